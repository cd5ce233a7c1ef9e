"""RoPE scaling from GGUF files: iron's frequencies are llama.cpp's.

llama.cpp rotates pair ``i`` of a head at position ``p`` by
``p * freq_base ** (-2i / d) / freq_factors[i] * freq_scale`` (``ggml_rope_cache_init`` and
``rope_yarn`` in ggml-cpu's ops.cpp), ``freq_factors`` being the ``rope_freqs.weight`` tensor
and ``freq_scale`` ``1 / llama.rope.scaling.factor`` unless the type is ``none`` (a file without
the type key is ``linear``: ``llama_model::load_hparams``).  Each test computes that formula
itself, in float64 from the file as the ``gguf`` package reads it, and compares iron's float32
``inv_freq`` of the converted checkpoint with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from iron.errors import CheckpointError
from apps.llama import gguf as llama_gguf
from apps.llama.config import LlamaConfig, inv_freq
from apps.llama.family import FAMILY, open_checkpoint
from iron.lm import gguf_import
from iron.lm.gguf_file import GGUFFile
from tiny_llama import TINY_CONFIG, _write_tiny_gguf

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import make_gguf  # noqa: E402

HEAD_DIM = 16  # the tiny GGUF's; its rope base is 10000
# original context 64 puts head_dim 16's wavelengths (6.3 .. 19869) into all three regimes of
# the llama3 rule (kept, interpolated, slowed by 8), as TINY_CONFIG's llama3 scaling does
LLAMA3 = make_gguf.RopeScaling("llama3", factor=8.0, original_context=64)


def llama_cpp_inv_freq(path: Path) -> np.ndarray:
    """llama.cpp's frequency of each pair for the file at ``path``, in float64."""
    reader = gguf.GGUFReader(path)

    def get(key: str, default):
        field = reader.get_field(key)
        return default if field is None else field.contents()

    base = get("llama.rope.freq_base", 10000.0)
    d = get("llama.rope.dimension_count", None)
    factor = get("llama.rope.scaling.factor", get("llama.rope.scale_linear", 0.0))
    none = get("llama.rope.scaling.type", "linear") == "none"
    freq_scale = 1.0 if none or factor == 0.0 else 1.0 / factor
    freq_factors = next((np.asarray(t.data, np.float64) for t in reader.tensors
                         if t.name == "rope_freqs.weight"), np.ones(d // 2))
    i = np.arange(d // 2, dtype=np.float64)
    return base ** (-2.0 * i / d) / freq_factors * freq_scale


def write(path: Path, keys: dict | None = None, rope_freqs: np.ndarray | None = None) -> Path:
    """The tiny Llama GGUF with ``keys`` (name -> float or string) and a rope_freqs tensor."""
    def extra(w: gguf.GGUFWriter) -> None:
        for key, value in (keys or {}).items():
            if isinstance(value, str):
                w.add_string(key, value)
            else:
                w.add_float32(key, value)
        if rope_freqs is not None:
            w.add_tensor("rope_freqs.weight", rope_freqs)
    _write_tiny_gguf(path, seed=3, extra=extra)
    return path


def converted_inv_freq(src: Path, tmp_path: Path) -> np.ndarray:
    """iron's frequencies, through the converted checkpoint's config.json as a bundle gets them."""
    ckpt = open_checkpoint(gguf_import.convert_gguf(src, tmp_path / "ckpt", FAMILY))
    return inv_freq(ckpt.config)


def test_llama3_rope_freqs_give_llama_cpps_frequencies(tmp_path):
    factors = make_gguf.llama3_rope_factors(HEAD_DIM, 10000.0, LLAMA3)
    assert factors[0] == 1 and factors[-1] == 8 and ((factors > 1) & (factors < 8)).any()
    src = write(tmp_path / "llama3.gguf", rope_freqs=factors)
    ours = converted_inv_freq(src, tmp_path)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, llama_cpp_inv_freq(src), rtol=1e-6, atol=0)


@pytest.mark.parametrize("keys, scaled", [
    ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}, True),
    ({"llama.rope.scaling.factor": 2.5}, True),      # no type key: llama.cpp reads linear
    ({"llama.rope.scale_linear": 2.0}, True),         # the older key
    ({"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 4.0}, False),
], ids=["linear", "factor-without-type", "scale_linear", "type-none"])
def test_linear_scaling_gives_llama_cpps_frequencies(tmp_path, keys, scaled):
    src = write(tmp_path / "linear.gguf", keys)
    ours = converted_inv_freq(src, tmp_path)
    np.testing.assert_allclose(ours, llama_cpp_inv_freq(src), rtol=1e-6, atol=0)
    plain = inv_freq(LlamaConfig.from_dict({**TINY_CONFIG, "rope_scaling": None}))
    assert (ours[1:] < plain[1:]).all() == scaled  # the case scales, or leaves RoPE alone


def test_rope_freqs_and_a_linear_factor_multiply(tmp_path):
    factors = make_gguf.llama3_rope_factors(HEAD_DIM, 10000.0, LLAMA3)
    src = write(tmp_path / "both.gguf", {"llama.rope.scaling.factor": 2.0}, factors)
    np.testing.assert_allclose(converted_inv_freq(src, tmp_path), llama_cpp_inv_freq(src),
                               rtol=1e-6, atol=0)


def test_make_gguf_writes_the_factors_of_iron_and_transformers_llama3_rule():
    """The rope_freqs of make_gguf (llama.cpp's converter's computation) are the ratio of plain
    to llama3-scaled frequencies of the same parameters in iron's config.json path."""
    hf = {**TINY_CONFIG["rope_scaling"]}
    assert (hf["factor"], hf["original_max_position_embeddings"]) == (8.0, 64)
    plain = inv_freq(LlamaConfig.from_dict({**TINY_CONFIG, "rope_scaling": None}))
    scaled = inv_freq(LlamaConfig.from_dict(TINY_CONFIG))
    factors = make_gguf.llama3_rope_factors(HEAD_DIM, 10000.0, LLAMA3)
    np.testing.assert_allclose(plain / factors, scaled, rtol=1e-6, atol=0)


@pytest.mark.parametrize("keys, rope_freqs, words", [
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, None,
     ["llama.rope.scaling.type = 'yarn'", "'none' and 'linear'"]),
    ({"llama.rope.scaling.type": "longrope"}, None,
     ["llama.rope.scaling.type = 'longrope'", "not supported"]),
    ({"llama.rope.scaling.attn_factor": 0.5}, None,
     ["llama.rope.scaling.attn_factor = 0.5", "must be 1"]),
    ({"llama.rope.scaling.factor": -2.0}, None,
     ["'llama.rope.scaling.factor' = -2.0", "positive finite"]),
    ({}, np.ones(7, np.float32), ["rope_freqs.weight", "dims [7]", "F32 [8]"]),
    ({}, np.ones(8, np.float16), ["rope_freqs.weight is F16", "F32 [8]"]),
    ({}, np.array([1, 1, 1, 0, 8, 8, 8, 8], np.float32),
     ["rope_freqs.weight[3] = 0.0", "positive finite"]),
], ids=["yarn", "longrope", "attn-factor", "negative-factor", "rope-freqs-size",
        "rope-freqs-f16", "rope-freqs-zero"])
def test_untranslatable_rope_scaling_is_refused_in_one_line(tmp_path, keys, rope_freqs, words):
    src = write(tmp_path / "bad.gguf", keys, rope_freqs)
    with pytest.raises(CheckpointError) as info:
        llama_gguf.gguf_config(GGUFFile.open(src), str(src))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(src))
    for w in words:
        assert w in msg


