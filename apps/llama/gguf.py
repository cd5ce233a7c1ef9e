"""The Llama family in llama.cpp's GGUF files: the metadata keys that make a ``LlamaConfig``,
the tensor names that map to Hugging Face's, and the row order llama.cpp's converter changes.

``general.architecture`` is the member: ``llama``, ``qwen2`` or ``qwen3``, each with its keys
under its own prefix (``qwen2.block_count``, ...).  llama.cpp's converter permutes a Llama
file's q and k rows for its interleaved RoPE (``convert_hf_to_gguf.py``'s
``LlamaModel.modify_tensors``), which this undoes; Qwen2 and Qwen3 run llama.cpp's NEOX RoPE
(rotating halves, as transformers does) and are stored unpermuted (``conversion/qwen.py``;
``llama_model_rope_type`` in ``src/llama-model.cpp``).  Their extra tensors are gguf-py's
``blk.N.attn_{q,k,v}.bias`` (Qwen2) and ``blk.N.attn_{q,k}_norm.weight`` (Qwen3)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from iron.errors import CheckpointError
from iron.lm.gguf_meta import check_layers, check_metadata, check_vocabulary
from iron.lm.gguf_rope import gguf_rope_scaling

from .config import VARIANTS, LlamaConfig

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
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
#: ``general.architecture`` -> the member's ``model_type`` (``config.VARIANTS``)
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                 "output": "lm_head"}


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF tensor, e.g. ``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight`` (and ``.bias`` -> ``.bias``)."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    m = re.fullmatch(r"(\w+)\.weight", gguf_name)
    if m and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.weight"
    raise CheckpointError(f"GGUF tensor {gguf_name!r} has no Llama-family counterpart; this "
                          "converter knows token_embd, output_norm, output and blk.N.{"
                          + ",".join(_LAYER_NAMES) + "}.{weight,bias}")


def unpermute_rows(w: np.ndarray, n_heads: int, head_dim: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> rotate-half halves).

    ``w`` is ``[n_heads * head_dim, in]``; within each head, GGUF row ``2j + p`` goes to row
    ``p * head_dim / 2 + j``.
    """
    out, inp = w.shape
    return w.reshape(n_heads, head_dim // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def from_gguf_rows(config: LlamaConfig, name: str, w: np.ndarray) -> np.ndarray:
    """``w``, the rows of tensor ``name`` in a GGUF file, in Hugging Face order: a Llama
    file's q and k rows un-permuted, every other tensor as it is."""
    if config.model_type != "llama":
        return w
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
    """The Llama-family config from GGUF metadata, plus token ids and the chat template."""
    arch = _field(reader, source, "general.architecture")
    if arch not in ARCHITECTURES:
        known = ", ".join(repr(a) for a in ARCHITECTURES)
        raise CheckpointError(f"{source}: general.architecture = {arch!r}; only {known} GGUF "
                              "files convert")
    check_metadata(reader, arch)
    def req(key: str) -> Any:
        return _field(reader, source, key)

    def opt(key: str, default: Any) -> Any:
        return _field(reader, source, key, default, required=False)

    a = arch + "."
    hidden = int(req(a + "embedding_length"))
    heads = int(req(a + "attention.head_count"))
    kv = int(opt(a + "attention.head_count_kv", heads))
    head_dim = int(opt(a + "attention.key_length", hidden // heads))
    rope_dims = int(opt(a + "rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise CheckpointError(f"{source}: rope.dimension_count = {rope_dims} differs from "
                              f"head_dim = {head_dim}; partial RoPE is not supported")
    names = {t.name for t in reader.tensors}
    rope_scaling = gguf_rope_scaling(reader, head_dim, arch)
    layers = int(req(a + "block_count"))
    check_layers(reader, layers, arch)
    vocab = check_vocabulary(reader, hidden, arch)
    t = "tokenizer.ggml."
    extra = {
        "bos_token_id": opt(t + "bos_token_id", None),
        "eos_token_id": opt(t + "eos_token_id", None),
        "unk_token_id": opt(t + "unknown_token_id", None),
        "pad_token_id": opt(t + "padding_token_id", None),
        "chat_template": opt("tokenizer.chat_template", None),
    }
    model_type = ARCHITECTURES[arch]
    data = {
        "architectures": [VARIANTS[model_type].architecture],
        "model_type": model_type,
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
