"""Programs on an NPU device, run through the emulator: designed steps as their designs would
run, host-placed steps with their numpy maths, every tensor rounded to its dtype in between.

A design is loaded once per executable and kept (``Emulation``): its cores keep looping, and
every call of its step is one more dispatch of the runtime sequence, as on the device, where a
decode step dispatches the same configuration again and again."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ...errors import BundleError, ShapeError
from ...program import Program, upcast
from .design import Design, design_from_json
from .emulator import Emulation


@functools.lru_cache(maxsize=1024)
def step_design(path: str) -> Design | None:
    """The design in a step file (``step.json``), None for a host placement."""
    try:
        doc = json.loads(Path(path).read_text())
        return None if doc["placement"] == "host" else design_from_json(doc["design"])
    except (OSError, ValueError, KeyError) as e:
        raise BundleError(f"{path}: not a readable npu step file ({e})") from None


def emulate_step(step, design: Design | None, env: dict[int, np.ndarray], program: Program,
                 loaded: Emulation | None) -> None:
    """Run one step on the arrays of ``env`` (index -> array in the tensor's dtype)."""
    op = step.op
    if design is None:
        result = op.reference(*(upcast(env[i]) for i in step.inputs))
        result = result if isinstance(result, tuple) else (result,)
        for i, r in zip(step.outputs, result):
            env[i] = np.asarray(r).astype(program.tensors[i].dtype)
        return
    args = [np.ascontiguousarray(env[i]).reshape(-1) for i in step.inputs]
    inplace = type(op).inplace  # an output that overwrites an input (a KV cache) is its array
    outs = [args[inplace[k]].reshape(program.tensors[i].shape) if k in inplace else
            np.zeros(program.tensors[i].shape, program.tensors[i].dtype)
            for k, i in enumerate(step.outputs)]
    loaded.dispatch(args + [o.reshape(-1) for o in outs])
    for i, o in zip(step.outputs, outs):
        env[i] = o


def emulate_program(program: Program, loaded: Sequence[tuple[Design | None, Emulation | None]],
                    arrays: Sequence[np.ndarray],
                    weights: Mapping[str, np.ndarray] = {},
                    state: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """``Program.reference``'s contract, computed by the emulator; ``state`` is updated in
    place (its arrays are written, not replaced)."""
    if len(arrays) != len(program.inputs):
        raise ShapeError(f"the program takes {len(program.inputs)} inputs, got {len(arrays)}")
    env: dict[int, np.ndarray] = {}
    state = {} if state is None else state
    for i, a in zip(program.inputs, arrays):
        t = program.tensors[i]
        a = np.asarray(a)
        if a.shape != t.shape:
            raise ShapeError(f"input {t.name!r} has shape {a.shape}, the program expects "
                             f"{t.shape}")
        env[i] = a.astype(t.dtype, copy=False)
    for t in program.tensors:
        if t.kind == "weight":
            if t.name not in weights:
                raise ShapeError(f"weight {t.name!r} {t.shape} is not bound")
            env[t.index] = np.asarray(weights[t.name]).astype(t.dtype, copy=False)
        elif t.kind == "state":
            env[t.index] = np.array(state.get(t.name, np.zeros(t.shape, t.dtype)), t.dtype)
    for step, (design, emulation) in zip(program.steps, loaded):
        emulate_step(step, design, env, program, emulation)
    for t in program.tensors:
        if t.kind == "state":
            if t.name in state:
                state[t.name][...] = env[t.index]
            else:
                state[t.name] = env[t.index]
    return [env[i] for i in program.outputs]


class Emulated:
    """A program on an NPU device, run by the emulator, with the cpu executable's interface
    (``bind_weights``, ``bind_state``, ``run``, ``reset_state``)."""

    def __init__(self, program: Program, step_files: Sequence[Path], library: Path):
        self.program = program
        self.designs = [step_design(str(p)) for p in step_files]
        self.library = str(library)
        by_file: dict[str, Emulation] = {}
        for path, design in zip(step_files, self.designs):
            if design is not None and str(path) not in by_file:
                by_file[str(path)] = Emulation(design, self.library)
        self.loaded = [(d, by_file.get(str(p))) for p, d in zip(step_files, self.designs)]
        self.weights: dict[str, np.ndarray] = {}
        self.states = {name: np.zeros(t.shape, t.dtype)
                       for name, t in program.named("state").items()}

    def bind_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        for name, t in self.program.named("weight").items():
            if name not in weights:
                raise ShapeError(f"weight {name!r} {t.shape} is not bound")
            self.weights[name] = weights[name]

    def bind_state(self, states: Mapping[str, np.ndarray]) -> None:
        for name, t in self.program.named("state").items():
            if name in states:
                if states[name].shape != t.shape or states[name].dtype != t.dtype:
                    raise ShapeError(f"state {name!r} must be a {t.dtype} array of shape "
                                     f"{t.shape}")
                self.states[name] = states[name]

    def state(self, name: str) -> np.ndarray:
        return self.states[name]

    def reset_state(self) -> None:
        for a in self.states.values():
            a[...] = 0

    def run(self, arrays: Sequence[np.ndarray], copy: bool = True) -> list[np.ndarray]:
        return emulate_program(self.program, self.loaded, arrays, self.weights, self.states)

    def run_timed(self, arrays: Sequence[np.ndarray], seconds: np.ndarray) -> list[np.ndarray]:
        return self.run(arrays)
