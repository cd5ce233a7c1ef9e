"""What a tuning run reports as it goes: the events the tuner emits, and the sinks that take them.

The tuner decides (what it measures, which setting moves and why one is kept) and emits each
step as a frozen event carrying its data; a sink decides what becomes of it.  ``PrintSink``
writes each event's ``text()`` as lines (the command line's progress and closing report);
``Collect`` keeps the events for a caller, a test or a notebook, to read as data.  The wording
lives here, beside the data it words, so the decision logic never prints.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, TextIO

from .report import report_lines, setting_text

if TYPE_CHECKING:
    from .log import Comparison
    from .measure import Measurement


class Event(ABC):
    """One thing a tuning run reports."""

    @abstractmethod
    def text(self) -> str:
        """The event as the command line shows it (one or more lines)."""


#: Where a tuning run's events go: any callable taking one event.
Sink = Callable[[Event], None]


class PrintSink:
    """Writes each event's text to ``stream`` (None: the ``sys.stdout`` of the moment), flushed,
    so a long run's progress shows as it happens."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream

    def __call__(self, event: Event) -> None:
        print(event.text(), file=self.stream or sys.stdout, flush=True)


@dataclass
class Collect:
    """Keeps every event, in order, for reading as data."""

    events: list[Event] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Event]) -> list[Any]:
        """The events of class ``kind``."""
        return [e for e in self.events if isinstance(e, kind)]


# ---- the run's plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RankedByModel(Event):
    """The device cannot run here: candidates are ranked by its target's cost model."""

    device: str
    reason: str
    kind: str

    def text(self) -> str:
        return (f"source: model. {self.device} cannot run here "
                f"({self.reason.split(':', 1)[-1].strip()}), so candidates are ranked by the "
                f"{self.kind} target's cost model, not measured")


@dataclass(frozen=True)
class Planned(Event):
    """What the run will tune: instances, candidates, and what it skips."""

    app: str
    device: str
    instances: int
    candidates: int
    logged: int  # of the candidates, already in the log
    log_path: Path
    single_setting: int  # instances skipped: one legal setting
    prune: int = 0  # the cost model's fastest candidates per instance kept (0: not pruned)
    legal: int = 0
    elsewhere: int = 0  # instances the target places on another unit
    placement: str = ""  # that unit
    kind: str = ""  # the target's kind
    budget: float | None = None
    unpriced: int = 0  # instances measured in full: no cost estimate

    def text(self) -> str:
        return (f"tuning {self.app} on {self.device}: {self.instances} instances, "
                f"{self.candidates} candidates "
                + (f"(the cost model's {self.prune} fastest of each instance and the setting in "
                   f"use; {self.legal} legal, --full measures all) " if self.prune else "")
                + f"({self.logged} already in {self.log_path}); {self.single_setting} instances "
                "with a single legal setting skipped"
                + (f"; {self.elsewhere} instances placed on the {self.placement} skipped (no "
                   f"{self.kind} design: their tunables change nothing there)"
                   if self.elsewhere else "")
                + (f"; budget {self.budget:g} s" if self.budget is not None else "")
                + (f"; {self.unpriced} instances without a cost estimate measured in full"
                   if self.unpriced else ""))


@dataclass(frozen=True)
class LogLinesSkipped(Event):
    count: int
    path: Path

    def text(self) -> str:
        return (f"warning: {self.count} line(s) of {self.path} are not valid records and were "
                "skipped; their candidates are measured again")


@dataclass(frozen=True)
class LoadingWeights(Event):
    def text(self) -> str:
        return "loading the application's weights: head-to-heads run inside its programs"


@dataclass(frozen=True)
class ClusterReady(Event):
    address: str
    workers: int
    device: str

    def text(self) -> str:
        return (f"cluster {self.address}: {self.workers} workers offer {self.device}; compiles "
                "go to any worker, measurements to those")


@dataclass(frozen=True)
class WorkersShareHost(Event):
    count: int
    host: str
    device: str

    def text(self) -> str:
        return (f"warning: {self.count} workers offering {self.device} run on host {self.host}: "
                "they measure at the same time, so if they share one device (the host cpu "
                "does) each disturbs the other's timings; run one worker per device")


# ---- measuring ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BaselineStarted(Event):
    """The settings in use of ``instances`` instances are measured first."""

    instances: int
    eta: str

    def text(self) -> str:
        return f"measuring the setting in use of {self.instances} instances ({self.eta})"


@dataclass(frozen=True)
class InstanceStarted(Event):
    n: int
    of: int
    instance: str
    uses: int
    candidates: int
    to_measure: int
    eta: str

    def text(self) -> str:
        return (f"[{self.n}/{self.of}] {self.instance} x{self.uses}: {self.candidates} "
                f"candidates, {self.to_measure} to measure ({self.eta})")


@dataclass(frozen=True)
class Compiled(Event):
    count: int
    seconds: float
    failed: int

    def text(self) -> str:
        return (f"    compiled {self.count} in {self.seconds:.0f} s"
                + (f", {self.failed} failed" if self.failed else ""))


