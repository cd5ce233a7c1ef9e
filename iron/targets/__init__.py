"""Targets compile resolved operator instances and run programs; one module per device kind.

``iron.targets.base`` writes down the interface; ``target_for(device)`` is how every layer
above finds the target of a device.
"""

from __future__ import annotations

from ..devices import Device
from ..program import Program
from . import cpu, npu
from .base import Executable, Recipe, Target

TARGETS: dict[str, Target] = {t.kind: t for t in (cpu.TARGET, npu.TARGET)}


def target_for(dev: Device) -> Target:
    """The target that compiles and runs programs for ``dev``."""
    return TARGETS[dev.kind].on(dev)


def executable_for(program: Program, store=None) -> Executable:
    """Compile (cached) and load ``program`` on its device's target."""
    return target_for(program.device).load(program, store)


__all__ = ["Executable", "Recipe", "Target", "TARGETS", "executable_for", "target_for"]
