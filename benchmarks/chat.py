"""A multi-turn chat as a client sends it: the whole conversation every turn, so the history
grows (about 1500 tokens by turn 8) and a server that keeps nothing between requests prefills
all of it again. Time to first token per turn, iron's server with its prompt cache on and off
and llama.cpp's server (its prompt cache on, as by default), on the same bundle and GGUF file.

    python benchmarks/chat.py [--bundle build/llama/cpu] [--turns 8] [--tokens 128]
                              [--rounds 2] [--no-llamacpp]

Each engine runs as a server in its own process (see ``benchmarks/serve.py``); one is measured
at a time. A turn posts a streaming ``/v1/chat/completions`` request (greedy, ``ignore_eos``,
``--tokens`` new tokens) and appends the reply to the conversation; the turns' user messages
are fixed paragraphs. Reported per turn: the prompt's tokens (iron's usage), the median time
to first token over the rounds per engine, and iron's cached tokens; then turn N's time to
first token over turn 1's per engine, and whether iron's replies with the cache on and off are
the same text (the cache must not change a token). OpenVINO GenAI has no HTTP server, so it
is not in this benchmark (``benchmarks/llm.py`` measures its prefill).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from serve import IronServer, LlamaCppServer  # noqa: E402

from iron.lm.texts import TEXTS  # noqa: E402

QUESTIONS = [f"Here is a passage:\n\n{TEXTS[i % len(TEXTS)]}\n\nWhat happens next? "
             f"Continue it in your own words (part {i + 1})." for i in range(64)]


def turn(port: int, model: str, messages: list[dict], tokens: int, extra: dict) -> dict:
    """One streamed chat turn: its reply, time to first token, and usage where sent."""
    body = json.dumps({"model": model, "messages": messages, "max_tokens": tokens,
                       "temperature": 0, "stream": True, "ignore_eos": True,
                       "stream_options": {"include_usage": True}, **extra}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", body,
                       {"Content-Type": "application/json"})
    reply = connection.getresponse()
    if reply.status != 200:
        raise SystemExit(f"turn refused: {reply.status} {reply.read()[:300]!r}")
    first, pieces, usage = None, [], {}
    for line in reply:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        doc = json.loads(line[6:])
        for choice in doc.get("choices") or ():
            text = (choice.get("delta") or {}).get("content")
            if text:
                first = first or time.perf_counter()
                pieces.append(text)
        usage = doc.get("usage") or usage
    connection.close()
    return {"ttft_ms": 1000 * (first - t0), "text": "".join(pieces), "usage": usage}


def conversation(engine, turns: int, tokens: int, first: int = 0) -> list[dict]:
    """A conversation of ``turns`` user messages from ``QUESTIONS[first]`` on."""
    messages, out = [], []
    for i in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[(first + i) % len(QUESTIONS)]})
        result = turn(engine.port, engine.model, messages, tokens, engine.extra)
        messages.append({"role": "assistant", "content": result["text"]})
        out.append(result)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", type=Path, default=REPO / "build/llama/cpu")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-llamacpp", action="store_true")
    args = p.parse_args(argv)
    engines = {"iron": IronServer(args.bundle, 1),
               "iron, no cache": IronServer(args.bundle, 1, ("--no-prompt-cache",))}
    if not args.no_llamacpp:
        engines["llama.cpp"] = LlamaCppServer(1, 8192, os.cpu_count() or 1, "Q4_1")
        engines["llama.cpp"].extra = {}  # its default: cache_prompt on
    try:
        runs = {name: [] for name in engines}
        for r in range(args.rounds):
            order = list(engines) if r % 2 == 0 else list(engines)[::-1]
            for name in order:
                # a new conversation each round: the cache must not hold it from the last one
                runs[name].append(conversation(engines[name], args.turns, args.tokens,
                                               first=r * args.turns))
    finally:
        for engine in engines.values():
            engine.close()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.turns} turns of {args.tokens} greedy "
          f"tokens, {args.rounds} rounds; median time to first token (ms) per turn")
    names = list(engines)
    print(f"{'turn':>4} {'prompt':>6} {'cached':>6} " + " ".join(f"{n:>15}" for n in names))
    ttft = {n: [statistics.median(run[t]["ttft_ms"] for run in runs[n])
                for t in range(args.turns)] for n in names}
    first_run = runs["iron"][0]
    for t in range(args.turns):
        usage = first_run[t]["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        print(f"{t + 1:>4} {usage.get('prompt_tokens', 0):>6} {cached:>6} "
              + " ".join(f"{ttft[n][t]:>15.1f}" for n in names))
    print("turn {} / turn 1: ".format(args.turns)
          + ", ".join(f"{n} {ttft[n][-1] / ttft[n][0]:.2f}x" for n in names))
    same = all([t["text"] for t in a] == [t["text"] for t in b]
               for a, b in zip(runs["iron"], runs["iron, no cache"]))
    print(f"iron's replies with the prompt cache on and off: {'identical' if same else 'DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
