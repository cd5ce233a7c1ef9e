"""Programs: the recorded form of a graph, a list of resolved steps over numbered tensors.

A ``Program`` is what every target compiles and runs, what a bundle stores (``to_json``), and
what ``reference`` evaluates with each operator's numpy maths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .devices import Device
from .devices import device as get_device
from .errors import ShapeError
from .operator import Operator
from .tensor import Tensor, dtype_by_name


@dataclass(frozen=True)
class Step:
    """One resolved operator instance and the tensors (by index) it reads and writes."""

    op: Operator
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass
class Program:
    """A recorded graph: its tensors, its steps in order, its inputs and outputs."""

    device: Device
    tensors: list[Tensor]
    steps: list[Step]
    inputs: list[int]
    outputs: list[int]

    @property
    def ops(self) -> list[Operator]:
        return [s.op for s in self.steps]

    def named(self, kind: str) -> dict[str, Tensor]:
        return {t.name: t for t in self.tensors if t.kind == kind}

    def reference(self, args: Sequence[np.ndarray], weights: Mapping[str, np.ndarray] = {},
                  state: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """Run every step's numpy reference maths, rounding each output to its dtype once.

        ``state`` (name -> array) is read and updated in place, so a caller can carry a KV
        cache across calls; missing state starts at zero.
        """
        env: dict[int, np.ndarray] = {}
        state = {} if state is None else state
        for t, a in zip((self.tensors[i] for i in self.inputs), args):
            env[t.index] = upcast(np.asarray(a))
        for t in self.tensors:
            if t.kind == "weight":
                if t.name not in weights:
                    raise ShapeError(f"weight {t.name!r} {t.shape} is not bound")
                env[t.index] = upcast(np.asarray(weights[t.name]))
            elif t.kind == "state":
                env[t.index] = upcast(state.get(t.name, np.zeros(t.shape, t.dtype)))
        for s in self.steps:
            result = s.op.reference(*(env[i] for i in s.inputs))
            result = result if isinstance(result, tuple) else (result,)
            for i, r in zip(s.outputs, result):
                env[i] = upcast(np.asarray(r).astype(self.tensors[i].dtype))
        for t in self.tensors:
            if t.kind == "state":
                state[t.name] = env[t.index].astype(t.dtype)
        return [env[i].astype(self.tensors[i].dtype) for i in self.outputs]

    def to_json(self) -> dict[str, Any]:
        """The program as data: what a bundle stores, from which ``from_json`` rebuilds it."""
        return {"device": self.device.name,
                "tensors": [t.spec() for t in self.tensors],
                "steps": [{"operator": type(s.op).__name__, "fields": s.op.config(),
                           "inputs": list(s.inputs), "outputs": list(s.outputs)}
                          for s in self.steps],
                "inputs": self.inputs, "outputs": self.outputs}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Program:
        from . import operators  # noqa: F401  (fills Operator.registry)

        tensors = [Tensor(i, tuple(t["shape"]), dtype_by_name(t["dtype"]), t["kind"], t["name"])
                   for i, t in enumerate(doc["tensors"])]
        steps = [Step(Operator.registry[s["operator"]](**s["fields"]), tuple(s["inputs"]),
                      tuple(s["outputs"])) for s in doc["steps"]]
        indices = [i for s in steps for i in (*s.inputs, *s.outputs)]
        indices += [*doc["inputs"], *doc["outputs"]]
        bad = [i for i in indices if type(i) is not int or not 0 <= i < len(tensors)]
        if bad:
            raise ValueError(f"tensor index {bad[0]!r} is not one of the program's "
                             f"{len(tensors)} tensors")
        return cls(get_device(doc["device"]), tensors, steps, list(doc["inputs"]),
                   list(doc["outputs"]))


def upcast(a: np.ndarray) -> np.ndarray:
    """Reference maths runs in float32; integer tensors (tokens, positions) stay integers."""
    return a if a.dtype.kind in "iu" else a.astype(np.float32)
