"""The cpu target: the host CPU, C kernels built by the system compiler and run by ``runtime.c``.

``build`` makes an instance's recipe and library, ``runtime`` loads and runs programs, ``rules``
holds what the kernels need of each operator class, ``cost`` models an instance's time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Sequence

from ...devices import Device
from ...operator import Operator, Rule
from ...operators import GEMM
from ...program import Program
from ...quant import PLAIN
from ...store import Entry, Store
from ..base import Recipe, Target
from ..cost import Estimate
from ... import host
from .build import LIBRARY, build, compiler, recipe_for
from .ranges import range_rules
from .rules import RULES
from .runtime import Executable


class CpuTarget(Target):
    """The host CPU: C kernels built by the system compiler, run by ``runtime.c``."""

    kind = "cpu"
    RULES = RULES

    def claims(self, cls: type[Operator]) -> bool:
        """Operators with a cpu kernel source (``<kernel_root>/cpu/<kernel>.c``)."""
        return hasattr(cls, "kernel") and (cls.kernel_root / "cpu" / f"{cls.kernel}.c").is_file()

    def rules(self, op: Operator, dev: Device) -> Iterator[Rule]:
        """The kernel's needs (``RULES``), then each tunable within its macro's stated range."""
        yield from super().rules(op, dev)
        yield from range_rules(op)

    def value_rules(self, op: Operator) -> Iterator[Rule]:
        return range_rules(op)

    def recipe(self, op: Operator | None) -> Recipe:
        return recipe_for(op)

    def build(self, recipe: Recipe, folder: Path) -> None:
        build(recipe, folder)

    def artifact(self, entry: Entry) -> Path:
        return entry.file(LIBRARY)

    def requirements(self) -> dict[str, Any]:
        level = host.march()
        return {"march": level, "isa": list(host.required_features(compiler()[0], level)),
                "cpu": host.model()}

    def executable(self, program: Program, step_files: Sequence[Path],
                   runtime_file: Path | None) -> Executable:
        return Executable(program, step_files, runtime_file)

    def cost(self, op: Operator) -> Estimate | None:
        """The roofline of ``op``'s kernel on this host (``iron.targets.cpu.cost``); None
        where its family's hook gives no estimate."""
        from .cost import cost

        return cost(op)

    def ignored_tunables(self, op: Operator) -> frozenset[str]:
        """A GEMM with quantized B multiplies each row of A as the GEMV does, a whole row of
        B's codes at a time (qmatmul.h): its ``tile_k`` changes nothing."""
        if isinstance(op, GEMM) and op.weight_format not in PLAIN:
            return frozenset({"tile_k"})
        return frozenset()


TARGET = CpuTarget()


def compile_op(op: Operator, store: Store | None = None) -> Entry:
    return TARGET.compile(recipe_for(op), store)


def compile_all(ops: Sequence[Operator | None], store: Store | None = None,
                jobs: int | None = None) -> list[Entry]:
    return TARGET.compile_all(ops, store, jobs)


def load(program: Program, store: Store | None = None) -> Executable:
    """Compile what is missing and return a ready ``Executable``."""
    return TARGET.load(program, store)
