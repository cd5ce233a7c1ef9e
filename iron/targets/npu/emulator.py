"""Run a design on the host as the NPU would: DMA transfers, FIFOs of the declared depth, core
programs calling the core kernels' host build, dispatch after dispatch.

An ``Emulation`` is one design loaded on the array.  Its cores and memory-tile links start
once and run until the emulation is dropped, as an mlir-aie core loops until reconfiguration:
each ``dispatch`` runs the runtime sequence once on new host buffers.  Every actor is a Python
generator run by one cooperative scheduler:

- a runtime-sequence transfer walks its access pattern and moves one FIFO element at a time
  between the host tensor and the FIFO (blocking while the FIFO is full, or empty);
- a memory tile link splits, forwards or joins elements between FIFOs;
- a core repeats its program of acquire / call / release, calling the kernel's host build
  (ctypes) on the buffers it holds.  It runs the program as mlir-aie's static object FIFO
  lowering leaves it (``rotation.lower``): loops unrolled by the FIFOs' depths, each acquire
  taking the buffer the unrolled code names, while the DMA side fills and drains the buffers
  in order, round and round.  An acquire whose buffer is not the one the DMA used for that
  element computes on the wrong data, as the device would; the dispatch then fails, naming
  the acquire and the loop whose rotation drifted.

An actor yields a condition before every acquire; the scheduler resumes it when the condition
holds.  When no actor can move and the sequence is unfinished, that is a deadlock, reported
with what each actor waits for.  When a dispatch ends, every core must have taken and given
exactly one program's worth of elements per dispatch so far (it may run ahead into the next
one only as far as acquiring an output buffer), and every FIFO must be empty: otherwise the
next dispatch would start from leftovers, and the design only works once.  At each wait of
the sequence, every input transfer of the phase must have finished (``bds`` frees their
descriptors there).  A transfer whose pattern reaches outside its tensor is refused before
anything runs.

Every buffer a kernel gets (a FIFO element, a core buffer) lies between guard regions of
``GUARD`` bytes holding a known pattern; a kernel call that changes one wrote outside its
buffer, and the emulator says which.  The host build of the AIE API (``aie_api_host.h``)
also checks every vector load and store of a call against the buffers the call was given
(``iron_npu_set_bounds``), so a kernel reading past its buffer is caught too.
"""

from __future__ import annotations

import ctypes
import functools
import math
import re
from collections import defaultdict
from typing import Callable, Iterator, Sequence

import numpy as np

from ...errors import IronError
from ...tensor import bfloat16
from .cost import acquires
from .ir import (Acquire, Buf, Call, Design, Fifo, Iv, Loop, Pattern, Release, Tile,
                     Transfer)
from .check import buffers_at
from .rotation import Copy, Slot, Unrolled, lower, problems

NP_DTYPE = {"bf16": bfloat16, "f32": np.float32, "i32": np.int32, "i8": np.int8,
            "u8": np.uint8}
#: Bytes of guard region on each side of every buffer a kernel gets.
GUARD = 256
GUARD_BYTE = 0xA5


class EmulationError(IronError, RuntimeError):
    """A design that cannot run: a deadlock, a design that only works once, an out-of-bounds
    transfer or kernel access, a size mismatch."""


