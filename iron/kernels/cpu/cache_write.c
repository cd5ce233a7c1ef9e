/* cache_write: store new key (or value) rows into a KV cache, in place.
 *
 * args: cache (KV_HEADS, CTX, HEAD_DIM) bf16, x (ROWS, KV_HEADS * HEAD_DIM) bf16, pos (ROWS)
 *       int32. The cache is also the output: it is modified in place, there is no out pointer.
 * Row r goes to position pos[0] + r; rows whose position is outside [0, CTX) are skipped.
 * macros:
 *   IRON_KV_HEADS  key/value heads
 *   IRON_CTX       cache length (positions)
 *   IRON_HEAD_DIM  head dimension
 *   IRON_ROWS      rows written per call
 */
#include "iron_cpu.h"

#if !defined(IRON_KV_HEADS) || !defined(IRON_CTX) || !defined(IRON_HEAD_DIM) \
    || !defined(IRON_ROWS)
#error "cache_write.c needs IRON_KV_HEADS, IRON_CTX, IRON_HEAD_DIM, IRON_ROWS"
#endif

void iron_kernel(void *const *args) {
    uint16_t *cache = args[0];
    const uint16_t *x = args[1];
    const int32_t *pos = args[2];

    for (long r = 0; r < IRON_ROWS; r++) {
        const long p = (long)pos[0] + r;
        if (p < 0 || p >= IRON_CTX) continue;
        for (long h = 0; h < IRON_KV_HEADS; h++)
            memcpy(cache + (h * IRON_CTX + p) * IRON_HEAD_DIM,
                   x + (r * IRON_KV_HEADS + h) * IRON_HEAD_DIM,
                   sizeof(uint16_t) * IRON_HEAD_DIM);
    }
}
