"""Generate text with a Llama bundle: ``python -m iron.lm.run BUNDLE --prompt TEXT``.

Streams the text as it is generated, then reports prompt tokens, time to first token, prefill
tokens/s and decode tokens/s; ``--json`` prints one JSON object with the text and those figures
instead.  Greedy unless ``--temperature`` is above zero.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import IronError
from .generate import LlamaModel, Sampler, TextStream, chat_prompt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iron.lm.run", description=__doc__)
    parser.add_argument("bundle", help="a bundle folder, e.g. build/llama/cpu")
    parser.add_argument("--prompt", default=None, help="the prompt (default: the bundle's)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    parser.add_argument("--emulate", action="store_true",
                        help="run an npu1 / npu2 bundle in the emulator (slow)")
    args = parser.parse_args(argv)
    try:
        model = LlamaModel(args.bundle, emulate=args.emulate)
        tokenizer = model.tokenizer()
        prompt = args.prompt if args.prompt is not None else model.meta.default_prompt
        text_in = chat_prompt(prompt) if args.chat else prompt
        ids = tokenizer.encode(text_in, add_special_tokens=False).ids
        stream = TextStream(tokenizer)
        chunks: list[str] = []

        def on_token(token: int) -> None:
            if token in model.eos:
                return
            piece = stream.push(token)
            chunks.append(piece)
            if not args.json:
                sys.stdout.write(piece)
                sys.stdout.flush()

        if not args.json:
            sys.stdout.write(prompt if not args.chat else "")
        sampler = Sampler(args.temperature, args.top_k, args.top_p, args.seed)
        tokens, stats = model.generate(ids, args.max_new_tokens, sampler, on_token)
    except IronError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = {"text": "".join(chunks), "tokens": tokens, **stats.as_dict()}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"\n\nprompt tokens: {stats.prompt_tokens}  time to first token: "
              f"{stats.time_to_first_token * 1000:.1f} ms  prefill: "
              f"{stats.prefill_tokens_per_second:.1f} tok/s  decode: "
              f"{stats.decode_tokens_per_second:.1f} tok/s ({stats.new_tokens} new tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
