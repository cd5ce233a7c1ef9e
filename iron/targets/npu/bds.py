"""Buffer-descriptor ids of a design's runtime sequence, allocated per shim tile.

Each ``aiex.npu.dma_memcpy_nd`` programs the buffer descriptor ``id`` of its shim tile's DMA;
mlir-aie passes the id through to the hardware (``AIEDmaToNpu``: the queue push encodes it in
four bits), and a shim tile has ``NpuResources.shim_bds`` of them (16: the target model's
``getNumBDs`` for a shim NOC tile).  Reprogramming a descriptor that is still executing
corrupts its transfer (``NpuDmaMemcpyNdOp``'s description, "Reusing Buffer Descriptor IDs"), so
an id is handed out again only after the transfer holding it was waited on.

A phase of iron's runtime sequence issues its transfers, then waits (``aiex.npu.dma_wait``)
for its output transfers; that frees every descriptor of the phase, inputs included, as
upstream IRON's runtime frees a task group after waiting on its drains: an output completes
only after the cores consumed every input element of the phase, so the input transfers have
finished first.  The emulator checks exactly that at every wait (``emulator``), so the rule
is tested on every design it runs.  A phase without an output frees nothing.

``allocate`` is the one allocator: the legality rule (``check``) and the renderer (``mlir``)
both call it, so a design that needs more descriptors than a tile has is refused, with the
figures, before any MLIR is written.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir import Design, Tile


@dataclass(frozen=True)
class Allocation:
    ids: tuple[tuple[int, ...], ...]  # per phase, per transfer: its descriptor id (-1: none)
    peak: dict[Tile, int]  # per shim tile: the most descriptors held at once
    overflow: str | None  # the first shortage, in words; None when every transfer has an id


def allocate(design: Design, per_tile: int) -> Allocation:
    """Lowest free id per shim tile for each transfer, in issue order."""
    free: dict[Tile, list[int]] = {}
    held: dict[Tile, int] = {}
    peak: dict[Tile, int] = {}
    ids: list[tuple[int, ...]] = []
    overflow = None
    for p, phase in enumerate(design.sequence):
        got = []
        taken: list[tuple[Tile, int]] = []
        for t in phase:
            pool = free.setdefault(t.tile, list(range(per_tile)))
            if not pool:
                if overflow is None:
                    want = held[t.tile] + sum(1 for u in phase[len(got):] if u.tile == t.tile)
                    overflow = (f"runtime phase {p} needs {want} buffer descriptors on {t.tile} "
                                f"at once (transfers issued before their wait), it has "
                                f"{per_tile}")
                got.append(-1)
                continue
            got.append(pool.pop(0))
            taken.append((t.tile, got[-1]))
            held[t.tile] = held.get(t.tile, 0) + 1
            peak[t.tile] = max(peak.get(t.tile, 0), held[t.tile])
        ids.append(tuple(got))
        if any(t.direction == "out" for t in phase):  # the waits free the phase's ids
            for tile, i in taken:
                free[tile].append(i)
                free[tile].sort()
                held[tile] -= 1
    return Allocation(tuple(ids), peak, overflow)
