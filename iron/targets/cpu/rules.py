"""What the cpu kernels need of each operator class beyond the operator's own rules.

A cpu kernel runs an instance's work items on a team of ``num_aie_columns`` OpenMP threads;
the entries below are the cases where a kernel's loops assume more than the operator states.
``iron.resolution`` chains them after ``Operator.rules``; a class without an entry here (or
for a base class) cannot be resolved on the cpu, and ``tests/operators/test_resolve.py``
checks every operator with a cpu kernel has one.
"""

from __future__ import annotations

from typing import Iterator

from ...devices import Device
from ...operator import Rule, rule
from ...operators import (GEMM, GEMV, Attention, CacheWrite, Concat, Elementwise, Embedding,
                          QKVRoPE, RowWise, SwiGLU)
from ..base import own_rules_only


def elementwise(op: Elementwise, dev: Device) -> Iterator[Rule]:
    yield rule(op.num_channels == 1, "num_channels",
               "num_channels == 1 (the cpu has no shim DMA channels to spread over)")


def gemm(op: GEMM, dev: Device) -> Iterator[Rule]:
    # gemm.c blocks A by tile_m rows and B by tile_n rows with no partial blocks
    yield rule(op.M % op.tile_m == 0, "tile_m", "M % tile_m == 0")
    yield rule(op.N % op.tile_n == 0, "tile_n", "N % tile_n == 0")


RULES = {
    Elementwise: elementwise,
    GEMM: gemm,
    GEMV: own_rules_only,
    RowWise: own_rules_only,
    SwiGLU: own_rules_only,
    Embedding: own_rules_only,
    CacheWrite: own_rules_only,
    Concat: own_rules_only,
    QKVRoPE: own_rules_only,
    Attention: own_rules_only,
}
