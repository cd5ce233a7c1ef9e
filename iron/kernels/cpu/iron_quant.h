/* iron_quant.h: block-quantized weight matrices in the tiled layout of iron/quant.py, for the
 * cpu kernels.
 *
 * Rows come in tiles of Q_TILE = 16, so that a 512-bit register holds one 32-bit lane per row.
 * A tile is its groups in order; a group is its codes, chunk after chunk of 32 values, then its
 * 16 scales (fp16; bf16 for uint4), then its 16 minimums (q4_1 and uint4 only). A chunk's codes
 * are Q_NIBBLES sets of 4 planes j of 16 uint32 (one per row), word i of plane j holding 4-bit
 * codes 8j .. 8j+7 of row i: code 8j+2s in bits 4s..4s+3, code 8j+2s+1 in bits 16+4s..16+4s+3.
 * 4-bit formats have one set (the codes u); q8_0 two, the low and the high nibbles of the
 * unsigned u = q + 128. Value = d * (u - Q_ZERO) + m, with m a stored minimum (q4_1, uint4) or
 * 0, and Q_ZERO 8 (q4_0), 128 (q8_0) or 0.
 *
 * The K-quants (q4_k, q6_k) come in super-blocks of 256 values (IRON_GROUP_SIZE), Q_SUPER = 8
 * of the kernels' groups of QG = 32: a super-block of a tile is its 8 groups, each its codes
 * (q6_k: two sets, the low 4 and the high 2 bits of q; the high set in 2 planes, plane j's 2-bit
 * values in bits 0-1 of each nibble and plane j + 2's in bits 2-3: the file's 210 bytes per row
 * and super-block, not 274 for a full second set) then 32 bytes of its 16 rows' sub-block
 * scales (q4_k: 16 6-bit scales sc, 16 6-bit minimums mn, a byte each; q6_k: the int8 scales
 * of its two blocks of 16 values), then the super-block's 16 fp16 d (q4_k: and 16 dmin).
 * Value = (d sc) u - (dmin mn) (q4_k, per group) or (d sc) (u - 32) (q6_k, per 16 values):
 * d sc and dmin mn are exact in float32.
 *
 * bf16 and f16 (Q_PLAIN) are not blocked: a (rows, K) matrix of 16-bit floats, read by the
 * kernels' own plain paths.
 *
 * macros: IRON_WEIGHT_FORMAT (one of IRON_FMT_*, the index in iron.quant.FORMATS),
 * IRON_GROUP_SIZE (a multiple of 32).
 */
#ifndef IRON_QUANT_H
#define IRON_QUANT_H

#include "iron_cpu.h"

#define IRON_FMT_BF16 0
#define IRON_FMT_Q4_0 1
#define IRON_FMT_Q4_1 2
#define IRON_FMT_Q8_0 3
#define IRON_FMT_UINT4 4
#define IRON_FMT_Q4_K 5
#define IRON_FMT_Q6_K 6
#define IRON_FMT_F16 7 /* IEEE half, one per value: a plain (rows, K) matrix like bf16 */

#if !defined(IRON_WEIGHT_FORMAT) || !defined(IRON_GROUP_SIZE)
#error "iron_quant.h needs IRON_WEIGHT_FORMAT and IRON_GROUP_SIZE"
#endif

#define QFMT IRON_WEIGHT_FORMAT
#define Q_PLAIN (QFMT == IRON_FMT_BF16 || QFMT == IRON_FMT_F16) /* no blocks, no tiles */
#define Q_KQUANT (QFMT == IRON_FMT_Q4_K || QFMT == IRON_FMT_Q6_K)
#define QG (Q_KQUANT ? 32 : IRON_GROUP_SIZE)               /* the kernels' group */
#define Q_SUPER (Q_KQUANT ? 8 : 1)                         /* groups per super-block */
#define Q_SUPER_VALUES (QG * Q_SUPER)
#define Q_TILE 16
#define Q_HAS_MIN (QFMT == IRON_FMT_Q4_1 || QFMT == IRON_FMT_UINT4) /* a stored fp16 minimum */
#define Q_CHUNKS (QG / 32)                                 /* chunks per group */
#define Q_NIBBLES (QFMT == IRON_FMT_Q8_0 || QFMT == IRON_FMT_Q6_K ? 2 : 1) /* 4-bit code sets */
#define Q_HIGH_PACKED (QFMT == IRON_FMT_Q6_K) /* the high set's planes j, j + 2 share words */
#define Q_HIGH_2BIT 0x33333333                /* ... bits 0-1 of each nibble: plane j's */
#define Q_CHUNK_BYTES ((Q_HIGH_PACKED ? 24 : Q_NIBBLES * 16) * Q_TILE) /* a chunk's codes */
#define Q_CODE_BYTES (Q_CHUNKS * Q_CHUNK_BYTES)             /* a group's codes in a tile */
#define Q_ZERO (QFMT == IRON_FMT_Q8_0 ? 128 : QFMT == IRON_FMT_Q4_0 ? 8 \
                : QFMT == IRON_FMT_Q6_K ? 32 : 0)
