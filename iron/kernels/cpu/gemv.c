/* gemv: out[b, m] = sum_k W[m, k] * x[b, k]  (matrix-vector product, decode's hot kernel).
 *
 * args: W (M, K) bf16, or (M, row bytes) uint8 in a quantized format (iron_quant.h),
 *   x (BATCHES, K) bf16 -> out (BATCHES, M) bf16.
 * macros:
 *   IRON_M                  rows of W (outputs per batch)
 *   IRON_K                  columns of W (reduction length)
 *   IRON_BATCHES            vectors x multiplied by the same W
 *   IRON_TILE_SIZE_INPUT    rows of W computed together by the register-blocked inner kernel
 *                           (they share each load of x)
 *   IRON_TILE_SIZE_OUTPUT   rows of W per parallel work item (a multiple of TILE_SIZE_INPUT)
 *   IRON_NUM_AIE_COLUMNS    worker threads
 *   IRON_WEIGHT_FORMAT, IRON_GROUP_SIZE   how W is stored (iron_quant.h)
 * legality (the operator's rules(), asserted below): M % TILE_SIZE_OUTPUT == 0,
 *   TILE_SIZE_OUTPUT % TILE_SIZE_INPUT == 0.
 *
 * Memory-bandwidth bound: x is converted to float32 once per call (stored permuted, see
 * even8/odd8); W is streamed once, 16 bf16 per 32-byte load widened to float32 in registers
 * without shuffles, into 2 * UNROLL accumulators per row (at least 4 independent FMA chains
 * in flight), TILE_SIZE_INPUT rows sharing each load of x. A software prefetch 4 KiB ahead
 * covers the hardware prefetcher's stop at page boundaries (measured faster from DRAM).
 *
 * Quantized W: each row's scales are converted to float32 once per row, with the term the
 * minimums contribute (sum over groups of m_g * sum of x over the group, x's group sums taken
 * once per call); then per group the codes' dot product with x is accumulated and scaled by
 * d_g in float32. With AVX512-BF16 the 4-bit codes are widened in registers to the bf16
 * numbers 128 + q (bits 0x4300 | q, exact) and vdpbf16ps multiplies 32 of them by 32 bf16
 * x at once (the 128 * d_g * sum(x) this adds is taken off with the minimums' term); two
 * chunks of 32 values go together, their 32 code bytes widened in one zmm, against x
 * reordered once per call to match the nibbles (low: values 0-15 of both chunks); q8_0
 * codes, and 4-bit codes without AVX512-BF16, are widened to float32 for FMAs with x in
 * float32.
 */
#include "iron_cpu.h"
#include "iron_quant.h"

#if !defined(IRON_M) || !defined(IRON_K) || !defined(IRON_BATCHES) \
    || !defined(IRON_TILE_SIZE_INPUT) || !defined(IRON_TILE_SIZE_OUTPUT) \
    || !defined(IRON_NUM_AIE_COLUMNS)
#error "gemv.c needs IRON_M, IRON_K, IRON_BATCHES, IRON_TILE_SIZE_INPUT, \
IRON_TILE_SIZE_OUTPUT, IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_M % IRON_TILE_SIZE_OUTPUT == 0, "M % tile_size_output == 0");
_Static_assert(IRON_TILE_SIZE_OUTPUT % IRON_TILE_SIZE_INPUT == 0,
               "tile_size_output % tile_size_input == 0");
_Static_assert(QFMT == IRON_FMT_BF16 || (IRON_K % 32 == 0 && IRON_K % QG == 0),
               "a quantized W holds whole groups and 32-value chunks");

#define TI IRON_TILE_SIZE_INPUT

#if QFMT == IRON_FMT_BF16

#define UNROLL (TI >= 2 ? 1 : 2)  /* 16-element steps per iteration: >= 4 FMA chains */
#define KSTEP (16 * UNROLL)
#define K16 (IRON_K / 16 * 16)    /* k below K16 is done 16 at a time, the rest scalar */
#define KP ((IRON_K + 7) / 8 * 8)   /* row stride of the float32 copy of x (32-byte rows) */
#define PREFETCH 2048               /* software prefetch distance in elements of W (4 KiB) */

