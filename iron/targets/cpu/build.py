"""Building for the cpu: every resolved instance becomes a shared library.

Each operator's kernel ``<kernel_root>/cpu/<kernel>.c`` is compiled once per resolved instance
with its params and tunables baked in as ``-DIRON_<FIELD>=<int>`` constants, ``-O3``, the
build's ``-march`` level (``native`` unless ``$IRON_MARCH`` names another, see ``host``) and
OpenMP threads for ``num_aie_columns``.  Every library exports
``void iron_kernel(void *const *args)`` taking its inputs then its outputs.  A recipe's
description holds everything the artifact depends on: the sources and headers it includes
(by digest), the compiler's identity, the flags, and for ``native`` the host CPU's identity.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from ...errors import CompileError, DeviceError
from ...operator import Operator
from ...paths import KERNELS_DIR
from ..base import Recipe
from ... import host

RECIPE_VERSION = 1
SOURCE_DIR = KERNELS_DIR / "cpu"
FLAGS = ("-O3", "-fopenmp", "-fPIC", "-shared", "-std=gnu11")  # and -march=<level>
LIBRARY = "kernel.so"


def flags(level: str | None = None) -> list[str]:
    """The compiler flags of a build at ``level`` (the build's -march level by default)."""
    return [*FLAGS, f"-march={level or host.march()}"]


def toolchain(variable: str, default: str, missing: str) -> tuple[str, str]:
    """The compiler ``$variable`` (else ``default``) on PATH and its identity: path, version and
    target, which artifact keys hash; ``missing`` is the error when there is none."""
    path = shutil.which(os.environ.get(variable, default))
    if path is None:
        raise DeviceError(missing)
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    machine = subprocess.run([path, "-dumpmachine"], capture_output=True, text=True).stdout
    return path, f"{os.path.realpath(path)} | {version.splitlines()[0]} | {machine.strip()}"


@functools.lru_cache(maxsize=None)
def compiler() -> tuple[str, str]:
    """The C compiler (``$CC`` or ``cc``) and its identity: path, version and target."""
    return toolchain("CC", "cc", "the cpu target needs a C compiler: none found as $CC or cc "
                     "on PATH (install gcc)")


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
        "compiler": identity, "host": host.identity() if level == "native" else None,
        "march": level, "flags": flags(level),
        "macros": dict(macros),
    }
    return Recipe(name, macros, description, tuple(sources))


def build(recipe: Recipe, folder: Path) -> None:
    """Compile ``recipe``'s kernel into ``folder``/kernel.so; its macros and -march level are
    checked first, since a recipe may come from a file."""
    cc, _ = compiler()
    check_macros(recipe.macros)
    level = host.check_march(recipe.description["march"])
    command = [cc, *flags(level), f"-I{SOURCE_DIR}", *(f"-D{m}={v}" for m, v in recipe.macros),
               str(recipe.sources[0]), "-o", str(folder / LIBRARY)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(f"compiling {recipe.operator} {recipe.description['fields'] or ''} "
                           f"failed:\n$ {' '.join(command)}\n{result.stderr.strip()}")
