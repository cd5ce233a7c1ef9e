"""The flags of a language-model run (``iron run``, ``iron chat``, ``python -m iron.lm.run``):
one table, read by the commands' parsers and by the application's ``RUN_OPTIONS``.

The flags in the ``generation`` group are those a build may pass on to the run command
(``doit generate top_k=40 stop=.``); the others choose what runs (the prompt's source, the
context, the threads, the emulator) or how the answer is printed.  This module imports only
``argparse``, so an application declares its run options without loading numpy.
"""

from __future__ import annotations

import argparse

#: New tokens per answer unless told (``doit generate`` runs this command, so it is the same).
DEFAULT_MAX_NEW_TOKENS = 128
#: The title of the group of flags a build passes on (see ``run_options``).
GENERATION = "generation"


def add_flags(p: argparse.ArgumentParser) -> None:
    """The run flags, shared with ``iron run`` / ``iron chat`` (llama.cpp's short names)."""
    p.add_argument("-p", "--prompt", default=None,
                   help="the prompt (default: -f, else piped standard input, else the bundle's; "
                        "with --chat: ask interactively)")
    p.add_argument("-f", "--file", default=None, metavar="FILE",
                   help="read the prompt from FILE ('-' for standard input)")
    p.add_argument("-c", "--ctx-size", type=int, default=None, metavar="N",
                   help="most positions a conversation uses, at most the bundle's context "
                        "(default: the bundle's)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object at the end (text, tokens, finish_reason, "
                        "figures)")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="at most this many threads per kernel (default: as built, which is at "
                        "most the cores this process may use)")
    p.add_argument("--emulate", action="store_true",
                   help="run an npu1 / npu2 bundle in the emulator (slow)")
    add_generation_flags(p.add_argument_group(GENERATION))


def add_generation_flags(g) -> None:
    """What is generated and how it is sampled: the flags a build passes on."""
    g.add_argument("-n", "--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                   help=f"most tokens generated per answer, at least 1 (default "
                        f"{DEFAULT_MAX_NEW_TOKENS})")
    g.add_argument("--chat", action="store_true",
                   help="use the checkpoint's chat template; without a prompt, a conversation")
    g.add_argument("-s", "--system", default=None,
                   help="a system message (implies --chat: only the template has a place "
                        "for it)")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end the answer before this text (repeatable)")
    g.add_argument("--temperature", "--temp", type=float, default=0.0,
                   help="0 <= T <= 100; 0 is greedy (default)")
    g.add_argument("--top-k", type=int, default=0,
                   help="sample from the k most likely tokens, k >= 0 (0: all)")
    g.add_argument("--top-p", type=float, default=1.0,
                   help="sample from the smallest set of tokens whose probability reaches p, "
                        "0 < p <= 1")
    g.add_argument("--min-p", type=float, default=0.0,
                   help="sample only tokens at least this fraction as likely as the most "
                        "likely one, 0 <= p <= 1 (0: off)")
    g.add_argument("--seed", type=int, default=None, help="random seed, >= 0")
    g.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divide the logits of tokens already seen (prompt and output) by this, "
                        "0 < r <= 10; 1 is off, 1.1-1.3 stops greedy loops")
    g.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtract this times a token's count in the output, -2 .. 2")
    g.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtract this from every token in the output, -2 .. 2")


def run_options() -> tuple[str, ...]:
    """The generation flags by destination name (``top_k`` for ``--top-k``): the run options
    an application declares for the build, taken from this table."""
    parser = argparse.ArgumentParser(add_help=False)
    add_generation_flags(parser)
    return tuple(vars(parser.parse_args([])))
