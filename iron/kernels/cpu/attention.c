/* attention: causal grouped-query attention of new query rows over a KV cache.
 *
 * args: q (ROWS, HEADS * HEAD_DIM) bf16, k_cache (KV_HEADS, CTX, HEAD_DIM) bf16,
 *       v_cache (KV_HEADS, CTX, HEAD_DIM) bf16, pos (ROWS) int32
 *       -> out (ROWS, HEADS * HEAD_DIM) bf16.
 * Query row r sits at position pos[0] + r and attends keys 0 .. pos[0] + r inclusive (clamped
 * to the CTX cache positions; a row with no key gives zeros).
 * With IRON_SLOTTED (batched decode: every row is its own sequence), the caches are
 * (SLOTS, KV_HEADS, CTX, HEAD_DIM) and a sixth argument slot (ROWS) int32 comes before out:
 * row r sits at position pos[r] of cache slot slot[r]. Each (row, KV head) pair runs the same
 * attend_group() either way, so a row's result does not depend on the other rows.
 * Query head h reads KV head h / (HEADS / KV_HEADS). A score is q.k summed in float32 from
 * exact products of bf16 pairs (dot2_bf16, VDPBF16PS's arithmetic), then scaled by
 * 1/sqrt(HEAD_DIM); softmax is float32 (online softmax over blocks of TILE_SIZE keys, exp by
 * exp_p8 8 keys at a time); its probabilities are rounded to bf16 and the v rows summed by
 * dot2_bf16 into float32; out is rounded to bf16.
 * macros:
 *   IRON_ROWS             query rows (tokens)
 *   IRON_HEADS            query heads
 *   IRON_KV_HEADS         key/value heads (divides HEADS)
 *   IRON_HEAD_DIM         head dimension
 *   IRON_CTX              cache length (positions)
 *   IRON_TILE_SIZE        keys per online-softmax block
 *   IRON_NUM_AIE_COLUMNS  worker threads over the (row, KV head) pairs (or their parts, below)
 */
#include "iron_cpu.h"

#if !defined(IRON_ROWS) || !defined(IRON_HEADS) || !defined(IRON_KV_HEADS) \
    || !defined(IRON_HEAD_DIM) || !defined(IRON_CTX) || !defined(IRON_TILE_SIZE) \
    || !defined(IRON_NUM_AIE_COLUMNS)
#error "attention.c needs IRON_ROWS, IRON_HEADS, IRON_KV_HEADS, IRON_HEAD_DIM, IRON_CTX, \
IRON_TILE_SIZE, IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_TILE_SIZE <= IRON_CTX, "tile_size <= ctx");
_Static_assert(IRON_HEADS % IRON_KV_HEADS == 0, "heads % kv_heads == 0");

#define GROUP (IRON_HEADS / IRON_KV_HEADS)
#define BLOCK8 ((IRON_TILE_SIZE + 7) / 8 * 8) /* a key block rounded up to whole vectors */

/* Software prefetch. Decode reads each layer's cache once per step, after the weights have
 * pushed it out of the caches. A pair (below) first asks for its first PREFETCH_KEYS keys and
 * values, and for the next pair's; a longer run asks for each key and value row KV_AHEAD rows
 * (4 KiB at 64 dimensions) before it reads it. The hardware prefetcher alone streamed a long
 * cache at 15 GB/s on a Xeon whose weights stream at 30 (1B Llama, 2 threads, 16 layers'
 * caches after their GEMVs): 16-48 rows ahead made attention 1.2-1.3x faster at 1024 and 4096
 * positions, 64 less so. A prefetch changes no result, and one past the cache's end never
 * faults. */
#define PREFETCH_KEYS 128
#define KV_AHEAD 32

/* prefetch `rows` rows (of HEAD_DIM bf16 values), `ahead` values after `row`, into L1 */
static inline __attribute__((always_inline)) void prefetch_ahead(const uint16_t *row, int rows,
                                                                 long ahead) {
    const char *p = (const char *)(row + ahead);
    for (int line = 0; line < rows * IRON_HEAD_DIM * 2; line += 64)
        _mm_prefetch(p + line, _MM_HINT_T0);
}

