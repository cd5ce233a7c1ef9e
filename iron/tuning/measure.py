"""Measuring candidates: compile through a target, check against the reference maths, time.

``Benchmark`` is what the tuner needs; ``TargetBenchmark`` is the real one, for any target whose
executables time their steps (``Executable.run_timed``, see ``iron.targets.base``).  Tests pass
stand-ins with the same methods.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time
from abc import ABC, abstractmethod
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..devices import Device, device as get_device
from ..host import cache_bytes
from ..graph import Graph
from ..memory import huge_page_copy
from ..operator import Operator
from ..program import Program
from ..targets import Target, target_for
from ..tensor import spec
from .candidates import Instance
from .check import mismatch
from .log import Comparison
from .events import Sink
from .quiet import PATIENCE, QUIET, LoadMeter, wait_quiet


@dataclass(frozen=True)
class Measurement:
    """Seconds per run of one candidate (median, interquartile spread), or why it failed."""

    median: float | None = None
    spread: float | None = None
    runs: int = 0
    error: str | None = None
    load: float | None = None  # cores' worth other processes used while it was timed
    bottleneck: str = ""  # what limits it, when a cost model gave the time


class Benchmark(ABC):
    """What the tuner needs from a benchmark; ``TargetBenchmark`` is the real one.

    ``context`` and ``settle`` have the defaults of a benchmark that times kernels alone; one
    that times them inside programs (``iron.tuning.program.InProgram``) overrides both.
    """

    method: str  # recorded in the log; a measurement by another method is not reused
    source: str = "measured"  # or "model" when the times are a cost model's

    @abstractmethod
    def key(self, op: Operator) -> str:
        """The artifact key of ``op``'s kernel: what the log records its outcome under."""

    @abstractmethod
    def compile(self, ops: Sequence[Operator], deadline: float | None) -> dict[str, str | None]:
        """Compile ``ops``: artifact key -> None (ready) or the error; unstarted keys absent."""

    @abstractmethod
    def measure(self, instance: Instance, op: Operator, best: float | None) -> Measurement:
        """Check ``op`` against the reference on the instance's shapes, then time it."""

    @abstractmethod
    def compare(self, instance: Instance, new: Operator, old: Operator) -> Comparison:
        """Time two checked candidates head-to-head: ``gain`` = old time / new time."""

    def context(self, instance: Instance) -> str:
        """What a logged head-to-head of ``instance`` depends on beyond the two kernels (the
        program around them); kernels alone: nothing."""
        return ""

    def settle(self, instance: Instance, chosen: Operator) -> None:
        """Hear that ``instance`` runs ``chosen`` from now on; kernels alone: nothing to do."""


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
                     zip((instance.op.example_input(i, s.shape, s.dtype, rng)
                              for i, s in enumerate(instance.inputs)),
                         instance.inputs)]
        self.reference = single_threaded_reference(program, self.base)
        cold = sum(a.nbytes for a, s in zip(self.base, instance.inputs) if s.cold)
        copies = min(max_copies, math.ceil(cold_bytes / cold)) if cold else 1
        self.rotation = [[huge_page_copy(a) if s.cold and c else a
                          for a, s in zip(self.base, instance.inputs)] for c in range(copies)]


