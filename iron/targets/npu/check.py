"""A design measured against its device's resources: the npu legality rules, with figures.

Each function yields ``Rule`` s whose text carries the numbers, so a refused profile entry
reads e.g. "L1 of core tile (0, 2): A_0_0 2 x 8192 B + ... + stack 1024 B = 70656 B <= 65536 B".
Only the worst tile of each kind is reported: one rule per resource.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Iterator

from ...operator import Rule, rule
from .bds import allocate
from .ir import DTYPE_BYTES, Acquire, Design, Fifo, Tile, walk_ops
from .resources import NpuResources


def kib(n: int) -> str:
    return f"{n / 1024:g} KiB"


@functools.lru_cache(maxsize=256)
def acquired(design: Design) -> dict[tuple[Tile, str], int]:
    """Per (compute tile, FIFO): the most elements one acquire takes (iron's take one)."""
    return {(core.tile, op.fifo): 1 for core in design.cores for op in walk_ops(core.body)
            if isinstance(op, Acquire)}


def buffers_at(design: Design, fifo: Fifo, tile: Tile) -> int:
    """How many buffers of ``fifo`` mlir-aie allocates on ``tile``, as its object FIFO
    lowering (``AIEObjectFifoStatefulTransform.cpp``, ``findObjectFifoSize``) does for a FIFO
    whose ends are joined by DMA: a compute tile holds one more buffer than its largest acquire
    (room to prefetch: a ping-pong pair for acquires of one), except that a depth-1 FIFO
    acquired one at a time stays one buffer; a memory tile holds the declared depth; a shim
    tile none (the host buffers are the runtime sequence's)."""
    if tile.kind == "shim":
        return 0
    if tile.kind == "memtile":
        return fifo.depth
    most = acquired(design).get((tile, fifo.name), 0)
    if most == 0:
        return fifo.depth
    return 1 if (most == 1 and fifo.depth == 1) else most + 1


def endpoints(design: Design) -> dict[Tile, list[tuple[str, int, int]]]:
    """Per tile, the FIFO buffers it holds: (fifo, buffers, bytes per buffer).

    A memory tile holds one set of buffers per link, those of the link's larger side (the
    single FIFO of a split or join, the input of a forward), as mlir-aie's lowering creates
    them; every other endpoint holds its own (a broadcast's consumers each theirs)."""
    held: dict[Tile, list] = defaultdict(list)
    linked = {}
    for link in design.links:
        one = link.dsts[0] if link.kind == "join" else link.srcs[0]
        for name in link.srcs + link.dsts:
            linked[name] = one
    for f in design.fifos:
        for t in (f.producer, *f.consumers):
            if t.kind == "core" or (t.kind == "memtile" and linked.get(f.name) == f.name):
                held[t].append((f.name, buffers_at(design, f, t), f.nbytes))
    return held


def locks_at(design: Design) -> dict[Tile, int]:
    """Locks per tile as the lowering creates them on AIE2: a producer / consumer pair per
    FIFO end on a compute tile, and per link on a memory tile one pair per FIFO of the
    link's many side (``createObjectFifoLocks``' join / distribute factor)."""
    locks: dict[Tile, int] = defaultdict(int)
    for f in design.fifos:
        for t in (f.producer, *f.consumers):
            if t.kind == "core":
                locks[t] += 2
    for link in design.links:
        mem = design.fifo(link.srcs[0]).consumers[0]
        locks[mem] += 2 * max(len(link.srcs), len(link.dsts))
    return locks


def memory_rules(design: Design, res: NpuResources, fields: str) -> Iterator[Rule]:
    held = endpoints(design)
    cores = [t for t in held if t.kind == "core"]
    if cores:
        def l1(t):
            return (sum(d * b for _, d, b in held[t])
                    + sum(b.nbytes for b in design.buffers if b.tile == t) + res.stack_bytes)

        t = max(cores, key=l1)
        parts = [f"{n} {d} x {b} B" for n, d, b in held[t]]
        parts += [f"{b.name} {b.nbytes} B" for b in design.buffers if b.tile == t]
        total = l1(t)
        yield rule(total <= res.core_memory, fields,
                   f"L1 of {t}: {' + '.join(parts)} + stack {res.stack_bytes} B = {total} B "
                   f"({kib(total)}) <= {res.core_memory} B ({kib(res.core_memory)}) of data "
                   f"memory on {res.name}")
    mems = [t for t in held if t.kind == "memtile"]
    if mems:
        t = max(mems, key=lambda t: sum(d * b for _, d, b in held[t]))
        total = sum(d * b for _, d, b in held[t])
        parts = [f"{n} {d} x {b} B" for n, d, b in held[t]]
        yield rule(total <= res.memtile_memory, fields,
                   f"L2 of {t}: {' + '.join(parts)} = {total} B ({kib(total)}) <= "
                   f"{res.memtile_memory} B ({kib(res.memtile_memory)}) of memory tile on "
                   f"{res.name}")


def shares_memory(fifo: Fifo, linked: bool) -> bool:
    """Whether ``fifo`` (in a link or not: ``linked``) joins two compute tiles of one column on
    neighbouring rows, one producer and one consumer, outside any link: mlir-aie's object FIFO
    lowering then places its buffers where both cores reach them and sets up no DMA
    (``requiresDMAs`` in ``AIEObjectFifoStatefulTransform.cpp``; on AIE2 and AIE2P a core
    reaches the memory of the tiles north and south of it,
    ``AIE2TargetModel::isLegalMemAffinity``)."""
    if len(fifo.consumers) != 1 or linked:
        return False
    a, b = fifo.producer, fifo.consumers[0]
    return a.kind == b.kind == "core" and a.col == b.col and abs(a.row - b.row) == 1


def dma_rules(design: Design, res: NpuResources, fields: str) -> Iterator[Rule]:
    """DMA channels per direction, buffer descriptors and locks per tile."""
    into: dict[Tile, list[str]] = defaultdict(list)
    out_of: dict[Tile, list[str]] = defaultdict(list)
    bds: dict[Tile, int] = defaultdict(int)
    for f in design.fifos:
        if shares_memory(f, any(f.name in k.srcs + k.dsts for k in design.links)):
            # no DMA channel, no buffer descriptor
            continue
        out_of[f.producer].append(f.name)
        for t in f.consumers:
            into[t].append(f.name)
        for t in (f.producer, *f.consumers):
            if t.kind != "shim":
                bds[t] += buffers_at(design, f, t) if t.kind == "core" else f.depth
    locks = locks_at(design)
    limit = {"core": res.core_channels, "memtile": res.memtile_channels,
             "shim": res.shim_channels}
    for direction, table in (("into", into), ("out of", out_of)):
        if table:
            t = max(table, key=lambda t: len(table[t]) - limit[t.kind])
            n = len(table[t])
            yield rule(n <= limit[t.kind], fields,
                       f"DMA channels {direction} {t}: {n} ({', '.join(table[t])}) <= "
                       f"{limit[t.kind]} per direction on a {t.kind} tile of {res.name}")
    bd_limit = {"core": res.core_bds, "memtile": res.memtile_bds}
    lock_limit = {"core": res.core_locks, "memtile": res.memtile_locks}
    if bds:
        t = max(bds, key=lambda t: bds[t] - bd_limit[t.kind])
        yield rule(bds[t] <= bd_limit[t.kind], fields,
                   f"buffer descriptors of {t}: {bds[t]} (one per FIFO buffer) <= "
                   f"{bd_limit[t.kind]}")
        t = max(locks, key=lambda t: locks[t] - lock_limit[t.kind])
        yield rule(locks[t] <= lock_limit[t.kind], fields,
                   f"locks of {t}: {locks[t]} (a pair per FIFO end; per linked FIFO on a "
                   f"memory tile) <= {lock_limit[t.kind]}")
    plan = allocate(design, res.shim_bds)
    if plan.peak:
        t = max(plan.peak, key=plan.peak.get)
        yield rule(plan.overflow is None, fields,
                   f"buffer descriptors of the shim tiles: {plan.overflow}" if plan.overflow
                   else f"buffer descriptors of {t}: at most {plan.peak[t]} held at once "
                   f"(reused after each phase's wait) <= {res.shim_bds}")


def pattern_rules(design: Design, res: NpuResources, fields: str) -> Iterator[Rule]:
    """Every runtime transfer's access pattern within the shim DMA's limits."""
    problems = []
    for phase in design.sequence:
        for tr in phase:
            p = tr.pattern
            eb = DTYPE_BYTES[design.args[tr.arg].dtype]
            what = f"transfer of {design.args[tr.arg].name} via {tr.fifo} {list(p.sizes)}"
            words0 = p.sizes[-1] * eb / res.word_bytes
            if len(p.sizes) > res.ap_dims:
                problems.append(f"{what}: {len(p.sizes)} dimensions > {res.ap_dims}")
            elif p.sizes[0] > res.ap_repeat_max:
                problems.append(f"{what}: repeat {p.sizes[0]} > {res.ap_repeat_max}")
            elif any(s > res.ap_size_max for s in p.sizes[1:-1]) or words0 > res.ap_size_max:
                problems.append(f"{what}: a size over {res.ap_size_max} (innermost "
                                f"{p.sizes[-1]} x {eb} B = {words0:g} words)")
            elif (p.sizes[-1] * eb) % res.word_bytes or (p.offset * eb) % res.word_bytes:
                problems.append(f"{what}: innermost run {p.sizes[-1]} x {eb} B or offset "
                                f"{p.offset} is not whole {res.word_bytes}-byte words")
            elif any(s * eb / res.word_bytes > res.ap_stride_max for s in p.strides):
                problems.append(f"{what}: a stride over {res.ap_stride_max} words")
    yield rule(not problems, fields,
               "runtime access patterns fit the shim DMA (at most 4 dimensions, repeat <= "
               f"{res.ap_repeat_max}, sizes <= {res.ap_size_max} words, strides <= "
               f"{res.ap_stride_max} words, whole {res.word_bytes}-byte words)"
               + (f": {problems[0]}" if problems else ""))


def design_rules(design: Design, res: NpuResources, tunables: tuple[str, ...]
                 ) -> Iterator[Rule]:
    memory = " ".join(design.memory_fields or tunables)
    everything = " ".join(tunables)
    yield from memory_rules(design, res, memory)
    yield from dma_rules(design, res, everything)
    yield from pattern_rules(design, res, everything)
