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

The K-quants (llama.cpp's Q4_K and Q6_K, what Q4_K_M files hold; ggml-common.h block_q4_K,
block_q6_K) come in super-blocks of 256 values, their ``group_size``. Their row layout is the
GGUF blocks themselves, byte for byte::

    q4_k  144 bytes: d, dmin fp16 | 12 bytes: 8 6-bit scales sc, 8 6-bit minimums mn | 128
          bytes: 4-bit codes q (byte l of each 32 holds value l of sub-block 2i in its low
          nibble, of sub-block 2i + 1 in its high nibble)     w = (d sc) q - (dmin mn) per 32
    q6_k  210 bytes: 128 bytes of low 4 bits | 64 of high 2 bits | 16 int8 scales sc | d fp16
                                                               w = (d sc) (q - 32) per 16

Their tiled layout splits a super-block into its 8 groups of 32 values (the kernels' groups),
each the group's codes in the planes above (q6_k: the low 4 bits of the unsigned q as one set,
then its high 2 bits as a set of 2 planes, word i of plane j holding plane j's 2-bit nibbles of
row i in bits 0-1 of each nibble and plane j + 2's in bits 2-3) followed by its 16 rows'
sub-block scales as bytes (q4_k: sc, then mn, 6-bit values unpacked to a byte each; q6_k: the
two int8 scales of its sub-blocks of 16, 16 rows each), then the super-block's 16 d (and 16
dmin) fp16. Unpacking the 6-bit fields to bytes (148 bytes per row and super-block for 144;
q6_k stays at 210) is lossless: ``untile`` packs them back into the file's bytes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import FormatError

#: Weight formats, in the order of their IRON_FMT_* numbers in kernels/cpu/iron_quant.h.
FORMATS = ("bf16", "q4_0", "q4_1", "q8_0", "uint4", "q4_k", "q6_k", "f16")
#: Formats of one 16-bit float per value, (rows, K) arrays of their own dtype in the kernels'
#: layout (IEEE half for f16: a GGUF F16 tensor or a float16 safetensors one as stored, whose
#: 11 significant bits bf16 would round to 8); no blocks, no tiles.
PLAIN = ("bf16", "f16")
QUANTIZED = tuple(f for f in FORMATS if f not in PLAIN)
#: Group sizes each format supports (bf16 and f16 have no groups: their group_size stays 32);
#: the first is the one a GGUF file's blocks have.
GROUPS = {"bf16": (32,), "q4_0": (32,), "q4_1": (32,), "q8_0": (32,), "uint4": (32, 128),
          "q4_k": (256,), "q6_k": (256,), "f16": (32,)}
#: GGUF tensor type names of the formats a GGUF file stores as such (an F16 tensor's row
#: layout is its 2 K bytes per row).
GGUF_TYPES = {"Q4_0": "q4_0", "Q4_1": "q4_1", "Q8_0": "q8_0", "Q4_K": "q4_k", "Q6_K": "q6_k",
              "F16": "f16"}
#: The K-quants: bytes of a super-block of 256 values, in the file and per row of a tile.
K_BLOCK = {"q4_k": 144, "q6_k": 210}
K_TILED = {"q4_k": 148, "q6_k": 210}
#: q6_k's high 2 bits: one 4-bit plane's nibbles hold two planes' 2-bit values
HIGH_2BIT = 0x33333333
QK_K = 256
#: Rows per tile of the tiled layout (the lanes of a 512-bit register of 32-bit words).
TILE = 16


def plain_dtype(fmt: str) -> type:
    """The element dtype of a plain (one float per value) format's kernel layout."""
    return np.float16 if fmt == "f16" else ml_dtypes.bfloat16


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