class TargetBenchmark(Benchmark):
    """Compile through a target and the artifact store, check against ``Program.reference``,
    time.

    Timing uses the runtime's per-step clock (``run_timed``), so Python's call overhead is not
    counted: warm-up runs, then enough runs for ``min_time`` seconds (at least ``min_runs``);
    the median and the interquartile spread are kept.  Cold inputs (weights, KV caches) are
    rotated through copies totalling ``cold_bytes`` — by default twice the host's last-level
    cache — so each run reads them from memory, as the real model does.  A run longer than
    ``timeout`` seconds rejects the candidate; one whose fastest of ``min_runs`` runs is 3x
    the best median so far stops early, since it cannot win (a median would also stop one whose
    first runs are slow and later ones fast, as a single-threaded lookup's are while its rows
    come into cache).
    ``compare`` runs the head-to-head.  Both record the load they ran under; with ``quiet``
    (cores' worth of CPU other processes may use; None: no check) a timing taken beside busy
    processes is discarded, the tuner pauses until the machine is quiet, and times again.
    """

    def __init__(self, device: Device | str = "cpu", store=None, jobs: int | None = None,
                 cold_bytes: int | None = None, max_copies: int = 256, warmup: int = 2,
                 min_runs: int = 5, max_runs: int = 200, min_time: float = 0.1,
                 timeout: float = 5.0, blocks: int = 16, quiet: float | None = QUIET,
                 patience: float = PATIENCE, events: Sink | None = None):
        self.device = get_device(device)
        self.target: Target = target_for(self.device)
        self.store = store
        self.jobs = jobs or os.cpu_count() or 1
        cold_bytes = cold_bytes or max(64 << 20, 2 * cache_bytes())
        self.cold_bytes, self.max_copies = cold_bytes, max_copies
        self.warmup, self.min_runs, self.max_runs = warmup, min_runs, max_runs
        self.min_time, self.timeout, self.blocks = min_time, timeout, blocks
        self.quiet, self.patience = quiet, patience
        self.events = events  # where a pause for a busy machine is said (None: printed)
        # v3: every timing records the load it was taken under
        self.method = f"{self.target.kind}-v3 cold={cold_bytes >> 20}MiB"
        self._data: tuple[Operator, _InstanceData] | None = None

    def key(self, op: Operator) -> str:
        return self.target.key(op)

    def __getstate__(self) -> dict:
        """Sent to a cluster's workers without the sink, which stays with the tuner: a worker
        says a pause on its own output."""
        return {**self.__dict__, "events": None}

    def compile(self, ops: Sequence[Operator], deadline: float | None) -> dict[str, str | None]:
        """Compile in parallel (nothing is timed meanwhile), stopping at ``deadline``."""
        if self.target.has_runtime:
            self.target.compile_all([None], self.store)  # the executor every program needs
        results: dict[str, str | None] = {}
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            futures = {pool.submit(self.target.compile, self.target.recipe(op), self.store):
                       self.key(op)
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
        program = single_step(instance, op, self.device)
        if self._data is None or self._data[0] != instance.op:
            self._data = None  # free the previous instance's copies first
            self._data = (instance.op, _InstanceData(instance, program, self.cold_bytes,
                                                     self.max_copies))
        return self.target.load(program, self.store), self._data[1]

    def measure(self, instance: Instance, op: Operator, best: float | None) -> Measurement:
        """``_measure``, recording the load it ran under; with ``quiet`` set, a timing taken
        beside busy processes is thrown away and taken again once the machine is quiet."""
        while True:
            with LoadMeter() as meter:
                m = self._measure(instance, op, best)
            if self.quiet is None or meter.load <= self.quiet or m.error is not None:
                return dataclasses.replace(m, load=meter.load)
            wait_quiet(self.quiet, self.patience, self.events)

    def _measure(self, instance: Instance, op: Operator, best: float | None) -> Measurement:
        exe, data = self._prepare(instance, op)
        overwritten = set(type(op).inplace.values())  # inputs the step writes in place
        outputs, first = self.run_once(exe, [a.copy() if i in overwritten else a
                                             for i, a in enumerate(data.base)])
        for out, ref in zip(outputs, data.reference):
            problem = mismatch(type(op).__name__, out, ref, self.target.tolerance(type(op)))
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
        while True:
            with LoadMeter() as meter:
                c = self._compare(instance, new, old)
            if self.quiet is None or meter.load <= self.quiet:
                return dataclasses.replace(c, load=meter.load)
            wait_quiet(self.quiet, self.patience, self.events)

    def _compare(self, instance: Instance, new: Operator, old: Operator) -> Comparison:
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
