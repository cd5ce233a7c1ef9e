"""What the npu designs need of each operator class beyond the operator's own rules.

These are the shape rules of how a design splits an instance over the array: columns take
equal shares, each column's compute tiles (``compute_rows`` of them) take equal blocks.  They
are checked before a design is drawn; the design's fit in the device's memories, channels and
descriptors is checked after (``NpuTarget.rules``).  Classes without a design run on the host
between NPU calls and need nothing more (``own_rules_only``).  ``iron.resolution`` chains these
after ``Operator.rules``.
"""

from __future__ import annotations

from typing import Iterator

from ...devices import Device
from ...operator import Rule, rule
from ...operators import (GEMM, GEMV, Attention, CacheWrite, Concat, Elementwise, Embedding,
                          QKVRoPE, RowWise, SwiGLU)
from ...operators.matrix import PREFETCH_BYTES
from ..base import own_rules_only
from .resources import resources


def gemv(op: GEMV, dev: Device) -> Iterator[Rule]:
    yield rule(op.M % (op.tile_size_output * op.num_aie_columns) == 0,
               "tile_size_output num_aie_columns", "M % (tile_size_output * num_aie_columns) == 0")
    yield rule(op.prefetch == PREFETCH_BYTES[0], "prefetch",
               f"prefetch == {PREFETCH_BYTES[0]} (the designs stream W by DMA: a cpu kernel's "
               "prefetch distance does not apply)")


def gemm(op: GEMM, dev: Device) -> Iterator[Rule]:
    if op.weight_format == "bf16":  # a quantized B: one core per column (qmatrix.py)
        rows = resources(dev.name).compute_rows
        yield rule(op.M % (op.tile_m * rows) == 0, "tile_m",
                   f"M % (tile_m * {rows}) == 0 ({rows} compute tiles per column of {dev})")
    yield rule(op.N % (op.tile_n * op.num_aie_columns) == 0,
               "tile_n num_aie_columns", "N % (tile_n * num_aie_columns) == 0")


def attention(op: Attention, dev: Device) -> Iterator[Rule]:
    memory = resources(dev.name).core_memory
    need = 2 * 2 * op.tile_size * op.head_dim * 2  # K and V blocks, double-buffered, bf16
    yield rule(need <= memory, "tile_size",
               f"2 * 2 * tile_size * head_dim * 2 bytes <= {memory} bytes (a core tile's data "
               f"memory on {dev})")


RULES = {
    Elementwise: own_rules_only,
    GEMV: gemv,
    GEMM: gemm,
    RowWise: own_rules_only,
    SwiGLU: own_rules_only,
    Embedding: own_rules_only,
    CacheWrite: own_rules_only,
    Concat: own_rules_only,
    QKVRoPE: own_rules_only,
    Attention: attention,
}
