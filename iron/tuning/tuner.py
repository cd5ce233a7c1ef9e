"""The tuner: time every legal setting of every operator instance and rewrite the profile.

Small pieces, each in its own module, as in Triton's autotuner and TVM's meta-schedule:

- ``candidates``: for each distinct operator instance the application builds (class + params;
  an instance's tuned setting applies to all its uses), the frozen operators of
  ``legal_settings(op, dev)`` — the same legality rules ``resolve`` enforces;
- ``measure``: a benchmark passed in (``TargetBenchmark`` by default): it compiles candidates
  through the device's target and the artifact store, checks each against the reference maths
  on the instance's real shapes and times it;
- ``log``: one durable line per measured candidate, keyed by its artifact key, so an
  interrupted run resumes and a re-run measures only what changed;
- ``report``: the closing table of what moved; this module runs the whole.

With a cost model (``Target.cost``, see ``iron.tuning.model``) the sweep can be pruned to the
model's fastest candidates plus the setting in use, and a device that cannot run here is tuned
by the model alone, every record and the report saying ``source: model``.  Instances the
target places elsewhere (an npu step without a design runs on the host) are not tuned.

Per instance the setting the application runs today is measured first, so when the budget runs
out the best found so far is never worse than what the profile had.  The fastest valid
candidate wins the sweep (ties go to the earlier legal setting); a rejected one (compile error,
wrong result, timeout) is logged with its reason and never chosen.  The sweep's medians are
taken seconds apart, and on a shared machine they drift by more than many settings differ; so
the winner replaces the setting in use only after a head-to-head (the two timed in alternating
blocks on the same inputs) shows it at least ``MIN_GAIN`` faster in the median block and faster
in three blocks of four.  Near-ties keep what the profile had, which makes re-tuning stable: a
profile changes only for a gain that repeats.  The profile is rewritten with one entry per tuned
instance, matching all its params and setting all its tunables; every other entry survives.

With ``scheduler`` (a Dask scheduler's address), compiles, measurements and head-to-heads run
on the cluster's workers instead (``iron.tuning.cluster``): an instance's candidates are
measured in parallel, one per device worker at a time, and this process stays the only writer
of the log and the profile, so the run's decisions and its resume are those of a local run.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..devices import Device, device as get_device
from ..errors import DeviceError, IronError
from ..operator import Operator
from ..paths import build_dir
from ..pipeline.app import Application, profile_path as app_profile_path
from ..profile import Profile
from ..targets import target_for
from ..host import summary as host_summary
from .candidates import Instance, candidates, instances, traffic
from .events import (BaselineStarted, Compiled, Finished, HeadToHead, InstanceStarted,
                     InUseRejected, LoadingWeights, LogLinesSkipped, Measured, MeasuredAgain,
                     NearMissesProposed, NoTimeForHeadToHead, NotApplied, Planned, PrintSink,
                     RankedByModel, Sink, SweepBest, WholeModelStarted)
from .log import Comparison, Record, TuneLog
from .measure import Benchmark, Measurement, TargetBenchmark
from .quiet import QUIET, BusyError
from .model import ModelBenchmark
from .model import estimable
from .model import prune as prune_candidates
from .whole import AB_ROUNDS, Verdict, validate

#: How much faster, head-to-head (median round), a setting must run to replace the one in use.
MIN_GAIN = 1.03
#: A head-to-head gain beyond this (or its inverse) is taken for a disturbed measurement and
#: measured again once before it can move anything: no setting of one operator on one host has
#: been 10x another here, and a 1496x "gain" came from a busy machine.
IMPLAUSIBLE = 10.0


@dataclass(frozen=True)
class Outcome:
    """What tuning found for one instance."""

    instance: Instance
    total: int  # candidates
    measured: int  # with a logged outcome (ok or rejected), this run or an earlier one
    rejected: int
    best: Operator | None  # the sweep's fastest valid candidate, if any was measured
    best_time: float | None
    old_time: float | None  # of the setting the application ran before
    old_problem: str = ""  # why the old setting was rejected, if it was
    chosen: Operator | None = None  # what the profile gets: best if it won the head-to-head
    gain: float | None = None  # best against the old setting, head-to-head
    decided: bool = True  # False when the budget ran out before the head-to-head
    program: str = ""  # the program the head-to-head ran in ("": the kernels alone)
    tried: tuple[Operator, ...] = ()  # the candidates, in the order measured


@dataclass(frozen=True)
class Move:
    """One row of the table of what moved: an instance whose chosen setting changed."""

    instance: str
    old: dict[str, int]
    new: dict[str, int]
    old_time: float | None
    new_time: float
    gain: float | None  # head-to-head; None when the old setting was rejected
    program: str = ""  # the program the head-to-head ran in ("": the kernels alone)


@dataclass
class TuneResult:
    """The rewritten profile, where it went, what moved, and whether every candidate ran."""

    profile: Profile
    path: Path
    moved: list[Move]
    outcomes: list[Outcome]
    complete: bool
    measured_now: int
    seconds: float
    source: str = "measured"  # or "model": the times are the target's cost model's
    pruned: int = 0  # candidates per instance the model let through (0: all were measured)
    legal: int = 0  # legal candidates of the tuned instances, before pruning
    verdict: Verdict | None = None  # the whole-model A/B, when the programs were run
    written: bool = True  # False: the A/B found the model slower, the profile is unchanged
    unpriced: int = 0  # instances measured in full: their family's cost hook has no estimate
    plots: str = ""  # where the per-instance charts went, or why there are none


@dataclass(frozen=True)
class TuneOptions:
    """How one tuning run goes; each default is that of a plain run with no limit.

    ``only``: operator class names (a base class selects its subclasses) to tune; entries for
    the others are kept.  ``budget``: wall-clock seconds for the whole run: when it runs out,
    each instance keeps the best found so far and instances never measured keep their previous
    entry or default.  ``fresh``: discard the log.  ``prune``: when the target has a cost
    model, measure only its ``prune`` fastest candidates per instance, plus the setting in use
    (0: every candidate; the command line's default is ``DEFAULT_PRUNE``, see
    ``iron.tuning.model``).  ``in_program``: run the head-to-heads inside the application's
    programs, and the whole-model A/B that decides what is written (``iron.tuning.whole``),
    when the benchmark is a ``TargetBenchmark`` and no scheduler is given.  ``scheduler``
    (``tcp://HOST:PORT`` or a ``distributed.Client``): run the benchmark on a Dask cluster.
    ``profile_path`` and ``log_path`` default to ``profiles/<app>/<device>.json`` (on the cpu,
    this host class's file) and ``build/tune/<app>-<profile>.jsonl``; ``previous_path``
    (default: ``profile_path``) is the profile whose settings are in use.  ``plots``: a folder
    for one chart per tuned instance (needs matplotlib, the ``plots`` extra).
    """

    only: tuple[str, ...] = ()
    budget: float | None = None
    fresh: bool = False
    prune: int = 0
    in_program: bool = True
    scheduler: Any = None
    profile_path: str | os.PathLike | None = None
    previous_path: str | os.PathLike | None = None
    log_path: str | os.PathLike | None = None
    plots: str | os.PathLike | None = None

    def __post_init__(self):
        if isinstance(self.only, str):
            raise IronError(f"TuneOptions.only={self.only!r}: give a tuple of operator names, "
                            "not one string")
        if self.budget is not None and not self.budget > 0:
            raise IronError(f"TuneOptions.budget={self.budget!r}: the budget must be a positive "
                            "number of seconds")
        if self.prune < 0:
            raise IronError(f"TuneOptions.prune={self.prune!r}: prune must be 0 (measure every "
                            "candidate) or a positive number of candidates")


def choose_benchmark(dev: Device, probe: Operator | None, emit: Sink,
                     given: Benchmark | None = None) -> Benchmark:
    """Measure where the device runs; elsewhere rank by its target's cost model, saying so.

    A tuner measures; it guesses only from a model it names, and refuses without one (a
    measuring benchmark passed in is refused too on a device that cannot run here).
    """
    if given is not None and given.source == "model":
        return given
    target = target_for(dev)
    reason = target.unavailable(dev)
    if not reason:
        return given or TargetBenchmark(dev, events=emit)
    if given is not None or probe is None or target.cost(probe) is None:
        raise DeviceError(
            f"cannot tune for {dev}: tuning runs every candidate on the device itself ({reason}) "
            f"and the {target.kind} target has no cost model to rank them by instead. Tune on "
            f"--device cpu, or write profiles for {dev} by hand (recording and resolving check "
            "them).")
    emit(RankedByModel(str(dev), reason, target.kind))
    return ModelBenchmark(target, dev)


def select(found: list[Instance], only: Sequence[str]) -> list[Instance]:
    """The instances whose operator (or a base class of it) is named in ``only``."""
    if not only:
        return found
    names = {c.__name__ for i in found for c in type(i.op).__mro__ if issubclass(c, Operator)}
    unknown = [n for n in only if n not in names]
    if unknown:
        have = sorted({type(i.op).__name__ for i in found})
        raise IronError(f"--only {','.join(unknown)}: the application has no such operator; "
                        f"its operators are {', '.join(have)}")
    return [i for i in found if any(c.__name__ in only for c in type(i.op).__mro__)]


def default_log_path(app_name: str, dev: Device) -> Path:
    """``build/tune/<app>-<profile>.jsonl``: one log per device and, on the cpu, host class."""
    return build_dir() / "tune" / f"{app_name}-{app_profile_path(app_name, dev.name).stem}.jsonl"


def tune(app: Application, device: Device | str = "cpu", options: TuneOptions = TuneOptions(),
         *, benchmark: Benchmark | None = None, runner: Any = None,
         events: Sink | None = None) -> TuneResult:
    """Tune ``app`` on ``device`` as ``options`` say and rewrite its profile; see the module
    docstring.

    ``benchmark`` measures the candidates (default: the device's ``TargetBenchmark``, or its
    target's cost model where it cannot run here).  ``runner`` (an
    ``iron.tuning.program.ProgramRunner``; by default made from the application's weights when
    ``options.in_program`` allows) runs the head-to-heads inside the programs.  ``events``
    (default: a ``PrintSink`` on stdout) takes the run's progress and, last, ``Finished`` with
    the result.
    """
    emit = events or PrintSink()
    started = time.monotonic()
    deadline = None if options.budget is None else started + options.budget
    dev = get_device(device)
    path = Path(options.profile_path or app_profile_path(app.name, dev.name))
    source_path = Path(options.previous_path or path)  # where the settings in use come from
    previous = (Profile.load(source_path) if source_path.exists()
                else Profile(device=dev.name))

    target = target_for(dev)
    found = instances(app.tuned_programs(dev, previous))
    # an instance the target places elsewhere (an npu step without a design runs on the host
    # with its numpy maths) has no setting that changes anything there: not tuned, no entry
    placed = [i for i in found if target.placement(i.current) == target.kind]
    bench = choose_benchmark(dev, placed[0].current if placed else None, emit, benchmark)
    source = bench.source
    chosen = select(found, options.only)
    elsewhere = [i for i in chosen if i not in placed]
    work = [(i, candidates(i.op, dev)) for i in chosen if i in placed]
    fixed = [i for i, c in work if len(c) <= 1]
    # the instances that move the most bytes per model call first: a budget cut hits the rest
    work = sorted(((i, c) for i, c in work if len(c) > 1), key=lambda w: -traffic(w[0]))
    legal = sum(len(c) for _, c in work)
    # the cpu model is calibrated on the machine it runs on: with a cluster the devices are
    # the workers, so a distributed tune measures every candidate
    pruned = (options.prune > 0 and source == "measured" and options.scheduler is None
              and bool(work))
    unpriced = 0
    if pruned:
        unpriced = sum(not estimable(target, c) for _, c in work)
        work = [(i, prune_candidates(target, c, i.current, options.prune)) for i, c in work]
    total = sum(len(c) for _, c in work)
    log = TuneLog(options.log_path or default_log_path(app.name, dev), bench.method,
                  options.fresh, durable=source == "measured")
    logged = sum(log.get(bench.key(op)) is not None for _, c in work for op in c)
    emit(Planned(app.name, str(dev), len(work), total, logged, log.path, len(fixed),
                 options.prune if pruned else 0, legal, len(elsewhere),
                 target.placement(elsewhere[0].current) if elsewhere else "", target.kind,
                 options.budget, unpriced))
    if log.skipped:
        emit(LogLinesSkipped(log.skipped, log.path))

    if (runner is None and options.in_program and options.scheduler is None and work
            and isinstance(bench, TargetBenchmark)):
        from .program import ProgramRunner

        emit(LoadingWeights())
        runner = ProgramRunner(dev, dict(app.weights()), bench.store, bench.quiet,
                               bench.patience, events=emit)
    if runner is not None:
        from .program import InProgram

        bench = InProgram(bench, runner, app.tuned_programs(dev, previous), phases=app.phases())
    pool = None
    try:
        if options.scheduler is not None:
            from .cluster import Cluster

            pool = Cluster(options.scheduler, bench, dev.name, emit)
        run = _Run(bench, log, deadline, started, total - logged, emit, pool)
        work = run.baseline(work)
        outcomes = [run.instance(n, len(work), inst, cands)
                    for n, (inst, cands) in enumerate(work, 1)]
    finally:
        log.close()
        if pool is not None:
            pool.close()

    # the host it was tuned on, as data: the file's name selects it by class (host.class_name)
    host = None if dev.fixed else host_summary()
    if runner is not None:
        outcomes = propose_near_misses(outcomes, emit)
    profile = Profile(previous.entries, dev.name, host)
    for o in outcomes:
        if o.chosen is not None:
            profile.add(type(o.chosen), **{p: getattr(o.chosen, p) for p in o.chosen.params()},
                        **o.chosen.tunable_values())
    verdict = None
    if runner is not None:
        emit(WholeModelStarted(AB_ROUNDS))
        verdict = validate(lambda p: app.tuned_programs(dev, p), previous, profile, runner,
                           dev.name, host, lambda op: target.placement(op) == target.kind,
                           app.phases())
        profile = verdict.profile if verdict.profile is not None else previous
    written = verdict is None or verdict.profile is not None
    if written:
        profile.save(path)
        # what the A/B dropped is not applied on purpose
        check_applied(app, dev, profile, [o for o in outcomes if verdict is None
                                          or o.instance.op not in verdict.dropped], emit)
    final = {i.op: i.current for i in instances(app.tuned_programs(dev, profile))}
    moved = [Move(o.instance.describe(), o.instance.setting(), o.chosen.tunable_values(),
                  o.old_time, o.best_time, o.gain, o.program)
             for o in outcomes if o.chosen is not None
             and o.chosen.tunable_values() != o.instance.setting()
             and final.get(o.instance.op) == o.chosen]
    complete = all(o.measured == o.total and o.decided for o in outcomes)
    drawn = ""
    if options.plots is not None and outcomes:
        from .plots import draw

        drawn = draw(outcomes, log.path, bench.method, bench.key, Path(options.plots), source)
    result = TuneResult(profile, path, moved, outcomes, complete, run.measured_now,
                        time.monotonic() - started, source,
                        options.prune if pruned else 0, legal, verdict, written, unpriced, drawn)
    emit(Finished(result))
    return result


def near_miss(o: Outcome) -> bool:
    """The sweep's fastest was ahead of the setting in use in its program's head-to-head
    (median above 1) but not beyond the rounds' spread."""
    return (o.decided and o.best is not None and o.chosen == o.instance.current
            and o.best != o.instance.current and bool(o.program)
            and o.gain is not None and o.gain > 1)


def propose_near_misses(outcomes: list[Outcome], emit: Sink) -> list[Outcome]:
    """Propose the near misses' winners too, for the whole-model A/B to judge together: several
    instances' 1-3% each is lost in one head-to-head's noise but not in the program's sum (on
    a Xeon, four GEMVs' prefetch distances: 1.001-1.033x each, decode 1.055x together)."""
    near = [o for o in outcomes if near_miss(o)]
    if near:
        emit(NearMissesProposed(len(near)))
    return [dataclasses.replace(o, chosen=o.best) if near_miss(o) else o for o in outcomes]


def wins(c: Comparison) -> bool:
    """A move pays.  Kernels alone: ``MIN_GAIN`` faster in the median round, and faster in 3
    rounds of 4.  In a program (where one instance is a small part of the time): faster beyond
    the measured spread, the middle half of the rounds above 1."""
    if c.program:
        return c.gain > 1.0 and c.low > 1.0
    return c.gain >= MIN_GAIN and c.low > 1.0


class _Run:
    """The state of one tuning run: its log, its clock, and how much it measured.

    ``pool`` (a ``cluster.Cluster``) takes over compiling, measuring and comparing; without it
    the benchmark runs here, one candidate at a time.
    """

    def __init__(self, bench: Benchmark, log: TuneLog, deadline: float | None, started: float,
                 to_measure: int, emit: Sink, pool=None):
        self.bench, self.log, self.deadline, self.started = bench, log, deadline, started
        self.to_measure, self.measured_now, self.emit = to_measure, 0, emit
        self.pool = pool
        self.runner = pool or bench  # what compiles and compares
        self.source = bench.source

    def time_left(self) -> bool:
        return self.deadline is None or time.monotonic() < self.deadline

    def eta(self) -> str:
        """Estimated time to finish, and what the budget allows."""
        elapsed = time.monotonic() - self.started
        parts = [f"{elapsed:.0f} s elapsed"]
        if self.measured_now:
            left = (self.to_measure - self.measured_now) * elapsed / self.measured_now
            parts.append(f"~{left:.0f} s left")
        if self.deadline is not None:
            parts.append(f"budget {max(0.0, self.deadline - time.monotonic()):.0f} s left")
        return ", ".join(parts)

    def instance(self, n: int, of: int, inst: Instance, cands: list[Operator]) -> Outcome:
        # the current setting first: a budget cut never leaves the instance worse off
        order = sorted(cands, key=lambda op: op != inst.current)
        if inst.current not in cands:
            order.insert(0, inst.current)  # legal (it resolved) but outside space(): compare
        keys = {op: self.bench.key(op) for op in order}
        todo = [op for op in order if self.log.get(keys[op]) is None]
        self.emit(InstanceStarted(n, of, inst.describe(), inst.uses, len(order), len(todo),
                                  self.eta()))
        compiled: dict[str, str | None] = {}
        if todo and self.time_left():
            began = time.monotonic()
            compiled = self.runner.compile(todo, self.deadline)
            failed = sum(e is not None for e in compiled.values())
            if self.source == "measured":  # a model compiles nothing
                self.emit(Compiled(len(compiled), time.monotonic() - began, failed))
        before = self.log.get(keys[inst.current])
        self._measure_on_pool([(inst, op) for op in order], keys, compiled,
                              before.median if before is not None and before.ok else None)
        best: float | None = None
        for op in order:
            record = self._candidate(inst, op, keys[op], compiled, best)
            if record is not None and record.ok and (best is None or record.median < best):
                best = record.median
        return self._confirm(self._outcome(inst, order, keys, cands))

    def _confirm(self, o: Outcome) -> Outcome:
        """Choose the sweep's winner over the setting in use only if it wins head-to-head
        (inside its program when the benchmark runs programs, see ``iron.tuning.program``)."""
        current = o.instance.current
        if o.best is None or o.best == current or o.old_problem:
            # nothing measured, nothing to move, or the setting in use was rejected
            return self._settle(dataclasses.replace(o, chosen=o.best))
        if o.old_time is None:  # the budget cut the setting in use off: nothing to compare
            return dataclasses.replace(o, chosen=current, decided=False)
        context = self.bench.context(o.instance)
        new, old = self.bench.key(o.best), self.bench.key(current) + context
        comparison = self.log.comparison(new, old)
        if comparison is not None and comparison.load is not None and comparison.load > QUIET:
            self.emit(MeasuredAgain(load=comparison.load))
            comparison = None  # a timing taken under load is never reused
        if comparison is None and self.time_left():
            comparison = self.runner.compare(o.instance, o.best, current)
            self.log.compared(comparison)
        if comparison is not None and not 1 / IMPLAUSIBLE <= comparison.gain <= IMPLAUSIBLE \
                and self.time_left():
            self.emit(MeasuredAgain(gain=comparison.gain))
            comparison = self.bench.compare(o.instance, o.best, current)
            self.log.compared(comparison)
        if comparison is None:
            self.emit(NoTimeForHeadToHead())
            return dataclasses.replace(o, chosen=current, decided=False)
        moves = wins(comparison)
        self.emit(HeadToHead(o.instance.setting(), comparison, moves, self.source == "model",
                             MIN_GAIN))
        return self._settle(dataclasses.replace(o, chosen=o.best if moves else current,
                                                gain=comparison.gain,
                                                program=comparison.program))

    def _settle(self, o: Outcome) -> Outcome:
        """Later head-to-heads in programs run this instance with its chosen setting."""
        if o.chosen is not None:
            self.bench.settle(o.instance, o.chosen)
        return o

    def baseline(self, work: list[tuple[Instance, list[Operator]]]
                 ) -> list[tuple[Instance, list[Operator]]]:
        """Measure every instance's setting in use, then order the work by its time share.

        The instances that take the most time (median x uses) are tuned first, so a budget cut
        falls on those that matter least; each gets its old time for the table of moves.
        """
        todo = [i for i, _ in work if self.log.get(self.bench.key(i.current)) is None]
        if todo and self.time_left():
            self.emit(BaselineStarted(len(todo), self.eta()))
            compiled = self.runner.compile([i.current for i in todo], self.deadline)
            self._measure_on_pool([(i, i.current) for i in todo],
                                  {i.current: self.bench.key(i.current) for i in todo}, compiled,
                                  None, label=True)
            for inst in todo:
                self._candidate(inst, inst.current, self.bench.key(inst.current), compiled,
                                None, label=f"{inst.describe()}: ")

        def share(item: tuple[Instance, list[Operator]]) -> float:
            record = self.log.get(self.bench.key(item[0].current))
            return -item[0].uses * (record.median if record is not None and record.ok else 0)

        return sorted(work, key=share)

    def _candidate(self, inst: Instance, op: Operator, key: str,
                   compiled: Mapping[str, str | None], best: float | None,
                   label: str = "") -> Record | None:
        """The logged outcome of ``op``, measuring it if it is compiled and time is left."""
        record = self.log.get(key)
        if record is None and key in compiled:
            if compiled[key] is not None:
                return self._add(key, op, Measurement(error=compiled[key]))
            if self.time_left() and self.pool is None:
                return self._measure(inst, op, key, best, label)
        return record

    def _measure_on_pool(self, jobs: list[tuple[Instance, Operator]],
                         keys: Mapping[Operator, str], compiled: Mapping[str, str | None],
                         best: float | None, label: bool = False) -> None:
        """Measure the compiled, unlogged ``jobs`` on the pool at once, logging each result as
        it arrives; ``_candidate`` then finds them in the log.  Without a pool, nothing.

        ``best`` (the setting in use's time) lets a hopeless candidate stop early."""
        if self.pool is None:
            return
        jobs = [(i, op) for i, op in dict.fromkeys(jobs)
                if self.log.get(keys[op]) is None and compiled.get(keys[op], "absent") is None]
        if not jobs or not self.time_left():
            return
        for inst, op, m in self.pool.measure(jobs, best, self.deadline):
            record = self._logged(inst, op, keys[op], m, best,
                                  f"{inst.describe()}: " if label else "")
            if record.ok and not label and (best is None or record.median < best):
                best = record.median

    def _measure(self, inst: Instance, op: Operator, key: str, best: float | None,
                 label: str = "") -> Record:
        self.log.start(key)
        try:
            m = self.bench.measure(inst, op, best)
        except (KeyboardInterrupt, BusyError):  # the user stops it, or the machine is busy
            self.log.interrupted(key)
            raise
        except Exception as e:  # a broken candidate never stops the sweep
            m = Measurement(error=f"{type(e).__name__}: {e}")
        return self._logged(inst, op, key, m, best, label)

    def _logged(self, inst: Instance, op: Operator, key: str, m: Measurement,
                best: float | None, label: str) -> Record:
        """Log a measurement and report it."""
        record = self._add(key, op, m)
        self.measured_now += 1
        self.emit(Measured(op.tunable_values(), m, best is None or (
            m.median is not None and m.median < best), label))
        return record

    def _add(self, key: str, op: Operator, m: Measurement) -> Record:
        record = Record(key, "ok" if m.error is None else "rejected", type(op).__name__,
                        op.config(), m.median, m.spread, m.runs, m.error or "", self.bench.method,
                        m.load, self.source, m.bottleneck)
        self.log.add(record)
        return record

    def _outcome(self, inst: Instance, order: list[Operator], keys: dict[Operator, str],
                 cands: list[Operator]) -> Outcome:
        """The winner among logged records: fastest, ties to the earlier legal setting."""
        rank = {op: i for i, op in enumerate(cands)}
        records = {op: self.log.get(keys[op]) for op in order}
        ok = [(r.median, rank.get(op, len(cands)), op) for op, r in records.items()
              if r is not None and r.ok]
        best = min(ok, key=lambda t: t[:2]) if ok else None
        old = records.get(inst.current)
        outcome = Outcome(inst, len(order), sum(r is not None for r in records.values()),
                          sum(r is not None and not r.ok for r in records.values()),
                          best[2] if best else None, best[0] if best else None,
                          old.median if old is not None and old.ok else None,
                          old.reason if old is not None and not old.ok else "",
                          tried=tuple(order))
        if best:
            self.emit(SweepBest(best[2].tunable_values(), best[0], outcome.measured,
                                outcome.total, outcome.rejected, self.source == "model"))
        if outcome.old_problem:
            self.emit(InUseRejected(inst.setting(), outcome.old_problem))
        return outcome


def check_applied(app, dev: Device, profile: Profile, outcomes: list[Outcome],
                  emit: Sink) -> None:
    """Warn about chosen settings the application does not pick up (a call keyword wins)."""
    now = {i.op: i.current for i in instances(app.tuned_programs(dev, profile))}
    for o in outcomes:
        applied = now.get(o.instance.op)
        if o.chosen is not None and applied is not None and applied != o.chosen:
            emit(NotApplied(o.instance.describe(), applied.tunable_values(),
                            o.chosen.tunable_values()))


