"""Whole-model speed with the tuned profile against resolve() defaults, side by side.

Builds two SmolLM2 bundles that differ only in their profile (the committed profile of this
host class, ``profiles/llama/cpu-<class>.json`` — ``IRON_THREADS=1`` and
``IRON_MARCH=x86-64-v3`` select another class, see ``iron.host.class_name`` — or ``--profile
FILE``, and an empty one so that every tunable comes from ``iron.resolve``).  Each round is a fresh process that loads both and runs them alternately
(ABBA) on the same prompt, measuring as ``benchmarks/llm.py`` does.  Both models read one copy
of the weights in memory: when each mapped its own file, the two copies landed on different
physical pages, and that alone moved a kernel by 17% between identical bundles on this machine —
more than tuning moves.

Prints each side's decode and prefill tokens/s, the per-round ratios tuned / defaults (the two
runs of a round share the machine's state of the moment, so their ratio is steadier than either
figure), how many rounds each side won, and each operator's kernel time per decode token.  The
output is also written to ``benchmarks/results/<date>-profile-gain-<class>.md`` with the host
and the command (``--results DIR`` elsewhere, ``--results ''`` not at all).

    python benchmarks/profile_gain.py [--rounds 6] [--profile FILE]
    IRON_THREADS=1 python benchmarks/profile_gain.py      # the 1-thread class's profile
"""

import argparse
import datetime
import io
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import iron
from iron import host
from iron.paths import build_dir
from iron.pipeline.app import app_profile, load_app, profile_path
from iron.pipeline.bundle import write_bundle
from iron.util import atomic_write_bytes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm import abba, median, prompt_ids  # noqa: E402

TUNED, DEFAULTS = "tuned profile", "resolve() defaults"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--profile", help="the tuned profile (default: this host class's)")
    parser.add_argument("--results", default=str(Path(__file__).parent / "results"),
                        help="folder for the results file ('' writes none)")
    parser.add_argument("--note", default="", help="a line about the machine's state, e.g. "
                        "'shared machine, noisy'")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        tuned, defaults, ids_file = args.child
        ids = json.loads(Path(ids_file).read_text())
        print(json.dumps(abba({TUNED: tuned, DEFAULTS: defaults}, ids)))
        return
    app = load_app("llama")
    cpu = iron.device("cpu")
    path = Path(args.profile) if args.profile else profile_path("llama", "cpu")
    profile = iron.Profile.load(path) if args.profile else app_profile("llama", "cpu")
    text = io.StringIO()

    def say(line=""):
        print(line, flush=True)
        text.write(line + "\n")

    klass = host.class_name()
    missing = "" if path.exists() else ": no such file, so the defaults against themselves"
    say(f"profile: {path} ({len(profile)} entries{missing})")
    tuned = write_bundle(app, cpu, profile, build_dir() / "bench" / "tuned")
    defaults = write_bundle(app, cpu, iron.Profile(device="cpu"),
                            build_dir() / "bench" / "defaults")
    ids_file = build_dir() / "bench" / "prompt.json"
    ids_file.write_text(json.dumps(prompt_ids(tuned)))
    rounds, loads = [], []
    for n in range(args.rounds):
        done = subprocess.run([sys.executable, __file__, "--child", str(tuned), str(defaults),
                               str(ids_file)], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"round {n + 1} failed:\n{done.stderr}")
        rounds.append(json.loads(done.stdout.splitlines()[-1]))
        loads.append(os.getloadavg()[0])
        say(f"round {n + 1}/{args.rounds}: " + ", ".join(
            f"{name} {r['decode_tok_s']:.1f} tok/s" for name, r in rounds[-1].items())
            + f" (load average {loads[-1]:.1f})")
    for name in (TUNED, DEFAULTS):
        rs = [r[name] for r in rounds]
        say(f"{name:20s} decode {median(rs, 'decode_tok_s'):6.1f} tok/s  prefill "
            f"{median(rs, 'prefill_tok_s'):6.1f} tok/s  "
            f"TTFT {median(rs, 'ttft_s') * 1e3:6.1f} ms")
    speeds = {"decode tokens/s": lambda r: r["decode_tok_s"],
              "prefill tokens/s": lambda r: r["prefill_tok_s"],
              "decode step (1 / wall time)": lambda r: 1 / r["step_s"]}
    say("\ntuned / defaults, the median of the per-round ratios:")
    for what, speed in speeds.items():
        ratios = sorted(speed(r[TUNED]) / speed(r[DEFAULTS]) for r in rounds)
        say(f"  {what:28s} {statistics.median(ratios):.3f}x (range {ratios[0]:.3f}-"
            f"{ratios[-1]:.3f}, tuned ahead in {sum(x > 1 for x in ratios)} of {len(ratios)})")
    say("\nkernel time per decode token, by operator (microseconds, median over rounds):")
    say(f"  {'operator':22s} {'defaults':>9s} {'tuned':>9s} {'gain':>6s}")
    for label in rounds[0][DEFAULTS]["kernels"]:
        d, t = (statistics.median(r[name]["kernels"][label] for r in rounds) * 1e6
                for name in (DEFAULTS, TUNED))
        if max(d, t) >= 50:  # the operators that matter to a token
            say(f"  {label:22s} {d:9.0f} {t:9.0f} {d / t:5.2f}x")
    if args.results:
        save(Path(args.results), klass, path, args, text.getvalue(), loads)


def save(folder: Path, klass: str, path: Path, args, text: str, loads) -> None:
    """The results file: date, host, command, then the output as printed."""
    today = datetime.date.today().isoformat()
    command = " ".join(f"{k}={os.environ[k]}" for k in ("IRON_THREADS", "IRON_MARCH")
                       if os.environ.get(k))
    command = (command + " " if command else "") + "python benchmarks/profile_gain.py " + \
        " ".join(a for a in sys.argv[1:])
    doc = (f"# Tuned profile against resolve() defaults, host class {klass}\n\n"
           f"Date: {today}. Host: {host.model()}, {host.usable_cores()} usable cores, "
           f"-march={host.march()} (class {klass}); load average {min(loads):.1f}-"
           f"{max(loads):.1f} during the rounds." + (f" {args.note}." if args.note else "")
           + f"\nProfile: `{path.name}`. Command: `{command.strip()}`\n\n```\n{text}```\n")
    target = folder / f"{today}-profile-gain-{klass}.md"
    atomic_write_bytes(target, doc.encode())
    print(f"\nwritten to {target}")


if __name__ == "__main__":
    main()
