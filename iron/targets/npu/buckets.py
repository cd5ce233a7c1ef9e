"""Context buckets, built: a compiled design per bucket for each KV-cache step.

The KV-cache designs (``attention``) run one compiled sequence at every position, so a design
drawn at the whole context moves every position of the cache at every dispatch (Attention reads
the keys and values, QKVRoPE and CacheWrite read and write them).  A bucket is a number of
positions (powers of two from ``FLOOR`` up to the context, then the context itself,
``context_buckets``); the bucket's design (``bucket_design``) is the operator's design drawn at
the bucket's context, its cores masking past the position as at the whole context, with its
cache arguments and transfers re-addressed to the host's cache layout (``(slots, kv_heads, ctx,
head_dim)``), so it reads and writes the cache's first ``bucket`` positions in place.  Every
bucket's design is compiled with the step (its ``step.json`` carries them); at each dispatch
the host picks the smallest bucket covering the last position the rows reach (``reached``,
``covering``; ``runner.Bucketed``): a choice between compiled sequences, nothing rendered per
dispatch.  ``bucket_costs`` prices each bucket from the built designs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ...errors import BundleError
from ...operators import Attention, CacheWrite, QKVRoPE
from ...operators.llm import Slotted
from .cost import design_estimate
from .designs import design_for
from .ir import DTYPE_BYTES, Design, Pattern
from .resources import resources

#: The operators whose sequences move the KV cache.
KV_CACHE = (Attention, QKVRoPE, CacheWrite)
#: The smallest bucket: below it a bucket saves little (a few KiB per layer) and costs one more
#: compiled design per KV-cache step; 128 keeps a context of 8192 at 7 buckets.
FLOOR = 128
#: The KV-cache designs' runtime arguments that are caches (``attention``): these keep the
#: whole context's size in a bucket's design, the rest are the bucket's drawing unchanged.
CACHE_ARGS = frozenset({"k_cache", "v_cache", "cache", "cache_out"})


def context_buckets(ctx: int, least: int = 1) -> list[int]:
    """Powers of two from the smallest that holds ``least`` positions up to ``ctx``, then
    ``ctx`` itself: the buckets a host chooses from (the smallest covering the position)."""
    bucket = 1
    while bucket < least:
        bucket *= 2
    found = []
    while bucket < ctx:
        found.append(bucket)
        bucket *= 2
    return found + [ctx]


def least_positions(op) -> int:
    """The smallest context ``op`` can be drawn at: its rows, and Attention's key tile."""
    return max(op.rows, getattr(op, "tile_size", 1))


def bucket_positions(op) -> list[int]:
    """The buckets of a KV-cache step (the last its whole context), [] for any other."""
    if not isinstance(op, KV_CACHE):
        return []
    return context_buckets(op.ctx, max(least_positions(op), FLOOR))


def readdress(p: Pattern, block: int, whole: int) -> Pattern:
    """``p``, an access pattern of a cache laid out as runs of ``block`` elements (one per slot
    and KV head: a bucket's positions), re-addressed for runs of ``whole`` elements (the whole
    context) with the same start: a dimension stepping whole runs steps whole runs, the others
    must stay inside one run."""
    run, within = divmod(p.offset, block)
    strides, reach = [], within
    for size, stride in zip(p.sizes, p.strides):
        if stride % block == 0:
            strides.append(stride // block * whole)
        else:
            strides.append(stride)
            reach += (size - 1) * stride
    if reach >= block or min(p.strides) < 0:
        raise BundleError(f"access pattern {p} crosses a run of {block} cache elements other "
                          "than whole runs at a time: it cannot be re-addressed to a bucket")
    return Pattern(run * whole + within, p.sizes, tuple(strides))


def bucket_design(op, device: str, positions: int) -> Design:
    """``op``'s design reading and writing the first ``positions`` positions of its caches in
    the host's layout: drawn at ``ctx=positions`` (loops, FIFOs, kernels' positions), then
    its cache arguments given the whole context's size and its cache transfers
    re-addressed (``readdress``)."""
    drawn = design_for(dataclasses.replace(op, ctx=positions), resources(device))
    block, whole = positions * op.head_dim, op.ctx * op.head_dim
    caches = {i for i, a in enumerate(drawn.args) if a.name in CACHE_ARGS}
    if not caches:
        raise BundleError(f"{op.describe()}: its design has none of the cache arguments "
                          f"{sorted(CACHE_ARGS)}, so no bucket can be drawn")
    args = tuple(dataclasses.replace(a, numel=a.numel // block * whole) if i in caches else a
                 for i, a in enumerate(drawn.args))
    sequence = tuple(tuple(dataclasses.replace(t, pattern=readdress(t.pattern, block, whole))
                           if t.arg in caches else t for t in phase)
                     for phase in drawn.sequence)
    return dataclasses.replace(drawn, name=f"{op.describe(True)} bucket {positions}",
                               args=args, sequence=sequence)


def bucket_designs(op, device: str) -> dict[int, Design]:
    """Every bucket's design of ``op`` but the whole context's (the step's own design)."""
    return {b: bucket_design(op, device, b) for b in bucket_positions(op)[:-1]}


def reached(op, pos: np.ndarray) -> int:
    """The last cache position a dispatch of ``op`` with positions ``pos`` touches, as its
    kernels read them: a chunk's rows follow ``pos[0]``, a slotted form's rows each sit at
    their own ``pos[r]`` (-1 and below: a padding row, none)."""
    pos = np.asarray(pos).reshape(-1)
    return int(pos[:op.rows].max()) if isinstance(op, Slotted) else int(pos[0]) + op.rows - 1


def covering(buckets: Sequence[int], position: int) -> int:
    """The smallest of ``buckets`` (ascending) holding ``position`` (bucket b holds positions
    0 .. b - 1); the last, the whole context, when none does (a position past the context is
    the whole design's to mask)."""
    return next((b for b in buckets if position < b), buckets[-1])


def at_bucket(whole: Design, variants: Mapping[int, Design], positions: int) -> Design:
    """The design a step with bucket designs ``variants`` runs when its rows reach no further
    than ``positions - 1``: its smallest bucket holding them, else its whole design."""
    return next((variants[b] for b in sorted(variants) if b >= positions), whole)


def moved_bytes(design: Design) -> int:
    """Bytes the design's runtime sequence moves between host memory and the array."""
    return sum(t.pattern.numel * DTYPE_BYTES[design.args[t.arg].dtype]
               for phase in design.sequence for t in phase)


@dataclass(frozen=True)
class Bucket:
    positions: int  # the bucket: the cache positions its sequences cover
    bytes: int  # moved by the KV-cache steps' sequences, per call of the programs
    seconds: float  # the cost model's time of those steps


def bucket_costs(steps: Sequence[tuple[int, Design, Mapping[int, Design]]]) -> list[Bucket]:
    """Per bucket, what the built KV-cache steps move and take in one call: ``steps`` are
    (context, whole-context design, its bucket designs) of every KV-cache step, repeats
    included; a step runs its smallest bucket holding the bucket's positions, else its whole
    design (the last row: the whole context)."""
    if not steps:
        return []
    ctx = max(c for c, _, _ in steps)
    out = []
    for b in sorted({b for _, _, variants in steps for b in variants if b < ctx} | {ctx}):
        moved, seconds = 0, 0.0
        for _, whole, variants in steps:
            design = at_bucket(whole, variants, b)
            moved += moved_bytes(design)
            seconds += design_estimate(design).seconds
        out.append(Bucket(b, moved, seconds))
    return out
