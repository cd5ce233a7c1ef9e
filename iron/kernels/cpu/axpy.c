/* axpy: out = scalar_factor * x + y, elementwise.
 *
 * args: x (SIZE) bf16, y (SIZE) bf16 -> out (SIZE) bf16.
 * macros:
 *   IRON_SIZE                number of elements
 *   IRON_TILE_SIZE           elements per tile (the unit of the inner loop)
 *   IRON_NUM_AIE_COLUMNS     worker threads; tiles are split among them statically
 *   IRON_NUM_CHANNELS        NPU DMA channels per column; accepted and ignored on the cpu
 *   IRON_SCALAR_FACTOR_BITS  float32 bit pattern of scalar_factor
 * legality (checked in Python): SIZE % (NUM_AIE_COLUMNS * TILE_SIZE) == 0.
 */
#include "iron_cpu.h"

#if !defined(IRON_SIZE) || !defined(IRON_TILE_SIZE) || !defined(IRON_NUM_AIE_COLUMNS) \
    || !defined(IRON_SCALAR_FACTOR_BITS)
#error "axpy.c needs IRON_SIZE, IRON_TILE_SIZE, IRON_NUM_AIE_COLUMNS, IRON_SCALAR_FACTOR_BITS"
#endif

void iron_kernel(void *const *args) {
    const uint16_t *x = args[0];
    const uint16_t *y = args[1];
    uint16_t *out = args[2];
    const float a = iron_f32_from_bits(IRON_SCALAR_FACTOR_BITS);

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long t = 0; t < IRON_SIZE / IRON_TILE_SIZE; t++) {
        const long base = t * IRON_TILE_SIZE;
        for (long i = base; i < base + IRON_TILE_SIZE; i++)
            out[i] = iron_f32_to_bf16(a * iron_bf16_to_f32(x[i]) + iron_bf16_to_f32(y[i]));
    }
}