/* 16 bf16 loaded as 8 u32: the low halves are the even elements, the high halves the odd
 * ones; widening them needs one shift or one mask, no shuffle. x is stored permuted to
 * match: within each 16-block, xp = x[0, 2, .., 14], x[1, 3, .., 15]. */
static inline __m256 even8(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
static inline __m256 odd8(__m256i v) {
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

static void permute_x(const uint16_t *x, float *xp) {
    for (long k = 0; k < K16; k += 16)
        for (int i = 0; i < 8; i++) {
            xp[k + i] = iron_bf16_to_f32(x[k + 2 * i]);
            xp[k + 8 + i] = iron_bf16_to_f32(x[k + 2 * i + 1]);
        }
    for (long k = K16; k < IRON_K; k++) xp[k] = iron_bf16_to_f32(x[k]);
}

/* TI rows of W (row stride K) times one permuted float32 vector xp -> out[0 .. TI-1] */
static inline void gemv_block(const uint16_t *w, const float *xp, uint16_t *out) {
    __m256 acc[TI][2 * UNROLL];
    for (int t = 0; t < TI; t++)
        for (int c = 0; c < 2 * UNROLL; c++) acc[t][c] = _mm256_setzero_ps();
    long k = 0;
    for (; k < IRON_K / KSTEP * KSTEP; k += KSTEP) {
        for (int u = 0; u < UNROLL; u++) {
            const __m256 xe = _mm256_load_ps(xp + k + 16 * u);
            const __m256 xo = _mm256_load_ps(xp + k + 16 * u + 8);
            for (int t = 0; t < TI; t++) {
                const uint16_t *wk = w + t * (long)IRON_K + k + 16 * u;
                _mm_prefetch((const char *)(wk + PREFETCH), _MM_HINT_T0);
                const __m256i v = _mm256_loadu_si256((const __m256i *)wk);
                acc[t][2 * u] = _mm256_fmadd_ps(even8(v), xe, acc[t][2 * u]);
                acc[t][2 * u + 1] = _mm256_fmadd_ps(odd8(v), xo, acc[t][2 * u + 1]);
            }
        }
    }
    for (; k < K16; k += 16) { /* only when UNROLL = 2 and K % 32 == 16 */
        const __m256 xe = _mm256_load_ps(xp + k), xo = _mm256_load_ps(xp + k + 8);
        for (int t = 0; t < TI; t++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w + t * (long)IRON_K + k));
            acc[t][0] = _mm256_fmadd_ps(even8(v), xe, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(odd8(v), xo, acc[t][1]);
        }
    }
    for (int t = 0; t < TI; t++) {
        for (int c = 1; c < 2 * UNROLL; c++) acc[t][0] = _mm256_add_ps(acc[t][0], acc[t][c]);
        float s = iron_hsum8(acc[t][0]);
        for (long kk = K16; kk < IRON_K; kk++)
            s += iron_bf16_to_f32(w[t * (long)IRON_K + kk]) * xp[kk];
        out[t] = iron_f32_to_bf16(s);
    }
}

#else /* quantized W */

#define RB Q_ROW_BYTES(IRON_K) /* bytes per row of W */
#define NG (IRON_K / QG)       /* groups per row */
#define KP ((IRON_K + 15) / 16 * 16)
#if defined(__AVX512BF16__) && QFMT != IRON_FMT_Q8_0
#define DP_BF16 1
#define OFFSET 128.0f /* each code q enters the dot products as the bf16 number 128 + q */
#else
#define OFFSET 0.0f
#endif

#ifdef DP_BF16
#define PAIRS (IRON_K / 64) /* pairs of 32-value chunks; an odd last chunk goes alone */

/* 16 code bytes -> 32 bf16 lanes 128 + q in value order: the low nibbles, then the high ones */
static inline __m512bh expand4(const uint8_t *c) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)c));
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi16(b, 4), 1);
    /* (v & 0x000f) | 0x4300 */
    return (__m512bh)_mm512_ternarylogic_epi32(v, _mm512_set1_epi16(0x000f),
                                               _mm512_set1_epi16(0x4300), 0xea);
}

