"""Llama checkpoints in Hugging Face layout, read without executing anything from them.

A checkpoint is a directory holding

- ``config.json``: the model hyper-parameters, validated into a frozen :class:`LlamaConfig`;
- ``model.safetensors``, or ``model.safetensors.index.json`` plus the shards it names;
- ``tokenizer.json``: parsed here (by ``tokenizers``), so a damaged one fails at checkpoint
  time rather than in a built bundle.

Every file must resolve inside the directory: a symlink to a file elsewhere is refused, so a
bundle never copies in a file its checkpoint does not hold.  A config whose layer count is
larger than the weights can hold is refused before anything the size of the model is built.

Safetensors headers are parsed and checked by ``iron.tensorfile``; tensors are numpy views over
a read-only memory map, in the dtype stored (bfloat16 is ``ml_dtypes.bfloat16``). The set of
tensors must be exactly :func:`expected_tensors`, in Hugging Face names and ``[out, in]`` shapes::

    ckpt = Checkpoint.open("build/checkpoints/smollm2-135m-instruct")
    w = ckpt.tensor("model.layers.0.self_attn.q_proj.weight")    # (576, 576) bfloat16
    f = inv_freq(ckpt.config)                                    # (32,) float32
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iron.errors import CheckpointError, IronError
from iron.tensorfile import (TensorInfo, read_safetensors, read_safetensors_header,
                             tensor_view)
from iron.jsonfile import loads
from iron.util import read_bounded

__all__ = ["CheckpointError", "Checkpoint", "FrequencyFactors", "LinearRopeScaling",
           "LlamaConfig", "Llama3RopeScaling", "RopeScaling", "TensorInfo", "expected_tensors",
           "inv_freq", "read_safetensors", "read_safetensors_header"]


# ---------------------------------------------------------------------------------------------
# config.json

@dataclass(frozen=True)
class Llama3RopeScaling:
    """The ``rope_type: llama3`` frequency rule of Llama 3.1 (see :func:`inv_freq`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def to_json_dict(self, max_position_embeddings: int) -> dict[str, Any]:
        return {"rope_type": "llama3", **dataclasses.asdict(self)}


@dataclass(frozen=True)
class LinearRopeScaling:
    """``rope_type: linear`` (position interpolation): every frequency divided by ``factor``.

    llama.cpp's ``rope.scaling.type = linear`` is the same rule: it multiplies each angle by
    ``freq_scale = 1 / rope.scaling.factor`` (``llama_model::load_hparams``, ``rope_yarn``).
    """

    factor: float

    def to_json_dict(self, max_position_embeddings: int) -> dict[str, Any]:
        return {"rope_type": "linear", "factor": self.factor}


@dataclass(frozen=True)
class FrequencyFactors:
    """One divisor per RoPE frequency, ``inv_freq[i] = theta ** (-2i / head_dim) / factors[i]``.

    This is what a llama.cpp GGUF stores for Llama 3.1 scaling: llama.cpp's converter evaluates
    the llama3 rule into the ``rope_freqs`` tensor and ``ggml_rope_ext`` divides each angle by
    its entry, so keeping the entries (not parameters guessed back from them) reproduces
    llama.cpp's frequencies exactly.  In ``config.json`` it is transformers' ``longrope`` with
    equal short and long factors and ``attention_factor`` 1, which computes the same
    frequencies; other longrope configs (two factor sets, a cos/sin scale) are refused.
    """

    factors: tuple[float, ...]

    def to_json_dict(self, max_position_embeddings: int) -> dict[str, Any]:
        factors = list(self.factors)
        return {"rope_type": "longrope", "short_factor": factors, "long_factor": factors,
                "attention_factor": 1.0, "factor": 1.0,
                "original_max_position_embeddings": max_position_embeddings}


RopeScaling = Llama3RopeScaling | LinearRopeScaling | FrequencyFactors


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of a Llama model, as read from a Hugging Face ``config.json``."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    tie_word_embeddings: bool
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_id: int | tuple[int, ...] | None

    @classmethod
    def from_json(cls, path: str | Path) -> LlamaConfig:
        """Read and validate ``config.json`` (a file, or a directory containing one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            text = read_bounded(path, "a model config")
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read the model config ({e.strerror}); "
                                  "a checkpoint directory needs a config.json") from e
        try:
            data = loads(text)
        except ValueError as e:  # not JSON, or not UTF-8
            raise CheckpointError(f"{path}: not valid JSON ({e})") from e
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Any, source: str = "<config>") -> LlamaConfig:
        """Validate a parsed ``config.json`` against the table of fields; ``source`` names it."""
        return _parse_config(data, source)

    def to_json_dict(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` contents describing this config."""
        scaling = None
        if self.rope_scaling is not None:
            scaling = self.rope_scaling.to_json_dict(self.max_position_embeddings)
        eos = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
        }


