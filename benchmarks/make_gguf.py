"""Write a Llama GGUF file of a given shape with random weights, for benchmarks at the size people
run (the default is the shape of Llama 3.2 1B) without downloading a model.

The vocabulary, merges, special tokens and chat template are the embedded SmolLM2 file's
(``benchmarks/llamacpp.py`` fetches it), or with ``--vocab FILE.gguf`` those of another file
(every ``tokenizer.*`` key copied: one of llama.cpp's ``models/ggml-vocab-*.gguf`` makes a
Llama-3-shaped file with ``ggml-vocab-llama-bpe.gguf``, a Llama-2/Mistral-shaped one with
``ggml-vocab-llama-spm.gguf``), so every engine tokenizes and loads it as a real model; the
weights are random (normal, std 0.02; norms 1), so the text it generates is noise
and only its speed means anything. The embedding rows (tied: also the output rows) of tokens
that are not whole UTF-8 text (byte tokens, special tokens) are zero, so that greedy decoding
never picks them and a server streams every token (servers hold back partial characters).
Written with gguf's own ``GGUFWriter``, atomically.

Types: ``Q4_0``, ``Q4_1`` and ``Q8_0`` quantize the random float32 weights with gguf's own
quantizers (``gguf.quants.quantize``), every 2-D tensor in that type. gguf has no quantizer for
the K-quants, so ``Q4_K_M`` writes random valid blocks directly (random codes, 6-bit scales
and minimums, fp16 super-block scales sized for the same std), with llama.cpp's Q4_K_M mix:
Q6_K for the tied embedding / output and for attn_v and ffn_down of the layers llama.cpp gives
more bits (the first and last eighth, every third between), Q4_K elsewhere.

    python benchmarks/make_gguf.py                       # build/gguf/llama-1b-Q4_0.gguf
    python benchmarks/make_gguf.py --type Q4_K_M
    python benchmarks/make_gguf.py --hidden 576 --layers 30 --heads 9 --kv-heads 3 --ffn 1536
    python benchmarks/make_gguf.py --vocab ggml-vocab-llama-spm.gguf --hidden 256 --layers 2 \
        --heads 4 --kv-heads 2 --ffn 256 --type Q8_0

Architectures: ``--arch llama`` (the default), ``qwen2`` (q, k and v biases, ``blk.N.attn_q.bias``
...) or ``qwen3`` (per-head q and k RMSNorm weights, ``blk.N.attn_q_norm.weight``, and
``--head-dim``, which Qwen3 states apart from hidden / heads), with the keys under the
architecture's prefix as llama.cpp's converter writes them (``qwen2.block_count``, ...); a Qwen
file runs llama.cpp's NEOX RoPE, so its q and k rows are not permuted. Biases are random
(std 0.5: the size Qwen2's reach), the q/k norm weights random around 1, so a runtime that
skipped either would compute other numbers. ``--type F16`` stores every matrix as float16, the
file llama.cpp and iron are compared on; a Qwen2 vocabulary is llama.cpp's
``ggml-vocab-qwen2.gguf`` (``--vocab``)::

    python benchmarks/make_gguf.py --arch qwen3 --type F16 --vocab ggml-vocab-qwen2.gguf \
        --hidden 256 --layers 2 --heads 4 --kv-heads 2 --head-dim 128 --ffn 512

RoPE scaling: ``--rope-scaling llama3`` writes the ``rope_freqs`` tensor of Llama 3.1/3.2 as
llama.cpp's converter computes it from the llama3 parameters (``--rope-factor``, default 32,
low/high frequency factors 1 and 4, ``--rope-original-context``, default 8192: Llama 3.2's),
``--rope-scaling linear --rope-factor F`` the ``llama.rope.scaling.type``/``factor`` keys.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K_M", "F16")
ARCHS = ("llama", "qwen2", "qwen3")
#: llama.cpp's ``llama_ftype`` of each type (``general.file_type``)
FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "F16": 1}
BIAS_STD = 0.5
STD = 0.02
QK_K = 256


@dataclass(frozen=True)
class Shape:
    hidden: int = 2048
    layers: int = 16
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 8192
    context: int = 8192
    rope_base: float = 500000.0
    head_dim: int | None = None  # None: hidden // heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def check(self) -> None:
        rules = [(self.head_dim is not None or self.hidden % self.heads == 0,
                  "hidden % heads == 0 (or an explicit head_dim)"),
                 (self.head_size % 2 == 0, "head_dim even"),
                 (self.heads % self.kv_heads == 0, "heads % kv_heads == 0"),
                 (self.hidden % QK_K == 0 and self.ffn % QK_K == 0
                  and self.head_size * self.heads % QK_K == 0,
                  f"hidden, ffn and heads * head_dim multiples of {QK_K} (the K-quants' "
                  "super-blocks)"),
                 (min(self.hidden, self.layers, self.heads, self.kv_heads, self.ffn) > 0,
                  "every size positive")]
        for ok, rule in rules:
            if not ok:
                raise SystemExit(f"make_gguf: shape {self} breaks the rule {rule}")


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's llama3 rule (written as the rope_freqs tensor) or linear scaling (keys)."""

    kind: str = "llama3"  # or "linear"
    factor: float = 32.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192


