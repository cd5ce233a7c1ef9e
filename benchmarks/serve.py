"""Serving throughput: aggregate decode tokens/s with 1, 2, 4 and 8 concurrent streams, iron's
OpenAI-compatible server next to llama.cpp's server on the same weights, driven the same way.

    python benchmarks/serve.py [--bundle build/llama/cpu] [--streams 1 2 4 8] [--tokens 64]
                               [--rounds 2] [--cycles 5] [--dtype Q4_1] [--no-llamacpp]
                               [--variant VAR=VALUE[,...]] [--openai-clients]
    python benchmarks/serve.py --steps [--blocks 300] [--context 64]
    python benchmarks/serve.py --load [--clients 200] [--seconds 30] [--slots 4] [--queue 16]

Each engine runs as a server in its own process (iron: ``python -m iron.lm.serve BUNDLE
--slots 8``; llama.cpp: the server embedded in the prebuilt ``xllamacpp`` wheel, 8 parallel
slots, 2 threads, on the embedded SmolLM2 GGUF itself by default (``--dtype Q4_1``: Q4_1
projections and a Q8_0 embedding, the very blocks of iron's default native bundle; F16 / BF16
are written from it, for a bf16 bundle; see ``benchmarks/llamacpp.py``); ``--variant`` adds an
iron server started with other environment variables, e.g. libgomp's). All are started first
and warmed up at every stream count; one is measured at a time while the others idle. For
each stream count N, N clients post at the same moment a streaming ``/v1/completions``
request each (a different 32-token prompt of the same token ids for every engine, greedy,
``ignore_eos``, ``--tokens`` new tokens) and read the server-sent events: one thread reads
every stream off raw sockets with one ``select``, so the clients take little of the cores the
server's kernels run on.

The host's speed drifts by itself (a VM sharing memory bandwidth with its neighbours: one
stream decoded at 92-145 tok/s from one 64-token run to the next, 276 alone), so a figure
compared across measurements taken seconds apart measures the drift. So the measurements come
in cycles: each cycle runs every stream count once, back to back, and the next cycle runs them
in the opposite order (1 4 | 4 1 | 1 4 ...; ``--cycles`` per round, ``--rounds`` rounds), and
every ratio is taken within a cycle. With N = 1 among the counts, each cycle also decodes the
first stream's prompt in this process, without a server (``LanguageModel.generate``, greedy, same
bundle and token count), next to the served stream (engines in turns, the order reversed from
one cycle to the next).

Reported per engine and N, the medians over every cycle: aggregate tokens/s (all streams'
tokens over the wall time from the posts to the last token, prefills included), decode
tokens/s (the tokens the streams received after their first over the wall time from the
earliest first token to the latest last token: one definition for 1 and N streams, so a stream
that starts late or a prefill between decode steps counts against N), the median time to first
token and the median per-stream time between tokens. The run ends with the figures it is
judged by, every cycle's printed: each cycle's N-stream decode rate over the same cycle's
1-stream rate, and their median; the server's own cost per token (a served stream's ms per
token minus the in-process one's in the same cycle, and its share of the in-process step),
and iron's own clock over the same steps (``/health``: ms per step in the decode kernels, and
in the rest of the step). The load average is printed with the figures.

``--steps`` measures iron's decode steps alone, in this process, without HTTP: the time of one
step of N sequences (``SlotModel.decode_rows``: the one-row decode program for N = 1, the
batched ``decode_slots<B>`` program otherwise), N = 1, 2, 4, 8 taking turns step by step;
the fastest step of each N, so that moments when another process held a core (which stalls
a two-thread kernel) weigh least, and the median. Then where a step's time goes: each
kernel's time from the runtime's per-step clock (``run_timed``, as ``benchmarks/llm.py``'s
breakdown), summed by operator (GEMVs by shape).

``--load`` is a load test of iron's server alone (``--slots`` and ``--queue`` passed on): N
client threads, each posting streaming completions one after another for M seconds, prompts
of mixed lengths (about 8, 100 and 400 tokens) and 8 to 64 new tokens; a client refused with
429 waits the ``Retry-After`` it was given and tries again. Reported: requests completed, 429s,
failures (any other status, a broken connection, a stream without its end), the p50 and p99
of the time to first token and of the per-token latency (each completed request's time
between its first and last token over the tokens between), and the server's resident memory
(sampled every 0.2 s: at the start, at its peak, at the end). Exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

TEXT = ("Once upon a time, there was a little girl named Lily who lived in a small village at "
        "the edge of a great forest. Every morning she walked to the river to fetch water")


class SSEClient:
    """One streaming POST read off a raw non-blocking socket: the HTTP head, the chunked body,
    the server-sent events; when each event that carries text came, and the usage's token
    count. The clients of a measurement share one thread and one ``select``, so what they cost
    the host per event (a ``recv``, a scan, a small ``json.loads``) stays small next to the
    server's: the kernels' two threads take both cores, and every client woken beside a step
    takes one from them."""

    def __init__(self, port: int, body: dict):
        payload = json.dumps(body).encode()
        self.request = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                        "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                        f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=600)
        self.raw = b""  # received bytes not parsed yet
        self.head: bytes | None = None
        self.chunked = False
        self.events = b""  # body bytes whose events are not split off yet
        self.times: list[float] = []
        self.tokens: int | None = None
        self.done = False
        self.error: str | None = None

    def send(self) -> None:
        self.t0 = time.perf_counter()
        self.sock.sendall(self.request)
        self.sock.setblocking(False)

    def feed(self, data: bytes, now: float) -> None:
        """Take what ``recv`` returned at ``now`` (b"": the server closed the connection)."""
        if not data:
            self.done = True
            if self.tokens is None and not self.error:
                self.error = "the connection closed before the stream ended"
            return
        self.raw += data
        if self.head is None:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head, self.raw = self.raw[:end].lower(), self.raw[end + 4:]
            if not self.head.startswith((b"http/1.1 200", b"http/1.0 200")):
                self.error = self.head.split(b"\r\n", 1)[0].decode("latin-1")
                return
            self.chunked = b"transfer-encoding: chunked" in self.head
        if self.chunked:
            while (line := self.raw.find(b"\r\n")) >= 0:
                size = int(self.raw[:line].split(b";")[0], 16)
                if len(self.raw) < line + 2 + size + 2:
                    break
                self.events += self.raw[line + 2:line + 2 + size]
                self.raw = self.raw[line + 4 + size:]
                if size == 0:
                    self.done = True
                    break
        else:
            self.events, self.raw = self.events + self.raw, b""
        while (end := self.events.find(b"\n\n")) >= 0:
            event, self.events = self.events[:end].strip(), self.events[end + 2:]
            if not event.startswith(b"data: "):
                continue
            if event == b"data: [DONE]":
                self.done = True
                continue
            doc = json.loads(event[6:])
            if "error" in doc:
                self.error = f"error event: {doc['error']}"
            elif doc.get("choices") and doc["choices"][0].get("text"):
                self.times.append(now)
            elif doc.get("usage"):
                self.tokens = doc["usage"]["completion_tokens"]

    def result(self) -> dict:
        self.sock.close()
        if self.error or not self.times:
            return {"error": self.error or "no text came"}
        return {"t0": self.t0, "first": self.times[0], "last": self.times[-1],
                "chunks": len(self.times),
                "tokens": self.tokens if self.tokens is not None else len(self.times)}


def stream_all(port: int, bodies: list[dict]) -> list[dict]:
    """Post ``bodies`` as streaming completions at the same moment (the connections opened
    first, then the requests written one after another) and read every stream to its end, in
    this thread."""
    import selectors

    clients = [SSEClient(port, body) for body in bodies]
    for c in clients:
        c.send()
    selector = selectors.DefaultSelector()
    for c in clients:
        selector.register(c.sock, selectors.EVENT_READ, c)
    left = len(clients)
    while left:
        ready = selector.select(timeout=600)
        if not ready:
            raise SystemExit("no answer from the server in 600 s")
        now = time.perf_counter()
        for key, _ in ready:
            c = key.data
            try:
                data = c.sock.recv(1 << 16)
            except BlockingIOError:
                continue
            c.feed(data, now)
            if c.done or c.error:
                selector.unregister(c.sock)
                left -= 1
    selector.close()
    return [c.result() for c in clients]


def stream_openai(port: int, bodies: list[dict]) -> list[dict]:
    """``stream_all`` as users' programs stream: a thread per request, each with the official
    ``openai`` client, which parses every event into objects (what a client costs the cores
    the server's kernels run on is part of what a user on one machine sees)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=600)
    results: list[dict] = [{} for _ in bodies]

    def one(i: int, body: dict) -> None:
        times, tokens, t0 = [], None, time.perf_counter()
        fields = {k: v for k, v in body.items() if k not in ("model", "prompt", "stream")}
        standard = ("max_tokens", "temperature", "stream_options")
        stream = client.completions.create(
            model=body["model"], prompt=body["prompt"], stream=True,
            extra_body={k: v for k, v in fields.items() if k not in standard},
            **{k: v for k, v in fields.items() if k in standard})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                times.append(time.perf_counter())
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        results[i] = ({"t0": t0, "first": times[0], "last": times[-1], "chunks": len(times),
                       "tokens": tokens if tokens is not None else len(times)} if times else
                      {"error": "no text came"})

    threads = [threading.Thread(target=one, args=(i, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


#: how the clients read the streams: raw sockets in one thread (``stream_all``), or the
#: openai client in a thread each (``stream_openai``, ``--openai-clients``)
STREAM = stream_all


def measure(port: int, n: int, prompts: list[list[int]], new_tokens: int, model: str,
            extra: dict | None = None) -> dict:
    cpu, wall = time.process_time(), time.perf_counter()
    results = STREAM(port, [
        {"model": model, "prompt": prompts[i], "max_tokens": new_tokens, "temperature": 0,
         "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True},
         **(extra or {})} for i in range(n)])
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise SystemExit(f"a request failed: {errors[0]}")
    t0 = min(r["t0"] for r in results)
    last = max(r["last"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    gaps = [(r["last"] - r["first"]) / max(r["chunks"] - 1, 1) for r in results]
    # the clients' share of the host's cores while they read (this process runs only them)
    clients = (time.process_time() - cpu) / (time.perf_counter() - wall) / (os.cpu_count() or 1)
    return {"streams": n, "tokens": tokens, "aggregate_tok_s": tokens / (last - t0),
            "client_share": clients,
            "decode_tok_s": decode_rate([(r["first"], r["last"], r["tokens"])
                                         for r in results]),
            "ttft_ms": 1000 * statistics.median(r["first"] - r["t0"] for r in results),
            "token_gap_ms": 1000 * statistics.median(gaps)}


#: seconds between two measurements: the OpenMP threads of the engine measured last spin for a
#: few ms after its last kernel (libgomp's default), which would take a core from the next one
SETTLE = 0.1

#: what "decode tok/s" means, for 1 stream and for N alike (printed with the figures)
DECODE_RATE = ("decode tok/s: the tokens the streams received after their first, over the "
               "wall time from the earliest first token to the latest last token (one "
               "definition for 1 and N streams; a stream that starts late, or a prefill "
               "between decode steps, lengthens that time)")


def decode_rate(streams: list[tuple[float, float, int]]) -> float:
    """Decode tokens/s of streams given as (first token's time, last token's time, tokens):
    see ``DECODE_RATE``."""
    span = max(s[1] for s in streams) - min(s[0] for s in streams)
    return sum(s[2] - 1 for s in streams) / span


def wait_ready(url: str, process: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"no answer from {url} in {seconds} s")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class IronServer:
    name = "iron"
    extra: dict = {}  # request fields of this engine's own

    def __init__(self, bundle: Path, slots: int, flags: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):
        self.port = free_port()
        if env:  # a variant measured beside the plain server: named by what it sets
            self.name = "iron " + " ".join(f"{k}={v}" for k, v in env.items())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "iron.lm.serve", str(bundle), "--slots", str(slots),
             "--port", str(self.port), *flags], cwd=REPO, stderr=subprocess.DEVNULL,
            env={**os.environ, **(env or {})})
        wait_ready(f"http://127.0.0.1:{self.port}/health", self.process)
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models") as r:
            self.model = json.load(r)["data"][0]["id"]

    def clock(self) -> dict:
        """The engine's counters (``/health``): steps, and seconds by what they went to."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health") as r:
            health = json.load(r)
        return {"steps": health["steps"], **health["seconds"]}

    def measure(self, n: int, prompts: list[list[int]], new_tokens: int) -> dict:
        """``measure`` with the server's own clock over the same steps: ms per decode step in
        the kernels, and in the rest of the step."""
        before = self.clock()
        m = measure(self.port, n, prompts, new_tokens, self.model, self.extra)
        after = self.clock()
        d = {k: after[k] - before[k] for k in after}
        if d["steps"]:
            m["server"] = {"decode_ms": 1000 * d["decode"] / d["steps"],
                           "rest_ms": 1000 * (d["step"] - d["decode"] - d["prefill"])
                           / d["steps"]}
        return m

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


class LlamaCppServer:
    """llama.cpp's server in a child process (this script with ``--llamacpp-child``)."""

    name = "llama.cpp"
    extra: dict = {}  # its prompt cache on (llama-server's default), as iron's is

    def __init__(self, slots: int, ctx_per_slot: int, threads: int, dtype: str):
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--llamacpp-child", str(slots), str(ctx_per_slot),
             str(threads), dtype], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        address = self.process.stdout.readline().strip()
        if not address.startswith("http://127.0.0.1:"):
            raise SystemExit(f"llama.cpp's server did not start (said {address!r})")
        self.port = int(address.rsplit(":", 1)[1].strip("/"))
        wait_ready(f"{address}/health", self.process)
        self.model = "smollm2"

    def measure(self, n: int, prompts: list[list[int]], new_tokens: int) -> dict:
        return measure(self.port, n, prompts, new_tokens, self.model, self.extra)

    def close(self) -> None:
        self.process.stdin.close()  # the child exits when its stdin closes
        self.process.wait(timeout=60)


def llamacpp_child(slots: int, ctx_per_slot: int, threads: int, dtype: str) -> None:
    import xllamacpp as xlc

    from llamacpp import gguf_for

    p = xlc.CommonParams()
    p.model.path = str(gguf_for(dtype))
    p.n_parallel = slots
    p.n_ctx = slots * ctx_per_slot  # llama.cpp splits the context over its slots
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads
    p.verbosity = 0
    server = xlc.Server(p)
    print(server.listening_address, flush=True)
    sys.stdin.read()
    del server


def steps(bundle: Path, counts: list[int], blocks: int, context: int) -> None:
    """Decode-step time by number of sequences, in turns, then where a step's time goes (see
    the module docstring)."""
    from iron.lm.batch import SlotModel

    model = SlotModel(bundle, slots=max(counts))
    for s in range(model.slots):
        model.prefill_slot(s, [100 + i % 1000 for i in range(context)])
    times: dict[int, list[float]] = {n: [] for n in counts}
    print(f"load average before: {os.getloadavg()}", flush=True)
    for i in range(blocks):
        for n in counts:
            t = time.perf_counter()
            model.decode_rows(list(range(n)), [200] * n, [context + i % 64] * n)
            times[n].append(time.perf_counter() - t)
    per_op = {n: breakdown(model, n, context) for n in counts}
    print(f"load average after: {os.getloadavg()}\n")
    one = min(times[counts[0]])
    print("| sequences | step ms (fastest) | step ms (median) | aggregate tok/s | "
          f"against {counts[0]} |")
    print("|---|---|---|---|---|")
    for n in counts:
        best = min(times[n])
        print(f"| {n} | {best * 1000:.1f} | {statistics.median(times[n]) * 1000:.1f} | "
              f"{n / best:.1f} | {n / best / (counts[0] / one):.2f}x |")
    print("\nWhere a step goes: kernel ms per step by operator, the fastest of "
          f"{BREAKDOWN_ROUNDS} rounds of {BREAKDOWN_STEPS} steps (one-row programs for 1 "
          "sequence, decode_slots<B> otherwise)\n")
    labels = sorted(per_op[counts[-1]], key=per_op[counts[-1]].get, reverse=True)
    labels += sorted({k for n in counts for k in per_op[n]} - set(labels))
    print("| operator | " + " | ".join(f"{n} seq" for n in counts) + " |")
    print("|---" * (1 + len(counts)) + "|")
    for label in labels:
        print(f"| {label} | " + " | ".join(f"{1000 * per_op[n].get(label, 0.0):.3f}"
                                           for n in counts) + " |")
    print("| total | " + " | ".join(f"{1000 * sum(per_op[n].values()):.3f}" for n in counts)
          + " |")


BREAKDOWN_ROUNDS, BREAKDOWN_STEPS = 5, 40


def breakdown(model, n: int, context: int) -> dict[str, float]:
    """Seconds per step of ``n`` sequences by operator (GEMVs by shape), from the kernel
    runtime's own per-step clock: the fastest of a few rounds, so that a round disturbed by
    another process weighs least."""
    import collections

    import numpy as np

    rows = min((b for b in model.batched if b >= n), default=1)
    if n == 1:
        programs = [model.decode_exe.program, model.head_exe.program]
    else:
        programs = [model.batched[rows].program]
    best = None
    for _ in range(BREAKDOWN_ROUNDS):
        seconds = [np.zeros(len(p.steps)) for p in programs]
        for i in range(BREAKDOWN_STEPS):
            if n == 1:
                model._use_slot(0)
                model.position = context + i
                model.decode(200, tuple(seconds))
            else:
                tok, pos, slot = (np.zeros(rows, np.int32) for _ in range(3))
                tok[:n], pos[:n], slot[:n] = 200, context + i, np.arange(n)
                pos[n:] = -1
                model.batched[rows].run_timed([tok, pos, slot], seconds[0])
        total = sum(float(s.sum()) for s in seconds)
        if best is None or total < best[0]:
            best = (total, seconds)
    per_op: collections.Counter = collections.Counter()
    for program, seconds in zip(programs, best[1]):
        for step, t in zip(program.steps, seconds):
            op = step.op
            name = type(op).__name__.removeprefix("Slot")  # SlotAttention: Attention's row
            per_op[name + (f" {op.M}x{op.K}" if name == "GEMV" else "")] += t / BREAKDOWN_STEPS
    return dict(per_op)


LOAD_PROMPTS = (8, 100, 400)  # prompt lengths of the load test, in tokens (about)
LOAD_TOKENS = (8, 16, 32, 64)  # new tokens it asks for


def load_client(port: int, model: str, prompts: list[str], stop_at: float, seed: int,
                out: dict) -> None:
    """One client of the load test: requests back to back until ``stop_at``."""
    import random

    rng = random.Random(seed)
    while time.monotonic() < stop_at:
        body = {"model": model, "prompt": rng.choice(prompts), "stream": True,
                "max_tokens": rng.choice(LOAD_TOKENS), "temperature": 0, "ignore_eos": True}
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        try:
            t0 = time.perf_counter()
            connection.request("POST", "/v1/completions", json.dumps(body),
                               {"Content-Type": "application/json"})
            response = connection.getresponse()
            if response.status == 429:
                response.read()
                out["refused"] += 1
                time.sleep(float(response.getheader("Retry-After", "1")))
                continue
            if response.status != 200:
                out["failed"].append(f"{response.status}: {response.read()[:200]!r}")
                continue
            times, failure = [], "the stream ended without [DONE]"
            for raw in response:
                line = raw.strip()
                if line == b"data: [DONE]":
                    failure = None
                    break
                if line.startswith(b"data: "):
                    doc = json.loads(line[6:])
                    if "error" in doc:
                        failure = f"error event: {doc['error']['message']}"
                        break
                    if doc.get("choices") and doc["choices"][0].get("text"):
                        times.append(time.perf_counter())
            if failure:
                out["failed"].append(failure)
                continue
            out["completed"] += 1
            if times:
                out["ttft"].append(times[0] - t0)
            if len(times) > 1:
                out["per_token"].append((times[-1] - times[0]) / (len(times) - 1))
        except (OSError, http.client.HTTPException) as e:
            out["failed"].append(f"{type(e).__name__}: {e}")
        finally:
            connection.close()


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def load(bundle: Path, clients: int, seconds: float, slots: int, queue: int | None) -> int:
    """The load test (see the module docstring)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    words = TEXT.split()
    prompts = []
    for n in LOAD_PROMPTS:  # about n tokens each, from the same text
        text = " ".join(words[i % len(words)] for i in range(n))
        while len(tok.encode(text, add_special_tokens=False).ids) > n:
            text = text.rsplit(" ", 1)[0]
        prompts.append(text)
    flags = ("--queue", str(queue)) if queue is not None else ()
    server = IronServer(bundle, slots, flags)
    pid = server.process.pid
    out = {"completed": 0, "refused": 0, "failed": [], "ttft": [], "per_token": []}
    memory = [rss_mb(pid)]
    print(f"load average before: {os.getloadavg()}; {clients} clients for {seconds:g} s "
          f"against {slots} slots", flush=True)
    try:
        stop_at = time.monotonic() + seconds
        threads = [threading.Thread(target=load_client, args=(
            server.port, server.model, prompts, stop_at, i, out), daemon=True)
            for i in range(clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            memory.append(rss_mb(pid))
            time.sleep(0.2)
        memory.append(rss_mb(pid))
    finally:
        server.close()
    print(f"load average after: {os.getloadavg()}\n")

    def pct(values: list[float], q: float) -> str:
        if not values:
            return "-"
        values = sorted(values)
        return f"{1000 * values[min(len(values) - 1, int(q * len(values)))]:.0f}"

    print("| clients | seconds | slots | completed | 429 | failed | ttft p50 ms | ttft p99 ms | "
          "per-token p50 ms | per-token p99 ms | server RSS MB (start / peak / end) |")
    print("|---" * 11 + "|")
    print(f"| {clients} | {seconds:g} | {slots} | {out['completed']} | {out['refused']} | "
          f"{len(out['failed'])} | {pct(out['ttft'], 0.5)} | {pct(out['ttft'], 0.99)} | "
          f"{pct(out['per_token'], 0.5)} | {pct(out['per_token'], 0.99)} | "
          f"{memory[0]:.0f} / {max(memory):.0f} / {memory[-1]:.0f} |")
    for failure in out["failed"][:10]:
        print(f"failed: {failure}")
    return 1 if out["failed"] else 0


class InProcess:
    """iron's decode in this process, without a server: the same bundle, prompt and greedy
    sampling as a stream, through ``LanguageModel.generate``; the reference a served stream's
    time per token is compared with."""

    name = "in-process"

    def __init__(self, bundle: Path):
        from iron.lm.generate import LanguageModel

        self.model = LanguageModel(bundle)

    def measure(self, prompt: list[int], new_tokens: int) -> dict:
        from iron.lm.generate import Sampler

        self.model.reset()
        t0 = time.perf_counter()
        out, stats = self.model.generate(prompt, new_tokens, Sampler(temperature=0.0),
                                         stop_at_eos=False)
        first = t0 + stats.time_to_first_token
        last = first + stats.decode_seconds
        rate = decode_rate([(first, last, len(out))])
        return {"streams": 1, "tokens": len(out), "aggregate_tok_s": len(out) / (last - t0),
                "decode_tok_s": rate, "ttft_ms": 1000 * stats.time_to_first_token,
                "token_gap_ms": 1000 / rate}


def report(runs: dict[tuple[str, int], list[dict]], streams: list[int], dtype: str,
           bundle: Path, names: list[str]) -> None:
    """The table (medians over every cycle), then the figures a run is judged by: each cycle's
    N-stream / 1-stream decode rate (measurements taken back to back, so a host whose speed
    drifts over seconds moves both alike), their median; and a served stream's time per token
    against the same decode in process, cycle by cycle, with the server's own clock beside."""
    med = {key: {f: statistics.median(m[f] for m in ms) for f in ms[0] if f != "server"}
           for key, ms in runs.items()}
    print(DECODE_RATE + "; tok/s: all tokens over the wall time from the posts to the last "
          "token, prefills included; gap: the median stream's time between tokens. Medians "
          "over every cycle of every round.")
    if "llama.cpp" in names:
        print(f"llama.cpp weights: {dtype}; iron bundle: {bundle}")
    print("| streams | " + " | ".join(f"{n} tok/s | {n} decode tok/s | {n} ttft ms | {n} gap ms"
                                      for n in names)
          + (" | iron / llama.cpp |" if "llama.cpp" in names else " |"))
    print("|---" * (1 + 4 * len(names) + ("llama.cpp" in names)) + "|")
    for n in streams:
        cells = []
        for name in names:
            m = med[(name, n)]
            cells += [f"{m['aggregate_tok_s']:.1f}", f"{m['decode_tok_s']:.1f}",
                      f"{m['ttft_ms']:.0f}", f"{m['token_gap_ms']:.2f}"]
        if "llama.cpp" in names:
            cells.append(f"{med[('iron', n)]['aggregate_tok_s'] / med[('llama.cpp', n)]['aggregate_tok_s']:.2f}x")
        print(f"| {n} | " + " | ".join(cells) + " |")
    print()
    for name in names:
        one = runs[(name, streams[0])]
        for n in streams[1:]:
            ratios = [m["decode_tok_s"] / o["decode_tok_s"]
                      for m, o in zip(runs[(name, n)], one)]
            print(f"{name} {n} streams / {streams[0]} stream, decode tok/s, per cycle: "
                  + ", ".join(f"{x:.2f}x" for x in ratios)
                  + f"; median {statistics.median(ratios):.2f}x (lowest {min(ratios):.2f}x, "
                  f"highest {max(ratios):.2f}x; ratio of the medians "
                  f"{med[(name, n)]['decode_tok_s'] / med[(name, streams[0])]['decode_tok_s']:.2f}"
                  "x)")
    for name in names:
        if (InProcess.name, 1) not in runs or name == "llama.cpp" or (name, 1) not in runs:
            continue

        def ms(m: dict) -> float:  # ms per token after the first
            return 1000 / m["decode_tok_s"]

        costs = [(ms(h) - ms(p), ms(p))
                 for h, p in zip(runs[(name, 1)], runs[(InProcess.name, 1)])]
        diff = statistics.median(c for c, _ in costs)
        local = statistics.median(ms(m) for m in runs[(InProcess.name, 1)])
        print(f"{name}: server cost per token, 1 stream (HTTP ms/token - in-process ms/token), "
              "per cycle: " + ", ".join(f"{c:.3f} ms ({100 * c / step:.1f}% of {step:.2f})"
                                        for c, step in costs)
              + f"; median {diff:.3f} ms ({100 * diff / local:.1f}% of the median in-process "
              f"step, {local:.3f} ms)")
    for name in names:
        for n in streams:
            clocks = [m["server"] for m in runs.get((name, n), []) if m.get("server")]
            if not clocks:
                continue
            print(f"{name}: own clock, {n} stream{'s' if n > 1 else ''}, ms per step (kernels "
                  "of the decode step / the rest: sampling, text, events; prefill chunks "
                  "excluded), per cycle: "
                  + ", ".join(f"{c['decode_ms']:.3f} / {c['rest_ms']:.3f}" for c in clocks)
                  + f"; median rest {statistics.median(c['rest_ms'] for c in clocks):.3f} ms "
                  f"({100 * statistics.median(c['rest_ms'] / c['decode_ms'] for c in clocks):.1f}"
                  "% of the kernels)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=REPO / "build" / "llama" / "cpu")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per stream")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cycles", type=int, default=5,
                    help="alternations of the stream counts within a round (each cycle runs "
                         "every count once, in turns: 1 4 | 4 1 | ...); single cycles of 64 "
                         "tokens ranged 1.7-4.0x at load 1.8, so the median needs many")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp's threads")
    ap.add_argument("--dtype", default="Q4_1", choices=["Q4_1", "F16", "BF16"],
                    help="llama.cpp's weights: Q4_1 (the embedded GGUF, the blocks of iron's "
                         "native bundle; default) or a float GGUF written from it")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--openai-clients", action="store_true",
                    help="read the streams with the openai client, a thread each, parsing every "
                         "event (as users' programs do), instead of raw sockets in one thread; "
                         "each line says the clients' share of the cores")
    ap.add_argument("--variant", action="append", default=[], metavar="VAR=VALUE[,...]",
                    help="also measure an iron server started with these environment "
                         "variables (e.g. GOMP_SPINCOUNT=10000), in turns with the others "
                         "(repeatable)")
    ap.add_argument("--steps", action="store_true",
                    help="time iron's decode steps in this process instead (no servers)")
    ap.add_argument("--blocks", type=int, default=300, help="with --steps: steps per count")
    ap.add_argument("--context", type=int, default=64,
                    help="with --steps: positions each sequence holds before the timed steps")
    ap.add_argument("--load", action="store_true",
                    help="a load test of iron's server alone (see above)")
    ap.add_argument("--clients", type=int, default=200, help="with --load: client threads")
    ap.add_argument("--seconds", type=float, default=30.0, help="with --load: how long")
    ap.add_argument("--slots", type=int, default=4, help="with --load: the server's --slots")
    ap.add_argument("--queue", type=int, default=None,
                    help="with --load: the server's --queue (default: its own)")
    ap.add_argument("--llamacpp-child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for variant in args.variant:
        if not all("=" in pair and pair.split("=", 1)[0] for pair in variant.split(",")):
            ap.error(f"--variant {variant!r}: must be VAR=VALUE, or several joined by commas")
    if args.load:
        if args.clients < 1 or not args.seconds > 0 or args.slots < 1:
            ap.error("--load needs --clients >= 1, --seconds > 0 and --slots >= 1")
        return load(args.bundle, args.clients, args.seconds, args.slots, args.queue)
    if args.llamacpp_child:
        slots, ctx, threads, dtype = args.llamacpp_child
        llamacpp_child(int(slots), int(ctx), int(threads), dtype)
        return 0
    if args.steps:
        if not 1 <= args.context <= 1024:
            ap.error(f"--context {args.context}: must be 1 .. 1024 (the steps add up to 64)")
        steps(args.bundle, args.streams, args.blocks, args.context)
        return 0
    from tokenizers import Tokenizer

    global STREAM
    STREAM = stream_openai if args.openai_clients else stream_all
    tok = Tokenizer.from_file(str(args.bundle / "tokenizer.json"))
    base = tok.encode(TEXT, add_special_tokens=False).ids
    slots = max(args.streams)
    prompts = [(base[i:] + base[:i])[:32] for i in range(slots)]  # a different prompt each
    engines = [lambda: IronServer(args.bundle, slots)]
    for variant in args.variant:
        env = dict(pair.split("=", 1) for pair in variant.split(","))
        engines.append(lambda env=env: IronServer(args.bundle, slots, env=env))
    if not args.no_llamacpp:
        engines.append(lambda: LlamaCppServer(slots, 32 + args.tokens + 32, args.threads,
                                              args.dtype))
    runs: dict[tuple[str, int], list[dict]] = {}  # (engine, streams) -> a figure per cycle
    print(f"load average before: {os.getloadavg()}", flush=True)
    servers = []
    local = InProcess(args.bundle) if 1 in args.streams else None
    try:
        for make in engines:
            servers.append(make())
            for n in args.streams:  # warm up: each count's program, its slots' cache pages
                servers[-1].measure(n, prompts, 8)
        if local is not None:
            local.measure(prompts[0], 8)  # warm up
        for k in range(args.rounds * args.cycles):
            # ABBA: 1 4 | 4 1 | 1 4 ..., so each cycle's figures are taken back to back and
            # neither count is always the first after the other
            for n in (args.streams if k % 2 == 0 else args.streams[::-1]):
                measures = [(server.name, lambda s=server: s.measure(n, prompts, args.tokens))
                            for server in servers]
                if n == 1 and local is not None:
                    measures.append((InProcess.name, lambda: local.measure(prompts[0],
                                                                            args.tokens)))
                for name, run in (measures if (k + n) % 2 == 0 else measures[::-1]):
                    time.sleep(SETTLE)
                    m = run()
                    runs.setdefault((name, n), []).append(m)
                    clock = m.get("server")
                    print(f"round {k // args.cycles + 1} cycle {k % args.cycles + 1} "
                          f"{name:10s} {n} streams: {m['aggregate_tok_s']:7.1f} tok/s  "
                          f"decode {m['decode_tok_s']:7.1f} tok/s  ttft {m['ttft_ms']:6.1f} ms  "
                          f"gap {m['token_gap_ms']:6.2f} ms"
                          + (f"  step {clock['decode_ms']:.2f} + {clock['rest_ms']:.3f} ms"
                             if clock else "")
                          + (f"  clients {100 * m['client_share']:.0f}% of the cores"
                             if "client_share" in m else "")
                          + f"  load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        for server in servers:
            server.close()
    print(f"load average after: {os.getloadavg()}\n")
    report(runs, args.streams, args.dtype, args.bundle, [s.name for s in servers])
    return 0


if __name__ == "__main__":
    sys.exit(main())