_REQUIRED = object()

# field: (kind, default, rule). Defaults are those of transformers' LlamaConfig; None means the
# default is derived (num_key_value_heads, head_dim) or absent (token ids, rope_scaling).
_CONFIG_FIELDS: dict[str, tuple[str, Any]] = {
    "hidden_size": ("pos_int", _REQUIRED),
    "intermediate_size": ("pos_int", _REQUIRED),
    "num_hidden_layers": ("pos_int", _REQUIRED),
    "num_attention_heads": ("pos_int", _REQUIRED),
    "vocab_size": ("pos_int", _REQUIRED),
    "rms_norm_eps": ("pos_float", _REQUIRED),
    "num_key_value_heads": ("pos_int", None),
    "head_dim": ("pos_int", None),
    "rope_theta": ("pos_float", 10000.0),
    "tie_word_embeddings": ("bool", False),
    "max_position_embeddings": ("pos_int", 2048),
    "bos_token_id": ("token_id", None),
    "eos_token_id": ("token_ids", None),
}

_KIND_RULES = {
    "pos_int": "must be a positive integer",
    "pos_float": "must be a positive finite number",
    "bool": "must be true or false",
    "token_id": "must be a non-negative integer or null",
    "token_ids": "must be a non-negative integer, a non-empty list of them, or null",
}

# Fields that, when present, must hold this value: the decoder implements only this variant.
_FIXED_FIELDS = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                 "pretraining_tp": 1}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _kind_ok(kind: str, v: Any) -> bool:
    if kind == "pos_int":
        return _is_int(v) and v > 0
    if kind == "pos_float":
        return (_is_int(v) or isinstance(v, float)) and math.isfinite(v) and v > 0
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "token_id":
        return v is None or (_is_int(v) and v >= 0)
    if kind == "token_ids":
        if isinstance(v, list):
            return len(v) > 0 and all(_is_int(x) and x >= 0 for x in v)
        return v is None or (_is_int(v) and v >= 0)
    raise AssertionError(kind)


def _bad(source: str, field: str, value: Any, rule: str) -> CheckpointError:
    return CheckpointError(f"{source}: field {field!r} = {value!r} {rule}")


