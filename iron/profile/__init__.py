"""Profiles: per-device tunable choices, kept as data and applied to operators from outside.

A tunable gets its value from, in order:

1. the call's own keyword — ``AXPY.step(x, y, scalar_factor=1.5, num_aie_columns=1)``;
2. the profile — among the entries that match the step, the most specific one that sets the
   tunable wins (specificity = how many ``param()`` fields the entry names; a param it leaves
   out matches any value); two equally specific matching entries that set it differently are an
   error naming both;
3. ``iron.resolve(op, dev)`` — the first legal setting of the operator's space on the device.

Each tunable is decided on its own, so one entry may set ``tile_size`` and a more general one
``num_aie_columns`` for the same step.  An entry naming an operator's base class (``Elementwise``)
applies to its subclasses.  Example::

    profile = iron.Profile()
    profile.add(AXPY, tile_size=512, num_aie_columns=1)          # every AXPY
    profile.add(AXPY, size=2048, tile_size=1024)                 # wins for size 2048
    profile.save("build/my-profile.json")

The file is UTF-8 JSON, one entry per line so that ``git diff`` shows which tunable moved::

    {"device": "cpu", "entries": [
      {"operator": "AXPY", "size": 2048, "tile_size": 1024, "num_aie_columns": 2}
    ]}

Saving is deterministic (sorted entries, fields in declaration order) and atomic.  A tuned
profile also records the host it was tuned on (``"host": {"cpu": ..., "cores": 2, "march":
"native"}``).  On another host an entry that breaks a rule there (more columns than this host's
cores, ...) is not an error: its instance takes the defaults, and one warning line names every
such entry.  Loading is strict JSON: NaN, Infinity and a key given twice are errors.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import orjson

from .. import operators  # noqa: F401  (fills Operator.registry, which files name)
from ..devices import DEVICE_NAMES
from ..errors import FieldError, ProfileError
from ..operator import Operator
from ..jsonfile import JSONDepthError, check_depth
from ..util import atomic_write_bytes, read_bounded


@dataclass(frozen=True)
class Entry:
    """One profile entry: the params it matches and the tunables it sets, for one operator."""

    operator: str
    match: tuple[tuple[str, Any], ...]
    sets: tuple[tuple[str, Any], ...]
    origin: Any = field(default="", compare=False)  # for messages: "cpu.json line 3"

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
        return f"profile entry {body}" + (f" ({self.origin})" if str(self.origin) else "")


def make_entry(cls: type[Operator], fields: Mapping[str, Any], origin: Any = "") -> Entry:
    """Validate ``fields`` against ``cls``'s declaration and split them into match and sets."""
    params, tunables = cls.params(), cls.tunables()
    if not fields.keys() <= _field_set(cls):
        try:
            cls.check_field_names(fields, origin or f"Profile.add({cls.__name__}, ...)")
        except FieldError as e:
            raise ProfileError(str(e)) from None
    sets = tuple((n, fields[n]) for n in tunables if n in fields)
    match = tuple((n, fields[n]) for n in params if n in fields)
    for name, value in sets:
        if type(value) is not int or value < 1:
            raise ProfileError(f"{origin or f'Profile.add({cls.__name__}, ...)'}: "
                               f"{cls.__name__}.{name}={value!r} breaks the rule: a tunable is "
                               "a positive integer")
    for name, value in match:
        choices = cls.choices(name)
        if type(value) not in (bool, int, float) and not (isinstance(value, str)
                                                          and value in choices):
            rule = f"one of {', '.join(choices)}" if choices else "a number"
            raise ProfileError(f"{origin or f'Profile.add({cls.__name__}, ...)'}: "
                               f"{cls.__name__}.{name}={value!r} is not {rule}")
    if not sets:
        raise ProfileError(
            f"{origin or f'Profile.add({cls.__name__}, ...)'}: the entry for {cls.__name__} "
            f"sets no tunable; name at least one of {', '.join(tunables) or '(it has none)'}")
    return Entry(cls.__name__, match, sets, origin)


