"""The Llama family in llama.cpp's GGUF files: the metadata keys that make a ``LlamaConfig``,
the tensor names that map to Hugging Face's, and the row order llama.cpp's converter changes
(``convert_hf_to_gguf.py``'s ``LlamaModel.modify_tensors`` permutes q and k rows for its
interleaved RoPE; this undoes it)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from iron.errors import CheckpointError
from iron.lm.gguf_meta import check_layers, check_metadata, check_vocabulary
from iron.lm.gguf_rope import gguf_rope_scaling

from .config import LlamaConfig

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                 "output": "lm_head"}


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF tensor, e.g. ``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.weight"
    m = re.fullmatch(r"(\w+)\.weight", gguf_name)
    if m and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.weight"
    raise CheckpointError(f"GGUF tensor {gguf_name!r} has no Llama counterpart; this converter "
                          "knows token_embd, output_norm, output and blk.N.{"
                          + ",".join(_LAYER_NAMES) + "}")


def unpermute_rows(w: np.ndarray, n_heads: int, head_dim: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> rotate-half halves).

    ``w`` is ``[n_heads * head_dim, in]``; within each head, GGUF row ``2j + p`` goes to row
    ``p * head_dim / 2 + j``.
    """
    out, inp = w.shape
    return w.reshape(n_heads, head_dim // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def from_gguf_rows(config: LlamaConfig, name: str, w: np.ndarray) -> np.ndarray:
    """``w``, the rows of tensor ``name`` in a GGUF file, in Hugging Face order: q and k rows
    un-permuted, every other tensor as it is."""
    heads = {"q_proj.weight": config.num_attention_heads,
             "k_proj.weight": config.num_key_value_heads}
    for suffix, n in heads.items():
        if name.endswith(suffix):
            return unpermute_rows(w, n, config.head_dim)
    return w


def _field(reader: Any, source: str, key: str, default: Any = None,
           required: bool = True) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if required:
            raise CheckpointError(f"{source}: GGUF metadata key {key!r} is missing; "
                                  "the file is not a complete llama.cpp Llama model")
        return default
    return f.contents()


def _float32_decimal(v: float) -> float:
    """The shortest decimal that rounds to the same float32 (9.99999974738e-06 -> 1e-05)."""
    return float(str(np.float32(v)))


def gguf_config(reader: Any, source: str) -> tuple[LlamaConfig, dict[str, Any]]:
    """The Llama config from GGUF metadata, plus token ids and the chat template."""
    check_metadata(reader)
    arch = _field(reader, source, "general.architecture")
    if arch != "llama":
        raise CheckpointError(f"{source}: general.architecture = {arch!r}; only 'llama' GGUF "
                              "files convert")
    def req(key: str) -> Any:
        return _field(reader, source, key)

    def opt(key: str, default: Any) -> Any:
        return _field(reader, source, key, default, required=False)

    a = "llama."
    hidden = int(req(a + "embedding_length"))
    heads = int(req(a + "attention.head_count"))
    kv = int(opt(a + "attention.head_count_kv", heads))
    head_dim = int(opt(a + "attention.key_length", hidden // heads))
    rope_dims = int(opt(a + "rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise CheckpointError(f"{source}: rope.dimension_count = {rope_dims} differs from "
                              f"head_dim = {head_dim}; partial RoPE is not supported")
    names = {t.name for t in reader.tensors}
    rope_scaling = gguf_rope_scaling(reader, head_dim)
    layers = int(req(a + "block_count"))
    check_layers(reader, layers)
    vocab = check_vocabulary(reader, hidden)
    t = "tokenizer.ggml."
    extra = {
        "bos_token_id": opt(t + "bos_token_id", None),
        "eos_token_id": opt(t + "eos_token_id", None),
        "unk_token_id": opt(t + "unknown_token_id", None),
        "pad_token_id": opt(t + "padding_token_id", None),
        "chat_template": opt("tokenizer.chat_template", None),
    }
    data = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(req(a + "feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": _float32_decimal(req(a + "attention.layer_norm_rms_epsilon")),
        "rope_theta": _float32_decimal(opt(a + "rope.freq_base", 10000.0)),
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": "output.weight" not in names,
        "max_position_embeddings": int(_field(reader, source, a + "context_length")),
        "bos_token_id": extra["bos_token_id"],
        "eos_token_id": extra["eos_token_id"],
    }
    return LlamaConfig.from_dict(data, source=f"{source} (GGUF metadata)"), extra
