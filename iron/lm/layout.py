"""What a language-model bundle holds, named once: the application writes it, the generator
reads it.

Programs (all share the KV cache, a state tensor per layer and per k / v):

- ``DECODE``: one token at one position -> the last hidden state;
- ``PREFILL``: a chunk of ``chunk`` prompt tokens -> their hidden states;
- ``PREFILL_TAIL``: the same for ``tail_chunk`` tokens, a prompt's last rows;
- ``HEAD``: one hidden state -> logits.

The bundle's ``meta`` is ``LmMeta`` as JSON.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import BundleError

DECODE, PREFILL, PREFILL_TAIL, HEAD = "decode", "prefill", "prefill_tail", "head"
PROGRAMS = (DECODE, PREFILL, PREFILL_TAIL, HEAD)


@dataclass(frozen=True)
class LmMeta:
    """The data a language-model bundle's runtime needs beyond its programs."""

    context: int  # KV cache positions
    chunk: int  # rows of the PREFILL program
    tail_chunk: int  # rows of the PREFILL_TAIL program
    vocab_size: int
    hidden_size: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    default_prompt: str
    weights: str  # which weights the bundle was built with: native, bf16, uint4
    weight_formats: Mapping[str, tuple[str, int]]  # quantized weight -> (format, group size)

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["eos_token_ids"] = list(self.eos_token_ids)
        doc["weight_formats"] = {n: list(f) for n, f in self.weight_formats.items()}
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str) -> LmMeta:
        """Read a manifest's meta; a missing or extra key is a ``BundleError`` naming it."""
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in doc]
        if missing:
            raise BundleError(f"{where}: meta lacks {', '.join(missing)}; rebuild the bundle")
        values = {n: doc[n] for n in names}
        for name in ("context", "chunk", "tail_chunk", "vocab_size", "hidden_size"):
            if type(values[name]) is not int or values[name] < 1:
                raise BundleError(f"{where}: meta.{name} = {values[name]!r:.40} must be a "
                                  "positive integer")
        eos = values["eos_token_ids"]
        if not (isinstance(eos, list) and all(type(t) is int and t >= 0 for t in eos)):
            raise BundleError(f"{where}: meta.eos_token_ids = {eos!r:.40} must list token ids")
        if type(values["default_prompt"]) is not str:
            raise BundleError(f"{where}: meta.default_prompt must be text")
        values["eos_token_ids"] = tuple(eos)
        formats = values["weight_formats"]
        if not isinstance(formats, dict):
            raise BundleError(f"{where}: meta.weight_formats must map weights to formats")
        values["weight_formats"] = {n: tuple(f) for n, f in formats.items()}
        return cls(**values)