#define Q_GROUP_BYTES (Q_CODE_BYTES + 2 * Q_TILE * (Q_KQUANT ? 1 : 1 + Q_HAS_MIN))
#define Q_SUPER_TAIL (QFMT == IRON_FMT_Q4_K ? 4 * Q_TILE : QFMT == IRON_FMT_Q6_K ? 2 * Q_TILE : 0)
#define Q_SUPER_BYTES (Q_SUPER * Q_GROUP_BYTES + Q_SUPER_TAIL)
#define Q_ROW_BYTES(k) ((long)(k) / Q_SUPER_VALUES * (Q_SUPER_BYTES / Q_TILE))
#define Q_TILE_BYTES(k) (Q_TILE * Q_ROW_BYTES(k))

#if !Q_PLAIN

static inline float q_param(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
#if QFMT == IRON_FMT_UINT4
    return iron_bf16_to_f32(h);
#else
    return _cvtsh_ss(h);
#endif
}

/* group g of a tile: its codes, then its scales */
static inline const uint8_t *q_group(const uint8_t *tile, const long g) {
    return tile + g / Q_SUPER * Q_SUPER_BYTES + g % Q_SUPER * Q_GROUP_BYTES;
}

/* the K-quants: the fp16 d (then dmin) of the super-block of group g */
static inline const uint8_t *q_super_tail(const uint8_t *tile, const long g) {
    return tile + g / Q_SUPER * Q_SUPER_BYTES + Q_SUPER * Q_GROUP_BYTES;
}

/* byte offset in a chunk of plane j of code set h (the words of its 16 rows) and the right
 * shift that brings the plane's values to bits 0-3 of each nibble (q6_k's packed high set;
 * then masked with Q_HIGH_2BIT) */
#define Q_PLANE_AT(h, j) \
    ((h) == 0 ? 64 * (j) : Q_HIGH_PACKED ? 256 + 64 * ((j) % 2) : 256 + 64 * (j))
#define Q_PLANE_SHIFT(h, j) ((h) == 1 && Q_HIGH_PACKED ? 2 * ((j) / 2) : 0)

/* the unsigned code u of value v (0..31) of a chunk, row lane */
static inline int q_code(const uint8_t *chunk, const int lane, const int v) {
    int u = 0;
    for (int h = 0; h < Q_NIBBLES; h++) {
        uint32_t word;
        memcpy(&word, chunk + Q_PLANE_AT(h, v / 8) + 4 * lane, sizeof word);
        word >>= Q_PLANE_SHIFT(h, v / 8);
        if (h == 1 && Q_HIGH_PACKED) word &= Q_HIGH_2BIT;
        u |= ((int)(word >> (4 * (v % 8 / 2) + 16 * (v % 2))) & 0xf) << 4 * h;
    }
    return u;
}

/* the scale d and the offset m (the minimum, or -Q_ZERO d) of block blk of 16 values of
 * group g of the tile, row lane, so that a value is exactly d * u + m in float32 (d * u is
 * exact: an 11-bit scale times a code of at most 8 bits, or a K-quant's d sc, at most 18 bits,
 * times one of at most 6; so a fused multiply-add rounds once, like the reference) */
static inline void q_block_params(const uint8_t *tile, const long g, const int blk,
                                  const int lane, float *d, float *m) {
    const uint8_t *ds = q_group(tile, g) + Q_CODE_BYTES;
#if QFMT == IRON_FMT_Q4_K
    const uint8_t *tail = q_super_tail(tile, g);
    *d = q_param(tail + 2 * lane) * (float)ds[lane];
    *m = -(q_param(tail + 2 * Q_TILE + 2 * lane) * (float)ds[Q_TILE + lane]);
    (void)blk;
#elif QFMT == IRON_FMT_Q6_K
    *d = q_param(q_super_tail(tile, g) + 2 * lane) * (float)(int8_t)ds[Q_TILE * blk + lane];
    *m = -(float)Q_ZERO * *d;
#else
    *d = q_param(ds + 2 * lane);
#if Q_HAS_MIN
    *m = q_param(ds + 2 * Q_TILE + 2 * lane);
#else
    *m = -(float)Q_ZERO * *d;
#endif
    (void)blk;
#endif
}

/* out[0 .. len) = values k0 .. k0 + len of row lane of a tile (row length k) in float32;
 * k0 and len multiples of QG */
