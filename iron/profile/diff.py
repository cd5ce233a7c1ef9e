"""Compare two profiles entry by entry: ``python -m iron.profile diff A B``.

Entries are paired by operator and the params they match; for each pair the tunables that
differ are listed, and entries only one side has are listed as added or removed.  ``git diff``
shows the same lines; this view names the instance and the moved tunables.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, Sequence, TextIO

from ..errors import IronError
from . import Entry, Profile


@dataclass(frozen=True)
class Change:
    """One difference: ``old`` or ``new`` is None for an entry only one side has."""

    where: str  # "GEMV(M=576, K=576)" or "GEMV (every instance)"
    old: dict[str, Any] | None
    new: dict[str, Any] | None

    def describe(self) -> str:
        if self.old is None:
            return f"+ {self.where}: {fields_text(self.new)}"
        if self.new is None:
            return f"- {self.where}: {fields_text(self.old)}"
        moved = ", ".join(f"{k} {self.old.get(k, '(unset)')} -> {self.new.get(k, '(unset)')}"
                          for k in {**self.old, **self.new}
                          if self.old.get(k) != self.new.get(k))
        return f"~ {self.where}: {moved}"


def fields_text(fields: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in fields.items())


def where(entry: Entry) -> str:
    if not entry.match:
        return f"{entry.operator} (every instance)"
    return f"{entry.operator}({fields_text(dict(entry.match))})"


def diff(a: Profile, b: Profile) -> list[Change]:
    """The changes from ``a`` to ``b``, in ``b``'s saved order (then ``a``'s removed ones)."""
    old = {(e.operator, e.match): e for e in a.sorted_entries()}
    new = {(e.operator, e.match): e for e in b.sorted_entries()}
    changes = []
    for key, e in new.items():
        before = old.get(key)
        if before is None:
            changes.append(Change(where(e), None, dict(e.sets)))
        elif dict(before.sets) != dict(e.sets):
            changes.append(Change(where(e), dict(before.sets), dict(e.sets)))
    changes += [Change(where(e), dict(e.sets), None) for key, e in old.items() if key not in new]
    return changes


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``diff A B``: print the changes; exit status 0 when equal, 1 when they differ."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(prog="python -m iron.profile",
                                     description="Work with iron profile files.")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("diff", help="compare two profiles entry by entry")
    p.add_argument("a", help="the old profile (JSON file)")
    p.add_argument("b", help="the new profile (JSON file)")
    args = parser.parse_args(argv)
    try:
        a, b = Profile.load(args.a), Profile.load(args.b)
    except IronError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    changes = diff(a, b)
    if a.device != b.device:
        print(f"device: {a.device} -> {b.device}", file=out)
    for c in changes:
        print(c.describe(), file=out)
    if not changes and a.device == b.device:
        print(f"{args.a} and {args.b} set the same tunables", file=out)
        return 0
    return 1
