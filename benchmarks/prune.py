"""A pruned cpu tune against the full one: its time, and the decode speed of the two profiles.

The pruned tune runs before and after the full one (their mean is compared). All tunes start
from an empty profile (every tunable from ``iron.resolve``) with fresh
logs and an artifact cache that already holds every candidate (compiled first, untimed), so the
times compare measuring, not compiling.  The pruned tune measures the cost model's K fastest of
each instance plus the setting in use (``--prune K``); the full one every legal setting.  Then
two SmolLM2 bundles that differ only in those profiles decode the same prompt side by side:
each round is a fresh process that loads both on one copy of the weights and runs them in ABBA
order (as ``benchmarks/profile_gain.py`` does).  Targets: the pruned tune takes at most a third
of the full one's time, and its profile decodes within 2% of the full tune's.

    python benchmarks/prune.py [--k 8] [--rounds 4]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import iron
from iron.paths import build_dir
from iron.pipeline.app import load_app
from iron.pipeline.bundle import write_bundle
from iron.profile import Profile
from iron.tuning.candidates import candidates, instances
from iron.tuning.measure import TargetBenchmark
from iron.tuning.model import DEFAULT_PRUNE
from iron.tuning.events import PrintSink
from iron.tuning.tuner import TuneOptions, tune

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm import abba, median, prompt_ids  # noqa: E402

FULL, PRUNED = "full tune", "pruned tune"


def load() -> float:
    return os.getloadavg()[0]


def timed_tune(app, folder: Path, name: str, k: int) -> tuple[float, Path, str]:
    """Tune from an empty profile into ``folder``; seconds, the profile and the last lines."""
    profile, log, text = (folder / f"{name}.{ext}" for ext in ("json", "jsonl", "txt"))
    profile.unlink(missing_ok=True)
    began = time.monotonic()
    with open(text, "w") as out:
        result = tune(app, "cpu", TuneOptions(fresh=True, prune=k, profile_path=profile,
                                              log_path=log), events=PrintSink(out))
    seconds = time.monotonic() - began
    return seconds, profile, f"{result.measured_now} candidates measured, " \
        f"{len(result.moved)} instances moved from the defaults (log: {text})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=DEFAULT_PRUNE)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        full, pruned, ids_file = args.child
        ids = json.loads(Path(ids_file).read_text())
        print(json.dumps(abba({FULL: full, PRUNED: pruned}, ids)))
        return
    app = load_app("llama")
    cpu = iron.device("cpu")
    folder = build_dir() / "bench" / "prune"
    folder.mkdir(parents=True, exist_ok=True)

    began = time.monotonic()
    every = [op for i in instances(app.programs(cpu, Profile(device="cpu")))
             for op in candidates(i.op, cpu)]
    failed = [e for e in TargetBenchmark(cpu).compile(every, None).values() if e]
    print(f"artifact cache holds all {len(every)} candidates ({len(failed)} fail to compile; "
          f"{time.monotonic() - began:.0f} s, untimed)", flush=True)

    # pruned, full, pruned: a load that drifts during the run weighs on both sides
    tunes, pruned_seconds = {}, []
    for n, (name, k) in enumerate(((PRUNED, args.k), (FULL, 0), (PRUNED, args.k))):
        before = load()
        seconds, profile, summary = timed_tune(app, folder, f"{name.split()[0]}{n}", k)
        tunes[name] = (seconds, profile)
        if name == PRUNED:
            pruned_seconds.append(seconds)
        print(f"{name:12s} {seconds:6.0f} s  (load average {before:.1f} -> {load():.1f}; "
              f"{summary})", flush=True)
    ratio = statistics.mean(pruned_seconds) / tunes[FULL][0]
    print(f"pruned (mean of the two) / full tune time: {ratio:.2f} (target <= 0.33: "
          f"{'met' if ratio <= 1 / 3 else 'NOT met'})\n", flush=True)

    profiles = {n: Profile.load(p) for n, (_, p) in tunes.items()}
    same = sum(e in profiles[FULL].entries for e in profiles[PRUNED].entries)
    print(f"the full and the second pruned profile agree on {same} of "
          f"{len(profiles[FULL].entries)} entries")
    bundles = {n: write_bundle(app, cpu, profiles[n], folder / n.split()[0]) for n in tunes}
    ids_file = folder / "prompt.json"
    ids_file.write_text(json.dumps(prompt_ids(bundles[FULL])))
    rounds = []
    for n in range(args.rounds):
        done = subprocess.run([sys.executable, __file__, "--child", str(bundles[FULL]),
                               str(bundles[PRUNED]), str(ids_file)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            sys.exit(f"round {n + 1} failed:\n{done.stderr}")
        rounds.append(json.loads(done.stdout.splitlines()[-1]))
        print(f"round {n + 1}/{args.rounds}: " + ", ".join(
            f"{name} {r['decode_tok_s']:.1f} tok/s" for name, r in rounds[-1].items())
            + f" (load average {load():.1f})", flush=True)
    for what in ("decode_tok_s", "prefill_tok_s"):
        ratios = sorted(r[PRUNED][what] / r[FULL][what] for r in rounds)
        print(f"pruned / full {what.split('_')[0]:8s} {statistics.median(ratios):.3f}x "
              f"(rounds {ratios[0]:.3f}-{ratios[-1]:.3f})"
              + (f"; within 2%: {'yes' if abs(statistics.median(ratios) - 1) <= 0.02 else 'NO'}"
                 if what == "decode_tok_s" else ""))


if __name__ == "__main__":
    main()
