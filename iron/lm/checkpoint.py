"""Decoder checkpoints in Hugging Face layout, read without executing anything from them.

A checkpoint is a directory holding

- ``config.json``: the model hyper-parameters, validated by the checkpoint's family
  (``iron.lm.family``; the Llama family's is ``apps.llama.config.LlamaConfig``);
- ``model.safetensors``, or ``model.safetensors.index.json`` plus the shards it names;
- ``tokenizer.json``: parsed here (by ``tokenizers``), so a damaged one fails at checkpoint
  time rather than in a built bundle.

Every file must resolve inside the directory: a symlink to a file elsewhere is refused, so a
bundle never copies in a file its checkpoint does not hold.  A config whose layer count is
larger than the weights can hold is refused before anything the size of the model is built.

Safetensors headers are parsed and checked by ``iron.tensorfile``; tensors are numpy views over
a read-only memory map, in the dtype stored (bfloat16 is ``ml_dtypes.bfloat16``). The set of
tensors must be exactly the family's ``expected_tensors``, in Hugging Face names and
``[out, in]`` shapes::

    ckpt = Checkpoint.open("build/checkpoints/smollm2-135m-instruct", family)
    w = ckpt.tensor("model.layers.0.self_attn.q_proj.weight")    # (576, 576) bfloat16
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from iron.errors import CheckpointError, IronError
from iron.tensorfile import (TensorInfo, read_safetensors, read_safetensors_header,
                             tensor_view)
from iron.jsonfile import loads
from iron.util import read_bounded

from .family import Family

__all__ = ["CheckpointError", "Checkpoint", "TensorInfo", "read_safetensors",
           "read_safetensors_header"]


# Tensors some exporters add that carry nothing the config does not already say.
_HARMLESS = re.compile(r"(model\.layers\.\d+\.self_attn\.|model\.)rotary_emb\.inv_freq")


# ---------------------------------------------------------------------------------------------
# the checkpoint

class Checkpoint:
    """An open, validated checkpoint directory; tensors are read-only memory-mapped views."""

    def __init__(self, directory: Path, family: Family, config: Any, tokenizer_path: Path,
                 entries: dict[str, tuple[np.memmap, TensorInfo]],
                 blocks: dict[str, tuple[str, np.memmap, TensorInfo]] | None = None):
        self.directory = directory
        self.family = family
        self.config = config
        self.tokenizer_path = tokenizer_path
        self._entries = entries
        self._blocks = blocks or {}

    @classmethod
    def open(cls, directory: str | Path, family: Family) -> Checkpoint:
        """Open ``directory``, a checkpoint of ``family``; raise :class:`CheckpointError`
        naming what is wrong."""
        directory = Path(directory)
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: checkpoint directory does not exist")
        config = family.config_from_json(_inside(directory, "config.json"))
        tokenizer_path = directory / "tokenizer.json"
        if not tokenizer_path.is_file():
            raise CheckpointError(f"{tokenizer_path}: missing; a checkpoint directory needs "
                                  "the Hugging Face tokenizer.json")
        _check_vocabulary(directory, config, load_tokenizer(_inside(directory, "tokenizer.json")))
        infos: dict[str, tuple[Path, TensorInfo]] = {}
        data_start: dict[Path, int] = {}
        shards = _shards(directory)
        for shard in shards:
            _inside(directory, shard.name)
        for shard, names in shards.items():
            start, header = read_safetensors_header(shard)
            data_start[shard] = start
            if names is not None:
                _check_shard_matches_index(directory, shard, names, header)
            for name, info in header.items():
                if name in infos:
                    raise CheckpointError(f"{directory}: tensor {name!r} is in both "
                                          f"{infos[name][0].name} and {shard.name}")
                infos[name] = (shard, info)
        for name in [n for n in infos if _HARMLESS.fullmatch(n)]:
            del infos[name]
        _check_size(directory, family, config, len(infos))
        _check_tensors(directory, family, config, {n: i.shape for n, (_, i) in infos.items()})
        maps = {shard: _memmap(shard, start) for shard, start in data_start.items()}
        entries = {n: (maps[shard], info) for n, (shard, info) in infos.items()}
        return cls(directory, family, config, tokenizer_path, entries,
                   _open_blocks(directory, family.expected_tensors(config)))

    def tensor_names(self) -> list[str]:
        """Names of the checkpoint's tensors, in the family's ``expected_tensors`` order."""
        want = self.family.expected_tensors(self.config)
        return [n for n in want if n in self._entries] + sorted(
            n for n in self._entries if n not in want)

    def tensor(self, name: str) -> np.ndarray:
        """The stored tensor ``name``: a read-only view in its stored dtype."""
        try:
            mm, info = self._entries[name]
        except KeyError:
            raise CheckpointError(f"{self.directory}: no tensor {name!r} in this checkpoint "
                                  "(see Checkpoint.tensor_names())") from None
        return tensor_view(mm, info)

    def quantized(self, name: str) -> tuple[str, np.ndarray] | None:
        """The tensor ``name`` as the source file's own blocks or halves: (format, uint8 array
        in the row layout of ``iron.quant``; bundles tile it), or None when it is stored in a
        format the kernels do not run as it is (bf16 or float32 runs as bf16).

        A matrix a safetensors file stores as float16 is format f16, its bytes as they are:
        rounding it to bf16 would keep 8 of its 11 significant bits, and a GGUF F16 tensor is
        kept the same way (in ``quantized.safetensors``)."""
        if name in self._blocks:
            fmt, mm, info = self._blocks[name]
            return fmt, tensor_view(mm, info)
        if name in self._entries and self._entries[name][1].dtype == "F16":
            halves = self.tensor(name)
            if halves.ndim == 2:
                return "f16", halves.view(np.uint8)
        return None

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.directory)!r}, {len(self._entries)} tensors)"


def _inside(directory: Path, name: str) -> Path:
    """``directory / name``, refused if it resolves outside ``directory`` (a symlink out)."""
    path = directory / name
    real, root = path.resolve(), directory.resolve()
    if path.exists() and not real.is_relative_to(root):
        raise CheckpointError(f"{path}: resolves to {real}, outside the checkpoint directory "
                              f"{root}; copy the file in instead of linking to it")
    return path


def load_tokenizer(path: Path, error: type[IronError] = CheckpointError):
    """``tokenizer.json`` parsed (at most ``MAX_USER_FILE`` bytes of a regular file), or
    ``error`` in one line: a checkpoint's at open, since a bundle must not carry one its runtime
    cannot load, and a bundle's before its weights are read."""
    from tokenizers import Tokenizer

    try:
        text = read_bounded(path, "a tokenizer").decode("utf-8")
    except OSError as e:
        raise error(f"{path}: cannot read the tokenizer ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises its own Exception type for every parse error
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise error(f"{path}: not a tokenizer the tokenizers library can load "
                    f"({first})") from None


def _check_vocabulary(directory: Path, config: Any, tokenizer) -> None:
    """The embedding (``vocab_size`` rows) must cover every id the tokenizer gives, and each
    special token id must be a row of it and a token of the tokenizer: otherwise higher ids
    embed as nothing and generation stops on a token that cannot occur."""
    ids = tokenizer.get_vocab(with_added_tokens=True)
    highest = max(ids.values(), default=-1)
    where = directory / "config.json"
    if highest >= config.vocab_size:
        token = next(t for t, i in ids.items() if i == highest)
        raise CheckpointError(f"{where}: vocab_size = {config.vocab_size} is too small for "
                              f"tokenizer.json, which gives {token!r} the id {highest}; the "
                              "embedding needs a row for every token id")
    eos = config.eos_token_id if isinstance(config.eos_token_id, tuple) else (
        config.eos_token_id,)
    for field, values in (("bos_token_id", (config.bos_token_id,)), ("eos_token_id", eos)):
        for value in values:
            if value is not None and (value >= config.vocab_size
                                      or tokenizer.id_to_token(value) is None):
                raise CheckpointError(
                    f"{where}: {field} = {value} is not a token id of this model: the "
                    f"embedding has {config.vocab_size} rows and tokenizer.json's ids end at "
                    f"{highest}")


#: Tensors a checkpoint holds besides its layers: the embedding, the final norm, lm_head.
_OTHER_TENSORS = 3


def _check_size(directory: Path, family: Family, config: Any, found: int) -> None:
    """Refuse a layer count the files cannot hold before a table of that size is built."""
    least = family.tensors_per_layer * config.num_hidden_layers
    if least > found + _OTHER_TENSORS:
        raise CheckpointError(
            f"{directory / 'config.json'}: num_hidden_layers = {config.num_hidden_layers} "
            f"needs at least {least} tensors, the checkpoint holds {found}; the config does "
            "not describe these weights")


BLOCKS_FILE = "quantized.safetensors"


def _open_blocks(directory: Path, want: dict[str, tuple[int, ...]]
                 ) -> dict[str, tuple[str, np.ndarray, TensorInfo]]:
    """The checkpoint's quantized blocks (``quantized.safetensors``, written by the GGUF
    importer), each checked against its tensor's shape in ``want`` (the config's tensors)."""
    from iron import quant
    from iron.tensorfile import read_safetensors_metadata

    path = directory / BLOCKS_FILE
    if not path.is_file():
        return {}
    start, infos = read_safetensors_header(path)
    formats = read_safetensors_metadata(path)
    mm = _memmap(path, start)
    blocks = {}
    for name, info in infos.items():
        fmt = formats.get(name)
        if name not in want:
            raise CheckpointError(f"{path}: tensor {name!r} is not a tensor of this config")
        if fmt not in quant.GGUF_TYPES.values():
            known = ", ".join(quant.GGUF_TYPES.values())
            raise CheckpointError(f"{path}: tensor {name!r} has format {fmt!r} in the "
                                  f"metadata; expected one of {known}")
        rows, k = want[name]
        group = quant.GROUPS[fmt][0]  # a GGUF file's blocks
        whole = k % group == 0 or fmt in quant.PLAIN  # f16 rows: any K
        shape = (rows, quant.row_bytes(fmt, k, group)) if whole else None
        if info.dtype != "U8" or info.shape != shape:
            raise CheckpointError(f"{path}: tensor {name!r} is {info.dtype} {info.shape}; a "
                                  f"{fmt} {want[name]} tensor must be U8 {shape}")
        blocks[name] = (fmt, mm, info)
    return blocks


def _memmap(path: Path, start: int) -> np.ndarray:
    length = path.stat().st_size - start
    if length == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r", offset=start, shape=(length,))


def _shards(directory: Path) -> dict[Path, set[str] | None]:
    """Shard path -> tensor names the index assigns to it (None for a single file)."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file() and index.is_file():
        raise CheckpointError(f"{directory}: has both model.safetensors and "
                              "model.safetensors.index.json; remove the stale one")
    if single.is_file():
        return {single: None}
    if not index.is_file():
        raise CheckpointError(f"{directory}: no model.safetensors nor "
                              "model.safetensors.index.json; the weights are missing")
    try:
        data = loads(read_bounded(index, "a shard index"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{index}: cannot read the shard index ({e})") from e
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: needs a non-empty 'weight_map' object "
                              "(tensor name -> shard file name)")
    shards: dict[Path, set[str] | None] = {}
    for name, file in weight_map.items():
        if not isinstance(file, str) or Path(file).name != file or not file.endswith(
                ".safetensors"):
            raise CheckpointError(f"{index}: weight_map[{name!r}] = {file!r} must be the name "
                                  "of a .safetensors file in the same directory")
        path = directory / file
        if not path.is_file():
            raise CheckpointError(f"{index}: shard {file!r} (holding {name!r}) does not exist")
        shards.setdefault(path, set()).add(name)
    return shards


def _check_shard_matches_index(directory: Path, shard: Path, names: set[str],
                               header: dict[str, TensorInfo]) -> None:
    absent = sorted(names - header.keys())
    if absent:
        raise CheckpointError(f"{directory}: the index puts tensor {absent[0]!r} in "
                              f"{shard.name}, which does not contain it")
    unlisted = sorted(header.keys() - names)
    if unlisted:
        raise CheckpointError(f"{directory}: {shard.name} holds tensor {unlisted[0]!r}, which "
                              "the index does not list")


def _check_tensors(directory: Path, family: Family, config: Any,
                   found: dict[str, tuple[int, ...]]) -> None:
    """Every problem with the tensor set, reported together; each line names one tensor."""
    want = family.expected_tensors(config)
    tolerated = family.tolerated_tensors(config)
    problems = []
    for name, shape in want.items():
        if name not in found:
            problems.append(f"missing tensor {name!r} (expected shape {shape})")
        elif found[name] != shape:
            problems.append(f"tensor {name!r} has shape {found[name]}, expected {shape}")
    for name, shape in found.items():
        if name in want:
            continue
        if name in tolerated:
            if shape != tolerated[name]:
                problems.append(f"tensor {name!r} has shape {shape}, expected "
                                f"{tolerated[name]} (unused, but it must match)")
            continue
        problems.append(f"unexpected tensor {name!r} with shape {shape} (not in a "
                        "checkpoint of this config)")
    if problems:
        listed = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise CheckpointError(f"{directory}: {len(problems)} tensor problem(s) against "
                              f"config.json:\n  {listed}{more}")

