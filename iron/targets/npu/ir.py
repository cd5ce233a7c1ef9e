"""The npu target's IR: an NPU design as data (tiles, object FIFOs, core loops and the
runtime sequence), which the design builders in ``designs`` write and the rest read.

This is the shape of an mlir-aie "object FIFO" design (mlir-aie's ``programming_guide``):

- tiles are (column, row): row 0 is the column's shim tile (DMA to and from host memory), row 1
  its memory tile, rows 2.. its compute tiles;
- an ``Fifo`` connects one producer tile to one or more consumer tiles through ``depth`` buffers
  of one element shape and dtype; a ``Link`` in a memory tile splits one FIFO's elements into
  several FIFOs (``offsets`` into the source element) or joins several into one;
- each compute tile runs a ``Core`` program: loops of acquire / call / release;
- the runtime sequence is a list of phases; a phase issues ``Transfer`` s (a shim DMA between a
  host tensor and a FIFO, through an access pattern of at most four dimensions) and waits for
  its output transfers before the next phase.

A design is plain frozen data: the emulator runs it, ``mlir`` renders it, ``check`` measures
it against a device's resources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Union

DTYPE_BYTES = {"bf16": 2, "f32": 4, "i32": 4, "i8": 1, "u8": 1}  # u8: raw bytes (i8 in MLIR)


@dataclass(frozen=True)
class Tile:
    col: int
    row: int

    @property
    def kind(self) -> str:
        return "shim" if self.row == 0 else "memtile" if self.row == 1 else "core"

    def __str__(self) -> str:
        return f"{self.kind} tile ({self.col}, {self.row})"


@dataclass(frozen=True)
class Fifo:
    name: str
    producer: Tile
    consumers: tuple[Tile, ...]
    depth: int
    shape: tuple[int, ...]  # one element (buffer)
    dtype: str = "bf16"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Link:
    """A memory tile forwarding: ``srcs`` -> ``dsts``; one side has exactly one FIFO, and
    ``offsets`` (elements) place each FIFO of the other side inside its element."""

    srcs: tuple[str, ...]
    dsts: tuple[str, ...]
    offsets: tuple[int, ...] = ()

    @property
    def kind(self) -> str:
        return "join" if len(self.srcs) > 1 else "split" if len(self.dsts) > 1 else "forward"


@dataclass(frozen=True)
class Buffer:
    """A compute tile's own buffer (an accumulator), outside any FIFO."""

    name: str
    tile: Tile
    shape: tuple[int, ...]
    dtype: str = "f32"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Acquire:
    fifo: str
    port: str  # "produce" or "consume"


@dataclass(frozen=True)
class Release:
    fifo: str
    port: str


@dataclass(frozen=True)
class Call:
    """A call of a core kernel; ``args`` are FIFO names (the element this core holds), buffer
    names (``Buf``), loop indices (``Iv``) and ``int`` / ``float`` constants."""

    function: str
    args: tuple[Union[str, "Buf", "Iv", int, float], ...]


@dataclass(frozen=True)
class Buf:
    name: str


@dataclass(frozen=True)
class Iv:
    """The induction variable of the enclosing loop ``level`` levels out (0: the innermost),
    times ``scale``: a row offset that moves with the loop."""

    level: int
    scale: int


@dataclass(frozen=True)
class Loop:
    """``count`` iterations.  ``dynamic`` says why a loop read from a parsed module
    (``rotation.region_program``) has a bound computed at run time; no design makes one (the
    pinned static lowering unrolls every loop that acquires, by a constant trip count)."""

    count: int
    body: tuple["Op", ...]
    dynamic: str = ""


Op = Union[Acquire, Release, Call, Loop]


@dataclass(frozen=True)
class Core:
    tile: Tile
    body: tuple[Op, ...]


@dataclass(frozen=True)
class Pattern:
    """A DMA access pattern in elements: ``sizes`` and ``strides`` outermost first."""

    offset: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


