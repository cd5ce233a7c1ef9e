"""The tuning log: one JSON line per measured candidate, so a tune resumes where it stopped.

A record is keyed by the candidate's artifact key, which already hashes the kernel source, the
compiler and every field value: a re-run measures only what changed.  Each line is flushed and
fsynced before the next candidate starts, so killing the tuner loses at most the candidate in
flight, and a torn last line (a kill mid-write) is ignored on the next load.

Records::

    {"key": ..., "status": "started"}                      about to run this candidate
    {"key": ..., "status": "ok", "median": s,              measured (or modelled: source
     "source": "measured", ...}                            "model", with its bottleneck)
    {"key": ..., "status": "rejected", "reason": ...}      failed to compile, check or finish
    {"key": ..., "status": "interrupted"}                  the user stopped it mid-measurement
    {"key": new, "against": old, "status": "compared",     a head-to-head of two candidates:
     "gain": old/new, ...}                                 how much faster ``new`` ran (with
                                                           "program": the program both ran
                                                           in; ``against`` then ends with
                                                           "@program:digest" of its steps)

A candidate that was ``started`` twice without a result crashed or hung the tuner twice (a
kernel that never returns cannot be stopped in-process): the next run rejects it instead of
trying a third time.  One start is retried, so a kill in the middle of a run costs nothing.
Records measured by another benchmark ``method`` are ignored.  Each timing records ``load``,
the cores' worth of CPU other processes used while it ran (see ``iron.tuning.quiet``).  A line
whose fields do not have their types (``"median": "fast"``) is skipped like a torn one, and
counted in ``skipped``: the candidate is measured again.  ``source`` says where an ``ok``
record's time came from: ``"measured"``, or ``"model"`` (a target's cost model, on a device
this machine cannot run; ``bottleneck`` then names what limits it).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: ``started`` marks left without a result after which a candidate is rejected.
CRASH_LIMIT = 2


@dataclass(frozen=True)
class Record:
    """The outcome of one candidate: a time (``median`` seconds per run) or a rejection."""

    key: str
    status: str  # "ok" or "rejected"
    operator: str = ""
    fields: dict[str, Any] = field(default_factory=dict, compare=False)
    median: float | None = None
    spread: float | None = None  # interquartile range / median
    runs: int = 0
    reason: str = ""
    method: str = ""
    load: float | None = None  # cores' worth other processes used while it was timed
    source: str = "measured"
    bottleneck: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        doc = {"key": self.key, "status": self.status, "method": self.method,
               "operator": self.operator, "fields": self.fields}
        if self.ok:
            doc.update(median=self.median, spread=self.spread, runs=self.runs, load=self.load,
                       source=self.source)
            if self.bottleneck:
                doc["bottleneck"] = self.bottleneck
        else:
            doc["reason"] = self.reason
        return doc


@dataclass(frozen=True)
class Comparison:
    """A head-to-head of candidate ``key`` against ``against``: ``gain`` = old time / new time."""

    key: str
    against: str
    gain: float  # the median of the per-round gains
    low: float  # their quartiles: the middle half of the rounds lies in low..high
    high: float
    rounds: int
    method: str = ""
    load: float | None = None  # cores' worth other processes used while it ran
    program: str = ""  # the program both ran in; "" for the kernels alone
    won: int | None = None  # rounds the new setting was faster in

    def to_json(self) -> dict[str, Any]:
        doc = {"key": self.key, "against": self.against, "status": "compared",
               "gain": self.gain, "low": self.low, "high": self.high, "rounds": self.rounds,
               "method": self.method, "load": self.load}
        if self.program:
            doc.update(program=self.program, won=self.won)
        return doc


STATUSES = ("started", "ok", "rejected", "interrupted", "compared")


def _number(value: Any, zero: bool = False) -> float:
    """A finite number above zero (or zero, where allowed); ValueError otherwise."""
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0 or (
            value == 0 and not zero):
        raise ValueError(f"{value!r} is not a positive number")
    return float(value)


def _count(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value


def _load(value: Any) -> float | None:
    return None if value is None else _number(value, zero=True)


def _source(value: Any) -> str:
    if value is None:
        return "measured"
    if value not in ("measured", "model"):
        raise ValueError(f"source {value!r}")
    return value


def _str(value: Any) -> str:
    if type(value) is not str:
        raise ValueError(f"{value!r} is not text")
    return value


def _dict(value: Any) -> dict:
    if type(value) is not dict:
        raise ValueError(f"{value!r} is not an object")
    return value


class TuneLog:
    """The records of one log file, for one benchmark method; appends are durable."""

    def __init__(self, path: str | os.PathLike, method: str, fresh: bool = False,
                 durable: bool = True):
        """``durable=False`` (a cost model's records: recomputed in microseconds) flushes each
        line without waiting for the disk, and syncs once at ``close``."""
        self.path = Path(path)
        self.method, self.durable = method, durable
        self.records: dict[str, Record] = {}
        self.comparisons: dict[tuple[str, str], Comparison] = {}
        self.starts: dict[str, int] = {}
        self.skipped = 0  # lines that were not records of the right shape
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fresh:
            self.path.write_bytes(b"")
        data = self.path.read_bytes() if self.path.exists() else b""
        self._read(data)
        self._file = open(self.path, "ab")
        if data and not data.endswith(b"\n"):
            self._file.write(b"\n")  # end a torn last line, so the next record starts clean

    def _read(self, data: bytes) -> None:
        for line in data.splitlines():
            try:
                doc = json.loads(line)
                if not (isinstance(doc, dict) and type(doc.get("key")) is str
                        and doc.get("status") in STATUSES):
                    raise ValueError("not a record")
                key, status = doc["key"], doc["status"]
                if status == "compared":
                    if doc.get("method") == self.method:
                        won = doc.get("won")
                        c = Comparison(key, _str(doc["against"]), _number(doc["gain"]),
                                       _number(doc["low"]), _number(doc["high"]),
                                       _count(doc["rounds"]), self.method,
                                       _load(doc.get("load")), _str(doc.get("program", "")),
                                       None if won is None else _count(won))
                        self.comparisons[c.key, c.against] = c
                    continue
                if status == "ok" and doc.get("method") == self.method:
                    record = Record(key, status, _str(doc.get("operator", "")),
                                    _dict(doc.get("fields", {})), _number(doc["median"]),
                                    _number(doc.get("spread", 0.0), zero=True),
                                    _count(doc.get("runs", 0)), "", self.method,
                                    _load(doc.get("load")), _source(doc.get("source")),
                                    _str(doc.get("bottleneck", "")))
                elif status == "rejected" and doc.get("method") == self.method:
                    record = Record(key, status, _str(doc.get("operator", "")),
                                    _dict(doc.get("fields", {})),
                                    reason=_str(doc.get("reason", "")), method=self.method)
                else:
                    record = None
            except (ValueError, KeyError, TypeError):
                self.skipped += 1  # a torn line from a kill mid-write, or a damaged one
                continue
            if status == "started":
                self.starts[key] = self.starts.get(key, 0) + 1
                continue
            self.starts.pop(key, None)
            if record is not None:
                self.records[key] = record

    def get(self, key: str) -> Record | None:
        """The logged outcome of ``key``, a rejection if it crashed the tuner twice, or None."""
        record = self.records.get(key)
        if record is None and self.starts.get(key, 0) >= CRASH_LIMIT:
            return Record(key, "rejected", reason=f"crashed or hung the tuner {self.starts[key]} "
                          "times (started, never finished)", method=self.method)
        return record

    def comparison(self, key: str, against: str) -> Comparison | None:
        return self.comparisons.get((key, against))

    def compared(self, comparison: Comparison) -> None:
        self._write(comparison.to_json())
        self.comparisons[comparison.key, comparison.against] = comparison

    def start(self, key: str) -> None:
        self._write({"key": key, "status": "started"})
        self.starts[key] = self.starts.get(key, 0) + 1

    def interrupted(self, key: str) -> None:
        self._write({"key": key, "status": "interrupted"})
        self.starts.pop(key, None)

    def add(self, record: Record) -> None:
        self._write(record.to_json())
        self.records[record.key] = record
        self.starts.pop(record.key, None)

    def _write(self, doc: dict[str, Any]) -> None:
        self._file.write(json.dumps(doc, sort_keys=True).encode() + b"\n")
        self._file.flush()
        if self.durable:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
        self._file.close()

    def __enter__(self) -> TuneLog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
