"""The Llama head's logits are float32: the float32 sums of the matrix product, not rounded to
bf16 (whose 8 significant bits make the two likeliest tokens tie at a few percent of a small
model's steps, and greedy decoding then takes the lower id)."""

import numpy as np
import pytest

import iron
from apps.llama.config import LlamaConfig
from apps.llama.model import Head
from iron import quant
from iron.operator import ACCUMULATED
from iron.operators.matrix import weight_values

HIDDEN, VOCAB = 64, 96  # vocab rows: whole 16-row tiles of the quantized layout


def config() -> LlamaConfig:
    return LlamaConfig(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                       vocab_size=VOCAB, rms_norm_eps=1e-5, rope_theta=10000.0,
                       rope_scaling=None, tie_word_embeddings=True,
                       max_position_embeddings=64, bos_token_id=1, eos_token_id=2)


@pytest.mark.parametrize("fmt", ["bf16", "q8_0"])
def test_head_logits_are_the_float32_sums(fmt):
    """Logits of magnitude up to about 20 (a bf16 step there is 1/16 to 1/8) against the same
    product in float64: within the float32 accumulation tolerance, no bf16 rounding. A q8_0
    head multiplies h rounded to int8 codes per 16 values, as its GEMV does."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32) * 0.6
    h = rng.standard_normal((1, HIDDEN)).astype(iron.bfloat16)
    formats = {} if fmt == "bf16" else {"model.embed_tokens.weight": ("q8_0", 32)}
    if fmt == "bf16":
        stored = w.astype(iron.bfloat16)
        values, x = stored.astype(np.float64), h.astype(np.float64)
    else:
        stored = quant.tile(fmt, quant.random_matrix(fmt, VOCAB, HIDDEN, 32, rng, 0.6), HIDDEN,
                            32)
        values = weight_values(fmt, stored, HIDDEN, 32).astype(np.float64)
        x = quant.activation_values(h).astype(np.float64)
    graph = Head(config(), formats, device="cpu")
    graph.weights = {"model.embed_tokens.weight": stored}
    logits = graph(h)
    assert logits.dtype == np.float32 and logits.shape == (1, VOCAB)
    expected = x @ values.T
    assert np.abs(expected).max() > 8  # where a bf16 step (>= 1/32) dwarfs the tolerance
    error = np.abs(logits - expected).max()
    assert error <= ACCUMULATED[1], f"largest |logit - float64 sum| {error:.3g}"
