"""Matrix operators. Weights use the layout of a Linear layer: ``W`` is (out, in) = (M, K)."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..devices import Device
from ..errors import ShapeError
from ..operator import (ACCUMULATED, Operator, Rule, bfloat16, columns, expect, expect_dtype,
                        normal, param, pow2_tiles, rule, tunable)
from ..quant import (FORMATS, PLAIN, TILE, FormatError, activation_blocks, activation_values,
                     check_format, dequantize, k_of, plain_dtype, random_matrix, row_bytes, tile,
                     untile)
from ..tensor import Tensor


def weight_k(op: Operator | type, w: Tensor, fmt: str, group: int) -> int:
    """K of a weight (rows, K) in bf16 or f16, or (rows, row bytes) in a quantized format."""
    name = getattr(op, "__name__", type(op).__name__)
    try:
        check_format(fmt, group, name)
        if fmt in PLAIN:
            return w.shape[1]
        k = k_of(fmt, w.shape[1], group, tiled=True)
    except FormatError as e:
        raise ShapeError(str(e)) from None
    if w.shape[0] % TILE:
        raise ShapeError(f"{name}: a {fmt} weight of {w.shape[0]} rows: quantized weights are "
                         f"stored in tiles of {TILE} rows, so rows must be a multiple of {TILE}")
    return k


def weight_values(fmt: str, w: np.ndarray, k: int, group: int) -> np.ndarray:
    """The float32 values of a weight as a kernel reads it (quantized: the tiled layout)."""
    return dequantize(fmt, w if fmt in PLAIN else untile(fmt, w, k, group), k, group)


def example_weight(rng: np.random.Generator, rows: int, k: int, weight_format: str = "bf16",
                   group_size: int = 32, scale: float = 1.0) -> tuple[dict, np.ndarray]:
    """(call fields, weight matrix) of a test case: bf16 or f16 normal numbers, or valid
    blocks."""
    if weight_format == "bf16":
        return {}, normal(rng, rows, k, scale=scale)
    if weight_format == "f16":
        return ({"weight_format": "f16"},
                tile("f16", random_matrix("f16", rows, k, group_size, rng, scale), k, group_size))
    return ({"weight_format": weight_format, "group_size": group_size},
            tile(weight_format, random_matrix(weight_format, rows, k, group_size, rng, scale), k,
                 group_size))


def output_fields(fields: dict, dtype: str, x_block: int = 16) -> dict:
    """A test case's call fields with its output dtype and x block named where they are not
    the defaults."""
    fields = fields if dtype == "bf16" else {**fields, "output_dtype": dtype}
    return fields if x_block == 16 else {**fields, "x_block": x_block}


def expect_x_block(op: Operator) -> None:
    """x_block must be one its weight format takes (``quant.activation_blocks``)."""
    allowed = activation_blocks(op.weight_format)
    expect(op.x_block in allowed, op, f"x_block={op.x_block} is not one of "
           f"{', '.join(map(str, allowed))} for weight_format {op.weight_format!r} (x is "
           "rounded per 32 values only against a quantized weight whose scales span 32)")


def expect_weight(op: Operator, w: Tensor, rows: int, what: str) -> None:
    """W must be (rows, K) bf16 or f16, or (rows, row bytes) uint8 for a quantized format."""
    fmt, k = op.weight_format, op.K if hasattr(op, "K") else op.dim
    want = (rows, k) if fmt in PLAIN else (rows, row_bytes(fmt, k, op.group_size, tiled=True))
    dtype = plain_dtype(fmt) if fmt in PLAIN else np.uint8
    expect(w.shape == want, op, f"{what} has shape {w.shape}, expected {want} for "
           f"weight_format {fmt!r}")
    expect_dtype(w, dtype, op, what)


#: What a matrix product's output may be stored as: bf16, as every tensor between steps, or
#: float32 for a model's logits (a bf16 logit has 8 significant bits, so the two likeliest
#: tokens tie exactly at a few percent of the steps of a small model, and greedy decoding then
#: takes the lower id where the float32 sums would not tie)
OUTPUT_DTYPES = ("bf16", "float32")


def stored_dtype(op: Operator) -> type:
    """The numpy dtype of a matrix product's output (its ``output_dtype`` param)."""
    return np.float32 if op.output_dtype == "float32" else bfloat16


