/* attention: causal grouped-query attention of new query rows over a KV cache.
 *
 * args: q (ROWS, HEADS * HEAD_DIM) bf16, k_cache (KV_HEADS, CTX, HEAD_DIM) bf16,
 *       v_cache (KV_HEADS, CTX, HEAD_DIM) bf16, pos (ROWS) int32
 *       -> out (ROWS, HEADS * HEAD_DIM) bf16.
 * Query row r sits at position pos[0] + r and attends keys 0 .. pos[0] + r inclusive (clamped
 * to the CTX cache positions; a row with no key gives zeros). Query head h reads KV head
 * h / (HEADS / KV_HEADS). Scores are scaled by 1/sqrt(HEAD_DIM); softmax and the weighted sum
 * of v are float32 (online softmax over blocks of TILE_SIZE keys); out is rounded to bf16.
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

#define GROUP (IRON_HEADS / IRON_KV_HEADS)

/* One query head over keys 0 .. len-1 of one KV head. */
static void attend(const uint16_t *q, const uint16_t *k, const uint16_t *v, long len,
                   uint16_t *out) {
    float qf[IRON_HEAD_DIM], acc[IRON_HEAD_DIM], score[IRON_TILE_SIZE];
    const float scale = 1.0f / sqrtf((float)IRON_HEAD_DIM);
    for (int d = 0; d < IRON_HEAD_DIM; d++) {
        qf[d] = iron_bf16_to_f32(q[d]) * scale;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (long j0 = 0; j0 < len; j0 += IRON_TILE_SIZE) {
        const long n = len - j0 < IRON_TILE_SIZE ? len - j0 : IRON_TILE_SIZE;
        float bm = -INFINITY;
        for (long j = 0; j < n; j++) {
            score[j] = iron_dot_bf16_f32(k + (j0 + j) * IRON_HEAD_DIM, qf, IRON_HEAD_DIM);
            bm = fmaxf(bm, score[j]);
        }
        const float mnew = fmaxf(m, bm);
        float rescale = expf(m - mnew); /* 0 on the first block (m = -inf) */
        l *= rescale;
        for (long j = 0; j < n; j++) {
            const float p = expf(score[j] - mnew);
            l += p;
            iron_scale_axpy_bf16(acc, rescale, p, v + (j0 + j) * IRON_HEAD_DIM, IRON_HEAD_DIM);
            rescale = 1.0f;
        }
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
    uint16_t *out = args[4];
    const long start = pos[0];

    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static) \
        if (IRON_NUM_AIE_COLUMNS > 1)
    for (long rh = 0; rh < (long)IRON_ROWS * IRON_HEADS; rh++) {
        const long r = rh / IRON_HEADS, h = rh % IRON_HEADS;
        long len = start + r + 1;
        len = len < 0 ? 0 : len > IRON_CTX ? IRON_CTX : len;
        const long kv = (h / GROUP) * (long)IRON_CTX * IRON_HEAD_DIM;
        const long off = rh * IRON_HEAD_DIM;
        attend(q + off, k_cache + kv, v_cache + kv, len, out + off);
    }
}
