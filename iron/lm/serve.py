"""An OpenAI-compatible HTTP server for a Llama bundle:
``python -m iron.lm.serve BUNDLE [--host 127.0.0.1] [--port 8000] [--slots 4]``.

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (the
model's own chat template), ``GET /health``. ``stream: true`` sends server-sent events in
OpenAI's chunk format, ending with ``data: [DONE]``; ``stream_options: {"include_usage": true}``
adds a last chunk with the token counts. Sampling: ``temperature`` (OpenAI's default 1; 0 is
greedy), ``top_p``, ``top_k``, ``seed``, ``max_tokens``, ``stop`` (up to 4 strings),
``frequency_penalty``, ``presence_penalty``, ``repetition_penalty``, ``ignore_eos`` (as
llama.cpp's server: generate ``max_tokens`` whatever comes; for benchmarks); ``n`` must be 1.

Concurrent requests share the model through continuous batching (``iron.lm.batch``): up to
``--slots`` sequences decode together, one pass over the weights per step; more wait for a
free slot. A client that disconnects frees its slot at the next step. Bad requests get
OpenAI-style error JSON (``{"error": {"message", "type", "param", "code"}}``) with status 400
(404 for an unknown model or path) and the server keeps serving.

Built on FastAPI / Starlette, run by uvicorn (the ``serve`` extra: ``pip install -e
".[serve]"``).
"""

import argparse
import asyncio
import contextlib
import json
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

import orjson

from ..errors import IronError
from .batch import Engine, Request, SlotModel
from .chat import ChatError, ChatTemplate
from .generate import SAMPLING_RULES, SamplingError, Sampler, StopText

DEFAULT_SLOTS = 4


class BadRequest(Exception):
    """A request the server refuses: its status, message, offending parameter and code."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = (message, param, code,
                                                                       status, kind)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


def _number(body: dict, name: str, default: float, integer: bool = False) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise BadRequest(f"{name}={value!r}: must be {'an integer' if integer else 'a number'}",
                         name, "invalid_type")
    return value


@dataclass
class Generation:
    """A request's validated parameters."""

    prompt: list[int]
    max_tokens: int
    sampler: Sampler
    stop: list[str]
    stream: bool
    include_usage: bool
    ignore_eos: bool = False


class Outbox:
    """Hands a decode step's text to the event loop at once, and waits until it is sent.

    The engine's thread runs the kernels while the event loop writes the server-sent events.
    Where the kernels' thread team takes every core (2 threads on 2 cores here), an event loop
    woken for every token of every stream runs beside a step, takes a core from the team, and
    the team stalls at its barriers: a step of 4 sequences took 18.7 ms inside a server
    streaming 4 requests against 12.8 ms alone. So the engine hands a step's pieces over in
    one call (one wake-up of the loop) and starts its next step once the loop has passed them
    on: each woken stream writes its event within that turn of the loop, since a socket
    that is not backed up takes a write at once. It waits at most ``patience`` seconds, so a
    loop busy elsewhere (parsing a large request) delays no step by more than that.
    """

    def __init__(self, patience: float = 0.1):
        self.patience = patience
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: int | None = None
        self.items: list[tuple[asyncio.Queue, tuple]] = []
        self.sent = threading.Event()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver to ``loop`` (call from its thread)."""
        self.loop, self.loop_thread = loop, threading.get_ident()

    def put(self, queue: asyncio.Queue, item: tuple) -> None:
        """Queue ``item`` for ``queue`` (from the engine's thread, during a step)."""
        self.items.append((queue, item))

    def flush(self) -> None:
        """Deliver what the step queued; on the loop's own thread (an engine stopped by the
        server's shutdown), at once."""
        if not self.items or self.loop is None:
            return
        items, self.items = self.items, []
        if threading.get_ident() == self.loop_thread:
            self._deliver(items, wake=False)
            return
        self.sent.clear()
        try:
            self.loop.call_soon_threadsafe(self._deliver, items)
        except RuntimeError:  # the loop has closed: nobody is listening
            return
        self.sent.wait(self.patience)

    def _deliver(self, items: list, wake: bool = True) -> None:
        for queue, item in items:
            queue.put_nowait(item)
        if wake:  # after the streams this woke have run (callbacks run in order)
            self.loop.call_soon(self.sent.set)


class Server:
    """The model, its scheduler and the request handling, independent of the HTTP layer."""

    def __init__(self, bundle: str | Path, slots: int = DEFAULT_SLOTS,
                 model_name: str | None = None):
        self.model = SlotModel(bundle, slots)
        self.outbox = Outbox()
        self.engine = Engine(self.model, after_step=self.outbox.flush)
        self.tokenizer = self.model.tokenizer()
        self.name = model_name or self.model.meta.model_name or Path(bundle).name
        self.created = int(time.time())
        try:
            self.template: ChatTemplate | None = ChatTemplate.from_dir(self.model.bundle.path)
            self.template_error = ""
        except ChatError as e:
            self.template, self.template_error = None, str(e)

    # ---- validation ---------------------------------------------------------------------------

    def parse(self, body: Any, chat: bool) -> Generation:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model is required: the name /v1/models lists", "model",
                             "missing_model")
        if model != self.name:
            raise BadRequest(f"the model {model!r} does not exist: this server serves "
                             f"{self.name!r}", "model", "model_not_found", status=404)
        if _number(body, "n", 1, integer=True) != 1:
            raise BadRequest(f"n={body['n']!r}: only n=1 is supported", "n", "unsupported")
        for flag in ("echo", "logprobs"):
            if body.get(flag):
                raise BadRequest(f"{flag} is not supported", flag, "unsupported")
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
        options = {name: _number(body, name, default, integer=name == "top_k")
                   for name, default in (("temperature", 1.0), ("top_p", 1.0), ("top_k", 0),
                                         ("repetition_penalty", 1.0),
                                         ("frequency_penalty", 0.0),
                                         ("presence_penalty", 0.0))}
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
        return Generation(prompt, max_tokens, sampler, stop, stream,
                          bool(stream_options.get("include_usage")), ignore_eos)

    def _completion_prompt(self, body: dict) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
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
            messages = [flatten_content(m) for m in messages]
        try:
            text = self.template.render(messages)
        except ChatError as e:
            raise BadRequest(str(e), "messages", "invalid_value") from None
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    # ---- running ------------------------------------------------------------------------------

    def start(self, gen: Generation) -> tuple[Request, asyncio.Queue]:
        """Submit ``gen`` to the engine; its text pieces, then ("finish", reason, stats) arrive
        on the returned queue."""
        loop = asyncio.get_running_loop()
        if self.outbox.loop is not loop:
            self.outbox.bind(loop)
        queue: asyncio.Queue = asyncio.Queue()
        text, put = StopText(self.tokenizer, gen.stop), self.outbox.put

        def on_token(token: int) -> bool:
            piece = text.push(token)
            if piece:
                put(queue, ("text", piece))
            return not text.stopped

        def on_finish(reason: str, stats) -> None:
            rest = text.flush() if not text.stopped else ""
            if rest:
                put(queue, ("text", rest))
            put(queue, ("finish", reason, stats))

        request = Request(gen.prompt, gen.max_tokens, gen.sampler, on_token, on_finish,
                          stop_at_eos=not gen.ignore_eos)
        try:
            self.engine.submit(request)
        except IronError as e:
            raise BadRequest(str(e), None, "context_length_exceeded") from None
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
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.new_tokens,
            "total_tokens": stats.prompt_tokens + stats.new_tokens}