/* Heads per pass over a block's keys: the keys are loaded (and, for the sums, interleaved) once
 * for the heads of a pass, at the price of more accumulators than AVX-512's 32 registers of 256
 * bits (8 per head for 8 keys' scores, 2 per 16 dimensions for the sums) where a pass has 4
 * heads. Llama 3.2 1B's 4 heads per KV head took 0.81x the time in one pass that they took in
 * passes of 3 and 1 (1 thread, 64 rows at position 1508, Zen 4); SmolLM2's 3 are one pass
 * either way. More heads take several passes over the same keys, from L1. */
#define SCORE_PASS 4
#define ACC_VECTORS ((IRON_HEAD_DIM + 7) / 8) /* 8-float vectors of one head's accumulator */
#define SUM_PASS (ACC_VECTORS >= 32 ? 1 : 32 / ACC_VECTORS)

/* Heads per pass when ng heads go in passes of at most `most`: as even as whole passes of one
 * size allow (4 heads in 2 + 2, 7 in 3 + 3 + 1); a constant where ng is, so that the passes'
 * arrays stay in registers. */
static inline __attribute__((always_inline)) int per_pass(const int ng, const int most) {
    const int passes = (ng + most - 1) / most;
    return (ng + passes - 1) / passes;
}

/* The arithmetic is that of VDPBF16PS (AVX512-BF16): products of bf16 pairs added into float32
 * lanes. Each 32-bit lane of a and b holds two bf16 values; the lane gets acc + a1 * b1, rounded,
 * then + a0 * b0, rounded (the odd, upper, value first), with subnormal inputs and results taken
 * as zero (Intel SDM, VDPBF16PS; measured the same on Zen 4). A product of two bf16 values is
 * exact in float32, so each step is one FMA: builds without AVX512-BF16 run the two FMAs, under
 * MXCSR's flush-to-zero and denormals-are-zero, which attention_mode() sets in every build; so
 * every build gives the same bits. */
static inline __attribute__((always_inline)) __m256 dot2_bf16(__m256 acc, __m256i a, __m256i b) {
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
    return _mm256_dpbf16_ps(acc, (__m256bh)a, (__m256bh)b);
#else
    const __m256i upper = _mm256_set1_epi32((int)0xffff0000u);
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(a, upper)),
                          _mm256_castsi256_ps(_mm256_and_si256(b, upper)), acc);
    return _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)),
                           _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)), acc);
#endif
}

/* MXCSR with flush-to-zero (bit 15) and denormals-are-zero (bit 6) set, as VDPBF16PS computes
 * whatever MXCSR says; returns the caller's MXCSR, to restore. */
static inline unsigned attention_mode(void) {
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);
    return csr;
}

/* exp(x) for x <= 0 (a score less the running max), to 2.7e-6 of itself (2^-18.5, measured on
 * [-0.5, 0.5] in float32; far below the 2^-9 of the bf16 it is rounded to): 2^n 2^f with
 * x log2(e) = n + f, n an integer and |f| <= 1/2, 2^f by a degree-4 polynomial fitted for least
 * maximum relative error, n added into its exponent. Below -125 ln 2 (-86.64: exp(x) < 2^-125,
 * twice FLT_MIN; -inf included) it gives 0, so a masked key weighs nothing and every other p
 * is a normal float (n >= -125). 14 instructions to iron_exp8's 18. */
static inline __m256 exp_p8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-86.643398f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    const __m256 t = _mm256_mul_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(1.44269504088896341f));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(0.009570101276040077f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.05591785907745361f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.240247443318367f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931217908859253f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.9999992847442627f));
    const __m256i e = _mm256_add_epi32(_mm256_castps_si256(p),
                                       _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23));
    return _mm256_andnot_ps(underflow, _mm256_castsi256_ps(e));
}

/* 8 float32 -> 8 bf16 at p, rounded to nearest even (a NaN made quiet): VCVTNEPS2BF16 where
 * there is AVX512-BF16, else iron_store8_bf16, the same bits for every value but subnormals,
 * which the instruction flushes to zero (the probabilities are never subnormal: exp_p8 gives
 * 0 or a normal float). */
