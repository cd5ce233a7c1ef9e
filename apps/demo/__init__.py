"""A small demo application: a residual MLP block of a few chained operators.

It exercises the whole build (compile tasks, profile edits, bundles, gc, application
variables) in seconds.  This module declares the build variables; ``App`` (``app.py``) is
imported on first use, so a no-op ``doit`` imports neither it nor numpy.
"""

from __future__ import annotations

from iron.pipeline.variables import Variable, positive

DIM, HIDDEN = 256, 512

VARIABLES = {
    "hidden": Variable(HIDDEN, positive(4096), "the MLP's hidden width", tag="h{}"),
}


def __getattr__(name: str):
    if name in ("App", "Block"):
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
