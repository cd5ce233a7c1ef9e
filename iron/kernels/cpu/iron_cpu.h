/* iron_cpu.h: helpers shared by the cpu kernels of iron.
 *
 * Every kernel is compiled once per resolved operator instance with its shape parameters and
 * tunables baked in as integer macros IRON_<FIELD>; float parameters arrive as the IEEE-754
 * float32 bit pattern IRON_<FIELD>_BITS and are read with iron_f32_from_bits().
 *
 * A kernel states the values a tunable's macro may take on a line of the form below, once, in
 * the source that uses it; iron refuses any other value before compiling (a literal past an
 * int would otherwise reach the compiler, which truncates it with a warning nobody sees).
 * Every other tunable macro is used as an int:
 * range IRON_* 1 2147483647
 *
 * Numerics: bf16 inputs are widened to float32 (exact), all arithmetic is float32, and each
 * output element is rounded to bf16 once, round-to-nearest-even (NaN stays a quiet NaN).
 *
 * The helpers here use AVX2 + FMA intrinsics (x86-64-v3); gemm.c adds AVX512-BF16 and AMX paths,
 * each compiled only when the compiler targets those features (-march), with the AVX2 path as the
 * fallback.
 */
#ifndef IRON_CPU_H
#define IRON_CPU_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The one symbol each kernel .so exports: inputs in order, then outputs in order. */
void iron_kernel(void *const *args);

/* ---- scalars ---------------------------------------------------------------------------- */

static inline float iron_f32_from_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float iron_bf16_to_f32(uint16_t h) {
    return iron_f32_from_bits((uint32_t)h << 16);
}

/* Round-to-nearest-even; NaN -> quiet NaN of the same sign. Branch-free so loops vectorise. */
static inline uint16_t iron_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) : rounded;
    return (uint16_t)(r >> 16);
}

/* ---- AVX2, 8 lanes ---------------------------------------------------------------------- */

/* 8 bf16 -> 8 float32: zero-extend u16 to u32, shift left 16. */
static inline __m256 iron_load8_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* 8 float32 -> 8 bf16, the same rounding as iron_f32_to_bf16. */
static inline void iron_store8_bf16(uint16_t *p, __m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i qnan = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_srli_epi32(_mm256_blendv_epi8(r, qnan, isnan), 16);
    /* packus works per 128-bit lane: [r0..r3 r0..r3 | r4..r7 r4..r7]; keep qwords 0 and 2 */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(packed));
}

static inline float iron_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 8 lane sums of a[0..7], in order: [sum(a[0]), ..., sum(a[7])]. */
static inline __m256 iron_hsum8x8(const __m256 a[8]) {
    /* hadd pairs within each 128-bit half: t0 = [a0 a1 a2 a3 partial sums | the same, high] */
    __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20),
                         _mm256_permute2f128_ps(t0, t1, 0x31));
}

static inline float iron_hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) on 8 lanes, the Cephes expf method (as in sse_mathfun / avx_mathfun):
 *   n = round(x / ln 2),  r = x - n ln 2 (ln 2 split in two constants, |r| <= ln2 / 2),
 *   exp(r) = 1 + r + r^2 P(r) with P of degree 5,  exp(x) = exp(r) * 2^n (n put in the exponent).
 * Accuracy: at most 1.25 float32 ulp from the true value for x in [-87.33, 88.37] (measured
 * against float64 on 24M points; glibc/numpy float32 expf is 0.5-2.5 ulp).
 * Range: x < -87.33654 (where exp(x) < FLT_MIN, including -inf) gives 0; x > 88.376 is clamped
 * to 88.376 (exp ~ 2.4e38, finite, never inf); NaN stays NaN. */
static inline __m256 iron_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.376f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, _mm256_min_ps(hi, x)); /* this operand order keeps a NaN */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n: n in [-126, 127], so n + 127 is a valid biased exponent */
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* silu(g) = g * sigmoid(g) = g / (1 + exp(-g)) on 8 lanes; exact division, so the only error
 * is exp's. For g < -88.4, exp(-g) is clamped, so the result is a tiny g / 2.4e38, not -0. */
