"""The npu1 / npu2 targets: MLIR-AIE designs run through XRT — not buildable on this machine.

An instance compiles to an MLIR-AIE design plus NPU instructions with the ``mlir-aie``
toolchain (``aiecc.py`` and the Peano compiler) and runs through XRT's ``pyxrt``.  Neither
installs from PyPI or Debian, so this target checks for them and refuses clearly, before any
work; recording and resolving for npu1 / npu2 work everywhere.
"""

from __future__ import annotations

import importlib.util
import shutil

from ..devices import Device
from ..errors import DeviceError
from ..operator import Operator
from .base import Recipe, Target


def missing_toolchain() -> list[str]:
    missing = []
    if shutil.which("aiecc.py") is None:
        missing.append("aiecc.py (mlir-aie)")
    if importlib.util.find_spec("pyxrt") is None:
        missing.append("pyxrt (XRT Python bindings)")
    return missing


class NpuTarget(Target):
    """Refuses to compile or run, naming what is missing."""

    kind = "npu"

    def unavailable(self, dev: Device) -> str | None:
        missing = missing_toolchain()
        return (f"cannot compile or run on {dev}: "
                + (f"its toolchain is missing ({', '.join(missing)}); " if missing else "")
                + "designs are not implemented yet. Recording and resolving work for every "
                "device; run on the host with iron.device('cpu').")

    def recipe(self, op: Operator | None) -> Recipe:
        raise DeviceError(f"{'the executor' if op is None else op.describe()}: "
                          "the npu target builds no artifacts yet")


TARGET = NpuTarget()
