"""Operators a language model needs beyond linear algebra: lookup, KV cache, attention."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..devices import Device
from ..operator import (APPROXIMATED, Operator, Rule, bfloat16, columns, expect, expect_dtype,
                        mid_context, normal, param, pow2_tiles, rope_frequencies, rule,
                        tunable)
from ..quant import FORMATS, PLAIN, dequantize, tiled_rows
from ..tensor import Tensor
from .matrix import example_weight, expect_weight, weight_k
from .rowwise import RMSNorm, RoPE


class Embedding(Operator):
    """``out[r] = table[tokens[r]]``: table (vocab, dim), tokens int32 (rows,).

    A quantized table (``weight_format``, see ``iron.quant``) is expanded row by row to bf16,
    so the tied embedding and lm head of a model share one copy of the blocks.
    """

    kernel = "embedding"
    test_shapes = ({"vocab": 1, "dim": 1, "rows": 1}, {"vocab": 50, "dim": 7, "rows": 3},
                   {"vocab": 1000, "dim": 576, "rows": 4},
                   {"vocab": 304, "dim": 576, "rows": 5, "weight_format": "q8_0"},
                   {"vocab": 64, "dim": 64, "rows": 3, "weight_format": "q4_1"},
                   {"vocab": 48, "dim": 256, "rows": 2, "weight_format": "uint4",
                    "group_size": 128},
                   {"vocab": 32, "dim": 512, "rows": 3, "weight_format": "q4_k", "group_size": 256},
                   {"vocab": 48, "dim": 256, "rows": 4, "weight_format": "q6_k", "group_size": 256},
                   {"vocab": 50, "dim": 7, "rows": 3, "weight_format": "f16"})
    shape_fields = ("weight_format", "group_size")
    vocab: int = param()
    dim: int = param()
    rows: int = param()
    weight_format: str = param("bf16", choices=FORMATS)
    group_size: int = param(32)
    num_aie_columns: int = tunable()

    @classmethod
    def shape_params(cls, table: Tensor, tokens: Tensor, weight_format: str = "bf16",
                     group_size: int = 32) -> dict:
        expect(table.ndim == 2 and tokens.ndim == 1, cls,
               f"takes table (vocab, dim) and tokens (rows,), got {table.shape} and {tokens.shape}")
        return {"vocab": table.shape[0], "dim": weight_k(cls, table, weight_format, group_size),
                "rows": tokens.shape[0]}

    def signature(self, table: Tensor, tokens: Tensor) -> list:
        expect_weight(self, table, self.vocab, "table")
        expect_dtype(tokens, np.int32, self, "tokens")
        return [((self.rows, self.dim), bfloat16)]

    def space(self, dev: Device) -> dict[str, list[int]]:
        return {"num_aie_columns": columns(dev, 2 * self.rows * self.dim * 2)}

    def rules(self, dev: Device) -> Iterator[Rule]:
        yield from super().rules(dev)
        yield rule(self.rows % self.num_aie_columns == 0, "num_aie_columns",
                   "rows % num_aie_columns == 0")

    @classmethod
    def example(cls, rng, vocab, dim, rows, **fmt):
        fields, table = example_weight(rng, vocab, dim, **fmt)
        return fields, [table, rng.integers(0, vocab, rows).astype(np.int32)]

    def example_input(self, index, shape, dtype, rng):
        if index == 1:  # token ids
            return rng.integers(0, self.vocab, shape).astype(np.int32)
        if self.weight_format != "bf16":
            return example_weight(rng, self.vocab, self.dim, self.weight_format,
                                  self.group_size)[1]
        return super().example_input(index, shape, dtype, rng)

    def reference(self, table, tokens):
        ok = (tokens >= 0) & (tokens < self.vocab)
        index = np.where(ok, tokens, 0)
        fmt, dim, group = self.weight_format, self.dim, self.group_size
        rows = dequantize(fmt, table[index] if fmt in PLAIN else
                          tiled_rows(fmt, table, dim, group, index), dim, group)
        return np.where(ok[:, None], rows, np.float32(0))


def cache_shape(t: Tensor, op: type) -> tuple[int, int, int]:
    expect(t.ndim == 3, op, f"a KV cache is (kv_heads, ctx, head_dim), got shape {t.shape}")
    return t.shape


class CacheWrite(Operator):
    """Write rows of keys or values into a KV cache, in place, at positions ``pos[0] + r``.

    Inputs: cache (kv_heads, ctx, head_dim), x (rows, kv_heads * head_dim), pos int32 (rows,).
    Rows that would land at or past ``ctx`` are dropped (the caller checks the context length).
    """

    kernel = "cache_write"
    inplace = {0: 0}
    test_shapes = ({"kv_heads": 1, "ctx": 1, "head_dim": 1, "rows": 1, "pos": 0},
                   {"kv_heads": 3, "ctx": 64, "head_dim": 64, "rows": 1, "pos": 63},
                   {"kv_heads": 3, "ctx": 64, "head_dim": 64, "rows": 8, "pos": 60})
    kv_heads: int = param()
    ctx: int = param()
    head_dim: int = param()
    rows: int = param()

    @classmethod
    def shape_params(cls, cache: Tensor, x: Tensor, pos: Tensor) -> dict:
        kv_heads, ctx, head_dim = cache_shape(cache, cls)
        return {"kv_heads": kv_heads, "ctx": ctx, "head_dim": head_dim, "rows": x.shape[0]}

    def signature(self, cache: Tensor, x: Tensor, pos: Tensor) -> list:
        expect(x.shape == (self.rows, self.kv_heads * self.head_dim), self,
               f"x has shape {x.shape}, expected ({self.rows}, {self.kv_heads * self.head_dim})")
        expect(pos.shape == (self.rows,), self, f"pos has shape {pos.shape}, expected "
               f"({self.rows},)")
        for t, what in ((cache, "cache"), (x, "x")):
            expect_dtype(t, bfloat16, self, what)
        expect_dtype(pos, np.int32, self, "pos")
        return [(cache.shape, bfloat16)]

    def space(self, dev: Device) -> dict[str, list[int]]:
        return {}

    @classmethod
    def example(cls, rng, kv_heads, ctx, head_dim, rows, pos):
        return {}, [normal(rng, kv_heads, ctx, head_dim), normal(rng, rows, kv_heads * head_dim),
                    np.arange(pos, pos + rows, dtype=np.int32)]

    def example_input(self, index, shape, dtype, rng):
        if index == 2:
            return mid_context(self.rows, self.ctx)
        return super().example_input(index, shape, dtype, rng)

    def reference(self, cache, x, pos):
        out = cache.copy()
        start = int(pos[0])
        n = max(0, min(self.rows, self.ctx - start))
        out[:, start:start + n] = x[:n].reshape(n, self.kv_heads, self.head_dim).swapaxes(0, 1)
        return out


class Concat(Operator):
    """Rows side by side: x (rows, left) and y (rows, right) -> (rows, left + right).

    It joins the parts of a stacked matrix product that cannot run as one product because its
    weights are stored in different formats (a Q4_K_M file's Q4_K q and k beside a Q6_K v)."""

    kernel = "concat"
    test_shapes = ({"rows": 1, "left": 1, "right": 1}, {"rows": 1, "left": 640, "right": 128},
                   {"rows": 5, "left": 96, "right": 33})
    rows: int = param()
    left: int = param()
    right: int = param()

    @classmethod
    def shape_params(cls, x: Tensor, y: Tensor) -> dict:
        expect(x.ndim == 2 and y.ndim == 2 and x.shape[0] == y.shape[0], cls,
               f"takes x (rows, left) and y (rows, right), got {x.shape} and {y.shape}")
        return {"rows": x.shape[0], "left": x.shape[1], "right": y.shape[1]}

    def signature(self, x: Tensor, y: Tensor) -> list:
        expect_dtype(x, bfloat16, self, "x")
        expect_dtype(y, bfloat16, self, "y")
        return [((self.rows, self.left + self.right), bfloat16)]

    def space(self, dev: Device) -> dict[str, list[int]]:
        return {}

    @classmethod
    def example(cls, rng, rows, left, right):
        return {}, [normal(rng, rows, left), normal(rng, rows, right)]

    def reference(self, x, y):
        return np.concatenate([x, y], axis=1)


#: ``QKVRoPE.eps`` unless given: Qwen3's ``rms_norm_eps``.
QK_NORM_EPS = 1e-6


class QKVRoPE(Operator):
    """Split a stacked ``q|k|v`` row, rotate q and k (RoPE) and write k and v into the KV cache.

    Inputs: qkv (rows, (heads + 2 * kv_heads) * head_dim), pos int32 (rows,), inv_freq float32
    (head_dim / 2,), k_cache and v_cache (kv_heads, ctx, head_dim), then the variants' weights
    (``extra_inputs``).  Outputs: q rotated (rows, heads * head_dim), and the two caches,
    updated in place.  It is the composition of ``RoPE`` on q and k and ``CacheWrite`` of k and
    v, in one step, so one matrix product can compute q, k and v together.

    Two variants, both off for Llama, each a param the inputs imply:

    - ``bias`` (Qwen2): a bf16 (width,) ``q|k|v`` bias is added to the row first, in float32,
      as llama.cpp's ``llm_build_qwen2`` adds ``bq``, ``bk``, ``bv`` to the projections;
    - ``qk_norm`` (Qwen3): each query and key head is RMS-normed over its ``head_dim`` with
      epsilon ``eps`` and scaled by the bf16 (head_dim,) weight ``q_norm`` / ``k_norm`` before
      it is rotated (llama.cpp's ``llm_build_qwen3``, ``attn_q_norm`` / ``attn_k_norm``).

    The row stays float32 from the bias to the rotation; k, v and q are rounded to bf16 once.
    """

    kernel = "qkv_rope"
    #: the angles' cos and sin and the norms' rsqrt (``APPROXIMATED``)
    tolerance = APPROXIMATED
    inplace = {1: 3, 2: 4}
    test_shapes = ({"rows": 1, "heads": 1, "kv_heads": 1, "head_dim": 2, "ctx": 1, "pos": 0},
                   {"rows": 1, "heads": 9, "kv_heads": 3, "head_dim": 64, "ctx": 64, "pos": 63},
                   {"rows": 8, "heads": 4, "kv_heads": 2, "head_dim": 16, "ctx": 40, "pos": 36},
                   {"rows": 1, "heads": 7, "kv_heads": 1, "head_dim": 64, "ctx": 32, "pos": 20,
                    "bias": True},
                   {"rows": 3, "heads": 4, "kv_heads": 2, "head_dim": 128, "ctx": 16, "pos": 14,
                    "qk_norm": True},
                   {"rows": 2, "heads": 2, "kv_heads": 1, "head_dim": 2, "ctx": 4, "pos": 1,
                    "bias": True, "qk_norm": True})
    rows: int = param()
    heads: int = param()
    kv_heads: int = param()
    head_dim: int = param()
    ctx: int = param()
    bias: bool = param(False, optional=True)
    qk_norm: bool = param(False, optional=True)
    eps: float = param(QK_NORM_EPS, optional=True)  # the q/k norms' (the model's RMS eps)

    @classmethod
    def shape_params(cls, qkv: Tensor, pos: Tensor, inv_freq: Tensor, k_cache: Tensor,
                     v_cache: Tensor, *extra: Tensor) -> dict:
        kv_heads, ctx, head_dim = cache_shape(k_cache, cls)
        expect(qkv.ndim == 2 and qkv.shape[1] % head_dim == 0, cls,
               f"qkv must be (rows, (heads + 2 * kv_heads) * {head_dim}), got {qkv.shape}")
        heads = qkv.shape[1] // head_dim - 2 * kv_heads
        expect(heads > 0 and heads % kv_heads == 0, cls,
               f"qkv width {qkv.shape[1]} leaves {heads} query heads for {kv_heads} KV heads")
        return {"rows": qkv.shape[0], "heads": heads, "kv_heads": kv_heads,
                "head_dim": head_dim, "ctx": ctx, **variant_of(cls, len(extra))}

    def extra_inputs(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of the variants' bf16 weights, in input order: the q|k|v bias
        (``bias``), then the q and k norm weights (``qk_norm``)."""
        width = (self.heads + 2 * self.kv_heads) * self.head_dim
        return ([("bias", (width,))] if self.bias else []) + (
            [("q_norm", (self.head_dim,)), ("k_norm", (self.head_dim,))] if self.qk_norm
            else [])

    def check_extra(self, extra: tuple[Tensor, ...]) -> None:
        expect(self.qk_norm or self.eps == QK_NORM_EPS, self, f"eps={self.eps} is the q/k "
               "norms' epsilon: give it only with q_norm and k_norm inputs")
        for t, (what, shape) in zip(extra, self.extra_inputs()):
            expect(t.shape == shape, self, f"{what} has shape {t.shape}, expected {shape}")
            expect_dtype(t, bfloat16, self, what)

    def signature(self, qkv: Tensor, pos: Tensor, inv_freq: Tensor, k_cache: Tensor,
                  v_cache: Tensor, *extra: Tensor) -> list:
        expect(v_cache.shape == k_cache.shape, self, f"v_cache has shape {v_cache.shape}, "
               f"k_cache has {k_cache.shape}")
        expect(pos.shape == (self.rows,), self, f"pos has shape {pos.shape}, expected "
               f"({self.rows},)")
        expect(inv_freq.shape == (self.head_dim // 2,), self,
               f"inv_freq has shape {inv_freq.shape}, expected ({self.head_dim // 2},)")
        for t, what in ((qkv, "qkv"), (k_cache, "k_cache"), (v_cache, "v_cache")):
            expect_dtype(t, bfloat16, self, what)
        expect_dtype(pos, np.int32, self, "pos")
        expect_dtype(inv_freq, np.float32, self, "inv_freq")
        self.check_extra(extra)
        return [((self.rows, self.heads * self.head_dim), bfloat16), (k_cache.shape, bfloat16),
                (v_cache.shape, bfloat16)]

    def space(self, dev: Device) -> dict[str, list[int]]:
        return {}

    @classmethod
    def example(cls, rng, rows, heads, kv_heads, head_dim, ctx, pos, bias=False,
                qk_norm=False):
        width = (heads + 2 * kv_heads) * head_dim
        k, v = (normal(rng, kv_heads, ctx, head_dim) for _ in range(2))
        fields, extra = example_extra(rng, width, head_dim, bias, qk_norm)
        return fields, [normal(rng, rows, width), np.arange(pos, pos + rows, dtype=np.int32),
                        rope_frequencies(head_dim), k, v, *extra]

    def example_input(self, index, shape, dtype, rng):
        if index == 1:
            return mid_context(self.rows, self.ctx)
        if index == 2:
            return rope_frequencies(self.head_dim)
        return super().example_input(index, shape, dtype, rng)

    def prepared(self, qkv: np.ndarray, extra: tuple[np.ndarray, ...]) -> np.ndarray:
        """The float32 rows as they are rotated and stored: plus the bias, each q and k head
        RMS-normed and scaled by its weight."""
        weights = dict(zip((name for name, _ in self.extra_inputs()), extra))
        x = qkv + weights["bias"] if self.bias else qkv
        if not self.qk_norm:
            return x
        heads = x.reshape(self.rows, -1, self.head_dim).copy()
        for first, count, w in ((0, self.heads, weights["q_norm"]),
                                (self.heads, self.kv_heads, weights["k_norm"])):
            h = heads[:, first:first + count]
            norm = RMSNorm(rows=h.size // self.head_dim, size=self.head_dim, weighted=True,
                           eps=self.eps)
            heads[:, first:first + count] = norm.reference(
                h.reshape(-1, self.head_dim), w).reshape(h.shape)
        return heads.reshape(x.shape)

    def reference(self, qkv, pos, inv_freq, k_cache, v_cache, *extra):
        hd, q_dim, kv_dim = self.head_dim, self.heads * self.head_dim, self.kv_heads * self.head_dim
        qkv = self.prepared(qkv, extra)
        rope = {n: RoPE(rows=self.rows, size=n * hd, heads=n, head_dim=hd)
                for n in (self.heads, self.kv_heads)}
        q = rope[self.heads].reference(qkv[:, :q_dim], pos, inv_freq)
        k = rope[self.kv_heads].reference(qkv[:, q_dim:q_dim + kv_dim], pos, inv_freq)
        k = k.astype(bfloat16).astype(np.float32)  # RoPE rounds k before it is stored
        v = qkv[:, q_dim + kv_dim:].astype(bfloat16).astype(np.float32)
        write = CacheWrite(kv_heads=self.kv_heads, ctx=self.ctx, head_dim=hd, rows=self.rows)
        return q, write.reference(k_cache, k, pos), write.reference(v_cache, v, pos)


def variant_of(cls: type, extra: int) -> dict:
    """The ``bias`` / ``qk_norm`` params implied by the number of weights after a
    ``QKVRoPE``'s fixed inputs: 1 the bias, 2 the q and k norms, 3 all three."""
    expect(extra <= 3, cls, f"takes at most 3 inputs after the caches (bias, q_norm, k_norm), "
           f"got {extra}")
    return {"bias": extra in (1, 3), "qk_norm": extra >= 2}


def example_extra(rng, width: int, head_dim: int, bias: bool, qk_norm: bool):
    """(fields, inputs) of a test case's variant weights: a bias of the size Qwen2's reach, norm
    weights around 1."""
    extra = [normal(rng, width, scale=2)] if bias else []
    if qk_norm:
        extra += [(1 + rng.standard_normal(head_dim) * 0.5).astype(bfloat16) for _ in range(2)]
    return ({"eps": 1e-5} if qk_norm else {}), extra


class Attention(Operator):
    """Causal grouped-query attention of ``rows`` queries over a KV cache.

    Query row ``r`` sits at position ``pos[0] + r`` and attends to cache positions
    ``0 .. pos[0] + r``; query head ``h`` reads KV head ``h // (heads // kv_heads)``.
    Decode is ``rows == 1``; prefill is a chunk of rows.  ``tile_size`` keys are scored per
    block (online softmax); columns split the (row, head) pairs.
    """

    kernel = "attention"
    #: exp (``APPROXIMATED``), and the npu kernels multiply bf16-rounded probabilities into V:
    #: each p off by up to 2^-9 of itself moves an output by up to 2^-9 * sum p|v|, at most
    #: 2^-8 where sum p|v| < 2, as for the test inputs' standard normal values
    tolerance = (APPROXIMATED[0], 2.0 ** -8)
    test_shapes = ({"rows": 1, "heads": 1, "kv_heads": 1, "head_dim": 1, "ctx": 1, "pos": 0},
                   {"rows": 1, "heads": 9, "kv_heads": 3, "head_dim": 64, "ctx": 300, "pos": 0},
                   {"rows": 1, "heads": 9, "kv_heads": 3, "head_dim": 64, "ctx": 300, "pos": 299},
                   {"rows": 5, "heads": 4, "kv_heads": 2, "head_dim": 16, "ctx": 40, "pos": 3},
                   {"rows": 8, "heads": 9, "kv_heads": 3, "head_dim": 64, "ctx": 64, "pos": 56},
                   {"rows": 2, "heads": 16, "kv_heads": 8, "head_dim": 128, "ctx": 48,
                    "pos": 40})  # Qwen3-0.6B's heads: head_dim * heads > hidden (1024)
    sweep_shape = 2
    rows: int = param()
    heads: int = param()
    kv_heads: int = param()
    head_dim: int = param()
    ctx: int = param()
    tile_size: int = tunable()
    num_aie_columns: int = tunable()

    @classmethod
    def shape_params(cls, q: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor) -> dict:
        kv_heads, ctx, head_dim = cache_shape(k_cache, cls)
        expect(q.ndim == 2 and q.shape[1] % head_dim == 0, cls,
               f"q must be (rows, heads * {head_dim}), got shape {q.shape}")
        heads = q.shape[1] // head_dim
        expect(heads % kv_heads == 0, cls, f"{heads} query heads do not share {kv_heads} KV "
               "heads evenly")
        return {"rows": q.shape[0], "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                "ctx": ctx}

    def signature(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor) -> list:
        expect(v_cache.shape == k_cache.shape, self, f"v_cache has shape {v_cache.shape}, "
               f"k_cache has {k_cache.shape}")
        expect(pos.shape == (self.rows,), self, f"pos has shape {pos.shape}, expected "
               f"({self.rows},)")
        for t, what in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")):
            expect_dtype(t, bfloat16, self, what)
        expect_dtype(pos, np.int32, self, "pos")
        return [(q.shape, bfloat16)]

    def space(self, dev: Device) -> dict[str, list[int]]:
        return {"num_aie_columns": columns(dev),
                "tile_size": sorted(pow2_tiles(self.ctx, lo=16, hi=512),
                                    key=lambda t: abs(t - 128))}

    def rules(self, dev: Device) -> Iterator[Rule]:
        yield from super().rules(dev)
        yield rule(self.tile_size <= self.ctx, "tile_size", f"tile_size <= ctx ({self.ctx})")

    @classmethod
    def example(cls, rng, rows, heads, kv_heads, head_dim, ctx, pos):
        k, v = (normal(rng, kv_heads, ctx, head_dim) for _ in range(2))
        return {}, [normal(rng, rows, heads * head_dim), k, v,
                    np.arange(pos, pos + rows, dtype=np.int32)]

    def example_input(self, index, shape, dtype, rng):
        if index == 3:
            return mid_context(self.rows, self.ctx)
        return super().example_input(index, shape, dtype, rng)

    def reference(self, q, k_cache, v_cache, pos):
        group = self.heads // self.kv_heads
        out = np.zeros((self.rows, self.heads, self.head_dim), np.float32)
        qh = q.reshape(self.rows, self.heads, self.head_dim)
        for r in range(self.rows):
            n = min(int(pos[0]) + r + 1, self.ctx)
            if n <= 0:
                continue  # no key to attend (a padding row): zeros, as the kernel gives
            for h in range(self.heads):
                k, v = k_cache[h // group, :n], v_cache[h // group, :n]
                s = k @ qh[r, h] / np.float32(np.sqrt(self.head_dim))
                p = np.exp(s - s.max())
                out[r, h] = (p / p.sum()) @ v
        return out.reshape(self.rows, self.heads * self.head_dim)


def slot_cache_shape(t: Tensor, op: type) -> tuple[int, int, int]:
    expect(t.ndim == 4, op, "a slotted KV cache is (slots, kv_heads, ctx, head_dim), got shape "
           f"{t.shape}")
    return t.shape[1:]


def slot_positions(rng, rows: int, slots: int, ctx: int) -> tuple[np.ndarray, np.ndarray]:
    """Test inputs of a slotted step: a random position per row (-1, a padding row, included)
    and distinct slots."""
    return (rng.integers(-1, ctx, rows).astype(np.int32),
            rng.permutation(slots)[:rows].astype(np.int32))


def expect_slots(op: Operator, slot: Tensor) -> None:
    expect(slot.shape == (op.rows,), op, f"slot has shape {slot.shape}, expected ({op.rows},)")
    expect_dtype(slot, np.int32, op, "slot")


class Slotted:
    """What the slotted operators share: their kernel is compiled with ``IRON_SLOTTED``, and a
    timing example puts every row in slot 0 (input ``slot_input``, the slot indices)."""

    slot_input: int

    def kernel_macros(self) -> dict[str, int]:
        return {**super().kernel_macros(), "IRON_SLOTTED": 1}

    def example_input(self, index, shape, dtype, rng):
        if index == self.slot_input:
            return np.zeros(self.rows, np.int32)
        return super().example_input(index, shape, dtype, rng)


class SlotQKVRoPE(Slotted, QKVRoPE):
    """``QKVRoPE`` for batched decode: every row is its own sequence, at position ``pos[r]`` of
    KV-cache slot ``slot[r]``.

    Inputs: qkv, pos, inv_freq as ``QKVRoPE``; k_cache and v_cache (slots, kv_heads, ctx,
    head_dim); slot int32 (rows,); then the variants' weights, as ``QKVRoPE``'s.  ``slots``
    is the caches' first dimension: the cpu kernel indexes the caches by ``slot``, whose range
    the caller checks, and does not depend on it (a runtime may size the caches for more
    slots, ``iron.lm.batch``); an npu design moves every slot's cache in its one compiled
    sequence, so it serves exactly ``slots``.  Each row is rotated and written by the same
    code as ``QKVRoPE``'s.
    """

    test_shapes = ({"rows": 1, "slots": 1, "heads": 1, "kv_heads": 1, "head_dim": 2, "ctx": 1},
                   {"rows": 4, "slots": 6, "heads": 9, "kv_heads": 3, "head_dim": 64,
                    "ctx": 64},
                   {"rows": 3, "slots": 4, "heads": 4, "kv_heads": 2, "head_dim": 32,
                    "ctx": 8, "bias": True, "qk_norm": True})
    sweep_shape = -1
    slot_input = 5
    slots: int = param()

    @classmethod
    def shape_params(cls, qkv: Tensor, pos: Tensor, inv_freq: Tensor, k_cache: Tensor,
                     v_cache: Tensor, slot: Tensor, *extra: Tensor) -> dict:
        kv_heads, ctx, head_dim = slot_cache_shape(k_cache, cls)
        flat = Tensor(k_cache.index, (kv_heads, ctx, head_dim), k_cache.dtype)
        return {**super().shape_params(qkv, pos, inv_freq, flat, flat, *extra),
                "slots": k_cache.shape[0]}

    def signature(self, qkv: Tensor, pos: Tensor, inv_freq: Tensor, k_cache: Tensor,
                  v_cache: Tensor, slot: Tensor, *extra: Tensor) -> list:
        expect_slots(self, slot)
        (q, _, _) = super().signature(qkv, pos, inv_freq, k_cache, v_cache, *extra)
        return [q, (k_cache.shape, bfloat16), (v_cache.shape, bfloat16)]

    @classmethod
    def example(cls, rng, rows, slots, heads, kv_heads, head_dim, ctx, bias=False,
                qk_norm=False):
        width = (heads + 2 * kv_heads) * head_dim
        k, v = (normal(rng, slots, kv_heads, ctx, head_dim) for _ in range(2))
        pos, slot = slot_positions(rng, rows, slots, ctx)
        fields, extra = example_extra(rng, width, head_dim, bias, qk_norm)
        return fields, [normal(rng, rows, width), pos, rope_frequencies(head_dim), k, v, slot,
                        *extra]

    def reference(self, qkv, pos, inv_freq, k_cache, v_cache, slot, *extra):
        k_out, v_out = k_cache.copy(), v_cache.copy()
        q = np.zeros((self.rows, self.heads * self.head_dim), np.float32)
        one = QKVRoPE(rows=1, heads=self.heads, kv_heads=self.kv_heads,
                      head_dim=self.head_dim, ctx=self.ctx, bias=self.bias,
                      qk_norm=self.qk_norm, eps=self.eps)
        for r in range(self.rows):
            s = int(slot[r])
            q[r], k_out[s], v_out[s] = one.reference(qkv[r:r + 1], pos[r:r + 1], inv_freq,
                                                     k_out[s], v_out[s], *extra)
        return q, k_out, v_out


class SlotAttention(Slotted, Attention):
    """``Attention`` for batched decode: row ``r`` is one query of its own sequence, at position
    ``pos[r]``, attending keys ``0 .. pos[r]`` of KV-cache slot ``slot[r]``.

    Inputs: q (rows, heads * head_dim), k_cache and v_cache (slots, kv_heads, ctx, head_dim),
    pos and slot int32 (rows,).  ``slots`` as with ``SlotQKVRoPE``.
    Every (row, head) pair runs the same code as ``Attention``'s with the same ``tile_size``, so
    a row's output does not depend on the other rows.
    """

    test_shapes = ({"rows": 1, "slots": 1, "heads": 1, "kv_heads": 1, "head_dim": 1, "ctx": 1},
                   {"rows": 4, "slots": 5, "heads": 9, "kv_heads": 3, "head_dim": 64,
                    "ctx": 300})
    sweep_shape = 1
    slot_input = 4
    slots: int = param()

    @classmethod
    def shape_params(cls, q: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor,
                     slot: Tensor) -> dict:
        flat = Tensor(k_cache.index, slot_cache_shape(k_cache, cls), k_cache.dtype)
        return {**super().shape_params(q, flat, flat, pos), "slots": k_cache.shape[0]}

    def signature(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor,
                  slot: Tensor) -> list:
        expect_slots(self, slot)
        expect(v_cache.shape == k_cache.shape, self, f"v_cache has shape {v_cache.shape}, "
               f"k_cache has {k_cache.shape}")
        flat = Tensor(k_cache.index, k_cache.shape[1:], k_cache.dtype)
        return super().signature(q, flat, flat, pos)

    @classmethod
    def example(cls, rng, rows, slots, heads, kv_heads, head_dim, ctx):
        k, v = (normal(rng, slots, kv_heads, ctx, head_dim) for _ in range(2))
        pos, slot = slot_positions(rng, rows, slots, ctx)
        return {}, [normal(rng, rows, heads * head_dim), k, v, pos, slot]

    def reference(self, q, k_cache, v_cache, pos, slot):
        one = Attention(rows=1, heads=self.heads, kv_heads=self.kv_heads,
                        head_dim=self.head_dim, ctx=self.ctx, tile_size=self.tile_size,
                        num_aie_columns=self.num_aie_columns)
        return np.concatenate([one.reference(q[r:r + 1], k_cache[int(slot[r])],
                                             v_cache[int(slot[r])], pos[r:r + 1])
                               for r in range(self.rows)])
