"""iron's Llama bundle against llama.cpp on the same SmolLM2 weights, side by side in one run.

Each round runs the engines, alternating, each in a fresh child process (so peak resident
memory is each engine's own), on the same 128 prompt token ids, greedy, 128 new tokens, 2
threads. llama.cpp (the prebuilt ``xllamacpp`` wheel) reads ``--dtype``: Q4_1 is the embedded
GGUF file itself, the others a GGUF written from its dequantized tensors
(``benchmarks/llamacpp.py``). ``--also`` adds more iron bundles (e.g. the bf16 bundle built by
``doit weights=bf16``). Printed per engine: time to first token, prefill tokens/s, decode
tokens/s, peak RSS (medians over rounds); then the ratios against llama.cpp, each iron
bundle's decode as a fraction of its bandwidth ceiling (streaming bandwidth / the weight bytes
its decode token streams: every GEMV matrix, one embedding row, the norms; the bandwidth is
probed at the start of every round and each round's decode is set against its own round's
probe, since this figure moves between rounds on a shared host), and where the first bundle's
decode token goes: time in kernels per operator against time outside kernels (with
``--gguf``, also where a prompt's prefill goes, per operator and shape).

    python benchmarks/llm.py [--bundle build/llama/cpu] [--also build/llama/cpu-bf16]
                             [--rounds 3] [--dtype Q4_1]

``--gguf FILE`` compares three engines on one GGUF file instead (e.g. one written by
``benchmarks/make_gguf.py``): iron (a bundle built from the file: ``python -m
iron.lm.gguf_import`` then ``doit checkpoint=DIR``, unless ``--bundle`` names one), llama.cpp
and OpenVINO GenAI (``openvino-genai``, which loads GGUF files directly), in interleaved
rounds, each engine in a fresh process (per round, time to first token and prefill are the
median of the timed generation and three prefills of the prompt rotated, whose rate alone
varies by up to 10% between runs); the same figures per engine, plus the bandwidth probe
and the ceiling of iron's decode, written to ``benchmarks/results/`` with the date, the host's
CPU, ISA flags and bandwidth, and the command:

    python benchmarks/llm.py --gguf build/gguf/llama-1b-Q4_0.gguf [--rounds 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
PROMPT_TOKENS, NEW_TOKENS = 128, 128
# one timed prefill varies by up to 10% between runs: each child also times this many prefills
# of the prompt rotated (the same tokens, no prefix shared with the others, so no engine's
# prefix cache serves them) and reports the medians of time to first token and prefill rate
PREFILL_SAMPLES = 3
# every engine's threads and the bandwidth probe's: --threads, passed to the children as iron's
# own $IRON_THREADS
THREADS = int(os.environ.get("IRON_THREADS", "2"))


def prompt_ids(bundle: Path) -> list[int]:
    from tokenizers import Tokenizer

    sys.path.insert(0, str(HERE))
    from llamacpp import DEFAULT_TEXT

    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    ids = tok.encode(DEFAULT_TEXT * 4, add_special_tokens=False).ids
    return ids[:PROMPT_TOKENS]


def rotations(ids: list[int]) -> list[list[int]]:
    """The prompts of the extra prefill samples: ``ids`` rotated by 1, 2, ... tokens."""
    return [ids[i:] + ids[:i] for i in range(1, PREFILL_SAMPLES + 1)]


def with_prefill_samples(result: dict, samples: list[tuple[float, int]]) -> dict:
    """``result`` (one timed generation) with ``ttft_s`` and ``prefill_tok_s`` replaced by the
    medians over it and ``samples`` (time to first token, prompt tokens)."""
    ttfts = [result["ttft_s"]] + [t for t, _ in samples]
    rates = [result["prefill_tok_s"]] + [n / t for t, n in samples]
    return {**result, "ttft_s": statistics.median(ttfts),
            "prefill_tok_s": statistics.median(rates)}


def child_iron(bundle: str, ids: list[int]) -> dict:
    from iron.lm.generate import LanguageModel

    return measure_iron(LanguageModel(bundle), ids)


def measure_iron(model, ids: list[int]) -> dict:
    """Generation speed of a loaded ``LanguageModel``, and where a decode token's time goes."""
    import numpy as np

    model.generate(ids, 16, stop_at_eos=False)  # warm-up: page in weights, start threads
    samples = [(model.generate(p, 1)[1].time_to_first_token, len(p)) for p in rotations(ids)]
    tokens, stats = model.generate(ids, NEW_TOKENS, stop_at_eos=False)
    result = with_prefill_samples({"ttft_s": stats.time_to_first_token,
                                   "prefill_tok_s": stats.prefill_tokens_per_second,
                                   "decode_tok_s": stats.decode_tokens_per_second,
                                   "token_ids": tokens}, samples)
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
    result["breakdown"] = breakdown({exe: seconds, head: head_seconds}, head, wall, n)
    # and where a prompt's prefill goes (its chunks' programs and the head on the last row)
    seconds = {e: np.zeros(len(e.program.steps))
               for e in (model.prefill_exe, model.tail_exe, head)}
    start = time.perf_counter()
    for _ in range(PREFILL_SAMPLES):
        model.reset()
        model.prefill(ids, seconds)
    wall = (time.perf_counter() - start) / PREFILL_SAMPLES
    result["prefill_breakdown"] = breakdown(seconds, head, wall, PREFILL_SAMPLES)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def breakdown(seconds: dict, head, wall: float, n: int) -> dict:
    """Per-step kernel seconds of ``n`` runs (per executable) summed by operator and shape,
    per run, most first, with the wall time of a run."""
    per_op = collections.Counter()
    for exe, times in seconds.items():
        for step, t in zip(exe.program.steps, times):
            op, name = step.op, type(step.op).__name__
            label = (f"GEMV {'head ' if exe is head else ''}{op.M}x{op.K}" if name == "GEMV"
                     else f"GEMM {op.N}x{op.K}" if name == "GEMM" else name)
            per_op[label] += t / n
    return {"wall_s": wall, "kernels": dict(per_op.most_common())}