static inline void store8_bf16(uint16_t *p, __m256 v) {
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
    _mm_storeu_si128((__m128i *)p, (__m128i)_mm256_cvtneps_pbh(v));
#else
    iron_store8_bf16(p, v);
#endif
}

#if IRON_HEAD_DIM % 16 == 0
#define D16 (IRON_HEAD_DIM / 16)

/* The 8 scores of keys k[0..7] (rows of HEAD_DIM) against each of the ng <= SCORE_PASS query
 * heads q (bf16, as given), scaled, into score[g][j..j+7]: per key, 16 dimensions per
 * dot2_bf16 into 8 lanes, which iron_hsum8x8 then adds. A key is loaded once for the heads. */
static inline __attribute__((always_inline)) void score8(
    const int ng, const uint16_t *k, const uint16_t *q, float (*score)[BLOCK8], long j,
    float scale) {
    __m256 acc[SCORE_PASS][8];
    for (int g = 0; g < ng; g++)
        for (int jj = 0; jj < 8; jj++) acc[g][jj] = _mm256_setzero_ps();
    for (int c = 0; c < D16; c++) {
        __m256i qv[SCORE_PASS];
        for (int g = 0; g < ng; g++)
            qv[g] = _mm256_loadu_si256((const __m256i *)(q + g * IRON_HEAD_DIM + 16 * c));
        for (int jj = 0; jj < 8; jj++) {
            const __m256i kv = _mm256_loadu_si256((const __m256i *)(k + jj * IRON_HEAD_DIM
                                                                    + 16 * c));
            for (int g = 0; g < ng; g++) acc[g][jj] = dot2_bf16(acc[g][jj], kv, qv[g]);
        }
    }
    const __m256 s = _mm256_set1_ps(scale);
    for (int g = 0; g < ng; g++)
        _mm256_storeu_ps(score[g] + j, _mm256_mul_ps(iron_hsum8x8(acc[g]), s));
}

/* acc += the n v rows weighted by their probabilities p (bf16), for ng <= SUM_PASS heads. Two
 * keys at a time: their rows interleaved (vpunpck{l,h}wd) make each lane a pair of one
 * dimension's values, which dot2_bf16 multiplies by the pair of probabilities. A lane's
 * dimensions are therefore permuted within each 16: acc's 16 floats hold dimensions
 * 0-3, 8-11 (the low unpack), then 4-7, 12-15 (see finish()). An odd n pairs the last row with
 * zeros. */
static inline __attribute__((always_inline)) void add_values(
    const int ng, const uint16_t *v, long n, const uint16_t (*p)[BLOCK8],
    float (*acc)[IRON_HEAD_DIM], long ahead) {
    static const uint16_t zero_row[IRON_HEAD_DIM];
    __m256 va[SUM_PASS][2 * D16];
    for (int g = 0; g < ng; g++)
        for (int i = 0; i < 2 * D16; i++) va[g][i] = _mm256_loadu_ps(acc[g] + 8 * i);
    for (long j = 0; j < n; j += 2) {
        const uint16_t *v0 = v + j * IRON_HEAD_DIM;
        const uint16_t *v1 = j + 1 < n ? v0 + IRON_HEAD_DIM : zero_row;
        prefetch_ahead(v0, 2, ahead);
        __m256i pp[SUM_PASS];
        for (int g = 0; g < ng; g++) {
            int32_t pair;
            memcpy(&pair, p[g] + j, sizeof pair);
            pp[g] = _mm256_set1_epi32(pair);
        }
        for (int c = 0; c < D16; c++) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)(v0 + 16 * c));
            const __m256i b = _mm256_loadu_si256((const __m256i *)(v1 + 16 * c));
            const __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);
            for (int g = 0; g < ng; g++) {
                va[g][2 * c] = dot2_bf16(va[g][2 * c], lo, pp[g]);
                va[g][2 * c + 1] = dot2_bf16(va[g][2 * c + 1], hi, pp[g]);
            }
        }
    }
    for (int g = 0; g < ng; g++)
        for (int i = 0; i < 2 * D16; i++) _mm256_storeu_ps(acc[g] + 8 * i, va[g][i]);
}