#: Prefetch distances a quantized GEMV's cpu kernel may use, the default first (bytes of W)
PREFETCH_BYTES = (4096, 3072, 2048)


class GEMV(Operator):
    """``y[b] = W @ x[b]`` for ``batches`` vectors: W (M, K), x (K,) or (batches, K).

    ``tile_size_input`` rows of W are computed together (they share each load of x);
    ``tile_size_output`` rows make one unit of parallel work, split over the columns.
    ``weight_format`` is how W is stored (see ``iron.quant``): bf16 (M, K), or a quantized
    uint8 (M, row bytes) whose blocks the kernel expands in registers.  ``prefetch``: how
    many bytes ahead the cpu kernel for a quantized W asks for W, the best distance being a
    property of the host's caches and prefetchers (on a Sapphire Rapids-class Xeon 3 KiB
    decoded 1.08-1.09x faster than 4 KiB; Zen hosts were measured at 4 KiB); the npu designs
    stream W by DMA and have no use for it.  ``output_dtype`` float32 keeps the float32 sums
    unrounded (a model's head, whose logits decide the next token).  ``x_block``: the values
    of x that share one int8 scale against a quantized W (``quant.activation_values``): 16, or
    32 (the cpu kernel's float steps halve; the npu designs round per 16 only).
    """

    kernel = "gemv"
    tolerance = ACCUMULATED
    test_shapes = ({"M": 1, "K": 1, "batches": 1}, {"M": 7, "K": 3, "batches": 1},
                   {"M": 5, "K": 33, "batches": 3}, {"M": 576, "K": 576, "batches": 1},
                   {"M": 192, "K": 1536, "batches": 2},
                   {"M": 64, "K": 576, "batches": 1, "weight_format": "q4_1"},
                   {"M": 32, "K": 96, "batches": 3, "weight_format": "q4_1"},
                   {"M": 48, "K": 576, "batches": 1, "weight_format": "q4_0"},
                   {"M": 96, "K": 1536, "batches": 1, "weight_format": "q8_0"},
                   {"M": 16, "K": 64, "batches": 2, "weight_format": "q8_0"},
                   {"M": 32, "K": 64, "batches": 9, "weight_format": "q4_1"},
                   {"M": 32, "K": 576, "batches": 1, "weight_format": "uint4", "group_size": 32},
                   {"M": 48, "K": 1536, "batches": 2, "weight_format": "uint4",
                    "group_size": 128},
                   {"M": 32, "K": 512, "batches": 3, "weight_format": "q4_k", "group_size": 256},
                   {"M": 48, "K": 256, "batches": 1, "weight_format": "q6_k", "group_size": 256},
                   {"M": 40, "K": 576, "batches": 3, "output_dtype": "float32"},
                   {"M": 7, "K": 33, "batches": 2, "weight_format": "f16"},
                   {"M": 64, "K": 576, "batches": 1, "weight_format": "f16",
                    "output_dtype": "float32"},
                   {"M": 32, "K": 576, "batches": 2, "weight_format": "q8_0",
                    "output_dtype": "float32"},
                   {"M": 48, "K": 576, "batches": 3, "weight_format": "q4_0", "x_block": 32},
                   {"M": 32, "K": 512, "batches": 2, "weight_format": "q4_k", "group_size": 256,
                    "x_block": 32})
    sweep_shape = 3
    shape_fields = ("weight_format", "group_size")
    M: int = param()
    K: int = param()
    batches: int = param(1)
    weight_format: str = param("bf16", choices=FORMATS)
    group_size: int = param(32)
    output_dtype: str = param("bf16", choices=OUTPUT_DTYPES)
    x_block: int = param(16, optional=True)
    tile_size_input: int = tunable()
    tile_size_output: int = tunable()
    num_aie_columns: int = tunable()
    prefetch: int = tunable()

    @classmethod
    def shape_params(cls, w: Tensor, x: Tensor, weight_format: str = "bf16",
                     group_size: int = 32) -> dict:
        expect(w.ndim == 2, cls, f"W must be (M, K), got shape {w.shape}")
        expect(x.ndim in (1, 2), cls, f"x must be (K,) or (batches, K), got shape {x.shape}")
        return {"M": w.shape[0], "K": weight_k(cls, w, weight_format, group_size),
                "batches": 1 if x.ndim == 1 else x.shape[0]}

    def signature(self, w: Tensor, x: Tensor) -> list:
        expect(x.shape[-1] == self.K, self, f"x has {x.shape[-1]} columns, W has K={self.K}")
        expect_weight(self, w, self.M, "W")
        expect_x_block(self)
        expect_dtype(x, bfloat16, self, "x")
        return [(x.shape[:-1] + (self.M,), stored_dtype(self))]

    def space(self, dev: Device) -> dict[str, list[int]]:
        def preference(t: int) -> tuple[bool, int]:
            # work items that split evenly over the columns first (576 rows in items of 64
            # leave one thread a ninth idle), then about 64 rows an item
            return (self.M // t % dev.columns != 0, abs(t - 64))

        if self.weight_format not in PLAIN:  # rows come in the layout's tiles
            return {"num_aie_columns": columns(dev), "tile_size_input": [TILE],
                    "tile_size_output": sorted((t for t in pow2_tiles(self.M, lo=TILE, hi=512)
                                                if t % TILE == 0), key=preference),
                    "prefetch": list(PREFETCH_BYTES)}
        return {"num_aie_columns": columns(dev),
                "tile_size_input": [t for t in (4, 8, 2, 1) if self.M % t == 0],
                "tile_size_output": sorted(pow2_tiles(self.M, lo=4, hi=512), key=preference),
                "prefetch": list(PREFETCH_BYTES[:1])}

    def rules(self, dev: Device) -> Iterator[Rule]:
        yield from super().rules(dev)
        yield rule(self.tile_size_output % self.tile_size_input == 0,
                   "tile_size_output tile_size_input", "tile_size_output % tile_size_input == 0")
        yield rule(self.M % self.tile_size_output == 0, "tile_size_output",
                   "M % tile_size_output == 0")
        if self.weight_format not in PLAIN:
            yield rule(self.tile_size_input == TILE, "tile_size_input",
                       f"tile_size_input == {TILE} for a quantized W (the rows of one tile of "
                       "its layout are computed together)")

    @classmethod
    def example(cls, rng, M, K, batches, output_dtype="bf16", x_block=16, **fmt):
        x = normal(rng, K) if batches == 1 else normal(rng, batches, K)
        fields, w = example_weight(rng, M, K, scale=0.1, **fmt)
        return output_fields(fields, output_dtype, x_block), [w, x]

    def example_input(self, index, shape, dtype, rng):
        if index == 0 and self.weight_format != "bf16":  # f16: example_weight's dtype
            return example_weight(rng, self.M, self.K, self.weight_format, self.group_size,
                                  0.1)[1]
        return super().example_input(index, shape, dtype, rng)

    def reference(self, w, x):
        if self.weight_format not in PLAIN:  # x rounded to int8 codes per x_block values
            x = activation_values(x, self.x_block)
        return x @ weight_values(self.weight_format, w, self.K, self.group_size).T


class GEMM(Operator):
    """``C = A @ B.T``: A (M, K), B (N, K) in Linear-weight layout, C (M, N).

    Tiles of ``tile_m x tile_k`` of A and ``tile_n x tile_k`` of B make one block product;
    columns split the N dimension.  On a cpu with AMX the hardware fixes the tiles (16 x 32), so
    there only ``tile_n`` and ``num_aie_columns`` change the kernel's speed.  B may be stored
    quantized (``weight_format``, see ``iron.quant``): each row of A is then multiplied as the
    GEMV multiplies x (rounded to int8 codes per ``x_block`` values, integer dot products with
    B's codes), so a row of C is what the GEMV gives for that row.  ``output_dtype`` and
    ``x_block`` as the GEMV's.
    """

    kernel = "gemm"
    tolerance = ACCUMULATED
    test_shapes = ({"M": 1, "K": 1, "N": 1}, {"M": 7, "K": 3, "N": 5}, {"M": 16, "K": 576, "N": 96},
                   {"M": 32, "K": 64, "N": 48},
                   {"M": 20, "K": 96, "N": 80},  # AMX hosts: a part-filled row tile, odd n tiles
                   {"M": 32, "K": 80, "N": 96},  # K % 32 != 0: the non-AMX path on AMX hosts
                   {"M": 16, "K": 576, "N": 96, "weight_format": "q4_1"},
                   {"M": 7, "K": 64, "N": 48, "weight_format": "q8_0"},
                   {"M": 20, "K": 256, "N": 48, "weight_format": "uint4", "group_size": 128},
                   {"M": 9, "K": 512, "N": 32, "weight_format": "q4_k", "group_size": 256},
                   {"M": 6, "K": 256, "N": 48, "weight_format": "q6_k", "group_size": 256},
                   {"M": 20, "K": 96, "N": 80, "output_dtype": "float32"},
                   {"M": 7, "K": 3, "N": 5, "weight_format": "f16"},
                   {"M": 20, "K": 96, "N": 80, "weight_format": "f16"},
                   {"M": 5, "K": 20, "N": 12, "weight_format": "f16"},  # 8x8 blocks and rest
                   {"M": 7, "K": 64, "N": 48, "weight_format": "q8_0", "output_dtype": "float32"},
                   {"M": 20, "K": 256, "N": 48, "weight_format": "q4_1", "x_block": 32})
    sweep_shape = 3
    shape_fields = ("weight_format", "group_size")
    M: int = param()
    K: int = param()
    N: int = param()
    weight_format: str = param("bf16", choices=FORMATS)
    group_size: int = param(32)
    output_dtype: str = param("bf16", choices=OUTPUT_DTYPES)
    x_block: int = param(16, optional=True)
    tile_m: int = tunable()
    tile_k: int = tunable()
    tile_n: int = tunable()
    num_aie_columns: int = tunable()

    @classmethod
    def shape_params(cls, a: Tensor, b: Tensor, weight_format: str = "bf16",
                     group_size: int = 32) -> dict:
        expect(a.ndim == 2 and b.ndim == 2, cls,
               f"A and B must be 2-D, got shapes {a.shape} and {b.shape}")
        weight_k(cls, b, weight_format, group_size)
        return {"M": a.shape[0], "K": a.shape[1], "N": b.shape[0]}

    def signature(self, a: Tensor, b: Tensor) -> list:
        expect_weight(self, b, self.N, "B")
        expect_x_block(self)
        expect_dtype(a, bfloat16, self, "A")
        return [((self.M, self.N), stored_dtype(self))]

    def space(self, dev: Device) -> dict[str, list[int]]:
        return {"num_aie_columns": columns(dev),
                "tile_m": sorted(pow2_tiles(self.M, lo=4, hi=64), key=lambda t: abs(t - 16)),
                "tile_k": sorted(pow2_tiles(self.K, lo=32, hi=1024), key=lambda t: abs(t - 256)),
                "tile_n": sorted(pow2_tiles(self.N, lo=16, hi=256), key=lambda t: abs(t - 32))}

    def rules(self, dev: Device) -> Iterator[Rule]:
        yield from super().rules(dev)
        yield rule(self.K % self.tile_k == 0, "tile_k", "K % tile_k == 0")
        if self.weight_format not in PLAIN:
            yield rule(self.tile_k % self.group_size == 0, "tile_k",
                       f"tile_k % group_size == 0 (B's {self.weight_format} groups of "
                       f"{self.group_size} are expanded whole)")
            yield rule(self.tile_n % TILE == 0, "tile_n",
                       f"tile_n % {TILE} == 0 (B's rows are expanded a {TILE}-row tile of its "
                       "layout at a time)")

    @classmethod
    def example(cls, rng, M, K, N, output_dtype="bf16", x_block=16, **fmt):
        fields, b = example_weight(rng, N, K, scale=0.1, **fmt)
        return output_fields(fields, output_dtype, x_block), [normal(rng, M, K), b]

    def example_input(self, index, shape, dtype, rng):
        if index == 1 and self.weight_format != "bf16":
            return example_weight(rng, self.N, self.K, self.weight_format, self.group_size,
                                  0.1)[1]
        return super().example_input(index, shape, dtype, rng)

    def reference(self, a, b):
        if self.weight_format not in PLAIN:  # A's rows rounded as the GEMV rounds x
            a = activation_values(a, self.x_block)
        return a @ weight_values(self.weight_format, b, self.K, self.group_size).T
