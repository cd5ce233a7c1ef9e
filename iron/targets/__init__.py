"""Targets compile resolved operator instances and run programs; one module per device kind.

A target module provides ``load(program, store=None) -> Executable``; an executable has
``bind_weights(mapping)``, ``run(arrays)`` and ``reset_state()``.
"""

from __future__ import annotations

import importlib

from ..program import Program


def target_module(kind: str):
    return importlib.import_module(f"{__name__}.{kind}")


def executable_for(program: Program, store=None):
    """Compile (cached) and load ``program`` on its device's target."""
    return target_module(program.device.kind).load(program, store)
