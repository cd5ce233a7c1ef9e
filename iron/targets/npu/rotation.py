"""Which buffer each acquire of a core gets, as the pinned mlir-aie lowers object FIFOs
statically, and whether that rotation still matches the DMA's from one dispatch to the next.

mlir-aie's ``lib/Dialect/AIE/Transforms/AIEObjectFifoStatefulTransform.cpp`` (at the pin in
``ods.UPSTREAM``; a core without ``dynamic_objfifo_lowering``) does this:

- ``findObjectFifoSize``: the buffers of each FIFO end (``check.buffers_at``: two on a compute
  tile for iron's one-element acquires, one for a depth-1 FIFO);
- ``unrollForLoops``: every ``scf.for`` with an acquire directly in its body is unrolled by the
  least common multiple of the depths of the FIFOs acquired there, or fully when it runs fewer
  times; the remainder iterations become copies after the unrolled loop (``loopUnrollByFactor``).
  A loop whose acquires are all in nested loops is left alone, and that includes the loop
  "until reconfiguration" around a core's program (``scf.for`` to 9223372036854775807, IRON's
  ``Worker(while_true=True)``) when its body acquires nothing directly;
- replacing the acquires (``runOnOperation``, ``acqPerFifo`` and ``createUseLocks``): walking
  the unrolled code in program order, each acquire is given the next buffer of its FIFO, an
  index modulo the FIFO's buffers, fixed in the code;
- ``createDMA``: the tile's DMA walks a chain of one buffer descriptor per buffer, the last
  pointing back to the first, for as long as the array stays configured.

No stored copy of the file is at the pin itself: the one read is newer (mlir-aie 00cfd45f,
2026, which also has the dynamic lowering's peeling of cyclostatic acquires, a path a static
core does not take) and one older (3acd8744, 2023, its own unroller instead of
``loopUnrollByFactor``); both unroll by the LCM of the depths, fully when a loop runs no more
times than that, copy the remainder iterations after the loop, number the acquires in
program order modulo the depth and chain the descriptors in a cycle, so the pin does too.

So the code names a buffer, while the data arrive (or leave) wherever the DMA chain has got
to.  The two agree only if every loop body that runs more than once, as unrolled, acquires
each FIFO a whole number of rotations; otherwise an iteration (at the latest the next
dispatch) reads a buffer the DMA did not fill, or fills one the DMA will not send.  ``lower``
gives each acquire its buffer as the code would; ``problems`` names each loop that drifts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

from ...errors import IronError
from .check import buffers_at
from .ir import Acquire, Call, Core, Design, Iv, Loop, Release
from .violation import Violation  # preconditions lists this module's rule

SOURCE = "mlir-aie lib/Dialect/AIE/Transforms/AIEObjectFifoStatefulTransform.cpp"
#: The trip count of a core's loop until reconfiguration (the largest ``index``).
FOREVER = (1 << 63) - 1


@dataclass(frozen=True)
class Slot:
    """An acquire with the buffer the static lowering fixed for it."""

    fifo: str
    port: str
    index: int


class RotationError(IronError, ValueError):
    """A design whose object FIFO buffer rotation drifts across iterations or dispatches."""


class NotStatic(Exception):
    """A core the static lowering cannot unroll (an acquire directly in a loop whose trip
    count is not a constant: ``unrollForLoops`` fails with "unrollFactor = 0")."""


def rotating(count: int) -> int:
    """The depth for a FIFO a core acquires ``count`` times in each loop that repeats its code
    (and per dispatch): two buffers (double buffering) when that is a whole number of
    rotations, else one.  A design passes the count its own loops make."""
    return 2 if count % 2 == 0 else 1


def peeled(loop: Loop) -> tuple:
    """``loop`` with its first iteration written out before it, so that a program made of it
    acquires right in the loop until reconfiguration: the static lowering then unrolls that
    loop by the FIFOs' depths, and two dispatches' code (at depth 2) take a whole rotation of
    every FIFO whatever the count per dispatch.  The body must not read the loop's index
    (the written-out iteration has none)."""
    if _reads_index(loop.body, 0):
        raise ValueError(f"a loop of {loop.count} whose body reads its index cannot be peeled")
    if loop.count <= 1:
        return loop.body if loop.count == 1 else ()
    return (*loop.body, Loop(loop.count - 1, loop.body))


def _reads_index(body, level: int) -> bool:
    return any(_reads_index(op.body, level + 1) if isinstance(op, Loop) else
               isinstance(op, Call) and any(isinstance(a, Iv) and a.level == level
                                            for a in op.args) for op in body)


#: A core's FIFO name -> the buffers of that FIFO's end on the core's tile.
Buffers = Callable[[str], int]


def _direct(body) -> set[str]:
    return {op.fifo for op in body if isinstance(op, Acquire)}


def unroll_factor(loop: Loop, buffers: Buffers) -> int:
    """``unrollForLoops``' factor for ``loop``: 1 when it has no acquire of its own."""
    depths = {buffers(f) for f in _direct(loop.body)}
    return min(math.lcm(*depths), loop.count) if depths else 1


