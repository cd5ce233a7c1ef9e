"""The cpu target: every resolved instance becomes a shared library, called through the C ABI.

Each operator's kernel ``iron/kernels/cpu/<kernel>.c`` is compiled once per resolved instance
with its params and tunables baked in as ``-DIRON_<FIELD>=<int>`` constants, ``-O3``, the
build's ``-march`` level (``native`` unless ``$IRON_MARCH`` names another, see ``iron.host``)
and OpenMP threads for ``num_aie_columns``.  Every library exports
``void iron_kernel(void *const *args)`` taking its inputs then its outputs.  A program runs
through ``runtime.c``'s ``iron_exec``: one ctypes call walks the whole list of steps, so the
Python cost of a call does not grow with the number of steps.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .. import host
from ..errors import CompileError, DeviceError, ShapeError
from ..memplan import temp_buffers
from ..operator import Operator
from ..paths import KERNELS_DIR
from .base import Recipe, Target
from .cost import Estimate
from ..program import Program
from ..store import Entry, Store

RECIPE_VERSION = 1
SOURCE_DIR = KERNELS_DIR / "cpu"
FLAGS = ("-O3", "-fopenmp", "-fPIC", "-shared", "-std=gnu11")  # and -march=<level>
LIBRARY = "kernel.so"


def flags(level: str | None = None) -> list[str]:
    """The compiler flags of a build at ``level`` (the build's -march level by default)."""
    return [*FLAGS, f"-march={level or host.march()}"]


@functools.lru_cache(maxsize=None)
def compiler() -> tuple[str, str]:
    """The C compiler (``$CC`` or ``cc``) and its identity: path, version and target."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        raise DeviceError("the cpu target needs a C compiler: none found as $CC or cc on PATH "
                          "(install gcc)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    machine = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True).stdout
    return cc, f"{os.path.realpath(cc)} | {version.splitlines()[0]} | {machine.strip()}"


@functools.lru_cache(maxsize=None)
def host_identity() -> str:
    """What ``-march=native`` depends on: the host CPU's model and feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    fields = dict(re.findall(r"^(model name|flags)\s*:\s*(.*)$", info, re.M))
    return hashlib.sha256(repr(sorted(fields.items())).encode()).hexdigest()[:16]


def source_closure(source: Path) -> dict[Path, str]:
    """The sha256 of a kernel source and of every local header it includes (looked up beside
    the source, then in ``iron/kernels/cpu``), the source first."""
    digests: dict[Path, str] = {}
    todo = [source]
    while todo:
        path = todo.pop()
        if path in digests:
            continue
        text = path.read_bytes()
        digests[path] = hashlib.sha256(text).hexdigest()
        for name in re.findall(rb'^\s*#\s*include\s*"([^"]+)"', text, re.M):
            near = path.parent / name.decode()
            todo.append(near if near.is_file() else SOURCE_DIR / name.decode())
    return digests


def kernel_source(op: Operator | None) -> Path:
    """``<kernel_root>/cpu/<kernel>.c`` of the operator; ``runtime.c`` for the executor."""
    path = SOURCE_DIR / "runtime.c" if op is None else \
        type(op).kernel_root / "cpu" / f"{op.kernel}.c"
    if not path.is_file():
        raise CompileError(f"no cpu kernel {path}" + ("" if op is None else
                           f" for {type(op).__name__} (its kernel is {op.kernel!r})"))
    return path


def recipe_from(description: dict[str, Any], sources: Sequence[str | Path]) -> Recipe:
    """The recipe a description (as ``recipe_for`` made it) and its source files stand for;
    the macros are checked again, since both may come from a file."""
    macros = tuple(sorted(description["macros"].items()))
    check_macros(macros)
    host.check_march(description["march"])
    return Recipe(description["kernel"], macros, description, tuple(Path(s) for s in sources))


def check_macros(macros) -> None:
    for macro, value in macros:
        if type(value) is not int or not re.fullmatch(r"IRON_[A-Z0-9_]+", macro):
            raise CompileError(f"refusing to pass {macro}={value!r} to the compiler: only "
                               "IRON_* integer constants are allowed")


def recipe_for(op: Operator | None) -> Recipe:
    """The recipe of an operator instance (or, for ``None``, of the program executor)."""
    return source_recipe("runtime" if op is None else op.kernel, kernel_source(op), op)


def source_recipe(name: str, source: Path, op: Operator | None = None) -> Recipe:
    """The recipe of one C source built like a kernel (with ``op``'s fields as its macros)."""
    macros = tuple(sorted(({} if op is None else op.kernel_macros()).items()))
    check_macros(macros)
    cc, identity = compiler()
    sources = source_closure(source)
    level = host.march()
    description = {
        "recipe": RECIPE_VERSION, "target": "cpu", "kernel": name,
        "operator": None if op is None else type(op).__name__,
        "fields": None if op is None else op.config(),
        "sources": dict(sorted((p.name, digest) for p, digest in sources.items())),
        # only -march=native depends on the host's CPU; a named level builds the same anywhere
        "compiler": identity, "host": host_identity() if level == "native" else None,
        "march": level, "flags": flags(level),
        "macros": dict(macros),
    }
    return Recipe(name, macros, description, tuple(sources))


def build(recipe: Recipe, folder: Path) -> None:
    """Compile ``recipe``'s kernel into ``folder``/kernel.so."""
    cc, _ = compiler()
    level = host.check_march(recipe.description["march"])
    command = [cc, *flags(level), f"-I{SOURCE_DIR}", *(f"-D{m}={v}" for m, v in recipe.macros),
               str(recipe.sources[0]), "-o", str(folder / LIBRARY)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(f"compiling {recipe.operator} {recipe.description['fields'] or ''} "
                           f"failed:\n$ {' '.join(command)}\n{result.stderr.strip()}")


class CpuTarget(Target):
    """The host CPU: C kernels built by the system compiler, run by ``runtime.c``."""

    kind = "cpu"

    def recipe(self, op: Operator | None) -> Recipe:
        return recipe_for(op)

    def build(self, recipe: Recipe, folder: Path) -> None:
        build(recipe, folder)

    def artifact(self, entry: Entry) -> Path:
        return entry.file(LIBRARY)

    def recipe_from(self, description: dict[str, Any], sources: Sequence[str | Path]) -> Recipe:
        return recipe_from(description, sources)

    def requirements(self) -> dict[str, Any]:
        level = host.march()
        return {"march": level, "isa": list(host.required_features(compiler()[0], level)),
                "cpu": host.cpu_model()}

    def executable(self, program: Program, step_files: Sequence[Path],
                   runtime_file: Path | None) -> Executable:
        return Executable(program, step_files, runtime_file)

    def cost(self, op: Operator) -> Estimate | None:
        """The roofline of ``op``'s kernel on this host (``iron.targets.cpu_model``); None
        where its family's hook gives no estimate."""
        from . import cpu_model

        return cpu_model.cost(op)


TARGET = CpuTarget()


def compile_op(op: Operator, store: Store | None = None) -> Entry:
    return TARGET.compile(recipe_for(op), store)


def compile_all(ops: Sequence[Operator | None], store: Store | None = None,
                jobs: int | None = None) -> list[Entry]:
    return TARGET.compile_all(ops, store, jobs)


# ---- running ------------------------------------------------------------------------------

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


def load(program: Program, store: Store | None = None) -> Executable:
    """Compile what is missing and return a ready ``Executable``."""
    return TARGET.load(program, store)