/* out = acc * inv in bf16, acc's dimensions put back in order (add_values). */
static inline void finish(const float *acc, float inv, uint16_t *out) {
    const __m256 s = _mm256_set1_ps(inv);
    for (int c = 0; c < D16; c++) {
        const __m256 lo = _mm256_loadu_ps(acc + 16 * c), hi = _mm256_loadu_ps(acc + 16 * c + 8);
        iron_store8_bf16(out + 16 * c, _mm256_mul_ps(_mm256_permute2f128_ps(lo, hi, 0x20), s));
        iron_store8_bf16(out + 16 * c + 8,
                         _mm256_mul_ps(_mm256_permute2f128_ps(lo, hi, 0x31), s));
    }
}
#else
/* Head dimensions that are not whole vectors: the same arithmetic, one pair of dimensions
 * (then one key) at a time, the odd dimension first. */
static inline float dot2_scalar(float acc, uint16_t a0, uint16_t a1, uint16_t b0, uint16_t b1) {
    acc = fmaf(iron_bf16_to_f32(a1), iron_bf16_to_f32(b1), acc);
    return fmaf(iron_bf16_to_f32(a0), iron_bf16_to_f32(b0), acc);
}

static inline void score8(const int ng, const uint16_t *k, const uint16_t *q,
                          float (*score)[BLOCK8], long j, float scale) {
    for (int g = 0; g < ng; g++)
        for (int jj = 0; jj < 8; jj++) {
            const uint16_t *kr = k + jj * IRON_HEAD_DIM, *qr = q + g * IRON_HEAD_DIM;
            float s = 0.0f;
            int d = 0;
            for (; d + 2 <= IRON_HEAD_DIM; d += 2) s = dot2_scalar(s, kr[d], kr[d + 1], qr[d],
                                                                   qr[d + 1]);
            if (d < IRON_HEAD_DIM) s = dot2_scalar(s, kr[d], 0, qr[d], 0);
            score[g][j + jj] = s * scale;
        }
}

static inline void add_values(const int ng, const uint16_t *v, long n,
                              const uint16_t (*p)[BLOCK8], float (*acc)[IRON_HEAD_DIM],
                              long ahead) {
    (void)ahead;
    for (long j = 0; j < n; j += 2)
        for (int g = 0; g < ng; g++)
            for (int d = 0; d < IRON_HEAD_DIM; d++)
                acc[g][d] = dot2_scalar(acc[g][d], v[j * IRON_HEAD_DIM + d],
                                        j + 1 < n ? v[(j + 1) * IRON_HEAD_DIM + d] : 0,
                                        p[g][j], p[g][j + 1]);
}

static inline void finish(const float *acc, float inv, uint16_t *out) {
    for (int d = 0; d < IRON_HEAD_DIM; d++) out[d] = iron_f32_to_bf16(acc[d] * inv);
}
#endif

/* The ng (<= GROUP) query heads q[0 .. ng * HEAD_DIM) that read one KV head, over its keys
 * 0 .. len-1: the keys and values are read once for the heads (SCORE_PASS, SUM_PASS at a
 * time), not once per head (they are what decode attention streams from memory). Each head's
 * arithmetic is that of one head alone: scores 8 keys at a time by score8 (the last keys of a
 * run from a zero-padded copy, so a key's score does not depend on where the run ends), online
 * softmax per head over blocks of TILE_SIZE keys with its probabilities rounded to bf16 (as
 * FlashAttention rounds P to the inputs' type before its P V product), then the v rows added
 * two keys at a time by add_values. So a head's result does not depend on which heads share
 * the call (called with constant ng). */
