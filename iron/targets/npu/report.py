"""Dispatches, configuration loads and modelled time per token of an npu bundle's programs:
each NPU step its own dispatch, then folded, then folded with consecutive designs packed.

    python -m iron.targets.npu.report build/llama/npu2            # decode + head: one token
    python -m iron.targets.npu.report BUNDLE --programs prefill --json

For the programs together (one token of a language-model bundle: ``decode`` then ``head``)
and for each: its steps by placement (the host-placed ones by operator, with their count), the
NPU dispatches (unfolded: one per NPU step; folded: one per ``fold.Fold``; npu1 has no folds,
one xclbin per step as upstream IRON runs Phoenix, ``fold.folds_on``), the configurations
loaded, read off the folds as ``fold.plan`` renders and the emulator runs them (one per change
of configuration along the NPU steps, around the cycle to the next call, ``coresidence.loads``:
before packing each design its own device; packed, the bundle's folds, consecutive designs
merged into one device where they fit, devices with folds only), the host <-> device
handovers, and the modelled seconds split four ways:

- kernel: the ``compute`` term of each NPU step's design (``cost.design_estimate``, the model
  the tuner ranks by: the slowest core's kernel calls);
- data movement: the rest of the step's modelled time beyond its kernel and its dispatch (the
  DMA time compute does not hide, the pipeline fill, issuing the runtime transfers);
- dispatch: ``DISPATCH_SECONDS`` (45 us) per dispatch;
- reconfiguration: ``SWITCH_SECONDS`` (38.8 us, upstream IRON's measured ``switch_us``) per
  configuration loaded.

Unfolded, kernel + data movement + dispatch add up to the sum of the per-step model; folding
changes only the dispatches, packing only the loads.  The figures' sources are in
``resources``: the clock is npu2's top DPM level and the host memory's bandwidth a peak, so
kernel and data movement are lower bounds; a small design run alone costs 120-180 us in
upstream's measurements, more than this model's dispatch + load + step.  Host-placed steps
have no modelled time here (they run on the CPU, whose model is ``iron.targets.cpu.cost``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ...errors import IronError
from ...program import Program
from .buckets import KV_CACHE, Bucket, at_bucket, bucket_costs
from .coresidence import loads
from .cost import design_estimate
from .ir import Design
from .fold import Fold, folds_on, plan
from .resources import DISPATCH_SECONDS, SMALL_DESIGN_ALONE_SECONDS, SWITCH_SECONDS


@dataclass(frozen=True)
class Split:
    """Modelled seconds of a program's NPU work, four ways."""

    kernel: float
    data_movement: float
    dispatch: float
    reconfiguration: float

    @property
    def total(self) -> float:
        return self.kernel + self.data_movement + self.dispatch + self.reconfiguration


@dataclass(frozen=True)
class ProgramReport:
    name: str
    device: str
    folds: bool  # whether the device runs folds (and packs): npu2 yes, npu1 no
    steps: int
    npu_steps: int
    host_steps: dict[str, int]  # operator -> count
    dispatches: int  # unfolded: one per NPU step
    folded_dispatches: int  # one per fold (without folds: one per NPU step)
    loads: int  # configurations loaded per call: changes of design, around the cycle
    packed_loads: int  # changes of pack (without folds: the same as ``loads``)
    handovers: int  # host <-> npu changes of placement between consecutive steps
    unfolded: Split
    folded: Split
    packed: Split
    model_sum: float  # sum of ``design_estimate`` over the NPU steps: what ``unfolded`` must add to
    #: per context bucket, what the built KV-cache steps move and take (``buckets``)
    buckets: tuple[Bucket, ...] = ()
    #: the position the figures above are at (None: the whole context's designs)
    position: int | None = None


