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

#if !defined(IRON_WEIGHT_FORMAT) || !defined(IRON_GROUP_SIZE)
#error "iron_quant.h needs IRON_WEIGHT_FORMAT and IRON_GROUP_SIZE"
#endif

#define QFMT IRON_WEIGHT_FORMAT
#define QG IRON_GROUP_SIZE
#define Q_TILE 16
#define Q_HAS_MIN (QFMT == IRON_FMT_Q4_1 || QFMT == IRON_FMT_UINT4)
#define Q_CHUNKS (QG / 32)                                 /* chunks per group */
#define Q_NIBBLES (QFMT == IRON_FMT_Q8_0 ? 2 : 1)          /* 4-bit code sets per chunk */
#define Q_CHUNK_BYTES (Q_NIBBLES * 16 * Q_TILE)             /* a chunk's codes in a tile */
#define Q_ZERO (QFMT == IRON_FMT_Q8_0 ? 128 : QFMT == IRON_FMT_Q4_0 ? 8 : 0)
#define Q_GROUP_BYTES (Q_CHUNKS * Q_CHUNK_BYTES + 2 * Q_TILE * (1 + Q_HAS_MIN))
#define Q_ROW_BYTES(k) ((long)(k) / QG * (Q_GROUP_BYTES / Q_TILE))
#define Q_TILE_BYTES(k) (Q_TILE * Q_ROW_BYTES(k))

#if QFMT != IRON_FMT_BF16

static inline float q_param(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
#if QFMT == IRON_FMT_UINT4
    return iron_bf16_to_f32(h);
#else
    return _cvtsh_ss(h);
#endif
}

/* the unsigned code u of value v (0..31) of a chunk, row lane */
static inline int q_code(const uint8_t *chunk, const int lane, const int v) {
    int u = 0;
    for (int h = 0; h < Q_NIBBLES; h++) {
        uint32_t word;
        memcpy(&word, chunk + 4 * ((16 * h + v / 8 * 4) * 4 + lane), sizeof word);
        u |= ((int)(word >> (4 * (v % 8 / 2) + 16 * (v % 2))) & 0xf) << 4 * h;
    }
    return u;
}

/* the scale d and the offset m (the minimum, or -Q_ZERO d) of a group (its codes at g) of the tile, row lane, so that a
 * value is exactly d * u + m in float32 (d * u is exact: an 11-bit scale times a code of at
 * most 8 bits, so a fused multiply-add rounds once, like the reference) */
static inline void q_group_params(const uint8_t *g, const int lane, float *d, float *m) {
    const uint8_t *ds = g + Q_CHUNKS * Q_CHUNK_BYTES;
    *d = q_param(ds + 2 * lane);
#if Q_HAS_MIN
    *m = q_param(ds + 2 * Q_TILE + 2 * lane);
#else
    *m = -(float)Q_ZERO * *d;
#endif
}

/* out[0 .. len) = values k0 .. k0 + len of row lane of a tile (row length k) in float32;
 * k0 and len multiples of QG */
static inline void q_lane_f32(const uint8_t *tile, const long k, const int lane, const long k0,
                              const long len, float *out) {
    for (long g = k0 / QG; g < (k0 + len) / QG; g++) {
        const uint8_t *gp = tile + g * Q_GROUP_BYTES;
        float d, m;
        q_group_params(gp, lane, &d, &m);
        for (int c = 0; c < Q_CHUNKS; c++)
            for (int v = 0; v < 32; v++)
                out[g * QG + 32 * c + v - k0] =
                    fmaf((float)q_code(gp + c * Q_CHUNK_BYTES, lane, v), d, m);
    }
    (void)k;
}

/* 16 scales or minimums of a group (fp16, bf16 for uint4) -> float32, one lane per row */
#if defined(__AVX512F__)
static inline __m512 q_load16_params(const uint8_t *p) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
#if QFMT == IRON_FMT_UINT4
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#else
    return _mm512_cvtph_ps(h);
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

#endif /* QFMT != IRON_FMT_BF16 */
#endif /* IRON_QUANT_H */
