"""A design measured against its device's resources: the npu legality rules, with figures.

Each function yields ``Rule`` s whose text carries the numbers, so a refused profile entry
reads e.g. "L1 of core tile (0, 2): A_0_0 2 x 8192 B + ... + stack 1024 B = 70656 B <= 65536 B".
Only the worst tile of each kind is reported: one rule per resource.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterator

from ...operator import Rule, rule
from .design import DTYPE_BYTES, Design, Tile
from .resources import NpuResources


def kib(n: int) -> str:
    return f"{n / 1024:g} KiB"


def endpoints(design: Design) -> dict[Tile, list[tuple[str, int, int]]]:
    """Per tile, the FIFO buffers it holds: (fifo, depth, bytes per element).

    A memory tile holds one ring per link (the single side of a split, join or forward);
    every other endpoint holds its own ``depth`` buffers (a broadcast's consumers each hold
    theirs)."""
    held: dict[Tile, list] = defaultdict(list)
    linked = {}
    for link in design.links:
        one = link.dsts[0] if link.kind == "join" else link.srcs[0]
        for name in link.srcs + link.dsts:
            linked[name] = one
    for f in design.fifos:
        for t in (f.producer, *f.consumers):
            if t.kind == "core":
                held[t].append((f.name, f.depth, f.nbytes))
            elif t.kind == "memtile" and linked.get(f.name) == f.name:
                held[t].append((f.name, f.depth, f.nbytes))
    return held


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


def dma_rules(design: Design, res: NpuResources, fields: str) -> Iterator[Rule]:
    """DMA channels per direction, buffer descriptors and locks per tile."""
    into: dict[Tile, list[str]] = defaultdict(list)
    out_of: dict[Tile, list[str]] = defaultdict(list)
    bds: dict[Tile, int] = defaultdict(int)
    locks: dict[Tile, int] = defaultdict(int)
    for f in design.fifos:
        out_of[f.producer].append(f.name)
        for t in f.consumers:
            into[t].append(f.name)
        for t in (f.producer, *f.consumers):
            if t.kind != "shim":
                bds[t] += f.depth
                locks[t] += 2
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
                   f"locks of {t}: {locks[t]} (two per FIFO endpoint) <= {lock_limit[t.kind]}")
    for i, phase in enumerate(design.sequence):
        per_shim: dict[Tile, int] = defaultdict(int)
        for tr in phase:
            per_shim[tr.tile] += 1
        if per_shim:
            t = max(per_shim, key=per_shim.get)
            yield rule(per_shim[t] <= res.shim_bds, fields,
                       f"buffer descriptors of {t} in runtime phase {i}: {per_shim[t]} "
                       f"transfers in flight <= {res.shim_bds}")


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