def llama3_rope_factors(head_dim: int, base: float, s: RopeScaling) -> np.ndarray:
    """The rope_freqs tensor of llama.cpp's converter (``LlamaModel.generate_extra_tensors`` in
    convert_hf_to_gguf): per frequency, 1 where the wavelength is under
    ``original / high_freq_factor``, ``factor`` where it is over ``original / low_freq_factor``,
    and the reciprocal of the llama3 interpolation between; float32 throughout as it computes."""
    freqs = np.float32(1.0) / (np.float32(base) ** (
        np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    low_wavelen = s.original_context / s.low_freq_factor
    high_wavelen = s.original_context / s.high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = np.float32(2 * np.pi) / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(s.factor)
        else:
            smooth = ((np.float32(s.original_context) / wavelen - np.float32(s.low_freq_factor))
                      / np.float32(s.high_freq_factor - s.low_freq_factor))
            factors.append(1 / ((1 - smooth) / np.float32(s.factor) + smooth))
    return np.array(factors, dtype=np.float32)


def default_path(shape: Shape, qtype: str, vocab: Path | None = None,
                 arch: str = "llama") -> Path:
    name = f"{arch}-1b" if shape == Shape() else (
        f"{arch}-h{shape.hidden}-l{shape.layers}-a{shape.heads}-kv{shape.kv_heads}-f{shape.ffn}")
    if shape.head_dim is not None:
        name += f"-d{shape.head_dim}"
    if vocab is not None:
        name += "-" + vocab.stem.removeprefix("ggml-vocab-")
    return REPO / "build" / "gguf" / f"{name}-{qtype}.gguf"


def tensor_shapes(shape: Shape, vocab: int, arch: str = "llama"
                  ) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape (rows, columns)) of every tensor, in llama.cpp's names (gguf-py's
    ``TENSOR_NAMES``); tied embeddings: no output.weight."""
    head_dim = shape.head_size
    q, kv = shape.heads * head_dim, shape.kv_heads * head_dim
    out = [("token_embd.weight", (vocab, shape.hidden))]
    for i in range(shape.layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (shape.hidden,)),
                (b + "attn_q.weight", (q, shape.hidden)),
                (b + "attn_k.weight", (kv, shape.hidden)),
                (b + "attn_v.weight", (kv, shape.hidden))]
        if arch == "qwen2":
            out += [(b + "attn_q.bias", (q,)), (b + "attn_k.bias", (kv,)),
                    (b + "attn_v.bias", (kv,))]
        if arch == "qwen3":
            out += [(b + "attn_q_norm.weight", (head_dim,)),
                    (b + "attn_k_norm.weight", (head_dim,))]
        out += [(b + "attn_output.weight", (shape.hidden, q)),
                (b + "ffn_norm.weight", (shape.hidden,)),
                (b + "ffn_gate.weight", (shape.ffn, shape.hidden)),
                (b + "ffn_up.weight", (shape.ffn, shape.hidden)),
                (b + "ffn_down.weight", (shape.hidden, shape.ffn))]
    return out + [("output_norm.weight", (shape.hidden,))]


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits (llama-quant.cpp): the layers Q4_K_M gives Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, qtype: str, layers: int) -> str:
    """The GGML type of a 2-D tensor in a file of ``qtype``."""
    if qtype != "Q4_K_M":
        return qtype
    if name == "token_embd.weight":  # tied: it is also the output matrix
        return "Q6_K"
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        return "Q6_K" if more_bits(int(name.split(".")[1]), layers) else "Q4_K"
    return "Q4_K"


def random_k_blocks(ggml_type: str, rows: int, cols: int, rng: np.random.Generator,
                    std: float = STD) -> np.ndarray:
    """Random valid Q4_K / Q6_K blocks (rows, cols / 256 * block bytes), values of about std.

    Q4_K (144 bytes): d, dmin (fp16), 12 bytes of 6-bit scales and minimums, 128 bytes of 4-bit
    codes; value = d * scale * q - dmin * min. Q6_K (210 bytes): 128 bytes of low 4 bits, 64 of
    high 2 bits, 16 int8 scales, d (fp16); value = d * scale * (q - 32). Field order as in
    ggml-common.h (block_q4_K, block_q6_K)."""
    n = rows * cols // QK_K
    if ggml_type == "Q4_K":
        # codes 0..15 (mean 7.5), scales and minimums 0..63: each 32 values' offset
        # d * 7.5 * scale - dmin * min varies as much as the codes do
        d = np.full((n, 1), std / (31.5 * 4.6 * 1.8), np.float16)
        dmin = np.full((n, 1), std * 7.5 / (31.5 * 4.6 * 1.8), np.float16)
        rest = rng.integers(0, 256, (n, 12 + 128), dtype=np.uint8)
        blocks = np.concatenate([d.view(np.uint8), dmin.view(np.uint8), rest], axis=1)
    elif ggml_type == "Q6_K":
        codes = rng.integers(0, 256, (n, 128 + 64), dtype=np.uint8)
        scales = rng.integers(16, 128, (n, 16), dtype=np.int8) * rng.choice(
            np.array([-1, 1], np.int8), (n, 16))
        d = np.full((n, 1), std / (18.5 * 76), np.float16)  # |scale| mean ~72, q - 32 std 18.5
        blocks = np.concatenate([codes, scales.view(np.uint8), d.view(np.uint8)], axis=1)
    else:
        raise ValueError(f"no random blocks for {ggml_type}")
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def non_text_tokens(reader) -> np.ndarray:
    """Indices of the vocabulary's tokens that do not decode to whole UTF-8 text on their own
    (byte-level BPE pieces of a character, byte and control tokens); ``reader`` is an
    ``iron.lm.gguf_file.GGUFFile``."""
    from tokenizers.decoders import ByteLevel

    decoder = ByteLevel()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    byte_level = reader.fields["tokenizer.ggml.model"].contents() == "gpt2"
    bad = [i for i, token in enumerate(reader.fields["tokenizer.ggml.tokens"].contents())
           if types[i] != 1 or (byte_level and "\ufffd" in decoder.decode([token]))]
    return np.array(bad, dtype=np.int64)


def tokenizer_fields(reader) -> list:
    """The vocabulary file's tokenizer.* fields, as (name, value, value type, sub type)."""
    import gguf

    out = []
    for name, value in reader.fields.items():
        if name.startswith("tokenizer."):
            vtype = gguf.GGUFValueType.ARRAY if value.is_array else value.type
            out.append((name, value.contents(), vtype, value.type if value.is_array else None))
    return out


