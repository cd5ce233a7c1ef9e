"""Configurations per token, and consecutive designs packed side by side into one configuration
so that stepping between them loads nothing.

Every change of configuration between consecutive NPU steps loads another one onto the array
(an ``aiex.configure`` in a fold, another xclbin's context without folds); a step of the
configuration already loaded loads nothing, and the array keeps its configuration across host
steps and from one token to the next (``fold.Array`` emulates exactly this).  So the loads of a
token are the changes along its NPU steps, counted around the cycle from the last step back
to the first (``loads``).

Upstream IRON packs designs that run next to each other into one device configuration
(amd/IRON ``iron/common/image/coresidence.py``): ``AdjacentPacking`` walks the runlist and
grows the current pack with each new design while the union still fits, a design that does not
fit starts the next pack, and a design met again stays in the pack it was first put in
(``pack`` is that greedy walk).  ``merge_devices`` then makes one ``aie.device`` of a pack:
every symbol a member defines at device scope (FIFOs, buffers, its runtime sequence) renamed
into the member's namespace, uses included (the sequence becomes the member's name, the rest
``member__old``), kernel declarations shared (their symbol is the object file's, so two members
calling one kernel share one declaration, and two declaring it differently cannot be merged).
The main sequence configures the pack once and ``aiex.run`` s any member's sequence by its
symbol; mlir-aie looks that symbol up in the configured device (``RunOp``'s callee lookup in
``lib/Dialect/AIEX/IR/AIEXDialect.cpp``; its configure/run tests give one device two runtime
sequences, ``@run_a`` and ``@run_b``).  A member's cores loop forever, each round gated by the
locks its own sequence's transfers set, so they idle while another member's sequence runs.

Whether a union fits is, upstream, the placer's and the object-FIFO allocator's answer on the
merged device.  iron's designs are drawn from column 0 with fixed tiles, so ``Pack`` moves each
member to columns of its own (``relocate``: every tile shifted right by the columns of the
members before it): the union fits when the members' columns add up to at most the device's
and no two members declare one kernel function differently (``fits``).  Each column's shim,
memory tile and cores then belong to one member, so every member keeps the resources its own
legality rules counted (npu2's columns are alike, each with a shim DMA), and ``verify`` checks
the merged device with every rule, ``one_core_per_tile`` among them.  Only devices with folds
pack (``fold.folds_on``: npu1 runs one xclbin per step, each its own configuration).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator, Sequence

from .ir import Acquire, Buf, Call, Core, Design, Link, Loop, Release, Tile
from .violation import Violation


def columns(design: Design) -> int:
    """The array columns a design spans: from column 0, where it is drawn, to its last."""
    return 1 + max(t.col for t in design.tiles())


def declarations(design: Design) -> dict[str, tuple[str, str]]:
    """Every kernel function the design's cores call: its argument types and object file, as
    its ``func.func`` declaration states them (``mlir``)."""
    from .mlir import arg_type, object_file

    return {name: (", ".join(arg_type(design, a) for a in args),
                   object_file(design.kernel_source))
            for name, args in design.functions().items()}


def fits(members: Sequence[Design], available: int) -> str | None:
    """Why ``members`` cannot share one configuration of ``available`` columns, or None: their
    columns side by side must fit, and a kernel function two of them call must be declared
    alike (one symbol per device)."""
    wide = sum(map(columns, members))
    if wide > available:
        return f"{wide} columns side by side > the {available} of the device"
    seen: dict[str, tuple[str, str]] = {}
    for d in members:
        for name, decl in declarations(d).items():
            if seen.setdefault(name, decl) != decl:
                return (f"kernel function {name} is declared ({seen[name][0]}) by one member "
                        f"and ({decl[0]}) by {d.name}")
    return None


def pack(order: Sequence[Design], available: int) -> dict[int, int]:
    """Upstream's adjacent packing of the designs in ``order`` (an NPU step sequence, designs
    repeating) into configurations of at most ``available`` columns: id(design) -> its pack."""
    group: dict[int, int] = {}
    current: list[Design] = []
    packs = 0
    for design in order:
        if id(design) in group:
            if current and all(d is not design for d in current):
                current = []  # met again outside the current pack: that pack is closed
            continue
        if current and fits([*current, design], available) is not None:
            current = []
        if not current:
            packs += 1
        current.append(design)
        group[id(design)] = packs - 1
    return group


def loads(configurations: Sequence[object]) -> int:
    """Configurations loaded per pass of a cyclic sequence of steps, each step naming the
    configuration it needs: one per change, the last step to the first included (a single
    configuration used throughout stays loaded: none)."""
    return sum(a != b for a, b in zip(configurations, [*configurations[-1:],
                                                       *configurations[:-1]]))


def loads_per_pass(order: Sequence[Design], available: int, packed: bool) -> int:
    """The configurations loaded per pass of ``order``, each design its own configuration or
    (``packed``) each pack of ``pack`` one."""
    group = pack(order, available) if packed else {id(d): k for k, d in enumerate(order)}
    return loads([group[id(d)] for d in order])


# ---- a pack rendered: its members relocated and renamed into one device ----------------------


def relocate(design: Design, first_column: int, prefix: str) -> Design:
    """``design`` moved right by ``first_column`` columns, every symbol it defines at device
    scope (FIFOs, buffers) renamed ``prefix__name`` with its uses (links, core programs,
    runtime transfers).  Kernel functions keep their names (the object file's symbols)."""

    def tile(t: Tile) -> Tile:
        return Tile(t.col + first_column, t.row)

    def name(n: str) -> str:
        return f"{prefix}__{n}"

    def op(o):
        if isinstance(o, Loop):
            return dataclasses.replace(o, body=tuple(map(op, o.body)))
        if isinstance(o, (Acquire, Release)):
            return dataclasses.replace(o, fifo=name(o.fifo))
        if isinstance(o, Call):
            return Call(o.function, tuple(Buf(name(a.name)) if isinstance(a, Buf) else
                                          name(a) if isinstance(a, str) else a for a in o.args))
        raise TypeError(f"{design.name}: core op {o!r} is not one relocate knows")

    return dataclasses.replace(
        design,
        fifos=tuple(dataclasses.replace(f, name=name(f.name), producer=tile(f.producer),
                                        consumers=tuple(map(tile, f.consumers)))
                    for f in design.fifos),
        links=tuple(Link(tuple(map(name, k.srcs)), tuple(map(name, k.dsts)), k.offsets)
                    for k in design.links),
        buffers=tuple(dataclasses.replace(b, name=name(b.name), tile=tile(b.tile))
                      for b in design.buffers),
        cores=tuple(Core(tile(c.tile), tuple(map(op, c.body))) for c in design.cores),
        sequence=tuple(tuple(dataclasses.replace(t, fifo=name(t.fifo), tile=tile(t.tile))
                             for t in phase) for phase in design.sequence))


@dataclass(frozen=True)
class Member:
    """One design of a pack: as drawn (``design``, what the program's step names), and as the
    pack's device holds it (``placed``: its columns and symbols its own); ``symbol`` names its
    runtime sequence and prefixes its symbols."""

    design: Design
    placed: Design
    symbol: str


@dataclass(frozen=True)
class Pack:
    """One device configuration of one or more designs.  A pack of one is the design's own
    device, unchanged, with its sequence ``@sequence``; several are merged into one device."""

    symbol: str
    members: tuple[Member, ...]

    @property
    def merged(self) -> bool:
        return len(self.members) > 1

    def key(self) -> tuple[int, ...]:
        """Which configuration this is, across folds: the same designs, the same device."""
        return tuple(id(m.design) for m in self.members)

    def member(self, design: Design) -> Member:
        return next(m for m in self.members if m.design is design)

    def union(self) -> Design:
        """The merged device's tiles, FIFOs, links, buffers and cores (no runtime sequence of
        its own: each member keeps its own, ``Member.symbol``)."""
        placed = [m.placed for m in self.members]
        first = placed[0]
        return Design(self.symbol, first.device, (), sum((d.fifos for d in placed), ()),
                      sum((d.links for d in placed), ()), sum((d.buffers for d in placed), ()),
                      sum((d.cores for d in placed), ()), (), first.kernel_source)


def make_pack(symbol: str, designs: Sequence[Design], stem) -> Pack:
    """``designs`` side by side in one configuration named ``symbol``: each moved right past
    the columns of those before it, its symbols prefixed ``m<k>_<stem(design)>``."""
    if len(designs) == 1:
        return Pack(symbol, (Member(designs[0], designs[0], "sequence"),))
    members, column = [], 0
    for k, d in enumerate(designs):
        name = f"m{k}_{stem(d)}"
        members.append(Member(d, relocate(d, column, name), name))
        column += columns(d)
    return Pack(symbol, tuple(members))


def one_core_per_tile(d) -> Iterator[Violation]:
    """A physical tile carries one ``aie.tile`` and at most one ``aie.core``: upstream IRON's
    ``merge_devices`` shares one ``aie.tile`` per coordinate between the members of a pack and
    refuses two members putting an ``aie.core`` (or a DMA program) on the same tile
    (``_EXCLUSIVE_PER_TILE``); mlir-aie's ``TileOp::getCoreOp`` (``lib/Dialect/AIE/IR/
    AIEDialect.cpp``) returns the first core among the tile's users, so a second one would be
    lost unseen.  Two members whose columns overlap break it."""
    seen: dict[Tile, object] = {}
    for t in d.tiles:
        tile = d.tile(t.result)
        if tile in seen:
            yield Violation(t, f"{tile} is declared by a second aie.tile: one per coordinate")
        seen[tile] = t
    cores: dict[Tile, object] = {}
    for core in d.cores:
        tile = d.tile(core.tile)
        if tile in cores:
            yield Violation(core, f"a second aie.core on {tile}: a tile runs one core (two "
                            "designs of a pack on the same columns?)")
        cores[tile] = core