def program_report(name: str, programs: Sequence[Program],
                   step_designs: Sequence[Sequence[Design | None]],
                   step_buckets: Sequence[Sequence[Mapping[int, Design]]] | None = None,
                   position: int | None = None) -> ProgramReport:
    """The report of ``programs`` run one after the other, each with its steps' designs (None:
    placed on the host) and their context buckets' designs (``step_buckets``), as one call (a
    token: decode then head), with the designs run at ``position`` (the buckets covering it;
    None: the whole context's)."""
    step_buckets = step_buckets or [[{} for _ in ds] for ds in step_designs]
    kv = [(p.steps[i].op.ctx, d, v) for p, ds, vs in zip(programs, step_designs, step_buckets)
          for i, (d, v) in enumerate(zip(ds, vs))
          if d is not None and isinstance(p.steps[i].op, KV_CACHE)]
    if position is not None:
        step_designs = [[d if d is None else at_bucket(d, v, position + 1)
                         for d, v in zip(ds, vs)] for ds, vs in zip(step_designs, step_buckets)]
    designs = [d for ds in step_designs for d in ds]
    packed_plans = [plan(p, ds) for p, ds in zip(programs, step_designs)]
    folds = sum(isinstance(s, Fold) for segments in packed_plans for s in segments)
    kernel = movement = model_sum = 0.0
    for d in designs:
        if d is None:
            continue
        cost = design_estimate(d)
        model_sum += cost.seconds
        kernel += cost.terms["compute"]
        movement += cost.seconds - cost.terms["compute"] - DISPATCH_SECONDS
    npu = [d for d in designs if d is not None]
    host = Counter(type(p.steps[i].op).__name__ for p, ds in zip(programs, step_designs)
                   for i, d in enumerate(ds) if d is None)
    handovers = sum(sum((a is None) != (b is None) for a, b in zip(ds, ds[1:]))
                    for ds in step_designs)
    device = npu[0].device if npu else programs[0].device.name
    folding = folds_on(device)
    before = loads(configurations([plan(p, ds, packed=False)
                                   for p, ds in zip(programs, step_designs)]))
    packed = loads(configurations(packed_plans))

    def split(dispatches: int, configurations: int) -> Split:
        return Split(kernel, movement, dispatches * DISPATCH_SECONDS,
                     configurations * SWITCH_SECONDS)

    return ProgramReport(
        name, device, folding, len(designs), len(npu), dict(sorted(host.items())), len(npu),
        folds, before, packed, handovers, split(len(npu), before), split(folds, before),
        split(folds, packed), model_sum, tuple(bucket_costs(kv)), position)


def configurations(plans: Sequence[Sequence[int | Fold]]) -> list[tuple[int, ...]]:
    """The configuration (``coresidence.Pack.key``) each NPU step runs in, in order, as the
    folds of ``plans`` (one per program, called in turn) configure them."""
    return [fold.configurations[c].key() for segments in plans for fold in segments
            if isinstance(fold, Fold) for c, runs in fold.configures() for _ in runs]


def bundle_report(path: str | Path, programs: Sequence[str] | None = None,
                  position: int | None = None) -> list[ProgramReport]:
    """The report of ``programs`` together (default: decode and head of a language-model
    bundle, one token, else every program), then of each, for the npu bundle at ``path``,
    at ``position`` (None: the whole context's designs)."""
    from ...pipeline.bundle import Bundle
    from .runner import step_file

    bundle = Bundle.open(path)
    if bundle.manifest["device"] not in ("npu1", "npu2"):
        raise IronError(f"{path}: a {bundle.manifest['device']} bundle; the report is of npu "
                        "bundles (built with device=npu1 or npu2)")
    names = list(programs or ())
    if not names:
        have = list(bundle.manifest["programs"])
        names = ["decode", "head"] if {"decode", "head"} <= set(have) else have
    for name in names:
        if name not in bundle.manifest["programs"]:
            raise IronError(f"{path}: no program {name!r} (it has "
                            f"{', '.join(bundle.manifest['programs'])})")
    loaded = [(bundle.program(name), [step_file(str(bundle.path / f)) for f in
                                      bundle.manifest["programs"][name]["kernels"]])
              for name in names]
    together = program_report(" + ".join(names), [p for p, _ in loaded],
                              [[d for d, _ in fs] for _, fs in loaded],
                              [[v for _, v in fs] for _, fs in loaded], position)
    alone = [program_report(name, [p], [[d for d, _ in fs]], [[v for _, v in fs]], position)
             for name, (p, fs) in zip(names, loaded)]
    return [together, *alone] if len(names) > 1 else alone


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


#: What the folded and the packed rows are.
PACKED = ("Folded + packed: the bundle's folds as rendered and run, consecutive designs merged "
          "into one aie.device where their columns fit side by side (iron.targets.npu."
          "coresidence, upstream IRON's adjacent co-resident packing); folded: the same folds "
          "with one aie.device per design.")


