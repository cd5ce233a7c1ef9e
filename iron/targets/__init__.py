"""Targets compile resolved operator instances and run programs; one package per device kind.

``iron.targets.base`` writes down the interface; ``target_for(device)`` is how every layer
above finds the target of a device.  Each target package is imported on first use, so a light
tool (a no-op ``doit`` reading the host's facts in ``iron.host``) loads no target.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..devices import Device
    from ..program import Program
    from .base import Executable, Recipe, Target

#: The package of each device kind; each defines ``TARGET``, its ``Target``.
KINDS = {"cpu": "cpu", "npu": "npu"}


def target_of_kind(kind: str) -> Target:
    """The target of device kind ``kind`` (not bound to one device: see ``target_for``)."""
    return importlib.import_module(f".{KINDS[kind]}", __name__).TARGET


def target_for(dev: Device) -> Target:
    """The target that compiles and runs programs for ``dev``."""
    return target_of_kind(dev.kind).on(dev)


def executable_for(program: Program, store=None) -> Executable:
    """Compile (cached) and load ``program`` on its device's target."""
    return target_for(program.device).load(program, store)


def __getattr__(name: str):
    if name in ("Executable", "Recipe", "Target"):
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Executable", "KINDS", "Recipe", "Target", "executable_for", "target_for",
           "target_of_kind"]
