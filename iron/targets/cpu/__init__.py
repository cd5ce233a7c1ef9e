"""The cpu target: the host CPU, running C kernels built per resolved instance.

- ``target``: the ``Target`` (``TARGET``) and the shortcuts ``compile_op``, ``compile_all``,
  ``load``;
- ``build``: an instance's recipe (its artifact key) and its shared library;
- ``runtime``: loading kernel libraries and running programs (``Executable``);
- ``host``: this machine's facts, read once (CPU model and ISA features, cache size, the
  ``-march`` level and the features it requires);
- ``rules``: what the kernels need of each operator class beyond the operator's own rules;
- ``cost`` and ``calibration``: the roofline cost model and the host figures it is priced with.

The names below are imported on first use, so reading the host's facts (a no-op ``doit``)
does not load numpy.
"""

from __future__ import annotations

import importlib

_MEMBERS = {
    "target": ("TARGET", "CpuTarget", "compile_all", "compile_op", "load"),
    "build": ("LIBRARY", "SOURCE_DIR", "compiler", "flags", "kernel_source", "recipe_for",
              "source_recipe"),
    "runtime": ("Executable", "load_library", "set_thread_limit"),
}
_WHERE = {name: module for module, names in _MEMBERS.items() for name in names}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = sorted(_WHERE)