@pytest.mark.slow  # end to end: a GGUF, a bundle, llama.cpp
def test_llama32_shaped_file_with_rope_freqs_runs_as_llama_cpp_runs_it(tmp_path):
    """A tiny Llama-3.2-shaped Q8_0 file (rope base 500000, rope_freqs of factor 8 over an
    original context of 64, so that most frequencies are scaled within the prompt): iron's
    next-token log-probabilities after prompts of 8, 24 and 48 tokens match llama.cpp's own
    (its library in the test extra's xllamacpp wheel) on the same file.  Ignoring rope_freqs
    puts iron 1 to 7 nats off and changes the top token; the quantized products of the two
    engines differ by about 0.1 nats."""
    pytest.importorskip("xllamacpp")
    from conftest import make_bundle
    from llamacpp import LlamaCpp

    from iron.lm.generate import LanguageModel

    shape = make_gguf.Shape(hidden=256, layers=2, heads=4, kv_heads=2, ffn=512)
    src = make_gguf.write(tmp_path / "llama32-tiny.gguf", shape, "Q8_0", seed=1, std=0.1,
                          rope=make_gguf.RopeScaling("llama3", 8.0, original_context=64))
    checkpoint = gguf_import.convert_gguf(src, tmp_path / "ckpt", FAMILY)
    model = LanguageModel(make_bundle(checkpoint, tmp_path / "bundle", chunk=8, context=128))
    ids = [int(t) for t in np.random.default_rng(0).integers(300, 40000, 48)]
    model.reset()
    logits = np.stack([model.decode(t).astype(np.float64) for t in ids])
    ours = logits - logits.max(-1, keepdims=True)
    ours -= np.log(np.exp(ours).sum(-1, keepdims=True))
    with LlamaCpp(src, n_threads=2, n_ctx=128, warmup=False) as llm:
        for n in (8, 24, 48):
            r = llm._server.handle_completions(llm._request(
                ids[:n], 1, logprobs=10, n_probs=10, post_sampling_probs=False))
            top = r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            top_ids = np.array([t["id"] for t in top])
            theirs = np.array([t["logprob"] for t in top])
            diff = np.abs(ours[n - 1, top_ids] - theirs).max()
            print(f"{n} tokens: llama.cpp top {top_ids[:3]} {theirs[:3]}, iron's top "
                  f"{ours[n - 1].argmax()}, top-10 log-probability difference max {diff:.4f}")
            assert ours[n - 1].argmax() == top_ids[0]
            assert diff <= 0.3


def test_the_float32_reference_rotates_a_rope_freqs_file_as_llama_cpp(tmp_path):
    """transformers' GGUF reader drops rope_freqs; the reference (``LlamaReference.from_gguf``)
    puts it back, so a Llama 3.2 file's float32 reference rotates as llama.cpp does."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llama_reference import LlamaReference

    src = write(tmp_path / "llama3.gguf",
                rope_freqs=make_gguf.llama3_rope_factors(HEAD_DIM, 10000.0, LLAMA3))
    rotary = LlamaReference.from_gguf(src).model.model.rotary_emb
    for freqs in (rotary.inv_freq, rotary.original_inv_freq):
        np.testing.assert_allclose(freqs.numpy(), llama_cpp_inv_freq(src), rtol=1e-6, atol=0)