static inline __m256 iron_silu8(__m256 g) {
    const __m256 e = iron_exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

#if defined(__AVX512F__)
/* iron_exp8 on 16 lanes, operation for operation (min/max keep a NaN the same way; roundscale
 * with immediate 8 is round_ps's nearest-integer mode; n is integral, so its conversion is
 * exact); underflowing lanes are +0, as andnot makes them there. */
static inline __m512 iron_exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.376f);
    const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(lo, _mm512_min_ps(hi, x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps((__mmask16)~underflow, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}

static inline __m512 iron_load16_bf16(const uint16_t *p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* iron_store8_bf16's rounding on 16 lanes: nearest even, a NaN made quiet. */
static inline void iron_store16_bf16(uint16_t *p, __m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __mmask16 isnan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, isnan, u, _mm512_set1_epi32(0x00400000));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
}

/* iron_silu8 on 16 lanes: the same bits */
static inline __m512 iron_silu16(__m512 g) {
    const __m512 e = iron_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
#endif

/* ---- small vector routines over n elements (any n) -------------------------------------- */

/* sum_i a[i] * b[i], a in bf16, b in float32. */
static inline float iron_dot_bf16_f32(const uint16_t *a, const float *b, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(iron_load8_bf16(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(iron_load8_bf16(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(iron_load8_bf16(a + i), _mm256_loadu_ps(b + i), acc0);
    float s = iron_hsum8(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += iron_bf16_to_f32(a[i]) * b[i];
    return s;
}

/* The 8 dot products sum_i k[j * stride + i] * q[i], j = 0..7, k in bf16, q in float32;
 * n a multiple of 8. One accumulator per row, reduced together by iron_hsum8x8. */
static inline __m256 iron_dot8_bf16_f32(const uint16_t *k, long stride, const float *q, int n) {
    __m256 acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        for (int j = 0; j < 8; j++)
            acc[j] = _mm256_fmadd_ps(iron_load8_bf16(k + j * stride + i), qv, acc[j]);
    }
    return iron_hsum8x8(acc);
}

/* acc[i] += p * v[i], v in bf16. */
static inline void iron_axpy_bf16(float *acc, float p, const uint16_t *v, int n) {
    const __m256 vp = _mm256_set1_ps(p);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vp, iron_load8_bf16(v + i),
                                                  _mm256_loadu_ps(acc + i)));
    for (; i < n; i++) acc[i] += p * iron_bf16_to_f32(v[i]);
}

/* sum_i x[i]^2, x in bf16. */
static inline float iron_sumsq_bf16(const uint16_t *x, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = iron_load8_bf16(x + i), b = iron_load8_bf16(x + i + 8);
        acc0 = _mm256_fmadd_ps(a, a, acc0);
        acc1 = _mm256_fmadd_ps(b, b, acc1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a = iron_load8_bf16(x + i);
        acc0 = _mm256_fmadd_ps(a, a, acc0);
    }
    float s = iron_hsum8(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) {
        float v = iron_bf16_to_f32(x[i]);
        s += v * v;
    }
    return s;
}

/* max_i x[i], x in bf16, n >= 1. */
static inline float iron_max_bf16(const uint16_t *x, int n) {
    float m = iron_bf16_to_f32(x[0]);
    int i = 0;
    if (n >= 8) {
        __m256 acc = iron_load8_bf16(x);
        for (i = 8; i + 8 <= n; i += 8) acc = _mm256_max_ps(acc, iron_load8_bf16(x + i));
        m = iron_hmax8(acc);
    }
    for (; i < n; i++) m = fmaxf(m, iron_bf16_to_f32(x[i]));
    return m;
}

#endif /* IRON_CPU_H */
