"""Symbolic tensors: what a graph's body passes between steps while it is being recorded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

#: The dtype of tensors between steps: brain float 16, as the NPU computes.
bfloat16 = ml_dtypes.bfloat16

#: What a tensor can be in a program.
KINDS = ("input", "weight", "state", "temp")


@dataclass(frozen=True, eq=False)
class Tensor:
    """A value in a recorded program: its shape, dtype, kind and (for named ones) its name.

    ``input`` tensors are the graph's call arguments, ``weight`` tensors are bound once (model
    parameters), ``state`` tensors persist across calls (a KV cache), ``temp`` tensors are
    produced by steps.
    """

    index: int
    shape: tuple[int, ...]
    dtype: Any
    kind: str = "temp"
    name: str | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def spec(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": np.dtype(self.dtype).name, "kind": self.kind,
                "name": self.name}

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"<{self.kind}{label} {np.dtype(self.dtype).name}{list(self.shape)}>"


@dataclass(frozen=True)
class TensorSpec:
    """A shape and dtype given to ``Graph.record`` for one input (a bare tuple means bf16)."""

    shape: tuple[int, ...]
    dtype: Any = bfloat16


def spec(shape: tuple[int, ...] | int, dtype: Any = bfloat16) -> TensorSpec:
    return TensorSpec(tuple(shape) if not isinstance(shape, int) else (shape,), dtype)


def dtype_by_name(name: str) -> np.dtype:
    return np.dtype(bfloat16) if name == "bfloat16" else np.dtype(name)