static inline void q_lane_f32(const uint8_t *tile, const long k, const int lane, const long k0,
                              const long len, float *out) {
    for (long g = k0 / QG; g < (k0 + len) / QG; g++) {
        const uint8_t *gp = q_group(tile, g);
        for (int c = 0; c < Q_CHUNKS; c++)
            for (int blk = 0; blk < 2; blk++) {
                float d, m;
                q_block_params(tile, g, 2 * c + blk, lane, &d, &m);
                for (int v = 16 * blk; v < 16 * blk + 16; v++)
                    out[g * QG + 32 * c + v - k0] =
                        fmaf((float)q_code(gp + c * Q_CHUNK_BYTES, lane, v), d, m);
            }
    }
    (void)k;
}

/* 16 scales or minimums of a group (fp16, bf16 for uint4) -> float32, one lane per row */
#if defined(__AVX512F__)
static inline __m512 q_load16_params(const uint8_t *p) {
#if QFMT == IRON_FMT_UINT4
    return iron_load16_bf16((const uint16_t *)p);
#else
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#endif
}
#endif

/* 8 of them, rows 8h .. 8h+7 */
static inline __m256 q_load8_params(const uint8_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
#if QFMT == IRON_FMT_UINT4
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
    return _mm256_cvtph_ps(h);
#endif
}

/* the K-quants, rows 8h .. 8h+7 of group g: q4_k's scale d sc and bias -(dmin mn) of the
 * group, q6_k's scale d sc of its block blk of 16 values (both exact in float32) */
#if QFMT == IRON_FMT_Q4_K
static inline void q4_k_params8(const uint8_t *tile, const long g, const int h, __m256 *d,
                                __m256 *bias) {
    const uint8_t *sub = q_group(tile, g) + Q_CODE_BYTES, *tail = q_super_tail(tile, g);
    const __m256 sc = _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sub + 8 * h))));
    const __m256 mn = _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sub + Q_TILE + 8 * h))));
    *d = _mm256_mul_ps(q_load8_params(tail + 16 * h), sc);
    *bias = _mm256_sub_ps(_mm256_setzero_ps(),
                          _mm256_mul_ps(q_load8_params(tail + 2 * Q_TILE + 16 * h), mn));
}
#elif QFMT == IRON_FMT_Q6_K
static inline __m256 q6_k_scale8(const uint8_t *tile, const long g, const int blk, const int h) {
    const uint8_t *sub = q_group(tile, g) + Q_CODE_BYTES + Q_TILE * blk;
    const __m256 sc = _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sub + 8 * h))));
    return _mm256_mul_ps(q_load8_params(q_super_tail(tile, g) + 16 * h), sc);
}
#endif


/* the same for the 16 rows of a tile, one lane per row (the AVX512-VNNI kernel): the same
 * products, so each lane holds the bits its half's q4_k_params8 / q6_k_scale8 gives. The
 * super-block's d and dmin (q_super16) are widened once for its 8 groups, not once per group:
 * q4_k's GEMVs 1-3% faster, its GEMMs 0-5% (a Xeon); q6_k's within noise. */
#if defined(__AVX512F__) && Q_KQUANT
/* the fp16 d and (q4_k) dmin of the super-block of group g, as float32 */
static inline __attribute__((always_inline)) void q_super16(const uint8_t *tile, const long g,
                                                            __m512 *d, __m512 *dmin) {
    const uint8_t *tail = q_super_tail(tile, g);
    *d = q_load16_params(tail);
    *dmin = QFMT == IRON_FMT_Q4_K ? q_load16_params(tail + 2 * Q_TILE) : _mm512_setzero_ps();
}
#if QFMT == IRON_FMT_Q4_K
static inline __attribute__((always_inline)) void q4_k_params16(
    const uint8_t *tile, const long g, const __m512 dsuper, const __m512 dmin, __m512 *d,
    __m512 *bias) {
    const uint8_t *sub = q_group(tile, g) + Q_CODE_BYTES;
    const __m512 sc = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sub)));
    const __m512 mn = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sub + Q_TILE))));
    *d = _mm512_mul_ps(dsuper, sc);
    *bias = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, mn));
}
#else
static inline __attribute__((always_inline)) __m512 q6_k_scale16(
    const uint8_t *tile, const long g, const int blk, const __m512 dsuper) {
    const uint8_t *sub = q_group(tile, g) + Q_CODE_BYTES + Q_TILE * blk;
    const __m512 sc = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sub)));
    return _mm512_mul_ps(dsuper, sc);
}
#endif
#endif

#endif /* !Q_PLAIN */
#endif /* IRON_QUANT_H */
