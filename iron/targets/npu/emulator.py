"""Run a design on the host as the NPU would: DMA transfers, FIFOs of the declared depth, core
loops calling the core kernels' host build.

Every actor of a design is a Python generator run by one cooperative scheduler:

- a runtime-sequence transfer walks its access pattern and moves one FIFO element at a time
  between the host tensor and the FIFO (blocking while the FIFO is full, or empty);
- a memory tile link splits, forwards or joins elements between FIFOs;
- a core interprets its loop of acquire / call / release, calling the kernel's host build
  (ctypes) on the buffers it holds.

An actor yields a condition before every acquire; the scheduler resumes it when the condition
holds.  When no actor can move and a core, a transfer or the sequence is unfinished, that is a
deadlock: an acquire that can never be satisfied, reported with what each actor waits for.  A
transfer whose pattern reaches outside its tensor is refused before anything runs.
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import Callable, Iterator, Sequence

import numpy as np

from ...errors import IronError
from ...tensor import bfloat16
from .design import Acquire, Buf, Call, Design, Fifo, Iv, Loop, Pattern, Release, Tile, Transfer

NP_DTYPE = {"bf16": bfloat16, "f32": np.float32, "i32": np.int32}


class EmulationError(IronError, RuntimeError):
    """A design that cannot run: a deadlock, an out-of-bounds transfer, a size mismatch."""


class Ring:
    """A FIFO's ``depth`` buffers; each consumer reads every element once, in order."""

    def __init__(self, fifo: Fifo):
        self.fifo = fifo
        self.slots = [np.zeros(fifo.shape, NP_DTYPE[fifo.dtype]) for _ in range(fifo.depth)]
        self.acquired = 0  # elements the producer acquired
        self.released = 0  # ... and released (filled)
        n = len(fifo.consumers)
        self.taken = [0] * n  # per consumer: elements acquired
        self.freed = [0] * n  # ... and released

    def can_produce(self) -> bool:
        return self.acquired - min(self.freed) < self.fifo.depth

    def produce(self) -> np.ndarray:
        slot = self.slots[self.acquired % self.fifo.depth]
        self.acquired += 1
        return slot

    def release_produce(self) -> None:
        self.released += 1

    def can_consume(self, i: int) -> bool:
        return self.taken[i] < self.released

    def consume(self, i: int) -> np.ndarray:
        slot = self.slots[self.taken[i] % self.fifo.depth]
        self.taken[i] += 1
        return slot

    def release_consume(self, i: int) -> None:
        self.freed[i] += 1


Wait = tuple[Callable[[], bool], str]


class Scheduler:
    """Resumes actors whose wait condition holds until every non-daemon actor (cores,
    transfers, the sequence) has finished; memory-tile links are daemons: they forward for as
    long as data comes, and idling at the end is not a deadlock."""

    def __init__(self):
        self.actors: list[list] = []  # [generator, pending wait, name, daemon]

    def spawn(self, gen: Iterator[Wait], name: str, daemon: bool = False) -> None:
        self.actors.append([gen, (lambda: True, "start"), name, daemon])

    def run(self, design: str) -> None:
        while True:
            progress = False
            for actor in list(self.actors):
                while actor[1] is not None and actor[1][0]():
                    progress = True
                    try:
                        actor[1] = actor[0].send(None)
                    except StopIteration:
                        actor[1] = None
                        self.actors.remove(actor)
            if not any(not a[3] for a in self.actors):
                return
            if not progress:
                blocked = "; ".join(f"{a[2]} waits to {a[1][1]}" for a in self.actors)
                raise EmulationError(f"deadlock in {design}: no actor can move: {blocked}")


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


@functools.lru_cache(maxsize=None)
def library(path: str) -> ctypes.CDLL:
    return ctypes.CDLL(path)


