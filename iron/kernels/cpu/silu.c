/* silu: out = x * sigmoid(x) = x / (1 + exp(-x)), elementwise.
 *
 * args: x (SIZE) bf16 -> out (SIZE) bf16.
 * macros:
 *   IRON_SIZE             number of elements
 *   IRON_TILE_SIZE        elements per tile (the unit of the inner loop)
 *   IRON_NUM_AIE_COLUMNS  worker threads; tiles are split among them statically
 *   IRON_NUM_CHANNELS     NPU DMA channels per column; accepted and ignored on the cpu
 * legality (checked in Python): SIZE % (NUM_AIE_COLUMNS * TILE_SIZE) == 0.
 * 8 elements at a time with iron_silu8 (vector exp, iron_cpu.h); the tail of a tile uses expf.
 */
#include "iron_cpu.h"

#if !defined(IRON_SIZE) || !defined(IRON_TILE_SIZE) || !defined(IRON_NUM_AIE_COLUMNS)
#error "silu.c needs IRON_SIZE, IRON_TILE_SIZE, IRON_NUM_AIE_COLUMNS"
#endif

void iron_kernel(void *const *args) {
    const uint16_t *x = args[0];
    uint16_t *out = args[1];

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long t = 0; t < IRON_SIZE / IRON_TILE_SIZE; t++) {
        const long base = t * IRON_TILE_SIZE, end = base + IRON_TILE_SIZE;
        long i = base;
        for (; i + 8 <= end; i += 8) iron_store8_bf16(out + i, iron_silu8(iron_load8_bf16(x + i)));
        for (; i < end; i++) {
            float v = iron_bf16_to_f32(x[i]);
            out[i] = iron_f32_to_bf16(v / (1.0f + expf(-v)));
        }
    }
}
