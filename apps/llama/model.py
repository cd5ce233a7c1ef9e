"""The Llama decoder as iron graphs, top to bottom (nanoGPT-style: one file, dependency order).

``Decoder`` runs ``rows`` tokens through every layer: it embeds them, writes their keys and
values into the KV cache (state that persists across calls) at positions ``pos``, attends
causally over the cache and returns the final-normed hidden states.  ``Head`` turns one hidden
state into logits.  Decode is ``Decoder(rows=1)`` then ``Head``; prefill is
``Decoder(rows=chunk)`` over a prompt chunk, then ``Head`` on its last real row.
``SlotDecoder`` is batched decode: ``rows`` sequences, one token each, each in its own slot of
a KV cache of ``slots`` sequences, with the head at the end; its steps take every tunable from
the one-row decode and head programs (``match_tunables``), so a sequence's logits are
bit-identical whether it decodes alone or in a batch.

Weight names are the checkpoint's, except three derived in the kernels' layout at bundle time:
``model.layers.N.self_attn.qkv_proj.weight`` (q, k and v stacked, so one matrix product
computes all three and ``QKVRoPE`` rotates them and fills the KV cache),
``model.layers.N.mlp.gate_up_proj.weight`` (gate stacked over up, so one matrix product reads
both and ``SwiGLU`` combines them) and ``rope.inv_freq`` (float32 frequencies, llama3 scaling
included).

Matrices may be stored quantized (``iron.quant``): ``formats`` maps a kernel weight's name to
its (weight_format, group_size); a quantized matrix is a uint8 (rows, row bytes) tensor and
its GEMV / GEMM / Embedding steps name the format. Stacking rows of blocks is exact.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import iron
from iron import quant
from iron.errors import IronError
from iron.lm.checkpoint import LlamaConfig
from iron.errors import ShapeError
from iron.lm.layout import DECODE, HEAD, PREFILL, PREFILL_TAIL, decode_slots
from iron.operators import (GEMM, GEMV, Attention, Concat, ElementwiseAdd, Embedding, QKVRoPE,
                            RMSNorm, SlotAttention, SlotQKVRoPE, SwiGLU)

Formats = dict  # kernel weight name -> (weight_format, group_size); absent means bf16


def matrix(graph: iron.Graph, formats: Formats, name: str, rows: int, k: int):
    """The weight tensor ``name`` (rows, k) as stored, and the fields its steps need."""
    fmt, group = formats.get(name, ("bf16", 32))
    if fmt == "bf16":
        return graph.weight(name, (rows, k)), {}
    return (graph.weight(name, (rows, quant.row_bytes(fmt, k, group, tiled=True)), np.uint8),
            {"weight_format": fmt, "group_size": group})


def linear(weight, x: iron.Tensor, rows_apart: bool = False) -> iron.Tensor:
    """``x @ W.T`` for ``weight`` = (W, fields): a GEMV for one row (decode), a GEMM for a
    chunk (prefill), a batched GEMV when ``rows_apart`` (batched decode: each row computed as
    the one-row GEMV does)."""
    w, fields = weight
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

        def mat(name, rows, k):
            return matrix(self, self.formats, name, rows, k)

        table, fields = mat("model.embed_tokens.weight", c.vocab_size, d)
        x = Embedding.step(table, tokens, **fields)  # (rows, d)
        inv_freq = w("rope.inv_freq", (hd // 2,), np.float32)
        apart = self.slots is not None

        def linear_(weight, x):
            return linear(weight, x, apart)

        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            h = RMSNorm.step(x, w(p + "input_layernorm.weight", (d,)), eps=c.rms_norm_eps)
            if p + SPLIT_QK in self.formats:  # q, k and v not in one format: two products
                qkv = Concat.step(linear_(mat(p + SPLIT_QK, q_dim + kv_dim, d), h),
                                  linear_(mat(p + "self_attn.v_proj.weight", kv_dim, d), h))
            else:
                qkv = linear_(mat(p + "self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, d), h)
            cache = (c.num_key_value_heads, self.ctx, hd)
            if self.slots is None:
                q, k_cache, v_cache = QKVRoPE.step(  # q: (rows, heads * hd), rotated
                    qkv, pos, inv_freq, self.state(f"k_cache.{i}", cache),
                    self.state(f"v_cache.{i}", cache))
                a = Attention.step(q, k_cache, v_cache, pos)  # (rows, heads * hd)
            else:  # row r: its own sequence, at pos[r] in cache slot slot[r]
                cache = (self.slots, *cache)
                q, k_cache, v_cache = SlotQKVRoPE.step(
                    qkv, pos, inv_freq, self.state(f"k_cache.{i}", cache),
                    self.state(f"v_cache.{i}", cache), slot)
                a = SlotAttention.step(q, k_cache, v_cache, pos, slot)  # (rows, heads * hd)
            x = ElementwiseAdd.step(x, linear_(mat(p + "self_attn.o_proj.weight", d, q_dim), a))
            h = RMSNorm.step(x, w(p + "post_attention_layernorm.weight", (d,)),
                             eps=c.rms_norm_eps)
            gate_up = linear_(mat(p + "mlp.gate_up_proj.weight", 2 * c.intermediate_size, d), h)
            m = SwiGLU.step(gate_up)  # (rows, intermediate)
            x = ElementwiseAdd.step(x, linear_(mat(p + "mlp.down_proj.weight", d,
                                                   c.intermediate_size), m))
        return RMSNorm.step(x, w("model.norm.weight", (d,)), eps=c.rms_norm_eps)  # (rows, d)


class Head(iron.Graph):
    """Logits of one hidden state; the tied embedding is the output matrix when there is no
    separate ``lm_head``."""

    def __init__(self, config: LlamaConfig, formats: Formats | None = None, **graph):
        super().__init__(**graph)
        self.config, self.formats = config, formats or {}

    def body(self, h):  # h: (1, hidden)
        return head(self, self.config, h)  # (1, vocab)


def head(graph: iron.Graph, c: LlamaConfig, h: iron.Tensor) -> iron.Tensor:
    """Logits of each row of ``h`` (rows, hidden) -> (rows, vocab)."""
    name = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    return linear(matrix(graph, graph.formats, name, c.vocab_size, c.hidden_size), h, True)


class SlotDecoder(Decoder):
    """Batched decode: ``rows`` sequences, one token each, at positions ``pos`` in KV-cache
    slots ``slot``; returns their logits (rows, vocab)."""

    def __init__(self, config: LlamaConfig, rows: int, ctx: int, slots: int,
                 formats: Formats | None = None, **graph):
        super().__init__(config, rows, ctx, formats, **graph)
        self.slots = slots

    def body(self, tokens, pos, slot):  # int32 (rows,) each
        return head(self, self.config, super().body(tokens, pos, slot))  # (rows, vocab)


def match_tunables(program: iron.Program, like: list) -> iron.Program:
    """``program`` with every step's tunables taken from the same step of ``like`` (operators
    in the same order): a tunable may change a kernel's order of summation (a GEMV's
    ``tile_size_input``, attention's ``tile_size``), so a batched program that shares the
    one-row program's tunables computes each row with exactly the one-row arithmetic."""
    if len(program.steps) != len(like):
        raise ShapeError(f"cannot match tunables: {len(program.steps)} steps against "
                         f"{len(like)}")
    steps = []
    for step, other in zip(program.steps, like):
        if not isinstance(step.op, type(other)):
            raise ShapeError(f"cannot match tunables of {step.op.describe()} to "
                             f"{other.describe()}: different operators")
        op = dataclasses.replace(step.op, **other.tunable_values())
        steps.append(dataclasses.replace(step, op=iron.resolve(
            op, program.device, {n: f"matched to {other.describe()}" for n in op.tunables()})))
    return dataclasses.replace(program, steps=steps)