@dataclass(frozen=True)
class Transfer:
    """A shim DMA: ``direction`` "in" fills ``fifo`` from runtime argument ``arg``; "out"
    drains ``fifo`` into it."""

    direction: str
    arg: int
    fifo: str
    tile: Tile
    pattern: Pattern


@dataclass(frozen=True)
class Arg:
    name: str
    numel: int
    dtype: str = "bf16"


@dataclass(frozen=True)
class Place:
    """Where a step's tensor lies among its design's runtime arguments: argument ``arg``, from
    element ``offset``.  Several tensors share an argument when the design packs them (one
    host buffer addressed by offsets) or writes an output in place of an input."""

    arg: int
    offset: int = 0


@dataclass(frozen=True)
class Design:
    """One resolved operator instance on one NPU.  ``places`` puts each of the step's tensors
    (inputs, then outputs) in a runtime argument; empty, tensor ``i`` is argument ``i``."""

    name: str
    device: str
    args: tuple[Arg, ...]  # runtime arguments: the step's inputs, then its outputs
    fifos: tuple[Fifo, ...]
    links: tuple[Link, ...]
    buffers: tuple[Buffer, ...]
    cores: tuple[Core, ...]
    sequence: tuple[tuple[Transfer, ...], ...]  # phases
    kernel_source: str  # file in iron/kernels/npu/ holding the core functions
    memory_fields: tuple[str, ...] = field(default=())  # tunables that size the buffers
    places: tuple[Place, ...] = ()

    def placed(self) -> tuple[Place, ...]:
        """Each step tensor's ``Place`` (``places``, or argument ``i`` for tensor ``i``)."""
        return self.places or tuple(Place(i) for i in range(len(self.args)))

    def fifo(self, name: str) -> Fifo:
        return next(f for f in self.fifos if f.name == name)

    def tiles(self) -> list[Tile]:
        found = {f.producer for f in self.fifos} | {t for f in self.fifos for t in f.consumers}
        return sorted(found, key=lambda t: (t.col, t.row))

    def functions(self) -> dict[str, tuple]:
        """Every core function called, with one example argument list."""
        found: dict[str, tuple] = {}

        def walk(ops):
            for op in ops:
                if isinstance(op, Loop):
                    walk(op.body)
                elif isinstance(op, Call):
                    found.setdefault(op.function, op.args)

        for core in self.cores:
            walk(core.body)
        return found

    def to_json(self) -> dict:
        def tile(t):
            return [t.col, t.row]

        def ops(body):
            out = []
            for op in body:
                if isinstance(op, Loop):
                    out.append({"loop": op.count, "body": ops(op.body)})
                elif isinstance(op, Call):
                    out.append({"call": op.function, "args": [
                        {"buffer": a.name} if isinstance(a, Buf) else
                        {"iv": a.level, "scale": a.scale} if isinstance(a, Iv) else
                        {"fifo": a} if isinstance(a, str) else
                        {"f32": a} if isinstance(a, float) else {"i32": a} for a in op.args]})
                else:
                    out.append({type(op).__name__.lower(): op.fifo, "port": op.port})
            return out

        places = {"places": [[p.arg, p.offset] for p in self.places]} if self.places else {}
        return {
            "name": self.name, "device": self.device, "kernel_source": self.kernel_source,
            "args": [{"name": a.name, "numel": a.numel, "dtype": a.dtype} for a in self.args],
            "fifos": [{"name": f.name, "producer": tile(f.producer),
                       "consumers": [tile(c) for c in f.consumers], "depth": f.depth,
                       "shape": list(f.shape), "dtype": f.dtype} for f in self.fifos],
            "links": [{"srcs": list(k.srcs), "dsts": list(k.dsts), "offsets": list(k.offsets)}
                      for k in self.links],
            "buffers": [{"name": b.name, "tile": tile(b.tile), "shape": list(b.shape),
                         "dtype": b.dtype} for b in self.buffers],
            "cores": [{"tile": tile(c.tile), "body": ops(c.body)} for c in self.cores],
            "sequence": [[{"direction": t.direction, "arg": t.arg, "fifo": t.fifo,
                           "tile": tile(t.tile), "offset": t.pattern.offset,
                           "sizes": list(t.pattern.sizes), "strides": list(t.pattern.strides)}
                          for t in phase] for phase in self.sequence],
            **places,
        }


