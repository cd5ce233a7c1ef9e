"""An OpenAI-compatible HTTP server for a Llama bundle:
``python -m iron.lm.serve BUNDLE [--host 127.0.0.1] [--port 8000] [--slots 4]``.

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (the
model's own chat template), ``GET /health``. ``stream: true`` sends server-sent events in
OpenAI's chunk format, ending with ``data: [DONE]``; ``stream_options: {"include_usage": true}``
adds a last chunk with the token counts. ``model`` may be left out (this server has one).

Sampling: ``temperature`` (0 is greedy), ``top_k``, ``top_p``, ``min_p``, ``seed``,
``max_tokens``, ``stop`` (up to 4 strings), ``frequency_penalty``, ``presence_penalty``,
``repetition_penalty``, ``ignore_eos`` (as llama.cpp's server: generate ``max_tokens`` whatever
comes; for benchmarks); ``n`` must be 1. A request that leaves one out gets the checkpoint's
``generation_config.json`` value where it has one, else llama.cpp's server's (temperature 0.8,
top_k 40, top_p 0.95, min_p 0.05). ``response_format`` ``{"type": "json_object"}`` or
``{"type": "json_schema", "json_schema": {"schema": ...}}`` is enforced while decoding
(``iron.lm.grammar``): an answer that ends on its own parses and follows the schema.

Refused with an OpenAI-style error (``{"error": {"message", "type", "param", "code"}}``, never a
500 for a bad request): a parameter the server does not know (400 naming it), one it knows but
does not do (``tools``, ``logprobs``, ...: 400), an unknown model (404), a body over
``--max-body`` bytes (413, answered before the body is read), a request line and headers over
``--max-header-bytes`` bytes or more than ``--max-headers`` headers (431, answered and the
connection closed as soon as the excess arrives), a body that is not
``application/json`` (415), text that is not valid Unicode (400), a ``Host`` header that is not
the address the server is bound to (400; DNS rebinding), a conversation of more messages than
the context has positions (400, before its template renders), a chat template that runs past
its render budget of time, memory or text (400; ``iron.lm.render``), and, when ``--slots``
requests run and ``--queue`` more wait, any more (429 with ``Retry-After``). A request (line,
headers and body) must arrive within ``--read-timeout`` seconds, and an idle connection closes
after ``--idle-timeout``. Browsers get no CORS headers unless ``--cors ORIGIN``.

Concurrent requests share the model through continuous batching (``iron.lm.batch``): up to
``--slots`` sequences decode together, one pass over the weights per step; more wait for a
free slot. A client that disconnects frees its slot at the next step. The steps run on the
event loop's thread, between its turns (``LoopDriver``); requests are parsed, checked and
tokenized on worker threads, beside the kernels: one for completions, one for chat requests,
so that a chat template at its render budget never holds up a completion; a response_format's
masks are computed on one more, and a sequence whose mask is not in yet sits out the steps.

Built on FastAPI / Starlette, run by uvicorn (the ``serve`` extra: ``pip install -e
".[serve]"``).
"""

import argparse
import gc
import math
import sys

from ...errors import IronError
from .bridge import DEFAULT_SLOTS, Server
from .limits import Limits
from .routes import uvicorn_config


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number > 0")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    d = Limits()
    parser = argparse.ArgumentParser(prog="python -m iron.lm.serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", help="a bundle folder, e.g. build/llama/cpu")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--slots", type=_positive(int), default=DEFAULT_SLOTS,
                        help="sequences decoded at once; the KV cache holds this many "
                             f"(default {DEFAULT_SLOTS})")
    parser.add_argument("--model-name", default=None,
                        help="the model id clients ask for (default: the checkpoint's name)")
    parser.add_argument("--queue", type=int, default=d.queue,
                        help="requests that may wait for a slot; more get 429 (default "
                             f"{d.queue})")
    parser.add_argument("--max-body", type=_positive(int), default=d.max_body,
                        help=f"largest request body in bytes; larger get 413 (default "
                             f"{d.max_body})")
    parser.add_argument("--read-timeout", type=_positive(float), default=d.read_timeout,
                        help="seconds for a request's line, headers and body to arrive "
                             f"(default {d.read_timeout:g})")
    parser.add_argument("--idle-timeout", type=_positive(float), default=d.idle_timeout,
                        help="seconds an idle kept-alive connection stays open (default "
                             f"{d.idle_timeout:g})")
    parser.add_argument("--max-header-bytes", type=_positive(int), default=d.max_header_bytes,
                        help="largest request line and headers in bytes; larger get 431 "
                             f"(default {d.max_header_bytes})")
    parser.add_argument("--max-headers", type=_positive(int), default=d.max_headers,
                        help=f"most headers in a request; more get 431 (default "
                             f"{d.max_headers})")
    parser.add_argument("--no-prompt-cache", action="store_true",
                        help="prefill every prompt whole: keep no slot's tokens for the next "
                             "request that shares their prefix")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="a Host name to accept besides the bound address (repeatable; "
                             "'*' accepts any)")
    parser.add_argument("--cors", action="append", default=[], metavar="ORIGIN",
                        help="an origin browsers may call from (repeatable; '*' for any; "
                             "default none)")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port {args.port}: must be 1 .. 65535")
    if args.queue < 0:
        parser.error(f"--queue {args.queue}: must be >= 0")
    limits = Limits(max_body=args.max_body, queue=args.queue, read_timeout=args.read_timeout,
                    idle_timeout=args.idle_timeout, allow_hosts=tuple(args.allow_host),
                    cors=tuple(args.cors), max_header_bytes=args.max_header_bytes,
                    max_headers=args.max_headers)
    try:
        import httptools  # noqa: F401
        import uvicorn
    except ImportError:
        print("error: the server needs the serve extra: pip install -e '.[serve]'",
              file=sys.stderr)
        return 2
    try:
        server = Server(args.bundle, args.slots, args.model_name, limits,
                        prompt_cache=not args.no_prompt_cache)
    except IronError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # what loading made (the programs' records, the tokenizer, ...) lives as long as the
    # process: frozen out of the collector's sight, a full collection takes about 10 us
    # instead of stopping every thread for 0.3-0.4 s (60 000 objects, on a busy 2-core host)
    # in the middle of a stream
    gc.freeze()
    print(f"serving {server.name} from {args.bundle} on http://{args.host}:{args.port}/v1 "
          f"({args.slots} slots, up to {args.queue} waiting)", file=sys.stderr)
    uvicorn.Server(uvicorn_config(server, args.host, args.port)).run()
    return 0