def _parse_config(data: Any, source: str) -> LlamaConfig:
    if not isinstance(data, dict):
        raise CheckpointError(f"{source}: the model config must be a JSON object, "
                              f"got {type(data).__name__}")
    model_type = data.get("model_type")
    archs = data.get("architectures")
    if model_type is None and archs is None:
        raise CheckpointError(f"{source}: neither 'model_type' nor 'architectures' is set; "
                              "a Llama config has model_type 'llama'")
    if model_type is not None and model_type != "llama":
        raise _bad(source, "model_type", model_type,
                   "is not supported: only 'llama' (Llama architecture) checkpoints load")
    if archs is not None and archs != ["LlamaForCausalLM"]:
        raise _bad(source, "architectures", archs, "must be ['LlamaForCausalLM']")
    for field, want in _FIXED_FIELDS.items():
        if field in data and data[field] != want:
            raise _bad(source, field, data[field], f"is not supported: it must be {want!r}")

    values: dict[str, Any] = {}
    for field, (kind, default) in _CONFIG_FIELDS.items():
        if field not in data or (data[field] is None and default is not _REQUIRED):
            if default is _REQUIRED:
                raise CheckpointError(f"{source}: required field {field!r} is missing "
                                      f"(it {_KIND_RULES[kind]})")
            values[field] = default
            continue
        v = data[field]
        if not _kind_ok(kind, v):
            raise _bad(source, field, v, _KIND_RULES[kind])
        if kind == "pos_float":
            v = float(v)
        if kind == "token_ids" and isinstance(v, list):
            v = v[0] if len(v) == 1 else tuple(v)
        values[field] = v

    rope_params = data.get("rope_parameters")  # transformers v5 spelling of theta + scaling
    scaling_raw = data.get("rope_scaling")
    if rope_params is not None:
        if not isinstance(rope_params, dict):
            raise _bad(source, "rope_parameters", rope_params, "must be an object or null")
        if "rope_theta" in rope_params:
            theta = rope_params["rope_theta"]
            if not _kind_ok("pos_float", theta):
                raise _bad(source, "rope_parameters.rope_theta", theta, _KIND_RULES["pos_float"])
            values["rope_theta"] = float(theta)
        if scaling_raw is None:
            scaling_raw = rope_params
    values["rope_scaling"] = _parse_rope_scaling(scaling_raw, source)

    heads, kv = values["num_attention_heads"], values["num_key_value_heads"]
    if kv is None:
        values["num_key_value_heads"] = kv = heads
    if heads % kv:
        raise _bad(source, "num_key_value_heads", kv,
                   f"must divide num_attention_heads = {heads} (grouped-query attention)")
    if values["head_dim"] is None:
        hidden = values["hidden_size"]
        if hidden % heads:
            raise _bad(source, "hidden_size", hidden,
                       f"must be a multiple of num_attention_heads = {heads} "
                       "when head_dim is not given")
        values["head_dim"] = hidden // heads
    if values["head_dim"] % 2:
        raise _bad(source, "head_dim", values["head_dim"], "must be even (RoPE rotates pairs)")
    scaling = values["rope_scaling"]
    if isinstance(scaling, FrequencyFactors) and len(scaling.factors) != values["head_dim"] // 2:
        raise _bad(source, "rope_scaling.short_factor", list(scaling.factors),
                   f"must hold head_dim / 2 = {values['head_dim'] // 2} factors")
    return LlamaConfig(**values)


_LLAMA3_FIELDS = {"factor": "pos_float", "low_freq_factor": "pos_float",
                  "high_freq_factor": "pos_float", "original_max_position_embeddings": "pos_int"}


