"""Matrix operators. Weights use the layout of a Linear layer: ``W`` is (out, in) = (M, K)."""

from __future__ import annotations

from typing import Iterator

from ..devices import Device
from ..operator import (Operator, Rule, bfloat16, columns, expect, expect_dtype, normal, param,
                        pow2_tiles, rule, tunable)
from ..tensor import Tensor


class GEMV(Operator):
    """``y[b] = W @ x[b]`` for ``batches`` vectors: W (M, K), x (K,) or (batches, K).

    ``tile_size_input`` rows of W are computed together (they share each load of x);
    ``tile_size_output`` rows make one unit of parallel work, split over the columns.
    """

    kernel = "gemv"
    tolerance = (0.005, 0.005)
    test_shapes = ({"M": 1, "K": 1, "batches": 1}, {"M": 7, "K": 3, "batches": 1},
                   {"M": 5, "K": 33, "batches": 3}, {"M": 576, "K": 576, "batches": 1},
                   {"M": 192, "K": 1536, "batches": 2})
    sweep_shape = 3
    M: int = param()
    K: int = param()
    batches: int = param(1)
    tile_size_input: int = tunable()
    tile_size_output: int = tunable()
    num_aie_columns: int = tunable()

    @classmethod
    def shape_params(cls, w: Tensor, x: Tensor) -> dict:
        expect(w.ndim == 2, cls, f"W must be (M, K), got shape {w.shape}")
        expect(x.ndim in (1, 2), cls, f"x must be (K,) or (batches, K), got shape {x.shape}")
        return {"M": w.shape[0], "K": w.shape[1], "batches": 1 if x.ndim == 1 else x.shape[0]}

    def signature(self, w: Tensor, x: Tensor) -> list:
        expect(x.shape[-1] == self.K, self, f"x has {x.shape[-1]} columns, W has K={self.K}")
        expect_dtype(w, bfloat16, self, "W")
        expect_dtype(x, bfloat16, self, "x")
        return [(x.shape[:-1] + (self.M,), bfloat16)]

    def space(self, dev: Device) -> dict[str, list[int]]:
        def preference(t: int) -> tuple[bool, int]:
            # work items that split evenly over the columns first (576 rows in items of 64
            # leave one thread a ninth idle), then about 64 rows an item
            return (self.M // t % dev.columns != 0, abs(t - 64))

        return {"num_aie_columns": columns(dev),
                "tile_size_input": [t for t in (4, 8, 2, 1) if self.M % t == 0],
                "tile_size_output": sorted(pow2_tiles(self.M, lo=4, hi=512), key=preference)}

    def rules(self, dev: Device) -> Iterator[Rule]:
        yield from super().rules(dev)
        yield rule(self.tile_size_output % self.tile_size_input == 0,
                   "tile_size_output tile_size_input", "tile_size_output % tile_size_input == 0")
        yield rule(self.M % self.tile_size_output == 0, "tile_size_output",
                   "M % tile_size_output == 0")
        if dev.kind == "npu":
            yield rule(self.M % (self.tile_size_output * self.num_aie_columns) == 0,
                       "tile_size_output num_aie_columns",
                       "M % (tile_size_output * num_aie_columns) == 0")

    @classmethod
    def example(cls, rng, M, K, batches):
        x = normal(rng, K) if batches == 1 else normal(rng, batches, K)
        return {}, [normal(rng, M, K, scale=0.1), x]

    def reference(self, w, x):
        return x @ w.T


class GEMM(Operator):
    """``C = A @ B.T``: A (M, K), B (N, K) in Linear-weight layout, C (M, N).

    Tiles of ``tile_m x tile_k`` of A and ``tile_n x tile_k`` of B make one block product;
    columns split the N dimension.  On a cpu with AMX the hardware fixes the tiles (16 x 32), so
    there only ``tile_n`` and ``num_aie_columns`` change the kernel's speed.
    """

    kernel = "gemm"
    tolerance = (0.005, 0.005)
    test_shapes = ({"M": 1, "K": 1, "N": 1}, {"M": 7, "K": 3, "N": 5}, {"M": 16, "K": 576, "N": 96},
                   {"M": 32, "K": 64, "N": 48},
                   {"M": 20, "K": 96, "N": 80},  # AMX hosts: a part-filled row tile, odd n tiles
                   {"M": 32, "K": 80, "N": 96})  # K % 32 != 0: the non-AMX path on AMX hosts
    sweep_shape = 3
    M: int = param()
    K: int = param()
    N: int = param()
    tile_m: int = tunable()
    tile_k: int = tunable()
    tile_n: int = tunable()
    num_aie_columns: int = tunable()

    @classmethod
    def shape_params(cls, a: Tensor, b: Tensor) -> dict:
        expect(a.ndim == 2 and b.ndim == 2, cls,
               f"A and B must be 2-D, got shapes {a.shape} and {b.shape}")
        return {"M": a.shape[0], "K": a.shape[1], "N": b.shape[0]}

    def signature(self, a: Tensor, b: Tensor) -> list:
        expect(b.shape[1] == self.K, self, f"B has shape {b.shape}, expected (N, K={self.K})")
        expect_dtype(a, bfloat16, self, "A")
        expect_dtype(b, bfloat16, self, "B")
        return [((self.M, self.N), bfloat16)]

    def space(self, dev: Device) -> dict[str, list[int]]:
        return {"num_aie_columns": columns(dev),
                "tile_m": sorted(pow2_tiles(self.M, lo=4, hi=64), key=lambda t: abs(t - 16)),
                "tile_k": sorted(pow2_tiles(self.K, lo=32, hi=1024), key=lambda t: abs(t - 256)),
                "tile_n": sorted(pow2_tiles(self.N, lo=16, hi=256), key=lambda t: abs(t - 32))}

    def rules(self, dev: Device) -> Iterator[Rule]:
        yield from super().rules(dev)
        yield rule(self.K % self.tile_k == 0, "tile_k", "K % tile_k == 0")
        if dev.kind == "cpu":
            yield rule(self.M % self.tile_m == 0, "tile_m", "M % tile_m == 0")
            yield rule(self.N % self.tile_n == 0, "tile_n", "N % tile_n == 0")
        else:
            yield rule(self.M % (self.tile_m * 4) == 0, "tile_m",
                       "M % (tile_m * 4) == 0 (four compute tiles per column)")
            yield rule(self.N % (self.tile_n * self.num_aie_columns) == 0,
                       "tile_n num_aie_columns", "N % (tile_n * num_aie_columns) == 0")

    @classmethod
    def example(cls, rng, M, K, N):
        return {}, [normal(rng, M, K), normal(rng, N, K, scale=0.1)]

    def reference(self, a, b):
        return a @ b.T