def tail_chunk(chunk: int) -> int:
    """Rows of the prefill program for a prompt's last rows: half a chunk."""
    return max(1, chunk // 2)


def batch_sizes(batch: int) -> list[int]:
    """Rows of the batched decode programs: powers of two from 2 up to ``batch`` (a step of n
    sequences runs the smallest that holds them)."""
    sizes = [2]
    while sizes[-1] * 2 <= batch:
        sizes.append(sizes[-1] * 2)
    return [b for b in sizes if b <= batch]


def record(config: LlamaConfig, ctx: int, chunk: int, device=None, profile=None,
           formats: Formats | None = None, batch: int = 1) -> dict:
    """The programs of a Llama bundle, recorded and resolved for ``device``: decode, prefill,
    prefill_tail, head, and ``decode_slots<B>`` for each of ``batch_sizes(batch)``."""
    token = iron.spec((1,), np.int32)
    graph = {"device": device, "profile": profile, "formats": formats}

    def rows(n: int):
        return iron.spec((n,), np.int32)

    def prefill(n: int):
        return Decoder(config, n, ctx, **graph).record(rows(n), rows(n))

    reports = iron.profile.batch_reports(profile if isinstance(profile, iron.Profile) else None)
    with reports:  # entries that do not fit this host: one warning line for all the programs
        programs = {
            DECODE: Decoder(config, 1, ctx, **graph).record(token, token),
            PREFILL: prefill(chunk),
            PREFILL_TAIL: prefill(tail_chunk(chunk)),
            HEAD: Head(config, **graph).record((1, config.hidden_size)),
        }
        one_row = programs[DECODE].ops + programs[HEAD].ops
        for b in batch_sizes(batch):
            # the number of slots recorded here is a placeholder: the kernels do not depend on
            # it, and a runtime sizes the cache for its own (see iron.lm.batch)
            program = SlotDecoder(config, b, ctx, slots=b, **graph).record(rows(b), rows(b),
                                                                           rows(b))
            programs[decode_slots(b)] = match_tunables(program, one_row)
    return programs


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
    """(weight_format, group_size) of every quantized kernel weight under ``mode``.

    ``native`` keeps a matrix in the format its source file stored it in when every part of
    it has the same format (SmolLM2's GGUF: Q4_1 projections, a Q8_0 embedding), and splits
    a q|k|v stack whose v alone has another format into q|k (``SPLIT_QK``) and v; ``uint4``
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
    float32, or uint8 blocks in the tiled layout for a matrix ``formats`` names.

    Yields one tensor at a time so a bundle can be written without holding the model twice.
    """
    from iron.lm.checkpoint import inv_freq

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