class Emulation:
    """One run of one design on given runtime arguments (flat numpy arrays)."""

    def __init__(self, design: Design, args: Sequence[np.ndarray], lib: str):
        self.design = design
        self.args = args
        self.lib = library(lib)
        self.rings = {f.name: Ring(f) for f in design.fifos}
        self.sched = Scheduler()
        self.functions: dict[str, Callable] = {}

    def function(self, name: str, example: tuple) -> Callable:
        fn = self.functions.get(name)
        if fn is None:
            fn = getattr(self.lib, name)
            fn.restype = None
            fn.argtypes = [ctypes.c_float if isinstance(a, float) else ctypes.c_int32
                           if isinstance(a, (int, Iv)) else ctypes.c_void_p for a in example]
            self.functions[name] = fn
        return fn

    # ---- actors ---------------------------------------------------------------------------

    def transfer(self, t: Transfer) -> Iterator[Wait]:
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
                ring.produce().reshape(-1)[:] = arg[idx]
                ring.release_produce()
            else:
                yield (lambda: ring.can_consume(me)), f"drain {t.fifo} (empty)"
                arg[idx] = ring.consume(me).reshape(-1)
                ring.release_consume(me)

    def link(self, link, mem: Tile) -> Iterator[Wait]:
        if link.kind == "join":
            dst = self.rings[link.dsts[0]]
            srcs = [self.rings[s] for s in link.srcs]
            while True:
                yield dst.can_produce, f"produce into {dst.fifo.name}"
                d = dst.produce().reshape(-1)
                for src, off in zip(srcs, link.offsets):
                    i = src.fifo.consumers.index(mem)
                    yield (lambda: src.can_consume(i)), f"consume {src.fifo.name}"
                    s = src.consume(i).reshape(-1)
                    d[off:off + s.size] = s
                    src.release_consume(i)
                dst.release_produce()
        src = self.rings[link.srcs[0]]
        dsts = [self.rings[d] for d in link.dsts]
        offsets = link.offsets or (0,) * len(dsts)
        i = src.fifo.consumers.index(mem)
        while True:
            yield (lambda: src.can_consume(i)), f"consume {src.fifo.name}"
            s = src.consume(i).reshape(-1)
            for dst, off in zip(dsts, offsets):
                yield dst.can_produce, f"produce into {dst.fifo.name}"
                d = dst.produce().reshape(-1)
                d[:] = s[off:off + d.size]
                dst.release_produce()
            src.release_consume(i)

    def core(self, core) -> Iterator[Wait]:
        held: dict[str, list[np.ndarray]] = {}
        buffers = {b.name: np.zeros(b.shape, NP_DTYPE[b.dtype]) for b in self.design.buffers
                   if b.tile == core.tile}
        ivs: list[int] = []

        def run(body) -> Iterator[Wait]:
            for op in body:
                if isinstance(op, Loop):
                    ivs.append(0)
                    for i in range(op.count):
                        ivs[-1] = i
                        yield from run(op.body)
                    ivs.pop()
                elif isinstance(op, Acquire):
                    ring = self.rings[op.fifo]
                    if op.port == "produce":
                        yield ring.can_produce, f"acquire {op.fifo} to produce (full)"
                        held.setdefault(op.fifo, []).append(ring.produce())
                    else:
                        i = ring.fifo.consumers.index(core.tile)
                        yield (lambda: ring.can_consume(i)), f"acquire {op.fifo} (empty)"
                        held.setdefault(op.fifo, []).append(ring.consume(i))
                elif isinstance(op, Release):
                    ring = self.rings[op.fifo]
                    if not held.get(op.fifo):
                        raise EmulationError(f"{self.design.name}: {core.tile} releases "
                                             f"{op.fifo} without holding an element")
                    held[op.fifo].pop(0)
                    if op.port == "produce":
                        ring.release_produce()
                    else:
                        ring.release_consume(ring.fifo.consumers.index(core.tile))
                elif isinstance(op, Call):
                    values = []
                    for a in op.args:
                        if isinstance(a, Buf):
                            values.append(buffers[a.name].ctypes.data)
                        elif isinstance(a, Iv):
                            values.append(ivs[-1 - a.level] * a.scale)
                        elif isinstance(a, str):
                            if not held.get(a):
                                raise EmulationError(f"{self.design.name}: {core.tile} calls "
                                                     f"{op.function} on {a} without holding it")
                            values.append(held[a][-1].ctypes.data)
                        else:
                            values.append(a)
                    self.function(op.function, op.args)(*values)

        yield from run(core.body)

    def sequence(self) -> Iterator[Wait]:
        for i, phase in enumerate(self.design.sequence):
            done = []
            for t in phase:
                gen = self.transfer(t)
                if t.direction == "out":
                    gen = self._tracked(gen, done)
                self.sched.spawn(gen, f"{t.tile} {t.direction} {t.fifo}")
            outs = sum(t.direction == "out" for t in phase)
            yield (lambda: len(done) == outs), f"wait for phase {i}'s output transfers"

    @staticmethod
    def _tracked(gen, done: list) -> Iterator[Wait]:
        yield from gen
        done.append(True)

    def run(self) -> None:
        for phase in self.design.sequence:
            for t in phase:
                a = self.design.args[t.arg]
                lo, hi = pattern_bounds(t.pattern)
                if lo < 0 or hi >= a.numel:
                    raise EmulationError(
                        f"{self.design.name}: transfer {t.direction} of {a.name} via {t.fifo} "
                        f"(offset {t.pattern.offset}, sizes {list(t.pattern.sizes)}, strides "
                        f"{list(t.pattern.strides)}) reaches elements {lo}..{hi}, outside "
                        f"its {a.numel} elements")
        for c in self.design.cores:
            self.sched.spawn(self.core(c), str(c.tile))
        for link in self.design.links:
            ring = self.rings[link.srcs[0]]
            self.sched.spawn(self.link(link, ring.fifo.consumers[0]),
                             f"link {'+'.join(link.srcs)} -> {'+'.join(link.dsts)}", daemon=True)
        self.sched.spawn(self.sequence(), "runtime sequence")
        self.sched.run(self.design.name)


def emulate_design(design: Design, args: Sequence[np.ndarray], lib: str) -> None:
    """Run ``design`` on ``args`` (flat arrays, outputs written in place)."""
    for a, spec in zip(args, design.args):
        if a.size != spec.numel or a.dtype != NP_DTYPE[spec.dtype]:
            raise EmulationError(f"{design.name}: argument {spec.name} must be {spec.numel} "
                                 f"{spec.dtype} elements, got {a.size} {a.dtype}")
    Emulation(design, args, lib).run()
