"""The Llama decoder as iron graphs, top to bottom (nanoGPT-style: one file, dependency order).

``Decoder`` runs ``rows`` tokens through every layer: it embeds them, writes their keys and
values into the KV cache (state that persists across calls) at positions ``pos``, attends
causally over the cache and returns the final-normed hidden states.  ``Head`` turns one hidden
state into logits.  Decode is ``Decoder(rows=1)`` then ``Head``; prefill is
``Decoder(rows=chunk)`` over a prompt chunk, then ``Head`` on its last real row.

Weight names are the checkpoint's, except three derived in the kernels' layout at bundle time:
``model.layers.N.self_attn.qkv_proj.weight`` (q, k and v stacked, so one matrix product
computes all three and ``QKVRoPE`` rotates them and fills the KV cache),
``model.layers.N.mlp.gate_up_proj.weight`` (gate stacked over up, so one matrix product reads
both and ``SwiGLU`` combines them) and ``rope.inv_freq`` (float32 frequencies, llama3 scaling
included).
"""

from __future__ import annotations

import numpy as np

import iron
from iron.lm.checkpoint import LlamaConfig
from iron.lm.layout import DECODE, HEAD, PREFILL, PREFILL_TAIL
from iron.operators import (GEMM, GEMV, Attention, ElementwiseAdd, Embedding, QKVRoPE, RMSNorm,
                            SwiGLU)


def linear(weight: iron.Tensor, x: iron.Tensor) -> iron.Tensor:
    """``x @ weight.T``: a GEMV for one row (decode), a GEMM for a chunk (prefill)."""
    return GEMV.step(weight, x) if x.shape[0] == 1 else GEMM.step(x, weight)


class Decoder(iron.Graph):
    """All layers over ``rows`` tokens at positions ``pos``; returns normed hidden states."""

    def __init__(self, config: LlamaConfig, rows: int, ctx: int, **graph):
        super().__init__(**graph)
        self.config, self.rows, self.ctx = config, rows, ctx

    def body(self, tokens, pos):  # tokens, pos: int32 (rows,)
        c = self.config
        d, hd = c.hidden_size, c.head_dim
        q_dim, kv_dim = c.num_attention_heads * hd, c.num_key_value_heads * hd
        w = self.weight
        x = Embedding.step(w("model.embed_tokens.weight", (c.vocab_size, d)), tokens)  # (rows, d)
        inv_freq = w("rope.inv_freq", (hd // 2,), np.float32)
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            h = RMSNorm.step(x, w(p + "input_layernorm.weight", (d,)), eps=c.rms_norm_eps)
            qkv = linear(w(p + "self_attn.qkv_proj.weight", (q_dim + 2 * kv_dim, d)), h)
            cache = (c.num_key_value_heads, self.ctx, hd)
            q, k_cache, v_cache = QKVRoPE.step(  # q: (rows, heads * hd), rotated
                qkv, pos, inv_freq, self.state(f"k_cache.{i}", cache),
                self.state(f"v_cache.{i}", cache))
            a = Attention.step(q, k_cache, v_cache, pos)  # (rows, heads * hd)
            x = ElementwiseAdd.step(x, linear(w(p + "self_attn.o_proj.weight", (d, q_dim)), a))
            h = RMSNorm.step(x, w(p + "post_attention_layernorm.weight", (d,)),
                             eps=c.rms_norm_eps)
            gate_up = linear(w(p + "mlp.gate_up_proj.weight", (2 * c.intermediate_size, d)), h)
            m = SwiGLU.step(gate_up)  # (rows, intermediate)
            x = ElementwiseAdd.step(x, linear(w(p + "mlp.down_proj.weight",
                                                (d, c.intermediate_size)), m))
        return RMSNorm.step(x, w("model.norm.weight", (d,)), eps=c.rms_norm_eps)  # (rows, d)


class Head(iron.Graph):
    """Logits of one hidden state; the tied embedding is the output matrix when there is no
    separate ``lm_head``."""

    def __init__(self, config: LlamaConfig, **graph):
        super().__init__(**graph)
        self.config = config

    def body(self, h):  # h: (1, hidden)
        c = self.config
        name = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
        return GEMV.step(self.weight(name, (c.vocab_size, c.hidden_size)), h)  # (1, vocab)


def tail_chunk(chunk: int) -> int:
    """Rows of the prefill program for a prompt's last rows: half a chunk."""
    return max(1, chunk // 2)


def record(config: LlamaConfig, ctx: int, chunk: int, device=None, profile=None) -> dict:
    """The four programs of a Llama bundle, recorded and resolved for ``device``."""
    token = iron.spec((1,), np.int32)
    graph = {"device": device, "profile": profile}

    def prefill(rows: int):
        tokens = iron.spec((rows,), np.int32)
        return Decoder(config, rows, ctx, **graph).record(tokens, tokens)

    batch = iron.profile.batch_reports(profile if isinstance(profile, iron.Profile) else None)
    with batch:  # entries that do not fit this host: one warning line for the four programs
        return {
            DECODE: Decoder(config, 1, ctx, **graph).record(token, token),
            PREFILL: prefill(chunk),
            PREFILL_TAIL: prefill(tail_chunk(chunk)),
            HEAD: Head(config, **graph).record((1, config.hidden_size)),
        }


def kernel_weights(checkpoint, config: LlamaConfig):
    """Every weight the programs bind, as (name, bf16 or float32 array), in the kernels' layout.

    Yields one tensor at a time so a bundle can be written without holding the model twice.
    """
    from iron.lm.checkpoint import inv_freq

    bf16 = iron.bfloat16
    yield "rope.inv_freq", inv_freq(config)
    stacked = {".self_attn.q_proj.": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
               ".mlp.gate_proj.": ("gate_up_proj", ("gate_proj", "up_proj"))}
    absorbed = (".self_attn.k_proj.", ".self_attn.v_proj.", ".mlp.up_proj.")
    for name in checkpoint.tensor_names():
        first = next((k for k in stacked if k in name), None)
        if first:
            fused, parts = stacked[first]
            old = first.strip(".").split(".")[-1]
            yield (name.replace(old, fused), np.concatenate(
                [checkpoint.tensor(name.replace(old, part)) for part in parts]).astype(bf16))
        elif not any(part in name for part in absorbed):
            yield name, np.asarray(checkpoint.tensor(name)).astype(bf16, copy=False)
