/* qkv_rope: split a stacked q|k|v row, rotate q and k (RoPE, rotate-half), write k and v into
 * the KV cache. One step in place of a split, two RoPE steps and two cache writes.
 *
 * args: qkv (ROWS, (HEADS + 2 * KV_HEADS) * HEAD_DIM) bf16, pos (ROWS) int32,
 *       inv_freq (HEAD_DIM / 2) float32, k_cache, v_cache (KV_HEADS, CTX, HEAD_DIM) bf16
 *       -> q (ROWS, HEADS * HEAD_DIM) bf16; k_cache and v_cache are updated in place.
 * Row r is rotated by angle pos[r] * inv_freq[i] (as rope.c) and lands in cache position
 * pos[0] + r (as cache_write.c); positions outside [0, CTX) are not written.
 * With IRON_SLOTTED (batched decode: every row is its own sequence), the caches are
 * (SLOTS, KV_HEADS, CTX, HEAD_DIM), a sixth argument slot (ROWS) int32 comes before q, and row
 * r lands in position pos[r] of cache slot slot[r].
 * macros:
 *   IRON_ROWS, IRON_HEADS, IRON_KV_HEADS, IRON_HEAD_DIM (even), IRON_CTX
 */
#include "iron_cpu.h"

#if !defined(IRON_ROWS) || !defined(IRON_HEADS) || !defined(IRON_KV_HEADS) \
    || !defined(IRON_HEAD_DIM) || !defined(IRON_CTX)
#error "qkv_rope.c needs IRON_ROWS, IRON_HEADS, IRON_KV_HEADS, IRON_HEAD_DIM, IRON_CTX"
#endif
_Static_assert(IRON_HEADS % IRON_KV_HEADS == 0, "heads % kv_heads == 0");
_Static_assert(IRON_HEAD_DIM % 2 == 0, "head_dim is even");

#define HALF (IRON_HEAD_DIM / 2)
#define WIDTH ((IRON_HEADS + 2 * IRON_KV_HEADS) * IRON_HEAD_DIM)

/* one head: out = rotate(x) by the row's cos / sin */
static inline void rotate(const uint16_t *x, const float *c, const float *s, uint16_t *out) {
    for (int i = 0; i < HALF; i++) {
        const float lo = iron_bf16_to_f32(x[i]), hi = iron_bf16_to_f32(x[i + HALF]);
        out[i] = iron_f32_to_bf16(lo * c[i] - hi * s[i]);
        out[i + HALF] = iron_f32_to_bf16(hi * c[i] + lo * s[i]);
    }
}

void iron_kernel(void *const *args) {
    const uint16_t *qkv = args[0];
    const int32_t *pos = args[1];
    const float *inv_freq = args[2];
    uint16_t *k_cache = args[3], *v_cache = args[4];
#ifdef IRON_SLOTTED
    const int32_t *slot_of = args[5];
    uint16_t *q = args[6];
#else
    uint16_t *q = args[5];
#endif

    for (long r = 0; r < IRON_ROWS; r++) {
        float c[HALF], s[HALF];
        const float p = (float)pos[r];
        for (int i = 0; i < HALF; i++) {
            const float a = p * inv_freq[i];
            c[i] = cosf(a);
            s[i] = sinf(a);
        }
        const uint16_t *row = qkv + r * (long)WIDTH;
        for (int h = 0; h < IRON_HEADS; h++)
            rotate(row + h * IRON_HEAD_DIM, c, s,
                   q + (r * IRON_HEADS + h) * (long)IRON_HEAD_DIM);
#ifdef IRON_SLOTTED
        const long slot = pos[r];
        const long base = (long)slot_of[r] * IRON_KV_HEADS * IRON_CTX * IRON_HEAD_DIM;
#else
        const long slot = (long)pos[0] + r, base = 0;
#endif
        if (slot < 0 || slot >= IRON_CTX) continue;
        const uint16_t *k = row + IRON_HEADS * IRON_HEAD_DIM;
        const uint16_t *v = k + IRON_KV_HEADS * IRON_HEAD_DIM;
        for (int g = 0; g < IRON_KV_HEADS; g++) {
            const long at = base + (g * (long)IRON_CTX + slot) * IRON_HEAD_DIM;
            rotate(k + g * IRON_HEAD_DIM, c, s, k_cache + at);
            memcpy(v_cache + at, v + g * IRON_HEAD_DIM, sizeof(uint16_t) * IRON_HEAD_DIM);
        }
    }
}
