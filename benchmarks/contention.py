"""Decode speed beside a busy process, for each OpenMP waiting policy, in one run.

    python benchmarks/contention.py [BUNDLE] [--tokens 48] [--rounds 2]

For every policy, a fresh process (libgomp reads its settings once, when it loads) decodes the
same tokens twice: on a quiet machine, then beside one process spinning on a core (``while
True: pass``).  It prints decode tokens/s quiet and busy, busy / quiet, and each policy's quiet
speed against libgomp's own default, so a policy that survives contention by giving up quiet
speed shows it.  Run it when ``uptime`` shows little load: other processes are competitors too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Each a complete set of libgomp settings; "spin 300k" is libgomp's own default (about 3 ms of
#: spinning before a waiting thread sleeps).
POLICIES = {
    "libgomp default (spin 300k)": {"GOMP_SPINCOUNT": "300000"},
    "OMP_WAIT_POLICY=active": {"OMP_WAIT_POLICY": "active"},
    "OMP_WAIT_POLICY=passive": {"OMP_WAIT_POLICY": "passive"},
    "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
    "GOMP_SPINCOUNT=30000": {"GOMP_SPINCOUNT": "30000"},
    "OMP_DYNAMIC=true": {"OMP_DYNAMIC": "true", "GOMP_SPINCOUNT": "300000"},
}
OMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_DYNAMIC", "OMP_THREAD_LIMIT")


def child(bundle: str, tokens: int, seconds: float) -> None:
    """Decode ``tokens`` tokens (or as many as fit in ``seconds``); print tokens/s as JSON."""
    sys.path.insert(0, str(ROOT))
    from iron.lm.generate import LanguageModel

    model = LanguageModel(bundle)
    logits = model.prefill(list(range(100, 116)))
    for _ in range(4):  # warm up: the first tokens fault in pages
        logits = model.decode(int(logits.argmax()))
    start, n = time.perf_counter(), 0
    while n < tokens and time.perf_counter() - start < seconds:
        logits = model.decode(int(logits.argmax()))
        n += 1
    print(json.dumps({"tok_s": n / (time.perf_counter() - start)}))


def measure(bundle: str, env: dict[str, str], tokens: int, seconds: float) -> float:
    clean = {k: v for k, v in os.environ.items() if k not in OMP_VARIABLES}
    result = subprocess.run(
        [sys.executable, __file__, "--child", bundle, "--tokens", str(tokens),
         "--seconds", str(seconds)], env={**clean, **env}, capture_output=True, text=True,
        check=True)
    return json.loads(result.stdout.splitlines()[-1])["tok_s"]


def busy_process() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", nargs="?", default=str(ROOT / "build/llama/cpu"))
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default=None, help="comma-separated policy names")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.bundle, args.tokens, args.seconds)
    policies = {k: v for k, v in POLICIES.items()
                if not args.only or k in args.only.split(",")}
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"cores usable: {len(os.sched_getaffinity(0))}")
    quiet = {k: [] for k in policies}
    busy = {k: [] for k in policies}
    for _ in range(args.rounds):
        for name, env in policies.items():
            quiet[name].append(measure(args.bundle, env, args.tokens, args.seconds))
            spinner = busy_process()
            try:
                time.sleep(0.2)
                busy[name].append(measure(args.bundle, env, args.tokens, args.seconds))
            finally:
                spinner.kill()
                spinner.wait()
    base = statistics.median(next(iter(quiet.values())))
    print(f"{'policy':32} {'quiet tok/s':>12} {'busy tok/s':>11} {'busy/quiet':>10} "
          f"{'quiet/default':>13}")
    for name in policies:
        q, b = statistics.median(quiet[name]), statistics.median(busy[name])
        print(f"{name:32} {q:12.1f} {b:11.1f} {b / q:10.2f} {q / base:13.2f}")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
