"""The Llama application: a decoder over any Llama-architecture checkpoint in Hugging Face
layout; by default the embedded SmolLM2-135M-Instruct (see iron.lm.gguf_import)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from iron.lm.checkpoint import Checkpoint
from iron.lm.layout import LmMeta

from .model import kernel_weights, record, tail_chunk, weight_formats

#: Prompt rows per prefill call; longer prompts take several chunks. A bundle also holds a
#: program for half a chunk, for a prompt's last rows: each call streams every weight once,
#: so big chunks serve long prompts, and the small one spares a short prompt (or a short rest)
#: the padding of a big one (README, Performance, has the measured times).
PREFILL_CHUNK = 64
#: KV cache positions a bundle holds, unless the model's own context is shorter.
DEFAULT_CONTEXT = 2048
DEFAULT_PROMPT = "Once upon a time, there was a little"


class App:
    name = "llama"

    def __init__(self, checkpoint: str | Path | None = None, context: int | None = None,
                 chunk: int = PREFILL_CHUNK, weights: str = "native", group: int = 128):
        """``weights``: one of WEIGHT_MODES (see ``model.weight_formats``); ``group``: the
        uint4 group size."""
        if checkpoint is None:
            from iron.lm.gguf_import import ensure_default_checkpoint
            from iron.paths import build_dir

            checkpoint = ensure_default_checkpoint(build_dir())
        self.checkpoint = Checkpoint.open(checkpoint)
        self.config = self.checkpoint.config
        limit = self.config.max_position_embeddings
        self.context = min(int(context or DEFAULT_CONTEXT), limit)
        self.chunk = int(chunk)
        self.weight_mode, self.group = weights, int(group)
        self.formats = weight_formats(self.checkpoint, weights, self.group)

    def programs(self, device, profile) -> dict:
        return record(self.config, self.context, self.chunk, device, profile, self.formats)

    def weights(self) -> Iterator[tuple[str, np.ndarray]]:
        return kernel_weights(self.checkpoint, self.config, self.formats)

    def files(self) -> dict[str, Path]:
        return {"tokenizer.json": self.checkpoint.tokenizer_path,
                "config.json": self.checkpoint.directory / "config.json"}

    def sources(self) -> list[Path]:
        return sorted(p for p in self.checkpoint.directory.iterdir() if p.is_file())

    def run_command(self, bundle: Path, prompt: str | None = None) -> list[str]:
        return [sys.executable, "-m", "iron.lm.run", str(bundle),
                "--prompt", prompt or DEFAULT_PROMPT, "--max-new-tokens", "64"]

    def meta(self) -> dict[str, Any]:
        c = self.config
        eos = c.eos_token_id
        return LmMeta(context=self.context, chunk=self.chunk, tail_chunk=tail_chunk(self.chunk),
                      vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                      bos_token_id=c.bos_token_id,
                      eos_token_ids=tuple(eos) if isinstance(eos, tuple) else
                      (() if eos is None else (eos,)),
                      default_prompt=DEFAULT_PROMPT, weights=self.weight_mode,
                      weight_formats={n: tuple(f) for n, f in sorted(self.formats.items())}
                      ).to_json()
