"""Text generation on a decoder bundle: prefill in chunks, decode token by token, sample.

The bundle holds the programs ``iron.lm.layout`` names, sharing one KV cache: prefill (a chunk
of prompt tokens, and a smaller one for a prompt's last rows), decode (one token) and head
(logits of one hidden state).  Each call is one ctypes call into the compiled executor, so
Python work per token is a few small array writes and the sampling.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..pipeline.bundle import Bundle
from ..errors import BundleError, IronError
from .checkpoint import load_tokenizer
from .layout import DECODE, HEAD, PREFILL, PREFILL_TAIL, PROGRAMS, LmMeta


class SamplingError(IronError, ValueError):
    """A sampling option is out of its range."""


#: (field, check, rule) of every sampling option, checked by ``Sampler`` and reported by the
#: CLI and the server in one line each.
SAMPLING_RULES = (
    ("temperature", lambda v: 0 <= v <= 100, "0 <= temperature <= 100 (0 is greedy)"),
    ("top_k", lambda v: isinstance(v, int) and v >= 0,
     "top_k is an integer >= 0 (0 keeps every token)"),
    ("top_p", lambda v: 0 < v <= 1, "0 < top_p <= 1"),
    ("min_p", lambda v: 0 <= v <= 1, "0 <= min_p <= 1 (0 is off)"),
    ("repetition_penalty", lambda v: 0 < v <= 10, "0 < repetition_penalty <= 10 (1 is off)"),
    ("frequency_penalty", lambda v: -2 <= v <= 2, "-2 <= frequency_penalty <= 2"),
    ("presence_penalty", lambda v: -2 <= v <= 2, "-2 <= presence_penalty <= 2"),
)


@dataclass
class Sampler:
    """Greedy when ``temperature`` is 0, else temperature / top-k / top-p / min-p sampling;
    penalties first. ``min_p`` keeps the tokens at least that fraction as likely as the
    likeliest one (after the temperature, as transformers and vLLM apply it).

    Penalties, as vLLM applies them: ``repetition_penalty`` (Keskar et al. 2019, as in
    transformers and llama.cpp) divides a positive logit, or multiplies a negative one, of every
    token seen in the prompt or the output; ``frequency_penalty`` subtracts itself times the
    number of times a token was generated, ``presence_penalty`` once for any token generated
    (OpenAI's definitions). Call ``start(prompt)`` before a sequence; each call records the
    token it returns.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_p: float = 0.0  # last: callers pass the others by position
    rng: np.random.Generator = field(init=False)

    def __post_init__(self):
        for name, ok, rule in SAMPLING_RULES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
                raise SamplingError(f"{name}={value!r} is out of range: {rule}")
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int) or self.seed < 0):
            raise SamplingError(f"seed={self.seed!r} is out of range: a non-negative integer")
        self.rng = np.random.default_rng(self.seed)
        self._seen: set[int] = set()
        self._counts: dict[int, int] = {}

    @property
    def penalised(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    def start(self, prompt: list[int]) -> None:
        """A new sequence: forget the output counted so far; the prompt's tokens are seen."""
        self._seen, self._counts = set(prompt), {}

    def _penalise(self, logits: np.ndarray) -> np.ndarray:
        logits = logits.copy()
        if self.repetition_penalty != 1.0 and self._seen:
            ids = np.fromiter(self._seen, np.int64)
            ids = ids[ids < logits.size]
            v = logits[ids]
            logits[ids] = np.where(v > 0, v / self.repetition_penalty,
                                   v * self.repetition_penalty)
        if self._counts and (self.frequency_penalty or self.presence_penalty):
            ids = np.fromiter(self._counts, np.int64)
            n = np.fromiter(self._counts.values(), np.float32)
            keep = ids < logits.size
            logits[ids[keep]] -= n[keep] * self.frequency_penalty + self.presence_penalty
        return logits

    def __call__(self, logits: np.ndarray) -> int:
        token = self._sample(np.asarray(logits, np.float32).ravel())  # no copy: read only
        self._seen.add(token)
        self._counts[token] = self._counts.get(token, 0) + 1
        return token

    def _sample(self, logits: np.ndarray) -> int:
        if self.penalised:
            logits = self._penalise(logits)
        if self.temperature <= 0:
            return int(np.argmax(logits))
        logits = logits / self.temperature
        order = np.argsort(-logits)
        if self.top_k > 0:
            order = order[: self.top_k]
        p = np.exp(logits[order] - logits[order[0]])
        p /= p.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p)) + 1
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        if self.min_p > 0.0:  # p is sorted: p[0] is the likeliest
            keep = int(np.count_nonzero(p >= self.min_p * p[0]))
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        return int(self.rng.choice(order, p=p))