def server_error(reason: str) -> BadRequest:
    return BadRequest(f"generation failed: {reason}", None, "generation_failed", status=500,
                      kind="server_error")


def create_app(server: Server):
    """The ASGI application (FastAPI) around ``server``."""
    from fastapi import FastAPI, Request as HTTPRequest
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.engine.start()
        try:
            yield
        finally:
            server.engine.stop()

    app = FastAPI(title="iron", lifespan=lifespan)

    @app.exception_handler(BadRequest)
    async def bad_request(request, e: BadRequest):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        code = "not_found" if e.status_code == 404 else None
        return JSONResponse(BadRequest(f"{request.method} {request.url.path}: {e.detail}",
                                       code=code, status=e.status_code).body(),
                            status_code=e.status_code)

    @app.get("/health")
    async def health():
        e = server.engine
        return {"status": "ok", "slots": server.model.slots, "active": len(e.active),
                "prefilling": len(e.prefilling), "waiting": len(e.waiting)}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.name, "object": "model",
                                            "created": server.created, "owned_by": "iron"}]}

    async def body_of(request: HTTPRequest) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw)
        except ValueError as e:
            raise BadRequest(f"the request body is not valid JSON ({e})", None,
                             "invalid_json") from None

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        return await respond(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest):
        return await respond(request, chat=True)

    async def respond(request: HTTPRequest, chat: bool):
        gen = server.parse(await body_of(request), chat)
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        head = {"id": ident, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": server.name}
        job, queue = server.start(gen)
        if gen.stream:
            return StreamingResponse(stream(head, job, queue, gen, chat),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        pieces = []
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return JSONResponse({}, status_code=499)
                    continue
                if item[0] == "text":
                    pieces.append(item[1])
                    continue
                _, reason, stats = item
                break
        finally:
            job.cancel()  # a no-op once finished; frees the slot of an abandoned request
        if reason.startswith("error"):
            raise server_error(reason)
        text = "".join(pieces)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}}
                  if chat else {"index": 0, "text": text, "logprobs": None})
        choice["finish_reason"] = reason
        return {**head, "choices": [choice], "usage": usage(stats)}

    async def stream(head: dict, job: Request, queue: asyncio.Queue, gen: Generation,
                     chat: bool) -> AsyncIterator[bytes]:
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
            job.cancel()  # the client went away (or we are done): free the slot

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iron.lm.serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", help="a bundle folder, e.g. build/llama/cpu")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS,
                        help="sequences decoded at once; the KV cache holds this many "
                             f"(default {DEFAULT_SLOTS})")
    parser.add_argument("--model-name", default=None,
                        help="the model id clients ask for (default: the checkpoint's name)")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port {args.port}: must be 1 .. 65535")
    try:
        import uvicorn
    except ImportError:
        print("error: the server needs the serve extra: pip install -e '.[serve]'",
              file=sys.stderr)
        return 2
    try:
        server = Server(args.bundle, args.slots, args.model_name)
    except IronError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"serving {server.name} from {args.bundle} on http://{args.host}:{args.port}/v1 "
          f"({args.slots} slots)", file=sys.stderr)
    uvicorn.run(create_app(server), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
