"""A Q4_K_M GGUF (llama.cpp's mix of Q4_K and Q6_K super-blocks) end to end: converted with
its K-quant blocks kept, bundled with every one of them native (a layer's Q4_K q, k and Q6_K v
as two products joined by Concat), and judged by the KL gate of test_llama.py
against the same file in float32 as transformers' own GGUF reader loads it."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import make_bundle
from test_llama import KQUANT, assert_accurate, decode_logits, kl_stats, prefill_logits

pytestmark = pytest.mark.slow  # end to end: a GGUF, a bundle, transformers

REPO = Path(__file__).resolve().parents[2]


def test_q4_k_m_gguf_runs_its_k_quant_blocks_and_meets_the_kl_gate(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llama_reference import LlamaReference

    from apps.llama.family import FAMILY, open_checkpoint
    from iron.lm import gguf_import
    from iron.lm.generate import LanguageModel

    sys.path.insert(0, str(REPO / "benchmarks"))
    import make_gguf

    shape = make_gguf.Shape(hidden=256, layers=2, heads=4, kv_heads=2, ffn=512)
    src = make_gguf.write(tmp_path / "tiny-Q4_K_M.gguf", shape, "Q4_K_M", seed=1, std=0.1)
    checkpoint = gguf_import.convert_gguf(src, tmp_path / "ckpt", FAMILY)
    ckpt = open_checkpoint(checkpoint)
    kept = {n: ckpt.quantized(n)[0] for n in ckpt.tensor_names() if ckpt.quantized(n)}
    assert kept["model.embed_tokens.weight"] == "q6_k"
    assert kept["model.layers.1.mlp.down_proj.weight"] == "q6_k"  # a layer given more bits
    assert kept["model.layers.0.mlp.down_proj.weight"] == "q4_k"
    assert len(kept) == 1 + 7 * 2  # every matrix kept as its blocks
    bundle = make_bundle(checkpoint, tmp_path / "bundle", chunk=8, context=128)
    formats = json.loads((bundle / "manifest.json").read_text())["meta"]["weight_formats"]
    layer = "model.layers.{}."
    want = {"model.embed_tokens.weight": ["q6_k", 256]}  # also the tied output matrix
    for i, down in ((0, "q4_k"), (1, "q6_k")):
        want.update({layer.format(i) + "mlp.gate_up_proj.weight": ["q4_k", 256],
                     layer.format(i) + "self_attn.o_proj.weight": ["q4_k", 256],
                     layer.format(i) + "mlp.down_proj.weight": [down, 256]})
    # q, k and v run as one matrix when they share a format; layer 1's Q6_K v runs apart
    want[layer.format(0) + "self_attn.qkv_proj.weight"] = ["q4_k", 256]
    want[layer.format(1) + "self_attn.qk_proj.weight"] = ["q4_k", 256]
    want[layer.format(1) + "self_attn.v_proj.weight"] = ["q6_k", 256]
    assert formats == want
    model = LanguageModel(bundle)
    ref = LlamaReference.from_gguf(src)  # the file as transformers reads it, not as iron does
    ids = list(np.random.default_rng(0).integers(300, 40000, 40))
    logits = ref.logits(ids)
    print(f"reference logits: std {logits.std():.3f}, top-1 margin median "
          f"{np.median(np.diff(np.sort(logits, -1)[:, -2:], axis=-1)):.3f}")
    for path, run in (("decode", decode_logits), ("prefill", prefill_logits)):
        ours = run(model, ids)
        kl, agree = kl_stats(logits, ours)
        print(path, end=": ")
        assert_accurate(kl, agree, KQUANT)
        assert np.abs(ours - logits).max() <= 0.05 * np.abs(logits).max()
