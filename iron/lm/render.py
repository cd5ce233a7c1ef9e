"""Chat templates rendered within a budget of time, memory and output, in a worker process.

A checkpoint's chat template is a program: Jinja's immutable sandbox keeps it from reaching
anything but the data it is given, but not from running long or growing large. Nested loops
run for hours, ``tojson(indent=10**9)`` asks for gigabytes, a macro that calls itself ends in
a ``RecursionError``. So templates render in a worker process (``python -m iron.lm.render``)
that gives each rendering ``Budget.seconds`` of CPU time (``RLIMIT_CPU``: the signal it sends
stops the rendering; CPU time, so that a busy host does not fail a real template), lets its
address space grow by ``Budget.memory`` bytes (``RLIMIT_AS``: past it Python raises
``MemoryError``) and stops a rendering as soon as its text passes ``Budget.chars``
characters. A worker that does not answer within ``Budget.wall`` seconds is killed, and the
next rendering starts a new one. Every failure is one line (``TemplateFailed``) naming the
template and the budget it broke. Real templates render in milliseconds into a few kB.

The environment is transformers' (``apply_chat_template``): the immutable sandbox with
``trim_blocks``, ``lstrip_blocks``, the ``loopcontrols`` extension and the ``{% generation %}``
block, a ``tojson`` filter (``json.dumps`` with ``ensure_ascii=False``), and the globals
``raise_exception``, ``dict``, ``namespace`` and ``strftime_now`` (the current date and time in
the given ``strftime`` format, which Llama 3.2's, Mistral's and Granite's templates call; a
request may fix the time, for a reproducible prompt). Requests and replies cross the pipe as
length-prefixed JSON: the worker receives only data.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import IronError

#: a message's length prefix: 4 bytes, big-endian
_HEADER = struct.Struct(">I")


class TemplateFailed(IronError, ValueError):
    """A chat template that did not render: invalid, refused the conversation, failed, or went
    past its budget."""


@dataclass(frozen=True)
class Budget:
    """What one rendering may take."""

    seconds: int = 2  # of CPU time (whole seconds: the resolution of RLIMIT_CPU)
    memory: int = 512 << 20  # bytes the worker's address space may grow by
    chars: int = 16 << 20  # characters of rendered text
    wall: float = 30.0  # seconds the worker has to answer at all


class OutOfTime(Exception):
    """The rendering used its CPU time (``SIGXCPU``)."""


class Refused(Exception):
    """``raise_exception`` called by the template: it does not take the conversation."""


#: the time ``strftime_now`` reports during a rendering: the request's ``now`` where it gives
#: one (a fixed date, for a reproducible prompt), else None for the current time
_now: datetime | None = None


def environment():
    """The Jinja environment chat templates render in: transformers' own (its
    ``utils/chat_template_utils.py``, ``_cached_compile_jinja_template``), with its
    ``{% generation %}`` block (which marks the assistant's text for training masks and renders
    its body as it is), its ``dict`` and its ``namespace`` that refuses attribute names with a
    leading underscore."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.sandbox
    import jinja2.utils

    def raise_exception(message):
        raise Refused(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return (_now or datetime.now()).strftime(format)

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: its body, as it is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno)

        def _body(self, caller):
            return caller()

    class TemplateDict:
        """``dict(...)`` and ``dict.fromkeys(...)``, and nothing else of the type."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a namespace attribute may not start with an underscore: {name!r}")

    class TemplateNamespace(jinja2.utils.Namespace):
        """Jinja's ``namespace``, refusing underscore-prefixed attribute names."""

        def __init__(*args, **kwargs):  # noqa: N805 (Jinja's own signature trick)
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def compile_template(source: str, where: str):
    """``source`` compiled in ``environment()``; ``TemplateFailed`` if it is not a template.
    Compiling runs nothing of the template."""
    import jinja2

    try:
        return environment().from_string(source)
    except jinja2.TemplateError as e:
        raise TemplateFailed(f"{where}: not a valid Jinja template ({e})") from None
    except RecursionError:
        raise TemplateFailed(f"{where}: not a valid Jinja template (nested too deeply)") \
            from None


# ---- the worker ---------------------------------------------------------------------------


def render_within(template, context: dict[str, Any], chars: int) -> str:
    """``template`` rendered with ``context``, stopped once it passes ``chars`` characters."""
    pieces, size = [], 0
    for piece in template.generate(**context):
        size += len(piece)
        if size > chars:
            raise OverflowError(f"its text passed {chars} characters")
        pieces.append(piece)
    return "".join(pieces)


