"""iron's Llama bundle against llama.cpp on the same SmolLM2 weights, side by side in one run.

Each round runs the engines, alternating, each in a fresh child process (so peak resident
memory is each engine's own), on the same 128 prompt token ids, greedy, 128 new tokens, 2
threads. llama.cpp (the prebuilt ``xllamacpp`` wheel) reads ``--dtype``: Q4_1 is the embedded
GGUF file itself, the others a GGUF written from its dequantized tensors
(``benchmarks/llamacpp.py``). ``--also`` adds more iron bundles (e.g. the bf16 bundle built by
``doit weights=bf16``). Printed per engine: time to first token, prefill tokens/s, decode
tokens/s, peak RSS (medians over rounds); then the ratios against llama.cpp, each iron
bundle's decode as a fraction of its bandwidth ceiling (streaming bandwidth measured in the
same run / the weight bytes its decode token streams: every GEMV matrix, one embedding row,
the norms), and where the first bundle's decode token goes: time in kernels per operator
against time outside kernels.

    python benchmarks/llm.py [--bundle build/llama/cpu] [--also build/llama/cpu-bf16]
                             [--rounds 3] [--dtype Q4_1]
"""

from __future__ import annotations

import argparse
import collections
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPT_TOKENS, NEW_TOKENS = 128, 128


def prompt_ids(bundle: Path) -> list[int]:
    from tokenizers import Tokenizer

    sys.path.insert(0, str(HERE))
    from llamacpp import DEFAULT_TEXT

    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    ids = tok.encode(DEFAULT_TEXT * 4, add_special_tokens=False).ids
    return ids[:PROMPT_TOKENS]


def child_iron(bundle: str, ids: list[int]) -> dict:
    from iron.lm.generate import LlamaModel

    return measure_iron(LlamaModel(bundle), ids)


def measure_iron(model, ids: list[int]) -> dict:
    """Generation speed of a loaded ``LlamaModel``, and where a decode token's time goes."""
    import numpy as np

    model.generate(ids, 16, stop_at_eos=False)  # warm-up: page in weights, start threads
    tokens, stats = model.generate(ids, NEW_TOKENS, stop_at_eos=False)
    result = {"ttft_s": stats.time_to_first_token,
              "prefill_tok_s": stats.prefill_tokens_per_second,
              "decode_tok_s": stats.decode_tokens_per_second, "token_ids": tokens}
    # where a decode token goes: each step's kernel time, summed by operator, against the wall
    exe, head = model.decode_exe, model.head_exe
    seconds, head_seconds = np.zeros(len(exe.program.steps)), np.zeros(1)
    model.reset()
    model.prefill(ids)
    n = 64
    start = time.perf_counter()
    for token in tokens[:n]:
        model.decode(token, (seconds, head_seconds))
    wall = (time.perf_counter() - start) / n
    per_op = collections.Counter()
    for step, t in zip(exe.program.steps, seconds):
        op = step.op
        label = type(op).__name__ + (f" {op.M}x{op.K}" if type(op).__name__ == "GEMV" else "")
        per_op[label] += t / n
    per_op[f"GEMV head {head.program.ops[0].M}x{head.program.ops[0].K}"] += head_seconds[0] / n
    result["breakdown"] = {"wall_s": wall, "kernels": dict(per_op.most_common())}
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def abba(bundles: dict[str, str], ids: list[int]) -> dict:
    """One round comparing two bundles of the same weights: both loaded on one read of the first
    one's weights (so neither gets a warmer copy), run A B B A; per bundle the medians of
    decode, prefill and time to first token, the decode step and its per-kernel breakdown."""
    from iron.lm.generate import LlamaModel
    from iron.pipeline.bundle import Bundle

    (a, path_a), (b, path_b) = bundles.items()
    weights = Bundle.open(path_a).weights()
    models = {a: LlamaModel(path_a, weights), b: LlamaModel(path_b, weights)}
    runs = {name: [] for name in models}
    for name in [a, b, b, a]:
        runs[name].append(measure_iron(models[name], ids))
    return {name: {"decode_tok_s": median(rs, "decode_tok_s"),
                   "prefill_tok_s": median(rs, "prefill_tok_s"),
                   "ttft_s": median(rs, "ttft_s"),
                   "step_s": statistics.median(r["breakdown"]["wall_s"] for r in rs),
                   "kernels": {k: statistics.median(r["breakdown"]["kernels"][k] for r in rs)
                               for k in rs[0]["breakdown"]["kernels"]}}
            for name, rs in runs.items()}


def child_llamacpp(dtype: str, ids: list[int]) -> dict:
    sys.path.insert(0, str(HERE))
    from llamacpp import bench

    r = bench(dtype, threads=2, prompt_tokens=len(ids), new_tokens=NEW_TOKENS, repeats=1,
              prompt_token_ids=ids)
    m = r["median"]
    return {"ttft_s": m["ttft_s"], "prefill_tok_s": m["prefill_tok_s"],
            "decode_tok_s": m["decode_tok_s"], "token_ids": r["token_ids"],
            "peak_rss_mib": r["peak_rss_mib"], "model_bytes": r["model_bytes"]}


