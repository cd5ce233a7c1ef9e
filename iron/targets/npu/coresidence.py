"""Configurations per token: how often the array is reconfigured, and how many loads packing
consecutive designs side by side into one configuration saves.

Every change of design between consecutive NPU steps loads another configuration onto the
array (an ``aiex.configure`` in a fold, another xclbin's context without folds); a step of the
design already loaded loads nothing, and the array keeps its configuration across host steps
and from one token to the next (``fold.Array`` emulates exactly this).  So the loads of a
token are the changes along its NPU steps, counted around the cycle from the last step back
to the first (``loads``).

Upstream IRON packs designs that run next to each other into one device configuration
(amd/IRON ``iron/common/image/coresidence.py``, ``AdjacentPacking``): walking the runlist it
grows the current pack with each new design while the union still fits the array, a design
that does not fit starts the next pack, and a design met again stays in the pack it was first
put in.  Stepping between members of one pack loads nothing.  ``pack`` is that greedy walk.

Whether a union fits is, upstream, the placer's and the object-FIFO allocator's answer on the
merged device.  iron's designs are drawn from column 0 with fixed tiles, so members would sit
side by side in columns of their own: the union fits when the members' column counts add up to
at most the device's columns (each column's shim, memory tile and cores then belong to one
member, so every member keeps the resources its own legality rules counted; npu2's columns are
alike, each with a shim DMA).  Packing is counted for the report and can be emulated
(``runner.Emulated(pack=True)``: ``fold.Array`` keeps every member's cores and FIFOs while
the others run), but not rendered: the folds still write one device per design (relocating a
design's columns and renaming its symbols into a merged ``aie.device`` is not written), so
bundles run unpacked.  Only devices with folds pack (``fold.folds_on``: npu1 runs one xclbin
per step).
"""

from __future__ import annotations

from typing import Sequence

from .ir import Design


def columns(design: Design) -> int:
    """The array columns a design's tiles occupy."""
    return len({t.col for t in design.tiles()})


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
        if current and sum(map(columns, current)) + columns(design) > available:
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