def _parse_rope_scaling(raw: Any, source: str) -> RopeScaling | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _bad(source, "rope_scaling", raw, "must be an object or null")
    rope_type = raw.get("rope_type", raw.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type == "linear":
        return LinearRopeScaling(_scaling_field(raw, "factor", "pos_float", "linear", source))
    if rope_type == "longrope":
        return _parse_frequency_factors(raw, source)
    if rope_type != "llama3":
        raise _bad(source, "rope_scaling.rope_type", rope_type, "is not supported: only "
                   "'default', 'llama3', 'linear' and single-factor 'longrope' are implemented")
    vals = {key: _scaling_field(raw, key, kind, "llama3", source)
            for key, kind in _LLAMA3_FIELDS.items()}
    if not vals["high_freq_factor"] > vals["low_freq_factor"]:
        raise _bad(source, "rope_scaling.high_freq_factor", vals["high_freq_factor"],
                   f"must exceed low_freq_factor = {vals['low_freq_factor']}")
    return Llama3RopeScaling(**vals)


def _scaling_field(raw: dict, key: str, kind: str, rope_type: str, source: str) -> Any:
    """``raw[key]``, required and of ``kind``."""
    if key not in raw:
        raise CheckpointError(f"{source}: rope_scaling of type {rope_type} lacks {key!r} "
                              f"(it {_KIND_RULES[kind]})")
    if not _kind_ok(kind, raw[key]):
        raise _bad(source, f"rope_scaling.{key}", raw[key], _KIND_RULES[kind])
    return float(raw[key]) if kind == "pos_float" else raw[key]


def _parse_frequency_factors(raw: dict, source: str) -> FrequencyFactors:
    """A ``longrope`` config iron's RoPE can run: one set of per-frequency divisors (short and
    long factors equal) and no cos/sin scale (``attention_factor`` 1)."""
    short = raw.get("short_factor")
    if not (isinstance(short, list) and short and all(_kind_ok("pos_float", f) for f in short)):
        raise _bad(source, "rope_scaling.short_factor", short,
                   "must be a non-empty list of positive finite numbers")
    if raw.get("long_factor") != short:
        raise _bad(source, "rope_scaling.long_factor", raw.get("long_factor"),
                   "is not supported: it must equal short_factor (iron's RoPE has one set of "
                   "frequencies for every context length)")
    if raw.get("attention_factor") != 1.0:
        raise _bad(source, "rope_scaling.attention_factor", raw.get("attention_factor"),
                   "is not supported: it must be 1.0 (iron's RoPE does not scale cos/sin)")
    return FrequencyFactors(tuple(float(f) for f in short))


def inv_freq(config: LlamaConfig) -> np.ndarray:
    """RoPE inverse frequencies, float32 ``(head_dim // 2,)``: ``theta ** (-2i / head_dim)``.

    With llama3 rope_scaling, wavelengths longer than ``original / low_freq_factor`` are slowed
    by ``factor``, those shorter than ``original / high_freq_factor`` kept, and those between
    interpolated: the rule of transformers' ``_compute_llama3_parameters``, step by step in
    float32 as it does (the power is rounded from float64, so it may differ by an ulp).  Linear
    scaling divides every frequency by its factor, frequency factors each by its own (in
    float32, as ``ggml_rope_ext`` divides each angle by ``freq_factors[i]``).
    """
    d = config.head_dim
    exponent = (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / np.float32(d))
    power = np.power(np.float64(config.rope_theta), exponent.astype(np.float64))
    inv = np.float32(1.0) / power.astype(np.float32)
    s = config.rope_scaling
    if s is None:
        return inv
    if isinstance(s, LinearRopeScaling):
        return inv / np.float32(s.factor)
    if isinstance(s, FrequencyFactors):
        return inv / np.asarray(s.factors, np.float32)
    old_len = s.original_max_position_embeddings
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = np.float32(2 * math.pi) / inv
    inv_llama = np.where(wavelen > low_freq_wavelen, inv / np.float32(s.factor), inv)
    smooth = ((np.float32(old_len) / wavelen - np.float32(s.low_freq_factor))
              / np.float32(s.high_freq_factor - s.low_freq_factor))
    smoothed = (1 - smooth) * inv_llama / np.float32(s.factor) + smooth * inv_llama
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, inv_llama).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# tensor names and shapes