def vector(name: str, dims: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A 1-D tensor's float32 values: norms 1 (Qwen3's q/k norms random around 1), biases
    random."""
    if name.endswith(".bias"):
        return rng.standard_normal(dims, dtype=np.float32) * np.float32(BIAS_STD)
    if name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")):
        return 1 + rng.standard_normal(dims, dtype=np.float32) * np.float32(0.25)
    return np.ones(dims, np.float32)


def write(path: Path, shape: Shape, qtype: str, seed: int = 0, std: float = STD,
          vocab: Path | None = None, rope: RopeScaling | None = None,
          arch: str = "llama") -> Path:
    """Write the file (atomically); ``std`` is the weights' standard deviation, ``vocab`` the
    GGUF file whose tokenizer metadata it copies (default: the embedded SmolLM2 file's),
    ``rope`` the RoPE scaling (default none), ``arch`` the architecture (``ARCHS``)."""
    import gguf
    from gguf.quants import quantize

    sys.path.insert(0, str(HERE))
    from llamacpp import fetch_smollm2_gguf

    from iron.lm.gguf_file import GGUFFile

    if qtype not in TYPES:
        raise SystemExit(f"make_gguf: --type {qtype!r} is not one of {', '.join(TYPES)}")
    if arch not in ARCHS:
        raise SystemExit(f"make_gguf: --arch {arch!r} is not one of {', '.join(ARCHS)}")
    if rope is not None and arch != "llama":
        raise SystemExit(f"make_gguf: --rope-scaling {rope.kind} is Llama 3's; --arch {arch} "
                         "files have none")
    shape.check()
    if vocab is not None and not Path(vocab).is_file():
        raise SystemExit(f"make_gguf: --vocab {vocab}: no such file")
    # iron's bounded reader: gguf's GGUFReader takes most of a minute over 150k tokens' fields
    reader = GGUFFile.open(vocab if vocab is not None else fetch_smollm2_gguf())
    vocab = reader.fields["tokenizer.ggml.tokens"].count
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_name(f"random {arch} h{shape.hidden} l{shape.layers} {qtype}")
        w.add_context_length(shape.context)
        w.add_embedding_length(shape.hidden)
        w.add_block_count(shape.layers)
        w.add_feed_forward_length(shape.ffn)
        w.add_head_count(shape.heads)
        w.add_head_count_kv(shape.kv_heads)
        w.add_rope_freq_base(shape.rope_base)
        w.add_rope_dimension_count(shape.head_size)
        if shape.head_dim is not None:
            w.add_key_length(shape.head_dim)
            w.add_value_length(shape.head_dim)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(vocab)
        w.add_file_type(FILE_TYPES[qtype])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for name, value, vtype, sub in tokenizer_fields(reader):
            w.add_key_value(name, value, vtype, sub_type=sub)
        if rope is not None and rope.kind == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rope.factor)
        elif rope is not None:  # llama.cpp's converter writes the factors and no scaling keys
            w.add_tensor("rope_freqs.weight", llama3_rope_factors(
                shape.head_size, shape.rope_base, rope))
        for name, dims in tensor_shapes(shape, vocab, arch):
            if len(dims) == 1:
                w.add_tensor(name, vector(name, dims, rng))
                continue
            ggml = tensor_type(name, qtype, shape.layers)
            kind = gguf.GGMLQuantizationType[ggml]
            if ggml == "F16":
                values = rng.standard_normal(dims, dtype=np.float32) * np.float32(std)
                if name == "token_embd.weight":
                    values[non_text_tokens(reader)] = 0
                w.add_tensor(name, values.astype(np.float16))
                continue
            if ggml in ("Q4_K", "Q6_K"):
                blocks = random_k_blocks(ggml, *dims, rng, std)
                if name == "token_embd.weight":  # all-zero blocks are zero values
                    blocks[non_text_tokens(reader)] = 0
            else:
                values = rng.standard_normal(dims, dtype=np.float32)
                values *= np.float32(std)
                if name == "token_embd.weight":
                    values[non_text_tokens(reader)] = 0
                blocks = quantize(values, kind)
            w.add_tensor(name, blocks, raw_dtype=kind)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Shape()
    parser.add_argument("--type", default="Q4_0", choices=TYPES)
    parser.add_argument("--arch", default="llama", choices=ARCHS)
    parser.add_argument("--hidden", type=int, default=defaults.hidden)
    parser.add_argument("--layers", type=int, default=defaults.layers)
    parser.add_argument("--heads", type=int, default=defaults.heads)
    parser.add_argument("--kv-heads", type=int, default=defaults.kv_heads)
    parser.add_argument("--ffn", type=int, default=defaults.ffn)
    parser.add_argument("--head-dim", type=int, help="default: hidden / heads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=Path, metavar="FILE.gguf",
                        help="copy this GGUF file's tokenizer metadata (default: SmolLM2's)")
    parser.add_argument("--rope-scaling", choices=("none", "llama3", "linear"), default="none",
                        help="llama3: a rope_freqs tensor; linear: the scaling keys")
    parser.add_argument("--rope-factor", type=float, default=RopeScaling.factor)
    parser.add_argument("--rope-original-context", type=int,
                        default=RopeScaling.original_context,
                        help="llama3's original_max_position_embeddings")
    parser.add_argument("--out", type=Path,
                        help="default: build/gguf/<shape>[-<vocab>]-<type>.gguf")
    args = parser.parse_args(argv)
    shape = Shape(args.hidden, args.layers, args.heads, args.kv_heads, args.ffn,
                  head_dim=args.head_dim)
    rope = None if args.rope_scaling == "none" else RopeScaling(
        args.rope_scaling, args.rope_factor, original_context=args.rope_original_context)
    if rope is not None and not (math.isfinite(rope.factor) and rope.factor > 0
                                 and rope.original_context > 0):
        raise SystemExit(f"make_gguf: --rope-factor {rope.factor} --rope-original-context "
                         f"{rope.original_context} breaks the rule: both must be positive")
    out = args.out or default_path(shape, args.type, args.vocab, args.arch)
    if rope is not None and args.out is None:
        out = out.with_name(f"{out.stem}-rope-{rope.kind}{out.suffix}")
    path = write(out, shape, args.type, args.seed, vocab=args.vocab, rope=rope, arch=args.arch)
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
