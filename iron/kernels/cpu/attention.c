/* attention: causal grouped-query attention of new query rows over a KV cache.
 *
 * args: q (ROWS, HEADS * HEAD_DIM) bf16, k_cache (KV_HEADS, CTX, HEAD_DIM) bf16,
 *       v_cache (KV_HEADS, CTX, HEAD_DIM) bf16, pos (ROWS) int32
 *       -> out (ROWS, HEADS * HEAD_DIM) bf16.
 * Query row r sits at position pos[0] + r and attends keys 0 .. pos[0] + r inclusive (clamped
 * to the CTX cache positions; a row with no key gives zeros).
 * With IRON_SLOTTED (batched decode: every row is its own sequence), the caches are
 * (SLOTS, KV_HEADS, CTX, HEAD_DIM) and a sixth argument slot (ROWS) int32 comes before out:
 * row r sits at position pos[r] of cache slot slot[r]. Each (row, head) pair runs the same
 * attend() either way, so a row's result does not depend on the other rows.
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
 *   IRON_NUM_AIE_COLUMNS  worker threads over the (row, head) pairs
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

/* One query head over keys 0 .. len-1 of one KV head. */
static void attend(const uint16_t *q, const uint16_t *k, const uint16_t *v, long len,
                   uint16_t *out) {
    float qf[IRON_HEAD_DIM], acc[IRON_HEAD_DIM], score[BLOCK8];
    const float scale = 1.0f / sqrtf((float)IRON_HEAD_DIM);
    for (int d = 0; d < IRON_HEAD_DIM; d++) {
        qf[d] = iron_bf16_to_f32(q[d]) * scale;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (long j0 = 0; j0 < len; j0 += IRON_TILE_SIZE) {
        const long n = len - j0 < IRON_TILE_SIZE ? len - j0 : IRON_TILE_SIZE;
        const uint16_t *kb = k + j0 * IRON_HEAD_DIM, *vb = v + j0 * IRON_HEAD_DIM;
        /* scores q.k, 8 keys at a time when HEAD_DIM allows; padding up to BLOCK8 is -inf */
        long j = 0;
        if (IRON_HEAD_DIM % 8 == 0)
            for (; j + 8 <= n; j += 8)
                _mm256_storeu_ps(score + j, iron_dot8_bf16_f32(kb + j * IRON_HEAD_DIM,
                                                               IRON_HEAD_DIM, qf, IRON_HEAD_DIM));
        for (; j < n; j++) score[j] = iron_dot_bf16_f32(kb + j * IRON_HEAD_DIM, qf, IRON_HEAD_DIM);
        for (; j % 8; j++) score[j] = -INFINITY;
        /* new running max; p = exp(score - max) (exp(-inf) = 0); the block's sum of p */
        __m256 vmax = _mm256_set1_ps(-INFINITY);
        for (j = 0; j < n; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(score + j));
        const float mnew = fmaxf(m, iron_hmax8(vmax));
        const __m256 vmnew = _mm256_set1_ps(mnew);
        __m256 vsum = _mm256_setzero_ps();
        for (j = 0; j < n; j += 8) {
            __m256 p = iron_exp8(_mm256_sub_ps(_mm256_loadu_ps(score + j), vmnew));
            _mm256_storeu_ps(score + j, p);
            vsum = _mm256_add_ps(vsum, p);
        }
        /* rescale what came before to the new max, then add this block's p-weighted v rows */
        const float rescale = expf(m - mnew); /* 0 on the first block (m = -inf) */
        l = l * rescale + iron_hsum8(vsum);
        for (int d = 0; d < IRON_HEAD_DIM; d++) acc[d] *= rescale;
        for (j = 0; j < n; j++)
            iron_axpy_bf16(acc, score[j], vb + j * IRON_HEAD_DIM, IRON_HEAD_DIM);
        m = mnew;
    }
    const float inv = len > 0 ? 1.0f / l : 0.0f;
    for (int d = 0; d < IRON_HEAD_DIM; d++) out[d] = iron_f32_to_bf16(acc[d] * inv);
}

void iron_kernel(void *const *args) {
    const uint16_t *q = args[0];
    const uint16_t *k_cache = args[1];
    const uint16_t *v_cache = args[2];
    const int32_t *pos = args[3];
#ifdef IRON_SLOTTED
    const int32_t *slot = args[4];
    uint16_t *out = args[5];
#else
    uint16_t *out = args[4];
    const long start = pos[0];
#endif

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long rh = 0; rh < (long)IRON_ROWS * IRON_HEADS; rh++) {
        const long r = rh / IRON_HEADS, h = rh % IRON_HEADS;
#ifdef IRON_SLOTTED
        long len = (long)pos[r] + 1;
        const long base = (long)slot[r] * IRON_KV_HEADS * IRON_CTX * IRON_HEAD_DIM;
#else
        long len = start + r + 1;
        const long base = 0;
#endif
        len = len < 0 ? 0 : len > IRON_CTX ? IRON_CTX : len;
        const long kv = base + (h / GROUP) * (long)IRON_CTX * IRON_HEAD_DIM;
        const long off = rh * IRON_HEAD_DIM;
        attend(q + off, k_cache + kv, v_cache + kv, len, out + off);
    }
}