def run_child(*args: str) -> dict:
    result = subprocess.run([sys.executable, str(Path(__file__)), "--child", *args],
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"child {args[0]} failed:\n{result.stderr}")
    return json.loads(result.stdout.splitlines()[-1])


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def streamed_bytes(bundle: Path) -> int:
    """Weight bytes one decode token reads: the decode and head programs' weights, except
    the embedding table, of which a token reads one row."""
    import numpy as np

    from iron.pipeline.bundle import Bundle

    b = Bundle.open(bundle)
    total = 0
    for name in ("decode", "head"):
        program = b.program(name)
        tables = {s.inputs[0] for s in program.steps if type(s.op).__name__ == "Embedding"}
        for t in program.tensors:
            if t.kind != "weight":
                continue
            nbytes = int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize
            total += nbytes // t.shape[0] if t.index in tables else nbytes
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default="build/llama/cpu")
    parser.add_argument("--also", nargs="*", default=[], help="more iron bundles to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="F16",
                        help="llama.cpp's weight type (Q4_1: the embedded file; F16, BF16, F32)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        engine, what = args.child
        ids = json.loads(Path(args.ids).read_text())
        result = child_iron(what, ids) if engine == "iron" else child_llamacpp(what, ids)
        print(json.dumps(result))
        return

    sys.path.insert(0, str(HERE))
    from bandwidth import streaming_bandwidth

    bundles = [Path(args.bundle), *map(Path, args.also)]
    names = [f"iron {bundle_weights(b)}" for b in bundles]
    ids = prompt_ids(bundles[0])
    ids_file = bundles[0].parent / ".bench-prompt.json"
    ids_file.write_text(json.dumps(ids))
    runs = {n: [] for n in [*names, "llama.cpp"]}
    for round_ in range(args.rounds):
        for name, b in zip(names, bundles):
            runs[name].append(run_child("iron", str(b), "--ids", str(ids_file)))
        runs["llama.cpp"].append(run_child("llamacpp", args.dtype, "--ids", str(ids_file)))
        print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(
            f"{n} {r[-1]['decode_tok_s']:.1f}" for n, r in runs.items()) + " tok/s", flush=True)
    bandwidth = streaming_bandwidth(threads=2, mib=1024)  # larger than the L3

    print(f"\nSmolLM2-135M, {len(ids)} prompt tokens, {NEW_TOKENS} new tokens, 2 threads, "
          f"medians of {args.rounds} rounds; llama.cpp weights {args.dtype}")
    print(f"{'engine':16s} {'TTFT ms':>8s} {'prefill tok/s':>14s} {'decode tok/s':>13s} "
          f"{'peak RSS MiB':>13s}")
    for name, rs in runs.items():
        print(f"{name:16s} {median(rs, 'ttft_s') * 1e3:8.1f} "
              f"{median(rs, 'prefill_tok_s'):14.1f} "
              f"{median(rs, 'decode_tok_s'):13.1f} {median(rs, 'peak_rss_mib'):13.0f}")
    l = runs["llama.cpp"]
    for name, b in zip(names, bundles):
        i = runs[name]
        print(f"{name} / llama.cpp: decode "
              f"{median(i, 'decode_tok_s') / median(l, 'decode_tok_s'):.2f}x, prefill "
              f"{median(i, 'prefill_tok_s') / median(l, 'prefill_tok_s'):.2f}x, TTFT "
              f"{median(i, 'ttft_s') / median(l, 'ttft_s'):.2f}x (lower is better), peak RSS "
              f"{median(i, 'peak_rss_mib') / median(l, 'peak_rss_mib'):.2f}x")
    first = runs[names[0]]
    for name in names[1:]:
        o = runs[name]
        print(f"{names[0]} / {name}: decode "
              f"{median(first, 'decode_tok_s') / median(o, 'decode_tok_s'):.2f}x, prefill "
              f"{median(first, 'prefill_tok_s') / median(o, 'prefill_tok_s'):.2f}x, peak RSS "
              f"{median(first, 'peak_rss_mib') / median(o, 'peak_rss_mib'):.2f}x")
    same = sum(a == b for a, b in zip(first[0]["token_ids"], l[0]["token_ids"]))
    print(f"greedy tokens of {names[0]} identical to llama.cpp's: {same} of {NEW_TOKENS}")
    print(f"bandwidth {bandwidth:.1f} GB/s")
    for name, b in zip(names, bundles):
        streamed = streamed_bytes(b)
        ceiling = bandwidth * 1e9 / streamed
        print(f"  {name}: {streamed / 1e6:.1f} MB streamed per decode token, ceiling "
              f"{ceiling:.1f} tok/s; decode at {median(runs[name], 'decode_tok_s') / ceiling:.0%}"
              " of it")
    breakdown = first[-1]["breakdown"]
    kernels = sum(breakdown["kernels"].values())
    wall = breakdown["wall_s"]
    print(f"\n{names[0]} decode token: {wall * 1e3:.2f} ms, in kernels {kernels * 1e3:.2f} ms, "
          f"outside kernels {(wall - kernels) * 1e3:.2f} ms ({(wall - kernels) / wall:.1%})")
    for label, t in breakdown["kernels"].items():
        print(f"  {label:24s} {t * 1e3:7.3f} ms  {t / wall:6.1%}")


def bundle_weights(bundle: Path) -> str:
    """The bundle's weight mode as its manifest records it (bf16 for bundles before it did)."""
    from iron.pipeline.bundle import Bundle

    return Bundle.open(bundle).meta.get("weights", "bf16")


if __name__ == "__main__":
    main()
