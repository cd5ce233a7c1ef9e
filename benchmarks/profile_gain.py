"""Whole-model decode with the tuned profile against resolve() defaults, side by side.

Builds two SmolLM2 bundles that differ only in their profile (the committed
``profiles/llama/cpu.json``, and an empty one so that every tunable comes from
``Operator.resolve``), then runs them alternately, each in a fresh process, on the same prompt
(``benchmarks/llm.py``'s child), and prints decode tokens/s, TTFT and the ratio.

    python benchmarks/profile_gain.py [--rounds 3]
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import iron
from iron.build.app import app_profile, load_app
from iron.build.bundle import write_bundle
from iron.paths import build_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm import prompt_ids, run_child  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    app = load_app("llama")
    cpu = iron.device("cpu")
    bundles = {
        "tuned profile": write_bundle(app, cpu, app_profile("llama", "cpu"),
                                      build_dir() / "bench" / "tuned"),
        "resolve() defaults": write_bundle(app, cpu, iron.Profile(device="cpu"),
                                           build_dir() / "bench" / "defaults"),
    }
    ids_file = build_dir() / "bench" / "prompt.json"
    ids_file.write_text(json.dumps(prompt_ids(next(iter(bundles.values())))))
    runs = {name: [] for name in bundles}
    for round_ in range(args.rounds):
        for name, bundle in bundles.items():
            runs[name].append(run_child("iron", str(bundle), "--ids", str(ids_file)))
        print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(
            f"{n} {r[-1]['decode_tok_s']:.1f} tok/s" for n, r in runs.items()), flush=True)
    med = {n: {k: statistics.median(r[k] for r in rs) for k in ("decode_tok_s", "ttft_s")}
           for n, rs in runs.items()}
    for name, m in med.items():
        print(f"{name:20s} decode {m['decode_tok_s']:6.1f} tok/s  TTFT {m['ttft_s'] * 1e3:6.1f} ms")
    tuned, default = med["tuned profile"], med["resolve() defaults"]
    print(f"tuned / defaults: decode {tuned['decode_tok_s'] / default['decode_tok_s']:.2f}x, "
          f"TTFT {tuned['ttft_s'] / default['ttft_s']:.2f}x (lower is better)")


if __name__ == "__main__":
    main()
