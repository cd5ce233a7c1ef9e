"""The lowering's preconditions (``iron.targets.npu.preconditions``): each rule refuses a
module broken the way it guards against, naming the op, the value and the rule, and passes
the module as rendered.  Every design of the emulation sweep passing them all is tested with
the op definitions (``test_npu.py``, ``verify`` runs both)."""

from __future__ import annotations

import functools

import pytest

from iron.operators import GEMM
from iron.resolution import resolve
from iron.targets import npu
from iron.targets.npu.mlir import render
from iron.targets.npu.preconditions import target_model
from iron.targets.npu.verify import Problem, check_text


@functools.lru_cache(maxsize=None)
def gemm_module(dev: str) -> str:
    """A GEMM on one column: a distribute (A), a forward (B), a join (C), four cores."""
    op = GEMM(M=32, K=64, N=64, tile_m=8, tile_k=32, tile_n=16, num_aie_columns=1)
    return render(npu.design_of(resolve(op, dev), dev), generic=True)


def rejected(text: str, old: str, new: str) -> str:
    check_text(text)  # as rendered, it passes
    assert old in text, old
    with pytest.raises(Problem) as e:
        check_text(text.replace(old, new, 1), "design.generic.mlir")
    return str(e.value)


TILE_0_5 = '"aie.tile"() <{col = 0 : i32, row = 5 : i32}>'
A_0 = 'elemNumber = 2 : i32, elemType = !aie.objectfifo<memref<32x32xbf16>>, sym_name = "A_0"'
TOKEN = "issue_token = true, metadata = @C_0"
WAIT = '      "aiex.npu.dma_wait"() <{symbol = @C_0}> : () -> ()\n'
A_ACQUIRE = ("size = 1 : i32}> : () -> !aie.objectfifosubview<memref<8x32xbf16>>")


@pytest.mark.parametrize("dev,old,new,rule,message", [
    ("npu2", TILE_0_5, TILE_0_5.replace("col = 0", "col = 12").replace("row = 5", "row = 9"),
     "tiles_in_array", "tile (12, 9): column index 12 must be in 0..7 (the 8 columns of npu2)"),
    ("npu1", TILE_0_5, TILE_0_5.replace("col = 0", "col = 4"),
     "tiles_in_array", "column index 4 must be in 0..3 (the 4 columns of npu1)"),
    ("npu2", TILE_0_5, TILE_0_5.replace("row = 5", "row = 6"),
     "tiles_in_array", "row index 6 must be in 0..5 (the 6 rows of npu2)"),
    ("npu2", '"aie.core"(%tile_0_2)', '"aie.core"(%tile_0_1)',
     "tile_kinds", "aie.core on memtile tile (0, 1)"),
    ("npu2", "objFifo_name = @A_0_0", "objFifo_name = @A_0_1",
     "tile_kinds", "consumer port of @A_0_1 accessed by the core of core tile (0, 2), not of its "
     "consumer (core tile (0, 3))"),
    ("npu2", A_0, A_0.replace("elemNumber = 2", "elemNumber = 40"),
     "descriptors", "@A_0 on memtile tile (0, 1): 40 buffers need 40 buffer descriptors on "
     "one DMA channel, which reaches 24 (depth 40)"),
    ("npu2", A_ACQUIRE, A_ACQUIRE.replace("size = 1", "size = 15"),
     "descriptors", "core tile (0, 2): 20 buffer descriptors (@A_0_0 16, "),
    ("npu2", '"aie.core"(%tile_0_2) ({', '"aie.core"(%tile_0_2) <{stack_size = 64512 : i32}> ({',
     "memory", "acc_0_0 512 B + stack 64512 B = 68608 B > the 65536 B of its memory"),
    ("npu2", "dst_offsets = [0, 256, 512, 768]", "dst_offsets = [0, 256, 384, 768]",
     "link_legality", "@A_0_1 gets 128 elements from offset 256 of @A_0's 1024, its element "
     "has 256"),
    ("npu2", "src_offsets = [0, 128, 256, 384]", "src_offsets = [0, 128, 256]",
     "link_legality", "src_offsets [0, 128, 256] must give one offset per FIFO"),
    ("npu2", "fifoOuts = [@C_0]", "fifoOuts = [@C_0, @A_0]",
     "link_legality", "cannot join and distribute at the same time"),
    ("npu2", "fifoIns = [@B_0]", "fifoIns = [@A_0]",
     "link_legality", "@A_0 is in more than one aie.objectfifo.link"),
    ("npu2", "fifoIns = [@B_0]", "fifoIns = [@C_0]",
     "link_legality", "link ['C_0'] -> ['B_0_cores'] has no link point"),
    ("npu2", WAIT, "",
     "tokens_waited", "transfer via @C_0 issues a token that no later aiex.npu.dma_wait on @C_0 "
     "waits for"),
    ("npu2", TOKEN, TOKEN.replace("true", "false"),
     "tokens_waited", "transfer out of the array via @C_0 has issue_token = false"),
    ("npu2", WAIT, WAIT + WAIT,
     "tokens_waited", "dma_wait on @C_0: no transfer on it issued a token since the last wait"),
])
def test_each_precondition_rejects_the_module_that_breaks_it(dev, old, new, rule, message):
    problem = rejected(gemm_module(dev), old, new)
    assert problem.startswith("design.generic.mlir:") and problem.endswith(f"[{rule}]"), problem
    assert message in problem, problem


def test_a_problem_names_the_line_of_the_op_at_fault():
    text = gemm_module("npu2")
    problem = rejected(text, TILE_0_5, TILE_0_5.replace("row = 5", "row = 6"))
    line = next(n for n, t in enumerate(text.splitlines(), 1) if TILE_0_5 in t)
    assert problem.startswith(f"design.generic.mlir:{line}: 'aie.tile': "), problem


def test_the_target_models_follow_mlir_aies_device_cases():
    assert [target_model(d).columns for d in ("npu1", "npu1_2col", "npu2", "npu2_3col")] == [
        4, 2, 8, 3]
    with pytest.raises(ValueError, match="xcvc1902: no NPU target model"):
        target_model("xcvc1902")
