"""The tuner's use of a target's cost model: ranking, pruning, and choosing without a device.

A target may model an instance's time (``Target.cost(op)``, an ``iron.targets.cost.Estimate``
with its bottleneck named).  The tuner uses the model two ways:

- pruning (``--prune K``): where candidates can be measured, only the model's ``K`` fastest of
  each instance are, plus the setting in use; the sweep, the head-to-head and the log are as
  without it.  ``--prune 0`` (``--full``) measures every legal setting, and so does an
  instance whose family's cost hook gives no estimate;
- ranking (``ModelBenchmark``): on a device this machine cannot run (an NPU without XRT) the
  model's times stand in for measurements.  Their log records and the report say
  ``"source": "model"``; the profile they produce has the usual format.

How well a model ranks is checked where both exist: ``spearman`` of modelled against measured
times, per instance (``benchmarks/cost_model.py`` on the cpu tuner's log).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..devices import Device
from ..operator import Operator
from ..store import artifact_key
from ..targets import Target
from ..targets.cost import Estimate
from .candidates import Instance
from .log import Comparison
from .measure import Benchmark, Measurement

#: The model's fastest candidates measured per instance by default, besides the setting in use.
DEFAULT_PRUNE = 8


def ranked(target: Target, ops: Sequence[Operator]) -> list[tuple[Operator, Estimate]]:
    """``ops`` with their estimates, fastest first; equal estimates keep the order given."""
    estimates = [(op, target.cost(op)) for op in ops]
    missing = [op for op, e in estimates if e is None]
    if missing:
        raise ValueError(f"the {target.kind} target has no cost model for "
                         f"{missing[0].describe(True)}")
    return sorted(estimates, key=lambda pair: pair[1].seconds)


def estimable(target: Target, ops: Sequence[Operator]) -> bool:
    """Whether the target's model prices every one of ``ops`` (a family's cost hook may say
    "no estimate", and then its instances are measured in full)."""
    return all(target.cost(op) is not None for op in ops)


def prune(target: Target, ops: Sequence[Operator], current: Operator, k: int
          ) -> list[Operator]:
    """The model's ``k`` fastest of ``ops`` that run different code (of settings that differ
    only in tunables the target's kernel ignores, the first ranked), plus ``current`` if it is
    not among them, in the order given; all of them when ``k`` is 0 or at least their number,
    or when the model has no estimate for them."""
    if k <= 0 or len(ops) <= k or not estimable(target, ops):
        return list(ops)
    keep, seen = {current}, set()
    for op, _ in ranked(target, ops):
        ignored = target.ignored_tunables(op)
        code = tuple((name, getattr(op, name)) for name in op.tunables() if name not in ignored)
        if code not in seen and len(seen) < k:
            seen.add(code)
            keep.add(op)
    return [op for op in ops if op in keep]


def ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 1..n, ties sharing the mean of the ranks they span."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values, kind="stable")
    out = np.empty(len(values))
    sorted_values = values[order]
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or sorted_values[end] != sorted_values[start]:
            out[order[start:end]] = (start + end + 1) / 2
            start = end
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (the Pearson correlation of their
    tie-averaged ranks); NaN when either has a single distinct value."""
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} values against {len(b)}")
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    norm = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / norm) if norm > 0 else float("nan")


class ModelBenchmark(Benchmark):
    """A ``Benchmark`` whose times are a target's cost model: for devices not present.

    ``measure`` returns the estimate (runs = 0: nothing ran), ``compare`` the modelled ratio,
    so the tuner's rule for moving a setting (``MIN_GAIN`` in the head-to-head) applies to the
    model as it does to measurements.  Keys hash the instance and the model's name, since a
    design without a toolchain has no artifact key; the name carries the target's
    ``cost_version()``, so a log's records of an earlier model are not reused.
    """

    source = "model"

    def __init__(self, target: Target, dev: Device, version: str | None = None):
        self.target, self.device = target, dev
        version = version or target.cost_version()
        self.method = f"model {target.kind}-v{version} {dev.name}"

    def key(self, op: Operator) -> str:
        return artifact_key({"model": self.method, "operator": type(op).__name__,
                             "fields": op.config()})

    def compile(self, ops: Sequence[Operator], deadline: float | None) -> dict[str, str | None]:
        return {self.key(op): None for op in ops}

    def estimate(self, op: Operator) -> Estimate:
        e = self.target.cost(op)
        if e is None:
            raise ValueError(f"the {self.target.kind} target has no cost model for "
                             f"{op.describe(True)}")
        return e

    def measure(self, instance: Instance, op: Operator, best: float | None) -> Measurement:
        e = self.estimate(op)
        return Measurement(e.seconds, 0.0, 0, bottleneck=e.bottleneck)

    def compare(self, instance: Instance, new: Operator, old: Operator) -> Comparison:
        gain = self.estimate(old).seconds / self.estimate(new).seconds
        return Comparison(self.key(new), self.key(old), gain, gain, gain, 0, self.method)