def expected_tensors(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of ``config`` holds, Hugging Face name -> ``[out, in]`` shape."""
    h, inter, v = config.hidden_size, config.intermediate_size, config.vocab_size
    q_out = config.num_attention_heads * config.head_dim
    kv_out = config.num_key_value_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q_out, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv_out, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv_out, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, q_out)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, h)
        shapes[p + "mlp.up_proj.weight"] = (inter, h)
        shapes[p + "mlp.down_proj.weight"] = (h, inter)
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    return shapes


# Tensors some exporters add that carry nothing the config does not already say.
_HARMLESS = re.compile(r"(model\.layers\.\d+\.self_attn\.|model\.)rotary_emb\.inv_freq")



# ---------------------------------------------------------------------------------------------
# the checkpoint

class Checkpoint:
    """An open, validated checkpoint directory; tensors are read-only memory-mapped views."""

    def __init__(self, directory: Path, config: LlamaConfig, tokenizer_path: Path,
                 entries: dict[str, tuple[np.memmap, TensorInfo]],
                 blocks: dict[str, tuple[str, np.memmap, TensorInfo]] | None = None):
        self.directory = directory
        self.config = config
        self.tokenizer_path = tokenizer_path
        self._entries = entries
        self._blocks = blocks or {}

    @classmethod
    def open(cls, directory: str | Path) -> Checkpoint:
        """Open ``directory``; raise :class:`CheckpointError` naming what is wrong."""
        directory = Path(directory)
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: checkpoint directory does not exist")
        config = LlamaConfig.from_json(_inside(directory, "config.json"))
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
        _check_size(directory, config, len(infos))
        _check_tensors(directory, config, {n: i.shape for n, (_, i) in infos.items()})
        maps = {shard: _memmap(shard, start) for shard, start in data_start.items()}
        entries = {n: (maps[shard], info) for n, (shard, info) in infos.items()}
        return cls(directory, config, tokenizer_path, entries, _open_blocks(directory, config))

    def tensor_names(self) -> list[str]:
        """Names of the checkpoint's tensors, in :func:`expected_tensors` order."""
        return [n for n in expected_tensors(self.config) if n in self._entries] + sorted(
            n for n in self._entries if n not in expected_tensors(self.config))

    def tensor(self, name: str) -> np.ndarray:
        """The stored tensor ``name``: a read-only view in its stored dtype."""
        try:
            mm, info = self._entries[name]
        except KeyError:
            raise CheckpointError(f"{self.directory}: no tensor {name!r} in this checkpoint "
                                  "(see Checkpoint.tensor_names())") from None
        return tensor_view(mm, info)

    def quantized(self, name: str) -> tuple[str, np.ndarray] | None:
        """The tensor ``name`` as the source file's own blocks: (format, uint8 array in the
        row layout of ``iron.quant``; bundles tile it), or None when it was not stored quantized."""
        if name not in self._blocks:
            return None
        fmt, mm, info = self._blocks[name]
        return fmt, tensor_view(mm, info)

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


def _check_vocabulary(directory: Path, config: LlamaConfig, tokenizer) -> None:
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
_PER_LAYER_TENSORS, _OTHER_TENSORS = 9, 3


def _check_size(directory: Path, config: LlamaConfig, found: int) -> None:
    """Refuse a layer count the files cannot hold before a table of that size is built."""
    least = _PER_LAYER_TENSORS * config.num_hidden_layers
    if least > found + _OTHER_TENSORS:
        raise CheckpointError(
            f"{directory / 'config.json'}: num_hidden_layers = {config.num_hidden_layers} "
            f"needs at least {least} tensors, the checkpoint holds {found}; the config does "
            "not describe these weights")


BLOCKS_FILE = "quantized.safetensors"


def _open_blocks(directory: Path, config: LlamaConfig
                 ) -> dict[str, tuple[str, np.ndarray, TensorInfo]]:
    """The checkpoint's quantized blocks (``quantized.safetensors``, written by the GGUF
    importer), each checked against its tensor's shape in config.json."""
    from iron import quant
    from iron.tensorfile import read_safetensors_metadata

    path = directory / BLOCKS_FILE
    if not path.is_file():
        return {}
    start, infos = read_safetensors_header(path)
    formats = read_safetensors_metadata(path)
    want = expected_tensors(config)
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
        shape = (rows, quant.row_bytes(fmt, k, group)) if k % group == 0 else None
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


def _check_tensors(directory: Path, config: LlamaConfig,
                   found: dict[str, tuple[int, ...]]) -> None:
    """Every problem with the tensor set, reported together; each line names one tensor."""
    want = expected_tensors(config)
    problems = []
    for name, shape in want.items():
        if name not in found:
            problems.append(f"missing tensor {name!r} (expected shape {shape})")
        elif found[name] != shape:
            problems.append(f"tensor {name!r} has shape {found[name]}, expected {shape}")
    for name, shape in found.items():
        if name in want:
            continue
        embed = want["model.embed_tokens.weight"]
        if name == "lm_head.weight" and config.tie_word_embeddings:
            if shape != embed:
                problems.append(f"tensor 'lm_head.weight' has shape {shape}, expected {embed} "
                                "(tied to model.embed_tokens.weight)")
            continue
        problems.append(f"unexpected tensor {name!r} with shape {shape} (not in a Llama "
                        "checkpoint of this config)")
    if problems:
        listed = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise CheckpointError(f"{directory}: {len(problems)} tensor problem(s) against "
                              f"config.json:\n  {listed}{more}")