def answer(request: dict[str, Any], templates: dict[str, Any], seconds: int
           ) -> dict[str, Any]:
    """The worker's reply to one request: the rendered texts, or the one-line reason none."""
    import jinja2

    source = request["source"]
    if source not in templates:
        templates.clear()  # one template at a time in practice; never an unbounded cache
        templates[source] = compile_template(source, "the template")
    template = templates[source]
    global _now
    _now = datetime.fromisoformat(request["now"]) if request.get("now") else None
    try:
        with cpu_time(seconds):
            return {"texts": [render_within(template, {**request["context"], **call},
                                            request["chars"]) for call in request["calls"]]}
    except OutOfTime:
        return {"error": f"it ran for {seconds} s of CPU time, the render budget (a loop "
                         "that does not end?)"}
    except Refused as e:
        return {"refused": str(e)}
    except MemoryError:
        return {"error": "it needed more memory than the render budget"}
    except RecursionError:
        return {"error": "it recursed too deeply (a macro that calls itself?)"}
    except (jinja2.TemplateError, ArithmeticError, TypeError, ValueError, LookupError,
            AttributeError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def read_message(stream) -> Any:
    """One length-prefixed JSON message from ``stream``; None at its end."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    return json.loads(stream.read(_HEADER.unpack(header)[0]))


def write_message(stream, message: Any) -> None:
    data = json.dumps(message, ensure_ascii=False).encode("utf-8")
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _leave_with_parent(parent: int) -> None:
    """End this worker once the process that started it is gone (a render in a loop never
    reads the pipe's end)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


@contextlib.contextmanager
def cpu_time(seconds: int):
    """Raise ``OutOfTime`` in the block once this process has used ``seconds`` more of CPU
    time (the soft ``RLIMIT_CPU``, whose signal ``worker`` turns into the exception)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    soft = math.ceil(usage.ru_utime + usage.ru_stime) + seconds
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard < 0 else min(soft, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))


def _out_of_time(signum, frame):
    raise OutOfTime()


def worker(seconds: int, memory: int) -> None:
    """Serve render requests on stdin/stdout: each with ``seconds`` of CPU time, the address
    space limited to its size at start plus ``memory`` bytes."""
    import resource

    import jinja2.sandbox  # noqa: F401  (loaded before the limit is measured)

    compile_template("{{ 1 }}", "warm-up").render()
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    soft = size + memory
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))
    signal.signal(signal.SIGXCPU, _out_of_time)
    threading.Thread(target=_leave_with_parent, args=(os.getppid(),), daemon=True).start()
    templates: dict[str, Any] = {}
    while (request := read_message(sys.stdin.buffer)) is not None:
        try:
            reply = answer(request, templates, seconds)
        except TemplateFailed as e:
            reply = {"error": str(e)}
        except MemoryError:
            reply = {"error": "it needed more memory than the render budget"}
        write_message(sys.stdout.buffer, reply)


# ---- the client ---------------------------------------------------------------------------


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout):
        stream.close()


class Renderer:
    """A template's worker process, started on first use and again after it is killed; one
    rendering at a time (a lock), each within ``budget``."""

    def __init__(self, source: str, where: str, budget: Budget = Budget()):
        self.source, self.where, self.budget = source, where, budget
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the worker now, so that the first rendering does not wait for it."""
        with self._lock:
            self._started()

    def _started(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            # this copy of iron first, whatever the environment would import
            path = os.pathsep.join(filter(None, (str(Path(__file__).parents[2]),
                                                 os.environ.get("PYTHONPATH"))))
            self._process = subprocess.Popen(
                [sys.executable, "-m", "iron.lm.render", str(self.budget.seconds),
                 str(self.budget.memory)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": path})
            weakref.finalize(self, _stop, self._process)
        return self._process

    def _restart(self) -> None:
        if self._process is not None:
            _stop(self._process)
            self._process = None

    def render(self, calls: list[dict[str, Any]], context: dict[str, Any],
               chars: int | None = None, now: datetime | None = None) -> list[str]:
        """The texts of ``calls`` (each a dict of template variables, over ``context``), each
        at most ``chars`` characters (``budget.chars`` by default), with ``strftime_now``
        reporting ``now`` (default: the current time)."""
        request = {"source": self.source, "context": context, "calls": calls,
                   "chars": min(chars or self.budget.chars, self.budget.chars),
                   "now": now.isoformat() if now else None}
        with self._lock:
            process = self._started()
            try:
                write_message(process.stdin, request)
                reply = self._reply(process)
            except (OSError, ValueError) as e:  # the worker died: a broken pipe, a cut reply
                self._restart()
                raise TemplateFailed(f"{self.where}: rendering stopped the renderer "
                                     f"({e})") from None
            if reply is None:
                self._restart()
                raise TemplateFailed(f"{self.where}: rendering took longer than "
                                     f"{self.budget.wall:g} s, and its renderer was stopped")
        if "refused" in reply:
            raise TemplateFailed(f"{self.where}: the template refused the conversation: "
                                 f"{reply['refused']}")
        if "error" in reply:
            raise TemplateFailed(f"{self.where}: rendering failed ({reply['error']})")
        return reply["texts"]

    def _reply(self, process: subprocess.Popen) -> Any:
        """The worker's reply, or None if it did not come within ``budget.wall``."""
        deadline = time.monotonic() + self.budget.wall
        fd, data, need = process.stdout.fileno(), b"", _HEADER.size
        while len(data) < need:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, max(need - len(data), 1 << 16))
            if not chunk:
                raise OSError("it exited")
            data += chunk
            if need == _HEADER.size and len(data) >= need:
                need += _HEADER.unpack(data[:_HEADER.size])[0]
        return json.loads(data[_HEADER.size:need])


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]))
