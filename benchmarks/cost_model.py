"""How well the cpu cost model ranks the candidates the tuner measured, instance by instance.

Reads a tuning log (``build/tune/llama-cpu.jsonl``, written by ``python -m iron.lm.tune llama
--full``), groups its measured candidates by instance, models each with the cpu target's
roofline (``iron.targets.cpu.cost``, priced with this host's calibration) and prints, per
instance: Spearman's rank correlation between modelled and measured times; whether the measured
fastest is among the model's K fastest (what ``--prune K`` measures); and the regret, the
measured time of the best of the model's K over the measured best.  The median correlation is
the figure the model is judged by.

    python benchmarks/cost_model.py [--log build/tune/llama-cpu.jsonl] [--k 8] [--markdown]
                                    [--recalibrate]
"""

import argparse
import os
import statistics
import sys
from collections import defaultdict

from iron.operator import Operator
from iron.paths import build_dir
from iron.targets.cpu import calibration
from iron.targets.cpu import cost as cpu_model
from iron.tuning.log import TuneLog
from iron.tuning.measure import TargetBenchmark
from iron.tuning.model import DEFAULT_PRUNE, spearman


def instances(log: TuneLog) -> dict[str, list[tuple[Operator, float]]]:
    """Measured (operator, median seconds) per instance, from the log's ok records."""
    found = defaultdict(list)
    for record in log.records.values():
        if not record.ok or record.source != "measured":
            continue
        op = Operator.registry[record.operator](**record.fields)
        found[op.describe()].append((op, record.median))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", default=str(build_dir() / "tune" / "llama-cpu.jsonl"))
    parser.add_argument("--k", type=int, default=DEFAULT_PRUNE,
                        help=f"the pruning depth to check (default {DEFAULT_PRUNE})")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--recalibrate", action="store_true", help="measure this host's "
                        "numbers again (they are cached in build/cost/)")
    args = parser.parse_args()
    if args.recalibrate:
        calibration.calibration_path().unlink(missing_ok=True)
    if not os.path.isfile(args.log):
        sys.exit(f"no tuning log at {args.log}: run python -m iron.lm.tune llama --full first")
    log = TuneLog(args.log, TargetBenchmark("cpu").method)
    log.close()
    host = calibration.calibration()
    print(f"host: {calibration.describe(host)}")
    print(f"load average now: {os.getloadavg()[0]:.1f}\n")
    rows = []
    for name, measured in instances(log).items():
        if len(measured) < 3:
            continue
        modelled = [cpu_model.cost(op, host).seconds for op, _ in measured]
        times = [t for _, t in measured]
        rho = spearman(modelled, times)
        by_model = sorted(range(len(measured)), key=lambda i: modelled[i])[:args.k]
        best = min(times)
        found = min(times[i] for i in by_model)
        fastest = min(range(len(measured)), key=lambda i: times[i])
        bottleneck = cpu_model.cost(measured[fastest][0], host).bottleneck
        rows.append((name, len(measured), rho, fastest in by_model, found / best, bottleneck))
    if not rows:
        sys.exit(f"{args.log} holds no instance with 3 or more measured candidates")
    head = ("instance", "candidates", "Spearman", f"best in model's top {args.k}",
            "regret", "bottleneck (model)")
    cells = [(n, str(c), f"{r:+.2f}", "yes" if hit else "no", f"{g:.3f}x", b)
             for n, c, r, hit, g, b in rows]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for c in cells:
            print("| " + " | ".join(c) + " |")
    else:
        widths = [max(len(r[i]) for r in [head, *cells]) for i in range(len(head))]
        for c in [head, *cells]:
            print("  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip())
    rhos = [r for _, _, r, *_ in rows if r == r]
    print(f"\nmedian Spearman over {len(rhos)} instances: {statistics.median(rhos):+.2f} "
          f"(target >= 0.7); measured best within the model's top {args.k}: "
          f"{sum(r[3] for r in rows)} of {len(rows)}; median regret "
          f"{statistics.median(r[4] for r in rows):.3f}x, worst {max(r[4] for r in rows):.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
