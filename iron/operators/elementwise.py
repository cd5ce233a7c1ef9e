"""Elementwise operators: one output element per input element, tiled over the flat size."""

from __future__ import annotations

from typing import ClassVar, Iterator

import numpy as np

from ..devices import Device
from ..operator import (APPROXIMATED, Operator, Rule, bfloat16, columns, expect, expect_dtype,
                        normal, numel, param, pow2_tiles, rule, tunable)
from ..tensor import Tensor


class Elementwise(Operator):
    """Shared shape logic: all inputs have one shape; ``size`` is their element count.

    On an NPU each column streams ``tile_size`` elements per input through ``num_channels``
    shim channels; on the cpu a column is a thread working through tiles of ``tile_size``.
    """

    arity: ClassVar[int] = 2
    input_scale: ClassVar[float] = 1.0  # of the test inputs

    size: int = param()
    tile_size: int = tunable()
    num_aie_columns: int = tunable()
    num_channels: int = tunable()

    @classmethod
    def shape_params(cls, *inputs: Tensor) -> dict:
        expect(len(inputs) == cls.arity, cls, f"takes {cls.arity} inputs, got {len(inputs)}")
        return {"size": numel(inputs[0].shape)}

    def signature(self, *inputs: Tensor) -> list:
        for i, t in enumerate(inputs):
            expect(t.shape == inputs[0].shape, self,
                   f"input {i} has shape {t.shape}, input 0 has {inputs[0].shape}")
            expect_dtype(t, bfloat16, self, f"input {i}")
        return [(inputs[0].shape, bfloat16)]

    def space(self, dev: Device) -> dict[str, list[int]]:
        return {"num_aie_columns": columns(dev, (self.arity + 1) * self.size * 2),
                "tile_size": pow2_tiles(self.size, lo=16),
                "num_channels": list(range(1, dev.shim_channels + 1))}

    @classmethod
    def example(cls, rng, shape):
        return {}, [normal(rng, *shape, scale=cls.input_scale) for _ in range(cls.arity)]

    def rules(self, dev: Device) -> Iterator[Rule]:
        yield from super().rules(dev)
        yield rule(self.size % (self.num_aie_columns * self.tile_size) == 0,
                   "tile_size num_aie_columns", "size % (num_aie_columns * tile_size) == 0")


class AXPY(Elementwise):
    """``scalar_factor * x + y``."""

    kernel = "axpy"
    test_shapes = ({"shape": (1,)}, {"shape": (7,)}, {"shape": (2048,)}, {"shape": (3, 576)})
    sweep_shape = 2
    scalar_factor: float = param()

    @classmethod
    def example(cls, rng, shape):
        return {"scalar_factor": 1.5}, super().example(rng, shape)[1]

    def reference(self, x, y):
        return np.float32(self.scalar_factor) * x + y


class ElementwiseAdd(Elementwise):
    """``x + y``."""

    kernel = "add"
    test_shapes = ({"shape": (1,)}, {"shape": (13,)}, {"shape": (576,)})

    def reference(self, x, y):
        return x + y


class ElementwiseMul(Elementwise):
    """``x * y``."""

    kernel = "mul"
    test_shapes = ({"shape": (5,)}, {"shape": (1536,)})

    def reference(self, x, y):
        return x * y


class SiLU(Elementwise):
    """``x * sigmoid(x)``."""

    kernel = "silu"
    tolerance = APPROXIMATED  # exp
    arity = 1
    input_scale = 3.0
    test_shapes = ({"shape": (1,)}, {"shape": (9,)}, {"shape": (1536,)})

    def reference(self, x):
        return x / (np.float32(1) + np.exp(-x))
