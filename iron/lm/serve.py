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
so that a chat template at its render budget never holds up a completion.

Built on FastAPI / Starlette, run by uvicorn (the ``serve`` extra: ``pip install -e
".[serve]"``).
"""

import argparse
import asyncio
import contextlib
import gc
import ipaddress
import json
import math
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

import orjson

from ..errors import IronError
from ..jsonfile import loads
from .batch import Engine, Request, SlotModel
from .chat import ChatError, ChatTemplate
from .generate import SAMPLING_RULES, SamplingError, Sampler, StopText
from .grammar import Constrained, GrammarError, JsonGrammars

DEFAULT_SLOTS = 4

#: llama.cpp's server's sampling defaults, used where the checkpoint's generation_config.json
#: does not set a value
LLAMA_SERVER_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                         "repetition_penalty": 1.0}

#: the longest an idle engine waits for the requests that came with its first one to be read
#: and tokenized (``LoopDriver``)
GATHER_SECONDS = 0.05

#: the largest generation_config.json read (they are a few hundred bytes)
GENERATION_CONFIG_LIMIT = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What the server takes from a client, with the defaults ``--help`` states."""

    max_body: int = 1 << 20  # bytes of a request body (a full context as token ids is ~50 kB)
    queue: int = 16  # requests waiting for a slot; beyond, 429
    read_timeout: float = 15.0  # seconds for a request's line, headers and body to arrive
    idle_timeout: float = 5.0  # seconds a kept-alive connection may wait for its next request
    allow_hosts: tuple[str, ...] = ()  # Host names accepted besides the bound address; "*": any
    cors: tuple[str, ...] = ()  # origins browsers may call from; none by default
    retry_after: int = 1  # seconds a refused (429) client is told to wait
    max_header_bytes: int = 64 << 10  # bytes of a request line and headers; beyond, 431
    max_headers: int = 100  # headers of a request (llama.cpp's server: 100); beyond, 431


class BadRequest(Exception):
    """A request the server refuses: its status, message, offending parameter and code."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 status: int = 400, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = (message, param, code,
                                                                       status, kind)
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


def _number(body: dict, name: str, default: Any, integer: bool = False) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise BadRequest(f"{name}={value!r}: must be {'an integer' if integer else 'a number'}",
                         name, "invalid_type")
    return value


#: the request parameters each endpoint knows; anything else is refused, naming it
COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k",
          "min_p", "seed", "stop", "frequency_penalty", "presence_penalty",
          "repetition_penalty", "ignore_eos", "n", "user", "response_format", "logprobs",
          "logit_bias"}
KNOWN = {True: COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools",
                         "tool_choice", "parallel_tool_calls", "functions", "function_call"},
         False: COMMON | {"prompt", "echo", "suffix", "best_of"}}
#: known parameters the server does not do, refused when set to anything but "off"
UNSUPPORTED = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
               "logprobs", "top_logprobs", "logit_bias", "echo", "suffix")
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
            "presence_penalty")


@dataclass
class Generation:
    """A request's validated parameters."""

    prompt: list[int]
    max_tokens: int
    sampler: Any  # a Sampler, or a Constrained one
    stop: list[str]
    stream: bool
    include_usage: bool
    ignore_eos: bool = False