@dataclass(frozen=True)
class Unrolled:
    """A loop unrolled by ``len(copies)``: ``count`` iterations, each running the copies in
    turn; copy ``j`` of iteration ``i`` sees the loop index ``i * len(copies) + j``."""

    count: int
    copies: tuple[tuple, ...]


@dataclass(frozen=True)
class Copy:
    """A remainder iteration left after an unrolled loop: its body at loop index ``index``."""

    index: int
    body: tuple


def _unrolled(body, buffers: Buffers) -> tuple:
    """``body`` with every loop unrolled as ``unrollForLoops`` does (acquires not yet given
    buffers)."""
    out: list = []
    for op in body:
        if not isinstance(op, Loop):
            out.append(op)
            continue
        inner = _unrolled(op.body, buffers)
        if _direct(op.body) and op.dynamic:
            raise NotStatic(f"an acquire directly in a loop whose trip count is {op.dynamic}, "
                            "not a constant")
        factor = unroll_factor(op, buffers)
        if factor <= 1:
            out.append(Loop(op.count, inner, op.dynamic))
            continue
        main, rest = divmod(op.count, factor)
        out.append(Unrolled(main, (inner,) * factor))
        out.extend(Copy(main * factor + j, inner) for j in range(rest))
    return tuple(out)


def _numbered(body, buffers: Buffers, next_index: dict) -> tuple:
    """Each acquire of ``body`` given the next buffer of its FIFO, in program order."""
    out: list = []
    for op in body:
        if isinstance(op, Loop):
            out.append(Loop(op.count, _numbered(op.body, buffers, next_index), op.dynamic))
        elif isinstance(op, Unrolled):
            out.append(Unrolled(op.count, tuple(_numbered(c, buffers, next_index)
                                                for c in op.copies)))
        elif isinstance(op, Copy):
            out.append(Copy(op.index, _numbered(op.body, buffers, next_index)))
        elif isinstance(op, Acquire):
            key = (op.fifo, op.port)
            index = next_index.get(key, 0)
            next_index[key] = (index + 1) % buffers(op.fifo)
            out.append(Slot(op.fifo, op.port, index))
        else:
            out.append(op)
    return tuple(out)


def lowered(body, buffers: Buffers) -> tuple:
    """A core's region ``body`` (its loop until reconfiguration included) as the static
    lowering leaves it: loops unrolled, each acquire a ``Slot``.  Raises ``NotStatic`` for a
    body it cannot unroll."""
    return _numbered(_unrolled(body, buffers), buffers, {})


def core_buffers(design: Design, core: Core) -> Buffers:
    return lambda fifo: buffers_at(design, design.fifo(fifo), core.tile)


def lower(design: Design, core: Core) -> tuple[tuple, ...]:
    """The core's program as the static lowering leaves it: the copies of its per-dispatch
    program that its loop until reconfiguration runs in turn (one, unless that loop acquires
    directly), each acquire a ``Slot``.  Raises ``NotStatic`` for a core it cannot unroll."""
    forever = lowered((Loop(FOREVER, core.body),), core_buffers(design, core))[0]
    return (forever.body,) if isinstance(forever, Loop) else forever.copies


def _code(op) -> tuple:
    """The code of a loop's body: every copy of an unrolled one."""
    if isinstance(op, Unrolled):
        return tuple(x for c in op.copies for x in c)
    return op.body


def advance(body) -> dict[tuple[str, str], int]:
    """Acquires per (FIFO, port) written in ``body`` (nested loops counted once: their code)."""
    counts: dict[tuple[str, str], int] = {}
    for op in body:
        if isinstance(op, (Loop, Unrolled, Copy)):
            for key, n in advance(_code(op)).items():
                counts[key] = counts.get(key, 0) + n
        elif isinstance(op, Slot):
            counts[(op.fifo, op.port)] = counts.get((op.fifo, op.port), 0) + 1
    return counts


