"""The graph being recorded: a context variable, so that ``Op.step(...)`` finds its graph.

It sits below the operator model (``Operator.step`` reads it) and the graph module (which sets
it while a body runs), so neither has to import the other.
"""

from __future__ import annotations

import contextvars
from typing import Any

from .errors import ShapeError

_recording: contextvars.ContextVar[Any] = contextvars.ContextVar("iron_recording")


def current_recording() -> Any:
    """The ``iron.graph.Recording`` under way; an error outside a graph's body."""
    try:
        return _recording.get()
    except LookupError:
        raise ShapeError("Op.step(...) records a step of a graph: call it inside a Graph's body, "
                         "while the graph is recorded or run") from None


def start(recording: Any) -> contextvars.Token:
    return _recording.set(recording)


def stop(token: contextvars.Token) -> None:
    _recording.reset(token)