class LoopDriver:
    """Runs the engine's steps on the event loop's own thread, one step per turn of the loop.

    A step's tokens go straight onto the streams' queues; the streams write their events in
    the next turn (a socket that is not backed up takes a write at once), then the next step
    runs. Nothing passes between threads per token. With the engine on a thread of its own,
    each step's hand-off to the loop and back took two thread wake-ups and a GIL hand-off (on
    a 2-vCPU VM a wake-up of an idle vCPU goes through the hypervisor): 0.65 ms of a 1-stream
    step against 0.19 ms here, timed on the engine's own clock. The kernels release the GIL,
    so the worker that parses and tokenizes requests runs beside them; the loop reads new
    connections between steps, so a request waits at most one step to be read.

    An idle engine's first request waits, before its prefill, for those that came with it:
    ``GATHER_TURNS`` turns of the loop (connections whose bytes have come are read and their
    requests started), then until those being read or tokenized are submitted, at most
    ``Server.gather_seconds``. Clients that post together, as a batch or a benchmark does, so
    are prefilled in one step and decode together; a lone request waits only the turns.
    """

    GATHER_TURNS = 3

    def __init__(self, server: "Server"):
        self.server, self.engine = server, server.engine
        self.loop: asyncio.AbstractEventLoop | None = None
        self.handle: asyncio.Handle | None = None  # the next step, once scheduled
        self.turns = 0  # loop turns an idle engine's first request still waits
        self.deadline = 0.0
        self.stopped = False

    def start(self) -> None:
        self.loop, self.stopped = asyncio.get_running_loop(), False

    def kick(self) -> None:
        """A request was submitted or finished preparing (on the loop's thread): a step is
        coming, and a gathering that waited for that request looks again at once."""
        if self.loop is None or self.stopped:
            return
        if isinstance(self.handle, asyncio.TimerHandle):
            self.handle.cancel()
            self.handle = None
        if self.handle is None:
            e = self.engine
            if not (e.active or e.prefilling):
                self.turns = self.GATHER_TURNS
                self.deadline = time.monotonic() + self.server.gather_seconds
            self.handle = self.loop.call_soon(self._run)

    def _run(self) -> None:
        self.handle = None
        if self.stopped:
            return
        e = self.engine
        if not (e.waiting or e.prefilling or e.active):
            return  # idle: the next request kicks
        if e.waiting and not (e.active or e.prefilling):
            if self.turns > 0:
                self.turns -= 1
                self.handle = self.loop.call_soon(self._run)
                return
            left = self.deadline - time.monotonic()
            if self.server.preparing > 0 and left > 0:
                self.handle = self.loop.call_later(left, self._run)  # or kicked sooner
                return
        try:
            e.step()
        except Exception as error:  # a bug: fail what the engine holds, keep serving
            e.stop(f"error: {type(error).__name__}: {error}")
        self.handle = self.loop.call_soon(self._run)

    def stop(self) -> None:
        self.stopped = True
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.engine.stop()


def sampling_defaults(bundle_dir: Path) -> dict[str, Any]:
    """The sampling a request gets for what it leaves out: the checkpoint's
    ``generation_config.json`` values (``temperature``, ``top_k``, ``top_p``, ``min_p``,
    ``repetition_penalty``; ``do_sample: false`` is greedy) over llama.cpp's server's."""
    defaults = dict(LLAMA_SERVER_SAMPLING)
    path = bundle_dir / "generation_config.json"
    if not path.is_file():
        return defaults
    if path.stat().st_size > GENERATION_CONFIG_LIMIT:
        raise IronError(f"{path}: larger than {GENERATION_CONFIG_LIMIT} bytes; not a "
                        "generation config")
    try:
        config = loads(path.read_bytes())
    except ValueError as e:
        raise IronError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise IronError(f"{path}: must be a JSON object")
    for name in defaults:
        if config.get(name) is not None:
            defaults[name] = config[name]
    if config.get("do_sample") is False:
        defaults["temperature"] = 0.0
    try:
        Sampler(**defaults)
    except SamplingError as e:
        raise IronError(f"{path}: {e}") from None
    return defaults