class Guarded:
    """A buffer of ``shape`` inside a larger byte array whose ends are guard regions."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str):
        self.name = name
        dt = np.dtype(NP_DTYPE[dtype])
        n = math.prod(shape) * dt.itemsize
        self.raw = np.full(GUARD + n + GUARD, GUARD_BYTE, np.uint8)
        self.array = self.raw[GUARD:GUARD + n].view(dt).reshape(shape)
        self.array[...] = 0

    def intact(self) -> bool:
        return bool((self.raw[:GUARD] == GUARD_BYTE).all()
                    and (self.raw[-GUARD:] == GUARD_BYTE).all())

    def damage(self) -> str:
        before = np.nonzero(self.raw[:GUARD] != GUARD_BYTE)[0]
        after = np.nonzero(self.raw[-GUARD:] != GUARD_BYTE)[0]
        parts = []
        if before.size:
            parts.append(f"{GUARD - before[0]} bytes before its start")
        if after.size:
            parts.append(f"{after[-1] + 1} bytes past its end")
        return " and ".join(parts)


class Ring:
    """A FIFO's ``depth`` buffers; each consumer reads every element once, in order."""

    def __init__(self, fifo: Fifo):
        self.fifo = fifo
        self.slots = [Guarded(f"{fifo.name}[{i}]", fifo.shape, fifo.dtype)
                      for i in range(fifo.depth)]
        self.acquired = 0  # elements the producer acquired
        self.released = 0  # ... and released (filled)
        n = len(fifo.consumers)
        self.taken = [0] * n  # per consumer: elements acquired
        self.freed = [0] * n  # ... and released

    def can_produce(self) -> bool:
        return self.acquired - min(self.freed) < self.fifo.depth

    def produce(self, index: int | None = None) -> Guarded:
        """The next empty buffer in order, or buffer ``index`` (a core's code names it)."""
        slot = self.slots[self.acquired % self.fifo.depth if index is None else index]
        self.acquired += 1
        return slot

    def release_produce(self) -> None:
        self.released += 1

    def can_consume(self, i: int) -> bool:
        return self.taken[i] < self.released

    def consume(self, i: int, index: int | None = None) -> Guarded:
        slot = self.slots[self.taken[i] % self.fifo.depth if index is None else index]
        self.taken[i] += 1
        return slot

    def release_consume(self, i: int) -> None:
        self.freed[i] += 1

    def leftover(self) -> str | None:
        """What a finished dispatch left in the FIFO, or None when it is empty (a producer may
        hold an empty buffer it acquired ahead for the next dispatch)."""
        if any(t != f for t, f in zip(self.taken, self.freed)):
            return "a consumer holds an element"
        waiting = self.released - min(self.freed)
        return f"{waiting} element(s) nobody consumed" if waiting else None


Wait = tuple[Callable[[], bool], str]


class Scheduler:
    """Resumes actors whose wait condition holds.  Cores and links are daemons: they run
    forever, and idling between dispatches is not a deadlock."""

    def __init__(self):
        self.actors: list[list] = []  # [generator, pending wait, name, daemon]

    def spawn(self, gen: Iterator[Wait], name: str, daemon: bool = False) -> None:
        self.actors.append([gen, (lambda: True, "start"), name, daemon])

    def step(self) -> bool:
        progress = False
        for actor in list(self.actors):
            while actor[1] is not None and actor[1][0]():
                progress = True
                try:
                    actor[1] = actor[0].send(None)
                except StopIteration:
                    actor[1] = None
                    self.actors.remove(actor)
        return progress

    def run(self, design: str) -> None:
        """Until every non-daemon actor has finished and nothing can move any more."""
        while True:
            progress = self.step()
            if progress:
                continue
            if any(not a[3] for a in self.actors):
                blocked = "; ".join(f"{a[2]} waits to {a[1][1]}" for a in self.actors)
                raise EmulationError(f"deadlock in {design}: no actor can move: {blocked}")
            return

    def waiting(self, name: str) -> str:
        return next((a[1][1] for a in self.actors if a[2] == name), "finish")


def pattern_bounds(p: Pattern) -> tuple[int, int]:
    lo = p.offset + sum((s - 1) * st for s, st in zip(p.sizes, p.strides) if st < 0)
    hi = p.offset + sum((s - 1) * st for s, st in zip(p.sizes, p.strides) if st > 0)
    return lo, hi


def pattern_indices(p: Pattern, start: int, count: int) -> np.ndarray | slice:
    """Tensor indices of pattern positions [start, start + count): a slice when contiguous."""
    dense = all(st == math.prod(p.sizes[i + 1:]) for i, (s, st) in
                enumerate(zip(p.sizes, p.strides)) if s > 1)
    if dense:
        return slice(p.offset + start, p.offset + start + count)
    return all_indices(p)[start:start + count]


@functools.lru_cache(maxsize=256)
def all_indices(p: Pattern) -> np.ndarray:
    """Every tensor index a strided pattern visits, in order (kept: a program's designs
    repeat once per layer)."""
    idx = np.full(p.sizes, p.offset, np.int64)
    for axis, stride in enumerate(p.strides):
        shape = [1] * len(p.sizes)
        shape[axis] = p.sizes[axis]
        idx += (np.arange(p.sizes[axis], dtype=np.int64) * stride).reshape(shape)
    return idx.reshape(-1)


