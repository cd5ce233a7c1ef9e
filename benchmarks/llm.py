"""iron's Llama bundle against llama.cpp on the same SmolLM2 weights, side by side in one run.

Each round runs both engines, alternating, each in a fresh child process (so peak resident
memory is each engine's own), on the same 128 prompt token ids, greedy, 128 new tokens, 2
threads. llama.cpp (the prebuilt ``xllamacpp`` wheel) reads the weights as an F16 GGUF written
from the same dequantized tensors (``benchmarks/llamacpp.py``). Printed per engine: time to
first token, prefill tokens/s, decode tokens/s, peak RSS (medians over rounds); then the ratios
iron / llama.cpp, decode as a fraction of the bandwidth ceiling measured in the same run
(streaming bandwidth / bytes of bf16 weights), and where iron's decode token goes: time in
kernels per operator against time outside kernels.

    python benchmarks/llm.py [--bundle build/llama/cpu] [--rounds 3] [--dtype F16]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default="build/llama/cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="F16", help="llama.cpp's weight type (F16, BF16, F32)")
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

    bundle = Path(args.bundle)
    ids = prompt_ids(bundle)
    ids_file = bundle.parent / ".bench-prompt.json"
    ids_file.write_text(json.dumps(ids))
    runs = {"iron": [], "llama.cpp": []}
    for round_ in range(args.rounds):
        runs["iron"].append(run_child("iron", str(bundle), "--ids", str(ids_file)))
        runs["llama.cpp"].append(run_child("llamacpp", args.dtype, "--ids", str(ids_file)))
        print(f"round {round_ + 1}/{args.rounds}: iron {runs['iron'][-1]['decode_tok_s']:.1f} "
              f"tok/s, llama.cpp {runs['llama.cpp'][-1]['decode_tok_s']:.1f} tok/s", flush=True)
    bandwidth = streaming_bandwidth(threads=2, mib=1024)  # larger than the L3
    weight_bytes = (bundle / "weights.safetensors").stat().st_size
    ceiling = bandwidth * 1e9 / weight_bytes

    print(f"\nSmolLM2-135M, {len(ids)} prompt tokens, {NEW_TOKENS} new tokens, 2 threads, "
          f"medians of {args.rounds} rounds; llama.cpp weights {args.dtype}, iron bf16")
    print(f"{'engine':10s} {'TTFT ms':>8s} {'prefill tok/s':>14s} {'decode tok/s':>13s} "
          f"{'peak RSS MiB':>13s}")
    for name, rs in runs.items():
        print(f"{name:10s} {median(rs, 'ttft_s') * 1e3:8.1f} {median(rs, 'prefill_tok_s'):14.1f} "
              f"{median(rs, 'decode_tok_s'):13.1f} {median(rs, 'peak_rss_mib'):13.0f}")
    i, l = runs["iron"], runs["llama.cpp"]
    print(f"iron / llama.cpp: decode {median(i, 'decode_tok_s') / median(l, 'decode_tok_s'):.2f}x"
          f", prefill {median(i, 'prefill_tok_s') / median(l, 'prefill_tok_s'):.2f}x, "
          f"TTFT {median(i, 'ttft_s') / median(l, 'ttft_s'):.2f}x (lower is better)")
    same = sum(a == b for a, b in zip(i[0]["token_ids"], l[0]["token_ids"]))
    print(f"greedy tokens identical to llama.cpp's: {same} of {NEW_TOKENS}")
    print(f"bandwidth {bandwidth:.1f} GB/s, bf16 weights {weight_bytes / 1e6:.0f} MB: ceiling "
          f"{ceiling:.1f} tok/s; iron decode at {median(i, 'decode_tok_s') / ceiling:.0%} of it")
    breakdown = i[-1]["breakdown"]
    kernels = sum(breakdown["kernels"].values())
    wall = breakdown["wall_s"]
    print(f"\niron decode token: {wall * 1e3:.2f} ms, in kernels {kernels * 1e3:.2f} ms, outside "
          f"kernels {(wall - kernels) * 1e3:.2f} ms ({(wall - kernels) / wall:.1%})")
    for label, t in breakdown["kernels"].items():
        print(f"  {label:24s} {t * 1e3:7.3f} ms  {t / wall:6.1%}")


if __name__ == "__main__":
    main()
