"""Dispatches and modelled time per call of an npu bundle's programs, before and after folding.

    python -m iron.targets.npu.report build/llama/npu2            # decode + head: one token
    python -m iron.targets.npu.report BUNDLE --programs prefill --json

For each program: its steps by placement (the host-placed ones by operator, with their count),
the NPU dispatches (unfolded: one per NPU step; folded: one per ``fold.Fold``), the
configurations loaded (an ``aiex.configure`` per change of design, the same either way), the
host <-> device handovers, and the modelled seconds split three ways, read off each NPU step's
design (``Design.cost``, the cost model the tuner ranks by):

- kernel: the ``compute`` term (the slowest core's kernel calls);
- data movement: the rest of the step's modelled time beyond its kernel and its dispatch (the
  DMA time compute does not hide, the pipeline fill, issuing the runtime transfers);
- dispatch: ``DISPATCH_SECONDS`` (45 us, upstream's measurement of an empty design, see
  ``resources``) per dispatch.

Unfolded, the three add up to the sum of the per-step model; folding changes only the
dispatches.  Host-placed steps have no modelled time here (they run on the CPU, whose model is
``iron.targets.cpu.cost``), nor does loading a configuration (no public figure): both are
counted instead.  For a language-model bundle the default programs are ``decode`` and
``head``: what one generated token runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from ...errors import IronError
from ...program import Program
from .design import Design
from .fold import Fold, plan
from .resources import DISPATCH_SECONDS


@dataclass(frozen=True)
class Split:
    """Modelled seconds of a program's NPU work, three ways."""

    kernel: float
    data_movement: float
    dispatch: float

    @property
    def total(self) -> float:
        return self.kernel + self.data_movement + self.dispatch


@dataclass(frozen=True)
class ProgramReport:
    name: str
    device: str
    steps: int
    npu_steps: int
    host_steps: dict[str, int]  # operator -> count
    dispatches: int  # unfolded: one per NPU step
    folded_dispatches: int  # one per fold
    configures: int  # configurations loaded per call (changes of design), either way
    handovers: int  # host <-> npu changes of placement between consecutive steps
    unfolded: Split
    folded: Split
    model_sum: float  # sum of Design.cost() over the NPU steps: what ``unfolded`` must add to


def program_report(name: str, program: Program, designs: Sequence[Design | None]
                   ) -> ProgramReport:
    segments = plan(program, designs)
    folds = [s for s in segments if isinstance(s, Fold)]
    kernel = movement = model_sum = 0.0
    for d in designs:
        if d is None:
            continue
        cost = d.cost()
        model_sum += cost.seconds
        kernel += cost.terms["compute"]
        movement += cost.seconds - cost.terms["compute"] - DISPATCH_SECONDS
    npu = sum(d is not None for d in designs)
    host = Counter(type(program.steps[i].op).__name__ for i, d in enumerate(designs)
                   if d is None)
    handovers = sum((a is None) != (b is None) for a, b in zip(designs, designs[1:]))
    configures = sum(len(f.configures()) for f in folds)
    device = next((d.device for d in designs if d is not None), program.device.name)
    return ProgramReport(
        name, device, len(designs), npu, dict(sorted(host.items())), npu, len(folds),
        configures, handovers, Split(kernel, movement, npu * DISPATCH_SECONDS),
        Split(kernel, movement, len(folds) * DISPATCH_SECONDS), model_sum)


def bundle_report(path: str | Path, programs: Sequence[str] | None = None
                  ) -> list[ProgramReport]:
    """The report of each of ``programs`` (default: decode and head of a language-model
    bundle, else every program) of the npu bundle at ``path``."""
    from ...pipeline.bundle import Bundle
    from .runner import step_design

    bundle = Bundle.open(path)
    if bundle.manifest["device"] not in ("npu1", "npu2"):
        raise IronError(f"{path}: a {bundle.manifest['device']} bundle; the report is of npu "
                        "bundles (built with device=npu1 or npu2)")
    names = list(programs or ())
    if not names:
        have = list(bundle.manifest["programs"])
        names = ["decode", "head"] if {"decode", "head"} <= set(have) else have
    out = []
    for name in names:
        program = bundle.program(name)
        files = bundle.manifest["programs"][name]["kernels"]
        out.append(program_report(name, program, [step_design(str(bundle.path / f))
                                                  for f in files]))
    return out


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def markdown(reports: Sequence[ProgramReport]) -> str:
    """The reports as a markdown table: per program and in total, unfolded then folded."""
    rows = ["| programs | device | NPU steps | dispatches | kernel us | data movement us | "
            "dispatch us | total us | configurations | host steps |",
            "|---|---|---|---|---|---|---|---|---|---|"]

    def row(name, device, npu, dispatches, split, configures, host):
        hosted = ", ".join(f"{k} {v}" for k, v in sorted(host.items())) or "none"
        rows.append(f"| {name} | {device} | {npu} | {dispatches} | {us(split.kernel)} | "
                    f"{us(split.data_movement)} | {us(split.dispatch)} | {us(split.total)} | "
                    f"{configures} | {hosted} |")

    for label, pick, count in (("unfolded", "unfolded", "dispatches"),
                               ("folded", "folded", "folded_dispatches")):
        host: Counter = Counter()
        for r in reports:
            host.update(r.host_steps)
        total = Split(*(sum(getattr(getattr(r, pick), f) for r in reports)
                        for f in ("kernel", "data_movement", "dispatch")))
        name = " + ".join(r.name for r in reports) + f", {label}"
        row(name, reports[0].device, sum(r.npu_steps for r in reports),
            sum(getattr(r, count) for r in reports), total, sum(r.configures for r in reports),
            host)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iron.targets.npu.report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--programs", help="comma-separated program names (default: decode "
                        "and head of a language-model bundle, else all)")
    parser.add_argument("--json", action="store_true", help="every figure, as JSON")
    args = parser.parse_args(argv)
    try:
        reports = bundle_report(args.bundle, args.programs.split(",") if args.programs
                                else None)
    except IronError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([asdict(r) for r in reports], indent=1))
        return 0
    print(markdown(reports))
    for r in reports:
        print(f"\n{r.name}: {r.steps} steps, {r.npu_steps} on the NPU in {r.folded_dispatches} "
              f"folded dispatch(es) (unfolded {r.dispatches}), {r.handovers} host <-> NPU "
              f"handovers, {r.configures} configurations loaded per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
