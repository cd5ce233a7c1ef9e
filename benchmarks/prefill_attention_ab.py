"""Prefill attention over a long cached history as two source trees compile it, one thread,
timed in CPU time in one process (so a shared machine's load moves both alike).

A chat's next turn prefills its new tokens after the whole conversation already in the KV
cache: a chunk of query rows, each attending to every cached position before it. Here a
64-row chunk at position 1508 (a chat's turn 8 on SmolLM2: 9 query heads over 3 KV heads of
64, and a 1B Llama's 32 over 8), one decode row at 1600 and a short prompt's 32 rows at 60 run
from each tree in turn, round after round; printed per shape: each tree's median and best
milliseconds per call, and their ratio.

    python benchmarks/prefill_attention_ab.py --tree before=/path/to/old/checkout --tree after=.
        [--rounds 21]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

from iron.operators import Attention

from qkernel_ab import BF16, One, args_of, build

CTX, HEAD_DIM = 8192, 64
#: (query heads, KV heads, rows, the first row's position)
SHAPES = ((9, 3, 64, 1508), (32, 8, 64, 1508), (9, 3, 1, 1600), (9, 3, 32, 60))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=DIR",
                        help="a checkout whose iron/kernels/cpu to compile (twice or more)")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    if len(trees) < 2:
        parser.error("--tree NAME=DIR at least twice")
    rng = np.random.default_rng(0)
    folder = tempfile.mkdtemp()
    for heads, kv_heads, rows, position in SHAPES:
        k, v = (rng.standard_normal((kv_heads, CTX, HEAD_DIM)).astype(BF16) for _ in "kv")
        q = rng.standard_normal((rows, heads * HEAD_DIM)).astype(BF16)
        pos = np.arange(position, position + rows, dtype=np.int32)
        out = np.zeros_like(q)
        op = One(Attention, {"tile_size": 128, "num_aie_columns": 1}).record_like(
            [q, k, v, pos]).ops[0]
        kernels = build(op, trees, folder)
        call = args_of([q, k, v, pos, out])
        repeat = max(1, 20 // rows)  # calls per timing: a decode row is 40 us
        times = {name: [] for name in trees}
        for r in range(args.rounds + 1):  # the first round warms up, uncounted
            for name in (list(trees) if r % 2 else list(trees)[::-1]):
                start = time.process_time()
                for _ in range(repeat):
                    kernels[name](call)
                if r:
                    times[name].append((time.process_time() - start) / repeat)
        first, *others = trees
        print(f"{rows} rows at {position}, {heads} heads / {kv_heads} KV heads: " + "  ".join(
            f"{name} {statistics.median(t) * 1e3:.3f} ms (best {min(t) * 1e3:.3f})"
            for name, t in times.items()) + "  " + "  ".join(
            f"{name}/{first} {statistics.median(times[name]) / statistics.median(times[first]):.2f}"
            for name in others), flush=True)


if __name__ == "__main__":
    main()