/* x reordered for pairs of chunks: for chunks 2p, 2p + 1 (values 64p ..), 32 bf16 of the
 * values the low nibbles hold (64p + 0..15, 64p + 32..47), then 32 of the high nibbles'
 * (64p + 16..31, 64p + 48..63); an odd last chunk stays in order */
static void permute_x(const uint16_t *x, uint16_t *xp) {
    for (long p = 0; p < PAIRS; p++)
        for (int i = 0; i < 16; i++) {
            xp[64 * p + i] = x[64 * p + i];
            xp[64 * p + 16 + i] = x[64 * p + 32 + i];
            xp[64 * p + 32 + i] = x[64 * p + 16 + i];
            xp[64 * p + 48 + i] = x[64 * p + 48 + i];
        }
    for (long k = 64 * PAIRS; k < IRON_K; k++) xp[k] = x[k];
}

/* The dot products of the codes of chunks 2p, 2p + 1 (32 bytes at c) with x: float32 lanes
 * 0-7 hold chunk 2p's partial sums, lanes 8-15 chunk 2p + 1's (codes taken as 128 + q) */
static inline __m512 dot_pair(const uint8_t *c, const uint16_t *xp, __m512 acc) {
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)c));
    const __m512i lo = _mm512_ternarylogic_epi32(v, _mm512_set1_epi16(0x000f),
                                                 _mm512_set1_epi16(0x4300), 0xea);
    const __m512i hi = _mm512_or_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi16(0x4300));
    acc = _mm512_dpbf16_ps(acc, (__m512bh)lo, (__m512bh)_mm512_loadu_si512(xp));
    return _mm512_dpbf16_ps(acc, (__m512bh)hi, (__m512bh)_mm512_loadu_si512(xp + 32));
}
#endif

/* TI rows of W (row stride RB) times one x (bf16 in pair order xp, float32 xf, group sums) */
static inline void gemv_block(const uint8_t *w, const uint16_t *xp, const float *xf,
                              const float *xsum, uint16_t *out) {
    float d[TI][NG], bias[TI];
    for (int t = 0; t < TI; t++) bias[t] = q_row_scales(w + t * RB, IRON_K, OFFSET, xsum, d[t]);
#ifdef DP_BF16
    __m512 acc[TI];
    for (int t = 0; t < TI; t++) acc[t] = _mm512_setzero_ps();
#if QG == 32 /* a scale per chunk: lanes 0-7 take chunk 2p's, lanes 8-15 chunk 2p + 1's */
    for (long p = 0; p < PAIRS; p++)
        for (int t = 0; t < TI; t++) {
            const __m512 part = dot_pair(w + t * RB + 32 * p, xp + 64 * p, _mm512_setzero_ps());
            const __m512 dd = _mm512_insertf32x8(_mm512_set1_ps(d[t][2 * p]),
                                                 _mm256_set1_ps(d[t][2 * p + 1]), 1);
            acc[t] = _mm512_fmadd_ps(part, dd, acc[t]);
        }
    if (IRON_K % 64) /* the odd last chunk */
        for (int t = 0; t < TI; t++) {
            const long k = IRON_K - 32;
            const __m512 part = _mm512_dpbf16_ps(_mm512_setzero_ps(), expand4(w + t * RB + k / 2),
                                                 (__m512bh)_mm512_loadu_si512(xp + k));
            acc[t] = _mm512_fmadd_ps(part, _mm512_set1_ps(d[t][NG - 1]), acc[t]);
        }
#else /* groups of 64 or more values: whole pairs, one scale */
    for (long g = 0; g < NG; g++) {
        __m512 part[TI];
        for (int t = 0; t < TI; t++) part[t] = _mm512_setzero_ps();
        for (long p = g * QG / 64; p < (g + 1) * QG / 64; p++)
            for (int t = 0; t < TI; t++)
                part[t] = dot_pair(w + t * RB + 32 * p, xp + 64 * p, part[t]);
        for (int t = 0; t < TI; t++)
            acc[t] = _mm512_fmadd_ps(part[t], _mm512_set1_ps(d[t][g]), acc[t]);
    }
#endif
    for (int t = 0; t < TI; t++) out[t] = iron_f32_to_bf16(_mm512_reduce_add_ps(acc[t]) + bias[t]);
    (void)xf;
#else
    __m256 acc[TI];
    for (int t = 0; t < TI; t++) acc[t] = _mm256_setzero_ps();
    for (long g = 0; g < NG; g++) {
        __m256 part[TI];
        for (int t = 0; t < TI; t++) part[t] = _mm256_setzero_ps();
        for (long k = g * QG; k < (g + 1) * QG; k += 32)
            for (int t = 0; t < TI; t++)
                part[t] = q_dot32_f32(w + t * RB + Q_CODE_BYTES(k), xf + k, part[t]);
        for (int t = 0; t < TI; t++)
            acc[t] = _mm256_fmadd_ps(part[t], _mm256_set1_ps(d[t][g]), acc[t]);
    }
    for (int t = 0; t < TI; t++) out[t] = iron_f32_to_bf16(iron_hsum8(acc[t]) + bias[t]);
    (void)xp;
#endif
}

