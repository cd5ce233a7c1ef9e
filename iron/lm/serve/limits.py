"""The server's limits on clients: the sizes, counts and times past which a request is
refused or a connection closed, with the defaults ``--help`` states."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What the server takes from a client."""

    max_body: int = 1 << 20  # bytes of a request body (a full context as token ids is ~50 kB)
    queue: int = 16  # requests waiting for a slot; beyond, 429
    read_timeout: float = 15.0  # seconds for a request's line, headers and body to arrive
    idle_timeout: float = 5.0  # seconds a kept-alive connection may wait for its next request
    allow_hosts: tuple[str, ...] = ()  # Host names accepted besides the bound address; "*": any
    cors: tuple[str, ...] = ()  # origins browsers may call from; none by default
    retry_after: int = 1  # seconds a refused (429) client is told to wait
    max_header_bytes: int = 64 << 10  # bytes of a request line and headers; beyond, 431
    max_headers: int = 100  # headers of a request (llama.cpp's server: 100); beyond, 431

