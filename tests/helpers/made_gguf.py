"""The small F16 GGUF files, one per shape of the Llama family, that iron and llama.cpp are
compared on: ``benchmarks/make_gguf.py`` files with real vocabularies (llama.cpp's
``models/ggml-vocab-*.gguf``), random weights of std 0.1 (logits of std ~1.4, so a distribution
is not flat and an error shows)."""

from __future__ import annotations

import sys
from pathlib import Path

import llama_vocab

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import make_gguf  # noqa: E402

SMALL = dict(hidden=256, layers=2, heads=4, kv_heads=2, ffn=512, context=256)
#: name -> (make_gguf.write arguments, llama.cpp vocabulary)
FILES = {
    # Llama 3.2 1B: llama-bpe, rope base 500000, the llama3 rule as a rope_freqs tensor (factor
    # 8 over an original context of 64, so that all three regimes of the rule are used)
    "llama32": (dict(shape=make_gguf.Shape(**SMALL, rope_base=500000.0), arch="llama",
                     rope=make_gguf.RopeScaling("llama3", 8.0, original_context=64)),
                "llama-bpe"),
    # Llama 2 / Mistral: SentencePiece, rope base 10000
    "llama2": (dict(shape=make_gguf.Shape(**SMALL, rope_base=10000.0), arch="llama"),
               "llama-spm"),
    "qwen2": (dict(shape=make_gguf.Shape(**SMALL, rope_base=1000000.0), arch="qwen2"),
              "qwen2"),
    # Qwen3 states head_dim apart from hidden / heads (128 with hidden 1024, 16 heads)
    "qwen3": (dict(shape=make_gguf.Shape(**SMALL, rope_base=1000000.0, head_dim=128),
                   arch="qwen3"), "qwen2"),
}
STD = 0.1
SEED = 4


def write_f16(name: str, folder: Path) -> Path:
    """``folder/<name>.gguf``, the F16 file of shape ``name`` (a key of ``FILES``)."""
    args, vocab = FILES[name]
    return make_gguf.write(folder / f"{name}.gguf", qtype="F16", seed=SEED, std=STD,
                           vocab=llama_vocab.vocab_file(REPO / "build", vocab), **args)