class Kernels:
    """The core kernels' host build, with the bounds check of its AIE API header."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.functions: dict[str, Callable] = {}
        self.set_bounds = self.lib.iron_npu_set_bounds
        self.set_bounds.restype = None
        self.set_bounds.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p),
                                    ctypes.POINTER(ctypes.c_int64)]
        self.violation = self.lib.iron_npu_violation
        self.violation.restype = ctypes.c_char_p
        self.violation.argtypes = []

    def function(self, name: str, example: tuple) -> Callable:
        fn = self.functions.get(name)
        if fn is None:
            fn = getattr(self.lib, name)
            fn.restype = None
            fn.argtypes = [ctypes.c_float if isinstance(a, float) else ctypes.c_int32
                           if isinstance(a, (int, Iv)) else ctypes.c_void_p
                           for a in example]
            self.functions[name] = fn
        return fn

    def call(self, name: str, example: tuple, values: list,
             buffers: list[Guarded]) -> str | None:
        """Call ``name``; return what it did outside ``buffers`` (or None)."""
        n = len(buffers)
        bases = (ctypes.c_void_p * max(n, 1))(*(b.array.ctypes.data for b in buffers))
        sizes = (ctypes.c_int64 * max(n, 1))(*(b.array.nbytes for b in buffers))
        self.set_bounds(n, bases, sizes)
        self.function(name, example)(*values)
        message = self.violation()
        if message:
            return re.sub(r"buffer argument (\d+)", lambda m: buffers[int(m.group(1))].name,
                          message.decode())
        bad = [b for b in buffers if not b.intact()]
        if bad:
            return "; ".join(f"wrote {b.damage()} of {b.name}" for b in bad)
        return None


@functools.lru_cache(maxsize=None)
def kernels(path: str) -> Kernels:
    return Kernels(path)


class Emulation:
    """One design loaded on the array: cores and links started once, ``dispatch`` runs the
    runtime sequence on one set of host buffers (flat numpy arrays, outputs written in place).
    """

    def __init__(self, design: Design, lib: str):
        self.design = design
        self.kernels = kernels(lib)
        self.rings = {f.name: Ring(f) for f in design.fifos}
        self.sched = Scheduler()
        self.moved: dict[tuple[Tile, str, str], int] = defaultdict(int)  # consumed / released
        #: per core, the elements one program run (a dispatch) takes and gives
        self.per_program = {c.tile: acquires(c.body) for c in design.cores}
        self.buffers = {b.name: Guarded(b.name, b.shape, b.dtype) for b in design.buffers}
        self.dispatches = 0
        self.drift: str | None = None  # the first acquire of a buffer the DMA did not use
        self.core_buffers = {(c.tile, f.name): buffers_at(design, f, c.tile)
                             for c in design.cores for f in design.fifos}
        self.args: Sequence[np.ndarray] = ()
        for c in design.cores:
            self.sched.spawn(self.core(c), str(c.tile), daemon=True)
        for link in design.links:
            ring = self.rings[link.srcs[0]]
            self.sched.spawn(self.link(link, ring.fifo.consumers[0]),
                             f"link {'+'.join(link.srcs)} -> {'+'.join(link.dsts)}", daemon=True)

    # ---- actors ---------------------------------------------------------------------------

    def transfer(self, t: Transfer, done: list) -> Iterator[Wait]:
        ring, arg = self.rings[t.fifo], self.args[t.arg]
        n = ring.fifo.numel
        total = t.pattern.numel
        who = f"transfer {t.direction} of {self.design.args[t.arg].name} via {t.fifo}"
        if total % n:
            raise EmulationError(f"{self.design.name}: {who} moves {total} elements, not a "
                                 f"whole number of {n}-element FIFO elements")
        me = ring.fifo.consumers.index(t.tile) if t.direction == "out" else None
        for k in range(total // n):
            idx = pattern_indices(t.pattern, k * n, n)
            if t.direction == "in":
                yield ring.can_produce, f"fill {t.fifo} (full)"
                ring.produce().array.reshape(-1)[:] = arg[idx]
                ring.release_produce()
            else:
                yield (lambda: ring.can_consume(me)), f"drain {t.fifo} (empty)"
                arg[idx] = ring.consume(me).array.reshape(-1)
                ring.release_consume(me)
        done.append(t)

    def link(self, link, mem: Tile) -> Iterator[Wait]:
        if link.kind == "join":
            dst = self.rings[link.dsts[0]]
            srcs = [self.rings[s] for s in link.srcs]
            while True:
                yield dst.can_produce, f"produce into {dst.fifo.name}"
                d = dst.produce().array.reshape(-1)
                for src, off in zip(srcs, link.offsets):
                    i = src.fifo.consumers.index(mem)
                    yield (lambda: src.can_consume(i)), f"consume {src.fifo.name}"
                    s = src.consume(i).array.reshape(-1)
                    d[off:off + s.size] = s
                    src.release_consume(i)
                dst.release_produce()
        src = self.rings[link.srcs[0]]
        dsts = [self.rings[d] for d in link.dsts]
        offsets = link.offsets or (0,) * len(dsts)
        i = src.fifo.consumers.index(mem)
        while True:
            yield (lambda: src.can_consume(i)), f"consume {src.fifo.name}"
            s = src.consume(i).array.reshape(-1)
            for dst, off in zip(dsts, offsets):
                yield dst.can_produce, f"produce into {dst.fifo.name}"
                d = dst.produce().array.reshape(-1)
                d[:] = s[off:off + d.size]
                dst.release_produce()
            src.release_consume(i)

    def core(self, core) -> Iterator[Wait]:
        """The core's program, repeated until the emulation is dropped (reconfiguration)."""
        held: dict[str, list[Guarded]] = {}
        buffers = {b.name: self.buffers[b.name] for b in self.design.buffers
                   if b.tile == core.tile}
        ivs: list[int] = []
        copies = lower(self.design, core)

        def run(body) -> Iterator[Wait]:
            for op in body:
                if isinstance(op, Loop):
                    ivs.append(0)
                    for i in range(op.count):
                        ivs[-1] = i
                        yield from run(op.body)
                    ivs.pop()
                elif isinstance(op, Unrolled):
                    ivs.append(0)
                    for i in range(op.count):
                        for j, copy in enumerate(op.copies):
                            ivs[-1] = i * len(op.copies) + j
                            yield from run(copy)
                    ivs.pop()
                elif isinstance(op, Copy):
                    ivs.append(op.index)
                    yield from run(op.body)
                    ivs.pop()
                elif isinstance(op, (Acquire, Slot)):
                    ring = self.rings[op.fifo]
                    if op.port == "produce":
                        yield ring.can_produce, f"acquire {op.fifo} to produce (full)"
                        index = self.named_buffer(core, op, ring.acquired)
                        held.setdefault(op.fifo, []).append(ring.produce(index))
                    else:
                        i = ring.fifo.consumers.index(core.tile)
                        yield (lambda: ring.can_consume(i)), f"acquire {op.fifo} (empty)"
                        self.moved[(core.tile, op.fifo, "consume")] += 1
                        index = self.named_buffer(core, op, ring.taken[i])
                        held.setdefault(op.fifo, []).append(ring.consume(i, index))
                elif isinstance(op, Release):
                    ring = self.rings[op.fifo]
                    if not held.get(op.fifo):
                        raise EmulationError(f"{self.design.name}: {core.tile} releases "
                                             f"{op.fifo} without holding an element")
                    held[op.fifo].pop(0)
                    if op.port == "produce":
                        ring.release_produce()
                        self.moved[(core.tile, op.fifo, "produce")] += 1
                    else:
                        ring.release_consume(ring.fifo.consumers.index(core.tile))
                elif isinstance(op, Call):
                    self.call(core, op, held, buffers, ivs)

        while True:
            for copy in copies:
                yield from run(copy)

    def named_buffer(self, core, op, element: int) -> int | None:
        """The buffer a core's acquire takes for the FIFO's ``element``-th element: the one its
        code names (a ``Slot``), noting the first time it is not the one the tile's DMA chain
        filled (or will send) for that element; None (the next in order) for an acquire that
        names none."""
        if not isinstance(op, Slot):
            return None
        dma = element % self.core_buffers[(core.tile, op.fifo)]
        if op.index != dma and self.drift is None:
            verb = "filled" if op.port == "consume" else "sends"
            self.drift = (f"{core.tile} acquires buffer {op.index} of {op.fifo} for its element "
                          f"{element} (dispatch {self.dispatches + 1}), where the tile's DMA "
                          f"{verb} buffer {dma}")
        return op.index % self.rings[op.fifo].fifo.depth

    def call(self, core, op: Call, held, buffers, ivs) -> None:
        values, given = [], []
        for a in op.args:
            if isinstance(a, Buf):
                given.append(buffers[a.name])
                values.append(given[-1].array.ctypes.data)
            elif isinstance(a, Iv):
                values.append(ivs[-1 - a.level] * a.scale)
            elif isinstance(a, str):
                if not held.get(a):
                    raise EmulationError(f"{self.design.name}: {core.tile} calls "
                                         f"{op.function} on {a} without holding it")
                given.append(held[a][-1])
                values.append(given[-1].array.ctypes.data)
            else:
                values.append(a)
        problem = self.kernels.call(op.function, op.args, values, given)
        if problem:
            raise EmulationError(f"{self.design.name}: kernel {op.function} on {core.tile} "
                                 f"accessed memory outside the buffers it was given: {problem}")

    def sequence(self, sequence) -> Iterator[Wait]:
        for i, phase in enumerate(sequence):
            done: list[Transfer] = []
            for t in phase:
                self.sched.spawn(self.transfer(t, done), f"{t.tile} {t.direction} {t.fifo}")
            outs = [t for t in phase if t.direction == "out"]
            if not outs:
                continue
            yield (lambda: all(t in done for t in outs)), f"wait for phase {i}'s outputs"
            unfinished = [t for t in phase if t not in done]
            if unfinished:
                t = unfinished[0]
                raise EmulationError(
                    f"{self.design.name}: phase {i}'s wait returned while transfer "
                    f"{t.direction} via {t.fifo} had not finished: the wait frees its buffer "
                    "descriptor, which the next phase or dispatch would reprogram while it runs")

    # ---- dispatches -------------------------------------------------------------------------

    def dispatch(self, args: Sequence[np.ndarray]) -> None:
        d = self.design
        for a, spec in zip(args, d.args):
            if a.size != spec.numel or a.dtype != NP_DTYPE[spec.dtype]:
                raise EmulationError(f"{d.name}: argument {spec.name} must be {spec.numel} "
                                     f"{spec.dtype} elements, got {a.size} {a.dtype}")
        sequence = d.sequence
        for phase in sequence:
            for t in phase:
                a, size = d.args[t.arg], args[t.arg].size
                lo, hi = pattern_bounds(t.pattern)
                if lo < 0 or hi >= size:
                    raise EmulationError(
                        f"{d.name}: transfer {t.direction} of {a.name} via {t.fifo} "
                        f"(offset {t.pattern.offset}, sizes {list(t.pattern.sizes)}, strides "
                        f"{list(t.pattern.strides)}) reaches elements {lo}..{hi}, outside "
                        f"its {size} elements")
        self.args = args
        self.sched.spawn(self.sequence(sequence), "runtime sequence")
        self.sched.run(d.name)
        self.dispatches += 1
        for c in d.cores:
            per_program = self.per_program[c.tile]
            for fifo, port in sorted(per_program):
                moved = self.moved[(c.tile, fifo, port)]
                per = per_program[(fifo, port)]
                want, said = per * self.dispatches, f"its program {per} per dispatch"
                if moved != want:
                    verb = "taken" if port == "consume" else "filled"
                    raise EmulationError(
                        f"{d.name}: after dispatch {self.dispatches} {c.tile} has {verb} {moved} "
                        f"elements of {fifo}, {said} (it waits to "
                        f"{self.sched.waiting(str(c.tile))}): the next dispatch would start "
                        "from the middle of its program, the design only works once")
        for name, ring in self.rings.items():
            left = ring.leftover()
            if left:
                raise EmulationError(f"{d.name}: after dispatch {self.dispatches} FIFO {name} "
                                     f"is not empty ({left}): the next dispatch would read it")
        if self.drift:
            why = problems(d)
            raise EmulationError(f"{d.name}: {self.drift}: the buffer rotation of the static "
                                 f"lowering drifted, the data are wrong"
                                 + (f" ({why[0].removeprefix(d.name + ': ')})" if why else ""))


def emulate_design(design: Design, args: Sequence[np.ndarray], lib: str) -> None:
    """Run ``design`` once on ``args`` (flat arrays, outputs written in place) on a freshly
    loaded array."""
    Emulation(design, lib).dispatch(args)