def _repeated(body) -> Iterator[tuple[int, tuple]]:
    """(trip count, code) of every loop in ``body`` that may run its code more than once."""
    for op in body:
        if isinstance(op, Copy):
            yield from _repeated(op.body)
        elif isinstance(op, (Loop, Unrolled)):
            if op.count > 1 or (isinstance(op, Loop) and op.dynamic):
                yield op.count, _code(op)
            yield from _repeated(_code(op))


def drifts(body, buffers: Buffers) -> list[str]:
    """What drifts in a core's region ``body`` (its loop until reconfiguration included),
    one line per (loop, FIFO): the code of a loop body that runs more than once, as unrolled,
    acquiring a FIFO a number of times that is not a multiple of its buffers.  Empty for a
    body the static lowering cannot unroll (the trip-count rule's concern)."""
    try:
        code = lowered(body, buffers)
    except NotStatic:
        return []
    found = []
    for count, repeated in _repeated(code):
        for (fifo, port), n in sorted(advance(repeated).items()):
            if n % buffers(fifo):
                where, what = (("each iteration of its loop until reconfiguration (a dispatch)",
                                "dispatch") if count >= FOREVER // 2 else
                               (f"each iteration of a loop of {count}", "iteration"))
                found.append(
                    f"the code of {where}, as unrolled, acquires {fifo} ({port}) {n} time(s), "
                    f"not a multiple of its {buffers(fifo)} buffers, so from the next {what} on "
                    "the buffers the code names and the ones its DMA uses differ "
                    f"({SOURCE}: unrollForLoops)")
    return found


def problems(design: Design) -> list[str]:
    """One line per (core, loop, FIFO) of ``design`` whose buffer rotation drifts under the
    static lowering."""
    return [f"{design.name}: {core.tile}: {line}" for core in design.cores
            for line in drifts((Loop(FOREVER, core.body),), core_buffers(design, core))]


def check(design: Design) -> None:
    """Raise ``RotationError`` naming the first drifting FIFO of ``design``."""
    found = problems(design)
    if found:
        raise RotationError(found[0])


# ---- the rule on a parsed module (``preconditions.RULES``) ---------------------------------


def _constant(value) -> int | None:
    from xdsl.dialects import arith

    owner = value.owner
    return owner.value.value.data if isinstance(owner, arith.ConstantOp) else None


def region_program(ops) -> tuple:
    """The acquires, releases and ``scf.for`` loops of a parsed ``aie.core`` region as iron
    writes a core's program (``ir.Loop``; a bound not defined by a constant makes the loop
    ``dynamic``); an acquire of ``size`` n counts as n acquires of one."""
    from xdsl.dialects import scf

    from . import ods

    out: list = []
    for o in ops:
        if isinstance(o, scf.ForOp):
            body = region_program(o.body.block.ops)
            lb, ub, step = (_constant(v) for v in (o.lb, o.ub, o.step))
            if None in (lb, ub, step) or step <= 0:
                out.append(Loop(0, body, "a value computed at run time"))
            else:
                out.append(Loop(max(0, -(-(ub - lb) // step)), body))
        elif isinstance(o, (ods.ObjectFifoAcquireOp, ods.ObjectFifoReleaseOp)):
            port = "produce" if o.port.value.data == ods.OBJECTFIFO_PORT["Produce"] else "consume"
            kind = Acquire if isinstance(o, ods.ObjectFifoAcquireOp) else Release
            out += [kind(o.objFifo_name.root_reference.data, port)] * o.size.value.data
    return tuple(out)


def fifo_rotation(d) -> Iterator:
    """``AIEObjectFifoStatefulTransform.cpp`` (``unrollForLoops``, the acquires' buffers in
    program order, ``createDMA``'s cyclic descriptor chain): on every core the static lowering
    unrolls, each loop that runs its code more than once, the loop until reconfiguration
    included, acquires each FIFO a whole number of rotations of its buffers on that tile
    (``buffers_at``); otherwise the buffers the code names and the ones the tile's DMA uses
    part from the next iteration or dispatch on.  A core with ``dynamic_objfifo_lowering``
    tracks the buffers at run time and is not concerned."""
    for core in d.cores:
        flag = core.dynamic_objfifo_lowering
        if flag is not None and flag.value.data:
            continue
        tile = d.tile(core.tile)
        for line in drifts(region_program(core.body.block.ops),
                           lambda fifo: d.buffers_at(d.fifos[fifo], tile)):
            yield Violation(core, f"{tile}: {line}")