@dataclass
class Stats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens a server's prompt cache did not prefill again
    time_to_first_token: float = 0.0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens after the first over the time they took (the first comes from prefill)."""
        n = self.new_tokens - 1
        return n / self.decode_seconds if n > 0 and self.decode_seconds else 0.0

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens,
                "time_to_first_token_s": self.time_to_first_token,
                "prefill_tokens_per_s": self.prefill_tokens_per_second,
                "decode_tokens_per_s": self.decode_tokens_per_second}


def check_cache(bundle: Bundle, states: dict, context: int) -> int:
    """The context is what the KV cache holds, not what the metadata says: the positions
    (the cache is ``(kv_heads, positions, head_dim)``) of the decode program's cache, which
    every program must share and ``meta.context`` must agree with."""
    where = bundle.path / "manifest.json"
    cache = states[DECODE]
    if not cache:
        raise BundleError(f"{where}: the decode program has no KV cache state")
    positions = {t.shape[1] if len(t.shape) == 3 else -1 for t in cache.values()}
    for name, named in states.items():
        for key, t in named.items():
            if key not in cache or cache[key].shape != t.shape:
                raise BundleError(f"{where}: program {name!r} state {key!r} {t.shape} is not "
                                  "the decode program's KV cache")
    if len(positions) != 1 or positions != {context}:
        raise BundleError(f"{where}: meta.context = {context} but the KV cache "
                          f"holds {sorted(positions)} positions; rebuild the bundle")
    return positions.pop()


class LanguageModel:
    """A loaded decoder bundle of any family: forward passes with a persistent KV cache, all
    it needs of the model read from the bundle's programs and meta (``LmMeta``)."""

    def __init__(self, bundle: Bundle | str | Path,
                 weights: dict[str, np.ndarray] | None = None, emulate: bool = False):
        """Load ``bundle``; ``weights`` (another bundle's of the same checkpoint) are used
        instead of reading this bundle's own, so that two builds compared side by side read
        the very same memory; ``emulate`` runs an npu bundle in the emulator."""
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle)
        self.bundle.check_runnable(emulate)
        # parsed before the weights are read: a damaged one is a one-line error, not a late crash
        self._tokenizer = load_tokenizer(self.bundle.file("tokenizer.json"), BundleError)
        self.meta = meta = LmMeta.from_json(self.bundle.meta, str(self.bundle.path))
        self.chunk, self.tail_chunk = meta.chunk, meta.tail_chunk
        self.eos = set(meta.eos_token_ids)
        states = {name: self.bundle.program(name).named("state") for name in PROGRAMS}
        self.context = check_cache(self.bundle, states, meta.context)
        self.weights = weights = self.bundle.weights() if weights is None else weights
        self.decode_exe = self.bundle.executable(DECODE, weights, emulate=emulate)
        self.prefill_exe = self.bundle.executable(PREFILL, weights, emulate=emulate)
        self.tail_exe = self.bundle.executable(PREFILL_TAIL, weights, emulate=emulate)
        self.head_exe = self.bundle.executable(HEAD, weights, emulate=emulate)
        self.kv = {name: np.zeros(t.shape, t.dtype)
                   for name, t in self.decode_exe.program.named("state").items()}
        self.decode_exe.bind_state(self.kv)
        self.prefill_exe.bind_state(self.kv)
        self.tail_exe.bind_state(self.kv)
        self.position = 0
        self.history: list[int] = []  # the tokens whose keys and values the cache holds
        self._one = np.zeros(1, np.int32)
        self._pos = np.zeros(1, np.int32)

    def tokenizer(self):
        """The bundle's tokenizer, parsed and checked when the model was loaded."""
        return self._tokenizer

    def reset(self) -> None:
        """Forget the conversation: later tokens start at position 0 (old cache rows are
        overwritten before they are read)."""
        self.position = 0
        self.history = []

    def _check_room(self, n: int, what: str = "") -> None:
        if self.position + n > self.context:
            raise IronError(f"{what or f'{self.position + n} tokens'} do not fit the bundle's "
                            f"context of {self.context} positions; shorten the prompt or choose "
                            "a larger context (iron run -c N, doit context=N)")

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Refuse, before any work, a prompt and answer the context cannot hold."""
        self._check_room(prompt_tokens + max(max_new_tokens - 1, 0),
                         f"a prompt of {prompt_tokens} tokens and {max_new_tokens} new tokens")

    def _chunks(self, tokens: list[int], seconds: dict | None = None) -> Iterator[np.ndarray]:
        """Run prompt tokens through the prefill programs a chunk at a time; yield each
        chunk's hidden states (a view of the program's output buffer, valid until the next
        call). ``seconds``: see ``prefill``."""
        self._check_room(len(tokens))
        start = 0
        while start < len(tokens):
            hidden = self._prefill_chunk(tokens[start:], seconds)
            start += len(hidden)
            yield hidden

    def _prefill_chunk(self, tokens: list[int], seconds: dict | None = None) -> np.ndarray:
        """Run the first chunk of ``tokens`` at the current position (the tail program once no
        more than its rows are left); its hidden states, one row per token it took."""
        rows, exe = ((self.tail_chunk, self.tail_exe) if len(tokens) <= self.tail_chunk
                     else (self.chunk, self.prefill_exe))
        part = tokens[:rows]
        ids = np.zeros(rows, np.int32)  # the last chunk is padded: its extra rows write
        ids[: len(part)] = part  # cache rows past the prompt, overwritten later
        pos = np.arange(self.position, self.position + rows, dtype=np.int32)
        if seconds is None:
            (out,) = exe.run([ids, pos], copy=False)
        else:
            (out,) = exe.run_timed([ids, pos], seconds[exe])
        self.position += len(part)
        return out[: len(part)]

    def prefill(self, tokens: list[int], seconds: dict | None = None) -> np.ndarray:
        """Run prompt tokens through the model; return the logits after the last one.

        With ``seconds`` (per executable of the prefill, tail and head programs, one float64
        array per step), each step's kernel time is added to it: where a prompt's time goes.
        """
        if not tokens:
            raise IronError("the prompt is empty: give at least one token")
        for hidden in self._chunks(tokens, seconds):
            pass
        if seconds is None:
            return self.head(hidden[-1:])
        return self.head_exe.run_timed([hidden[-1:]], seconds[self.head_exe])[0][0]

    def prefill_hidden(self, tokens: list[int]) -> np.ndarray:
        """Hidden states of every prompt token (for accuracy checks of the prefill path)."""
        return np.concatenate([h.copy() for h in self._chunks(tokens)])

    def head(self, hidden: np.ndarray) -> np.ndarray:
        return self.head_exe.run([hidden], copy=False)[0][0]

    def decode(self, token: int, seconds: tuple[np.ndarray, np.ndarray] | None = None
               ) -> np.ndarray:
        """Feed one token at the current position; return the next token's logits.

        With ``seconds`` (one float64 array per step of the decode and the head program), each
        step's kernel time is added to it: where a token's time goes.
        """
        self._check_room(1)
        self._one[0], self._pos[0] = token, self.position
        if seconds is None:
            (hidden,) = self.decode_exe.run([self._one, self._pos], copy=False)
            logits = self.head(hidden)
        else:
            (hidden,) = self.decode_exe.run_timed([self._one, self._pos], seconds[0])
            logits = self.head_exe.run_timed([hidden], seconds[1])[0][0]
        self.position += 1
        return logits

    def generate(self, prompt: list[int], max_new_tokens: int, sampler: Sampler | None = None,
                 on_token: Callable[[int], bool | None] | None = None,
                 stop_at_eos: bool = True, stats: Stats | None = None,
                 keep_prefix: bool = False) -> tuple[list[int], Stats]:
        """Generate up to ``max_new_tokens`` after ``prompt``, stopping at an end token unless
        ``stop_at_eos`` is False (benchmarks generate a fixed count), or when ``on_token``
        returns False (a stop sequence).

        ``stats`` is filled as tokens come, so a caller interrupted (Ctrl-C) still has the
        figures so far.  With ``keep_prefix`` the cache rows of the previous call's tokens
        that start ``prompt`` are kept and only the rest is prefilled (a chat's next turn).
        """
        if max_new_tokens < 1:
            raise SamplingError(f"max_new_tokens={max_new_tokens} is out of range: at least 1")
        sampler = sampler or Sampler()
        sampler.start(prompt)
        keep = self._common_prefix(prompt) if keep_prefix else 0
        self.position = keep
        self.history = list(prompt[:keep])
        self._check_room(len(prompt) - keep + max(max_new_tokens - 1, 0),
                         f"a prompt of {len(prompt)} tokens and {max_new_tokens} new tokens")
        stats = stats if stats is not None else Stats()
        stats.prompt_tokens = len(prompt)
        start = time.perf_counter()
        logits = self.prefill(prompt[keep:])
        self.history = list(prompt)
        stats.prefill_seconds = time.perf_counter() - start
        out: list[int] = []
        decode_start = None
        while len(out) < max_new_tokens:
            token = sampler(logits)
            out.append(token)
            stats.new_tokens = len(out)
            if decode_start is None:
                decode_start = time.perf_counter()
                stats.time_to_first_token = decode_start - start
            else:
                stats.decode_seconds = time.perf_counter() - decode_start
            if stop_at_eos and token in self.eos:
                break
            if (on_token and on_token(token) is False) or len(out) == max_new_tokens:
                break
            logits = self.decode(token)
            self.history.append(token)
        if decode_start is not None:
            stats.decode_seconds = time.perf_counter() - decode_start
        return out, stats

    def _common_prefix(self, prompt: list[int]) -> int:
        """How many leading tokens of ``prompt`` the cache already holds (at least one token
        is left to prefill: its logits are needed)."""
        n = 0
        for a, b in zip(self.history, prompt[:-1]):
            if a != b:
                break
            n += 1
        return n


CONTEXT_TOKENS = 4  # prompt tokens a TextStream decodes after


class TextStream:
    """Turns tokens into the text each adds, holding back an incomplete multi-byte character.

    ``tokenizers``' ``DecodeStream`` decodes only the last few tokens at each step (the text
    of the tokens since the last complete character, minus that of the ones before it), so a
    token costs the same at any length of output; decoding the whole output at every token
    grows with its length. The pieces join to the text the tokens add to ``context`` (the
    prompt's last tokens), or without one to ``tokenizer.decode`` of all the tokens.
    """

    def __init__(self, tokenizer, context: list[int] | tuple[int, ...] = ()):
        from tokenizers.decoders import DecodeStream

        # The stream continues ``context`` (the prompt's last tokens): a SentencePiece decoder
        # drops the space in front of the text's first token, which the output's first token
        # is not.
        self.tokenizer = tokenizer
        self.decoder = DecodeStream(ids=list(context[-CONTEXT_TOKENS:]), skip_special_tokens=True)

    def push(self, token: int) -> str:
        return self.decoder.step(self.tokenizer, token) or ""


class StopText:
    """The text of a token stream up to the first of ``stop`` strings: ``push`` returns the text
    that is safe to show (text that could be the start of a stop string is held back until
    the next tokens decide), ``flush`` what is held back once the stream ends otherwise."""

    def __init__(self, tokenizer, stop: list[str] | tuple[str, ...] = (),
                 context: list[int] | tuple[int, ...] = ()):
        self.stream, self.stop = TextStream(tokenizer, context), [s for s in stop if s]
        self.held, self.stopped = "", False

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self.held += self.stream.push(token)
        cut = min((i for i in (self.held.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self.held = self.held[:cut], ""
            return out
        hold = max((n for s in self.stop for n in range(min(len(s) - 1, len(self.held)), 0, -1)
                    if self.held.endswith(s[:n])), default=0)
        out, self.held = self.held[:len(self.held) - hold], self.held[len(self.held) - hold:]
        return out

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out