void iron_kernel(void *const *args) {
    const uint8_t *W = args[0];
    const uint16_t *x = args[1];
    uint16_t *out = args[2];

    /* per vector: x in float32 (KP floats), then its NG group sums, then x in bf16 as the
     * kernel reads it (KP values) */
    const long xs_floats = (IRON_BATCHES * NG + 15) / 16 * 16;
    float *xf = aligned_alloc(64, sizeof(float) * (IRON_BATCHES * KP + xs_floats)
                                      + sizeof(uint16_t) * IRON_BATCHES * KP);
    float *xs = xf + (long)IRON_BATCHES * KP;
    uint16_t *xp = (uint16_t *)(xs + xs_floats);
    for (long b = 0; b < IRON_BATCHES; b++) {
#ifdef DP_BF16
        permute_x(x + b * IRON_K, xp + b * KP);
#endif
        for (long k = 0; k < IRON_K; k++) xf[b * KP + k] = iron_bf16_to_f32(x[b * IRON_K + k]);
        for (long g = 0; g < NG; g++) {
            float s = 0.0f;
            for (long k = g * QG; k < (g + 1) * QG; k++) s += xf[b * KP + k];
            xs[b * NG + g] = s;
        }
    }

#if IRON_NUM_AIE_COLUMNS > 1
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long item = 0; item < IRON_M / IRON_TILE_SIZE_OUTPUT; item++) {
        const long m_end = (item + 1) * IRON_TILE_SIZE_OUTPUT;
        for (long m = item * IRON_TILE_SIZE_OUTPUT; m < m_end; m += TI) {
            /* one prefetch per cache line, 4 KiB ahead of this block of rows */
            const char *next = (const char *)(W + m * RB) + 4096;
            for (long line = 0; line < TI * RB; line += 64)
                _mm_prefetch(next + line, _MM_HINT_T0);
            for (long b = 0; b < IRON_BATCHES; b++)
                gemv_block(W + m * RB, xp + b * KP, xf + b * KP, xs + b * NG,
                           out + b * (long)IRON_M + m);
        }
    }
    free(xf);
}

#endif /* quantized W */

#if QFMT == IRON_FMT_BF16
void iron_kernel(void *const *args) {
    const uint16_t *W = args[0];
    const uint16_t *x = args[1];
    uint16_t *out = args[2];

#if IRON_BATCHES * KP <= 65536
    _Alignas(32) float xf[IRON_BATCHES * KP];
#else
    float *xf = aligned_alloc(32, sizeof(float) * IRON_BATCHES * KP);
#endif
    for (long b = 0; b < IRON_BATCHES; b++) permute_x(x + b * IRON_K, xf + b * KP);

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long item = 0; item < IRON_M / IRON_TILE_SIZE_OUTPUT; item++) {
        const long m_end = (item + 1) * IRON_TILE_SIZE_OUTPUT;
        for (long m = item * IRON_TILE_SIZE_OUTPUT; m < m_end; m += TI)
            for (long b = 0; b < IRON_BATCHES; b++)
                gemv_block(W + m * IRON_K, xf + b * KP, out + b * (long)IRON_M + m);
    }

#if IRON_BATCHES * KP > 65536
    free(xf);
#endif
}
#endif
