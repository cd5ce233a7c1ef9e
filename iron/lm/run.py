"""Generate text with a Llama bundle: ``python -m iron.lm.run BUNDLE --prompt TEXT``.

Streams the text as it is generated, then reports prompt tokens, time to first token, prefill
tokens/s and decode tokens/s; ``--json`` prints one JSON object with the text and those figures
instead.  Greedy unless ``--temperature`` is above zero.

``--chat`` applies the checkpoint's own chat template (kept in the bundle); with ``--prompt``
it answers that one message, without it it is an interactive conversation: type a message,
the reply streams, and the next turn sees the whole conversation (the cache keeps what it
already holds).  An empty line or end of input ends it.  Ctrl-C ends any run cleanly with the
statistics so far.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import IronError
from ..util import MAX_USER_FILE, read_bounded
from .chat import ChatTemplate
from .flags import add_flags
from .generate import LanguageModel, SamplingError, Sampler, Stats, StopText


def parser(prog: str = "python -m iron.lm.run") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", help="a bundle folder, e.g. build/llama/cpu")
    add_flags(p)
    return p


def sampler_from(args, parse: argparse.ArgumentParser) -> Sampler:
    if args.max_new_tokens < 1:
        parse.error(f"--max-new-tokens {args.max_new_tokens} is out of range: at least 1")
    try:
        return Sampler(args.temperature, args.top_k, args.top_p, args.seed,
                       args.repetition_penalty, args.frequency_penalty, args.presence_penalty,
                       args.min_p)
    except SamplingError as e:
        name = str(e).split("=", 1)[0]
        parse.error(f"--{name.replace('_', '-')}: {e}")


def report(stats: Stats, out=sys.stderr, interrupted: bool = False) -> None:
    print(f"\n\n{'interrupted; ' if interrupted else ''}prompt tokens: {stats.prompt_tokens}  "
          f"time to first token: {stats.time_to_first_token * 1000:.1f} ms  prefill: "
          f"{stats.prefill_tokens_per_second:.1f} tok/s  decode: "
          f"{stats.decode_tokens_per_second:.1f} tok/s ({stats.new_tokens} new tokens)",
          file=out)


class Chat:
    """A conversation with the model under the checkpoint's chat template."""

    def __init__(self, model: LanguageModel, template: ChatTemplate, system: str | None = None):
        self.model, self.template = model, template
        self.tokenizer = model.tokenizer()
        self.messages = [{"role": "system", "content": system}] if system else []
        self.prompts: list[list[int]] = []  # the token ids each turn was given
        self.tokens: list[int] = []  # the last answer's tokens
        self.finish = ""  # why the last answer ended: stop or length

    def turn(self, text: str, max_new_tokens: int, sampler: Sampler, stop=(),
             on_text=None, stats: Stats | None = None) -> str:
        """Answer ``text``; the answer joins the conversation. ``on_text`` gets each piece."""
        self.messages.append({"role": "user", "content": text})
        ids = self.template.tokenize(self.messages, self.tokenizer)  # message text stays text
        self.prompts.append(ids)
        stream, pieces = StopText(self.tokenizer, stop, context=ids), []

        def on_token(token: int) -> bool:
            piece = stream.push(token)
            pieces.append(piece)
            if on_text and piece:
                on_text(piece)
            return not stream.stopped

        try:
            self.tokens, _ = self.model.generate(ids, max_new_tokens, sampler, on_token,
                                                 stats=stats, keep_prefix=True)
            self.finish = finish_reason(self.model, self.tokens, stream.stopped,
                                        max_new_tokens)
        finally:
            pieces.append(stream.flush())
            if on_text and pieces[-1]:
                on_text(pieces[-1])
            self.messages.append({"role": "assistant", "content": "".join(pieces)})
        return self.messages[-1]["content"]


