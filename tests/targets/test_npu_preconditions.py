"""The lowering's preconditions (``iron.targets.npu.preconditions``): each rule refuses a
module broken the way it guards against, naming the op, the value and the rule, and passes
the module as rendered.  The custom form (``iron.targets.npu.custom``) reads as the same
module as the generic one, and a custom form that says something else is refused.  Every
design of the emulation sweep passing them all is tested with the op definitions
(``test_npu.py``; ``verify`` runs every check)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

from iron.operators import GEMM, Attention, SlotAttention
from iron.resolution import resolve
from iron.targets import npu
from iron.targets.npu import custom, ods
from iron.targets.npu.ir import Tile
from iron.targets.npu.mlir import render
from iron.targets.npu.preconditions import devices, target_model
from iron.targets.npu.verify import Problem, check_text, parse


@functools.lru_cache(maxsize=None)
def gemm_module(dev: str, generic: bool = True) -> str:
    """A GEMM on one column: a distribute (A), a forward (B), a join (C), four cores."""
    op = GEMM(M=32, K=64, N=64, tile_m=8, tile_k=32, tile_n=16, num_aie_columns=1)
    return render(npu.design_of(resolve(op, dev), dev), generic=generic)


@functools.lru_cache(maxsize=None)
def passes(text: str, custom: str | None = None) -> bool:
    """Whether ``text`` (with its custom form) passes every check; checked once per text."""
    check_text(text, "design.generic.mlir", custom)
    return True


def rejected(text: str, old: str, new: str) -> str:
    assert passes(text) and old in text, old
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


def test_a_core_tile_receiving_three_fifos_runs_out_of_dma_channels():
    """A_0_1 broadcast to core (0, 2) too: its third S2MM channel (a core tile has two)."""
    text = gemm_module("npu2")
    line = next(t for t in text.splitlines() if 'sym_name = "A_0_1"' in t)
    wider = (line.replace("%tile_0_3)", "%tile_0_3, %tile_0_2)").replace("[[]]", "[[], []]")
             .replace("(index, index) -> ()", "(index, index, index) -> ()"))
    problem = rejected(text, line, wider)
    assert problem.endswith("core tile (0, 2): 3 S2MM DMA channels (@A_0_0, @A_0_1, "
                            "@B_0_cores) > the 2 it has [dma_channels]"), problem


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


def test_the_custom_form_reads_as_the_generic_module_and_is_checked_alone_too():
    """A GEMM and a slotted attention design (a relay core looping over its input's
    elements, loops three deep): the custom form aiecc reads is, op by op, the module the
    checks saw."""
    attention = npu.design_of(SlotAttention(rows=1, slots=2, heads=2, kv_heads=1, head_dim=16,
                                            ctx=64, tile_size=16, num_aie_columns=1), "npu2")
    for generic, custom in ((gemm_module("npu2"), gemm_module("npu2", False)),
                            (render(attention, generic=True), render(attention))):
        check_text(generic, "design.generic.mlir", custom)
        check_text(custom, "design.mlir")
    with pytest.raises(Problem, match=r"design.mlir:\d+: 'aie.tile': tile \(12, 9\).*"
                       r"\[tiles_in_array\]"):
        check_text(gemm_module("npu2", False).replace("aie.tile(0, 5)", "aie.tile(12, 9)"),
                   "design.mlir")


CUSTOM_A_0 = "aie.objectfifo @A_0(%tile_0_0, {%tile_0_1}, 2 : i32)"
CUSTOM_WAIT = "      aiex.npu.dma_wait {symbol = @C_0}\n"


@pytest.mark.parametrize("old,new,message", [
    (CUSTOM_A_0, CUSTOM_A_0.replace("2 : i32", "3 : i32"),
     "'aie.objectfifo' property elemNumber = 3 : i32 where the generic form has 2 : i32"),
    ("aie.tile(0, 5)", "aie.tile(0, 4)",
     "'aie.tile' property row = 4 : i32 where the generic form has 5 : i32"),
    ("([] [0, 256, 512, 768])", "([] [0, 256, 512, 640])", "property dst_offsets = "),
    ("@A_0_0(Consume, 1)", "@A_0_0(Produce, 1)",
     "'aie.objectfifo.acquire' property port = 0 : i32 where the generic form has 1 : i32"),
    ("issue_token = true", "issue_token = false", "property issue_token = false"),
    (CUSTOM_WAIT, "", "'aie.end' is aie.end where the generic form has aiex.npu.dma_wait"),
    ("%acc_0_0, %c6, %c7, %c8)", "%acc_0_0, %c7, %c6, %c8)",
     "'func.call' takes other operands than in the generic form"),
])
def test_a_custom_form_that_differs_from_the_generic_one_is_refused(old, new, message):
    generic, custom = gemm_module("npu2"), gemm_module("npu2", False)
    assert passes(generic, custom) and old in custom, old
    with pytest.raises(Problem) as e:
        check_text(generic, "design.generic.mlir", custom.replace(old, new, 1))
    problem = str(e.value)
    assert problem.startswith("design.generic.mlir (custom form):"), problem
    assert message in problem and problem.endswith("[custom_form]"), problem


def test_every_transcribed_op_has_its_custom_syntax():
    """An op added to ``ods`` needs its custom form in ``custom`` too (one line where its
    ODS assembly format is declarative), or ``design.mlir`` files using it cannot be read."""
    names = {op.name for dialect in (ods.AIE, ods.AIEX) for op in dialect.operations}
    assert names == set(custom.CUSTOM) - {"memref.cast"}, names ^ set(custom.CUSTOM)


@pytest.mark.parametrize("fifo,depth,tile,buffers", [
    ("A_0_0", 2, (0, 2), 2),  # a core acquiring one at a time: a ping-pong pair
    ("A_0_0", 1, (0, 2), 1),  # the pin's depth-1 exception (PR #2986 removes it later)
    ("A_0_0", 40, (0, 2), 2),  # on a core the lowering allocates by acquires, not depth
    ("A_0_0", 40, (0, 1), 40),  # a memory tile allocates the declared depth
    ("A_0", 3, (0, 0), 0),  # a shim tile none: the host buffers are the sequence's
])
def test_buffers_are_counted_as_the_pinned_lowering_allocates_them(fifo, depth, tile, buffers):
    old = "elemNumber = 2 : i32, elemType = !aie.objectfifo<memref<"
    text = gemm_module("npu2")
    start = text.index(f'sym_name = "{fifo}"')
    at = text.rindex(old, 0, start)
    text = text[:at] + old.replace("2", str(depth)) + text[at + len(old):]
    (d,) = devices(parse(text, "design.generic.mlir"))
    assert d.fifos[fifo].depth == depth
    assert d.buffers_at(d.fifos[fifo], Tile(*tile)) == buffers


def test_the_verify_command_checks_a_step_files_custom_form_against_its_generic_one(tmp_path):
    generic, custom = gemm_module("npu2"), gemm_module("npu2", False)
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({"placement": "npu", "mlir": custom, "mlir_generic": generic}))
    bad.write_text(json.dumps({"placement": "npu", "mlir": custom.replace(CUSTOM_WAIT, ""),
                               "mlir_generic": generic}))
    run = [sys.executable, "-m", "iron.targets.npu.verify"]
    ok = subprocess.run(run + [str(good)], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "1 module(s) verify" in ok.stdout, ok.stderr
    failed = subprocess.run(run + [str(bad)], capture_output=True, text=True, timeout=300)
    assert failed.returncode == 1 and failed.stderr.startswith(f"error: {bad} (custom form):")
    assert failed.stderr.rstrip().endswith("[custom_form]"), failed.stderr


def test_a_fifo_between_neighbouring_cores_holds_its_depth_on_the_producer_only():
    """Attention's position goes from core (0, 3) to core (0, 2) through shared memory: the
    pin creates the declared depth of buffers on the producer's tile, none on the consumer's,
    and no DMA (no channel, no descriptor)."""
    design = npu.design_of(Attention(rows=1, heads=2, kv_heads=1, head_dim=16, ctx=64,
                                     tile_size=16, num_aie_columns=1), "npu2")
    (d,) = devices(parse(render(design, generic=True), "design.generic.mlir"))
    shared = [f for f in d.fifos.values() if d.shared(f)]
    assert [f.name for f in shared] == ["pos_0"]
    f = shared[0]
    assert (d.holds_buffers(f, f.producer), d.holds_buffers(f, f.consumers[0])) == (True, False)
    assert d.buffers_at(f, f.producer) == f.depth
