"""Measuring where a candidate runs: inside the application's recorded programs.

A kernel timed alone, on rotated copies of its inputs, is not the kernel the model runs: there
it follows its neighbours (which left their outputs, and evicted its weights, in the cache),
shares the thread team's wake-ups with them, and reads a KV cache the previous steps wrote.  A
setting 5% faster alone has measured slower in the model.  So the tuner's head-to-head times
the whole program the instance runs in (its *home*: the program with most of its uses), once
with the incumbent setting and once with the candidate swapped into every use, in interleaved
rounds (``ProgramRunner.rounds``); the gain is the median of the per-round ratios of program
time.  The sweep before it still times kernels alone: it is the fast first pass that picks the
one candidate worth a head-to-head, and the only measurement of an operator outside any program.

``ProgramRunner`` loads programs through the device's target with the application's real
weights (in huge pages, as a bundle's are) and one set of state buffers (a KV cache) shared by
every program and version, as the model shares it; inputs come from each input's first
consumer's ``example_input`` (token ids, positions at mid-context).  ``whole`` uses the same
runner for the whole-model A/B of profiles.

A program run back to back also finds its own weights in the cache when they fit there, which in
the model they need not: a 1B Llama's head (57 MB, under a Xeon's last-level cache) ran in 1.06
ms back to back and in 2.12 ms after the decode program, as every token runs it, and a prefetch
distance 1.09x faster there was even back to back.  So a program whose weights fit in the cache
while its phase's do not is timed after the rest of its phase (``ProgramRunner.evictors``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from typing import Mapping, Sequence

import numpy as np

from ..devices import Device
from ..memory import huge_page_copy
from ..operator import Operator
from ..program import Program
from ..targets import Target, target_for
from ..host import cache_bytes
from .candidates import Instance, unset
from .log import Comparison
from .measure import Benchmark, Measurement
from .events import Sink
from .quiet import PATIENCE, QUIET, LoadMeter, wait_quiet

#: Interleaved rounds of a program head-to-head, and roughly how long it may take.
ROUNDS, SECONDS = 12, 4.0
#: Runs of a version per visit are chosen so that a visit lasts at least this long.
VISIT = 0.02


def uses(op: Operator, program: Program) -> int:
    """How many steps of ``program`` are instances of ``op`` (an unset operator)."""
    return sum(unset(s.op) == op for s in program.steps)


def home(op: Operator, programs: Mapping[str, Program]) -> str | None:
    """The program with most of the instance's uses (the first such, on a tie); None when no
    program uses it."""
    counts = {name: uses(op, p) for name, p in programs.items()}
    best = max(counts, key=lambda n: counts[n], default=None)
    return best if best is not None and counts[best] else None


def swapped(program: Program, op: Operator, setting: Operator) -> Program:
    """``program`` with every use of instance ``op`` running ``setting`` instead."""
    steps = [dataclasses.replace(s, op=setting) if unset(s.op) == op else s
             for s in program.steps]
    return dataclasses.replace(program, steps=steps)


def program_inputs(program: Program, rng: np.random.Generator) -> list[np.ndarray]:
    """Realistic values for each program input: what its first consumer's ``example_input``
    gives for that argument (a token id within the vocabulary, a position in the context)."""
    arrays = []
    for index in program.inputs:
        t = program.tensors[index]
        step = next((s for s in program.steps if index in s.inputs), None)
        if step is None:
            arrays.append(np.zeros(t.shape, t.dtype))
            continue
        arrays.append(np.asarray(step.op.example_input(step.inputs.index(index), t.shape,
                                                       t.dtype, rng)).astype(t.dtype))
    return arrays


def signature(program: Program, target: Target) -> str:
    """A digest of the program's steps as the target builds them: two versions with the same
    signature run the same code."""
    text = "|".join(target.key(op) for op in program.ops)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ProgramRunner:
    """The application's programs on the device, with its weights, timed whole.

    ``rounds`` runs several versions of one program in interleaved rounds (each round visits
    the versions in one order and then in reverse, so a drift of the machine weighs on all of
    them alike) and returns each version's median time per round.  With ``quiet`` set, rounds
    taken beside busy processes are thrown away and taken again once the machine is quiet.
    """

    def __init__(self, dev: Device, weights: Mapping[str, np.ndarray], store=None,
                 quiet: float | None = QUIET, patience: float = PATIENCE,
                 cache: int | None = None, events: Sink | None = None):
        self.device, self.target, self.store = dev, target_for(dev), store
        self.cache = cache or cache_bytes()  # the host's last-level cache, which runs the programs
        self.weights = {name: huge_page_copy(np.ascontiguousarray(a))
                        for name, a in weights.items()}
        self.quiet, self.patience, self.events = quiet, patience, events
        self.state: dict[str, np.ndarray] = {}  # shared by every program, as the model does
        self._exes: dict[str, object] = {}
        self._inputs: dict[str, list[np.ndarray]] = {}
        self.load = 0.0  # the load the last ``rounds`` ran under

    def executable(self, program: Program):
        """The loaded program, its weights bound and its state the shared one (cached by what
        it runs)."""
        sig = signature(program, self.target)
        exe = self._exes.get(sig)
        if exe is None:
            exe = self.target.load(program, self.store)
            exe.bind_weights(self.weights)
            for name, t in program.named("state").items():
                if name not in self.state:
                    self.state[name] = np.zeros(t.shape, t.dtype)
            exe.bind_state({n: a for n, a in self.state.items()
                            if n in program.named("state")
                            and a.shape == program.named("state")[n].shape})
            while len(self._exes) >= 16:  # each holds its temporaries: keep the recent ones
                self._exes.pop(next(iter(self._exes)))
            self._exes[sig] = exe
        return exe

    def inputs(self, program: Program) -> list[np.ndarray]:
        key = repr([(program.tensors[i].name, program.tensors[i].shape,
                     str(program.tensors[i].dtype)) for i in program.inputs])
        if key not in self._inputs:
            self._inputs[key] = program_inputs(program, np.random.default_rng(0))
        return self._inputs[key]

    def weight_bytes(self, programs: Sequence[Program]) -> int:
        """The bytes of the weights ``programs`` read, each weight once."""
        names = {n for p in programs for n in p.named("weight")}
        return sum(self.weights[n].nbytes for n in names if n in self.weights)

    def evictors(self, name: str, programs: Mapping[str, Program],
                 phases: Mapping[str, tuple[Sequence[str], int]] | None) -> list[str]:
        """The programs to run before each timed run of program ``name``: the rest of its phase,
        in the order the model runs them after it, when its own weights fit in the cache and the
        phase's do not (then the model always starts it cold); else none."""
        for group, _ in (phases or {}).values():
            if name in group:
                i = list(group).index(name)
                rest = [n for n in (*group[i + 1:], *group[:i]) if n in programs]
                if self.weight_bytes([programs[name]]) < self.cache \
                        <= self.weight_bytes([programs[n] for n in (name, *rest)]):
                    return rest
        return []

    @staticmethod
    def run_once(exe, inputs: Sequence[np.ndarray]) -> float:
        start = time.perf_counter()
        exe.run(inputs, copy=False)
        return time.perf_counter() - start

    def rounds(self, versions: Mapping[str, Program], rounds: int = ROUNDS,
               seconds: float | None = SECONDS,
               between: Sequence[Program] = ()) -> dict[str, list[float]]:
        """Each version's median seconds per round; versions that run the same code are timed
        once and share their times (their ratio is exactly 1).  With ``seconds``, fewer rounds
        (never under 6) when the programs are long.  ``between`` run, untimed, before every
        timed run (``evictors``)."""
        while True:
            with LoadMeter() as meter:
                times = self._rounds(versions, rounds, seconds, between)
            if self.quiet is None or meter.load <= self.quiet:
                self.load = meter.load
                return times
            wait_quiet(self.quiet, self.patience, self.events)

    def _rounds(self, versions: Mapping[str, Program], rounds: int,
                seconds: float | None, between: Sequence[Program]) -> dict[str, list[float]]:
        sigs = {label: signature(p, self.target) for label, p in versions.items()}
        distinct = {}
        for label, p in versions.items():
            distinct.setdefault(sigs[label], p)
        exes = {sig: self.executable(p) for sig, p in distinct.items()}
        inputs = self.inputs(next(iter(distinct.values())))
        others = [(self.executable(p), self.inputs(p)) for p in between]

        def run(exe) -> tuple[float, float]:
            """Seconds of a run of ``exe``, and of the evictors' runs before it."""
            before = sum(self.run_once(e, i) for e, i in others)
            return self.run_once(exe, inputs), before

        for exe in exes.values():  # warm-up: page in, start the threads
            run(exe)
        once = {sig: min(run(exe) for _ in range(2)) for sig, exe in exes.items()}
        runs = {sig: max(1, math.ceil(VISIT / max(t, 1e-7))) for sig, (t, _) in once.items()}
        per_round = sum(2 * runs[s] * sum(once[s]) for s in exes)
        if seconds is not None:
            rounds = max(min(rounds, 6), min(rounds, math.floor(seconds / per_round)))
        order = list(exes)
        result: dict[str, list[float]] = {sig: [] for sig in exes}
        for r in range(rounds):
            seen: dict[str, list[float]] = {sig: [] for sig in exes}
            forward = order[r % len(order):] + order[:r % len(order)]  # rotate the lead
            for sig in forward + forward[::-1]:
                seen[sig] += [run(exes[sig])[0] for _ in range(runs[sig])]
            for sig in exes:
                result[sig].append(float(np.median(seen[sig])))
        return {label: result[sigs[label]] for label in versions}


