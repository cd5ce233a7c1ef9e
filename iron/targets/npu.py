"""The npu1 / npu2 targets: MLIR-AIE designs run through XRT — planned, not yet buildable here.

An instance would compile to an MLIR-AIE design plus NPU instructions with the ``mlir-aie``
toolchain (``aiecc.py`` and the Peano compiler) and run through XRT's ``pyxrt``.  Neither is
installable from PyPI or Debian (FACTS.md), so this target only checks for them and refuses
clearly; recording and resolving for npu1 / npu2 work everywhere.
"""

from __future__ import annotations

import importlib.util
import shutil

from ..devices import Device
from ..errors import DeviceError


def missing_toolchain(dev: Device) -> list[str]:
    missing = []
    if shutil.which("aiecc.py") is None:
        missing.append("aiecc.py (mlir-aie)")
    if importlib.util.find_spec("pyxrt") is None:
        missing.append("pyxrt (XRT Python bindings)")
    return missing


def load(program, store=None):
    dev = program.device
    missing = missing_toolchain(dev)
    raise DeviceError(
        f"cannot compile or run on {dev}: "
        + (f"its toolchain is missing ({', '.join(missing)}); " if missing else "")
        + "the npu target is not implemented yet. Recording and resolving work for every "
        "device; run on the host with iron.device('cpu').")
