"""Two bundles of the same weights prefilling the same prompt in one process, in turn.

On a shared machine one bundle timed after another sees a different machine, and a 2-thread
prefill waits at every barrier for a thread another process has descheduled. Here both
bundles are loaded on one read of the first one's weights and prefill a 128-token prompt
alternately, round after round; printed per bundle: the median wall time and tokens/s, the
median CPU time of the process (run with ``OMP_WAIT_POLICY=passive`` so that a thread waiting
at a barrier sleeps instead of spinning: CPU time is then the work done, which the load moves
least), and where the prefill's kernel time goes, per operator and shape.

    OMP_WAIT_POLICY=passive python benchmarks/prefill_ab.py \\
        --bundle before=/path/to/bundle --bundle after=build/llama/cpu-... [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from iron.lm.generate import LanguageModel
from iron.pipeline.bundle import Bundle

from llm import PROMPT_TOKENS, breakdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", action="append", required=True, metavar="NAME=DIR",
                        help="a bundle to time (twice or more, all of the same weights)")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    paths = dict(b.split("=", 1) for b in args.bundle)
    if len(paths) < 2:
        raise SystemExit("--bundle NAME=DIR at least twice")
    weights = Bundle.open(next(iter(paths.values()))).weights()
    models = {name: LanguageModel(path, weights) for name, path in paths.items()}
    ids = list(range(1000, 1000 + PROMPT_TOKENS))  # any ids: the speed does not depend on them
    for model in models.values():
        model.generate(ids, 4, stop_at_eos=False)  # warm-up: page in weights, start threads
    walls = {name: [] for name in models}
    cpus = {name: [] for name in models}
    seconds = {name: {e: np.zeros(len(e.program.steps))
                      for e in (m.prefill_exe, m.tail_exe, m.head_exe)}
               for name, m in models.items()}
    print(f"load average {os.getloadavg()[0]:.2f}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    for _ in range(args.rounds):
        for name, model in models.items():
            model.reset()
            wall, cpu = time.perf_counter(), time.process_time()
            model.prefill(ids, seconds[name])
            walls[name].append(time.perf_counter() - wall)
            cpus[name].append(time.process_time() - cpu)
    for name, model in models.items():
        wall = statistics.median(walls[name])
        b = breakdown(seconds[name], model.head_exe, wall, args.rounds)
        kernels = sum(b["kernels"].values())
        print(f"{name}: wall {wall * 1e3:.1f} ms ({len(ids) / wall:.1f} tok/s), CPU "
              f"{statistics.median(cpus[name]) * 1e3:.1f} ms, in kernels {kernels * 1e3:.1f} ms")
        for label, t in b["kernels"].items():
            print(f"  {label:24s} {t * 1e3:8.2f} ms {t / kernels:6.1%}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