def row_bytes(fmt: str, k: int, group: int, tiled: bool = False) -> int:
    """Bytes per row of K values (K a multiple of 32 and of ``group``) in the row layout, or
    the tiled one (the same but for the K-quants)."""
    if fmt in PLAIN:
        return 2 * k
    if fmt in K_BLOCK:
        return k // QK_K * (K_TILED if tiled else K_BLOCK)[fmt]
    return code_bytes(fmt, k) + (2 + 2 * has_min(fmt)) * (k // group)


def k_of(fmt: str, nbytes: int, group: int, tiled: bool = False) -> int:
    """The K whose rows take ``nbytes``; FormatError when no K does."""
    if fmt in PLAIN:
        if nbytes % 2:
            raise FormatError(f"a {fmt} row of {nbytes} bytes is not a whole number of values")
        return nbytes // 2
    per_group = row_bytes(fmt, group, group, tiled)
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
    if fmt in PLAIN:  # f16 either as its row layout's bytes or as float16 (exact in float32)
        w = np.asarray(w)
        return (w.view(np.float16) if w.dtype == np.uint8 else w).astype(np.float32)
    if fmt in K_BLOCK:
        return _k_dequantize(fmt, w, k)
    rows, n, codes, d, m = _planes(fmt, w, k, group)
    q = unpack_codes(fmt, codes).reshape(rows, n, group)
    if fmt == "q4_0":
        q = q - np.float32(8)
    out = d[:, :, None] * q
    if m is not None:
        out = out + m[:, :, None]
    return out.reshape(rows, k).astype(np.float32)


def _plain_bytes(fmt: str, w: np.ndarray, k: int) -> np.ndarray:
    """A plain format's row layout, checked: uint8 (rows, 2 K)."""
    if w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] != 2 * k:
        raise FormatError(f"a {fmt} matrix with K={k} must be uint8 (rows, {2 * k}) in the row "
                          f"layout, got {w.dtype} {w.shape}")
    return np.ascontiguousarray(w)


def _tile_axes(fmt: str, rows: int, k: int, group: int) -> tuple[int, int, int, int]:
    """Tiles, groups, 32-value chunks per group and 4-bit code sets of the tiled layout."""
    if rows % TILE:
        raise FormatError(f"a {fmt} matrix of {rows} rows cannot be tiled: its rows must be a "
                          f"multiple of {TILE}")
    return rows // TILE, k // group, group // 32, 2 if fmt == "q8_0" else 1


def _code_planes(u: np.ndarray, group: int, nibbles: int) -> np.ndarray:
    """Unsigned codes (rows, K) -> their planes (tiles, K/group, group's code bytes * TILE)."""
    rows, k = u.shape
    t, n, chunks = rows // TILE, k // group, group // 32
    q = u.astype(np.int32)
    if nibbles == 2:  # a low and a high nibble
        q = np.stack([q & 0xF, q >> 4], axis=-1)
    q = q.reshape(t, TILE, n, chunks, 4, 4, 2, nibbles).astype(np.uint32)
    # pairs (8j + 2s, 8j + 2s + 1) of every row into bits 4s and 16 + 4s of word j
    shift = (4 * np.arange(4, dtype=np.uint32))[:, None]
    words = ((q[..., 0, :] << shift) | (q[..., 1, :] << (shift + 16))).sum(axis=-2,
                                                                          dtype=np.uint32)
    c = words.transpose(0, 2, 3, 5, 4, 1).astype("<u4")  # (tile, group, chunk, nibble, j, row)
    return c.reshape(t, n, -1).view(np.uint8)


def _plane_codes(planes: np.ndarray, rows: int, k: int, group: int, nibbles: int
                 ) -> np.ndarray:
    """Inverse of ``_code_planes``: (tiles, K/group, code bytes * TILE) -> codes (rows, K)."""
    t, n, chunks = rows // TILE, k // group, group // 32
    words = np.ascontiguousarray(planes).view("<u4").reshape(t, n, chunks, nibbles, 4, TILE)
    words = words.transpose(0, 5, 1, 2, 4, 3)[..., None, None, :]  # (t,row,g,c,j,1,1,nibble)
    shift = (4 * np.arange(4, dtype=np.uint32))[:, None, None]
    q = (words >> (shift + 16 * np.arange(2, dtype=np.uint32)[:, None])) & 0xF  # (..,j,s,2,nib)
    q = q.reshape(rows, k, nibbles).astype(np.int32)
    return q[..., 0] + 16 * q[..., 1] if nibbles == 2 else q[..., 0]


