"""A small random Llama-3-style checkpoint for tests: every loader feature, a few hundred KB.

``write_tiny_llama(dir, seed)`` writes llama3 rope scaling, an untied ``lm_head``, grouped-query
attention, two bfloat16 (or float16) safetensors shards with ``model.safetensors.index.json``,
and a real ``tokenizer.json``: byte-level BPE without merges, where token id ``b`` is byte ``b``
(0..255) followed by four special tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np


TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 260,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    # original_max_position_embeddings 64 puts head_dim 16's eight wavelengths (6.3 .. 19869)
    # into all three regimes of the llama3 rule: kept (< 16), smoothed, slowed (> 64).
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "tie_word_embeddings": False,
    "max_position_embeddings": 512,
    "bos_token_id": 256,
    "eos_token_id": [257, 258],
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "bfloat16",
}
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|pad|>"]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tokenizer(path: Path) -> None:
    """Byte-level BPE without merges: id b is byte b; specials follow at 256.."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in SPECIAL_TOKENS])
    tok.save(str(path))


def tiny_weights(config: dict, seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights in Hugging Face names: N(0, 0.02) matrices, norms near 1."""
    from apps.llama.config import LlamaConfig
    from apps.llama.weights import expected_tensors

    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_tensors(LlamaConfig.from_dict(config)).items():
        if name.endswith("norm.weight"):
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return out


def random_weights(program, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights for every weight a recorded decoder program binds: RoPE frequencies of base
    10000, norm weights around 1, every other tensor normal with std 0.1."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, t in program.named("weight").items():
        if name == "rope.inv_freq":
            weights[name] = (10000.0 ** -(np.arange(t.shape[0]) / t.shape[0])).astype(t.dtype)
        elif name.endswith("norm.weight"):
            weights[name] = (1 + 0.1 * rng.standard_normal(t.shape)).astype(t.dtype)
        else:
            weights[name] = (0.1 * rng.standard_normal(t.shape)).astype(t.dtype)
    return weights


def write_tiny_llama(directory: str | Path, seed: int = 0, dtype: str = "bfloat16") -> Path:
    """Write the tiny checkpoint into ``directory`` (created) and return it; ``dtype``
    (bfloat16 or float16) is the type every tensor is stored in."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stored = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
    weights = {n: w.astype(stored) for n, w in tiny_weights(TINY_CONFIG, seed).items()}
    shards = {"model-00001-of-00002.safetensors": {}, "model-00002-of-00002.safetensors": {}}
    for name, w in weights.items():
        first = name.startswith(("model.embed_tokens", "model.layers.0."))
        shards["model-00001-of-00002.safetensors" if first else
               "model-00002-of-00002.safetensors"][name] = w
    weight_map = {}
    for file, tensors in shards.items():
        save_file(tensors, str(directory / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in tensors})
    total = sum(w.nbytes for w in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {**TINY_CONFIG, "torch_dtype": dtype}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(directory / "tokenizer.json")
    return directory


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's q/k permutation (rotate-half -> interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def llama_cpp_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of ``llama_cpp_permute`` (interleaved -> rotate-half)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def _write_tiny_gguf(path: Path, seed: int, quantize: bool = False,
                     types: dict[str, str] | None = None,
                     extra: Callable[[Any], None] | None = None) -> dict[str, np.ndarray]:
    """A float32 Llama GGUF as llama.cpp's converter would write the tiny model (no scaling);
    with ``quantize``, projections in Q4_1 and the embedding in Q8_0, like SmolLM2's file;
    ``types`` stores the tensors whose name ends with a key as that GGML type instead;
    ``extra(writer)`` adds keys or tensors (RoPE scaling) before the file is written.
    Returns the float32 weights written (the blocks' values when quantized)."""
    import gguf
    from gguf.quants import dequantize, quantize as gguf_quantize

    cfg = {**TINY_CONFIG, "rope_scaling": None, "eos_token_id": 257}
    weights = tiny_weights(cfg, seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(16)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(260)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    table = bytes_to_unicode()
    w.add_token_list([table[b] for b in range(256)] + SPECIAL_TOKENS)
    w.add_token_types([1] * 256 + [3] * 4)
    w.add_token_merges([])
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)
    w.add_pad_token_id(259)
    # GGUF names from gguf-py's own table (what llama.cpp's converter uses), not iron's
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg["num_hidden_layers"])
    for name, t in weights.items():
        gname = names.get_name(name, try_suffixes=(".weight",))
        assert gname, f"gguf-py has no GGUF name for {name}"
        if name.endswith("q_proj.weight"):
            t = llama_cpp_permute(t, 4)
        elif name.endswith("k_proj.weight"):
            t = llama_cpp_permute(t, 2)
        qtype = None
        if quantize and name.endswith("_proj.weight"):
            qtype = gguf.GGMLQuantizationType.Q4_1
        elif quantize and name == "model.embed_tokens.weight":
            qtype = gguf.GGMLQuantizationType.Q8_0
        for suffix, kind in (types or {}).items():
            if name.endswith(suffix):
                qtype = gguf.GGMLQuantizationType[kind]
        if qtype is None:
            w.add_tensor(gname, np.ascontiguousarray(t))
            continue
        blocks = gguf_quantize(np.ascontiguousarray(t, np.float32), qtype)
        w.add_tensor(gname, blocks, raw_dtype=qtype)
        values = dequantize(blocks, qtype)
        heads = 4 if name.endswith("q_proj.weight") else 2
        weights[name] = (llama_cpp_unpermute(values, heads)
                         if name.endswith(("q_proj.weight", "k_proj.weight")) else values)
    if extra is not None:
        extra(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights
