"""The Llama decoder as iron graphs, top to bottom (nanoGPT-style: one file, dependency order).

``Decoder`` runs ``rows`` tokens through every layer: it embeds them, writes their keys and
values into the KV cache (state that persists across calls) at positions ``pos``, attends
causally over the cache and returns the final-normed hidden states.  ``Head`` turns one hidden
state into logits.  Decode is ``Decoder(rows=1)`` then ``Head``; prefill is
``Decoder(rows=chunk)`` over a prompt chunk, then ``Head`` on its last real row.
``SlotDecoder`` is batched decode: ``rows`` sequences, one token each, each in its own slot of
a KV cache of ``slots`` sequences, with the head at the end; its steps take every tunable from
the one-row decode and head programs (``programs.match_tunables``), so a sequence's logits are
bit-identical whether it decodes alone or in a batch.

Weight names and formats are ``weights.py``'s: q, k and v stacked in one matrix
(``qkv_proj``, or ``SPLIT_QK`` and v where their formats differ), gate over up
(``gate_up_proj``), and the RoPE frequencies ``rope.inv_freq``.
"""

from __future__ import annotations

import numpy as np

import iron
from iron import quant
from iron.operators import (GEMM, GEMV, Attention, Concat, ElementwiseAdd, Embedding, QKVRoPE,
                            RMSNorm, SlotAttention, SlotQKVRoPE, SwiGLU)

from .config import LlamaConfig
from .weights import SPLIT_QK, Formats


def matrix(graph: iron.Graph, formats: Formats, name: str, rows: int, k: int):
    """The weight tensor ``name`` (rows, k) as stored, and the fields its steps need."""
    fmt, group = formats.get(name, ("bf16", 32))
    if fmt == "bf16":
        return graph.weight(name, (rows, k)), {}
    if fmt in quant.PLAIN:  # f16: the file's halves, converted in the kernels
        return graph.weight(name, (rows, k), quant.plain_dtype(fmt)), {"weight_format": fmt}
    return (graph.weight(name, (rows, quant.row_bytes(fmt, k, group, tiled=True)), np.uint8),
            {"weight_format": fmt, "group_size": group})


#: The products whose x is rounded per 32 values on the cpu (``product_fields``): the
#: attention output and the MLP, 86% of a 1B prefill's kernel time. q, k and v (x straight from
#: RMSNorm, with its outlier channels) and the head keep blocks of 16.
X_BLOCK_32 = ("self_attn.o_proj.", "mlp.")


def product_fields(graph: iron.Graph, fields: dict, name: str) -> dict:
    """The fields of the product by weight ``name``: on the cpu, x rounded per 32 values for
    the ``X_BLOCK_32`` products where the weight's format allows it
    (``quant.activation_blocks``): one float conversion and FMA per 8 vpdpbusd instead of two,
    7-8% faster at a 1B prefill's GEMMs on Zen 4, for a KL from float32 of 0.0031 against
    0.0024 on the embedded model (docs/performance.md). Decode, prefill and batched decode
    all take it, so a prompt token's bits stay its decode bits; the npu designs round per 16."""
    fmt = fields.get("weight_format", "bf16")
    if (graph.device.kind == "cpu" and any(part in name for part in X_BLOCK_32)
            and 32 in quant.activation_blocks(fmt)):
        return {**fields, "x_block": 32}
    return fields


def linear(graph: iron.Graph, weight, x: iron.Tensor, rows_apart: bool = False) -> iron.Tensor:
    """``x @ W.T`` for ``weight`` = (W, fields, name): a GEMV for one row (decode), a GEMM for
    a chunk (prefill), a batched GEMV when ``rows_apart`` (batched decode: each row computed as
    the one-row GEMV does)."""
    w, fields, name = weight
    fields = product_fields(graph, fields, name)
    if x.shape[0] == 1 or rows_apart:
        return GEMV.step(w, x, **fields)
    return GEMM.step(x, w, **fields)