def markdown(report: ProgramReport) -> str:
    """One report as a markdown table: each NPU step its own dispatch, folded, and folded with
    consecutive designs packed (or, without folds, why there are none)."""
    rows = ["| programs | device | NPU steps | dispatches | configurations | kernel us | "
            "data movement us | dispatch us | reconfiguration us | total us | host steps |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    hosted = ", ".join(f"{k} {v}" for k, v in sorted(report.host_steps.items())) or "none"
    forms = [("one dispatch per step", report.dispatches, report.loads, report.unfolded)]
    if report.folds:
        forms += [("folded", report.folded_dispatches, report.loads, report.folded),
                  ("folded + packed", report.folded_dispatches, report.packed_loads,
                   report.packed)]
    for label, dispatches, loads, split in forms:
        rows.append(f"| {report.name}, {label} | {report.device} | {report.npu_steps} | "
                    f"{dispatches} | {loads} | {us(split.kernel)} | {us(split.data_movement)} | "
                    f"{us(split.dispatch)} | {us(split.reconfiguration)} | {us(split.total)} | "
                    f"{hosted} |")
    if not report.folds:
        rows.append(f"\n{report.device} has no folds: no full-ELF flow, so each NPU step is its "
                    "own xclbin and dispatch, as upstream IRON runs Phoenix; nothing is packed.")
    else:
        rows.append(f"\n{PACKED}")
    return "\n".join(rows)


def bucket_markdown(report: ProgramReport) -> str:
    """What the KV-cache steps move and take per context bucket, or "" without them."""
    if not report.buckets:
        return ""
    rows = ["| context bucket (positions) | KV-cache steps' bytes moved | their modelled us |",
            "|---|---|---|"]
    rows += [f"| {b.positions} | {b.bytes:,} | {us(b.seconds)} |" for b in report.buckets]
    rows.append(f"\nPer call of {report.name}, from the bundle's built designs: a dispatch "
                "runs the smallest bucket holding the last position its rows reach, the last "
                "row past the last smaller bucket (iron.targets.npu.buckets).")
    return "\n".join(rows)


def summary(r: ProgramReport) -> str:
    """One line: what a call of the programs costs in dispatches and configurations."""
    folded = (f"{r.folded_dispatches} folded dispatch(es), {r.loads} configuration loads "
              f"({us(r.folded.reconfiguration)} us), {r.packed_loads} with consecutive designs "
              f"packed ({us(r.packed.reconfiguration)} us)" if r.folds else
              f"{r.dispatches} dispatches (no folds on {r.device}), {r.loads} configuration "
              f"loads ({us(r.unfolded.reconfiguration)} us)")
    return (f"{r.name}: {r.steps} steps, {r.npu_steps} on the NPU: {folded}; "
            f"{r.handovers} host <-> NPU handovers")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iron.targets.npu.report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--programs", help="comma-separated program names (default: decode "
                        "and head of a language-model bundle, else all)")
    parser.add_argument("--position", type=int, help="price the designs run at this "
                        "position (its context buckets); default: the whole context's")
    parser.add_argument("--json", action="store_true", help="every figure, as JSON")
    args = parser.parse_args(argv)
    try:
        reports = bundle_report(args.bundle, args.programs.split(",") if args.programs
                                else None, args.position)
    except IronError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{**asdict(r), "total": {form: getattr(r, form).total for form in
                                                  ("unfolded", "folded", "packed")}}
                          for r in reports], indent=1))
        return 0
    print("The designs of the whole context (every dispatch's worst case):" if args.position
          is None else f"The designs run at position {args.position} (its context buckets):")
    print(markdown(reports[0]))
    buckets = bucket_markdown(reports[0])
    if buckets:
        print(f"\n{buckets}")
    print()
    for r in reports:
        print(summary(r))
    low, high = SMALL_DESIGN_ALONE_SECONDS
    print(f"\nPer configuration load {SWITCH_SECONDS * 1e6:.1f} us, per dispatch "
          f"{us(DISPATCH_SECONDS)} us (upstream IRON's measurements, iron.targets.npu.resources);"
          f" upstream measured a small design run alone at {us(low)}-{us(high)} us.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
