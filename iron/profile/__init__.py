"""Profiles: per-device tunable choices, kept as data and applied to operators from outside.

A tunable gets its value from, in order:

1. the call's own keyword — ``AXPY.step(x, y, scalar_factor=1.5, num_aie_columns=1)``;
2. the profile — among the entries that match the step, the most specific one that sets the
   tunable wins (specificity = how many ``param()`` fields the entry names; a param it leaves
   out matches any value); two equally specific matching entries that set it differently are an
   error naming both;
3. ``Operator.resolve(dev)`` — the operator's own default for the device.

Each tunable is decided on its own, so one entry may set ``tile_size`` and a more general one
``num_aie_columns`` for the same step.  An entry naming an operator's base class (``Elementwise``)
applies to its subclasses.  Example::

    profile = iron.Profile()
    profile.add(AXPY, tile_size=512, num_aie_columns=1)          # every AXPY
    profile.add(AXPY, size=2048, tile_size=1024)                 # wins for size 2048
    profile.save("profiles/demo/cpu.json")

The file is UTF-8 JSON, one entry per line so that ``git diff`` shows which tunable moved::

    {"device": "cpu", "entries": [
      {"operator": "AXPY", "size": 2048, "tile_size": 1024, "num_aie_columns": 2}
    ]}

Saving is deterministic (sorted entries, fields in declaration order) and atomic.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..devices import DEVICE_NAMES
from ..errors import FieldError, ProfileError
from ..operator import Operator
from ..util import atomic_write_bytes


@dataclass(frozen=True)
class Entry:
    """One profile entry: the params it matches and the tunables it sets, for one operator."""

    operator: str
    match: tuple[tuple[str, Any], ...]
    sets: tuple[tuple[str, Any], ...]
    origin: str = field(default="", compare=False)  # for messages: "cpu.json line 3"

    @property
    def specificity(self) -> int:
        return len(self.match)

    def applies_to(self, op: Operator) -> bool:
        names = {c.__name__ for c in type(op).__mro__}
        return self.operator in names and all(getattr(op, k) == v for k, v in self.match)

    def fields(self) -> dict[str, Any]:
        return {"operator": self.operator, **dict(self.match), **dict(self.sets)}

    def describe(self) -> str:
        body = json.dumps(self.fields(), separators=(", ", ": "))
        return f"profile entry {body}" + (f" ({self.origin})" if self.origin else "")


def make_entry(cls: type[Operator], fields: Mapping[str, Any], origin: str = "") -> Entry:
    """Validate ``fields`` against ``cls``'s declaration and split them into match and sets."""
    where = origin or f"Profile.add({cls.__name__}, ...)"
    try:
        cls.check_field_names(fields, where)
    except FieldError as e:
        raise ProfileError(str(e)) from None
    params, tunables = cls.params(), cls.tunables()
    for name in tunables:
        value = fields.get(name)
        if name in fields and (type(value) is not int or value < 1):
            raise ProfileError(f"{where}: {cls.__name__}.{name}={value!r} breaks the rule: a "
                               "tunable is a positive integer")
    for name in params:
        value, choices = fields.get(name), cls.choices(name)
        if name not in fields or (isinstance(value, str) and value in choices):
            continue
        if not isinstance(value, (bool, int, float)):
            rule = f"one of {', '.join(choices)}" if choices else "a number"
            raise ProfileError(f"{where}: {cls.__name__}.{name}={value!r} is not {rule}")
    sets = tuple((n, fields[n]) for n in tunables if n in fields)
    if not sets:
        raise ProfileError(
            f"{where}: the entry for {cls.__name__} sets no tunable; name at least one of "
            f"{', '.join(tunables) or '(it has none)'}")
    match = tuple((n, fields[n]) for n in params if n in fields)
    return Entry(cls.__name__, match, sets, origin)


