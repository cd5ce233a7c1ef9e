"""What the tuner tunes: the distinct operator instances of an application, and their candidates.

An instance is an operator with its tunables cleared (class + params); its tuned setting
applies to all its uses.  Its candidates are the frozen operators of
``legal_settings(op, dev)``, the same legality rules ``resolve`` enforces.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..devices import Device
from ..operator import Operator
from ..program import Program
from ..resolution import legal_settings


@dataclass(frozen=True)
class InputSpec:
    """One input of a step: its shape and dtype, and whether it is cold in the real model.

    Weights and state (a KV cache) are read once per token from main memory; activations were
    just written by the previous step and sit in cache.
    """

    shape: tuple[int, ...]
    dtype: Any
    cold: bool


@dataclass(frozen=True)
class Instance:
    """A distinct operator instance of the application: ``op`` has every tunable unset."""

    op: Operator
    current: Operator  # as the application resolves it under the previous profile
    inputs: tuple[InputSpec, ...]
    uses: int

    def describe(self) -> str:
        return self.op.describe()

    def setting(self, op: Operator | None = None) -> dict[str, int]:
        return (op or self.current).tunable_values()


def unset(op: Operator) -> Operator:
    """``op`` with its tunables cleared: what identifies the instance, whatever its setting."""
    return dataclasses.replace(op, **{n: None for n in op.tunables()})


def instances(programs: Mapping[str, Program]) -> list[Instance]:
    """The distinct operator instances of ``programs``, in order of first use."""
    found: dict[Operator, Instance] = {}
    for name in programs:
        program = programs[name]
        for step in program.steps:
            key = unset(step.op)
            if key in found:
                found[key] = dataclasses.replace(found[key], uses=found[key].uses + 1)
                continue
            specs = tuple(InputSpec(program.tensors[i].shape, program.tensors[i].dtype,
                                    program.tensors[i].kind in ("weight", "state"))
                          for i in step.inputs)
            found[key] = Instance(key, step.op, specs, 1)
    return list(found.values())


def traffic(instance: Instance) -> int:
    """Bytes the instance reads per call of the application's programs, over all its uses."""
    return instance.uses * sum(math.prod(s.shape) * np.dtype(s.dtype).itemsize
                               for s in instance.inputs)


def candidates(op: Operator, dev: Device | str) -> list[Operator]:
    """Every legal setting of ``op``'s tunables on ``dev``, as frozen resolved operators."""
    return [dataclasses.replace(op, **s) for s in legal_settings(unset(op), dev)]
