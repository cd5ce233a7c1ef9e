"""The Llama family's weights: the tensors a checkpoint holds (Hugging Face names and
``[out, in]`` shapes) and how they become the kernels' weights at bundle time.

Weight names are the checkpoint's, except those derived in the kernels' layout:
``model.layers.N.self_attn.qkv_proj.weight`` (q, k and v stacked, so one matrix product
computes all three and ``QKVRoPE`` rotates them and fills the KV cache; Qwen2's biases stacked
the same way, ``qkv_proj.bias``, which ``QKVRoPE`` adds),
``model.layers.N.mlp.gate_up_proj.weight`` (gate stacked over up, so one matrix product reads
both and ``SwiGLU`` combines them) and ``rope.inv_freq`` (float32 frequencies, llama3 scaling
included).

Matrices may be stored quantized (``iron.quant``): ``Formats`` maps a kernel weight's name to
its (weight_format, group_size); a quantized matrix is a uint8 (rows, row bytes) tensor and
its GEMV / GEMM / Embedding steps name the format. Stacking rows of blocks is exact.
"""

from __future__ import annotations

import numpy as np

import iron
from iron import quant
from iron.errors import IronError

from .config import LlamaConfig, inv_freq

Formats = dict  # kernel weight name -> (weight_format, group_size); absent means bf16


def expected_tensors(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of ``config`` holds, Hugging Face name -> ``[out, in]`` shape."""
    h, inter, v = config.hidden_size, config.intermediate_size, config.vocab_size
    q_out = config.num_attention_heads * config.head_dim
    kv_out = config.num_key_value_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q_out, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv_out, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv_out, h)
        if config.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q_out,)
            shapes[p + "self_attn.k_proj.bias"] = (kv_out,)
            shapes[p + "self_attn.v_proj.bias"] = (kv_out,)
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (config.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (config.head_dim,)
        shapes[p + "self_attn.o_proj.weight"] = (h, q_out)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, h)
        shapes[p + "mlp.up_proj.weight"] = (inter, h)
        shapes[p + "mlp.down_proj.weight"] = (h, inter)
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    return shapes


def tolerated_tensors(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Tensors a checkpoint may hold unused: ``lm_head`` when the embedding is tied (some
    exporters write it anyway), of the embedding's shape."""
    if not config.tie_word_embeddings:
        return {}
    return {"lm_head.weight": (config.vocab_size, config.hidden_size)}


#: Tensors each layer holds at the least (the two norms and seven projections).
TENSORS_PER_LAYER = 9


#: What ``weights=`` selects: the checkpoint's own formats, bf16, or uint4 quantized here.
WEIGHT_MODES = ("native", "bf16", "uint4")
_STACKED = {".self_attn.q_proj.": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
            ".mlp.gate_proj.": ("gate_up_proj", ("gate_proj", "up_proj"))}
_ABSORBED = (".self_attn.k_proj.", ".self_attn.v_proj.", ".mlp.up_proj.")


#: A layer's q and k stacked without v, where q|k and v are stored in different formats.
SPLIT_QK = "self_attn.qk_proj.weight"


def kernel_parts(checkpoint, formats: Formats | None = None) -> dict[str, list[str]]:
    """Kernel weight name -> the checkpoint tensors stacked (in order) to make it; a q|k|v
    stack whose layer ``formats`` splits (``SPLIT_QK``) is q|k and v apart."""
    parts = {}
    for name in checkpoint.tensor_names():
        first = next((k for k in _STACKED if k in name), None)
        if first:
            fused, names = _STACKED[first]
            old = first.strip(".").split(".")[-1]
            stack = [name.replace(old, part) for part in names]
            qk = name.replace("self_attn.q_proj.weight", SPLIT_QK)
            if formats and qk in formats:
                parts[qk], parts[stack[2]] = stack[:2], stack[2:]
            else:
                parts[name.replace(old, fused)] = stack
        elif not any(part in name for part in _ABSORBED):
            parts[name] = [name]
    return parts


def weight_formats(checkpoint, mode: str = "native", group: int = 128) -> Formats:
    """(weight_format, group_size) of every kernel weight not run as bf16 under ``mode``.

    ``native`` keeps a matrix in the format its source file stored it in when every part of
    it has the same format (SmolLM2's GGUF: Q4_1 projections, a Q8_0 embedding; an F16 file
    or a float16 safetensors checkpoint: f16; see ``Checkpoint.quantized``), and splits a q|k|v
    stack whose v alone has another format into q|k (``SPLIT_QK``) and v; ``uint4``
    quantizes every projection (not the embedding) in groups of ``group``, or of 32 where
    ``group`` does not divide its rows (rows not a multiple of 32 stay bf16); ``bf16``
    quantizes nothing. A matrix whose row count is not a whole number of the quantized
    layout's tiles (``iron.quant.TILE`` rows) stays bf16 in every mode.
    """
    if mode not in WEIGHT_MODES:
        raise IronError(f"weights={mode!r} is not one of {', '.join(WEIGHT_MODES)}")
    formats: Formats = {}
    for name, parts in kernel_parts(checkpoint).items():
        shapes = [checkpoint.tensor(p).shape for p in parts]
        if len(shapes[0]) != 2 or sum(s[0] for s in shapes) % quant.TILE:
            continue
        k = shapes[0][1]
        if mode == "native":
            found = [(checkpoint.quantized(p) or ("bf16", None))[0] for p in parts]
            if len(set(found)) == 1 and found[0] != "bf16":
                formats[name] = (found[0], quant.GROUPS[found[0]][0])
            elif (name.endswith("qkv_proj.weight") and found[0] == found[1] != "bf16"
                  and found[2] != "bf16" and shapes[2][0] % quant.TILE == 0):
                # e.g. Q4_K_M's Q4_K q, k and Q6_K v: two products (``Concat`` joins them)
                formats[name.replace("self_attn.qkv_proj.weight", SPLIT_QK)] = (
                    found[0], quant.GROUPS[found[0]][0])
                formats[parts[2]] = (found[2], quant.GROUPS[found[2]][0])
        elif mode == "uint4" and name.endswith("_proj.weight"):
            if k % 32 == 0:
                formats[name] = ("uint4", group if k % group == 0 else 32)
    return formats


def kernel_weights(checkpoint, config: LlamaConfig, formats: Formats | None = None):
    """Every weight the programs bind, as (name, array) in the kernels' layout: bf16 or
    float32, or for a matrix ``formats`` names uint8 blocks in the tiled layout or (f16) the
    file's float16 halves.

    Yields one tensor at a time so a bundle can be written without holding the model twice.
    """
    formats = formats or {}
    yield "rope.inv_freq", inv_freq(config)
    for name, parts in kernel_parts(checkpoint, formats).items():
        fmt, group = formats.get(name, ("bf16", 32))
        if fmt == "bf16":
            arrays = [checkpoint.tensor(p) for p in parts]
            yield name, (np.concatenate(arrays) if len(arrays) > 1 else
                         np.asarray(arrays[0])).astype(iron.bfloat16, copy=False)
        elif fmt == "uint4":
            w = np.concatenate([np.asarray(checkpoint.tensor(p), np.float32) for p in parts])
            yield name, quant.tile(fmt, quant.quantize_uint4(w, group), w.shape[1], group)
        else:
            w = np.concatenate([checkpoint.quantized(p)[1] for p in parts])
            yield name, quant.tile(fmt, w, quant.k_of(fmt, w.shape[1], group), group)
