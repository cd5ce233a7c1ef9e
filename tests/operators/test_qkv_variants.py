"""QKVRoPE's Qwen variants: q/k/v biases (Qwen2) and per-head q/k RMSNorm (Qwen3), declared as
optional params that leave Llama's instances as they were."""

import numpy as np
import pytest
from opcases import OneStep, assert_close

import iron
from iron.errors import ShapeError
from iron.operator import normal, rope_frequencies
from iron.operators import QKVRoPE, SlotQKVRoPE
from iron.program import Program

SHAPE = dict(rows=2, heads=4, kv_heads=2, head_dim=8, ctx=6)


def inputs(rng, extra=(), scale=1.0, rows=2, heads=4, kv_heads=2, head_dim=8, ctx=6):
    width = (heads + 2 * kv_heads) * head_dim
    caches = [normal(rng, kv_heads, ctx, head_dim) for _ in range(2)]
    return [(normal(rng, rows, width) * scale).astype(iron.bfloat16),
            np.arange(3, 3 + rows, dtype=np.int32), rope_frequencies(head_dim), *caches,
            *extra]


def test_llamas_instances_keep_their_fields_macros_and_recorded_programs():
    """The variants' params are optional: at their defaults they are in no config, macro or
    stored program, so Llama's artifact keys and bundles do not depend on them."""
    plain = QKVRoPE(**SHAPE)
    assert list(plain.config()) == list(SHAPE)
    assert set(plain.kernel_macros()) == {f"IRON_{n.upper()}" for n in SHAPE}
    assert plain.describe() == ("QKVRoPE(rows=2, heads=4, kv_heads=2, head_dim=8, ctx=6)")
    program = OneStep(QKVRoPE).record_like(inputs(np.random.default_rng(0)))
    assert program.to_json()["steps"][0]["fields"] == SHAPE
    qwen3 = QKVRoPE(**SHAPE, qk_norm=True, eps=1e-5)
    assert qwen3.config() == {**SHAPE, "qk_norm": True, "eps": 1e-5}
    assert qwen3.kernel_macros()["IRON_QK_NORM"] == 1


def test_the_inputs_say_which_variant_a_step_is_and_a_program_keeps_it():
    rng = np.random.default_rng(1)
    width = 8 * 8
    bias = [normal(rng, width)]
    norms = [normal(rng, 8), normal(rng, 8)]
    for extra, variant in (([], {}), (bias, {"bias": True}), (norms, {"qk_norm": True}),
                           (bias + norms, {"bias": True, "qk_norm": True})):
        program = OneStep(QKVRoPE).record_like(inputs(rng, extra))
        op = program.ops[0]
        assert (op.bias, op.qk_norm) == (bool(variant.get("bias")), bool(variant.get("qk_norm")))
        again = Program.from_json(program.to_json())
        assert again.ops[0] == op


@pytest.mark.parametrize("extra,fields,message", [
    ([(8,)], {}, r"bias has shape \(8,\), expected \(64,\)"),
    ([(8,), (4,)], {}, r"k_norm has shape \(4,\), expected \(8,\)"),
    ([(64,), (8,), (8,), (8,)], {}, "at most 3 inputs after the caches"),
    ([], {"eps": 1e-5}, "eps=1e-05 is the q/k norms' epsilon: give it only with q_norm"),
    ([(64,)], {"qk_norm": True}, "qk_norm=True disagrees with the inputs"),
])
def test_weights_that_do_not_fit_the_variant_are_refused(extra, fields, message):
    rng = np.random.default_rng(2)
    with pytest.raises(iron.IronError, match=message):
        OneStep(QKVRoPE, fields).record_like(inputs(rng, [normal(rng, *s) for s in extra]))