class Profile:
    """An ordered set of entries for one device (or any device, for a profile made in code)."""

    def __init__(self, entries: Iterable[Entry] = (), device: str | None = None):
        self.device = device
        self.entries: list[Entry] = []
        for e in entries:
            self._insert(e)

    def add(self, cls: type[Operator], **fields: Any) -> Profile:
        """Add an entry: the ``param()`` fields given match, the ``tunable()`` fields given set."""
        if not (isinstance(cls, type) and issubclass(cls, Operator)):
            raise ProfileError(f"Profile.add: {cls!r} is not an operator class")
        self._insert(make_entry(cls, fields))
        return self

    def _insert(self, entry: Entry) -> None:
        """Add ``entry``, replacing an earlier one with the same operator and match."""
        self.entries = [e for e in self.entries
                        if (e.operator, e.match) != (entry.operator, entry.match)]
        self.entries.append(entry)

    def lookup(self, op: Operator) -> dict[str, tuple[Any, Entry]]:
        """For each tunable some entry sets for ``op``: (value, winning entry), by the precedence rule above."""
        chosen: dict[str, tuple[Any, Entry]] = {}
        for name in op.tunables():
            best: list[tuple[Any, Entry]] = []
            for entry in self.entries:
                if name in dict(entry.sets) and entry.applies_to(op):
                    if best and entry.specificity < best[0][1].specificity:
                        continue
                    if best and entry.specificity > best[0][1].specificity:
                        best = []
                    best.append((dict(entry.sets)[name], entry))
            values = {v for v, _ in best}
            if len(values) > 1:
                a, b = [e for _, e in best][:2]
                raise ProfileError(
                    f"{op.describe()}: two equally specific profile entries set {name} "
                    f"differently: {a.describe()} and {b.describe()}; make one of them more "
                    "specific or remove one")
            if best:
                chosen[name] = best[0]
        return chosen

    # ---- equality, files ------------------------------------------------------------------

    def sorted_entries(self) -> list[Entry]:
        return sorted(self.entries, key=lambda e: (e.operator, json.dumps(e.match), e.sets))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Profile) and self.device == other.device
                and set(self.entries) == set(other.entries))

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"<Profile device={self.device!r} entries={len(self.entries)}>"

    def dumps(self) -> str:
        lines = [json.dumps(e.fields(), separators=(", ", ": ")) for e in self.sorted_entries()]
        head = json.dumps({"device": self.device})[:-1]
        if not lines:
            return head + ', "entries": []}\n'
        return head + ', "entries": [\n  ' + ",\n  ".join(lines) + "\n]}\n"

    def save(self, path: str | os.PathLike) -> Path:
        """Write the profile deterministically and atomically (temporary file, then rename)."""
        path = Path(path)
        atomic_write_bytes(path, self.dumps().encode("utf-8"))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Profile:
        """Read a profile file; any problem is an error naming the file, the line and the rule."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ProfileError(f"{path}: no such profile file") from None
        except UnicodeDecodeError as e:
            raise ProfileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        return cls.loads(text, str(path))

    @classmethod
    def loads(cls, text: str, name: str = "<profile>") -> Profile:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ProfileError(f"{name} line {e.lineno} column {e.colno}: malformed JSON: "
                               f"{e.msg}") from None
        if not isinstance(doc, dict) or set(doc) != {"device", "entries"}:
            keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
            raise ProfileError(f"{name} line 1: a profile is an object with exactly the keys "
                               f"'device' and 'entries', got {keys}")
        device = doc["device"]
        if device is not None and device not in DEVICE_NAMES:
            raise ProfileError(f"{name} line 1: unknown device {device!r}; expected one of "
                               f"{', '.join(DEVICE_NAMES)}")
        if not isinstance(doc["entries"], list):
            raise ProfileError(f"{name}: 'entries' must be a list")
        entries, seen = [], {}
        for (raw, line) in zip(doc["entries"], entry_lines(text)):
            where = f"{name} line {line}"
            if not isinstance(raw, dict) or not isinstance(raw.get("operator"), str):
                raise ProfileError(f"{where}: an entry is an object with an \"operator\" name, "
                                   f"got {json.dumps(raw)}")
            op_name = raw["operator"]
            op_cls = Operator.registry.get(op_name)
            if op_cls is None:
                raise ProfileError(f"{where}: unknown operator {op_name!r}; known operators: "
                                   f"{', '.join(sorted(Operator.registry))}")
            entry = make_entry(op_cls, {k: v for k, v in raw.items() if k != "operator"}, where)
            if (entry.operator, entry.match) in seen:
                raise ProfileError(f"{where}: duplicates the entry at "
                                   f"{seen[entry.operator, entry.match]} (same operator and "
                                   "params); merge them")
            seen[entry.operator, entry.match] = where
            entries.append(entry)
        return cls(entries, device)


def entry_lines(text: str) -> list[int]:
    """The line on which each element of the top-level "entries" list starts.

    Called only on text that already parsed, so the structure is known to be valid.
    """
    decoder = json.JSONDecoder()
    doc_start = text.index("{")
    pos = doc_start + 1
    lines = []
    while True:  # walk the top-level keys until "entries"
        pos = skip_space(text, pos, ",")
        key, pos = decoder.raw_decode(text, pos)
        pos = skip_space(text, pos, ":")
        if key != "entries":
            _, pos = decoder.raw_decode(text, pos)
            continue
        pos = skip_space(text, pos, "[")
        while True:
            pos = skip_space(text, pos, ",")
            if text[pos] == "]":
                return lines
            lines.append(text.count("\n", 0, pos) + 1)
            _, pos = decoder.raw_decode(text, pos)


def skip_space(text: str, pos: int, punctuation: str) -> int:
    while text[pos].isspace() or text[pos] in punctuation:
        pos += 1
    return pos


def as_profile(value: Profile | str | os.PathLike | None, device: str) -> Profile:
    """A ``Profile`` from what ``Graph.profile`` accepts: a profile, a file, a folder, or None."""
    if value is None:
        return Profile()
    if isinstance(value, Profile):
        profile = value
    else:
        path = Path(value)
        if path.is_dir():
            path = path / f"{device}.json"
        profile = Profile.load(path)
    if profile.device not in (None, device):
        raise ProfileError(f"a profile for {profile.device} cannot apply to a graph on {device}")
    return profile