def walk_ops(body) -> Iterator[Op]:
    for op in body:
        yield op
        if isinstance(op, Loop):
            yield from walk_ops(op.body)


# ---- access patterns -------------------------------------------------------------------------


# ---- builders the designs share ---------------------------------------------------------


def shim(c: int) -> Tile:
    """Column ``c``'s shim tile (row 0), where DRAM transfers enter and leave the array."""
    return Tile(c, 0)


def consume(*names):
    return tuple(Acquire(n, "consume") for n in names)


def produce(*names):
    return tuple(Acquire(n, "produce") for n in names)


def release(port, *names):
    return tuple(Release(n, port) for n in names)


def linear(offset: int, count: int, inner_max: int = 2046) -> Pattern:
    """``count`` contiguous elements from ``offset`` as rows of the largest ``inner`` that
    divides ``count`` and fits one DMA dimension (1023 words = 2046 bf16); the outer count is
    split once more when it is long."""
    inner = next(d for d in range(min(count, inner_max), 0, -1) if count % d == 0)
    outer = count // inner
    if outer <= 1023:
        return Pattern(offset, (1, 1, outer, inner), (0, 0, inner, 1))
    mid = next(d for d in range(1023, 0, -1) if outer % d == 0)
    return Pattern(offset, (1, outer // mid, mid, inner), (0, mid * inner, inner, 1))


def design_from_json(doc: dict) -> Design:
    """The inverse of ``Design.to_json``: how a bundle's step file becomes a runnable design."""

    def tile(t):
        return Tile(int(t[0]), int(t[1]))

    def arg(a):
        if "buffer" in a:
            return Buf(a["buffer"])
        if "iv" in a:
            return Iv(int(a["iv"]), int(a["scale"]))
        if "fifo" in a:
            return a["fifo"]
        return float(a["f32"]) if "f32" in a else int(a["i32"])

    def ops(body):
        out = []
        for op in body:
            if "loop" in op:
                out.append(Loop(int(op["loop"]), ops(op["body"])))
            elif "call" in op:
                out.append(Call(op["call"], tuple(arg(a) for a in op["args"])))
            elif "acquire" in op:
                out.append(Acquire(op["acquire"], op["port"]))
            else:
                out.append(Release(op["release"], op["port"]))
        return tuple(out)

    return Design(
        doc["name"], doc["device"],
        tuple(Arg(a["name"], int(a["numel"]), a["dtype"]) for a in doc["args"]),
        tuple(Fifo(f["name"], tile(f["producer"]), tuple(map(tile, f["consumers"])),
                   int(f["depth"]), tuple(f["shape"]), f["dtype"]) for f in doc["fifos"]),
        tuple(Link(tuple(k["srcs"]), tuple(k["dsts"]), tuple(k["offsets"]))
              for k in doc["links"]),
        tuple(Buffer(b["name"], tile(b["tile"]), tuple(b["shape"]), b["dtype"])
              for b in doc["buffers"]),
        tuple(Core(tile(c["tile"]), ops(c["body"])) for c in doc["cores"]),
        tuple(tuple(Transfer(t["direction"], int(t["arg"]), t["fifo"], tile(t["tile"]),
                             Pattern(int(t["offset"]), tuple(t["sizes"]), tuple(t["strides"])))
                    for t in phase) for phase in doc["sequence"]),
        doc["kernel_source"], (),
        tuple(Place(int(a), int(o)) for a, o in doc.get("places", ())))
