"""The routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` and ``POST
/v1/chat/completions`` (whole replies, or server-sent events in OpenAI's chunk format), the
OpenAI-style error of every refusal, and uvicorn's configuration of the application."""

# no ``from __future__ import annotations``: FastAPI reads the handlers' annotations as types,
# and the request type is imported inside create_app
import asyncio
import contextlib
import time
import uuid
from typing import AsyncIterator

import orjson

from ..batch import Request
from .bridge import Server
from .http import Guard, allowed_host, read_body, timed_protocol
from .request import BadRequest, Generation


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



def create_app(server: Server, host: str = "127.0.0.1"):
    """The ASGI application (FastAPI) around ``server``, answering as bound to ``host``."""
    from fastapi import FastAPI, Request as HTTPRequest
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException

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
            raw = await read_body(request, limits.max_body)
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

