"""The tuner: time every legal setting of every operator instance and rewrite the profile.

Three small pieces, as in Triton's autotuner:

- candidates: for each distinct operator instance the application builds (class + params; an
  instance's tuned setting applies to all its uses), the frozen operators of
  ``op.legal_settings(dev)`` — the same legality rules ``resolve`` enforces;
- a benchmark passed in (``CpuBenchmark`` by default): it compiles candidates through the
  artifact store, checks each against the reference maths on the instance's real shapes and
  times it;
- the log (``iron.tuning.log``): one durable line per measured candidate, keyed by its artifact
  key, so an interrupted run resumes and a re-run measures only what changed.

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
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, TextIO

import numpy as np

from ..devices import Device, host_cache_bytes
from ..devices import device as get_device
from ..errors import DeviceError, IronError
from ..graph import Graph
from ..memory import huge_page_copy
from ..operator import Operator
from ..paths import build_dir
from ..profile import Profile
from ..program import Program
from ..tensor import spec
from .check import mismatch
from .log import Comparison, Record, TuneLog

#: How much faster, head-to-head (median round), a setting must run to replace the one in use.
MIN_GAIN = 1.03

# ---- instances and candidates ---------------------------------------------------------------


@dataclass(frozen=True)
class InputSpec:
    """One input of a step: its shape and dtype, and whether it is cold in the real model.

    Weights and state (a KV cache) are read once per token from main memory; activations were
    just written by the previous step and sit in cache.
    """

    shape: tuple[int, ...]
    dtype: Any
    cold: bool


@dataclass(frozen=True)
class Instance:
    """A distinct operator instance of the application: ``op`` has every tunable unset."""

    op: Operator
    current: Operator  # as the application resolves it under the previous profile
    inputs: tuple[InputSpec, ...]
    uses: int

    def describe(self) -> str:
        return self.op.describe()

    def setting(self, op: Operator | None = None) -> dict[str, int]:
        return (op or self.current).tunable_values()


def unset(op: Operator) -> Operator:
    """``op`` with its tunables cleared: what identifies the instance, whatever its setting."""
    return dataclasses.replace(op, **{n: None for n in op.tunables()})


def instances(programs: Mapping[str, Program]) -> list[Instance]:
    """The distinct operator instances of ``programs``, in order of first use."""
    found: dict[Operator, Instance] = {}
    for name in programs:
        program = programs[name]
        for step in program.steps:
            key = unset(step.op)
            if key in found:
                found[key] = dataclasses.replace(found[key], uses=found[key].uses + 1)
                continue
            specs = tuple(InputSpec(program.tensors[i].shape, program.tensors[i].dtype,
                                    program.tensors[i].kind in ("weight", "state"))
                          for i in step.inputs)
            found[key] = Instance(key, step.op, specs, 1)
    return list(found.values())


def traffic(instance: Instance) -> int:
    """Bytes the instance reads per call of the application's programs, over all its uses."""
    return instance.uses * sum(math.prod(s.shape) * np.dtype(s.dtype).itemsize
                               for s in instance.inputs)


def candidates(op: Operator, dev: Device | str) -> list[Operator]:
    """Every legal setting of ``op``'s tunables on ``dev``, as frozen resolved operators."""
    return [dataclasses.replace(op, **s) for s in unset(op).legal_settings(dev)]


# ---- the benchmark ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """Seconds per run of one candidate (median, interquartile spread), or why it failed."""

    median: float | None = None
    spread: float | None = None
    runs: int = 0
    error: str | None = None


class Benchmark(Protocol):
    """What the tuner needs from a benchmark; ``CpuBenchmark`` is the real one."""

    method: str  # recorded in the log; a measurement by another method is not reused

    def key(self, op: Operator) -> str: ...

    def compile(self, ops: Sequence[Operator], deadline: float | None) -> dict[str, str | None]:
        """Compile ``ops``: artifact key -> None (ready) or the error; unstarted keys absent."""

    def measure(self, instance: Instance, op: Operator, best: float | None) -> Measurement:
        """Check ``op`` against the reference on the instance's shapes, then time it."""

    def compare(self, instance: Instance, new: Operator, old: Operator) -> Comparison:
        """Time two checked candidates head-to-head: ``gain`` = old time / new time."""


