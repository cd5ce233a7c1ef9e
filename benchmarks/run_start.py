"""What ``iron run [MODEL] -p hi -n 1`` spends before it loads the model: from the command line
to a checked bundle (the doit graph, when no bundle folder is given, then the manifest read and
every kernel hashed), in CPU seconds of this process, repeated in one process.

    python benchmarks/run_start.py [--model BUNDLE] [--rounds 15]

CPU time (``time.process_time``) rather than wall time, so that other processes on a busy host
change the figure less; the bundle must be built first (``iron run -p hi -n 1`` builds the
default one).  To compare two checkouts, run it once with each on ``PYTHONPATH`` (and each
its own ``IRON_BUILD_DIR``).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a bundle folder (default: none given, so the "
                   "doit graph finds the default bundle)")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()

    from iron import cli
    from iron.pipeline.bundle import Bundle

    top, _ = cli.parser()
    argv = ["run", *([args.model] if args.model else []), "-p", "hi", "-n", "1"]
    seconds = []
    for _ in range(args.rounds + 1):  # the first round warms the file cache and the imports
        parsed = top.parse_args(argv)
        start = time.process_time()
        bundle = cli.resolve(parsed)
        if not isinstance(bundle, Bundle):  # a checkout whose resolve returns the folder
            bundle = Bundle.open(bundle)
        seconds.append(time.process_time() - start)
    seconds = seconds[1:]
    print(f"iron run {args.model or '(default model)'}: command line to checked bundle "
          f"{statistics.median(seconds) * 1000:.1f} ms CPU (median of {len(seconds)}, min "
          f"{min(seconds) * 1000:.1f})")


if __name__ == "__main__":
    main()
