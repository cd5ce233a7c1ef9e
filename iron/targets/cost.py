"""Cost models: what a target's ``cost(op)`` returns: an estimate with its bottleneck named.

A cost model estimates the time of one resolved operator instance from the work it does and the
machine it runs on, without running it.  The tuner uses it to rank candidates: on the cpu to
measure only the most promising settings (``--prune K``), on a device it cannot measure (an
NPU without XRT) to choose by the model alone, saying so (``"source": "model"``).

``Target.cost(op)`` returns an ``Estimate`` or ``None`` (the target has no model).  An estimate
is seconds per call of the instance and its named bottleneck, with every term it took the
maximum or the sum of, so a person can check it by hand:

- ``terms``: seconds per resource, each computed as if it were the only limit; ``bottleneck`` is
  the name of the largest, one of ``BOTTLENECKS``;
- ``seconds``: the launch terms (``LAUNCH``: a per-call overhead that does not overlap anything)
  plus the largest of the others, which overlap (double-buffered data movement beside compute);
  a model may add a term no resource is named for (the npu's pipeline ``fill``) and list it.

The npu designs' model (``iron.targets.npu.cost``) fills these terms: ``compute`` (the
slowest core's kernel calls), ``shim DMA`` and ``memtile`` (the busiest DMA channel of each
kind), ``launch`` (the dispatch and the runtime sequence's transfers); its device numbers, with
their sources, are in ``iron.targets.npu.resources``.  The cpu's roofline is
``iron.targets.cpu.cost``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

#: The resources an estimate can name as its bottleneck.
COMPUTE, MEMORY, SHIM_DMA, MEMTILE, LAUNCH = "compute", "memory", "shim DMA", "memtile", "launch"
BOTTLENECKS = (COMPUTE, MEMORY, SHIM_DMA, MEMTILE, LAUNCH)


@dataclass(frozen=True)
class Estimate:
    """Modelled seconds per call of one instance, and the resource that sets them."""

    seconds: float
    bottleneck: str
    terms: Mapping[str, float] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.bottleneck not in BOTTLENECKS:
            raise ValueError(f"estimate bottleneck {self.bottleneck!r} is not one of "
                             f"{', '.join(BOTTLENECKS)}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"estimate of {self.seconds!r} s: a modelled time is a positive "
                             "finite number of seconds")

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v * 1e6:.1f}" for k, v in self.terms.items())
        return f"{self.seconds * 1e6:.1f} us ({self.bottleneck}-bound; {parts} us)"


def estimate(terms: Mapping[str, float], launch: Mapping[str, float] | None = None) -> Estimate:
    """The estimate of overlapping ``terms`` after non-overlapping ``launch`` terms.

    seconds = sum(launch) + max(terms); the bottleneck is the largest single term of either.
    """
    launch = dict(launch or {})
    every = {**terms, **{k: v + terms.get(k, 0.0) for k, v in launch.items()}}
    bottleneck = max(every, key=lambda k: every[k])
    return Estimate(sum(launch.values()) + max(terms.values(), default=0.0), bottleneck, every)