def tile(fmt: str, w: np.ndarray, k: int, group: int) -> np.ndarray:
    """Row layout -> tiled layout (the bytes the kernels read); rows a multiple of TILE. An
    f16 matrix has no tiles: its row bytes viewed as float16 (rows, K)."""
    if fmt == "f16":
        return _plain_bytes(fmt, w, k).view(np.float16)
    if fmt in K_BLOCK:
        return _k_tile(fmt, w, k)
    rows, n, codes, _, _ = _planes(fmt, w, k, group)
    t, n, chunks, nibbles = _tile_axes(fmt, rows, k, group)
    q = unpack_codes(fmt, codes).astype(np.int32)
    c = _code_planes(q + 128 if fmt == "q8_0" else q, group, nibbles)  # q8_0: unsigned q + 128
    params = w[:, code_bytes(fmt, k):].reshape(rows, -1, n, 2)  # (row, plane, group, 2 bytes)
    fields = [c,
              params.reshape(t, TILE, -1, n, 2).transpose(0, 3, 2, 1, 4).reshape(t, n, -1)]
    return np.ascontiguousarray(np.concatenate(fields, axis=2)).reshape(rows, -1)


def untile(fmt: str, w: np.ndarray, k: int, group: int) -> np.ndarray:
    """Tiled layout -> row layout: the inverse of ``tile``."""
    if fmt == "f16":
        if w.dtype != np.float16 or w.shape[-1] != k:
            raise FormatError(f"an f16 matrix with K={k} in the kernels' layout must be float16 "
                              f"(rows, {k}), got {w.dtype} {w.shape}")
        return np.ascontiguousarray(w).view(np.uint8)
    if fmt in K_BLOCK:
        return _k_untile(fmt, w, k)
    if w.dtype != np.uint8 or w.ndim != 2 or w.shape[1] != row_bytes(fmt, k, group):
        raise FormatError(f"a {fmt} (group {group}) matrix with K={k} must be uint8 (rows, "
                          f"{row_bytes(fmt, k, group)}), got {w.dtype} {w.shape}")
    t, n, chunks, nibbles = _tile_axes(fmt, w.shape[0], k, group)
    g = w.reshape(t, n, row_bytes(fmt, group, group) * TILE)
    c = code_bytes(fmt, group) * TILE
    q = _plane_codes(g[:, :, :c], w.shape[0], k, group, nibbles)
    codes = pack_codes(fmt, q - 128 if fmt == "q8_0" else q)
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


#: Values of x that share one int8 scale in a product with a quantized matrix, unless the
#: operator's ``x_block`` says 32 (see ``activation_blocks``).
ACTIVATION_BLOCK = 16


def activation_blocks(fmt: str) -> tuple[int, ...]:
    """The ``x_block`` values a GEMV or GEMM over a ``fmt`` weight may take: 16, and 32 where
    every scale of the weight spans 32 values (all quantized formats but Q6_K, whose scale
    changes every 16). A bf16 or f16 weight multiplies x unrounded: only the default."""
    return (ACTIVATION_BLOCK,) if fmt in PLAIN or fmt == "q6_k" else (ACTIVATION_BLOCK, 32)


def activation_values(x: np.ndarray, block: int = ACTIVATION_BLOCK) -> np.ndarray:
    """``x`` as a matrix-vector product with a quantized matrix multiplies it (float32).

    Every ``block`` consecutive values (16, or 32: the operator's ``x_block``) become int8 codes
    with one float32 scale, max |x| / 127, by rounding x * (127 / max |x|) half to even; the
    value is code * scale (a block whose 127 / max |x| overflows float32, max |x| = 0 or below
    3.7e-37, gets codes 0). This makes every product of a 4-bit code with x an integer, so the
    cpu kernel sums them exactly with integer dot products (vpdpbusd; vpmaddubsw on AVX2), in
    any order, at twice the rate of bfloat16 ones. llama.cpp rounds x the same way in blocks of
    32 (ggml-quants.c, quantize_row_q8_0 / q8_1): one float conversion and multiply-add per 8
    vpdpbusd instead of two, 7-8% faster at a prefill GEMM's shapes on Zen 4, for about
    twice the KL of blocks of 16 (docs/performance.md). The last axis must be a multiple of
    the block.
    """
    x = np.asarray(x, np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, block)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", over="ignore"):
        inverse = np.float32(127) / amax
    inverse[~np.isfinite(inverse)] = 0
    codes = np.rint(blocks * inverse)
    return (codes * (amax / np.float32(127))).reshape(x.shape)