_FIELD_SETS: dict[type, frozenset[str]] = {}


def _field_set(cls: type[Operator]) -> frozenset[str]:
    names = _FIELD_SETS.get(cls)
    if names is None:
        names = _FIELD_SETS[cls] = frozenset(cls.field_names())
    return names


class Profile:
    """An ordered set of entries for one device (or any device, for a profile made in code).

    Entries are kept by (operator, matched params), so adding one replaces an earlier entry of
    the same key and a lookup tries only the keys an instance can match: both cost the same
    whether the profile holds ten entries or a hundred thousand.
    """

    def __init__(self, entries: Iterable[Entry] = (), device: str | None = None,
                 host: Mapping[str, Any] | None = None):
        self.device = device
        self.host = dict(host) if host else None  # the host it was tuned on, as tuned
        self._entries: dict[tuple[str, tuple], Entry] = {}
        self._by_operator: dict[str, dict[tuple, Entry]] = {}
        self.fallbacks: dict[Entry, str] = {}  # entries that broke a rule here -> the rule
        self.warnings_to = None  # where fallback warnings go (a text stream; None: stderr)
        self._reported: set[Entry] = set()
        for e in entries:
            self._insert(e)

    @property
    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def add(self, cls: type[Operator], **fields: Any) -> Profile:
        """Add an entry: the ``param()`` fields given match, the ``tunable()`` fields given set."""
        if not (isinstance(cls, type) and issubclass(cls, Operator)):
            raise ProfileError(f"Profile.add: {cls!r} is not an operator class")
        self._insert(make_entry(cls, fields))
        return self

    def _insert(self, entry: Entry) -> None:
        """Add ``entry``, replacing an earlier one with the same operator and match."""
        key = (entry.operator, entry.match)
        self._entries.pop(key, None)  # re-inserted last, as a replacement always was
        self._entries[key] = entry
        self._by_operator.setdefault(entry.operator, {})[entry.match] = entry

    def candidates(self, op: Operator) -> list[Entry]:
        """The entries that apply to ``op``: one dictionary probe per subset of its params."""
        found = []
        params = [(n, getattr(op, n)) for n in op.params()]
        for cls in type(op).__mro__:
            table = self._by_operator.get(cls.__name__)
            if not table:
                continue
            if len(table) <= 1 << len(params):
                found += [e for e in table.values() if e.applies_to(op)]
                continue
            for k in range(len(params) + 1):
                for subset in itertools.combinations(params, k):
                    entry = table.get(subset)
                    if entry is not None:
                        found.append(entry)
        return found

    def lookup(self, op: Operator) -> dict[str, tuple[Any, Entry]]:
        """For each tunable some entry sets for ``op``: (value, winning entry); see the module
        docstring for the rule."""
        chosen: dict[str, tuple[Any, Entry]] = {}
        candidates = self.candidates(op)
        for name in op.tunables():
            best: list[tuple[Any, Entry]] = []
            for entry in candidates:
                if name in dict(entry.sets):
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

    # ---- entries that do not fit this host ------------------------------------------------

    def fall_back(self, entries: Iterable[Entry], rule_text: str) -> None:
        """Note that ``entries`` broke ``rule_text`` here and their instance took defaults."""
        for entry in entries:
            self.fallbacks.setdefault(entry, rule_text)

    def report_fallbacks(self, stream=None) -> None:
        """One warning line naming the entries that fell back since the last report."""
        new = [e for e in self.fallbacks if e not in self._reported]
        if not new:
            return
        self._reported.update(new)
        rules = sorted({self.fallbacks[e] for e in new})
        files: dict[str, list[str]] = {}  # "cpu.json line 2", "cpu.json line 3" -> lines 2, 3
        for origin in sorted({str(e.origin) or e.operator for e in new}, key=_natural):
            head, sep, line = origin.rpartition(" line ")
            files.setdefault(head if sep else origin, []).append(line if sep else "")
        where = [f"{name} line{'s' if len(lines) > 1 else ''} {', '.join(lines)}"
                 if lines[0] else name for name, lines in files.items()]
        print(f"warning: {len(new)} profile entr{'y' if len(new) == 1 else 'ies'} "
              f"do{'es' if len(new) == 1 else ''} not fit this host (breaking "
              f"{'; '.join(rules)}) and use the defaults instead: {', '.join(where)}",
              file=stream or self.warnings_to or sys.stderr)

    # ---- equality, files ------------------------------------------------------------------

    def sorted_entries(self) -> list[Entry]:
        return sorted(self.entries, key=lambda e: (e.operator, json.dumps(e.match), e.sets))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Profile) and self.device == other.device
                and set(self.entries) == set(other.entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<Profile device={self.device!r} entries={len(self)}>"

    def dumps(self) -> str:
        lines = [json.dumps(e.fields(), separators=(", ", ": ")) for e in self.sorted_entries()]
        head = json.dumps({"device": self.device})[:-1]
        if self.host:
            head += ', "host": ' + json.dumps(self.host, sort_keys=True)
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
        """Read a profile file; any problem is an error naming the file, the line and the rule.

        The file must be a regular file of at most ``MAX_USER_FILE`` bytes (64 MiB): a link
        to /dev/zero or a FIFO is refused before anything is read."""
        path = Path(path)
        try:
            data = read_bounded(path, "a profile")
        except FileNotFoundError:
            raise ProfileError(f"{path}: no such profile file") from None
        except OSError as e:
            raise ProfileError(f"{path}: cannot read the profile ({e.strerror})") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProfileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        return cls.loads(text, str(path))

    @classmethod
    def loads(cls, text: str, name: str = "<profile>") -> Profile:
        """Parse a profile's text: strict JSON (no NaN or Infinity, no key given twice)."""
        doc = _parse(text, name)
        if not isinstance(doc, dict) or not {"device", "entries"} <= set(doc) <= _TOP_KEYS:
            keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
            raise ProfileError(f"{name} line 1: a profile is an object with the keys 'device' "
                               f"and 'entries' (and optionally 'host'), got {keys}")
        device = doc["device"]
        if device is not None and device not in DEVICE_NAMES:
            raise ProfileError(f"{name} line 1: unknown device {device!r}; expected one of "
                               f"{', '.join(DEVICE_NAMES)}")
        host = doc.get("host")
        if host is not None and not isinstance(host, dict):
            raise ProfileError(f"{name}: 'host' must be an object describing the tuning host, "
                               f"got {json.dumps(host)}")
        if not isinstance(doc["entries"], list):
            raise ProfileError(f"{name}: 'entries' must be a list")
        lines = _Lines(text, name)
        profile = cls((), device, host)
        table, registry = profile._entries, Operator.registry
        for i, raw in enumerate(doc["entries"]):
            where = _Origin(lines, i)
            if type(raw) is not dict or type(raw.get("operator")) is not str:
                raise ProfileError(f"{where}: an entry is an object with an \"operator\" name, "
                                   f"got {json.dumps(raw)}")
            op_name = raw.pop("operator")
            op_cls = registry.get(op_name)
            if op_cls is None:
                raise ProfileError(f"{where}: unknown operator {op_name!r}; known operators: "
                                   f"{', '.join(sorted(registry))}")
            entry = make_entry(op_cls, raw, where)
            key = (entry.operator, entry.match)
            if key in table:
                raise ProfileError(f"{where}: duplicates the entry at {table[key].origin} "
                                   "(same operator and params); merge them")
            profile._insert(entry)
        return profile


_TOP_KEYS = {"device", "entries", "host"}
_batch: contextvars.ContextVar[bool] = contextvars.ContextVar("iron_profile_batch",
                                                              default=False)


@contextlib.contextmanager
def batch_reports(profile: Profile | None):
    """Record several programs under ``profile`` and report its fallbacks once, at the end."""
    token = _batch.set(True)
    try:
        yield
    finally:
        _batch.reset(token)
    if profile is not None and not _batch.get():
        profile.report_fallbacks()


def _natural(text: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


class _Duplicate(ValueError):
    """A key given twice in one object (raised by ``_unique`` while parsing)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict:
    """``json``'s ``object_pairs_hook``: the object, unless a key (as decoded, so an escaped
    spelling such as ``"d\\u0065vice"`` is the same key) appears twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        raise _Duplicate(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


def _no_constant(word: str) -> Any:
    raise ValueError(word)


def _parse(text: str, name: str) -> Any:
    """Strict JSON: no NaN or Infinity, and no key given twice in one object, checked on the
    keys as parsed (``json``'s C parser, calling ``_unique`` once per object).  Only a text that
    fails is parsed again, by orjson, whose messages say what was expected where.  Nesting
    deeper than ``jsonfile.MAX_DEPTH`` is refused first (``json`` would recurse through it)."""
    try:
        check_depth(text)
    except JSONDepthError as e:
        raise ProfileError(f"{name}: {e}") from None
    try:
        return json.loads(text, object_pairs_hook=_unique, parse_constant=_no_constant)
    except _Duplicate as e:
        raise ProfileError(f"{name} line {_object_line(text)}: key {e.args[0]!r} appears twice "
                           "in the object that starts there; JSON keys must be unique") from None
    except ValueError as e:  # malformed, or NaN / Infinity: orjson says what was expected
        error = e
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError as e:
        line = text.count("\n", 0, e.pos) + 1
        column = e.pos - (text.rfind("\n", 0, e.pos) + 1) + 1
        nan = (" (NaN and Infinity are not JSON numbers)"
               if re.match(r"-?(NaN|Infinity)", text[e.pos:e.pos + 9]) else "")
        raise ProfileError(f"{name} line {line} column {column}: malformed JSON{nan}: "
                           f"{e.msg}") from None
    where = (f" line {error.lineno} column {error.colno}"
             if isinstance(error, json.JSONDecodeError) else "")
    raise ProfileError(f"{name}{where}: malformed JSON: {error}") from None


def _object_line(text: str) -> int:
    """The line on which the object holding a key twice starts: the text parsed again by
    ``json``'s pure-Python parser, which tells where each object starts (slow, so only for the
    message)."""
    from json.decoder import JSONObject
    from json.scanner import py_make_scanner

    starts: list[int] = []

    def parse_object(s_and_end, *args):
        starts.append(s_and_end[1] - 1)  # the "{"
        result = JSONObject(s_and_end, *args)
        starts.pop()
        return result

    decoder = json.JSONDecoder(object_pairs_hook=_unique)
    decoder.parse_object = parse_object
    decoder.scan_once = py_make_scanner(decoder)
    try:
        decoder.decode(text)
    except _Duplicate:
        return text.count("\n", 0, starts[-1]) + 1
    return 1


class _Lines:
    """The line each entry of a profile text starts on, found once and only when a message
    needs one (most loads never do)."""

    def __init__(self, text: str, name: str):
        self.text, self.name, self._lines = text, name, None

    def __getitem__(self, i: int) -> int:
        if self._lines is None:
            self._lines = entry_lines(self.text)
        return self._lines[i]


@dataclass(frozen=True)
class _Origin:
    """``cpu.json line 3``, computed when shown."""

    lines: _Lines
    index: int

    def __str__(self) -> str:
        return f"{self.lines.name} line {self.lines[self.index]}"

    def __bool__(self) -> bool:
        return True


def entry_lines(text: str) -> list[int]:
    """The line on which each element of the top-level "entries" list starts, in one pass.

    Called only on text that already parsed, so the structure is known to be valid.
    """
    decoder = json.JSONDecoder()
    doc_start = text.index("{")
    pos = doc_start + 1
    lines, line, counted = [], 1, 0
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
            line += text.count("\n", counted, pos)
            counted = pos
            lines.append(line)
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
