"""The HTTP layer's guards, below the routes: the ``Host`` check (DNS rebinding), the content
type and declared size of a body (``Guard``, an ASGI middleware), a body read up to its limit
(``read_body``), and uvicorn's protocol with a deadline per request and bounds on its head
(``timed_protocol``). Each refusal is an OpenAI-style error."""

from __future__ import annotations

import asyncio
import ipaddress

import orjson

from .limits import Limits
from .request import BadRequest


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



async def read_body(request, max_body: int) -> bytes:
    """The body of ``request`` (a Starlette request), refused (413) as soon as it passes
    ``max_body`` bytes (a chunked one has no length to check beforehand)."""
    from starlette.requests import ClientDisconnect

    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                raise BadRequest(f"the request body is over {max_body} bytes, the most the "
                                 "server takes (--max-body)", None, "request_too_large",
                                 status=413)
            chunks.append(chunk)
    except ClientDisconnect:
        raise BadRequest("the client went away before its request arrived") from None
    return b"".join(chunks)