def check_text(body: Any) -> None:
    """Refuse a lone surrogate (``"\\ud800"``: valid JSON, not text) anywhere in the request,
    naming where: nothing downstream (tokenizer, template, grammar) takes one."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                check_string(f"{path} key {key!r}" if path else f"key {key!r}", key)
                stack.append((f"{path}.{key}" if path else key, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, str):
            check_string(path, value)


def check_string(path: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        param = path.split(".")[0].split("[")[0].split(" ")[0] or None
        raise BadRequest(f"{path}: character {e.start} is a lone surrogate "
                         f"(U+{ord(text[e.start]):04X}), not text", param,
                         "invalid_value") from None


def parse_json(raw: bytes) -> Any:
    """The request body as JSON: strict (no NaN, no raw control characters in strings),
    refused in one line otherwise."""
    def constant(name):
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(raw, parse_constant=constant)
    except RecursionError:
        raise BadRequest("the request body is nested too deeply", None,
                         "invalid_json") from None
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError included
        raise BadRequest(f"the request body is not valid JSON ({e})", None,
                         "invalid_json") from None


class Server:
    """The model, its scheduler and the request handling, independent of the HTTP layer."""

    def __init__(self, bundle: str | Path, slots: int = DEFAULT_SLOTS,
                 model_name: str | None = None, limits: Limits = Limits(),
                 prompt_cache: bool = True):
        self.model = SlotModel(bundle, slots)
        self.limits = limits
        self.engine = Engine(self.model, prompt_cache)
        self.driver = LoopDriver(self)
        self.tokenizer = self.model.tokenizer()
        self.name = model_name or self.model.meta.model_name or Path(bundle).name
        self.created = int(time.time())
        self.defaults = sampling_defaults(self.model.bundle.path)
        self.grammars = JsonGrammars(self.tokenizer, sorted(self.model.eos),
                                     self.model.meta.vocab_size)
        # a token stands for at most this many characters: a longer prompt cannot fit the
        # context, and is refused before it is tokenized
        self.token_chars = max(len(self.tokenizer.decode([i]))
                               for i in range(self.tokenizer.get_vocab_size()))
        # requests between admission and the engine's queue (reading, parsing, tokenizing),
        # counted on the event loop's thread
        self.preparing = 0
        self.gather_seconds = GATHER_SECONDS
        self.workers = ThreadPoolExecutor(1, thread_name_prefix="iron-prepare")
        # chat requests prepare on a thread of their own: a template that runs to its render
        # budget holds up other chats, never completions
        self.chat_workers = ThreadPoolExecutor(1, thread_name_prefix="iron-chat")
        try:
            self.template: ChatTemplate | None = ChatTemplate.from_dir(self.model.bundle.path)
            self.template.warm(self.tokenizer)
            self.template_error = ""
        except ChatError as e:
            self.template, self.template_error = None, str(e)

    # ---- admission ----------------------------------------------------------------------------

    def admit(self) -> None:
        """Take a request in, or refuse it (429) when the slots are busy and the queue full."""
        e = self.engine
        held = self.preparing + len(e.waiting) + len(e.prefilling) + len(e.active)
        if held >= self.model.slots + self.limits.queue:
            raise BadRequest(f"the server is busy: {self.model.slots} requests running and "
                             f"{self.limits.queue} waiting; retry after "
                             f"{self.limits.retry_after} s", None, "server_busy", status=429,
                             kind="rate_limit_error",
                             headers={"Retry-After": str(self.limits.retry_after)})

    def begin_preparing(self) -> None:
        self.preparing += 1

    def end_preparing(self) -> None:
        self.preparing -= 1
        self.driver.kick()  # an idle engine may be gathering: it looks again

    # ---- validation (on a worker thread) ------------------------------------------------------

    def prepare(self, raw: bytes, chat: bool) -> Generation:
        """A request body as a ``Generation``, or ``BadRequest``."""
        body = parse_json(raw)
        check_text(body)
        return self.parse(body, chat)

    def parse(self, body: Any, chat: bool) -> Generation:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        unknown = sorted(set(body) - KNOWN[chat])
        if unknown:
            raise BadRequest(f"unrecognized request argument supplied: {', '.join(unknown)}",
                             unknown[0], "unknown_parameter")
        for name in UNSUPPORTED:
            if body.get(name) not in (None, False, [], {}) and not (
                    name == "tool_choice" and body[name] == "none"):
                raise BadRequest(f"{name} is not supported by this server", name,
                                 "unsupported")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise BadRequest(f"model={model!r}: must be a string", "model", "invalid_type")
        if model is not None and model != self.name:
            raise BadRequest(f"the model {model!r} does not exist: this server serves "
                             f"{self.name!r}", "model", "model_not_found", status=404)
        if _number(body, "n", 1, integer=True) != 1:
            raise BadRequest(f"n={body['n']!r}: only n=1 is supported", "n", "unsupported")
        if _number(body, "best_of", 1, integer=True) != 1:
            raise BadRequest(f"best_of={body['best_of']!r}: only 1 is supported", "best_of",
                             "unsupported")
        schema = self._schema(body.get("response_format"))
        prompt = self._chat_prompt(body) if chat else self._completion_prompt(body)
        ctx = self.model.context
        if len(prompt) > ctx - 1:
            raise BadRequest(f"the prompt is {len(prompt)} tokens; the context holds {ctx} "
                             "positions, at least one of them for the answer",
                             "messages" if chat else "prompt", "context_length_exceeded")
        room = ctx - len(prompt)
        default = room if chat else min(16, room)  # OpenAI's legacy completions default to 16
        key = "max_completion_tokens" if chat and "max_completion_tokens" in body else \
            "max_tokens"
        max_tokens = _number(body, key, default, integer=True)
        if max_tokens < 1:
            raise BadRequest(f"{key}={max_tokens}: must be at least 1", key, "invalid_value")
        if max_tokens > room:
            raise BadRequest(f"{key}={max_tokens} does not fit: the prompt is {len(prompt)} "
                             f"tokens and the context {ctx} positions, so at most {room}", key,
                             "context_length_exceeded")
        options = {name: _number(body, name, self.defaults.get(name, 0.0),
                                 integer=name == "top_k") for name in SAMPLING}
        seed = body.get("seed")
        if seed is not None:
            seed = _number(body, "seed", 0, integer=True)
        try:
            sampler = Sampler(seed=seed, **options)
        except SamplingError as e:
            param = next((n for n, _, _ in SAMPLING_RULES if str(e).startswith(n + "=")),
                         "seed")
            raise BadRequest(str(e), param, "invalid_value") from None
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else (stop or [])
        if not isinstance(stop, list) or len(stop) > 4 or not all(
                isinstance(s, str) for s in stop):
            raise BadRequest(f"stop={body.get('stop')!r}: a string or a list of up to 4 strings",
                             "stop", "invalid_value")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest(f"stream={stream!r}: must be true or false", "stream",
                             "invalid_type")
        stream_options = body.get("stream_options") or {}
        if not isinstance(stream_options, dict):
            raise BadRequest("stream_options must be an object", "stream_options",
                             "invalid_type")
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise BadRequest(f"ignore_eos={ignore_eos!r}: must be true or false", "ignore_eos",
                             "invalid_type")
        if schema is not None:
            if ignore_eos:
                raise BadRequest("ignore_eos cannot be combined with response_format: the "
                                 "answer ends where the document does", "ignore_eos",
                                 "invalid_value")
            try:
                sampler = Constrained(sampler, self.grammars.matcher(schema),
                                      self.model.meta.vocab_size)
            except GrammarError as e:
                raise BadRequest(f"response_format: {e}", "response_format",
                                 "invalid_value") from None
        return Generation(prompt, max_tokens, sampler, stop, stream,
                          bool(stream_options.get("include_usage")), ignore_eos)

    def _schema(self, response_format: Any) -> dict | None:
        """The JSON schema ``response_format`` asks for, or None for plain text."""
        if response_format is None:
            return None
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        fields = {"text": {"type"}, "json_object": {"type"},
                  "json_schema": {"type", "json_schema"}}.get(kind)
        if fields is None:
            raise BadRequest(f"response_format={response_format!r}: must be an object whose "
                             "type is text, json_object or json_schema", "response_format",
                             "invalid_value")
        extra = sorted(set(response_format) - fields)
        if extra:
            raise BadRequest(f"unrecognized request argument supplied: response_format."
                             f"{extra[0]}", "response_format", "unknown_parameter")
        if kind == "text":
            return None
        if kind == "json_object":
            return {"type": "object"}
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise BadRequest("response_format.json_schema must be an object with a schema",
                             "response_format", "invalid_value")
        extra = sorted(set(spec) - {"name", "schema", "strict", "description"})
        if extra:
            raise BadRequest(f"unrecognized request argument supplied: response_format."
                             f"json_schema.{extra[0]}", "response_format", "unknown_parameter")
        schema = spec.get("schema", {"type": "object"})
        if not isinstance(schema, (dict, bool)):
            raise BadRequest("response_format.json_schema.schema must be a JSON schema object",
                             "response_format", "invalid_value")
        return schema

    def _check_length(self, chars: int, param: str) -> None:
        """Refuse text too long for the context whatever its tokens, before tokenizing it."""
        most = (self.model.context - 1) * self.token_chars
        if chars > most:
            raise BadRequest(f"the {param} is {chars} characters; the context holds "
                             f"{self.model.context} tokens of at most {self.token_chars} "
                             f"characters each, so it cannot fit", param,
                             "context_length_exceeded")

    def _completion_prompt(self, body: dict) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            self._check_length(len(prompt), "prompt")
            ids = self.tokenizer.encode(prompt).ids  # with the BOS/EOS the model's tokenizer adds
        elif isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = self.model.meta.vocab_size
            bad = next((t for t in prompt if not 0 <= t < vocab), None)
            if bad is not None:
                raise BadRequest(f"prompt token id {bad} is outside the vocabulary "
                                 f"(0 .. {vocab - 1})", "prompt", "invalid_value")
            ids = list(prompt)
        else:
            raise BadRequest("prompt must be a string, a list of one string, or a list of "
                             "token ids", "prompt", "invalid_type")
        if not ids:
            raise BadRequest("the prompt is empty", "prompt", "invalid_value")
        return ids

    def _chat_prompt(self, body: dict) -> list[int]:
        if self.template is None:
            raise BadRequest(self.template_error, "messages", "no_chat_template")
        messages = body.get("messages")
        if isinstance(messages, list):
            most = self.model.context - 1
            if len(messages) > most:  # every message renders to one token at least
                raise BadRequest(f"the conversation has {len(messages)} messages; the context "
                                 f"holds {self.model.context} positions, at least one of them "
                                 "for the answer, and each message takes one at least",
                                 "messages", "context_length_exceeded")
            messages = [flatten_content(m) for m in messages]
            self._check_length(sum(len(m["content"]) for m in messages
                                   if isinstance(m, dict) and isinstance(m.get("content"), str)),
                               "messages")
        try:  # a rendered text longer than this cannot fit the context either
            return self.template.tokenize(messages, self.tokenizer, max_chars=(
                self.model.context - 1) * self.token_chars)
        except ChatError as e:
            raise BadRequest(str(e), "messages", "invalid_value") from None

    # ---- running ------------------------------------------------------------------------------

    def start(self, gen: Generation) -> tuple[Request, asyncio.Queue]:
        """Submit ``gen`` to the engine; its text pieces, then ("finish", reason, stats) arrive
        on the returned queue."""
        queue: asyncio.Queue = asyncio.Queue()  # filled on this thread: the loop runs the steps
        text, put = StopText(self.tokenizer, gen.stop, context=gen.prompt), queue.put_nowait

        def on_token(token: int) -> bool:
            piece = text.push(token)
            if piece:
                put(("text", piece))
            return not text.stopped

        def on_finish(reason: str, stats) -> None:
            rest = text.flush() if not text.stopped else ""
            if rest:
                put(("text", rest))
            put(("finish", reason, stats))

        request = Request(gen.prompt, gen.max_tokens, gen.sampler, on_token, on_finish,
                          stop_at_eos=not gen.ignore_eos)
        try:
            self.engine.submit(request)
        except IronError as e:
            raise BadRequest(str(e), None, "context_length_exceeded") from None
        self.driver.kick()
        return request, queue


def flatten_content(message: Any) -> Any:
    """OpenAI's content parts (``[{"type": "text", "text": ...}, ...]``) joined into one
    string; anything else is left for the template's checks."""
    if isinstance(message, dict) and isinstance(message.get("content"), list):
        parts = message["content"]
        if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
               for p in parts):
            return {**message, "content": "".join(p["text"] for p in parts)}
    return message