def from_gguf(fmt: str, blocks: np.ndarray) -> np.ndarray:
    """GGUF blocks (rows, K/32 * block bytes) -> the row layout: bytes moved, not changed
    (the K-quants' and F16's row layout is the blocks as they are)."""
    if fmt == "f16":
        return _plain_bytes(fmt, blocks, blocks.shape[-1] // 2)
    if fmt in K_BLOCK:
        if blocks.dtype != np.uint8 or blocks.ndim != 2 or blocks.shape[1] % K_BLOCK[fmt]:
            raise FormatError(f"{fmt} GGUF blocks must be uint8 (rows, K/256 * "
                              f"{K_BLOCK[fmt]}), got {blocks.dtype} {blocks.shape}")
        return np.ascontiguousarray(blocks)
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
    if fmt in K_BLOCK or fmt == "f16":
        return w
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
    if fmt == "f16":  # normal numbers in the row layout's bytes
        return (rng.standard_normal((rows, k)) * scale).astype(np.float16).view(np.uint8)
    if fmt in K_BLOCK:
        return _k_random(fmt, rows, k, rng, scale)
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


def _k_blocks(fmt: str, w: np.ndarray, k: int, tiled: bool = False) -> np.ndarray:
    """A K-quant matrix (rows, row bytes) as (rows, super-blocks, bytes), checked."""
    want = row_bytes(fmt, k, QK_K, tiled)
    if w.dtype != np.uint8 or w.ndim != 2 or k % QK_K or w.shape[1] != want:
        raise FormatError(f"a {fmt} matrix with K={k} must be uint8 (rows, {want}) with K a "
                          f"multiple of {QK_K}, got {w.dtype} {w.shape}")
    return w.reshape(w.shape[0], k // QK_K, -1)


def _q4_k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes (..., 12) -> its 8 6-bit scales and 8 6-bit minimums (..., 8): bytes
    0-3 hold sc 0-3 (low 6 bits) and the top 2 bits of sc 4-7, bytes 4-7 the same for mn,
    bytes 8-11 the low 4 bits of sc 4-7 (low nibble) and of mn 4-7 (high nibble)."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _q4_k_pack_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Inverse of ``_q4_k_scales`` (every one of the 96 bits is a bit of a 6-bit field)."""
    return np.concatenate([(sc[..., :4] & 0x3F) | ((sc[..., 4:] >> 4) << 6),
                           (mn[..., :4] & 0x3F) | ((mn[..., 4:] >> 4) << 6),
                           (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)],
                          axis=-1).astype(np.uint8)


def _k_codes(fmt: str, b: np.ndarray) -> np.ndarray:
    """Blocks (rows, n, bytes) -> unsigned codes (rows, n, 256) in the order of the values."""
    rows, n = b.shape[:2]
    if fmt == "q4_k":
        qs = b[..., 16:].reshape(rows, n, 4, 1, 32)
        return np.concatenate([qs & 0x0F, qs >> 4], axis=3).reshape(rows, n, QK_K)
    ql = b[..., :128].reshape(rows, n, 2, 1, 64)  # value 128h + 64s + l: nibble s of byte 64h + l
    qh = b[..., 128:192].reshape(rows, n, 2, 1, 32)  # 128h + 32s + l: bits 2s of byte 32h + l
    lo = np.concatenate([ql & 0x0F, ql >> 4], axis=3).reshape(rows, n, QK_K)
    hi = np.concatenate([(qh >> 2 * s) & 3 for s in range(4)], axis=3).reshape(rows, n, QK_K)
    return lo | (hi << 4)


def _k_pack_codes(fmt: str, u: np.ndarray) -> np.ndarray:
    """Inverse of ``_k_codes``: codes (rows, n, 256) -> the blocks' code bytes (rows, n, ...)."""
    rows, n = u.shape[:2]
    u = u.astype(np.uint8)
    if fmt == "q4_k":
        u = u.reshape(rows, n, 4, 2, 32)
        return (u[:, :, :, 0] | (u[:, :, :, 1] << 4)).reshape(rows, n, 128)
    lo = (u & 0x0F).reshape(rows, n, 2, 2, 64)
    hi = (u >> 4).reshape(rows, n, 2, 4, 32)
    ql = lo[:, :, :, 0] | (lo[:, :, :, 1] << 4)
    qh = hi[:, :, :, 0] | (hi[:, :, :, 1] << 2) | (hi[:, :, :, 2] << 4) | (hi[:, :, :, 3] << 6)
    return np.concatenate([ql.reshape(rows, n, 128), qh.reshape(rows, n, 64)], axis=2)


def _k_dequantize(fmt: str, w: np.ndarray, k: int) -> np.ndarray:
    """gguf's dequantization (gguf.quants Q4_K / Q6_K), in float32 as it computes it: d * sc
    and dmin * mn are exact, as is (d sc) (q - 32); Q4_K's difference rounds once."""
    b = _k_blocks(fmt, w, k)
    rows, n = b.shape[:2]
    u = _k_codes(fmt, b).astype(np.float32)
    if fmt == "q4_k":
        d = np.ascontiguousarray(b[..., 0:2]).view(np.float16).astype(np.float32)
        dmin = np.ascontiguousarray(b[..., 2:4]).view(np.float16).astype(np.float32)
        sc, mn = _q4_k_scales(b[..., 4:16])
        scale = (d * sc.astype(np.float32))[..., None]
        low = (dmin * mn.astype(np.float32))[..., None]
        out = scale * u.reshape(rows, n, 8, 32) - low
    else:
        sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)
        d = np.ascontiguousarray(b[..., 208:210]).view(np.float16).astype(np.float32)
        out = (d * sc)[..., None] * (u.reshape(rows, n, 16, 16) - np.float32(32))
    return out.reshape(rows, k).astype(np.float32)


def _tile_rows(a: np.ndarray) -> np.ndarray:
    """Per-row fields (rows, n, f, bytes) -> (tiles, n, f * TILE * bytes): a field's 16 rows
    side by side."""
    rows, n, f, nbytes = a.shape
    return np.ascontiguousarray(a.reshape(rows // TILE, TILE, n, f, nbytes)
                                .transpose(0, 2, 3, 1, 4)).reshape(rows // TILE, n, -1)


def _untile_rows(a: np.ndarray, f: int, nbytes: int) -> np.ndarray:
    """Inverse of ``_tile_rows``."""
    t, n = a.shape[:2]
    return a.reshape(t, n, f, TILE, nbytes).transpose(0, 3, 1, 2, 4).reshape(t * TILE, n, f,
                                                                              nbytes)


def _k_tile(fmt: str, w: np.ndarray, k: int) -> np.ndarray:
    b = _k_blocks(fmt, w, k)
    rows, n = b.shape[:2]
    _tile_axes(fmt, rows, k, 32)
    t = rows // TILE
    nibbles = 1 if fmt == "q4_k" else 2
    planes = _code_planes(_k_codes(fmt, b).reshape(rows, k), 32, nibbles)  # (t, 8n, bytes)
    if fmt == "q6_k":  # the high set's planes j and j + 2 share a word (HIGH_2BIT)
        words = planes.view("<u4").reshape(t, 8 * n, 2, 4, TILE)
        high = words[:, :, 1, :2] | (words[:, :, 1, 2:] << 2)
        planes = np.concatenate([words[:, :, 0], high], axis=2).reshape(t, 8 * n, -1).view(
            np.uint8)
    if fmt == "q4_k":
        sc, mn = _q4_k_scales(b[..., 4:16])
        scales = np.stack([sc, mn], axis=3)  # (rows, n, group, 2)
        tail = [b[..., 0:2], b[..., 2:4]]
    else:
        scales = b[..., 192:208].reshape(rows, n, 8, 2)  # the two of each group's 16-blocks
        tail = [b[..., 208:210]]
    scales = _tile_rows(scales.reshape(rows, 8 * n, 2, 1))  # (t, 8n, 2 * 16)
    groups = np.concatenate([planes, scales], axis=2).reshape(t, n, -1)
    tail = _tile_rows(np.stack(tail, axis=2))  # (t, n, fields * 32)
    return np.concatenate([groups, tail], axis=2).reshape(rows, -1)


def _k_untile(fmt: str, w: np.ndarray, k: int) -> np.ndarray:
    b = _k_blocks(fmt, w, k, tiled=True)
    rows, n = b.shape[:2]
    _tile_axes(fmt, rows, k, 32)
    t = rows // TILE
    nibbles = 1 if fmt == "q4_k" else 2
    code = (16 if fmt == "q4_k" else 24) * TILE  # q6_k: 4 planes of low bits, 2 of high
    tail = 32 * (2 if fmt == "q4_k" else 1)
    s = b.reshape(t, TILE * n * K_TILED[fmt])
    s = s.reshape(t, n, -1)
    groups = s[:, :, :-tail].reshape(t, 8 * n, code + 2 * TILE)
    planes = groups[:, :, :code]
    if fmt == "q6_k":
        words = np.ascontiguousarray(planes).view("<u4").reshape(t, 8 * n, 6, TILE)
        high = words[:, :, 4:]
        planes = np.concatenate([words[:, :, :4], high & HIGH_2BIT, (high >> 2) & HIGH_2BIT],
                                axis=2).astype("<u4").reshape(t, 8 * n, -1).view(np.uint8)
    u = _plane_codes(planes, rows, k, 32, nibbles).reshape(rows, n, QK_K)
    scales = _untile_rows(groups[:, :, code:], 2, 1).reshape(rows, n, 8, 2)
    fields = _untile_rows(s[:, :, -tail:], tail // 32, 2)  # (rows, n, fields, 2)
    codes = _k_pack_codes(fmt, u)
    if fmt == "q4_k":
        parts = [fields[:, :, 0], fields[:, :, 1],
                 _q4_k_pack_scales(scales[..., 0], scales[..., 1]), codes]
    else:
        parts = [codes, scales.reshape(rows, n, 16), fields[:, :, 0]]
    return np.ascontiguousarray(np.concatenate(parts, axis=2).reshape(rows, -1))


def _k_random(fmt: str, rows: int, k: int, rng: np.random.Generator, scale: float
              ) -> np.ndarray:
    """Valid random K-quant blocks of about ``scale``-sized values: random codes and 6-bit /
    int8 sub-block scales, fp16 super-block scales sized so."""
    n = rows * k // QK_K
    if k % QK_K:
        raise FormatError(f"a {fmt} matrix's K={k} must be a multiple of {QK_K}")
    if fmt == "q4_k":
        d = (rng.uniform(0.5, 1.5, (n, 1)) * scale / (7.5 * 40)).astype(np.float16)
        dmin = (rng.uniform(0.5, 1.5, (n, 1)) * scale / 40).astype(np.float16)
        rest = rng.integers(0, 256, (n, 140), dtype=np.uint8)
        blocks = np.concatenate([d.view(np.uint8), dmin.view(np.uint8), rest], axis=1)
    else:
        codes = rng.integers(0, 256, (n, 192), dtype=np.uint8)
        sc = rng.integers(-128, 128, (n, 16)).astype(np.int8)
        d = (rng.uniform(0.5, 1.5, (n, 1)) * scale / (32 * 64)).astype(np.float16)
        blocks = np.concatenate([codes, sc.view(np.uint8), d.view(np.uint8)], axis=1)
    return np.ascontiguousarray(blocks.reshape(rows, -1))
