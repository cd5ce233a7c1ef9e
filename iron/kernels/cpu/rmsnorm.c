/* rmsnorm: out = x / sqrt(mean(x^2) + eps) [* w], per row.
 *
 * args: x (ROWS, SIZE) bf16, [w (SIZE) bf16 when WEIGHTED] -> out (ROWS, SIZE) bf16.
 * macros:
 *   IRON_ROWS             rows
 *   IRON_SIZE             row length (normalised dimension)
 *   IRON_WEIGHTED         1: multiply by w (args x, w, out); 0: no weight (args x, out)
 *   IRON_EPS_BITS         float32 bit pattern of eps
 *   IRON_TILE_SIZE        rows per tile; tiles are the parallel items
 *   IRON_NUM_AIE_COLUMNS  worker threads
 * legality (the operator's rules(), asserted below): ROWS % (TILE_SIZE * NUM_AIE_COLUMNS) == 0.
 */
#include "iron_cpu.h"

#if !defined(IRON_ROWS) || !defined(IRON_SIZE) || !defined(IRON_WEIGHTED) \
    || !defined(IRON_EPS_BITS) || !defined(IRON_TILE_SIZE) || !defined(IRON_NUM_AIE_COLUMNS)
#error "rmsnorm.c needs IRON_ROWS, IRON_SIZE, IRON_WEIGHTED, IRON_EPS_BITS, IRON_TILE_SIZE, \
IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_ROWS % (IRON_NUM_AIE_COLUMNS * IRON_TILE_SIZE) == 0,
               "rows % (num_aie_columns * tile_size) == 0");

void iron_kernel(void *const *args) {
    const uint16_t *x = args[0];
    const uint16_t *w = IRON_WEIGHTED ? args[1] : NULL;
    uint16_t *out = args[IRON_WEIGHTED ? 2 : 1];
    const float eps = iron_f32_from_bits(IRON_EPS_BITS);

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long t = 0; t < IRON_ROWS / IRON_TILE_SIZE; t++) {
        for (long r = t * IRON_TILE_SIZE; r < (t + 1) * IRON_TILE_SIZE; r++) {
            const uint16_t *xr = x + r * IRON_SIZE;
            uint16_t *o = out + r * IRON_SIZE;
            float inv = 1.0f / sqrtf(iron_sumsq_bf16(xr, IRON_SIZE) / IRON_SIZE + eps);
            for (long i = 0; i < IRON_SIZE; i++) {
                float v = iron_bf16_to_f32(xr[i]) * inv;
                o[i] = iron_f32_to_bf16(IRON_WEIGHTED ? v * iron_bf16_to_f32(w[i]) : v);
            }
        }
    }
}
