"""QKVRoPE's Qwen variants on the npu (``iron/targets/npu/qkv_weights.py``): the bias and norm
weights joined to every row in the memory tile, emulated against the operator's reference at
several positions on one loaded design, and their modules verified."""

import numpy as np
import pytest
from opcases import OneStep, assert_close, tolerance_on

import iron
from iron.operator import normal, rope_frequencies
from iron.operators import GEMV, Attention, QKVRoPE, SlotQKVRoPE
from iron.targets import npu, target_for
from iron.targets.npu.bds import allocate
from iron.targets.npu.check import design_rules
from iron.targets.npu.cost import design_estimate
from iron.targets.npu.mlir import render
from iron.targets.npu.resources import resources
from iron.targets.npu.verify import check_text

#: (shape and variant, positions of the dispatches in a row, device): the end of the context,
#: the start, rows past the end; Qwen3-0.6B's head_dim of 128.
CASES = [
    (dict(rows=1, heads=7, kv_heads=1, head_dim=64, ctx=32, bias=True), (31, 0, 32), "npu2"),
    (dict(rows=3, heads=4, kv_heads=2, head_dim=128, ctx=16, qk_norm=True), (13, 0, 15), "npu1"),
    (dict(rows=8, heads=4, kv_heads=2, head_dim=32, ctx=40, bias=True, qk_norm=True),
     (36, 0, 30), "npu2"),
]


def variant_inputs(shape, position, seed):
    fields, inputs = QKVRoPE.example(np.random.default_rng(seed), **shape, pos=0)
    inputs[1] = np.arange(position, position + shape["rows"], dtype=np.int32)
    return fields, inputs


@pytest.mark.parametrize("shape,positions,dev", CASES, ids=[str(i) for i in range(len(CASES))])
def test_the_variants_design_matches_the_reference_dispatch_after_dispatch(shape, positions,
                                                                          dev):
    fields, first = variant_inputs(shape, positions[0], 0)
    graph = OneStep(QKVRoPE, fields, dev)
    exe = target_for(graph.device).emulated().load(graph.record_like(first))
    assert all(d is not None for d in exe.designs), "placed on the host"
    for seed, position in enumerate(positions):
        _, xs = variant_inputs(shape, position, seed)
        want = graph.reference(*[x.copy() for x in xs])
        got = exe.run([x.copy() for x in xs])
        for g, w in zip(got, want):
            assert_close("QKVRoPE", g, w, tolerance_on("QKVRoPE", dev))


def test_each_row_reaches_the_core_joined_with_one_copy_of_each_weight():
    """The row FIFO's element is the row, the bias and the two norm weights; each weight is
    sent once per row, in repeats of at most 64 (the shim DMA's outermost dimension)."""
    op = QKVRoPE(rows=100, heads=4, kv_heads=2, head_dim=64, ctx=256, bias=True, qk_norm=True)
    d = npu.design_of(op, "npu2")
    width = 8 * 64
    (link,) = d.links
    assert link.srcs == ("qkv_in", "bias_in", "q_norm_in", "k_norm_in")
    assert link.offsets == (0, width, 2 * width, 2 * width + 64)
    assert next(f for f in d.fifos if f.name == "qkv").shape == (2 * width + 128,)
    # the weights lie behind the rows in runtime argument 0, the rotated q behind them
    rows = 100 * width
    for at, n, fifo in ((rows, width, "bias_in"), (rows + width, 64, "q_norm_in"),
                        (rows + width + 64, 64, "k_norm_in")):
        sent = [t for t in d.sequence[0] if t.fifo == fifo]
        assert {(t.arg, t.pattern.offset) for t in sent} == {(0, at)}
        assert [t.pattern.sizes[0] for t in sent] == [64, 36]
        assert {t.pattern.strides[0] for t in sent} == {0}
        assert sum(t.pattern.numel for t in sent) == 100 * n
    assert [a.name for a in d.args] == ["qkv+bias+q_norm+k_norm+q", "pos", "inv_freq",
                                        "k_cache", "v_cache"]
    assert d.args[0].numel == rows + width + 128 + 100 * 4 * 64


def test_llamas_design_keeps_its_plain_row_fifo_and_kernel():
    d = npu.design_of(QKVRoPE(rows=8, heads=9, kv_heads=3, head_dim=64, ctx=64), "npu2")
    assert d.links == () and "qkv_in" not in {f.name for f in d.fifos}
    assert "qkv_head_row" in d.functions() and "qkv_head_row_qwen" not in d.functions()
    assert [a.name for a in d.args] == ["qkv+q", "pos", "inv_freq", "k_cache", "v_cache"]


def assert_fits_and_verifies(op, d, dev: str) -> None:
    """Design ``d`` of ``op`` keeps every resource rule and the shim's descriptors, and is
    valid as mlir-aie's op definitions and ``verify``'s rules have it (five runtime buffers
    at most, ``sequence_arguments``, among them)."""
    assert [r.text for r in design_rules(d, resources(dev), ()) if not r.ok] == []
    assert allocate(d, resources(dev).shim_bds).overflow is None
    generic = render(d, generic=True)
    assert len(d.args) == 5 and check_text(generic, op.describe(True)) is None