@dataclass(frozen=True)
class Measured(Event):
    """One candidate's logged outcome: its time, or why it was rejected."""

    setting: Mapping[str, int]
    measurement: Measurement
    best_so_far: bool
    label: str = ""  # the instance, when candidates of several are measured together

    def text(self) -> str:
        m = self.measurement
        if m.error is None:
            spread = (f"modelled, {m.bottleneck}-bound" if m.bottleneck
                      else f"+-{100 * m.spread:.1f}% ({m.runs} runs)")
            what = (f"{m.median * 1e6:9.1f} us {spread}"
                    + ("  best so far" if self.best_so_far else ""))
        else:
            what = f"rejected: {m.error.splitlines()[0][:150]}"
        return f"    {self.label}{setting_text(self.setting)}  {what}"


@dataclass(frozen=True)
class SweepBest(Event):
    setting: Mapping[str, int]
    seconds: float
    measured: int
    total: int
    rejected: int
    modelled: bool

    def text(self) -> str:
        return (f"    best {setting_text(self.setting)} {self.seconds * 1e6:.1f} us "
                f"({self.measured}/{self.total} {'modelled' if self.modelled else 'measured'}, "
                f"{self.rejected} rejected)")


@dataclass(frozen=True)
class InUseRejected(Event):
    setting: Mapping[str, int]
    problem: str

    def text(self) -> str:
        return (f"    warning: the setting in use, {setting_text(self.setting)}, was rejected: "
                f"{self.problem.splitlines()[0][:150]}")


@dataclass(frozen=True)
class Paused(Event):
    """Other processes use more than ``limit`` cores' worth: timings wait for a quiet machine."""

    busy: float
    limit: float

    def text(self) -> str:
        return (f"    paused: other processes use {self.busy:.2f} cores' worth "
                f"(limit {self.limit:g})")


@dataclass(frozen=True)
class QuietAgain(Event):
    waited: float

    def text(self) -> str:
        return f"    quiet again after {self.waited:.0f} s"


# ---- deciding ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredAgain(Event):
    """A head-to-head is not trusted and is measured again: the logged one ran under ``load``
    busy cores, or its ``gain`` is implausible."""

    load: float | None = None
    gain: float | None = None

    def text(self) -> str:
        if self.gain is not None:
            return f"    an implausible head-to-head gain of {self.gain:.3g}x: measured again"
        return (f"    the logged head-to-head ran beside {self.load:.2f} busy cores: "
                "measured again")


@dataclass(frozen=True)
class NoTimeForHeadToHead(Event):
    def text(self) -> str:
        return "    no time left for the head-to-head: keeps the setting in use"


@dataclass(frozen=True)
class HeadToHead(Event):
    """The sweep's fastest against the setting in use, and whether it moves."""

    in_use: Mapping[str, int]
    comparison: Comparison
    moves: bool
    modelled: bool
    min_gain: float  # what a move needs, kernels alone or modelled

    def text(self) -> str:
        c = self.comparison
        if self.modelled:
            return (f"    modelled against the setting in use ({setting_text(self.in_use)}): "
                    f"{c.gain:.3f}x -> " + ("moves" if self.moves else "keeps the setting in "
                                            f"use (the model predicts less than "
                                            f"{self.min_gain:g}x)"))
        where = f"in the {c.program} program" if c.program else "the kernels alone"
        rule = ("a move needs the program faster beyond the spread: the middle half of the "
                "rounds above 1" if c.program else
                f"a move needs {self.min_gain:g}x, and faster in three rounds of four")
        won = f", ahead in {c.won} of {c.rounds}" if c.won is not None else ""
        return (f"    head-to-head {where} against the setting in use "
                f"({setting_text(self.in_use)}): {c.gain:.3f}x, middle half of {c.rounds} "
                f"rounds {c.low:.3f}-{c.high:.3f}x{won} -> "
                + ("moves" if self.moves else f"keeps the setting in use ({rule})"))


@dataclass(frozen=True)
class NearMissesProposed(Event):
    count: int

    def text(self) -> str:
        return (f"{self.count} instances were ahead head-to-head within the spread: their "
                "winners are proposed together, and the whole-model A/B decides")


@dataclass(frozen=True)
class WholeModelStarted(Event):
    rounds: int

    def text(self) -> str:
        return ("whole-model A/B: every program with the new profile, the previous one and "
                f"resolve() defaults, up to {self.rounds} interleaved rounds")


@dataclass(frozen=True)
class NotApplied(Event):
    """A chosen setting the application does not pick up (a call keyword wins)."""

    instance: str
    applied: Mapping[str, int]
    chosen: Mapping[str, int]

    def text(self) -> str:
        return (f"warning: {self.instance} still resolves to {setting_text(self.applied)}, "
                f"not the tuned {setting_text(self.chosen)}: a call keyword or another profile "
                "entry overrides it")


@dataclass(frozen=True)
class Finished(Event):
    """The run's result (an ``iron.tuning.tuner.TuneResult``); its text is the closing report."""

    result: Any

    def text(self) -> str:
        return "\n".join(report_lines(self.result))
