"""The cpu target: the host CPU, running C kernels built per resolved instance.

``target`` is the ``Target`` (recipes, builds, loading and running programs), ``host`` the
facts of this machine a build and a bundle depend on, ``cost`` the roofline cost model and its
calibration.  The names below are imported from ``target`` on first use, so reading the host's
facts (``iron.targets.cpu.host``, a no-op ``doit``) does not load numpy.
"""

from __future__ import annotations

_TARGET_NAMES = ("LIBRARY", "SOURCE_DIR", "TARGET", "CpuTarget", "Executable", "compile_all",
                 "compile_op", "compiler", "flags", "kernel_source", "load", "load_library",
                 "recipe_for", "set_thread_limit", "source_recipe")


def __getattr__(name: str):
    if name in _TARGET_NAMES:
        from . import target

        return getattr(target, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_TARGET_NAMES)
