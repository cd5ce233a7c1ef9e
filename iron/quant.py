"""Block-quantized weight formats: their two byte layouts, exact dequantization, and
round-to-nearest uint4 quantization.

A quantized weight matrix (rows, K) is a uint8 array (rows, row_bytes(fmt, K, group)), in one
of two layouts of the same bytes.

The row layout (checkpoints): each row holds its K values in groups of ``group`` elements,
stored as planes::

    q4_0   codes (K/2 bytes) | d fp16 (K/group)                      w = d * (q - 8)
    q4_1   codes (K/2 bytes) | d fp16 (K/group) | m fp16 (K/group)   w = d * q + m
    q8_0   codes (K int8)    | d fp16 (K/group)                      w = d * q
    uint4  codes (K/2 bytes) | d bf16 (K/group) | m bf16 (K/group)   w = d * q + m

4-bit codes keep llama.cpp's nibble order within every 32 elements: byte j of a 32-element
chunk holds element j in its low nibble and element j + 16 in its high nibble. The three
llama.cpp formats (group 32) are the GGUF blocks with their fields moved into planes
(``from_gguf``): every byte is kept, nothing is rounded again. Block definitions:
ggml-common.h (block_q4_0, block_q4_1, block_q8_0) in github.com/ggml-org/llama.cpp.
``uint4`` is group-wise asymmetric uint4 with bf16 scale and minimum, the weight format Ryzen
AI's LLM flow uses (group 128), here also with group 32.

The tiled layout (bundles and kernels, ``tile``): rows in tiles of TILE = 16, so that one
512-bit register holds one 32-bit lane per row and a kernel computes 16 rows at once without
ever summing across lanes. Within a tile, group after group: the group's codes, chunk after
chunk of 32 values, then its 16 scales, then its 16 minimums (q4_1, uint4). A chunk's codes:

    4-bit  4 planes j = 0..3 of 16 little-endian uint32, word i of plane j holding row i's
           codes 8j .. 8j+7: code 8j+2s in bits 4s..4s+3, code 8j+2s+1 in bits
           16+4s..16+4s+3 (s = 0..3), so that one mask gives every row's codes 8j, 8j+4,
           8j+1, 8j+5 as the 4 bytes of its word, and one shift and one mask codes 8j+2,
           8j+6, 8j+3, 8j+7, for int8 dot products (vpdpbusd on 16 rows, vpmaddubsw on the
           8 rows of either 32-byte half of a plane)
    q8_0   the unsigned codes q + 128 as two such 4-bit chunks: their low nibbles, then their
           high nibbles (so that the kernels expand both like 4-bit codes)

Only the order of the bytes differs from the row layout: ``untile(tile(w)) == w``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

#: Weight formats, in the order of their IRON_FMT_* numbers in kernels/cpu/iron_cpu.h.
FORMATS = ("bf16", "q4_0", "q4_1", "q8_0", "uint4")
QUANTIZED = FORMATS[1:]
#: Group sizes each format supports (bf16 has no groups: its group_size stays 32).
GROUPS = {"bf16": (32,), "q4_0": (32,), "q4_1": (32,), "q8_0": (32,), "uint4": (32, 128)}
#: GGUF tensor type names of the formats a GGUF file stores as such.
GGUF_TYPES = {"Q4_0": "q4_0", "Q4_1": "q4_1", "Q8_0": "q8_0"}
#: Rows per tile of the tiled layout (the lanes of a 512-bit register of 32-bit words).
TILE = 16


class FormatError(ValueError):
    """A weight format, group size or byte array that does not fit together."""


def check_format(fmt: str, group: int, where: str) -> None:
    if fmt not in FORMATS:
        raise FormatError(f"{where}: weight_format={fmt!r} is not one of {', '.join(FORMATS)}")
    if group not in GROUPS[fmt]:
        raise FormatError(f"{where}: group_size={group} is not supported by weight_format "
                          f"{fmt!r} (supported: {', '.join(map(str, GROUPS[fmt]))})")


def has_min(fmt: str) -> bool:
    return fmt in ("q4_1", "uint4")


def code_bytes(fmt: str, k: int) -> int:
    return k if fmt == "q8_0" else k // 2


def row_bytes(fmt: str, k: int, group: int) -> int:
    """Bytes per row of K values (K a multiple of 32 and of ``group``)."""
    if fmt == "bf16":
        return 2 * k
    return code_bytes(fmt, k) + (2 + 2 * has_min(fmt)) * (k // group)


def k_of(fmt: str, nbytes: int, group: int) -> int:
    """The K whose rows take ``nbytes``; FormatError when no K does."""
    per_group = row_bytes(fmt, group, group)
    if nbytes % per_group:
        raise FormatError(f"a {fmt} row of {nbytes} bytes is not a whole number of "
                          f"{per_group}-byte groups of {group}")
    return nbytes // per_group * group


def _planes(fmt: str, w: np.ndarray, k: int, group: int) -> tuple[np.ndarray, ...]:
    rows = w.shape[0]
    if w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] != row_bytes(fmt, k, group):
        raise FormatError(f"a {fmt} (group {group}) matrix with K={k} must be uint8 (rows, "
                          f"{row_bytes(fmt, k, group)}), got {w.dtype} {w.shape}")
    n, c = k // group, code_bytes(fmt, k)
    scale_type = ml_dtypes.bfloat16 if fmt == "uint4" else np.float16
    codes = w[:, :c]
    d = np.ascontiguousarray(w[:, c:c + 2 * n]).view(scale_type).astype(np.float32)
    m = (np.ascontiguousarray(w[:, c + 2 * n:]).view(scale_type).astype(np.float32)
         if has_min(fmt) else None)
    return rows, n, codes, d, m


def unpack_codes(fmt: str, codes: np.ndarray) -> np.ndarray:
    """Integer codes (rows, K) as float32: nibbles 0..15, or int8 for q8_0."""
    if fmt == "q8_0":
        return codes.view(np.int8).astype(np.float32)
    rows = codes.shape[0]
    chunks = codes.reshape(rows, -1, 16)
    q = np.concatenate([chunks & 0x0F, chunks >> 4], axis=2)  # (rows, K/32, 32)
    return q.reshape(rows, -1).astype(np.float32)


def pack_codes(fmt: str, q: np.ndarray) -> np.ndarray:
    """Inverse of ``unpack_codes`` for integer codes (rows, K)."""
    if fmt == "q8_0":
        return q.astype(np.int8).view(np.uint8)
    rows = q.shape[0]
    chunks = q.astype(np.uint8).reshape(rows, -1, 32)
    return (chunks[:, :, :16] | (chunks[:, :, 16:] << 4)).reshape(rows, -1)


def dequantize(fmt: str, w: np.ndarray, k: int, group: int) -> np.ndarray:
    """The float32 matrix (rows, K) a quantized one stands for, computed exactly as
    ``d * q + m`` in float32 (d * q is exact: an 11-bit scale times a code of at most 8 bits)."""
    if fmt == "bf16":
        return np.asarray(w, np.float32)
    rows, n, codes, d, m = _planes(fmt, w, k, group)
    q = unpack_codes(fmt, codes).reshape(rows, n, group)
    if fmt == "q4_0":
        q = q - np.float32(8)
    out = d[:, :, None] * q
    if m is not None:
        out = out + m[:, :, None]
    return out.reshape(rows, k).astype(np.float32)


def _tile_axes(fmt: str, rows: int, k: int, group: int) -> tuple[int, int, int, int]:
    """Tiles, groups, 32-value chunks per group and 4-bit code sets of the tiled layout."""
    if rows % TILE:
        raise FormatError(f"a {fmt} matrix of {rows} rows cannot be tiled: its rows must be a "
                          f"multiple of {TILE}")
    return rows // TILE, k // group, group // 32, 2 if fmt == "q8_0" else 1


def tile(fmt: str, w: np.ndarray, k: int, group: int) -> np.ndarray:
    """Row layout -> tiled layout (the bytes the kernels read); rows a multiple of TILE."""
    rows, n, codes, _, _ = _planes(fmt, w, k, group)
    t, n, chunks, nibbles = _tile_axes(fmt, rows, k, group)
    q = unpack_codes(fmt, codes).astype(np.int32)
    if fmt == "q8_0":  # the unsigned code q + 128 as a low and a high nibble
        q = np.stack([(q + 128) & 0xF, (q + 128) >> 4], axis=-1)
    q = q.reshape(t, TILE, n, chunks, 4, 4, 2, nibbles).astype(np.uint32)
    # pairs (8j + 2s, 8j + 2s + 1) of every row into bits 4s and 16 + 4s of word j
    shift = (4 * np.arange(4, dtype=np.uint32))[:, None]
    words = ((q[..., 0, :] << shift) | (q[..., 1, :] << (shift + 16))).sum(axis=-2,
                                                                          dtype=np.uint32)
    c = words.transpose(0, 2, 3, 5, 4, 1).astype("<u4")  # (tile, group, chunk, nibble, j, row)
    params = w[:, code_bytes(fmt, k):].reshape(rows, -1, n, 2)  # (row, plane, group, 2 bytes)
    fields = [c.reshape(t, n, -1).view(np.uint8),
              params.reshape(t, TILE, -1, n, 2).transpose(0, 3, 2, 1, 4).reshape(t, n, -1)]
    return np.ascontiguousarray(np.concatenate(fields, axis=2)).reshape(rows, -1)


def untile(fmt: str, w: np.ndarray, k: int, group: int) -> np.ndarray:
    """Tiled layout -> row layout: the inverse of ``tile``."""
    if w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] != row_bytes(fmt, k, group):
        raise FormatError(f"a {fmt} (group {group}) matrix with K={k} must be uint8 (rows, "
                          f"{row_bytes(fmt, k, group)}), got {w.dtype} {w.shape}")
    t, n, chunks, nibbles = _tile_axes(fmt, w.shape[0], k, group)
    g = w.reshape(t, n, row_bytes(fmt, group, group) * TILE)
    c = code_bytes(fmt, group) * TILE
    words = np.ascontiguousarray(g[:, :, :c]).view("<u4").reshape(t, n, chunks, nibbles, 4, TILE)
    words = words.transpose(0, 5, 1, 2, 4, 3)[..., None, None, :]  # (t,row,g,c,j,1,1,nibble)
    shift = (4 * np.arange(4, dtype=np.uint32))[:, None, None]
    q = (words >> (shift + 16 * np.arange(2, dtype=np.uint32)[:, None])) & 0xF  # (..,j,s,2,nib)
    q = q.reshape(w.shape[0], k, nibbles).astype(np.int32)
    q = q[..., 0] + 16 * q[..., 1] - 128 if fmt == "q8_0" else q[..., 0]
    codes = pack_codes(fmt, q)
    params = g[:, :, c:].reshape(t, n, -1, TILE, 2).transpose(0, 3, 2, 1, 4)  # (t,row,pl,g,2)
    return np.ascontiguousarray(np.concatenate(
        [codes, params.reshape(w.shape[0], -1)], axis=1))


def tiled_rows(fmt: str, w: np.ndarray, k: int, group: int, index: np.ndarray) -> np.ndarray:
    """Rows ``index`` of a tiled matrix in the row layout, untiling only their tiles."""
    index = np.asarray(index)
    tiles, where = np.unique(index // TILE, return_inverse=True)
    blocks = w.reshape(-1, TILE, w.shape[1])[tiles].reshape(-1, w.shape[1])
    rows = untile(fmt, blocks, k, group)
    return rows[where.reshape(index.shape) * TILE + index % TILE]


#: Values of x that share one int8 scale in a product with a quantized matrix.
ACTIVATION_BLOCK = 16


def activation_values(x: np.ndarray) -> np.ndarray:
    """``x`` as a matrix-vector product with a quantized matrix multiplies it (float32).

    Every ACTIVATION_BLOCK consecutive values become int8 codes with one float32 scale,
    max |x| / 127, by rounding x * (127 / max |x|) half to even; the value is code * scale (a
    block whose 127 / max |x| overflows float32, max |x| = 0 or below 3.7e-37, gets codes 0).
    This makes every product of a 4-bit code with x an integer, so the cpu kernel sums them
    exactly with integer dot products (vpdpbusd; vpmaddubsw on AVX2), in any order, at twice
    the rate of bfloat16 ones. llama.cpp rounds x the same way in blocks of 32 (ggml-quants.c, quantize_row_q8_0 /
    q8_1); blocks of 16 cost less than half as much accuracy (KL from the bf16 bundle, README)
    for one more multiply-add per block. The last axis must be a multiple of the block.
    """
    x = np.asarray(x, np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, ACTIVATION_BLOCK)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", over="ignore"):
        inverse = np.float32(127) / amax
    inverse[~np.isfinite(inverse)] = 0
    codes = np.rint(blocks * inverse)
    return (codes * (amax / np.float32(127))).reshape(x.shape)


def from_gguf(fmt: str, blocks: np.ndarray) -> np.ndarray:
    """GGUF blocks (rows, K/32 * block bytes) -> the row layout: bytes moved, not changed."""
    per = {"q4_0": 18, "q4_1": 20, "q8_0": 34}[fmt]
    if blocks.dtype != np.uint8 or blocks.ndim != 2 or blocks.shape[1] % per:
        raise FormatError(f"{fmt} GGUF blocks must be uint8 (rows, K/32 * {per}), got "
                          f"{blocks.dtype} {blocks.shape}")
    rows, n = blocks.shape[0], blocks.shape[1] // per
    b = blocks.reshape(rows, n, per)
    fields = [b[:, :, 0:2]] + ([b[:, :, 2:4]] if fmt == "q4_1" else [])
    codes = b[:, :, 2 + 2 * (fmt == "q4_1"):]
    return np.ascontiguousarray(np.concatenate(
        [codes.reshape(rows, -1)] + [f.reshape(rows, -1) for f in fields], axis=1))


def to_gguf(fmt: str, w: np.ndarray) -> np.ndarray:
    """Inverse of ``from_gguf``."""
    per = {"q4_0": 18, "q4_1": 20, "q8_0": 34}[fmt]
    rows, n = w.shape[0], w.shape[1] // per
    c = code_bytes(fmt, 32 * n)
    fields = [w[:, c:c + 2 * n].reshape(rows, n, 2)]
    if fmt == "q4_1":
        fields.append(w[:, c + 2 * n:].reshape(rows, n, 2))
    return np.concatenate(fields + [w[:, :c].reshape(rows, n, -1)], axis=2).reshape(rows, -1)


def quantize_uint4(w: np.ndarray, group: int) -> np.ndarray:
    """Group-wise asymmetric uint4, round to nearest: per group of ``group`` values the bf16
    minimum m and scale d = (max - min) / 15 (both rounded to bf16 first), then
    q = clip(round((w - m) / d), 0, 15). Returns the kernels' layout (rows, row_bytes)."""
    w = np.asarray(w, np.float32)
    rows, k = w.shape
    check_format("uint4", group, "quantize_uint4")
    if k % group or k % 32:
        raise FormatError(f"quantize_uint4: K={k} is not a multiple of 32 and of the group "
                          f"size {group}")
    g = w.reshape(rows, k // group, group)
    lo, hi = g.min(axis=2), g.max(axis=2)
    m = lo.astype(ml_dtypes.bfloat16)
    d = ((hi - m.astype(np.float32)) / 15).astype(ml_dtypes.bfloat16)
    df, mf = d.astype(np.float32), m.astype(np.float32)
    safe = np.where(df > 0, df, 1)[:, :, None]
    q = np.clip(np.rint((g - mf[:, :, None]) / safe), 0, 15)
    q = np.where(df[:, :, None] > 0, q, 0)
    return np.ascontiguousarray(np.concatenate(
        [pack_codes("uint4", q.reshape(rows, k)), d.view(np.uint8).reshape(rows, -1),
         m.view(np.uint8).reshape(rows, -1)], axis=1))


def random_matrix(fmt: str, rows: int, k: int, group: int, rng: np.random.Generator,
                  scale: float = 0.1) -> np.ndarray:
    """A valid quantized matrix of about ``scale``-sized values (random codes, scales and
    minimums): realistic inputs for timing and checking a kernel."""
    codes = rng.integers(-128, 128, (rows, k)) if fmt == "q8_0" else rng.integers(0, 16,
                                                                                   (rows, k))
    n = k // group
    scale_type = ml_dtypes.bfloat16 if fmt == "uint4" else np.float16
    top = 127 if fmt == "q8_0" else 7.5
    d = (rng.uniform(0.5, 1.5, (rows, n)) * scale / top).astype(scale_type)
    planes = [pack_codes(fmt, codes), d.view(np.uint8).reshape(rows, -1)]
    if has_min(fmt):
        m = (-d.astype(np.float32) * rng.uniform(6, 9, (rows, n))).astype(scale_type)
        planes.append(m.view(np.uint8).reshape(rows, -1))
    return np.ascontiguousarray(np.concatenate(planes, axis=1))
