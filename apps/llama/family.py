"""The Llama family as the language-model runtime sees it (``iron.lm.family.Family``): its
config, its tensors and its GGUF mapping, gathered from the modules that define them."""

from __future__ import annotations

from pathlib import Path

from iron.lm.checkpoint import Checkpoint

from . import gguf, weights
from .config import LlamaConfig


class LlamaFamily:
    """Llama-architecture decoders (``iron.lm.family.Family``)."""

    tensors_per_layer = weights.TENSORS_PER_LAYER

    @staticmethod
    def config_from_json(path: Path) -> LlamaConfig:
        return LlamaConfig.from_json(path)

    expected_tensors = staticmethod(weights.expected_tensors)
    tolerated_tensors = staticmethod(weights.tolerated_tensors)
    gguf_config = staticmethod(gguf.gguf_config)
    hf_name = staticmethod(gguf.hf_name)
    from_gguf_rows = staticmethod(gguf.from_gguf_rows)


FAMILY = LlamaFamily()


def open_checkpoint(directory: str | Path) -> Checkpoint:
    """The Llama-family checkpoint in ``directory``, checked (``Checkpoint.open``)."""
    return Checkpoint.open(directory, FAMILY)
