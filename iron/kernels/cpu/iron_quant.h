/* iron_quant.h: block-quantized weight rows (the formats of iron/quant.py) for the cpu kernels.
 *
 * A row of K values is stored as: codes (K/2 bytes of 4-bit codes, or K int8 for q8_0), then
 * one scale per group of IRON_GROUP_SIZE values (fp16; bf16 for uint4), then one minimum per
 * group (q4_1 and uint4 only). Value = d * q + m (q4_1, uint4), d * (q - 8) (q4_0), d * q
 * (q8_0). 4-bit codes keep llama.cpp's order within every 32 values: byte j holds value j in
 * its low nibble and value j + 16 in its high nibble.
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
#define Q_HAS_MIN (QFMT == IRON_FMT_Q4_1 || QFMT == IRON_FMT_UINT4)
#define Q_CODE_BYTES(k) (QFMT == IRON_FMT_Q8_0 ? (long)(k) : (long)(k) / 2)
#define Q_ROW_BYTES(k) (Q_CODE_BYTES(k) + (2 + 2 * Q_HAS_MIN) * ((long)(k) / QG))

#if QFMT != IRON_FMT_BF16

/* 8 scales or minimums (fp16, bf16 for uint4) -> float32 */
static inline __m256 q_load8_params(const uint8_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
#if QFMT == IRON_FMT_UINT4
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
    return _mm256_cvtph_ps(h);
#endif
}

static inline float q_param(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
#if QFMT == IRON_FMT_UINT4
    return iron_bf16_to_f32(h);
#else
    return _cvtsh_ss(h);
#endif
}

/* The scales d[g] of a row and its offset term sum_g (m_g - offset * d_g) * xsum[g], where m_g
 * is the group's minimum (-8 d_g for q4_0, 0 for q8_0): what the per-group dot products of the
 * codes (each taken as offset + q) leave out. */
static inline float q_row_scales(const uint8_t *row, const long k, const float offset,
                                 const float *xsum, float *d) {
    const uint8_t *ds = row + Q_CODE_BYTES(k), *ms = ds + 2 * (k / QG);
    const long n = k / QG;
    __m256 bias = _mm256_setzero_ps();
    const __m256 off = _mm256_set1_ps(offset);
    long g = 0;
    for (; g + 8 <= n; g += 8) {
        const __m256 dv = q_load8_params(ds + 2 * g);
        _mm256_storeu_ps(d + g, dv);
#if Q_HAS_MIN
        const __m256 mv = _mm256_fnmadd_ps(off, dv, q_load8_params(ms + 2 * g));
#elif QFMT == IRON_FMT_Q4_0
        const __m256 mv = _mm256_mul_ps(_mm256_sub_ps(_mm256_set1_ps(-8.0f), off), dv);
#else
        const __m256 mv = _mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), off), dv);
#endif
        bias = _mm256_fmadd_ps(mv, _mm256_loadu_ps(xsum + g), bias);
    }
    float b = iron_hsum8(bias);
    for (; g < n; g++) {
        d[g] = q_param(ds + 2 * g);
#if Q_HAS_MIN
        const float m = q_param(ms + 2 * g);
#elif QFMT == IRON_FMT_Q4_0
        const float m = -8.0f * d[g];
#else
        const float m = 0.0f;
#endif
        b += (m - offset * d[g]) * xsum[g];
    }
    (void)ms;
    return b;
}

/* acc += the 32 codes at c (as float32 q, no offset) times xf[0..31] */
static inline __m256 q_dot32_f32(const uint8_t *c, const float *xf, __m256 acc) {
#if QFMT == IRON_FMT_Q8_0
    for (int i = 0; i < 4; i++) {
        const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(c + 8 * i)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(xf + 8 * i), acc);
    }
#else
    const __m128i b = _mm_loadu_si128((const __m128i *)c);
    const __m256i q0 = _mm256_cvtepu8_epi32(b), q1 = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
    const __m256i lo = _mm256_set1_epi32(0x0f);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q0, lo)), _mm256_loadu_ps(xf), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q1, lo)),
                          _mm256_loadu_ps(xf + 8), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q0, 4)),
                          _mm256_loadu_ps(xf + 16), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q1, 4)),
                          _mm256_loadu_ps(xf + 24), acc);