def abba(bundles: dict[str, str], ids: list[int]) -> dict:
    """One round comparing two bundles of the same weights: both loaded on one read of the first
    one's weights (so neither gets a warmer copy), run A B B A; per bundle the medians of
    decode, prefill and time to first token, the decode step and its per-kernel breakdown."""
    from iron.lm.generate import LanguageModel
    from iron.pipeline.bundle import Bundle

    (a, path_a), (b, path_b) = bundles.items()
    weights = Bundle.open(path_a).weights()
    models = {a: LanguageModel(path_a, weights), b: LanguageModel(path_b, weights)}
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

    r = bench(dtype, threads=THREADS, prompt_tokens=len(ids), new_tokens=NEW_TOKENS, repeats=1,
              prompt_token_ids=ids)
    m = r["median"]
    return {"ttft_s": m["ttft_s"], "prefill_tok_s": m["prefill_tok_s"],
            "decode_tok_s": m["decode_tok_s"], "token_ids": r["token_ids"],
            "peak_rss_mib": r["peak_rss_mib"], "model_bytes": r["model_bytes"]}


def child_llamacpp_file(path: str, ids: list[int]) -> dict:
    """llama.cpp on a GGUF file: one warm-up generation, then one timed."""
    sys.path.insert(0, str(HERE))
    from llamacpp import LlamaCpp, peak_rss_mib

    with LlamaCpp(path, n_threads=THREADS, n_ctx=len(ids) + NEW_TOKENS + 16) as llm:
        llm.generate(ids, 16, return_ids=False)
        samples = [(llm.generate(p, 1, return_ids=False)["ttft_s"], len(p))
                   for p in rotations(ids)]
        r = llm.generate(ids, NEW_TOKENS)
    if "decode_tok_s" not in r:
        raise SystemExit(f"llama.cpp streamed {r['n_streamed']} tokens of {NEW_TOKENS} from {path}")
    return with_prefill_samples({"ttft_s": r["ttft_s"], "prefill_tok_s": r["prefill_tok_s"],
                                 "decode_tok_s": r["decode_tok_s"], "token_ids": r["token_ids"],
                                 "peak_rss_mib": peak_rss_mib()}, samples)