class Decoder(iron.Graph):
    """All layers over ``rows`` tokens at positions ``pos``; returns normed hidden states."""

    #: the KV cache's number of sequences: None for one sequence, (kv_heads, ctx, hd) per layer
    slots: int | None = None

    def __init__(self, config: LlamaConfig, rows: int, ctx: int, formats: Formats | None = None,
                 **graph):
        super().__init__(**graph)
        self.config, self.rows, self.ctx = config, rows, ctx
        self.formats = formats or {}

    def body(self, tokens, pos, slot=None):  # tokens, pos, slot: int32 (rows,)
        c = self.config
        d, hd = c.hidden_size, c.head_dim
        q_dim, kv_dim = c.num_attention_heads * hd, c.num_key_value_heads * hd
        w = self.weight

        def mat(name, rows, k):  # (W, fields, name)
            return matrix(self, self.formats, name, rows, k) + (name,)

        table, fields, _ = mat("model.embed_tokens.weight", c.vocab_size, d)
        x = Embedding.step(table, tokens, **fields)  # (rows, d)
        inv_freq = w("rope.inv_freq", (hd // 2,), np.float32)
        apart = self.slots is not None

        def linear_(weight, x):
            return linear(self, weight, x, apart)

        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            h = RMSNorm.step(x, w(p + "input_layernorm.weight", (d,)), eps=c.rms_norm_eps)
            if p + SPLIT_QK in self.formats:  # q, k and v not in one format: two products
                qkv = Concat.step(linear_(mat(p + SPLIT_QK, q_dim + kv_dim, d), h),
                                  linear_(mat(p + "self_attn.v_proj.weight", kv_dim, d), h))
            else:
                qkv = linear_(mat(p + "self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, d), h)
            extra, fields = self.variant_inputs(p)  # Qwen2's q|k|v bias, Qwen3's q/k norms
            cache = (c.num_key_value_heads, self.ctx, hd)
            if self.slots is None:
                q, k_cache, v_cache = QKVRoPE.step(  # q: (rows, heads * hd), rotated
                    qkv, pos, inv_freq, self.state(f"k_cache.{i}", cache),
                    self.state(f"v_cache.{i}", cache), *extra, **fields)
                a = Attention.step(q, k_cache, v_cache, pos)  # (rows, heads * hd)
            else:  # row r: its own sequence, at pos[r] in cache slot slot[r]
                cache = (self.slots, *cache)
                q, k_cache, v_cache = SlotQKVRoPE.step(
                    qkv, pos, inv_freq, self.state(f"k_cache.{i}", cache),
                    self.state(f"v_cache.{i}", cache), slot, *extra, **fields)
                a = SlotAttention.step(q, k_cache, v_cache, pos, slot)  # (rows, heads * hd)
            x = ElementwiseAdd.step(x, linear_(mat(p + "self_attn.o_proj.weight", d, q_dim), a))
            h = RMSNorm.step(x, w(p + "post_attention_layernorm.weight", (d,)),
                             eps=c.rms_norm_eps)
            gate_up = linear_(mat(p + "mlp.gate_up_proj.weight", 2 * c.intermediate_size, d), h)
            m = SwiGLU.step(gate_up)  # (rows, intermediate)
            x = ElementwiseAdd.step(x, linear_(mat(p + "mlp.down_proj.weight", d,
                                                   c.intermediate_size), m))
        return RMSNorm.step(x, w("model.norm.weight", (d,)), eps=c.rms_norm_eps)  # (rows, d)

    def variant_inputs(self, p: str) -> tuple[list[iron.Tensor], dict]:
        """What a family member adds to layer ``p``'s ``QKVRoPE`` step, in its input order:
        Qwen2's stacked q|k|v bias, added before the rotation; Qwen3's q and k norm weights,
        each head RMS-normed with the model's epsilon before it is rotated."""
        c, hd = self.config, self.config.head_dim
        extra, fields = [], {}
        if c.qkv_bias:
            width = (c.num_attention_heads + 2 * c.num_key_value_heads) * hd
            extra.append(self.weight(p + "self_attn.qkv_proj.bias", (width,)))
        if c.qk_norm:
            extra += [self.weight(p + "self_attn.q_norm.weight", (hd,)),
                      self.weight(p + "self_attn.k_norm.weight", (hd,))]
            fields["eps"] = c.rms_norm_eps
        return extra, fields


class Head(iron.Graph):
    """Logits of one hidden state; the tied embedding is the output matrix when there is no
    separate ``lm_head``."""

    def __init__(self, config: LlamaConfig, formats: Formats | None = None, **graph):
        super().__init__(**graph)
        self.config, self.formats = config, formats or {}

    def body(self, h):  # h: (1, hidden)
        return head(self, self.config, h)  # (1, vocab)


def head(graph: iron.Graph, c: LlamaConfig, h: iron.Tensor) -> iron.Tensor:
    """Float32 logits of each row of ``h`` (rows, hidden) -> (rows, vocab): rounded to bf16,
    the two likeliest tokens would tie at a few percent of the steps and greedy decoding would
    take the lower id."""
    name = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    w, fields = matrix(graph, graph.formats, name, c.vocab_size, c.hidden_size)
    return GEMV.step(w, h, output_dtype="float32", **fields)


class SlotDecoder(Decoder):
    """Batched decode: ``rows`` sequences, one token each, at positions ``pos`` in KV-cache
    slots ``slot``; returns their logits (rows, vocab)."""

    def __init__(self, config: LlamaConfig, rows: int, ctx: int, slots: int,
                 formats: Formats | None = None, **graph):
        super().__init__(config, rows, ctx, formats, **graph)
        self.slots = slots

    def body(self, tokens, pos, slot):  # int32 (rows,) each
        return head(self, self.config, super().body(tokens, pos, slot))  # (rows, vocab)