def interactive(chat: Chat, args, parse) -> int:
    total = Stats()
    print("chat: type a message; an empty line or end of input ends, Ctrl-C too",
          file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            break
        if not line.strip():
            break
        stats = Stats()
        try:
            chat.turn(line, args.max_new_tokens, sampler_from(args, parse), args.stop,
                      lambda piece: (sys.stdout.write(piece), sys.stdout.flush()), stats)
        except KeyboardInterrupt:
            report(stats, interrupted=True)
            break
        sys.stdout.write("\n")
        print(f"[{stats.new_tokens} tokens, {stats.decode_tokens_per_second:.1f} tok/s]",
              file=sys.stderr)
        total.prompt_tokens += stats.prompt_tokens
        total.new_tokens += stats.new_tokens
    print(f"\n{len(chat.prompts)} turns, {total.new_tokens} tokens generated", file=sys.stderr)
    return 0


def finish_reason(model: LanguageModel, tokens: list[int], stopped: bool, limit: int) -> str:
    """``stop`` (an end token or a stop text) or ``length`` (the token limit), as OpenAI says."""
    if stopped or (tokens and tokens[-1] in model.eos) or len(tokens) < limit:
        return "stop"
    return "length"


def read_prompt(args) -> str | None:
    """The prompt: ``--prompt``, else ``--file`` (``-`` is standard input), else piped standard
    input when there is no conversation to hold on it; None when none is given.  A file is
    read with ``read_bounded`` (a regular file of at most ``MAX_USER_FILE`` bytes: /dev/zero
    or a FIFO is refused unread) and standard input up to as many characters."""
    if args.prompt is not None and args.file is not None:
        raise IronError("give the prompt once: --prompt or --file, not both")
    if args.file is not None:
        try:
            if args.file == "-":
                return _read_stdin()
            return read_bounded(args.file, "a prompt").decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise IronError(f"--file {args.file}: cannot read the prompt "
                            f"({getattr(e, 'strerror', None) or e})") from None
    if args.prompt is None and not args.chat and not sys.stdin.isatty():
        text = _read_stdin()
        return text if text else None
    return args.prompt


def _read_stdin() -> str:
    """Standard input, refused past ``MAX_USER_FILE`` characters (``yes | iron run`` ends)."""
    text = sys.stdin.read(MAX_USER_FILE + 1)
    if len(text) > MAX_USER_FILE:
        raise IronError(f"standard input: the prompt is over the {MAX_USER_FILE >> 20} MiB limit "
                        "for a prompt")
    return text


def main(argv: list[str] | None = None) -> int:
    parse = parser()
    return run(parse.parse_args(argv), parse)


def run(args: argparse.Namespace, parse: argparse.ArgumentParser, bundle=None) -> int:
    """Generate as the parsed flags say (``args.bundle``: the bundle folder; ``bundle``, when
    given, that bundle already opened and checked)."""
    args.chat = args.chat or args.system is not None
    sampler = sampler_from(args, parse)
    stats = Stats()
    chunks: list[str] = []
    finish = "length"
    try:
        if args.threads is not None:
            if args.threads < 1:
                raise IronError(f"--threads {args.threads}: must be a positive integer")
            from ..targets.cpu import set_thread_limit

            set_thread_limit(args.threads)
        prompt = read_prompt(args)
        if prompt is not None:
            check_text(prompt, "--prompt" if args.prompt is not None else "the prompt")
        if bundle is None:
            not_a_bundle(args.bundle)
        model = LanguageModel(bundle or args.bundle, emulate=args.emulate)
        limit_context(model, args.ctx_size)
        tokenizer = model.tokenizer()
        if args.chat:
            chat = Chat(model, ChatTemplate.from_dir(model.bundle.path), args.system)
            if prompt is None:
                return interactive(chat, args, parse)
        prompt = prompt if prompt is not None else model.meta.default_prompt

        def show(piece: str) -> None:
            chunks.append(piece)
            if not args.json:
                sys.stdout.write(piece)
                sys.stdout.flush()

        if args.chat:
            chat.turn(prompt, args.max_new_tokens, sampler, args.stop, show, stats)
            tokens, finish = chat.tokens, chat.finish
        else:
            ids = tokenizer.encode(prompt).ids  # with the BOS/EOS the model's tokenizer adds
            model.check_fits(len(ids), args.max_new_tokens)  # before the prompt is echoed
            if not args.json:
                sys.stdout.write(prompt)
            stream = StopText(tokenizer, args.stop, context=ids)

            def on_token(token: int) -> bool:
                piece = stream.push(token)
                if piece:
                    show(piece)
                return not stream.stopped

            tokens, _ = model.generate(ids, args.max_new_tokens, sampler, on_token, stats=stats)
            finish = finish_reason(model, tokens, stream.stopped, args.max_new_tokens)
            rest = stream.flush()
            if rest:
                show(rest)
    except IronError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        report(stats, interrupted=True)
        return 130
    if args.json:
        prompt_ids = chat.prompts[-1] if args.chat else ids
        print(json.dumps({"text": "".join(chunks), "prompt_ids": prompt_ids, "tokens": tokens,
                          "finish_reason": finish, **stats.as_dict()}))
    else:
        report(stats, sys.stdout)
    return 0


def not_a_bundle(path: str) -> None:
    """A model that is not a bundle yet gets a one-line pointer to the command that builds it."""
    from pathlib import Path

    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".gguf" or (
            (p / "config.json").is_file() and not (p / "manifest.json").exists()):
        raise IronError(f"{path}: a {'GGUF file' if p.is_file() else 'checkpoint folder'}, not "
                        f"a bundle; `iron run {path}` builds one and runs it")


def limit_context(model: LanguageModel, positions: int | None) -> None:
    """Hold a run to ``positions`` of the bundle's context (a larger one needs another
    bundle: ``iron run -c N`` builds it)."""
    if positions is None:
        return
    if not 1 <= positions <= model.context:
        raise IronError(f"--ctx-size {positions}: the bundle {model.bundle.path} holds "
                        f"{model.context} positions; give 1 to {model.context}, or run "
                        f"`iron run CHECKPOINT -c {positions}`, which builds a bundle for it")
    model.context = positions


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