class _OneStep(Graph):
    def __init__(self, op: Operator, dev: Device):
        super().__init__(dev)
        self.op = op

    def body(self, *inputs):
        return type(self.op).step(*inputs, **self.op.config())


def single_step(instance: Instance, op: Operator, dev: Device) -> Program:
    """A program of the one step ``op``, every input of it a program input."""
    program = _OneStep(op, dev).record(*(spec(s.shape, s.dtype) for s in instance.inputs))
    assert program.ops == [op], (program.ops, op)
    return program


def random_input(op: Operator, s: InputSpec, rng: np.random.Generator) -> np.ndarray:
    """An input of realistic values: in-range tokens and positions, weight-sized numbers."""
    if np.dtype(s.dtype) == np.int32:
        n = s.shape[0] if s.shape else 1
        if hasattr(op, "vocab"):  # token ids
            return rng.integers(0, op.vocab, s.shape).astype(np.int32)
        start = max(0, (op.ctx - n) // 2) if hasattr(op, "ctx") else 1000  # mid-context
        return np.arange(start, start + n, dtype=np.int32).reshape(s.shape)
    if np.dtype(s.dtype) == np.float32 and hasattr(op, "head_dim"):  # RoPE's inv_freq
        hd = op.head_dim
        return (1.0 / 10000.0 ** (np.arange(0, hd, 2) / hd)).astype(np.float32)
    scale = 0.1 if s.cold and len(s.shape) == 2 else 1.0  # weight matrices are small numbers
    return (rng.standard_normal(s.shape) * scale).astype(s.dtype)


def single_threaded_reference(program: Program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``program.reference`` with BLAS on one thread.

    OpenBLAS's helper threads busy-wait for a while after each call; on a small machine they
    would take the cores the next candidate's kernel threads are timed on.  Without
    ``threadpoolctl`` we wait for them to go idle instead.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        reference = program.reference(inputs)
        time.sleep(0.2)
        return reference
    with threadpool_limits(1, user_api="blas"):
        return program.reference(inputs)


class _InstanceData:
    """The inputs of one instance, copied so that cold inputs cycle out of the cache.

    Cold inputs live in huge pages, as the model's weights do (``Bundle.weights``): the page
    size changes a streaming kernel's speed, and could change which setting wins.
    """

    def __init__(self, instance: Instance, program: Program, cold_bytes: int, max_copies: int):
        rng = np.random.default_rng(0)
        self.base = [huge_page_copy(a) if s.cold else a for a, s in
                     zip((random_input(instance.op, s, rng) for s in instance.inputs),
                         instance.inputs)]
        self.reference = single_threaded_reference(program, self.base)
        cold = sum(a.nbytes for a, s in zip(self.base, instance.inputs) if s.cold)
        copies = min(max_copies, math.ceil(cold_bytes / cold)) if cold else 1
        self.rotation = [[huge_page_copy(a) if s.cold and c else a
                          for a, s in zip(self.base, instance.inputs)] for c in range(copies)]


class CpuBenchmark:
    """Compile through the artifact store, check against ``Program.reference``, time.

    Timing uses the runtime's per-step clock (``run_timed``), so Python's call overhead is not
    counted: warm-up runs, then enough runs for ``min_time`` seconds (at least ``min_runs``);
    the median and the interquartile spread are kept.  Cold inputs (weights, KV caches) are
    rotated through copies totalling ``cold_bytes`` — by default twice the host's last-level
    cache — so each run reads them from memory, as the real model does.  A run longer than
    ``timeout`` seconds rejects the candidate; one whose fastest of ``min_runs`` runs is 3x
    the best median so far stops early, since it cannot win (a median would also stop one that
    starts slow: the single-threaded prefill Embedding ran 11.6 us for 3 runs, then 1.2 us).
    ``compare`` runs the head-to-head.
    """

    def __init__(self, store=None, jobs: int | None = None, cold_bytes: int | None = None,
                 max_copies: int = 256, warmup: int = 2, min_runs: int = 5,
                 max_runs: int = 200, min_time: float = 0.1, timeout: float = 5.0,
                 blocks: int = 16):
        from ..targets import cpu

        self.cpu = cpu
        self.store = store
        self.jobs = jobs or os.cpu_count() or 1
        cold_bytes = cold_bytes or max(64 << 20, 2 * host_cache_bytes())
        self.cold_bytes, self.max_copies = cold_bytes, max_copies
        self.warmup, self.min_runs, self.max_runs = warmup, min_runs, max_runs
        self.min_time, self.timeout, self.blocks = min_time, timeout, blocks
        self.method = f"cpu-v2 cold={cold_bytes >> 20}MiB"
        self._data: tuple[Operator, _InstanceData] | None = None

    def key(self, op: Operator) -> str:
        return self.cpu.recipe_for(op).key

    def compile(self, ops: Sequence[Operator], deadline: float | None) -> dict[str, str | None]:
        """Compile in parallel (nothing is timed meanwhile), stopping at ``deadline``."""
        self.cpu.compile_all([None], self.store)  # the runtime every program needs
        results: dict[str, str | None] = {}
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            futures = {pool.submit(self.cpu.compile_op, op, self.store): self.key(op)
                       for op in ops}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                for f in done:
                    if not f.cancelled():
                        error = f.exception()
                        results[futures[f]] = None if error is None else f"compile error: {error}"
                if deadline is not None and time.monotonic() > deadline:
                    for f in pending:
                        f.cancel()
        return results

    def run_once(self, exe, arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], float]:
        """One run: the outputs and the seconds the step took."""
        seconds = np.zeros(1)
        outputs = exe.run_timed(arrays, seconds)
        return outputs, float(seconds[0])

    def _prepare(self, instance: Instance, op: Operator):
        """The executable of ``op`` alone, and the instance's inputs (built once per instance)."""
        program = single_step(instance, op, get_device("cpu"))
        if self._data is None or self._data[0] != instance.op:
            self._data = None  # free the previous instance's copies first
            self._data = (instance.op, _InstanceData(instance, program, self.cold_bytes,
                                                     self.max_copies))
        return self.cpu.load(program, self.store), self._data[1]

    def measure(self, instance: Instance, op: Operator, best: float | None) -> Measurement:
        exe, data = self._prepare(instance, op)
        overwritten = set(type(op).inplace.values())  # inputs the step writes in place
        outputs, first = self.run_once(exe, [a.copy() if i in overwritten else a
                                             for i, a in enumerate(data.base)])
        for out, ref in zip(outputs, data.reference):
            problem = mismatch(type(op).__name__, out, ref)
            if problem:
                return Measurement(error=f"wrong result: {problem}")
        copies = itertools.cycle(data.rotation)
        times = [first] + [self.run_once(exe, next(copies))[1] for _ in range(self.warmup)]
        if max(times) > self.timeout:
            return Measurement(error=f"timeout: a run took {max(times):.3g} s, the limit is "
                               f"{self.timeout:g} s")
        runs = max(self.min_runs, min(self.max_runs, math.ceil(self.min_time / times[-1])))
        times = []
        for _ in range(runs):
            times.append(self.run_once(exe, next(copies))[1])
            if times[-1] > self.timeout:
                return Measurement(error=f"timeout: a run took {times[-1]:.3g} s, the limit "
                                   f"is {self.timeout:g} s")
            if best is not None and len(times) >= self.min_runs and min(times) > 3 * best:
                break  # even its fastest run is 3x the best median: it cannot win
        q1, median, q3 = np.percentile(times, [25, 50, 75])
        return Measurement(float(median), float((q3 - q1) / median), len(times))

    def compare(self, instance: Instance, new: Operator, old: Operator) -> Comparison:
        """``blocks`` rounds of a few runs of each, in ABBA order, on the same rotated inputs.

        Both see the same neighbours and the same cache state within a round, so the median of
        the per-round ratios is the gain a move would bring, not the machine's drift.
        """
        exe_new, data = self._prepare(instance, new)
        exe_old, _ = self._prepare(instance, old)
        copies = itertools.cycle(data.rotation)
        once = [self.run_once(exe, next(copies))[1] for exe in (exe_new, exe_old) * 2]
        per_block = max(3, min(50, math.ceil(self.min_time / 10 / max(min(once), 1e-7))))
        gains = []
        for block in range(self.blocks):
            pair = (exe_new, exe_old) if block % 2 == 0 else (exe_old, exe_new)
            times = {id(exe): np.median([self.run_once(exe, next(copies))[1]
                                         for _ in range(per_block)]) for exe in pair}
            gains.append(times[id(exe_old)] / times[id(exe_new)])
        q1, gain, q3 = np.percentile(gains, [25, 50, 75])
        return Comparison(self.key(new), self.key(old), float(gain), float(q1), float(q3),
                          len(gains), self.method)


# ---- the tuning run -----------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Move:
    """One row of the table of what moved: an instance whose chosen setting changed."""

    instance: str
    old: dict[str, int]
    new: dict[str, int]
    old_time: float | None
    new_time: float
    gain: float | None  # head-to-head; None when the old setting was rejected


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


def require_tunable_device(dev: Device) -> None:
    """Refuse a device whose kernels cannot run here: a tuner measures, it never guesses."""
    if dev.kind == "cpu":
        return
    from ..targets.npu import missing_toolchain

    missing = missing_toolchain(dev)
    raise DeviceError(
        f"cannot tune for {dev}: tuning runs every candidate on the device itself, and "
        + (f"its toolchain is missing here ({', '.join(missing)}); " if missing else "")
        + "the npu target cannot compile or run yet. Tune on --device cpu, or write "
        f"profiles for {dev} by hand (recording and resolving check them).")


def select(found: list[Instance], only: Sequence[str] | None) -> list[Instance]:
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
    return build_dir() / "tune" / f"{app_name}-{dev.name}.jsonl"


def tune(app, device: Device | str = "cpu", *, only: Sequence[str] | None = None,
         budget: float | None = None, fresh: bool = False, out: TextIO = sys.stdout,
         benchmark: Benchmark | None = None, profile_path: str | os.PathLike | None = None,
         log_path: str | os.PathLike | None = None) -> TuneResult:
    """Tune ``app`` on ``device`` and rewrite its profile; see the module docstring.

    ``budget`` is wall-clock seconds for the whole run: when it runs out, each instance keeps
    the best found so far and instances never measured keep their previous entry or default.
    ``fresh`` discards the log.  ``profile_path`` and ``log_path`` default to
    ``profiles/<app>/<device>.json`` and ``build/tune/<app>-<device>.jsonl``.
    """
    from ..pipeline.app import profile_path as app_profile_path

    started = time.monotonic()
    deadline = None if budget is None else started + budget
    dev = get_device(device)
    require_tunable_device(dev)
    bench = benchmark or CpuBenchmark()
    path = Path(profile_path or app_profile_path(app.name, dev.name))
    previous = Profile.load(path) if path.exists() else Profile(device=dev.name)

    found = instances(app.programs(dev, previous))
    work = [(i, candidates(i.op, dev)) for i in select(found, only)]
    fixed = [i for i, c in work if len(c) <= 1]
    # the instances that move the most bytes per model call first: a budget cut hits the rest
    work = sorted(((i, c) for i, c in work if len(c) > 1), key=lambda w: -traffic(w[0]))
    total = sum(len(c) for _, c in work)
    log = TuneLog(log_path or default_log_path(app.name, dev), bench.method, fresh)
    logged = sum(log.get(bench.key(op)) is not None for _, c in work for op in c)
    print(f"tuning {app.name} on {dev}: {len(work)} instances, {total} candidates "
          f"({logged} already in {log.path}); {len(fixed)} instances with a single legal "
          f"setting skipped" + (f"; budget {budget:g} s" if budget is not None else ""),
          file=out, flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > 0.5:
        print(f"warning: the machine is busy (load average {load:.1f}); other processes "
              "distort the timings, multi-threaded candidates most", file=out, flush=True)

    run = _Run(bench, log, deadline, started, total - logged, out)
    try:
        work = run.baseline(work)
        outcomes = [run.instance(n, len(work), inst, cands)
                    for n, (inst, cands) in enumerate(work, 1)]
    finally:
        log.close()

    profile = Profile(previous.entries, dev.name)
    for o in outcomes:
        if o.chosen is not None:
            profile.add(type(o.chosen), **{p: getattr(o.chosen, p) for p in o.chosen.params()},
                        **o.chosen.tunable_values())
    profile.save(path)
    check_applied(app, dev, profile, outcomes, out)
    moved = [Move(o.instance.describe(), o.instance.setting(), o.chosen.tunable_values(),
                  o.old_time, o.best_time, o.gain)
             for o in outcomes if o.chosen is not None
             and o.chosen.tunable_values() != o.instance.setting()]
    complete = all(o.measured == o.total and o.decided for o in outcomes)
    result = TuneResult(profile, path, moved, outcomes, complete, run.measured_now,
                        time.monotonic() - started)
    report(result, out)
    return result


def wins(c: Comparison) -> bool:
    """A move pays: ``MIN_GAIN`` faster in the median round, and faster in 3 rounds of 4."""
    return c.gain >= MIN_GAIN and c.low > 1.0


class _Run:
    """The state of one tuning run: its log, its clock, and how much it measured."""

    def __init__(self, bench: Benchmark, log: TuneLog, deadline: float | None, started: float,
                 to_measure: int, out: TextIO):
        self.bench, self.log, self.deadline, self.started = bench, log, deadline, started
        self.to_measure, self.measured_now, self.out = to_measure, 0, out

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
        print(f"[{n}/{of}] {inst.describe()} x{inst.uses}: {len(order)} candidates, "
              f"{len(todo)} to measure ({self.eta()})", file=self.out, flush=True)
        compiled: dict[str, str | None] = {}
        if todo and self.time_left():
            began = time.monotonic()
            compiled = self.bench.compile(todo, self.deadline)
            failed = sum(e is not None for e in compiled.values())
            print(f"    compiled {len(compiled)} in {time.monotonic() - began:.0f} s"
                  + (f", {failed} failed" if failed else ""), file=self.out, flush=True)
        best: float | None = None
        for op in order:
            record = self._candidate(inst, op, keys[op], compiled, best)
            if record is not None and record.ok and (best is None or record.median < best):
                best = record.median
        return self._confirm(self._outcome(inst, order, keys, cands))

    def _confirm(self, o: Outcome) -> Outcome:
        """Choose the sweep's winner over the setting in use only if it wins head-to-head."""
        current = o.instance.current
        if o.best is None or o.best == current or o.old_problem:
            # nothing measured, nothing to move, or the setting in use was rejected
            return dataclasses.replace(o, chosen=o.best)
        if o.old_time is None:  # the budget cut the setting in use off: nothing to compare
            return dataclasses.replace(o, chosen=current, decided=False)
        new, old = self.bench.key(o.best), self.bench.key(current)
        comparison = self.log.comparison(new, old)
        if comparison is None and self.time_left():
            comparison = self.bench.compare(o.instance, o.best, current)
            self.log.compared(comparison)
        if comparison is None:
            print("    no time left for the head-to-head: keeps the setting in use",
                  file=self.out, flush=True)
            return dataclasses.replace(o, chosen=current, decided=False)
        moves = wins(comparison)
        print(f"    head-to-head against the setting in use ({setting_text(o.instance.setting())})"
              f": {comparison.gain:.3f}x, middle half of {comparison.rounds} rounds "
              f"{comparison.low:.3f}-{comparison.high:.3f}x -> "
              + ("moves" if moves else f"keeps the setting in use (needs {MIN_GAIN:g}x, and "
                 "faster in three rounds of four)"), file=self.out, flush=True)
        return dataclasses.replace(o, chosen=o.best if moves else current,
                                   gain=comparison.gain)

    def baseline(self, work: list[tuple[Instance, list[Operator]]]
                 ) -> list[tuple[Instance, list[Operator]]]:
        """Measure every instance's setting in use, then order the work by its time share.

        The instances that take the most time (median x uses) are tuned first, so a budget cut
        falls on those that matter least; each gets its old time for the table of moves.
        """
        todo = [i for i, _ in work if self.log.get(self.bench.key(i.current)) is None]
        if todo and self.time_left():
            print(f"measuring the setting in use of {len(todo)} instances ({self.eta()})",
                  file=self.out, flush=True)
            compiled = self.bench.compile([i.current for i in todo], self.deadline)
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
            if self.time_left():
                return self._measure(inst, op, key, best, label)
        return record

    def _measure(self, inst: Instance, op: Operator, key: str, best: float | None,
                 label: str = "") -> Record:
        self.log.start(key)
        try:
            m = self.bench.measure(inst, op, best)
        except KeyboardInterrupt:
            self.log.interrupted(key)
            raise
        except Exception as e:  # a broken candidate never stops the sweep
            m = Measurement(error=f"{type(e).__name__}: {e}")
        record = self._add(key, op, m)
        self.measured_now += 1
        text = (f"{m.median * 1e6:9.1f} us +-{100 * m.spread:.1f}% ({m.runs} runs)"
                + ("  best so far" if best is None or m.median < best else "")
                if record.ok else f"rejected: {m.error.splitlines()[0][:150]}")
        print(f"    {label}{setting_text(op.tunable_values())}  {text}", file=self.out,
              flush=True)
        return record

    def _add(self, key: str, op: Operator, m: Measurement) -> Record:
        record = Record(key, "ok" if m.error is None else "rejected", type(op).__name__,
                        op.config(), m.median, m.spread, m.runs, m.error or "", self.bench.method)
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
                          old.reason if old is not None and not old.ok else "")
        if best:
            print(f"    best {setting_text(best[2].tunable_values())} {best[0] * 1e6:.1f} us"
                  f" ({outcome.measured}/{outcome.total} measured, {outcome.rejected} rejected)",
                  file=self.out, flush=True)
        if outcome.old_problem:
            print(f"    warning: the setting in use, {setting_text(inst.setting())}, was "
                  f"rejected: {outcome.old_problem.splitlines()[0][:150]}", file=self.out)
        return outcome


def check_applied(app, dev: Device, profile: Profile, outcomes: list[Outcome],
                  out: TextIO) -> None:
    """Warn about chosen settings the application does not pick up (a call keyword wins)."""
    now = {i.op: i.current for i in instances(app.programs(dev, profile))}
    for o in outcomes:
        applied = now.get(o.instance.op)
        if o.chosen is not None and applied is not None and applied != o.chosen:
            print(f"warning: {o.instance.describe()} still resolves to "
                  f"{setting_text(applied.tunable_values())}, not the tuned "
                  f"{setting_text(o.chosen.tunable_values())}: a call keyword or another profile "
                  "entry overrides it", file=out)


def setting_text(setting: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


def changes_text(old: Mapping[str, int], new: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {old.get(k)} -> {v}" for k, v in new.items() if old.get(k) != v)


def report(result: TuneResult, out: TextIO) -> None:
    """The closing summary: where the profile went and the table of what moved."""
    state = "complete" if result.complete else "stopped by the budget; re-run to continue"
    print(f"\nwrote {result.path} ({len(result.profile)} entries) in {result.seconds:.0f} s, "
          f"{result.measured_now} candidates measured this run; tuning {state}", file=out)
    held = sum(o.gain is not None and o.chosen == o.instance.current for o in result.outcomes)
    if held:
        print(f"{held} instances kept their setting: the sweep's fastest did not beat it "
              "head-to-head", file=out)
    if not result.moved:
        print("nothing moved against the previous profile", file=out)
        return
    rows = [(m.instance, changes_text(m.old, m.new),
             f"{m.old_time * 1e6:.1f} -> {m.new_time * 1e6:.1f} us" if m.old_time else
             f"? -> {m.new_time * 1e6:.1f} us",
             f"{m.gain:.2f}x" if m.gain else "the old setting was rejected")
            for m in result.moved]
    head = ("instance", "old -> new", "time (sweep)", "gain (head-to-head)")
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(4)]
    print(f"{len(rows)} instances moved:", file=out)
    for r in [head, *rows]:
        print("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip(), file=out)
