"""Text generation on a Llama bundle: prefill in chunks, decode token by token, sample.

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
from ..errors import IronError
from .layout import DECODE, HEAD, PREFILL, PREFILL_TAIL, LmMeta


def chat_prompt(text: str) -> str:
    """The ChatML template of SmolLM2-Instruct for a single user turn."""
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


@dataclass
class Sampler:
    """Greedy when ``temperature`` is 0, else temperature / top-k / top-p sampling."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    rng: np.random.Generator = field(init=False)

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)

    def __call__(self, logits: np.ndarray) -> int:
        logits = logits.astype(np.float32).ravel()
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
        return int(self.rng.choice(order, p=p))


@dataclass
class Stats:
    prompt_tokens: int = 0
    new_tokens: int = 0
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


class LlamaModel:
    """A loaded Llama bundle: forward passes with a persistent KV cache."""

    def __init__(self, bundle: Bundle | str | Path,
                 weights: dict[str, np.ndarray] | None = None, emulate: bool = False):
        """Load ``bundle``; ``weights`` (another bundle's of the same checkpoint) are used
        instead of reading this bundle's own, so that two builds compared side by side read
        the very same memory; ``emulate`` runs an npu bundle in the emulator."""
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle)
        self.bundle.check_runnable(emulate)
        self.meta = meta = LmMeta.from_json(self.bundle.meta, str(self.bundle.path))
        self.context, self.chunk, self.tail_chunk = meta.context, meta.chunk, meta.tail_chunk
        self.eos = set(meta.eos_token_ids)
        weights = self.bundle.weights() if weights is None else weights
        self.decode_exe = self.bundle.executable(DECODE, weights, emulate)
        self.prefill_exe = self.bundle.executable(PREFILL, weights, emulate)
        self.tail_exe = self.bundle.executable(PREFILL_TAIL, weights, emulate)
        self.head_exe = self.bundle.executable(HEAD, weights, emulate)
        self.kv = {name: np.zeros(t.shape, t.dtype)
                   for name, t in self.decode_exe.program.named("state").items()}
        self.decode_exe.bind_state(self.kv)
        self.prefill_exe.bind_state(self.kv)
        self.tail_exe.bind_state(self.kv)
        self.position = 0
        self._one = np.zeros(1, np.int32)
        self._pos = np.zeros(1, np.int32)

    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.bundle.file("tokenizer.json")))

    def reset(self) -> None:
        """Forget the conversation: later tokens start at position 0 (old cache rows are
        overwritten before they are read)."""
        self.position = 0

    def _check_room(self, n: int, what: str = "") -> None:
        if self.position + n > self.context:
            raise IronError(f"{what or f'{self.position + n} tokens'} do not fit the bundle's "
                            f"context of {self.context} positions; shorten the prompt or rebuild "
                            "the bundle with a larger context (doit context=N)")

    def _chunks(self, tokens: list[int]) -> Iterator[np.ndarray]:
        """Run prompt tokens through the prefill programs a chunk at a time (the tail program
        once no more than its rows are left); yield each chunk's hidden states (a view of the
        program's output buffer, valid until the next call)."""
        self._check_room(len(tokens))
        start = 0
        while start < len(tokens):
            left = len(tokens) - start
            rows, exe = ((self.tail_chunk, self.tail_exe) if left <= self.tail_chunk
                         else (self.chunk, self.prefill_exe))
            part = tokens[start:start + rows]
            ids = np.zeros(rows, np.int32)  # the last chunk is padded: its extra rows write
            ids[: len(part)] = part  # cache rows past the prompt, overwritten later
            pos = np.arange(self.position, self.position + rows, dtype=np.int32)
            (out,) = exe.run([ids, pos], copy=False)
            self.position += len(part)
            start += len(part)
            yield out[: len(part)]

    def prefill(self, tokens: list[int]) -> np.ndarray:
        """Run prompt tokens through the model; return the logits after the last one."""
        if not tokens:
            raise IronError("the prompt is empty: give at least one token")
        for hidden in self._chunks(tokens):
            pass
        return self.head(hidden[-1:])

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
                 on_token: Callable[[int], None] | None = None,
                 stop_at_eos: bool = True) -> tuple[list[int], Stats]:
        """Generate up to ``max_new_tokens`` after ``prompt``, stopping at an end token unless
        ``stop_at_eos`` is False (benchmarks generate a fixed count)."""
        sampler = sampler or Sampler()
        self.reset()
        self._check_room(len(prompt) + max(max_new_tokens - 1, 0),
                         f"a prompt of {len(prompt)} tokens and {max_new_tokens} new tokens")
        stats = Stats(prompt_tokens=len(prompt))
        start = time.perf_counter()
        logits = self.prefill(prompt)
        stats.prefill_seconds = time.perf_counter() - start
        out: list[int] = []
        decode_start = None
        while len(out) < max_new_tokens:
            token = sampler(logits)
            out.append(token)
            if decode_start is None:
                decode_start = time.perf_counter()
                stats.time_to_first_token = decode_start - start
            if on_token:
                on_token(token)
            if (stop_at_eos and token in self.eos) or len(out) == max_new_tokens:
                break
            logits = self.decode(token)
        stats.new_tokens = len(out)
        if decode_start is not None:
            stats.decode_seconds = time.perf_counter() - decode_start
        return out, stats


class TextStream:
    """Turns tokens into the text each adds, holding back an incomplete multi-byte character."""

    def __init__(self, tokenizer):
        self.tokenizer, self.tokens, self.shown = tokenizer, [], ""

    def push(self, token: int) -> str:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens)
        if text.endswith("\ufffd"):
            return ""
        new, self.shown = text[len(self.shown):], text
        return new
