"""Running on the cpu: kernel libraries loaded through ctypes, programs run by ``runtime.c``.

A program runs through ``runtime.c``'s ``iron_exec``: one ctypes call walks the whole list of
steps, so the Python cost of a call does not grow with the number of steps.  ``Executable``
owns the program's buffers; ``set_thread_limit`` caps every kernel's thread team.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ...errors import DeviceError, ShapeError
from ...memplan import temp_buffers
from ...program import Program

KernelFn = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p))


def set_thread_limit(threads: int) -> None:
    """Cap every kernel's thread team at ``threads`` (``--threads``): libgomp reads
    ``OMP_THREAD_LIMIT`` once, when the first kernel loads, so call this before that."""
    if re.search(r"/libgomp\.so\.1\b", Path("/proc/self/maps").read_text()):
        raise DeviceError("--threads must be set before the first kernel is loaded")
    os.environ["OMP_THREAD_LIMIT"] = str(int(threads))


@functools.lru_cache(maxsize=None)
def load_library(path: str) -> ctypes.CDLL:
    """Load a kernel library.  libgomp's waiting policy is the environment's: its default
    (spin, then sleep) keeps a quiet machine fastest; ``OMP_WAIT_POLICY=passive`` keeps a
    shared one steady (``benchmarks/contention.py`` measures both; README, Running on another
    host)."""
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise DeviceError(f"cannot load the kernel library {path}: {e}") from None


def kernel_address(library: Path) -> int:
    return ctypes.cast(load_library(str(library)).iron_kernel, ctypes.c_void_p).value


class Executable:
    """A program compiled for the cpu: its buffers are allocated once and reused across calls.

    Weights are bound once (``bind_weights``), state tensors start at zero and persist, inputs
    are bound per call without a copy when they already have the right dtype and layout; temps
    share memory where their lifetimes allow (``temp_buffers``).
    """

    def __init__(self, program: Program, libraries: Sequence[Path], runtime: Path):
        self.program = program
        self.buffers: dict[int, np.ndarray] = temp_buffers(program)
        for t in program.tensors:
            if t.kind == "state":
                self.buffers[t.index] = np.zeros(t.shape, t.dtype)
        self._runtime = load_library(str(runtime))
        self._runtime.iron_exec.restype = None
        self._runtime.iron_exec_timed.restype = None
        n = len(program.steps)
        self._fns = (ctypes.c_void_p * n)(*(kernel_address(p) for p in libraries))
        self._args = [(ctypes.c_void_p * (len(s.inputs) + len(s.outputs)))()
                      for s in program.steps]
        self._arg_table = (ctypes.c_void_p * n)(*(ctypes.addressof(a) for a in self._args))
        self._slots: dict[int, list[tuple[int, int]]] = {}  # tensor -> (step, arg) slots
        for i, s in enumerate(program.steps):
            args = list(s.inputs) + [o for k, o in enumerate(s.outputs)
                                     if k not in type(s.op).inplace]
            for j, t in enumerate(args):
                self._slots.setdefault(t, []).append((i, j))
        for index, buf in self.buffers.items():
            self._point(index, buf)
        self._bound: set[int] = set(self.buffers)
        self._weights_bound = False  # checked once, on the first run
        self._overwritten = {s.inputs[i] for s in program.steps
                             for i in type(s.op).inplace.values()}

    def _point(self, index: int, array: np.ndarray) -> None:
        address = array.ctypes.data
        for i, j in self._slots.get(index, ()):
            self._args[i][j] = address

    def _conform(self, index: int, array: np.ndarray, what: str) -> np.ndarray:
        t = self.program.tensors[index]
        if array.dtype == t.dtype and array.shape == t.shape and array.flags.c_contiguous:
            return array  # the common case, kept cheap: it runs for every input of every call
        if tuple(array.shape) != t.shape:
            raise ShapeError(f"{what} has shape {tuple(array.shape)}, the program expects "
                             f"{t.shape}")
        return np.ascontiguousarray(array, dtype=t.dtype)

    def bind_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Point the program at its weights (kept alive here; converted once if needed)."""
        for name, t in self.program.named("weight").items():
            if name not in weights:
                raise ShapeError(f"weight {name!r} {t.shape} is not bound")
            self.buffers[t.index] = self._conform(t.index, weights[name], f"weight {name!r}")
            self._point(t.index, self.buffers[t.index])
            self._bound.add(t.index)

    def bind_state(self, states: Mapping[str, np.ndarray]) -> None:
        """Share state buffers (a KV cache) with other programs: they must already fit."""
        for name, t in self.program.named("state").items():
            if name in states:
                array = states[name]
                if array.shape != t.shape or array.dtype != t.dtype or not array.flags.c_contiguous:
                    raise ShapeError(f"state {name!r} must be a C-contiguous {t.dtype} array of "
                                     f"shape {t.shape}")
                self.buffers[t.index] = array
                self._point(t.index, array)

    def state(self, name: str) -> np.ndarray:
        return self.buffers[self.program.named("state")[name].index]

    def reset_state(self) -> None:
        for t in self.program.named("state").values():
            self.buffers[t.index][...] = 0

    def _bind_inputs(self, arrays: Sequence[np.ndarray]) -> None:
        if len(arrays) != len(self.program.inputs):
            raise ShapeError(f"the program takes {len(self.program.inputs)} inputs, "
                             f"got {len(arrays)}")
        for index, given in zip(self.program.inputs, arrays):
            a = self._conform(index, given, f"input {self.program.tensors[index].name!r}")
            if index in self._overwritten and a is given:
                a = a.copy()  # an in-place step writes this input: never the caller's array
            self.buffers[index] = a
            self._point(index, a)
        if not self._weights_bound:
            missing = [t for t in self.program.tensors if t.kind == "weight"
                       and t.index not in self._bound]
            if missing:
                raise ShapeError(f"weight {missing[0].name!r} is not bound; call bind_weights "
                                 "first")
            self._weights_bound = True

    def run(self, arrays: Sequence[np.ndarray], copy: bool = True) -> list[np.ndarray]:
        """Run every step once; return the outputs (copies unless ``copy=False``)."""
        self._bind_inputs(arrays)
        self._runtime.iron_exec(len(self._args), self._fns, self._arg_table)
        return [self.buffers[i].copy() if copy else self.buffers[i]
                for i in self.program.outputs]

    def run_timed(self, arrays: Sequence[np.ndarray], seconds: np.ndarray) -> list[np.ndarray]:
        """``run``, adding each step's wall time to ``seconds`` (float64, one per step)."""
        self._bind_inputs(arrays)
        self._runtime.iron_exec_timed(len(self._args), self._fns, self._arg_table,
                                      seconds.ctypes.data_as(ctypes.c_void_p))
        return [self.buffers[i].copy() for i in self.program.outputs]
