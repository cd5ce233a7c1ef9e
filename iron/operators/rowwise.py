"""Row-wise operators: each row of a (rows, size) tensor is computed on its own.

``tile_size`` is the number of rows a column (a thread, on the cpu) takes at a time.
"""

from __future__ import annotations

from typing import ClassVar, Iterator

import numpy as np

from ..devices import Device
from ..operator import (APPROXIMATED, Operator, Rule, bfloat16, columns, expect, expect_dtype,
                        mid_context, normal, param, pow2_tiles, rope_frequencies, rule,
                        tunable)
from ..tensor import Tensor


def rows_and_size(t: Tensor, op: type) -> tuple[int, int]:
    expect(t.ndim in (1, 2), op, f"takes a (size,) or (rows, size) tensor, got shape {t.shape}")
    return (1, t.shape[0]) if t.ndim == 1 else t.shape


class RowWise(Operator):
    """Shared shape logic and tiling of the row-wise operators."""

    streams: ClassVar[int] = 2  # tiles of ``size`` elements in flight per row (in + out)

    rows: int = param()
    size: int = param()
    tile_size: int = tunable()
    num_aie_columns: int = tunable()

    def row_tensor(self, t: Tensor, what: str = "input 0") -> None:
        expect(rows_and_size(t, type(self)) == (self.rows, self.size), self,
               f"{what} has shape {t.shape}, expected ({self.rows}, {self.size})")
        expect_dtype(t, bfloat16, self, what)

    def space(self, dev: Device) -> dict[str, list[int]]:
        return {"num_aie_columns": columns(dev, self.streams * self.rows * self.size * 2),
                "tile_size": pow2_tiles(self.rows)}

    def rules(self, dev: Device) -> Iterator[Rule]:
        yield from super().rules(dev)
        yield rule(self.rows % (self.num_aie_columns * self.tile_size) == 0,
                   "tile_size num_aie_columns", "rows % (num_aie_columns * tile_size) == 0")


class RMSNorm(RowWise):
    """``x / sqrt(mean(x**2) + eps)``, times ``w`` when a weight is given."""

    kernel = "rmsnorm"
    tolerance = APPROXIMATED  # rsqrt
    test_shapes = ({"rows": 1, "size": 1, "weighted": True},
                   {"rows": 5, "size": 7, "weighted": False},
                   {"rows": 1, "size": 576, "weighted": True},
                   {"rows": 8, "size": 576, "weighted": True})
    eps: float = param(1e-5)
    weighted: bool = param()

    @classmethod
    def example(cls, rng, rows, size, weighted):
        return {"eps": 1e-5}, [normal(rng, rows, size), *([normal(rng, size)] if weighted else [])]

    @classmethod
    def shape_params(cls, x: Tensor, *w: Tensor) -> dict:
        expect(len(w) <= 1, cls, f"takes x and an optional weight, got {1 + len(w)} inputs")
        rows, size = rows_and_size(x, cls)
        return {"rows": rows, "size": size, "weighted": bool(w)}

    def signature(self, x: Tensor, *w: Tensor) -> list:
        self.row_tensor(x)
        if w:
            expect(w[0].shape == (self.size,), self, f"weight has shape {w[0].shape}, "
                   f"expected ({self.size},)")
            expect_dtype(w[0], bfloat16, self, "weight")
        return [(x.shape, bfloat16)]

    def reference(self, x, *w):
        out = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(self.eps))
        return out * w[0] if w else out


