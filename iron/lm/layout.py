"""What a language-model bundle holds, named once: the application writes it, the generator
reads it.

Programs (all share the KV cache, a state tensor per layer and per k / v):

- ``DECODE``: one token at one position -> the last hidden state;
- ``PREFILL``: a chunk of ``chunk`` prompt tokens -> their hidden states;
- ``PREFILL_TAIL``: the same for ``tail_chunk`` tokens, a prompt's last rows;
- ``HEAD``: one hidden state -> logits;
- ``decode_slots(B)`` for each of ``batch_sizes``: batched decode, one token of each of B
  sequences, each at its own position in its own slot of a KV cache of several sequences
  (every layer's cache gains a leading slot dimension) -> their logits.

The bundle's ``meta`` is ``LmMeta`` as JSON.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import BundleError

DECODE, PREFILL, PREFILL_TAIL, HEAD = "decode", "prefill", "prefill_tail", "head"
PROGRAMS = (DECODE, PREFILL, PREFILL_TAIL, HEAD)


def decode_slots(rows: int) -> str:
    """The name of the batched decode program of ``rows`` sequences."""
    return f"decode_slots{rows}"


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
    model_name: str = ""  # the id a server gives the model (the checkpoint's folder name)
    batch_sizes: tuple[int, ...] = ()  # rows of the decode_slots programs

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["eos_token_ids"] = list(self.eos_token_ids)
        doc["weight_formats"] = {n: list(f) for n, f in self.weight_formats.items()}
        doc["batch_sizes"] = list(self.batch_sizes)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str) -> LmMeta:
        """Read a manifest's meta; a missing key (but one with a default, which bundles built
        before it lack) is a ``BundleError`` naming it."""
        fields = dataclasses.fields(cls)
        missing = [f.name for f in fields if f.name not in doc
                   and f.default is dataclasses.MISSING]
        if missing:
            raise BundleError(f"{where}: meta lacks {', '.join(missing)}; rebuild the bundle")
        values = {f.name: doc[f.name] for f in fields if f.name in doc}
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
        values["batch_sizes"] = tuple(values.get("batch_sizes", ()))
        return cls(**values)
