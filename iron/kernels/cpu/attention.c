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
 * Query head h reads KV head h / (HEADS / KV_HEADS). Scores are scaled by 1/sqrt(HEAD_DIM);
 * softmax and the weighted sum of v are float32 (online softmax over blocks of TILE_SIZE keys,
 * exp by iron_exp8 8 keys at a time); out is rounded to bf16.
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

/* The 8 scores of keys k[0..7] (rows of HEAD_DIM) against each of the ng <= GROUP query heads
 * qf, into score[g][0..7]. Each head's 8 dot products are computed exactly as
 * iron_dot8_bf16_f32 computes them (the same FMAs in the same order, then iron_hsum8x8); a
 * key is widened from bf16 once for all the heads that read it. */
static inline __attribute__((always_inline)) void dot8_group(
    const int ng, const uint16_t *k, const float (*qf)[IRON_HEAD_DIM], float (*score)[BLOCK8],
    long j) {
    __m256 acc[GROUP][8];
    for (int g = 0; g < ng; g++)
        for (int jj = 0; jj < 8; jj++) acc[g][jj] = _mm256_setzero_ps();
    for (int i = 0; i < IRON_HEAD_DIM; i += 8) {
        __m256 qv[GROUP];
        for (int g = 0; g < ng; g++) qv[g] = _mm256_loadu_ps(qf[g] + i);
        for (int jj = 0; jj < 8; jj++) {
            const __m256 kv = iron_load8_bf16(k + jj * IRON_HEAD_DIM + i);
            for (int g = 0; g < ng; g++) acc[g][jj] = _mm256_fmadd_ps(kv, qv[g], acc[g][jj]);
        }
    }
    for (int g = 0; g < ng; g++) _mm256_storeu_ps(score[g] + j, iron_hsum8x8(acc[g]));
}

/* The ng (<= GROUP) query heads q[0 .. ng * HEAD_DIM) that read one KV head, over its keys
 * 0 .. len-1: the keys and values are read once for the heads, not once per head (they are
 * what decode attention streams from memory). Each head's arithmetic is that of one head
 * alone: scores 8 keys at a time by dot8_group, online softmax per head over blocks of
 * TILE_SIZE keys, then acc += p * v in key order, with the same FMAs as iron_axpy_bf16. So a
 * head's result does not depend on which heads share the call (called with constant ng). */
static inline __attribute__((always_inline)) void attend_group(
    const int ng, const uint16_t *q, const uint16_t *k, const uint16_t *v, long len,
    uint16_t *out) {
    float qf[GROUP][IRON_HEAD_DIM], acc[GROUP][IRON_HEAD_DIM], score[GROUP][BLOCK8];
    float m[GROUP], l[GROUP];
    const float scale = 1.0f / sqrtf((float)IRON_HEAD_DIM);
    /* KV_AHEAD rows ahead in a run the first request did not cover; else the row itself (in
     * L1 already: a branch in the loops cost 5% at 4096 positions) */
    const long ahead = len > PREFETCH_KEYS ? KV_AHEAD * IRON_HEAD_DIM : 0;
    for (int g = 0; g < ng; g++) {
        for (int d = 0; d < IRON_HEAD_DIM; d++) {
            qf[g][d] = iron_bf16_to_f32(q[g * IRON_HEAD_DIM + d]) * scale;
            acc[g][d] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    for (long j0 = 0; j0 < len; j0 += IRON_TILE_SIZE) {
        const long n = len - j0 < IRON_TILE_SIZE ? len - j0 : IRON_TILE_SIZE;
        const uint16_t *kb = k + j0 * IRON_HEAD_DIM, *vb = v + j0 * IRON_HEAD_DIM;
        /* scores q.k, 8 keys at a time when HEAD_DIM allows; padding up to BLOCK8 is -inf */
        long j = 0;
        if (IRON_HEAD_DIM % 8 == 0)
            for (; j + 8 <= n; j += 8) {
                prefetch_ahead(kb + j * IRON_HEAD_DIM, 8, ahead);
                dot8_group(ng, kb + j * IRON_HEAD_DIM, qf, score, j);
            }
        for (; j < n; j++)
            for (int g = 0; g < ng; g++)
                score[g][j] = iron_dot_bf16_f32(kb + j * IRON_HEAD_DIM, qf[g], IRON_HEAD_DIM);
        for (; j % 8; j++)
            for (int g = 0; g < ng; g++) score[g][j] = -INFINITY;
        for (int g = 0; g < ng; g++) {
            /* new running max; p = exp(score - max) (exp(-inf) = 0); the block's sum of p */
            __m256 vmax = _mm256_set1_ps(-INFINITY);
            for (j = 0; j < n; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(score[g] + j));
            const float mnew = fmaxf(m[g], iron_hmax8(vmax));
            const __m256 vmnew = _mm256_set1_ps(mnew);
            __m256 vsum = _mm256_setzero_ps();
            for (j = 0; j < n; j += 8) {
                __m256 p = iron_exp8(_mm256_sub_ps(_mm256_loadu_ps(score[g] + j), vmnew));
                _mm256_storeu_ps(score[g] + j, p);
                vsum = _mm256_add_ps(vsum, p);
            }
            /* rescale what came before to the new max (0 on the first block: m = -inf) */
            const float rescale = expf(m[g] - mnew);
            l[g] = l[g] * rescale + iron_hsum8(vsum);
            for (int d = 0; d < IRON_HEAD_DIM; d++) acc[g][d] *= rescale;
            m[g] = mnew;
        }
        /* add this block's p-weighted v rows, each row widened once for the group */
        if (IRON_HEAD_DIM % 8 == 0) {
            /* the accumulators stay in registers over the block (GROUP * HEAD_DIM / 8 of
             * them: 24 for SmolLM2's 3 x 64, within AVX-512's 32) */
            __m256 va[GROUP][IRON_HEAD_DIM / 8];
            for (int g = 0; g < ng; g++)
                for (int i = 0; i < IRON_HEAD_DIM / 8; i++)
                    va[g][i] = _mm256_loadu_ps(acc[g] + 8 * i);
            for (j = 0; j < n; j++) {
                const uint16_t *vr = vb + j * IRON_HEAD_DIM;
                prefetch_ahead(vr, 1, ahead);
                __m256 p[GROUP];
                for (int g = 0; g < ng; g++) p[g] = _mm256_set1_ps(score[g][j]);
                for (int i = 0; i < IRON_HEAD_DIM / 8; i++) {
                    const __m256 vv = iron_load8_bf16(vr + 8 * i);
                    for (int g = 0; g < ng; g++) va[g][i] = _mm256_fmadd_ps(p[g], vv, va[g][i]);
                }
            }
            for (int g = 0; g < ng; g++)
                for (int i = 0; i < IRON_HEAD_DIM / 8; i++)
                    _mm256_storeu_ps(acc[g] + 8 * i, va[g][i]);
        } else {
            for (j = 0; j < n; j++)
                for (int g = 0; g < ng; g++)
                    iron_axpy_bf16(acc[g], score[g][j], vb + j * IRON_HEAD_DIM, IRON_HEAD_DIM);
        }
    }
    for (int g = 0; g < ng; g++) {
        const float inv = len > 0 ? 1.0f / l[g] : 0.0f;
        for (int d = 0; d < IRON_HEAD_DIM; d++)
            out[g * IRON_HEAD_DIM + d] = iron_f32_to_bf16(acc[g][d] * inv);
    }
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