def child_openvino(path: str, ids: list[int]) -> dict:
    """OpenVINO GenAI's LLMPipeline on a GGUF file (it reads GGUF directly), greedy, from the
    same token ids: one warm-up generation, then one timed; its own perf metrics (time to first
    token, time per output token)."""
    import numpy as np
    import openvino
    import openvino_genai

    pipe = openvino_genai.LLMPipeline(path, "CPU", INFERENCE_NUM_THREADS=THREADS)
    config = openvino_genai.GenerationConfig()
    config.do_sample, config.ignore_eos = False, True
    def inputs(tokens: list[int]):
        t = np.array([tokens], np.int64)
        return openvino_genai.TokenizedInputs(openvino.Tensor(t), openvino.Tensor(np.ones_like(t)))

    # the warm-up prompt shares no prefix with the timed one: the pipeline caches prefixes
    config.max_new_tokens = 16
    pipe.generate(inputs(ids[::-1]), config)
    config.max_new_tokens = 1
    samples = [(pipe.generate(inputs(p), config).perf_metrics.get_ttft().mean / 1e3, len(p))
               for p in rotations(ids)]
    config.max_new_tokens = NEW_TOKENS
    r = pipe.generate(inputs(ids), config)
    m = r.perf_metrics
    ttft = m.get_ttft().mean / 1e3
    return with_prefill_samples(
        {"ttft_s": ttft, "prefill_tok_s": len(ids) / ttft,
         "decode_tok_s": 1e3 / m.get_tpot().mean, "token_ids": [int(t) for t in r.tokens[0]],
         "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}, samples)


CHILDREN = {"iron": lambda what, ids: child_iron(what, ids), "llamacpp": child_llamacpp,
            "llamacpp-file": child_llamacpp_file, "openvino": child_openvino}


def run_child(*args: str) -> dict:
    result = subprocess.run([sys.executable, str(Path(__file__)), "--child", *args],
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"child {args[0]} failed:\n{result.stderr}")
    return json.loads(result.stdout.splitlines()[-1])


def ceiling_share(runs: list[dict], probes: list[float], streamed: int) -> str:
    """Decode as a share of the bandwidth ceiling, each round against the probe taken in that
    round (this host's bandwidth moves between rounds), and the median of those shares."""
    shares = [r["decode_tok_s"] * streamed / (gb_s * 1e9) for r, gb_s in zip(runs, probes)]
    return (f"decode at {statistics.median(shares):.0%} of the ceiling (median of rounds; "
            f"per round {', '.join(f'{x:.0%}' for x in shares)})")


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
    global THREADS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", help="iron's bundle (default build/llama/cpu; with --gguf, "
                        "the one built from the file)")
    parser.add_argument("--also", nargs="*", default=[], help="more iron bundles to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="F16",
                        help="llama.cpp's weight type (Q4_1: the embedded file; F16, BF16, F32)")
    parser.add_argument("--gguf", type=Path, help="compare iron, llama.cpp and OpenVINO GenAI "
                        "on this GGUF file (iron's bundle: --bundle, else built from the file)")
    parser.add_argument("--threads", type=int, default=THREADS,
                        help="threads of every engine and of the bandwidth probe (default 2)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    THREADS = args.threads
    os.environ["IRON_THREADS"] = str(THREADS)
    os.environ["OMP_THREAD_LIMIT"] = str(THREADS)  # caps a bundle built for more cores
    if args.child:
        engine, what = args.child
        ids = json.loads(Path(args.ids).read_text())
        print(json.dumps(CHILDREN[engine](what, ids)))
        return
    if args.gguf:
        compare_gguf(args)
        return

    sys.path.insert(0, str(HERE))
    from bandwidth import streaming_bandwidth

    bundles = [Path(args.bundle or "build/llama/cpu"), *map(Path, args.also)]
    # a bundle by its folder (cpu, cpu-x86-64-v3-1t, ...) and its weight mode
    names = [f"iron {b.resolve().name} {bundle_weights(b)}" for b in bundles]
    ids = prompt_ids(bundles[0])
    ids_file = bundles[0].parent / ".bench-prompt.json"
    ids_file.write_text(json.dumps(ids))
    runs = {n: [] for n in [*names, "llama.cpp"]}
    probes = []
    engines = {**{name: ("iron", str(b)) for name, b in zip(names, bundles)},
               "llama.cpp": ("llamacpp", args.dtype)}
    for round_ in range(args.rounds):
        probes.append(streaming_bandwidth(threads=THREADS, mib=1024))  # larger than the L3
        # the engines take turns at running first, right after the probe's gigabyte: in a
        # fixed order one engine would take whatever that place costs or gains in every round
        turn = round_ % len(engines)
        for name in [*engines][turn:] + [*engines][:turn]:
            runs[name].append(run_child(*engines[name], "--ids", str(ids_file)))
        print(f"round {round_ + 1}/{args.rounds}: bandwidth {probes[-1]:.1f} GB/s, " + ", ".join(
            f"{n} {r[-1]['decode_tok_s']:.1f}" for n, r in runs.items()) + " tok/s", flush=True)
    bandwidth = statistics.median(probes)

    print(f"\nSmolLM2-135M, {len(ids)} prompt tokens, {NEW_TOKENS} new tokens, {THREADS} threads, "
          f"medians of {args.rounds} rounds; llama.cpp weights {args.dtype}")
    width = max(16, *map(len, runs))
    print(f"{'engine':{width}s} {'TTFT ms':>8s} {'prefill tok/s':>14s} {'decode tok/s':>13s} "
          f"{'peak RSS MiB':>13s}")
    for name, rs in runs.items():
        print(f"{name:{width}s} {median(rs, 'ttft_s') * 1e3:8.1f} "
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
    print(f"bandwidth {bandwidth:.1f} GB/s ({THREADS} threads; median of one probe per round, "
          f"{min(probes):.1f}-{max(probes):.1f})")
    for name, b in zip(names, bundles):
        streamed = streamed_bytes(b)
        print(f"  {name}: {streamed / 1e6:.1f} MB streamed per decode token, ceiling "
              f"{bandwidth * 1e9 / streamed:.1f} tok/s; "
              + ceiling_share(runs[name], probes, streamed))
    breakdown = first[-1]["breakdown"]
    kernels = sum(breakdown["kernels"].values())
    wall = breakdown["wall_s"]
    print(f"\n{names[0]} decode token: {wall * 1e3:.2f} ms, in kernels {kernels * 1e3:.2f} ms, "
          f"outside kernels {(wall - kernels) * 1e3:.2f} ms ({(wall - kernels) / wall:.1%})")
    for label, t in breakdown["kernels"].items():
        print(f"  {label:24s} {t * 1e3:7.3f} ms  {t / wall:6.1%}")


def bundle_from_gguf(path: Path) -> Path:
    """iron's bundle of a GGUF file, built through the normal path: the file converted to a
    checkpoint folder, then ``doit checkpoint=DIR``; the bundle folder as doit reports it."""
    checkpoint = REPO / "build" / "checkpoints" / path.stem
    subprocess.run([sys.executable, "-m", "iron.lm.gguf_import", "--gguf", str(path), "--out",
                    str(checkpoint)], check=True, cwd=REPO)
    doit = Path(sys.executable).with_name("doit")
    result = subprocess.run([str(doit), f"checkpoint={checkpoint}"], cwd=REPO,
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"doit checkpoint={checkpoint} failed:\n{result.stdout}{result.stderr}")
    found = re.findall(r"^bundle written to (.+)$", result.stdout, re.M)
    if found:
        return Path(found[-1].strip())
    # up to date: doit wrote nothing; the bundle of this checkpoint is the newest one naming it
    from iron.pipeline.bundle import Bundle

    named = [b for b in (REPO / "build" / "llama").glob("cpu-*")
             if (b / "manifest.json").is_file()
             and Bundle.open(b).meta.get("model_name") == checkpoint.name]
    if not named:
        sys.exit(f"doit checkpoint={checkpoint} reported no bundle; pass --bundle")
    return max(named, key=lambda b: (b / "manifest.json").stat().st_mtime)


def host_facts() -> dict:
    """The host a result was measured on: CPU model, the ISA flags that pick kernels, cores."""
    from iron import host

    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
              "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
    return {"cpu": host.model(), "isa": [f for f in wanted if f in host.features()],
            "cores": os.cpu_count()}


def compare_gguf(args) -> None:
    """iron, llama.cpp and OpenVINO GenAI on one GGUF file, interleaved rounds; a results file."""
    sys.path.insert(0, str(HERE))
    from bandwidth import streaming_bandwidth

    path = args.gguf.resolve()
    if not path.is_file():
        sys.exit(f"--gguf {args.gguf}: no such file")
    bundle = Path(args.bundle) if args.bundle else bundle_from_gguf(path)
    ids = prompt_ids(bundle)
    ids_file = bundle.parent / ".bench-prompt.json"
    ids_file.write_text(json.dumps(ids))
    engines = {"iron": ("iron", str(bundle)), "llama.cpp": ("llamacpp-file", str(path)),
               "OpenVINO GenAI": ("openvino", str(path))}
    runs = {name: [] for name in engines}
    probes = []
    for round_ in range(args.rounds):
        probes.append(streaming_bandwidth(threads=THREADS, mib=1024))
        order = list(engines) if round_ % 2 == 0 else list(reversed(engines))
        for name in order:
            runs[name].append(run_child(*engines[name], "--ids", str(ids_file)))
        print(f"round {round_ + 1}/{args.rounds}: bandwidth {probes[-1]:.1f} GB/s, " + ", ".join(
            f"{n} {r[-1]['decode_tok_s']:.1f}" for n, r in runs.items()) + " decode tok/s",
            flush=True)
    bandwidth = statistics.median(probes)
    streamed = streamed_bytes(bundle)
    ceiling = bandwidth * 1e9 / streamed
    lines = [f"{path.name} ({path.stat().st_size / 1e6:.1f} MB), {len(ids)} prompt tokens, "
             f"{NEW_TOKENS} new, greedy, {THREADS} threads, medians of {args.rounds} "
             f"interleaved rounds, each engine in its own process (TTFT and prefill: per round "
             f"the median of {PREFILL_SAMPLES + 1} prompts, the prompt rotated)", "",
             "| engine | TTFT ms | prefill tok/s | decode tok/s | peak RSS MiB |",
             "|---|---|---|---|---|"]
    for name, rs in runs.items():
        lines.append(f"| {name} | {median(rs, 'ttft_s') * 1e3:.1f} | "
                     f"{median(rs, 'prefill_tok_s'):.1f} | {median(rs, 'decode_tok_s'):.1f} | "
                     f"{median(rs, 'peak_rss_mib'):.0f} |")
    iron_runs = runs["iron"]
    lines.append("")
    for name in list(engines)[1:]:
        o = runs[name]
        lines.append(f"iron / {name}: decode "
                     f"{median(iron_runs, 'decode_tok_s') / median(o, 'decode_tok_s'):.2f}x, "
                     f"prefill {median(iron_runs, 'prefill_tok_s') / median(o, 'prefill_tok_s'):.2f}x")
    lines.append(f"bandwidth {bandwidth:.1f} GB/s ({THREADS} threads; median of one probe per "
                 f"round, {min(probes):.1f}-{max(probes):.1f}); a decode token streams "
                 f"{streamed / 1e6:.1f} MB of iron's bundle: ceiling {ceiling:.1f} tok/s")
    for name, rs in runs.items():
        lines.append(f"- {name}: " + ceiling_share(rs, probes, streamed))
    for what, key in (("decode token", "breakdown"), (f"prefill of {len(ids)} tokens",
                                                      "prefill_breakdown")):
        b = iron_runs[-1][key]
        kernels = sum(b["kernels"].values())
        lines += ["", f"iron's {what} (last round, per-step clocks): {b['wall_s'] * 1e3:.2f} ms, "
                  f"in kernels {kernels * 1e3:.2f} ms", "", "| operator | ms | share |",
                  "|---|---|---|"]
        lines += [f"| {k} | {t * 1e3:.3f} | {t / kernels:.1%} |" for k, t in b["kernels"].items()]
    print("\n" + "\n".join(lines))
    write_result(f"llm-{path.stem}", lines, bandwidth,
                 {"runs": runs, "probes_gb_s": probes, "bundle": str(bundle)})


def write_result(name: str, lines: list[str], bandwidth: float, data: dict) -> Path:
    """benchmarks/results/<date>-<name>.md: the figures with the date, the host and the
    command, and the raw runs as JSON beside it (both written atomically)."""
    from iron.util import atomic_write_bytes

    stamp = time.strftime("%Y-%m-%d-%H%M", time.gmtime())
    facts = host_facts()
    head = [f"# {name}", "", f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            f"- host: {facts['cpu']}, {facts['cores']} cores, ISA {' '.join(facts['isa'])}, "
            f"streaming bandwidth {bandwidth:.1f} GB/s",
            f"- load average as the run ended: {os.getloadavg()[0]:.1f} (a shared machine when "
            "well above 0)",
            f"- command: `python {' '.join(sys.argv)}`", ""]
    out = RESULTS / f"{stamp}-{name}.md"
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, ("\n".join(head + lines) + "\n").encode())
    atomic_write_bytes(out.with_suffix(".json"), json.dumps(
        {"host": facts, "bandwidth_gb_s": bandwidth, "command": sys.argv, **data},
        indent=1).encode())
    print(f"written {out}")
    return out


def bundle_weights(bundle: Path) -> str:
    """The bundle's weight mode as its manifest records it (bf16 for bundles before it did)."""
    from iron.pipeline.bundle import Bundle

    return Bundle.open(bundle).meta.get("weights", "bf16")


if __name__ == "__main__":
    main()