#endif
    return acc;
}

/* out[0 .. len) = the row's values k0 .. k0 + len in float32, exactly d * q + m (d * q is exact,
 * so a fused multiply-add rounds once, like the reference); k0 and len multiples of QG. */
static inline void q_row_f32(const uint8_t *row, const long k, const long k0, const long len,
                             float *out) {
    const uint8_t *ds = row + Q_CODE_BYTES(k), *ms = ds + 2 * (k / QG);
    for (long g = k0 / QG; g < (k0 + len) / QG; g++) {
        const __m256 d = _mm256_set1_ps(q_param(ds + 2 * g));
#if Q_HAS_MIN
        const __m256 m = _mm256_set1_ps(q_param(ms + 2 * g));
#elif QFMT == IRON_FMT_Q4_0
        const __m256 m = _mm256_mul_ps(_mm256_set1_ps(-8.0f), d);
#else
        const __m256 m = _mm256_setzero_ps();
#endif
        for (long k32 = g * QG; k32 < (g + 1) * QG; k32 += 32) {
            float *o = out + (k32 - k0);
#if QFMT == IRON_FMT_Q8_0
            for (int i = 0; i < 4; i++) {
                const __m256i q = _mm256_cvtepi8_epi32(
                    _mm_loadl_epi64((const __m128i *)(row + k32 + 8 * i)));
                _mm256_storeu_ps(o + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
            }
#else
            const __m128i b = _mm_loadu_si128((const __m128i *)(row + k32 / 2));
            const __m256i q0 = _mm256_cvtepu8_epi32(b);
            const __m256i q1 = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
            const __m256i lo = _mm256_set1_epi32(0x0f);
            const __m256i q[4] = {_mm256_and_si256(q0, lo), _mm256_and_si256(q1, lo),
                                  _mm256_srli_epi32(q0, 4), _mm256_srli_epi32(q1, 4)};
            for (int i = 0; i < 4; i++)
                _mm256_storeu_ps(o + 8 * i, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[i]), d, m));
#endif
        }
    }
    (void)ms;
}

/* out[0 .. len) = the row's values k0 .. k0 + len rounded to bf16 (as iron_f32_to_bf16; with
 * AVX512-BF16 by vcvtne2ps2bf16, 32 values per instruction, the same rounding for the values
 * here, which are never NaN nor subnormal) */
static inline void q_row_bf16(const uint8_t *row, const long k, const long k0, const long len,
                              float *scratch, uint16_t *out) {
#if defined(__AVX512BF16__)
    const uint8_t *ds = row + Q_CODE_BYTES(k), *ms = ds + 2 * (k / QG);
    for (long g = k0 / QG; g < (k0 + len) / QG; g++) {
        const __m512 d = _mm512_set1_ps(q_param(ds + 2 * g));
#if Q_HAS_MIN
        const __m512 m = _mm512_set1_ps(q_param(ms + 2 * g));
#elif QFMT == IRON_FMT_Q4_0
        const __m512 m = _mm512_mul_ps(_mm512_set1_ps(-8.0f), d);
#else
        const __m512 m = _mm512_setzero_ps();
#endif
        for (long k32 = g * QG; k32 < (g + 1) * QG; k32 += 32) {
#if QFMT == IRON_FMT_Q8_0
            const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + k32)));
            const __m512i q1 = _mm512_cvtepi8_epi32(
                _mm_loadu_si128((const __m128i *)(row + k32 + 16)));
#else
            const __m512i b =
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + k32 / 2)));
            const __m512i q0 = _mm512_and_si512(b, _mm512_set1_epi32(0x0f));
            const __m512i q1 = _mm512_srli_epi32(b, 4);
#endif
            const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q0), d, m);
            const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q1), d, m);
            _mm512_storeu_si512(out + (k32 - k0), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
    (void)ms;
    (void)scratch;
#else
    q_row_f32(row, k, k0, len, scratch);
    for (long i = 0; i < len; i += 8) iron_store8_bf16(out + i, _mm256_loadu_ps(scratch + i));
#endif
}

#endif /* QFMT != IRON_FMT_BF16 */
#endif /* IRON_QUANT_H */