@pytest.mark.parametrize("op", [
    QKVRoPE(rows=64, heads=14, kv_heads=2, head_dim=64, ctx=8192, bias=True),
    QKVRoPE(rows=1, heads=16, kv_heads=8, head_dim=128, ctx=4096, qk_norm=True),
    QKVRoPE(rows=8, heads=4, kv_heads=2, head_dim=64, ctx=64, bias=True, qk_norm=True),
], ids=["qwen2-prefill", "qwen3-decode", "both"])
def test_the_variants_designs_fit_and_verify_against_mlir_aies_op_definitions(op):
    for dev in ("npu1", "npu2"):
        d = npu.design_of(op, dev)
        assert_fits_and_verifies(op, d, dev)
        assert design_estimate(d).terms["compute"] > 0  # the model prices the kernel


SLOTTED = [(dict(rows=4, slots=6, heads=4, kv_heads=2, head_dim=32, ctx=8, bias=True,
                 qk_norm=True), "npu2"),
           (dict(rows=2, slots=2, heads=4, kv_heads=2, head_dim=128, ctx=16, qk_norm=True),
            "npu1")]


@pytest.mark.parametrize("shape,dev", SLOTTED, ids=["both", "qwen3"])
def test_the_slotted_variants_design_matches_the_reference(shape, dev):
    """Batched decode: every row at its own position of its own slot (a padding row of
    position -1 among them: q only), three dispatches on one loaded design."""
    fields, first = SlotQKVRoPE.example(np.random.default_rng(0), **shape)
    graph = OneStep(SlotQKVRoPE, fields, dev)
    exe = target_for(graph.device).emulated().load(graph.record_like(first))
    assert all(d is not None for d in exe.designs), "placed on the host"
    for seed in range(3):
        _, xs = SlotQKVRoPE.example(np.random.default_rng(seed), **shape)
        xs[1][seed % 2] = -1  # a padding row, past the cache: its q only
        want = graph.reference(*[x.copy() for x in xs])
        got = exe.run([x.copy() for x in xs])
        for g, w in zip(got, want):
            assert_close("SlotQKVRoPE", g, w, tolerance_on("SlotQKVRoPE", dev))


def test_the_slotted_variants_weights_follow_the_slots():
    op = SlotQKVRoPE(rows=8, slots=8, heads=14, kv_heads=2, head_dim=64, ctx=1024, bias=True,
                     qk_norm=True)
    for dev in ("npu1", "npu2"):
        d = npu.design_of(op, dev)
        assert [a.name for a in d.args][:2] == ["qkv+bias+q_norm+k_norm+q", "pos+slot"]
        assert_fits_and_verifies(op, d, dev)


@pytest.mark.parametrize("dev", ["npu1", "npu2"])
def test_the_attention_after_a_qwen3_qkv_rope_takes_its_head_dim(dev):
    """Qwen3-0.6B's 16 query heads of 128 over 8 KV heads (head_dim * heads = 2048, twice its
    hidden size): Attention's design at its default setting against the reference."""
    shape = Attention.test_shapes[-1]
    assert shape["head_dim"] == 128
    fields, inputs = Attention.example(np.random.default_rng(0), **shape)
    graph = OneStep(Attention, fields, dev)
    exe = target_for(graph.device).emulated().load(graph.record_like(inputs))
    assert all(d is not None for d in exe.designs), "placed on the host"
    assert_close("Attention", exe.run(inputs)[0], graph.reference(*inputs),
                 tolerance_on("Attention", dev))


class Qwen3Attention(iron.Graph):
    """A Qwen3 attention block up to the attention: the q|k|v projection, the per-head q/k
    norms and RoPE into the KV cache (state across calls), then attention; the norm weights
    are the graph's weights, as a bundle binds them."""

    def body(self, x, pos):  # x: (1, 64), pos: int32 (1,)
        qkv = GEMV.step(self.weight("qkv_proj", (4 * 32, 64)), x)  # (1, 128): 2 q, 1 k, 1 v
        q, k, v = QKVRoPE.step(qkv, pos, self.weight("inv_freq", (16,), np.float32),
                               self.state("k", (1, 8, 32)), self.state("v", (1, 8, 32)),
                               self.weight("q_norm", (32,)), self.weight("k_norm", (32,)),
                               eps=1e-6)
        return Attention.step(q, k, v, pos)  # (1, 64)


def test_a_qwen3_block_folds_with_its_norm_weights_and_keeps_its_cache_across_calls():
    rng = np.random.default_rng(6)
    graph = Qwen3Attention(device="npu2")
    graph.weights = {"qkv_proj": normal(rng, 128, 64, scale=0.1),
                     "inv_freq": rope_frequencies(32, 1e6), "q_norm": normal(rng, 32),
                     "k_norm": normal(rng, 32)}
    for p in range(3):  # each token attends to the keys the earlier calls stored
        x, pos = normal(rng, 1, 64), np.array([p], np.int32)
        assert_close("Attention", graph.emulate(x, pos), graph.reference(x, pos),
                     tolerance_on("Attention", "npu2"))