class InProgram(Benchmark):
    """A ``Benchmark`` whose head-to-head runs in the instance's home program (after the rest
    of its phase, where that is what evicts its weights: ``ProgramRunner.evictors``).

    ``key``, ``compile`` and ``measure`` (the isolated sweep) are the wrapped benchmark's.
    ``compare`` times the home program with the candidate and with the incumbent; the other
    instances run the settings already decided in this run (``settle`` records each decision),
    so each head-to-head sees the neighbours the profile will give it.  ``context`` names that
    program state, so a logged head-to-head is reused only in the same surroundings.
    """

    def __init__(self, bench: Benchmark, runner: ProgramRunner,
                 programs: Mapping[str, Program], rounds: int = ROUNDS,
                 phases: Mapping[str, tuple[Sequence[str], int]] | None = None):
        self.bench, self.runner, self.rounds, self.phases = bench, runner, rounds, phases
        self.method = bench.method
        self.source = bench.source
        self.programs = dict(programs)

    def key(self, op: Operator) -> str:
        return self.bench.key(op)

    def compile(self, ops, deadline):
        return self.bench.compile(ops, deadline)

    def measure(self, instance: Instance, op: Operator, best: float | None) -> Measurement:
        return self.bench.measure(instance, op, best)

    def home(self, instance: Instance) -> str | None:
        return home(instance.op, self.programs)

    def context(self, instance: Instance) -> str:
        name = self.home(instance)
        if name is None:
            return ""
        after = "".join(f"+{n}" for n in self.runner.evictors(name, self.programs, self.phases))
        return f"@{name}:{signature(self.programs[name], self.runner.target)}{after}"

    def compare(self, instance: Instance, new: Operator, old: Operator) -> Comparison:
        name = self.home(instance)
        if name is None:  # outside every program: the kernel alone is all there is
            return self.bench.compare(instance, new, old)
        base = self.programs[name]
        times = self.runner.rounds({"new": swapped(base, instance.op, new),
                                    "old": swapped(base, instance.op, old)}, self.rounds,
                                   between=[self.programs[n] for n in self.runner.evictors(
                                       name, self.programs, self.phases)])
        gains = [o / n for o, n in zip(times["old"], times["new"])]
        q1, gain, q3 = np.percentile(gains, [25, 50, 75])
        return Comparison(self.key(new), self.key(old) + self.context(instance), float(gain),
                          float(q1), float(q3), len(gains), self.method, self.runner.load,
                          program=name, won=sum(g > 1 for g in gains))

    def settle(self, instance: Instance, chosen: Operator) -> None:
        """Run ``chosen`` for the instance in every program from now on."""
        self.programs = {n: swapped(p, instance.op, chosen) for n, p in self.programs.items()}