static inline __attribute__((always_inline)) void attend_group(
    const int ng, const uint16_t *q, const uint16_t *k, const uint16_t *v, long len,
    uint16_t *out) {
    float acc[GROUP][IRON_HEAD_DIM], score[GROUP][BLOCK8];
    uint16_t p[GROUP][BLOCK8];
    uint16_t tail[8 * IRON_HEAD_DIM];
    float m[GROUP], l[GROUP];
    const float scale = 1.0f / sqrtf((float)IRON_HEAD_DIM);
    const unsigned csr = attention_mode();
    /* KV_AHEAD rows ahead in a run the first request did not cover; else the row itself (in
     * L1 already: a branch in the loops cost 5% at 4096 positions) */
    const long ahead = len > PREFETCH_KEYS ? KV_AHEAD * IRON_HEAD_DIM : 0;
    for (int g = 0; g < ng; g++) {
        for (int d = 0; d < IRON_HEAD_DIM; d++) acc[g][d] = 0.0f;
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    for (long j0 = 0; j0 < len; j0 += IRON_TILE_SIZE) {
        const long n = len - j0 < IRON_TILE_SIZE ? len - j0 : IRON_TILE_SIZE;
        const uint16_t *kb = k + j0 * IRON_HEAD_DIM, *vb = v + j0 * IRON_HEAD_DIM;
        /* scores q.k, 8 keys at a time; padding up to BLOCK8 is -inf */
        for (long j = 0; j < n; j += 8) {
            const uint16_t *keys = kb + j * IRON_HEAD_DIM;
            if (j + 8 > n) {
                memset(tail, 0, sizeof tail);
                memcpy(tail, keys, (size_t)(n - j) * IRON_HEAD_DIM * sizeof *tail);
                keys = tail;
            } else {
                prefetch_ahead(keys, 8, ahead);
            }
            const int h = per_pass(ng, SCORE_PASS);
            int g0 = 0;
            for (; g0 + h <= ng; g0 += h)
                score8(h, keys, q + g0 * IRON_HEAD_DIM, score + g0, j, scale);
            if (g0 < ng) score8(ng - g0, keys, q + g0 * IRON_HEAD_DIM, score + g0, j, scale);
        }
        for (int g = 0; g < ng; g++) {
            for (long j = n; j % 8; j++) score[g][j] = -INFINITY;
            /* new running max; p = exp(score - max) (exp(-inf) = 0) rounded to bf16; the
             * block's sum of the rounded p */
            __m256 vmax = _mm256_set1_ps(-INFINITY);
            for (long j = 0; j < n; j += 8)
                vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(score[g] + j));
            const float mnew = fmaxf(m[g], iron_hmax8(vmax));
            const __m256 vmnew = _mm256_set1_ps(mnew);
            __m256 vsum = _mm256_setzero_ps();
            for (long j = 0; j < n; j += 8) {
                store8_bf16(p[g] + j,
                            exp_p8(_mm256_sub_ps(_mm256_loadu_ps(score[g] + j), vmnew)));
                vsum = _mm256_add_ps(vsum, iron_load8_bf16(p[g] + j));
            }
            /* rescale what came before to the new max (0 on the first block: m = -inf) */
            const float rescale = expf(m[g] - mnew);
            l[g] = l[g] * rescale + iron_hsum8(vsum);
            for (int d = 0; d < IRON_HEAD_DIM; d++) acc[g][d] *= rescale;
            m[g] = mnew;
        }
        /* add this block's p-weighted v rows, each row read once for SUM_PASS heads */
        const int h = per_pass(ng, SUM_PASS);
        int g0 = 0;
        for (; g0 + h <= ng; g0 += h) add_values(h, vb, n, p + g0, acc + g0, ahead);
        if (g0 < ng) add_values(ng - g0, vb, n, p + g0, acc + g0, ahead);
    }
    for (int g = 0; g < ng; g++)
        finish(acc[g], len > 0 ? 1.0f / l[g] : 0.0f, out + g * IRON_HEAD_DIM);
    _mm_setcsr(csr);
}

/* Where pair rk = (row r, KV head) reads: its keys and values, and how many (row r at
 * position pos[r] of slot slot[r] when slotted, else at pos[0] + r; clamped to the cache). */