def qwen_attention_inputs(x, bias, q_norm, k_norm, pos, inv_freq, heads, kv_heads, hd, eps):
    """q, k, v of one row as Qwen2 / Qwen3 compute them (transformers' modeling_qwen2 /
    modeling_qwen3, llama.cpp's llm_build_qwen2 / qwen3), written head by head in float64:
    bias added to the projections, each q and k head RMS-normed, then rotate-half RoPE."""
    x = x.astype(np.float64) + (0 if bias is None else bias.astype(np.float64))
    q, k, v = np.split(x, [heads * hd, (heads + kv_heads) * hd])
    angle = pos * inv_freq.astype(np.float64)
    out = []
    for part, n, w in ((q, heads, q_norm), (k, kv_heads, k_norm)):
        rotated = []
        for h in part.reshape(n, hd):
            if w is not None:
                h = h / np.sqrt(np.mean(h * h) + eps) * w.astype(np.float64)
            a, b = h[:hd // 2], h[hd // 2:]
            rotated.append(np.concatenate([a * np.cos(angle) - b * np.sin(angle),
                                           b * np.cos(angle) + a * np.sin(angle)]))
        out.append(np.concatenate(rotated))
    return out[0], out[1], v


@pytest.mark.parametrize("bias,qk_norm", [(True, False), (False, True), (True, True)])
def test_the_kernel_computes_what_qwen_computes_head_by_head(bias, qk_norm):
    """The cpu kernel against an independent per-head formulation of the two models' maths
    (not the operator's reference): q out, k and v where the cache stores them."""
    rng = np.random.default_rng(3)
    heads, kv_heads, hd, ctx, pos = 4, 2, 16, 8, 5
    width = (heads + 2 * kv_heads) * hd
    b = normal(rng, width, scale=2) if bias else None
    qn, kn = ((1 + rng.standard_normal(hd) * 0.5).astype(iron.bfloat16) for _ in range(2))
    extra = [x for x in (b,) if x is not None] + ([qn, kn] if qk_norm else [])
    args = inputs(rng, extra, rows=1, heads=heads, kv_heads=kv_heads, head_dim=hd, ctx=ctx)
    args[1] = np.array([pos], np.int32)
    fields = {"eps": 1e-5} if qk_norm else {}
    q, k_cache, v_cache = OneStep(QKVRoPE, fields)(*args)
    want = qwen_attention_inputs(args[0][0], b, qn if qk_norm else None,
                                 kn if qk_norm else None, pos, args[2], heads, kv_heads, hd,
                                 1e-5)
    got = (q[0], k_cache[:, pos].reshape(-1), v_cache[:, pos].reshape(-1))
    for name, g, w in zip("qkv", got, want):
        try:
            assert_close("QKVRoPE", g, w.astype(np.float32))
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def test_the_q_and_k_norms_use_the_eps_given():
    """Heads of values near 1e-3 (mean square near 1e-6): an eps of 1e-4 dominates it, so a
    kernel that used another epsilon gives other q and k."""
    rng = np.random.default_rng(4)
    norms = [normal(rng, 8), normal(rng, 8)]
    args = inputs(rng, norms, scale=1e-3)
    graph = OneStep(QKVRoPE, {"eps": 1e-4})
    out, ref = graph(*args), graph.reference(*args)
    for o, r in zip(out, ref):
        assert_close("QKVRoPE", o, r)
    other = OneStep(QKVRoPE, {"eps": 1e-6}).reference(*args)[0].astype(np.float32)
    assert not np.allclose(other, ref[0].astype(np.float32), rtol=0.1)


def test_the_slotted_form_takes_the_variants_weights_after_the_slots():
    rng = np.random.default_rng(5)
    fields, args = SlotQKVRoPE.example(rng, rows=2, slots=3, heads=2, kv_heads=1, head_dim=8,
                                       ctx=4, bias=True, qk_norm=True)
    op = OneStep(SlotQKVRoPE, fields).record_like(args).ops[0]
    assert (op.bias, op.qk_norm, op.eps) == (True, True, fields["eps"])
    with pytest.raises(ShapeError, match="slot has shape"):
        OneStep(SlotQKVRoPE, fields).record_like(args[:5] + args[6:])
