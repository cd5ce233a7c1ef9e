"""Structured output: JSON that follows a schema, enforced token by token while decoding.

llguidance (Microsoft's grammar engine, the one llama.cpp and vLLM can use) compiles a JSON
schema into a grammar and, at each step, tells which tokens of the vocabulary may come next;
the others get a logit of minus infinity before the sampler sees them, so whatever is sampled
keeps the text a prefix of a valid document, and the end token is allowed only once the
document is complete. An answer that ends with an end token therefore parses and validates;
one cut by ``max_tokens`` is incomplete (finish reason "length"), as with OpenAI.

The JSON is written in one fixed layout, ``{"key": value, "key": [1, 2]}``: no free whitespace,
so a small model cannot wander into endless blank lines inside a document.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np

from ..errors import IronError

#: the layout of generated JSON: no whitespace but the single spaces after ':' and ','
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(IronError, ValueError):
    """A schema llguidance cannot compile or cannot follow (it may fail at any step: a
    5000-way ``anyOf`` passes its limit on a parser row only once decoding reaches it), or
    llguidance is not installed."""


class JsonGrammars:
    """Compiles schemas for one model's tokenizer (the tokenizer is converted once, ~1 s)."""

    def __init__(self, tokenizer, eos: list[int], vocab_size: int):
        self.tokenizer, self.eos, self.vocab_size = tokenizer, eos, vocab_size
        self._ll = None
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Convert the tokenizer now, if llguidance is installed: the conversion holds the GIL
        (0.3-0.6 s for a 49k vocabulary), which would stall every stream of a server when its
        first schema request is prepared."""
        try:
            self._ll_tokenizer()
        except GrammarError:
            pass  # not installed: a request with a schema is refused, saying so

    def _ll_tokenizer(self):
        with self._lock:
            if self._ll is None:
                try:
                    import llguidance
                except ImportError:
                    raise GrammarError("response_format needs llguidance: pip install -e "
                                       "'.[serve]'") from None
                self._ll = llguidance.LLTokenizer(self.tokenizer.to_str(),
                                                  n_vocab=self.vocab_size, eos_token=self.eos)
            return self._ll

    def matcher(self, schema: dict[str, Any]):
        """A fresh llguidance matcher of ``schema``; ``GrammarError`` naming what it refused."""
        tokenizer = self._ll_tokenizer()
        from llguidance import LLMatcher, LLParserLimits

        try:
            grammar = LLMatcher.grammar_from_json_schema(schema, overrides=LAYOUT)
        except (ValueError, TypeError) as e:
            raise GrammarError(f"the schema is not usable: {e}") from None
        matcher = LLMatcher(tokenizer, grammar, log_level=0, limits=LLParserLimits(
            verbose_errors=False))  # one-line errors, without the parser's state
        if not matcher.is_error():  # a schema that compiles may still fail at its first step
            matcher.compute_bitmask()  # ($ref loops, a schema that refers to itself alone)
        if matcher.is_error():
            raise GrammarError(f"the schema is not usable: {first_line(matcher.get_error())}")
        return matcher


def first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "no reason given"


class Constrained:
    """A sampler whose choices a grammar matcher restricts: same interface as ``Sampler``
    (``start(prompt)``, then a call per token with the logits), plus ``ready()``.

    With an ``executor``, each token's mask is computed there, never on the thread that runs
    the engine's steps (a server's event loop): the first at ``start``, each next one as soon
    as a token is consumed, so it is computed while the next decode step runs (llguidance
    releases the GIL while it computes a mask). ``ready()`` says whether the mask is in; an
    engine samples the sequence only then, and the other sequences keep decoding meanwhile.
    Without one, the mask is computed in the call."""

    def __init__(self, sampler, matcher, vocab_size: int, executor: Executor | None = None):
        self.sampler, self.matcher, self.executor = sampler, matcher, executor
        self.words = (vocab_size + 31) // 32
        self.mask = np.zeros(self.words, np.int32)
        self.pending: Future | None = None  # the next token's mask, being computed

    def start(self, prompt: list[int]) -> None:
        self.sampler.start(prompt)
        self._next_mask()

    def ready(self) -> bool:
        """Whether the next token's mask is computed (or will be computed in the call)."""
        return self.pending is None or self.pending.done()

    def _next_mask(self) -> None:
        if self.executor is not None:
            self.pending = self.executor.submit(self._compute_mask)

    def _compute_mask(self) -> None:
        self.matcher.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.mask.nbytes)

    def __call__(self, logits: np.ndarray) -> int:
        if self.pending is None:
            self._compute_mask()
        else:
            pending, self.pending = self.pending, None
            pending.result()  # at once when ready(); re-raises what the computation raised
        if self.matcher.is_error():
            raise GrammarError(f"the grammar failed: {first_line(self.matcher.get_error())}")
        logits = logits.astype(np.float32).ravel()  # a copy: the program's buffer stays as is
        allowed = np.unpackbits(self.mask.view(np.uint8), bitorder="little")[:logits.size]
        logits[allowed == 0] = -np.inf
        token = self.sampler(logits)
        if not self.matcher.consume_token(token):
            raise GrammarError(f"the grammar refused token {token}: "
                               f"{first_line(self.matcher.get_error())}")
        self._next_mask()
        return token