static inline long pair(const int32_t *pos, const int32_t *slot, const long rk,
                        const uint16_t *k_cache, const uint16_t *v_cache, const uint16_t **k,
                        const uint16_t **v) {
    const long r = rk / IRON_KV_HEADS, kvh = rk % IRON_KV_HEADS;
    long len = slot ? (long)pos[r] + 1 : (long)pos[0] + r + 1;
    const long base = slot ? (long)slot[r] * IRON_KV_HEADS * IRON_CTX * IRON_HEAD_DIM : 0;
    len = len < 0 ? 0 : len > IRON_CTX ? IRON_CTX : len;
    *k = k_cache + base + kvh * (long)IRON_CTX * IRON_HEAD_DIM;
    *v = v_cache + base + kvh * (long)IRON_CTX * IRON_HEAD_DIM;
    return len;
}

/* Software prefetch of the first PREFETCH_KEYS keys and values of a pair: short runs are too
 * short for the hardware prefetcher to get ahead of (64 keys: 8 KiB of keys, 8 of values):
 * this pair's into L1 as it starts, the next pair's into L2. Measured on Zen 4 with cold
 * caches, a 4-sequence step's attention took 21 us per layer against 27 at 64 positions, 30
 * against 40 at 130. Longer runs go on with prefetch_ahead. */

static inline void prefetch_pair(const uint16_t *k, const uint16_t *v, long len, int hint) {
    len = len < PREFETCH_KEYS ? len : PREFETCH_KEYS;
    for (long i = 0; i < len * IRON_HEAD_DIM; i += 32) {
        if (hint == _MM_HINT_T0) {
            _mm_prefetch((const char *)(k + i), _MM_HINT_T0);
            _mm_prefetch((const char *)(v + i), _MM_HINT_T0);
        } else {
            _mm_prefetch((const char *)(k + i), _MM_HINT_T1);
            _mm_prefetch((const char *)(v + i), _MM_HINT_T1);
        }
    }
}

/* Work items: (row, KV head) pairs, each split in two (its first FIRST_PART heads, then the
 * rest) when the pairs do not share out evenly over the threads: one decode row of SmolLM2
 * has 3 KV heads of 3 query heads, which 2 threads would take 2:1 whole, and 5:4 in parts.
 * A part reads its pair's keys and values again (from cache, the second time); each head's
 * result is the same whichever part computes it (attend_group). */
#define PARTS ((IRON_ROWS * IRON_KV_HEADS) % IRON_NUM_AIE_COLUMNS != 0 && GROUP > 1 ? 2 : 1)
#define FIRST_PART ((GROUP + 1) / 2)

void iron_kernel(void *const *args) {
    const uint16_t *q = args[0];
    const uint16_t *k_cache = args[1];
    const uint16_t *v_cache = args[2];
    const int32_t *pos = args[3];
#ifdef IRON_SLOTTED
    const int32_t *slot = args[4];
    uint16_t *out = args[5];
#else
    const int32_t *slot = NULL;
    uint16_t *out = args[4];
#endif
    const long pairs = (long)IRON_ROWS * IRON_KV_HEADS;

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long item = 0; item < pairs * PARTS; item++) {
        const long rk = item / PARTS;
        const int part = (int)(item % PARTS);
        const uint16_t *k, *v, *next_k, *next_v;
        const long len = pair(pos, slot, rk, k_cache, v_cache, &k, &v);
        prefetch_pair(k, v, len, _MM_HINT_T0);
        if (part == PARTS - 1 && rk + 1 < pairs)
            prefetch_pair(next_k, next_v, pair(pos, slot, rk + 1, k_cache, v_cache, &next_k,
                                               &next_v), _MM_HINT_T1);
        const long off = (rk / IRON_KV_HEADS * IRON_HEADS + rk % IRON_KV_HEADS * GROUP
                          + (part ? FIRST_PART : 0)) * IRON_HEAD_DIM;
        if (PARTS == 1)
            attend_group(GROUP, q + off, k, v, len, out + off);
        else if (part == 0)
            attend_group(FIRST_PART, q + off, k, v, len, out + off);
        else
            attend_group(GROUP - FIRST_PART, q + off, k, v, len, out + off);
    }
}
