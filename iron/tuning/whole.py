"""The whole-model A/B that decides what a tune writes.

Every entry a tune proposes won its head-to-head in its program, one instance at a time; the
profile as a whole still has to make the model faster.  Before writing, the tuner times every
program of the application in three versions — the new profile, the previous one, and no
profile (every tunable from ``resolve()``) — in interleaved rounds on the same runner
(``ProgramRunner.rounds``, after the rest of the program's phase where the model's step evicts
its weights: ``ProgramRunner.evictors``), and keeps, program by program:

- the new entries, when the program runs faster with them than with the defaults beyond the
  measured spread (``Spread.beyond``: faster in the middle half of the rounds) and is not
  slower than with the previous profile (median ratio at least 1);
- else the previous profile's entries, when those beat the defaults beyond the spread;
- else no entries at all: the program keeps ``resolve()``'s defaults, and the report says "no
  measurable gain".

An instance follows the decision of its home program (the one with most of its uses).  If the
composed profile makes any phase of the model slower than the previous profile, nothing is
written.  The report ends with these lines; an application may name its phases
(``phases()``: e.g. decode = the decode and head programs per token), and tokens per second are
then given for each phase, as the programs run back to back (no sampling, no Python between
steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..operator import Operator
from ..profile import Profile, make_entry
from ..program import Program
from .candidates import Instance, instances
from .program import home, signature

NEW, OLD, DEFAULTS = "new", "old", "defaults"
#: Interleaved rounds of the whole-model A/B, and about how long one program's may take (long
#: programs get fewer rounds, never under 6).
AB_ROUNDS, SECONDS = 10, 60.0
TEXT = {NEW: "this tune's entries", OLD: "the previous profile's entries",
        DEFAULTS: "resolve() defaults"}


@dataclass(frozen=True)
class Spread:
    """Per-round ratios of one version's speed over another's (> 1: the first is faster)."""

    ratios: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(np.median(self.ratios))

    @property
    def low(self) -> float:
        return min(self.ratios)

    @property
    def high(self) -> float:
        return max(self.ratios)

    @property
    def won(self) -> int:
        return sum(r > 1 for r in self.ratios)

    @property
    def exact(self) -> bool:
        """The two versions run the same code: the ratio is 1 by construction."""
        return all(r == 1.0 for r in self.ratios)

    def beyond(self) -> bool:
        """Faster beyond the measured spread: the first quartile of the rounds is above 1."""
        return not self.exact and float(np.percentile(self.ratios, 25)) > 1.0

    def text(self) -> str:
        if self.exact:
            return "1.000x (the same code)"
        return (f"{self.median:.3f}x (range {self.low:.3f}-{self.high:.3f}, ahead in "
                f"{self.won} of {len(self.ratios)})")


def spread(slow: Sequence[float], fast: Sequence[float]) -> Spread:
    """Per-round ``slow / fast`` time ratios: how much faster ``fast`` ran."""
    return Spread(tuple(float(s / f) for s, f in zip(slow, fast)))


@dataclass
class Verdict:
    """What the A/B found and what the tuner writes."""

    profile: Profile | None  # None: nothing is written (the model would be slower)
    kept: dict[str, str]  # program -> NEW, OLD or DEFAULTS
    times: dict[str, dict[str, list[float]]]  # program -> version -> seconds per round
    phases: dict[str, tuple[tuple[str, ...], int]]
    rounds: int
    lines: list[str] = field(default_factory=list)
    dropped: set = field(default_factory=set)  # instances not given this tune's setting
    proposed: dict[str, Spread] = field(default_factory=dict)  # program -> this tune's entries
    #                                                  against the defaults, where they differ


def settings(programs: Mapping[str, Program]) -> dict[Operator, Operator]:
    """Each instance (unset) -> its resolved setting in ``programs``."""
    return {i.op: i.current for i in instances(programs)}


def compose(previous: Profile, found: Sequence[Instance], chosen: Mapping[Operator, Operator],
            device: str, host) -> Profile:
    """``previous``'s entries that apply to none of ``found``, plus one exact entry (every
    param matched, every tunable set) per instance in ``chosen``."""
    keep = [e for e in previous.entries if not any(e.applies_to(i.current) for i in found)]
    profile = Profile(keep, device, host)
    for op in chosen.values():
        profile._insert(make_entry(type(op), {**{p: getattr(op, p) for p in op.params()},
                                              **op.tunable_values()}))
    return profile


def decide(times: Mapping[str, Mapping[str, list[float]]]) -> dict[str, str]:
    """Per program, which version's entries to keep (see the module docstring)."""
    kept = {}
    for name, t in times.items():
        new_vs_defaults = spread(t[DEFAULTS], t[NEW])
        if new_vs_defaults.beyond() and spread(t[OLD], t[NEW]).median >= 1.0:
            kept[name] = NEW
        elif spread(t[DEFAULTS], t[OLD]).beyond():
            kept[name] = OLD
        else:
            kept[name] = DEFAULTS
    return kept


