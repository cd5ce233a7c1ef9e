"""The Llama application's ``App``: what the build needs of a Llama checkpoint (its options
are declared in the package's ``VARIABLES``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from iron.errors import IronError
from iron.pipeline.app import Application
from iron.lm.layout import LmMeta
from iron.memory import available_memory

from . import DEFAULT_BATCH
from .family import FAMILY, open_checkpoint
from .programs import batch_sizes, record, tail_chunk
from .weights import kernel_weights, weight_formats

#: Prompt rows per prefill call; longer prompts take several chunks. A bundle also holds a
#: program for half a chunk, for a prompt's last rows: each call streams every weight once,
#: so big chunks serve long prompts, and the small one spares a short prompt (or a short rest)
#: the padding of a big one (README, Performance, has the measured times).
PREFILL_CHUNK = 64
DEFAULT_PROMPT = "Once upon a time, there was a little"
#: The share of the memory available at build time the KV caches of a full batch may take
#: by default; a checkpoint whose own context needs more gets a smaller default.
KV_MEMORY_SHARE = 0.5


class App(Application):
    name = "llama"

    def __init__(self, checkpoint: str | Path | None = None, context: int | None = None,
                 chunk: int = PREFILL_CHUNK, weights: str = "native", group: int = 128,
                 batch: int = DEFAULT_BATCH):
        """``weights``: one of WEIGHT_MODES (see ``weights.weight_formats``); ``group``: the
        uint4 group size; ``batch``: the most sequences a batched decode program holds."""
        if checkpoint is None:
            from iron.lm.gguf_import import ensure_default_checkpoint
            from iron.paths import build_dir

            checkpoint = ensure_default_checkpoint(build_dir(), FAMILY)
        elif str(checkpoint).lower().endswith(".gguf"):
            from iron.lm.gguf_import import ensure_checkpoint

            checkpoint = ensure_checkpoint(checkpoint, FAMILY)
        self.checkpoint = open_checkpoint(checkpoint)
        self.config = self.checkpoint.config
        limit = self.config.max_position_embeddings
        if context is not None and context > limit:
            raise IronError(f"context={context}: the checkpoint {checkpoint} holds at most "
                            f"{limit} positions (max_position_embeddings)")
        self.context = int(context) if context else default_context(self.config, batch)
        self.chunk = int(chunk)
        self.weight_mode, self.group = weights, int(group)
        self.formats = weight_formats(self.checkpoint, weights, self.group)
        self.batch = int(batch)

    def weights_key(self) -> dict[str, Any]:
        """What the weights depend on: the checkpoint's files and the weight formats (not the
        context nor the batch), so bundles that differ only in those share one weights file."""
        files = {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in self.sources()}
        return {"checkpoint": str(self.checkpoint.directory.resolve()), "files": files,
                "formats": {n: list(f) for n, f in sorted(self.formats.items())}}

    def weights_sources(self) -> list[Path]:
        """The code that converts and loads the checkpoint (``gguf_import.converter_sources``:
        this package, with its stacking and RoPE table, and the ``iron`` modules that read
        and convert checkpoints); an edit of an unrelated module here costs one rewrite of the
        weights, a missed one would leave them stale."""
        from iron.lm.gguf_import import converter_sources

        return converter_sources(FAMILY)

    def programs(self, device, profile) -> dict:
        return record(self.config, self.context, self.chunk, device, profile, self.formats,
                      self.batch)

    def tuned_programs(self, device, profile) -> dict:
        """The programs the tuner times: the batched decode programs take every tunable from
        the one-row decode and head programs, so they have nothing of their own to tune."""
        return record(self.config, self.context, self.chunk, device, profile, self.formats)

    def phases(self) -> dict[str, tuple[tuple[str, ...], int]]:
        """What the tuner's whole-model A/B reports per phase: a decode token runs the decode
        and head programs; prefill runs ``chunk`` tokens per call of the prefill program."""
        return {"decode": (("decode", "head"), 1), "prefill": (("prefill",), self.chunk)}

    def weights(self) -> Iterator[tuple[str, np.ndarray]]:
        return kernel_weights(self.checkpoint, self.config, self.formats)

    def files(self) -> dict[str, Path]:
        """The tokenizer, the config and, where the checkpoint has them, its tokenizer config,
        chat template (``tokenizer_config.json``'s ``chat_template``, or the separate
        ``chat_template.jinja`` newer transformers versions write) and sampling defaults
        (``generation_config.json``, which the server follows)."""
        d = self.checkpoint.directory
        files = {"tokenizer.json": self.checkpoint.tokenizer_path, "config.json": d / "config.json"}
        for name in ("tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
            if (d / name).is_file():
                files[name] = d / name
        return files

    def sources(self) -> list[Path]:
        return sorted(p for p in self.checkpoint.directory.iterdir() if p.is_file())

    def run_command(self, bundle: Path, prompt: str | None = None,
                    options: dict[str, str] | None = None) -> list[str]:
        """``iron.lm.run`` on ``bundle``; ``options`` (doit variables such as ``top_k``,
        ``stop``, ``chat``) become its flags, which it validates. Without ``--chat`` the
        default prompt is the bundle's.  Each flag and its value are one word,
        ``--prompt=VALUE``, so that no value (``-hello``, ``--help``) is read as an option."""
        options = {k: v for k, v in (options or {}).items() if v is not None}
        argv = [sys.executable, "-m", "iron.lm.run", str(bundle)]
        chat = str(options.pop("chat", "")).lower() in ("1", "true", "yes")
        if prompt or not chat:
            argv.append(f"--prompt={prompt or DEFAULT_PROMPT}")
        if chat:
            argv.append("--chat")
        for name, value in options.items():
            argv.append(f"--{name.replace('_', '-')}={value}")
        return argv

    def meta(self) -> dict[str, Any]:
        c = self.config
        eos = c.eos_token_id
        return LmMeta(context=self.context, chunk=self.chunk, tail_chunk=tail_chunk(self.chunk),
                      vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                      bos_token_id=c.bos_token_id,
                      eos_token_ids=tuple(eos) if isinstance(eos, tuple) else
                      (() if eos is None else (eos,)),
                      default_prompt=DEFAULT_PROMPT, weights=self.weight_mode,
                      weight_formats={n: tuple(f) for n, f in sorted(self.formats.items())},
                      model_name=self.checkpoint.directory.name,
                      batch_sizes=tuple(batch_sizes(self.batch))).to_json()


def kv_bytes_per_position(config) -> int:
    """Bytes of KV cache one sequence needs per position: keys and values of every layer, in
    bfloat16."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2


def default_context(config, batch: int = DEFAULT_BATCH) -> int:
    """The checkpoint's own context, unless the KV caches of ``batch`` sequences at that
    length take more than ``KV_MEMORY_SHARE`` of the memory available: then the largest power
    of two (at least 256) that fits, said in one line."""
    own = config.max_position_embeddings
    per_position = kv_bytes_per_position(config) * max(int(batch), 1)
    budget = available_memory() * KV_MEMORY_SHARE
    if own * per_position <= budget:
        return own
    chosen = 256
    while chosen * 2 <= own and chosen * 2 * per_position <= budget:
        chosen *= 2
    print(f"context: {chosen} positions (the checkpoint's {own} would need "
          f"{own * per_position / 2**30:.1f} GiB of KV cache for {batch} sequences; "
          f"{budget / 2**30:.1f} GiB is half the memory available); context=N sets it",
          file=sys.stderr)
    return chosen
