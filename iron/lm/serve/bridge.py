"""The bridge between HTTP requests and the model: the bundle loaded into a ``SlotModel``, its
``Engine`` (continuous batching, prompt cache) stepped on the event loop's thread by a
``LoopDriver``, admission (the queue's limit), and a parsed request (``request.Generation``)
submitted as an engine ``Request`` whose text arrives on an asyncio queue.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ...errors import IronError
from ...jsonfile import loads
from ..batch import HELD_WAIT, Engine, Request, SlotModel
from ..chat import ChatError, ChatTemplate
from ..generate import SamplingError, Sampler, StopText
from ..grammar import Constrained, GrammarError, JsonGrammars
from .limits import Limits
from .request import LLAMA_SERVER_SAMPLING, BadRequest, Generation, ModelView, parse_body

DEFAULT_SLOTS = 4

#: the longest an idle engine waits for the requests that came with its first one to be read
#: and tokenized (``LoopDriver``)
GATHER_SECONDS = 0.05

#: the largest generation_config.json read (they are a few hundred bytes)
GENERATION_CONFIG_LIMIT = 1 << 20


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
        # every sequence waiting for its grammar's mask: look again shortly, not at once
        self.handle = self.loop.call_later(HELD_WAIT, self._run) if e.only_held() else \
            self.loop.call_soon(self._run)

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
        self.created = int(time.time())
        self.grammars = JsonGrammars(self.tokenizer, sorted(self.model.eos),
                                     self.model.meta.vocab_size)
        self.grammars.warm()
        # grammars' masks are computed here, off the event loop that runs the steps
        self.mask_worker = ThreadPoolExecutor(1, thread_name_prefix="iron-grammar")
        # a token stands for at most this many characters: a longer prompt cannot fit the
        # context, and is refused before it is tokenized
        token_chars = max(len(self.tokenizer.decode([i]))
                          for i in range(self.tokenizer.get_vocab_size()))
        self.view = ModelView(model_name or self.model.meta.model_name or Path(bundle).name,
                              self.model.meta.vocab_size, self.model.context, self.tokenizer,
                              token_chars, sampling_defaults(self.model.bundle.path))
        # requests between admission and the engine's queue (reading, parsing, tokenizing),
        # counted on the event loop's thread
        self.preparing = 0
        self.gather_seconds = GATHER_SECONDS
        self.workers = ThreadPoolExecutor(1, thread_name_prefix="iron-prepare")
        # chat requests prepare on a thread of their own: a template that runs to its render
        # budget holds up other chats, never completions
        self.chat_workers = ThreadPoolExecutor(1, thread_name_prefix="iron-chat")
        try:
            self.view.template = ChatTemplate.from_dir(self.model.bundle.path)
            self.view.template.warm(self.tokenizer)
        except ChatError as e:
            self.view.template_error = str(e)

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def defaults(self) -> dict[str, Any]:
        return dict(self.view.defaults)

    @property
    def token_chars(self) -> int:
        return self.view.token_chars

    @property
    def template(self) -> ChatTemplate | None:
        return self.view.template

    @template.setter
    def template(self, template: ChatTemplate | None) -> None:
        self.view.template = template

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

    # ---- preparing (on a worker thread) -------------------------------------------------------

    def prepare(self, raw: bytes, chat: bool) -> Generation:
        """A request body as a ``Generation`` whose sampler follows its schema, if it has one;
        or ``BadRequest``."""
        gen = parse_body(raw, chat, self.view)
        if gen.schema is not None:
            try:
                gen.sampler = Constrained(gen.sampler, self.grammars.matcher(gen.schema),
                                          self.model.meta.vocab_size, self.mask_worker)
            except GrammarError as e:
                raise BadRequest(f"response_format: {e}", "response_format",
                                 "invalid_value") from None
        return gen

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
