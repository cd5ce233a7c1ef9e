/* qkv_rope: split a stacked q|k|v row, rotate q and k (RoPE, rotate-half), write k and v into
 * the KV cache. One step in place of a split, two RoPE steps and two cache writes.
 *
 * args: qkv (ROWS, (HEADS + 2 * KV_HEADS) * HEAD_DIM) bf16, pos (ROWS) int32,
 *       inv_freq (HEAD_DIM / 2) float32, k_cache, v_cache (KV_HEADS, CTX, HEAD_DIM) bf16,
 *       [bias ((HEADS + 2 * KV_HEADS) * HEAD_DIM) bf16 when BIAS],
 *       [q_norm, k_norm (HEAD_DIM) bf16 when QK_NORM]
 *       -> q (ROWS, HEADS * HEAD_DIM) bf16; k_cache and v_cache are updated in place.
 * Row r is rotated by angle pos[r] * inv_freq[i] (as rope.c) and lands in cache position
 * pos[0] + r (as cache_write.c); positions outside [0, CTX) are not written.
 * With BIAS (Qwen2) the bias is added to the row first; with QK_NORM (Qwen3) each q and k head
 * is then RMS-normed over HEAD_DIM (epsilon EPS) and scaled by q_norm / k_norm. A head stays
 * float32 from its bias to its rotation, rounded to bf16 once.
 * With IRON_SLOTTED (batched decode: every row is its own sequence), the caches are
 * (SLOTS, KV_HEADS, CTX, HEAD_DIM), a sixth argument slot (ROWS) int32 comes before the
 * variants' weights, and row r lands in position pos[r] of cache slot slot[r].
 * macros:
 *   IRON_ROWS, IRON_HEADS, IRON_KV_HEADS, IRON_HEAD_DIM (even), IRON_CTX
 *   IRON_BIAS, IRON_QK_NORM (0 when absent), IRON_EPS_BITS (float32 bits, with QK_NORM)
 */
#include "iron_cpu.h"

#if !defined(IRON_ROWS) || !defined(IRON_HEADS) || !defined(IRON_KV_HEADS) \
    || !defined(IRON_HEAD_DIM) || !defined(IRON_CTX)
#error "qkv_rope.c needs IRON_ROWS, IRON_HEADS, IRON_KV_HEADS, IRON_HEAD_DIM, IRON_CTX"
#endif
#ifndef IRON_BIAS
#define IRON_BIAS 0
#endif
#ifndef IRON_QK_NORM
#define IRON_QK_NORM 0
#endif
#if IRON_QK_NORM && !defined(IRON_EPS_BITS)
#define IRON_EPS_BITS 0x358637bd  /* 1e-6, the operator's default */
#endif
#ifndef IRON_SLOTTED
#define IRON_SLOTTED 0
#endif
_Static_assert(IRON_HEADS % IRON_KV_HEADS == 0, "heads % kv_heads == 0");
_Static_assert(IRON_HEAD_DIM % 2 == 0, "head_dim is even");

#define HALF (IRON_HEAD_DIM / 2)
#define WIDTH ((IRON_HEADS + 2 * IRON_KV_HEADS) * IRON_HEAD_DIM)

/* one head as float32, ready to rotate: x plus its bias (when BIAS), RMS-normed and scaled by
 * norm (when QK_NORM and norm is given: v is not normed) */
static inline void prepare(const uint16_t *x, const uint16_t *bias, const uint16_t *norm,
                           float *out) {
    for (int i = 0; i < IRON_HEAD_DIM; i++)
        out[i] = iron_bf16_to_f32(x[i]) + (IRON_BIAS ? iron_bf16_to_f32(bias[i]) : 0.0f);
#if IRON_QK_NORM
    if (norm) {
        float ss = 0.0f;
        for (int i = 0; i < IRON_HEAD_DIM; i++)
            ss += out[i] * out[i];
        const float inv = 1.0f / sqrtf(ss / IRON_HEAD_DIM + iron_f32_from_bits(IRON_EPS_BITS));
        for (int i = 0; i < IRON_HEAD_DIM; i++)
            out[i] *= inv * iron_bf16_to_f32(norm[i]);
    }
#else
    (void)norm;
#endif
}

/* one head: out = rotate(x) by the row's cos / sin */
static inline void rotate(const float *x, const float *c, const float *s, uint16_t *out) {
    for (int i = 0; i < HALF; i++) {
        const float lo = x[i], hi = x[i + HALF];
        out[i] = iron_f32_to_bf16(lo * c[i] - hi * s[i]);
        out[i + HALF] = iron_f32_to_bf16(hi * c[i] + lo * s[i]);
    }
}

void iron_kernel(void *const *args) {
    const uint16_t *qkv = args[0];
    const int32_t *pos = args[1];
    const float *inv_freq = args[2];
    uint16_t *k_cache = args[3], *v_cache = args[4];
    const int32_t *slot_of = IRON_SLOTTED ? args[5] : NULL;
    int arg = 5 + IRON_SLOTTED;
    const uint16_t *bias = IRON_BIAS ? args[arg++] : qkv;  /* not read without BIAS */
    const uint16_t *q_norm = IRON_QK_NORM ? args[arg++] : NULL;
    const uint16_t *k_norm = IRON_QK_NORM ? args[arg++] : NULL;
    uint16_t *q = args[arg];

    for (long r = 0; r < IRON_ROWS; r++) {
        float c[HALF], s[HALF], head[IRON_HEAD_DIM];
        const float p = (float)pos[r];
        for (int i = 0; i < HALF; i++) {
            const float a = p * inv_freq[i];
            c[i] = cosf(a);
            s[i] = sinf(a);
        }
        const uint16_t *row = qkv + r * (long)WIDTH;
        for (int h = 0; h < IRON_HEADS; h++) {
            prepare(row + h * IRON_HEAD_DIM, bias + h * IRON_HEAD_DIM, q_norm, head);
            rotate(head, c, s, q + (r * IRON_HEADS + h) * (long)IRON_HEAD_DIM);
        }
        const long slot = IRON_SLOTTED ? (long)pos[r] : (long)pos[0] + r;
        const long base = IRON_SLOTTED ?
            (long)slot_of[r] * IRON_KV_HEADS * IRON_CTX * IRON_HEAD_DIM : 0;
        if (slot < 0 || slot >= IRON_CTX) continue;
        const long k_at = IRON_HEADS * IRON_HEAD_DIM, v_at = k_at + IRON_KV_HEADS * IRON_HEAD_DIM;
        for (int g = 0; g < IRON_KV_HEADS; g++) {
            const long at = base + (g * (long)IRON_CTX + slot) * IRON_HEAD_DIM;
            const long k = k_at + g * IRON_HEAD_DIM, v = v_at + g * IRON_HEAD_DIM;
            prepare(row + k, bias + k, k_norm, head);
            rotate(head, c, s, k_cache + at);
            if (IRON_BIAS) {
                prepare(row + v, bias + v, NULL, head);
                for (int i = 0; i < IRON_HEAD_DIM; i++)
                    v_cache[at + i] = iron_f32_to_bf16(head[i]);
            } else {
                memcpy(v_cache + at, row + v, sizeof(uint16_t) * IRON_HEAD_DIM);
            }
        }
    }
}
