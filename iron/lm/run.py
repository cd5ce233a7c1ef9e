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
    parser.add_argument("--threads", type=int, default=None,
                        help="at most this many threads per kernel (default: as built, which "
                             "is at most the cores this process may use)")
    args = parser.parse_args(argv)
    try:
        if args.threads is not None:
            if args.threads < 1:
                raise IronError(f"--threads {args.threads}: must be a positive integer")
            from ..targets.cpu import set_thread_limit

            set_thread_limit(args.threads)
        if args.prompt is not None:
            check_text(args.prompt, "--prompt")
        model = LlamaModel(args.bundle)
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


def check_text(text: str, what: str) -> None:
    """Command-line text that is not UTF-8 arrives with its bytes as lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        byte = ord(text[e.start]) - 0xDC00 if 0xDC80 <= ord(text[e.start]) <= 0xDCFF else None
        shown = f"byte 0x{byte:02x}" if byte is not None else repr(text[e.start])
        raise IronError(f"{what}: {shown} at character {e.start} is not UTF-8 text") from None


if __name__ == "__main__":
    sys.exit(main())
