"""A chat's turn 8 against its turn 1, prefill only, in process: what the prompt cache leaves
of a turn's time to first token as the history grows.

With the cache, turn 8 of ``benchmarks/chat.py`` prefills its 91 new tokens after 1508 kept
ones (each new token attends to all of them), turn 1 its 101 tokens from position 0. This
times both on one slot of a bundle (``SlotModel.prefill_part`` chunk by chunk, then the head,
as the server's engine does), alternating, and prints the medians and turn 8 over turn 1.
Build the bundle with one thread (``doit bundle threads=1``) and keep the default CPU-time
clock, and a shared machine's load moves both turns alike; ``--wall`` times a many-thread
bundle on a quiet one. The server's own steps (template, tokenizer, HTTP) are not in it.

    python benchmarks/chat_prefill.py --bundle build/llama/cpu-1t [--rounds 9] [--wall]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from iron.lm.batch import SlotModel

REPO = Path(__file__).resolve().parents[1]
TURN1, KEPT, NEW = 101, 1508, 91  # benchmarks/chat.py's first and eighth turns


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=REPO / "build/llama/cpu-1t")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--wall", action="store_true", help="wall time instead of CPU time")
    args = parser.parse_args()
    clock = time.perf_counter if args.wall else time.process_time
    model = SlotModel(args.bundle, 1)
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(100, 40000, KEPT + NEW)]

    def prefill(prompt, start):
        """Seconds to prefill prompt[start:] after prompt[:start] is in the slot."""
        begin = clock()
        logits = None
        while logits is None:
            start, logits = model.prefill_part(0, prompt, start)
        return clock() - begin

    first, eighth = [], []
    for _ in range(args.rounds):
        first.append(prefill(tokens[:TURN1], 0))
        prefill(tokens[:KEPT], TURN1)  # the history back in the slot (turn 1 overwrote it)
        eighth.append(prefill(tokens, KEPT))
    a, b = statistics.median(first), statistics.median(eighth)
    print(f"turn 1 ({TURN1} tokens) {a * 1e3:.1f} ms, turn 8 ({NEW} after {KEPT}) "
          f"{b * 1e3:.1f} ms: {b / a:.2f}x ({'wall' if args.wall else 'CPU'} time, medians of "
          f"{args.rounds})")


if __name__ == "__main__":
    main()