def usage(stats) -> dict:
    """OpenAI's usage object; ``cached_tokens``: the prompt tokens the prompt cache kept."""
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.new_tokens,
            "total_tokens": stats.prompt_tokens + stats.new_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}


def server_error(reason: str) -> BadRequest:
    """The error of a generation that ended in ``reason`` "error: ...": a schema that the
    grammar engine gave up on while decoding is the request's fault (400), anything else the
    server's (500)."""
    schema = "error: sampling: GrammarError: "
    if reason.startswith(schema):
        return BadRequest(f"response_format: the schema failed while decoding "
                          f"({reason[len(schema):]})", "response_format", "invalid_value")
    return BadRequest(f"generation failed: {reason}", None, "generation_failed", status=500,
                      kind="server_error")


def allowed_host(bound: str, allow: tuple[str, ...]):
    """A check of a request's ``Host`` header: the address the server is bound to (with
    ``localhost`` for a loopback one; any IP address for a wildcard one) or a name of
    ``allow``. A page on another site whose name an attacker points at 127.0.0.1 (DNS
    rebinding) sends its own name, and is refused."""
    names = {bound.lower().strip("[]")} | {a.lower() for a in allow}
    wildcard = bound in ("", "0.0.0.0", "::")
    try:
        if ipaddress.ip_address(bound.strip("[]")).is_loopback:
            names |= {"localhost", "127.0.0.1", "::1"}
    except ValueError:
        if bound.lower() == "localhost":
            names |= {"127.0.0.1", "::1"}

    def check(host: str) -> bool:
        if "*" in names:
            return True
        host = host.lower()
        name = host[1:host.find("]")] if host.startswith("[") else host.rsplit(":", 1)[0] \
            if host.count(":") == 1 else host
        if name in names:
            return True
        if wildcard:
            try:
                ipaddress.ip_address(name)
                return True
            except ValueError:
                return False
        return False
    return check