def validate(record: Callable[[Profile], Mapping[str, Program]], previous: Profile,
             candidate: Profile, runner, device: str, host, placed: Callable[[Operator], bool],
             phases: Mapping[str, tuple[Sequence[str], int]] | None = None,
             rounds: int = AB_ROUNDS) -> Verdict:
    """Time the programs under the candidate, the previous profile and the defaults; compose
    the profile to write from the programs that gained; see the module docstring.

    ``record(profile)`` records the application's tuned programs under a profile; ``placed``
    says whether an instance runs on the target (only those get entries)."""
    empty = Profile(device=device)
    versions = {NEW: record(candidate), OLD: record(previous), DEFAULTS: record(empty)}
    names = list(versions[NEW])

    def after(name: str) -> list[Program]:  # what the model runs between two runs of it
        return [versions[NEW][n] for n in runner.evictors(name, versions[NEW], phases)]

    times = {name: runner.rounds({v: versions[v][name] for v in versions}, rounds, SECONDS,
                                 after(name))
             for name in names}
    kept = decide(times)
    target = runner.target
    proposed = {name: spread(times[name][DEFAULTS], times[name][NEW]) for name in names
                if signature(versions[NEW][name], target)
                != signature(versions[DEFAULTS][name], target)}
    found = [i for i in instances(versions[NEW]) if placed(i.current) and i.op.tunables()]
    by_version = {v: settings(p) for v, p in versions.items()}
    chosen, dropped = {}, set()
    for inst in found:
        version = kept[home(inst.op, versions[NEW])]
        if version != NEW:
            dropped.add(inst.op)
        setting = by_version[version][inst.op]
        if setting != by_version[DEFAULTS][inst.op]:  # a default needs no entry
            chosen[inst.op] = setting
    final = compose(previous, found, chosen, device, host)
    # a program whose instances follow homes elsewhere may now be a version not timed yet
    programs = record(final)
    for name in names:
        sig = signature(programs[name], target)
        match = next((v for v in (NEW, OLD, DEFAULTS)
                      if signature(versions[v][name], target) == sig), None)
        if match is None:
            again = runner.rounds({"final": programs[name], OLD: versions[OLD][name],
                                   DEFAULTS: versions[DEFAULTS][name]}, rounds, SECONDS,
                                  after(name))
            times[name] = {**times[name], "final": again["final"], OLD: again[OLD],
                           DEFAULTS: again[DEFAULTS]}
        else:
            times[name] = {**times[name], "final": times[name][match]}
    verdict = Verdict(final, kept, times, {k: (tuple(v[0]), v[1]) for k, v in
                                           (phases or {}).items()}, rounds, dropped=dropped,
                      proposed=proposed)
    slower = [what for what, (old, fin) in totals(verdict, OLD).items()
              if spread(old, fin).median < 1.0]
    slower += [f"the {name} program" for name in names
               if spread(times[name][OLD], times[name]["final"]).median < 1.0]
    if slower:
        verdict.profile = None
    verdict.lines = lines(verdict, slower)
    return verdict


def totals(verdict: Verdict, against: str) -> dict[str, tuple[list[float], list[float]]]:
    """Per phase (or per program, without phases): seconds per round of ``against`` and of the
    final profile."""
    groups = verdict.phases or {n: ((n,), 0) for n in verdict.times}
    out = {}
    for what, (programs, _) in groups.items():
        out[what] = tuple([sum(verdict.times[p][v][r] for p in programs)
                           for r in range(len(verdict.times[programs[0]][v]))]
                          for v in (against, "final"))
    return out


def lines(verdict: Verdict, slower: Sequence[str]) -> list[str]:
    """The closing lines of the tune report."""
    counts = sorted({len(t["final"]) for t in verdict.times.values()})
    rounds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    out = [f"whole model: the programs with the profile written ({rounds} interleaved rounds; "
           "median of the per-round speed ratios, their range, rounds ahead)"]
    if verdict.profile is None:
        out[0] = ("whole model: NOTHING WRITTEN, the composed profile ran slower than the "
                  f"previous one ({', '.join(slower)}); the previous profile stays")
    for against in (DEFAULTS, OLD):
        for what, (base, final) in totals(verdict, against).items():
            s = spread(base, final)
            rate = ""
            if what in verdict.phases and verdict.phases[what][1]:
                tokens = verdict.phases[what][1]
                rate = (f"; {tokens / float(np.median(base)):.1f} -> "
                        f"{tokens / float(np.median(final)):.1f} tokens/s (programs back to "
                        "back)")
            gain = (s.text() if s.beyond() else
                    f"no gain: {s.text()}" if s.exact else f"no measurable gain: {s.text()}")
            label = "resolve() defaults" if against == DEFAULTS else "the previous profile"
            out.append(f"  {what:12s} against {label}: {gain}{rate}")
    for name, s in verdict.proposed.items():
        fate = "written" if verdict.kept[name] == NEW else "not written"
        out.append(f"  {name:12s} this tune's entries against resolve() defaults: {s.text()} "
                   f"-> {fate}")
    kept = {v: [n for n, k in verdict.kept.items() if k == v] for v in (NEW, OLD, DEFAULTS)}
    out.append("  programs: " + "; ".join(
        f"{TEXT[v]} kept for {', '.join(names)}" if v != DEFAULTS else
        f"no entries (no measurable gain over the defaults) for {', '.join(names)}"
        for v, names in kept.items() if names))
    return out
