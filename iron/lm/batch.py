"""Continuous batching: many sequences share one model, one weight pass per decode step.

Each sequence owns a slot of the KV cache: the cache of every layer is (slots, kv_heads, ctx,
head_dim), and slot ``s``'s rows are a contiguous (kv_heads, ctx, head_dim) block, so the
one-sequence programs (prefill, decode) run on a slot by pointing their cache at that block.
A decode step of n > 1 sequences runs the bundle's ``decode_slots<B>`` program (the smallest
B >= n; rows beyond n are padding at position -1, which writes nothing and reads nothing): one
pass over the weights for all of them, each row at its own position in its own slot.

The batched programs take their tunables from the one-row programs and every kernel computes a
row the same way whatever the other rows hold (see ``apps.llama.programs.match_tunables``),
so a sequence's logits, and its greedy tokens, are the same alone and in any batch.

``Engine`` schedules requests over the slots: a waiting request takes a slot as soon as one is
free; prompts are prefilled a chunk at a time, oldest first, up to a budget of prompt tokens
per step (two chunks), and every active sequence then advances one token. So a long prompt is
spread over several steps while the others keep decoding (a 2000-token prompt would otherwise
stop them for over a second), and prompts that arrive together, short ones, are prefilled in
the same step and start decoding together. A finished, stopped or cancelled request leaves its
slot at once.

The prompt cache (on unless ``Engine(prompt_cache=False)``), as llama-server's ``cache_prompt``:
a slot keeps the keys and values of the tokens it last held after its request ends, and a new
request takes the free slot whose kept tokens share the longest prefix with its prompt, so it
prefills only the rest (a chat client resends the whole conversation every turn). Since every
kernel computes a row the same way in any chunk or batch, the cached rows are the bits a full
prefill would write, and the logits are too. Its memory is the slots' own KV cache: when no
free slot shares a prefix, the least recently used one is overwritten.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..pipeline.bundle import Bundle
from ..errors import IronError
from ..memory import available_memory
from .generate import LanguageModel, Sampler, Stats
from .layout import decode_slots


def check_slots_fit(slots: int, slot_bytes: int, context: int) -> None:
    """Refuse, in one line and before allocating, a KV cache of ``slots`` sequences of
    ``slot_bytes`` each that is larger than the memory available (the weights are loaded by
    then): it would be mapped, then fail or swap once sequences fill it."""
    need, have = slots * slot_bytes, available_memory()
    if need > have:
        raise IronError(f"slots={slots}: the KV cache of {slots} sequences of {context} "
                        f"positions takes {need / 2**30:.1f} GiB ({slot_bytes / 2**20:.1f} MiB "
                        f"each) and {have / 2**30:.1f} GiB of memory is available: give at "
                        f"most {have // slot_bytes} slots, or a bundle of a smaller context")


class SlotModel(LanguageModel):
    """A Llama bundle with a KV cache of ``slots`` sequences."""

    def __init__(self, bundle: Bundle | str | Path, slots: int,
                 weights: dict[str, np.ndarray] | None = None):
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise IronError(f"slots={slots!r}: the number of KV-cache slots must be an integer "
                            ">= 1")
        bundle = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle)
        weights = bundle.weights() if weights is None else weights
        super().__init__(bundle, weights)
        self.slots = slots
        check_slots_fit(slots, sum(a.nbytes for a in self.kv.values()), self.context)
        # np.zeros maps zero pages: a slot's memory is touched only once a sequence uses it
        self.kv = {name: np.zeros((slots, *a.shape), a.dtype) for name, a in self.kv.items()}
        self.batched = {}  # rows -> the decode_slots<rows> program, its cache = self.kv
        for rows in self.meta.batch_sizes:
            name = decode_slots(rows)
            exe = self.bundle.executable(name, weights,
                                         resize_slots(self.bundle.program(name), slots))
            exe.bind_state(self.kv)
            self.batched[rows] = exe
        self._on_slot = {}  # id(one-sequence executable) -> the slot its cache points at
        self._rows = {b: [np.zeros(b, np.int32) for _ in range(3)] for b in self.batched}

    def _use_slot(self, slot: int) -> None:
        """Point the one-sequence programs' cache at ``slot``'s rows."""
        if not 0 <= slot < self.slots:
            raise IronError(f"slot {slot} does not exist: there are {self.slots} slots")
        view = None  # built only when a program moves: a step of one sequence stays put
        for exe in (self.decode_exe, self.prefill_exe, self.tail_exe):
            if self._on_slot.get(id(exe)) != slot:
                view = view or {name: a[slot] for name, a in self.kv.items()}
                exe.bind_state(view)
                self._on_slot[id(exe)] = slot

    def prefill_slot(self, slot: int, tokens: list[int]) -> np.ndarray:
        """Prefill ``tokens`` from position 0 of ``slot``; the logits after the last one."""
        self._use_slot(slot)
        self.position = 0
        return self.prefill(tokens)

    def prefill_part(self, slot: int, tokens: list[int], start: int
                     ) -> tuple[int, np.ndarray | None]:
        """Prefill the next chunk of ``tokens`` from ``start`` (its position in ``slot``; the
        tokens before it are in the cache): how many are in the cache after it, and once that
        is all of them, the logits after the last one."""
        self._use_slot(slot)
        self.position = start
        self._check_room(len(tokens) - start)
        hidden = self._prefill_chunk(tokens[start:])
        done = start + len(hidden)
        return done, (self.head(hidden[-1:]) if done == len(tokens) else None)

    def decode_rows(self, slots: list[int], tokens: list[int], positions: list[int]
                    ) -> np.ndarray:
        """One decode step of several sequences: token ``tokens[i]`` at ``positions[i]`` of
        ``slots[i]``; their next-token logits (n, vocab), rows in the order given."""
        n = len(slots)
        if n == 1 or not self.batched:
            out = []
            for s, t, p in zip(slots, tokens, positions):
                self._use_slot(s)
                self.position = p
                out.append(self.decode(t))
            return out[0][None] if n == 1 else np.stack(out)  # one row: a view, no copy
        for p in positions:
            if not 0 <= p < self.context:
                raise IronError(f"position {p} is outside the context of {self.context}")
        most = max(self.batched)
        if n > most:  # more sequences than the largest program: several steps
            return np.concatenate([self.decode_rows(slots[i:i + most], tokens[i:i + most],
                                                    positions[i:i + most])
                                   for i in range(0, n, most)])
        rows = min(b for b in self.batched if b >= n)
        tok, pos, slot = self._rows[rows]
        tok[:n], pos[:n], slot[:n] = tokens, positions, slots
        tok[n:], pos[n:], slot[n:] = 0, -1, 0  # padding rows: position -1 touches no cache row
        (logits,) = self.batched[rows].run([tok, pos, slot], copy=False)
        return logits[:n]


#: how long whoever runs the steps waits when every sequence waits for its sampler
HELD_WAIT = 0.001


def ready(sampler) -> bool:
    """Whether ``sampler`` can take logits now: a plain ``Sampler`` always can, a grammar's
    once its mask is computed (``ready()``)."""
    check = getattr(sampler, "ready", None)
    return check is None or check()


def resize_slots(program, slots: int):
    """``program`` with its slotted KV-cache state sized for ``slots`` sequences (the kernels
    index the slot dimension at run time and do not depend on its size)."""
    tensors = [dataclasses.replace(t, shape=(slots, *t.shape[1:]))
               if t.kind == "state" and len(t.shape) == 4 else t for t in program.tensors]
    return dataclasses.replace(program, tensors=tensors)


@dataclass
class Request:
    """One generation: what to generate and where its tokens go.

    ``on_token(token)`` is called from the thread that runs the steps for every token but an
    end token; returning False ends the sequence (a stop string). ``on_finish(reason, stats)``
    is called once, with reason "stop" (end token or stop string), "length", "cancelled" or
    "error: <message>". ``cancel()`` may be called from any thread.
    """

    prompt: list[int]
    max_new_tokens: int
    sampler: Sampler
    on_token: Callable[[int], bool | None]
    on_finish: Callable[[str, Stats], None]
    stop_at_eos: bool = True
    cancelled: bool = False
    stats: Stats = field(default_factory=Stats)

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class _Sequence:
    request: Request
    slot: int
    position: int  # where the next token's keys and values go (while prefilling: the next
    #                prompt token's)
    token: int  # the last token sampled, fed at the next step
    tokens: list[int] = field(default_factory=list)  # the prompt, then every token sampled
    #                                                  (kept only for the prompt cache)
    generated: int = 0
    started: float = 0.0
    decode_started: float = 0.0
    held: np.ndarray | None = None  # logits kept until the sampler is ready for them


class Engine:
    """Runs requests on a ``SlotModel``: at most ``model.slots`` at once, decoded together."""

    def __init__(self, model: SlotModel, prompt_cache: bool = True):
        self.model = model
        self.prompt_cache = prompt_cache
        # per slot, the tokens whose keys and values its rows 0.. hold, and when it was last
        # given up (for eviction); the requests that reused a prefix and the tokens they skipped
        self.cached: list[list[int]] = [[] for _ in range(model.slots)]
        self.released = [0.0] * model.slots
        self.cache_hits = 0
        self.cache_tokens = 0
        self.waiting: collections.deque[Request] = collections.deque()
        self.prefilling: collections.deque[_Sequence] = collections.deque()  # oldest first
        self.active: dict[int, _Sequence] = {}  # slot -> a sequence that decodes
        self.prefill_budget = 2 * model.chunk  # prompt tokens prefilled per step
        self.free = list(range(model.slots))
        self.lock = threading.Lock()  # the queue and the free slots: submit from any thread
        self.steps = 0  # decode steps run; ``batch_rows`` sums their sequences
        self.batch_rows = 0
        # where the steps that decoded spent their time, in seconds: the decode kernels
        # (``decode_rows``), the prompt chunks prefilled in those steps, and all of it
        # (sampling and the listeners too); a server's own cost per step is
        # step - decode - prefill, read off the same steps, so the host's drifting speed
        # moves the kernels and the whole alike
        self.decode_seconds = 0.0
        self.prefill_seconds = 0.0
        self.step_seconds = 0.0

    # ---- submitting (any thread) --------------------------------------------------------------

    def check(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise if a request of this size cannot run on the model's context."""
        ctx = self.model.context
        if prompt_tokens < 1:
            raise IronError("the prompt is empty: give at least one token")
        if prompt_tokens > ctx - 1:
            raise IronError(f"the prompt is {prompt_tokens} tokens; the context holds {ctx} "
                            "positions, at least one of them for the answer")
        if max_new_tokens < 1 or prompt_tokens + max_new_tokens > ctx:
            raise IronError(f"max_tokens={max_new_tokens} does not fit: the prompt is "
                            f"{prompt_tokens} tokens and the context {ctx} positions, so at "
                            f"most {ctx - prompt_tokens} new tokens")

    def submit(self, request: Request) -> None:
        self.check(len(request.prompt), request.max_new_tokens)
        with self.lock:
            self.waiting.append(request)

    # ---- running (one thread: a server's event loop, or the caller's) ------------------------

    def step(self) -> bool:
        """Give waiting requests free slots, prefill up to the budget, then decode one token of
        every active sequence; whether there was anything to do."""
        start, steps = time.perf_counter(), self.steps
        try:
            return self._step()
        finally:
            if self.steps != steps:
                self.step_seconds += time.perf_counter() - start

    def _step(self) -> bool:
        self._take_slots()
        for seq in [*self.prefilling, *self.active.values()]:
            if seq.request.cancelled:
                self._finish(seq, "cancelled")
        start = time.perf_counter()
        prefilled = self._prefill()
        self._sample_held()
        seqs = [s for s in self.active.values() if s.held is None]
        if not seqs:
            return prefilled or bool(self.active)
        prefill, start = time.perf_counter() - start, time.perf_counter()
        try:
            logits = self.model.decode_rows([s.slot for s in seqs], [s.token for s in seqs],
                                            [s.position for s in seqs])
        except Exception as e:  # a kernel or shape failure: fail these requests, keep serving
            for seq in seqs:
                self._finish(seq, f"error: {e}")
            return True
        self.decode_seconds += time.perf_counter() - start
        self.prefill_seconds += prefill
        self.steps += 1
        self.batch_rows += len(seqs)
        for seq, row in zip(seqs, logits):
            seq.position += 1
            self._sample(seq, row)
        return True

    def _take_slots(self) -> None:
        """Give waiting requests free slots, to be prefilled."""
        with self.lock:
            while self.waiting and self.free:
                request = self.waiting.popleft()
                if request.cancelled:
                    request.on_finish("cancelled", request.stats)
                    continue
                slot, reused = self._slot_for(request.prompt)
                self.free.remove(slot)
                seq = _Sequence(request, slot, position=reused, token=-1,
                                tokens=list(request.prompt) if self.prompt_cache else [],
                                started=time.perf_counter())
                request.stats.prompt_tokens = len(request.prompt)
                request.stats.cached_tokens = reused
                self.cache_hits += reused > 0
                self.cache_tokens += reused
                self.prefilling.append(seq)
                try:
                    request.sampler.start(request.prompt)
                except Exception as e:
                    self._finish(seq, f"error: sampling: {type(e).__name__}: {e}", locked=True)

    def _slot_for(self, prompt: list[int]) -> tuple[int, int]:
        """The free slot to run ``prompt`` in, and how many of its first tokens that slot's
        cache already holds: the longest shared prefix (all but the last token, whose logits
        are needed), else the slot given up longest ago."""
        best, reused = min(self.free, key=lambda s: self.released[s]), 0
        if self.prompt_cache:
            ids = np.asarray(prompt)
            for slot in self.free:
                kept = np.asarray(self.cached[slot][:len(prompt) - 1])
                differ = np.flatnonzero(kept != ids[:kept.size])
                shared = int(differ[0]) if differ.size else kept.size
                if shared > reused:
                    best, reused = slot, shared
        self.cached[best] = []  # its rows change from ``reused`` on
        return best, reused

    def _prefill(self) -> bool:
        """Prefill prompts, oldest first, a chunk at a time, until this step's budget of
        prompt tokens is spent (at least one chunk runs); a prompt whose last chunk is in
        samples its first token and decodes from the next step. Whether any chunk ran."""
        spent = 0
        while self.prefilling and spent < self.prefill_budget:
            seq = self.prefilling[0]
            r, t = seq.request, time.perf_counter()
            try:
                done, logits = self.model.prefill_part(seq.slot, r.prompt, seq.position)
            except Exception as e:
                self._finish(seq, f"error: {e}")
                continue
            r.stats.prefill_seconds += time.perf_counter() - t
            spent += done - seq.position
            seq.position = done
            if logits is not None:
                self.prefilling.popleft()
                self.active[seq.slot] = seq
                self._sample(seq, logits)
            self._take_slots()  # a request that came during the chunk joins this step
        return spent > 0

    def _sample(self, seq: _Sequence, logits: np.ndarray) -> None:
        """Sample ``seq``'s next token and pass it on; a sampler that raises (a grammar's bug,
        say) fails its own request, not the step's others. A sampler that is not ready (a
        grammar's mask still being computed elsewhere) gets the logits at a later step, and
        its sequence sits out the decode steps until then."""
        sampler = seq.request.sampler
        if not ready(sampler):
            seq.held = np.array(logits)  # a copy: the next step overwrites the program's buffer
            return
        try:
            token = sampler(logits)
        except Exception as e:
            return self._finish(seq, f"error: sampling: {type(e).__name__}: {e}")
        self._emit(seq, token)

    def _sample_held(self) -> None:
        """Sample the sequences whose samplers have become ready for their held logits."""
        for seq in [s for s in self.active.values() if s.held is not None]:
            if ready(seq.request.sampler):
                logits, seq.held = seq.held, None
                self._sample(seq, logits)

    def only_held(self) -> bool:
        """Whether every running sequence waits for its sampler, with no prompt to prefill:
        a step would do nothing, and whoever runs the steps may wait a little."""
        running = list(self.active.values())  # one copy: a server's health check reads too
        return bool(running) and not self.prefilling and all(s.held is not None
                                                             for s in running)

    def _emit(self, seq: _Sequence, token: int) -> None:
        r, now = seq.request, time.perf_counter()
        seq.generated += 1
        seq.token = token
        if self.prompt_cache:  # without it, no slot's tokens are kept for the next request
            seq.tokens.append(token)
        r.stats.new_tokens = seq.generated
        if seq.generated == 1:
            seq.decode_started = now
            r.stats.time_to_first_token = now - seq.started
        else:
            r.stats.decode_seconds = now - seq.decode_started
        if r.stop_at_eos and token in self.model.eos:
            return self._finish(seq, "stop")
        try:
            more = r.on_token(token)
        except Exception as e:
            return self._finish(seq, f"error: {e}")
        if more is False:
            return self._finish(seq, "stop")
        if seq.generated >= r.max_new_tokens or seq.position >= self.model.context:
            return self._finish(seq, "length")

    def _finish(self, seq: _Sequence, reason: str, locked: bool = False) -> None:
        if self.active.get(seq.slot) is seq:
            del self.active[seq.slot]
        else:
            self.prefilling.remove(seq)
        # the rows written so far: every token fed, which is all but the last one sampled (a
        # failed step leaves them unknown)
        failed = reason.startswith("error")
        self.cached[seq.slot] = [] if failed else seq.tokens[:seq.position]
        self.released[seq.slot] = time.perf_counter()
        with contextlib.nullcontext() if locked else self.lock:
            self.free.append(seq.slot)
            self.free.sort()
        try:
            seq.request.on_finish(reason, seq.request.stats)
        except Exception:  # the listener is gone (a closed connection): nothing to tell
            pass

    def run_until_idle(self) -> None:
        """Step until nothing is waiting or active (for callers without a thread)."""
        while self.step():
            if self.only_held():
                time.sleep(HELD_WAIT)

    def stop(self, reason: str = "cancelled") -> None:
        """End every request, running or waiting, with ``reason`` (a server shutting down, or
        a step that failed); on the thread that runs the steps."""
        for seq in [*self.prefilling, *self.active.values()]:
            self._finish(seq, reason)
        with self.lock:
            waiting, self.waiting = list(self.waiting), collections.deque()
        for r in waiting:
            r.on_finish(reason, r.stats)