class Guard:
    """The checks every request passes before the application sees it (an ASGI middleware):
    its ``Host``, and for a POST, its content type and declared size. Each refusal is an
    OpenAI-style error; the body is never read."""

    def __init__(self, app, host_ok, max_body: int):
        self.app, self.host_ok, self.max_body = app, host_ok, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        error = None
        if not self.host_ok(headers.get("host", "")):
            error = BadRequest(f"Host {headers.get('host', '')!r} is not this server's "
                               "address (start it with --allow-host NAME to accept it)",
                               None, "invalid_host")
        elif scope["method"] == "POST":
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            length = headers.get("content-length")
            if media != "application/json":
                error = BadRequest(f"Content-Type {media or 'missing'!r}: the body must be "
                                   "application/json", None, "unsupported_media_type",
                                   status=415)
            elif length is not None and (not length.isdigit() or int(length) > self.max_body):
                error = BadRequest(f"the request body is {length} bytes; the server takes at "
                                   f"most {self.max_body} (--max-body)", None,
                                   "request_too_large", status=413)
        if error is None:
            return await self.app(scope, receive, send)
        from starlette.responses import JSONResponse

        await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)


def timed_protocol(limits: Limits):
    """uvicorn's HTTP/1.1 protocol (httptools) with a deadline for each request to arrive and a
    bound on its head. The deadline runs from the connection or the first byte of a request
    until its body is complete: a client that sends its headers or body slowly, or connects
    and says nothing, is disconnected. A request line and headers over
    ``limits.max_header_bytes``, or more than ``limits.max_headers`` headers, are answered 431
    and the connection closed as soon as the excess arrives: nothing more of them is read or
    kept (uvicorn itself has no such limit with httptools)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    read_timeout = limits.read_timeout

    class Protocol(HttpToolsProtocol):
        deadline: asyncio.TimerHandle | None = None
        head_open = True  # between a request's first byte and the end of its headers
        head_bytes = 0  # bytes received while the head was open (a bound, not an exact count)
        header_count = 0
        refused = False

        def refuse(self, message: str) -> None:
            """Answer 431 and close the connection (once)."""
            if self.refused or self.transport.is_closing():
                return
            self.refused = True
            body = orjson.dumps(BadRequest(message, None, "header_too_large", 431).body())
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                                 b"content-type: application/json\r\ncontent-length: "
                                 + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
                                 + body)
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.refused:
                return
            if self.head_open:
                self.head_bytes += len(data)
            super().data_received(data)
            if self.head_open and self.head_bytes > limits.max_header_bytes:
                self.refuse(f"the request line and headers are over {limits.max_header_bytes} "
                            "bytes, the most the server takes (--max-header-bytes)")

        def send_400_response(self, msg: str) -> None:
            if not self.refused:  # a refusal stops the parser, which reports an error
                super().send_400_response(msg)

        def on_header(self, name: bytes, value: bytes) -> None:
            self.header_count += 1
            if self.header_count > limits.max_headers:
                self.refuse(f"the request has over {limits.max_headers} headers, the most the "
                            "server takes (--max-headers)")
                raise ValueError("too many headers")  # stops the parser
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self.head_open = False
            super().on_headers_complete()

        def arm(self) -> None:
            if self.deadline is None:
                self.deadline = self.loop.call_later(read_timeout, self.expire)

        def disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def expire(self) -> None:
            self.deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.arm()

        def on_message_complete(self) -> None:
            self.disarm()
            self.head_open, self.head_bytes, self.header_count = True, 0, 0  # the next request
            super().on_message_complete()

        def connection_lost(self, exc) -> None:
            self.disarm()
            super().connection_lost(exc)

    return Protocol


def create_app(server: Server, host: str = "127.0.0.1"):
    """The ASGI application (FastAPI) around ``server``, answering as bound to ``host``."""
    from fastapi import FastAPI, Request as HTTPRequest
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    limits = server.limits

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.driver.start()
        try:
            yield
        finally:
            server.driver.stop()

    app = FastAPI(title="iron", lifespan=lifespan)

    @app.exception_handler(BadRequest)
    async def bad_request(request, e: BadRequest):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        code = "not_found" if e.status_code == 404 else None
        return JSONResponse(BadRequest(f"{request.method} {request.url.path}: {e.detail}",
                                       code=code, status=e.status_code).body(),
                            status_code=e.status_code)

    @app.exception_handler(Exception)
    async def failure(request, e: Exception):  # a bug: still an OpenAI-style error
        return JSONResponse(server_error(f"{type(e).__name__}: {e}").body(), status_code=500)

    @app.get("/health")
    async def health():
        e = server.engine
        return {"status": "ok", "slots": server.model.slots, "active": len(e.active),
                "prefilling": len(e.prefilling), "waiting": len(e.waiting),
                "queue": limits.queue, "steps": e.steps, "rows": e.batch_rows,
                "seconds": {"step": e.step_seconds, "decode": e.decode_seconds,
                            "prefill": e.prefill_seconds},
                "prompt_cache": {"on": e.prompt_cache, "hits": e.cache_hits,
                                 "tokens": e.cache_tokens}}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.name, "object": "model",
                                            "created": server.created, "owned_by": "iron"}]}

    async def body_of(request: HTTPRequest) -> bytes:
        """The body, refused (413) as soon as it passes the limit (a chunked one has no
        length to check beforehand)."""
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body:
                    raise BadRequest(f"the request body is over {limits.max_body} bytes, the "
                                     "most the server takes (--max-body)", None,
                                     "request_too_large", status=413)
                chunks.append(chunk)
        except ClientDisconnect:
            raise BadRequest("the client went away before its request arrived") from None
        return b"".join(chunks)

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        return await respond(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest):
        return await respond(request, chat=True)

    async def respond(request: HTTPRequest, chat: bool):
        server.admit()
        server.begin_preparing()
        try:
            raw = await body_of(request)
            gen = await asyncio.get_running_loop().run_in_executor(
                server.chat_workers if chat else server.workers, server.prepare, raw, chat)
            job, queue = server.start(gen)
            watcher = asyncio.create_task(cancel_on_disconnect(request, job))
        finally:
            server.end_preparing()
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        head = {"id": ident, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": server.name}
        if gen.stream:
            return StreamingResponse(stream(head, job, queue, gen, chat, watcher),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        pieces = []
        try:
            while True:
                item = await queue.get()
                if item[0] == "text":
                    pieces.append(item[1])
                    continue
                _, reason, stats = item
                break
        finally:
            watcher.cancel()
            job.cancel()  # a no-op once finished; frees the slot of an abandoned request
        if watcher.done() and not watcher.cancelled() and watcher.exception() is None:
            return JSONResponse({}, status_code=499)  # the client went away: nobody listens
        if reason.startswith("error"):
            raise server_error(reason)
        text = "".join(pieces)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}}
                  if chat else {"index": 0, "text": text, "logprobs": None})
        choice["finish_reason"] = reason
        return {**head, "choices": [choice], "usage": usage(stats)}

    async def cancel_on_disconnect(request: HTTPRequest, job: Request) -> None:
        """Cancel ``job`` when its client goes away, so that the engine ends it at its next
        step and frees its slot. Cancelling the response's task is not enough: anyio delivers
        a cancellation only to a task whose wait is still pending, and the step that runs on
        this loop completes the stream's wait (its next token) in every turn, just before
        anyio looks again, so a stream would run to its last token."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.cancel()

    async def stream(head: dict, job: Request, queue: asyncio.Queue, gen: Generation,
                     chat: bool, watcher: asyncio.Task) -> AsyncIterator[bytes]:
        head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}

        def event(choice: dict | None, **extra) -> bytes:
            doc = {**head, "choices": [choice] if choice else [], **extra}
            return b"data: " + orjson.dumps(doc) + b"\n\n"

        def choice(text: str | None, reason: str | None) -> dict:
            if chat:
                delta = {} if text is None else {"content": text}
                return {"index": 0, "delta": delta, "finish_reason": reason}
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}

        try:
            if chat:
                yield event({"index": 0, "delta": {"role": "assistant", "content": ""},
                             "finish_reason": None})
            while True:
                item = await queue.get()
                if item[0] == "text":
                    yield event(choice(item[1], None))
                    continue
                _, reason, stats = item
                if reason.startswith("error"):
                    yield b"data: " + orjson.dumps(server_error(reason).body()) + b"\n\n"
                    return
                yield event(choice(None, reason))
                if gen.include_usage:
                    yield event(None, usage=usage(stats))
                yield b"data: [DONE]\n\n"
                return
        finally:
            watcher.cancel()
            job.cancel()  # the client went away (or we are done): free the slot

    app.add_middleware(Guard, host_ok=allowed_host(host, limits.allow_hosts),
                       max_body=limits.max_body)
    if limits.cors:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(limits.cors),
                           allow_methods=["GET", "POST"], allow_headers=["*"])
    return app


def uvicorn_config(server: Server, host: str, port: int):
    """How uvicorn runs ``server``'s application: its limits on slow and idle clients."""
    import uvicorn

    return uvicorn.Config(create_app(server, host), host=host, port=port, log_level="warning",
                          http=timed_protocol(server.limits),
                          timeout_keep_alive=server.limits.idle_timeout)


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


if __name__ == "__main__":
    sys.exit(main())
