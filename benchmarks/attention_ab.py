"""Decode attention as two source trees compile it, timed in one process, its caches cold.

In a decode step each layer's attention reads its KV cache after that layer's GEMVs have
streamed their weights, so the cache comes from memory. Here a 1B Llama's decode attention (32
query heads, 8 KV heads of 64, one row) runs over 16 layers' caches, each call after a q4_0
GEMV of 16384 x 2048 on its own weights, the trees taking turns round after round; printed per
position: each tree's median milliseconds for the 16 layers and the KV cache's GB/s.

    python benchmarks/attention_ab.py --tree before=/path/to/old/checkout --tree after=.
        [--positions 127 1023 4095] [--march x86-64-v3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

from iron.memory import huge_page_copy
from iron.operators import GEMV, Attention
from iron.targets import cpu

from qkernel_ab import BF16, One, args_of, build, weight

LAYERS, HEADS, KV_HEADS, HEAD_DIM, CTX = 16, 32, 8, 64, 8192


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=DIR",
                        help="a checkout whose iron/kernels/cpu to compile (twice or more)")
    parser.add_argument("--positions", type=int, nargs="+", default=[127, 1023, 4095])
    parser.add_argument("--march", help="compile for this -march instead of the host's")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    if len(trees) < 2:
        parser.error("--tree NAME=DIR at least twice")
    if args.march:
        host_flags = cpu.flags
        cpu.flags = lambda: host_flags(args.march)
    rng = np.random.default_rng(0)
    folder = tempfile.mkdtemp()
    caches = [[huge_page_copy(np.full((KV_HEADS, CTX, HEAD_DIM), 0.01, BF16)) for _ in "kv"]
              for _ in range(LAYERS)]
    q = rng.standard_normal((1, HEADS * HEAD_DIM)).astype(BF16)
    out = np.zeros_like(q)
    weights = [huge_page_copy(weight("q4_0", 16384, 2048, rng)) for _ in range(LAYERS)]
    x = rng.standard_normal((1, 2048)).astype(BF16)
    gemv_out = np.zeros((1, 16384), BF16)
    gemv_op = One(GEMV, {"weight_format": "q4_0", "group_size": 32}).record_like(
        [weights[0], x]).ops[0]
    gemv = next(iter(build(gemv_op, {"gemv": "."}, folder).values()))
    gemv_args = [args_of([w, x, gemv_out]) for w in weights]
    for position in args.positions:
        pos = np.array([position], np.int32)
        op = One(Attention, {}).record_like([q, *caches[0], pos]).ops[0]
        kernels = build(op, trees, folder)
        calls = [args_of([q, k, v, pos, out]) for k, v in caches]
        times = {name: [] for name in trees}
        for r in range(args.rounds + 1):  # the first round warms up, uncounted
            for name in (list(trees) if r % 2 else list(trees)[::-1]):
                total = 0.0
                for layer in range(LAYERS):
                    gemv(gemv_args[layer])
                    start = time.perf_counter()
                    kernels[name](calls[layer])
                    total += time.perf_counter() - start
                if r:
                    times[name].append(total)
        kv = LAYERS * 2 * KV_HEADS * (position + 1) * HEAD_DIM * 2
        print(f"{position + 1} positions ({kv / 1e6:.0f} MB of KV cache): " + "  ".join(
            f"{name} {statistics.median(t) * 1e3:.2f} ms ({kv / statistics.median(t) / 1e9:.1f}"
            f" GB/s)" for name, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
