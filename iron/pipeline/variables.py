"""Build variables: ``doit NAME=VALUE`` and the options an application declares.

A ``Variable`` names its default (shown by ``doit list`` and ``doit help TASK``), checks a
value given as text (a bad one is a one-line ``IronError`` naming the variable, the value and
the rule) and, for an application's variables, says how a value other than the default marks
the bundle's folder name (``ctx{}`` makes ``build/<app>/cpu-ctx4096``).  The checks are small
functions of ``(name, text)`` so an application declares its variables with them::

    VARIABLES = {"context": Variable(None, positive(1 << 20), "KV cache positions",
                                     tag="ctx{}", shown="the checkpoint's")}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import IronError

Check = Callable[[str, str], Any]


@dataclass(frozen=True)
class Variable:
    """One build variable: its default (None: decided later, ``shown`` says by whom), the check
    that turns its text into a value, one line of help and the bundle-name tag (``None``: the
    variable does not change what a bundle holds)."""

    default: Any
    check: Check
    help: str
    tag: str | None = None
    shown: str | None = None
    #: a flag of the application's run command (``doit generate`` passes it on), not an option
    #: of its ``App``
    run_option: bool = False

    def describe(self) -> str:
        if self.default is None:
            return f"({self.shown or 'none'})"
        return str(self.default)


def positive(limit: int) -> Check:
    def check(name: str, text: str) -> int:
        if not re.fullmatch(r"[0-9]{1,9}", text.strip()) or not 1 <= int(text) <= limit:
            raise IronError(f"variable {name}={text!r}: must be an integer from 1 to {limit}")
        return int(text)
    return check


def count(name: str, text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,6}", text.strip()):
        raise IronError(f"variable {name}={text!r}: must be a whole number, 0 or more")
    return int(text)


def number(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and value < 1e9):  # nan and inf fail both
        raise IronError(f"variable {name}={text!r}: must be a non-negative number")
    return value


def choice(*allowed: str, as_int: bool = False) -> Check:
    def check(name: str, text: str) -> Any:
        if text not in allowed:
            raise IronError(f"variable {name}={text!r}: must be one of {', '.join(allowed)}")
        return int(text) if as_int else text
    return check


def identifier(name: str, text: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", text):
        raise IronError(f"variable {name}={text!r}: must be a package name under apps/")
    return text


def text(name: str, value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise IronError(f"variable {name}: byte {value[e.start]!r} at position {e.start} "
                        "is not UTF-8 text") from None
    return value


def path(name: str, value: str) -> str:
    """A file or folder: UTF-8 text that is not empty (``checkpoint=`` would otherwise name
    the current directory and build it as a model)."""
    if not text(name, value).strip():
        raise IronError(f"variable {name}={value!r}: must name a file or folder; leave the "
                        f"variable out for the default")
    return value


def operators(name: str, value: str) -> str:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*(,[A-Za-z][A-Za-z0-9]*)*", value):
        raise IronError(f"variable {name}={value!r}: must be operator names, comma-separated")
    return value


def check_all(given: dict[str, str], declared: dict[str, Variable], what: str) -> dict[str, Any]:
    """``given`` (name -> text) checked against ``declared``; an unknown name is an error that
    names it, the closest known name and all of them."""
    import difflib

    checked = {}
    for name, value in given.items():
        if name not in declared:
            close = difflib.get_close_matches(name, declared, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise IronError(f"unknown {what} {name!r}{hint}; the variables are "
                            f"{', '.join(declared)}")
        checked[name] = declared[name].check(name, str(value))
    return checked


def defaults_line(declared: dict[str, Variable], given: dict[str, Any] | None = None) -> str:
    """``name=default`` of every variable (``name=value`` for those ``given``), for a task's
    one-line doc."""
    given = given or {}
    return " ".join(f"{n}={given[n] if n in given else v.describe()}"
                    for n, v in declared.items())
