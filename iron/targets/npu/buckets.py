"""What a runtime sequence per context bucket would move, priced: not built.

The KV-cache designs (``attention``) run one compiled sequence at every position, so each
dispatch moves the whole context's keys and values (Attention reads them, QKVRoPE and
CacheWrite read and write them), whatever the position.  A sequence per context bucket, each
its own compiled design reading the cache's first ``bucket`` positions (powers of two up to the
context, the host picking the smallest that covers the position) would move only the bucket.
This module says what each bucket would cost: the designs drawn at the bucket's context (the
same transfers, the cache's rows beyond it left out) and the bytes their sequences move, with
the cost model's time.  Nothing picks a bucket at run time: no bundle holds these designs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from ...operators import Attention, CacheWrite, QKVRoPE
from .cost import design_estimate
from .ir import DTYPE_BYTES, Design

#: The operators whose sequences move the KV cache.
KV_CACHE = (Attention, QKVRoPE, CacheWrite)


def context_buckets(ctx: int, least: int = 1) -> list[int]:
    """Powers of two from the smallest that holds ``least`` positions up to ``ctx``, then
    ``ctx`` itself: the buckets a host would choose from (the smallest covering the
    position)."""
    bucket = 1
    while bucket < least:
        bucket *= 2
    found = []
    while bucket < ctx:
        found.append(bucket)
        bucket *= 2
    return found + [ctx]


def moved_bytes(design: Design) -> int:
    """Bytes the design's runtime sequence moves between host memory and the array."""
    return sum(t.pattern.numel * DTYPE_BYTES[design.args[t.arg].dtype]
               for phase in design.sequence for t in phase)


@dataclass(frozen=True)
class Bucket:
    positions: int  # the bucket: the cache positions its sequences cover
    bytes: int  # moved by the KV-cache steps' sequences, per call of the programs
    seconds: float  # the cost model's time of those steps


def least_positions(op) -> int:
    """The smallest context ``op`` can be drawn at: its rows, and Attention's key tile."""
    return max(op.rows, getattr(op, "tile_size", 1))


def bucket_costs(ops: Sequence, device: str) -> list[Bucket]:
    """Per bucket of the KV-cache steps among ``ops`` (one call: every step, repeats
    included), the bytes their sequences would move and their modelled time on ``device``;
    the last bucket is the whole context, what the built designs move."""
    from . import design_of

    steps = [op for op in ops if isinstance(op, KV_CACHE)]
    if not steps:
        return []
    ctx = max(op.ctx for op in steps)
    least = max(least_positions(op) for op in steps)
    drawn: dict = {}
    out = []
    for b in context_buckets(ctx, least):
        moved, seconds = 0, 0.0
        for op in steps:
            key = (op, b)
            if key not in drawn:
                d = design_of(dataclasses.replace(op, ctx=min(b, op.ctx)), device)
                drawn[key] = (moved_bytes(d), design_estimate(d).seconds)
            moved += drawn[key][0]
            seconds += drawn[key][1]
        out.append(Bucket(b, moved, seconds))
    return out
