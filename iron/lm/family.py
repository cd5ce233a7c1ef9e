"""What the language-model runtime needs of a decoder family, so that its checkpoint readers
and GGUF importer serve every family alike.

A family (the Llama family, with its variants, lives in ``apps/llama/``) names its tensors
and reads its hyper-parameters; the runtime reads files, checks them against what the family
says, and never names a tensor itself.  A family's config object carries at least the fields
of a Hugging Face ``config.json`` the runtime reads: ``vocab_size``, ``bos_token_id``,
``eos_token_id`` (an id, a tuple of them, or None), ``max_position_embeddings`` and
``to_json_dict()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Family(Protocol):
    """A decoder family: its config, its tensors in Hugging Face names, its GGUF mapping."""

    #: Tensors each layer holds at the least: a config claiming more layers than the files can
    #: hold is refused before a table of its size is built.
    tensors_per_layer: int

    def config_from_json(self, path: Path) -> Any:
        """The validated config of ``config.json`` at ``path``."""

    def expected_tensors(self, config: Any) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint of ``config`` must hold: name -> ``[out, in]`` shape."""

    def tolerated_tensors(self, config: Any) -> dict[str, tuple[int, ...]]:
        """Tensors a checkpoint may hold besides those, unused (a tied ``lm_head``)."""

    def gguf_config(self, reader: Any, source: str) -> tuple[Any, dict[str, Any]]:
        """The config of a GGUF file's metadata, and its token ids and chat template."""

    def hf_name(self, gguf_name: str) -> str:
        """The Hugging Face name of GGUF tensor ``gguf_name``."""

    def from_gguf_rows(self, config: Any, name: str, w: np.ndarray) -> np.ndarray:
        """The rows of tensor ``name`` (float32 values, or whole rows of blocks) in Hugging
        Face order: llama.cpp's converters reorder some (q and k, for interleaved RoPE)."""
