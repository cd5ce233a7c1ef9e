"""Operator test cases, read off the operator registry: each class's ``test_shapes``, its
``example`` inputs and its ``tolerance``. The kernel tests loop over these."""

from __future__ import annotations

import iron
from iron.operator import Operator
from iron.tuning.check import assert_close  # noqa: F401  (the tests' comparison)


class OneStep(iron.Graph):
    """A graph of a single step: ``cls.step(*inputs, **fields)``."""

    def __init__(self, cls, fields=None, device="cpu"):
        super().__init__(device)
        self.cls, self.fields = cls, dict(fields or {})

    def body(self, *inputs):
        return self.cls.step(*inputs, **self.fields)


def operators_under_test() -> list[type[Operator]]:
    """Every registered operator that declares test shapes, by name."""
    return sorted((c for c in Operator.registry.values() if c.test_shapes),
                  key=lambda c: c.__name__)


def case_inputs(name: str, shape: dict, rng) -> tuple[type, dict, list]:
    """(operator class, call fields, input arrays) for one named case at one shape."""
    cls = Operator.registry[name]
    fields, inputs = cls.example(rng, **shape)
    return cls, fields, inputs


#: Shapes per operator: odd and minimum sizes, the Llama shapes of SmolLM2.
SHAPES = {c.__name__: list(c.test_shapes) for c in operators_under_test()}

#: The shape of each operator whose every legal tunable setting is run.
SWEEP = {c.__name__: c.test_shapes[c.sweep_shape] for c in operators_under_test()}


SMALL = [
    ("AXPY", {"shape": (1024,)}), ("ElementwiseAdd", {"shape": (512,)}),
    ("ElementwiseMul", {"shape": (2, 256)}), ("SiLU", {"shape": (512,)}),
    ("SwiGLU", {"rows": 2, "size": 256}),
    ("RMSNorm", {"rows": 8, "size": 64, "weighted": True}),
    ("RMSNorm", {"rows": 4, "size": 96, "weighted": False}),
    ("Softmax", {"rows": 8, "size": 64}),
    ("GEMV", {"M": 64, "K": 32, "batches": 1}), ("GEMV", {"M": 32, "K": 48, "batches": 3}),
    ("GEMM", {"M": 32, "K": 64, "N": 64}),
]
