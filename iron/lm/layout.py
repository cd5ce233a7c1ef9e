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
    model_name: str = ""  # the id a server gives the model (the checkpoint's folder name)
    batch_sizes: tuple[int, ...] = ()  # rows of the decode_slots programs

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["eos_token_ids"] = list(self.eos_token_ids)
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
        values["eos_token_ids"] = tuple(values["eos_token_ids"])
        values["batch_sizes"] = tuple(values.get("batch_sizes", ()))
        return cls(**values)
