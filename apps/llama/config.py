"""A Llama-family model's hyper-parameters: ``LlamaConfig``, read and validated from a Hugging
Face ``config.json`` (the fields and defaults of transformers' ``LlamaConfig``), and the RoPE
frequencies they give (:func:`inv_freq`)::

    config = LlamaConfig.from_json("build/checkpoints/smollm2-135m-instruct")
    f = inv_freq(config)                                         # (32,) float32
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iron.errors import CheckpointError
from iron.jsonfile import loads
from iron.util import read_bounded

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
    #: the family member (``VARIANTS``): ``llama``, ``qwen2`` or ``qwen3``
    model_type: str = "llama"
    #: q, k and v projections carry biases (Qwen2)
    qkv_bias: bool = False
    #: each query and key head is RMS-normed over ``head_dim`` before RoPE (Qwen3)
    qk_norm: bool = False

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
        variant = VARIANTS[self.model_type]
        return {
            "architectures": [variant.architecture],
            "model_type": self.model_type,
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
            **variant.fixed,
        }


@dataclass(frozen=True)
class Variant:
    """A member of the Llama family as its ``config.json`` names it: the same decoder (RMSNorm,
    grouped-query attention with RoPE rotating halves, SwiGLU) with what the member adds."""

    architecture: str  # ``architectures[0]``, transformers' class
    qkv_bias: bool  # q, k and v projections with biases (o_proj without)
    qk_norm: bool  # per-head RMSNorm of q and k (weights of head_dim) before RoPE
    #: fields whose transformers default is not Llama's
    defaults: dict[str, Any]
    #: fields that, when present, must hold this value: the decoder implements only this
    fixed: dict[str, Any]


#: transformers' LlamaConfig, Qwen2Config and Qwen3Config (``models/<name>/configuration_*.py``
#: and ``modeling_*.py``): Qwen2's q/k/v projections have ``bias=True``; Qwen3's have
#: ``attention_bias`` (o_proj too), and ``q_norm`` / ``k_norm`` over ``head_dim`` (default 128,
#: not derived); both default to a context of 32768 and may use a sliding window, which iron's
#: attention does not.
VARIANTS = {
    "llama": Variant("LlamaForCausalLM", False, False, {},
                     {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                      "pretraining_tp": 1}),
    "qwen2": Variant("Qwen2ForCausalLM", True, False, {"max_position_embeddings": 32768},
                     {"hidden_act": "silu", "use_sliding_window": False}),
    "qwen3": Variant("Qwen3ForCausalLM", False, True,
                     {"max_position_embeddings": 32768, "head_dim": 128},
                     {"hidden_act": "silu", "attention_bias": False,
                      "use_sliding_window": False}),
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


def _variant_name(data: dict, source: str) -> str:
    """The family member ``data`` describes, by its ``model_type`` and ``architectures``."""
    model_type = data.get("model_type")
    archs = data.get("architectures")
    if model_type is None and archs is None:
        raise CheckpointError(f"{source}: neither 'model_type' nor 'architectures' is set; "
                              "a Llama config has model_type 'llama'")
    known = ", ".join(repr(n) for n in VARIANTS)
    if model_type is not None and model_type not in VARIANTS:
        raise _bad(source, "model_type", model_type, f"is not supported: only {known} "
                   "(Llama-family) checkpoints load")
    if model_type is None:
        model_type = next((n for n, v in VARIANTS.items() if archs == [v.architecture]), None)
    want = [VARIANTS[model_type].architecture] if model_type else None
    if archs is not None and archs != want:
        rule = f"must be {want}" if want else "must be one of " + ", ".join(
            str([v.architecture]) for v in VARIANTS.values())
        raise _bad(source, "architectures", archs, rule)
    return model_type


def _parse_config(data: Any, source: str) -> LlamaConfig:
    if not isinstance(data, dict):
        raise CheckpointError(f"{source}: the model config must be a JSON object, "
                              f"got {type(data).__name__}")
    name = _variant_name(data, source)
    variant = VARIANTS[name]
    for field, want in variant.fixed.items():
        if field in data and data[field] != want:
            raise _bad(source, field, data[field], f"is not supported: it must be {want!r}")

    values: dict[str, Any] = {}
    for field, (kind, default) in _CONFIG_FIELDS.items():
        default = variant.defaults.get(field, default)
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
    values.update(model_type=name, qkv_bias=variant.qkv_bias, qk_norm=variant.qk_norm)

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
