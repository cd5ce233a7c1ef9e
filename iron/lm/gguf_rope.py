"""A Llama GGUF file's RoPE scaling, as the ``rope_scaling`` of a Hugging Face ``config.json``.

llama.cpp rotates pair ``i`` of a head at position ``p`` by the angle
``p * freq_base ** (-2i / n_rot) / freq_factors[i] * freq_scale`` (``ggml_rope_cache_init`` and
``rope_yarn`` in ggml-cpu's ``ops.cpp``), where

- ``freq_factors`` is the ``rope_freqs.weight`` tensor when the file has one: llama.cpp's
  converter (``LlamaModel.generate_extra_tensors``) evaluates Llama 3.1's llama3 rule into it,
  one float32 divisor per frequency, and writes no scaling keys for it;
- ``freq_scale`` is ``1 / llama.rope.scaling.factor`` (or the older ``llama.rope.scale_linear``)
  unless ``llama.rope.scaling.type`` is ``none``; a file without the type key is ``linear``
  (``llama_model::load_hparams``).

So a file with ``rope_freqs`` becomes ``FrequencyFactors`` (``apps/llama/config.py``) (times the
linear factor, if any), one with only a linear factor ``rope_type: linear``; YaRN and LongRoPE
files, and a cos/sin scale (``llama.rope.scaling.attn_factor`` other than 1), are refused in one
line, since iron's RoPE takes one set of frequencies and no scale.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from iron.errors import CheckpointError
from iron.lm.gguf_file import GGUFFile
from iron.lm.gguf_meta import value

ROPE_FREQS = "rope_freqs.weight"
_TRANSLATED = ("none", "linear")


def gguf_rope_scaling(f: GGUFFile, head_dim: int, arch: str) -> dict[str, Any] | None:
    """The ``rope_scaling`` entry of ``config.json`` giving llama.cpp's frequencies for ``f``
    (metadata already checked by ``gguf_meta.check_metadata``), or None for plain RoPE;
    ``arch`` is the file's ``general.architecture``, its keys' prefix."""
    prefix = f"{arch}.rope."
    kind = value(f, prefix + "scaling.type", "linear")
    if kind not in _TRANSLATED:
        raise CheckpointError(f"{f.source}: {prefix}scaling.type = {kind!r} is not supported: iron "
                              "translates 'none' and 'linear' (and Llama 3.1's rope_freqs tensor)")
    attn = value(f, prefix + "scaling.attn_factor", 1.0)
    if attn != 1.0:
        raise CheckpointError(f"{f.source}: {prefix}scaling.attn_factor = {attn!r} is not "
                              "supported: it must be 1 (iron's RoPE does not scale cos/sin)")
    factor = 1.0
    if kind == "linear":
        factor = value(f, prefix + "scaling.factor", value(f, prefix + "scale_linear", 1.0))
    freq_factors = _freq_factors(f, head_dim)
    if freq_factors is not None:
        factors = freq_factors * np.float32(factor)
        return {"rope_type": "longrope", "short_factor": factors.tolist(),
                "long_factor": factors.tolist(), "attention_factor": 1.0}
    if factor != 1.0:
        return {"rope_type": "linear", "factor": float(factor)}
    return None


def _freq_factors(f: GGUFFile, head_dim: int) -> np.ndarray | None:
    """The ``rope_freqs`` tensor's float32 divisors, one per frequency, or None without one."""
    t = next((t for t in f.tensors if t.name == ROPE_FREQS), None)
    if t is None:
        return None
    if t.tensor_type != GGMLQuantizationType.F32 or t.dims != (head_dim // 2,):
        raise CheckpointError(f"{f.source}: {ROPE_FREQS} is {t.tensor_type.name} with dims "
                              f"{list(t.dims)}; it must be F32 [{head_dim // 2}] (one factor per "
                              "RoPE frequency, head_dim / 2)")
    factors = np.array(t.data, np.float32)
    bad = np.flatnonzero(~(np.isfinite(factors) & (factors > 0)))
    if bad.size:
        i = int(bad[0])
        raise CheckpointError(f"{f.source}: {ROPE_FREQS}[{i}] = {float(factors[i])}; every "
                              "factor must be a positive finite number (it divides a frequency)")
    return factors