class Softmax(RowWise):
    """``exp(x - max) / sum(exp(x - max))`` along each row."""

    kernel = "softmax"
    tolerance = APPROXIMATED  # exp
    test_shapes = ({"rows": 1, "size": 1}, {"rows": 3, "size": 37}, {"rows": 4, "size": 2048})

    @classmethod
    def example(cls, rng, rows, size):
        return {}, [normal(rng, rows, size, scale=3)]

    @classmethod
    def shape_params(cls, x: Tensor) -> dict:
        rows, size = rows_and_size(x, cls)
        return {"rows": rows, "size": size}

    def signature(self, x: Tensor) -> list:
        self.row_tensor(x)
        return [(x.shape, bfloat16)]

    def reference(self, x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


class RoPE(RowWise):
    """Rotary position embedding, rotate-half layout (Hugging Face Llama).

    Inputs: ``x`` (rows, heads * head_dim), ``pos`` int32 (rows,) — each row's position, given
    at run time — and ``inv_freq`` float32 (head_dim / 2,), so any frequency rule (plain theta,
    llama3 scaling) is data, not a param.
    """

    kernel = "rope"
    tolerance = APPROXIMATED  # the angles' cos and sin
    test_shapes = ({"rows": 1, "heads": 1, "head_dim": 2}, {"rows": 3, "heads": 9, "head_dim": 64},
                   {"rows": 4, "heads": 3, "head_dim": 64})
    heads: int = param()
    head_dim: int = param()

    @classmethod
    def example(cls, rng, rows, heads, head_dim):
        pos = rng.integers(0, 4096, rows).astype(np.int32)
        return {}, [normal(rng, rows, heads * head_dim), pos, rope_frequencies(head_dim)]

    def example_input(self, index, shape, dtype, rng):
        if index == 1:
            return mid_context(self.rows)
        if index == 2:
            return rope_frequencies(self.head_dim)
        return super().example_input(index, shape, dtype, rng)

    @classmethod
    def shape_params(cls, x: Tensor, pos: Tensor, inv_freq: Tensor) -> dict:
        rows, size = rows_and_size(x, cls)
        head_dim = 2 * inv_freq.shape[0]
        expect(size % head_dim == 0, cls, f"row size {size} is not a multiple of head_dim "
               f"{head_dim} (twice the length of inv_freq)")
        return {"rows": rows, "size": size, "heads": size // head_dim, "head_dim": head_dim}

    def signature(self, x: Tensor, pos: Tensor, inv_freq: Tensor) -> list:
        self.row_tensor(x)
        expect(pos.shape == (self.rows,), self, f"pos has shape {pos.shape}, expected "
               f"({self.rows},)")
        expect_dtype(pos, np.int32, self, "pos")
        expect_dtype(inv_freq, np.float32, self, "inv_freq")
        return [(x.shape, bfloat16)]

    def reference(self, x, pos, inv_freq):
        angle = pos.astype(np.float32)[:, None] * inv_freq[None, :]  # (rows, hd/2)
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        h = x.reshape(self.rows, self.heads, self.head_dim)
        a, b = h[..., : self.head_dim // 2], h[..., self.head_dim // 2:]
        out = np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
        return out.reshape(x.shape)


class SwiGLU(Operator):
    """``silu(x[:, :size]) * x[:, size:]``: the gated MLP activation on a stacked gate|up row.

    Stacking gate and up lets one GEMV compute both projections; this step then reads them once.
    ``tile_size`` counts elements of a row per work item, since decode has a single row.
    """

    kernel = "swiglu"
    tolerance = APPROXIMATED  # exp
    test_shapes = ({"rows": 1, "size": 1}, {"rows": 3, "size": 7}, {"rows": 1, "size": 1536})
    rows: int = param()
    size: int = param()
    tile_size: int = tunable()
    num_aie_columns: int = tunable()

    @classmethod
    def shape_params(cls, x: Tensor) -> dict:
        rows, width = rows_and_size(x, cls)
        expect(width % 2 == 0, cls, f"row width {width} is odd; it must hold gate and up halves")
        return {"rows": rows, "size": width // 2}

    def signature(self, x: Tensor) -> list:
        expect_dtype(x, bfloat16, self, "input 0")
        return [((self.size,) if x.ndim == 1 else (self.rows, self.size), bfloat16)]

    def space(self, dev: Device) -> dict[str, list[int]]:
        return {"num_aie_columns": columns(dev, 3 * self.rows * self.size * 2),
                "tile_size": pow2_tiles(self.size, lo=16)}

    def rules(self, dev: Device) -> Iterator[Rule]:
        yield from super().rules(dev)
        yield rule(self.size % (self.num_aie_columns * self.tile_size) == 0,
                   "tile_size num_aie_columns", "size % (num_aie_columns * tile_size) == 0")

    @classmethod
    def example(cls, rng, rows, size):
        return {}, [normal(rng, rows, 2 * size, scale=2)]

    def reference(self, x):
        gate, up = x[..., : self.size], x[..., self.size:]
        return gate / (np.float32(1) + np.exp(-gate)) * up
