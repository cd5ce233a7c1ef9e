/* iron_elementwise.h: the loop of every elementwise kernel (add, mul, axpy, silu).
 *
 * A kernel includes iron_cpu.h, then defines
 *   IRON_ARITY                  1 or 2 inputs
 *   float iron_element(a, b)    one output element from the widened inputs (b is 0 for one)
 *   IRON_ELEMENT8 (optional)    the name of an 8-lane AVX2 version of it, for one input
 * and includes this file.
 *
 * args: x (SIZE) bf16 [, y (SIZE) bf16] -> out (SIZE) bf16.
 * macros:
 *   IRON_SIZE             number of elements
 *   IRON_TILE_SIZE        elements per tile (the unit of the inner loop)
 *   IRON_NUM_AIE_COLUMNS  worker threads; tiles are split among them statically
 *   IRON_NUM_CHANNELS     NPU DMA channels per column; the cpu has none, so it is 1
 */
#ifndef IRON_ELEMENTWISE_H
#define IRON_ELEMENTWISE_H

#if !defined(IRON_SIZE) || !defined(IRON_TILE_SIZE) || !defined(IRON_NUM_AIE_COLUMNS) \
    || !defined(IRON_NUM_CHANNELS) || !defined(IRON_ARITY)
#error "an elementwise kernel needs IRON_SIZE, IRON_TILE_SIZE, IRON_NUM_AIE_COLUMNS, \
IRON_NUM_CHANNELS and IRON_ARITY"
#endif
_Static_assert(IRON_SIZE % (IRON_NUM_AIE_COLUMNS * IRON_TILE_SIZE) == 0,
               "size % (num_aie_columns * tile_size) == 0");
_Static_assert(IRON_NUM_CHANNELS == 1, "num_channels == 1 on the cpu");

void iron_kernel(void *const *args) {
    const uint16_t *x = args[0];
#if IRON_ARITY == 2
    const uint16_t *y = args[1];
#endif
    uint16_t *out = args[IRON_ARITY];

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long t = 0; t < IRON_SIZE / IRON_TILE_SIZE; t++) {
        const long end = (t + 1) * IRON_TILE_SIZE;
        long i = t * IRON_TILE_SIZE;
#ifdef IRON_ELEMENT8
        for (; i + 8 <= end; i += 8)
            iron_store8_bf16(out + i, IRON_ELEMENT8(iron_load8_bf16(x + i)));
#endif
        for (; i < end; i++) {
#if IRON_ARITY == 2
            out[i] = iron_f32_to_bf16(iron_element(iron_bf16_to_f32(x[i]),
                                                   iron_bf16_to_f32(y[i])));
#else
            out[i] = iron_f32_to_bf16(iron_element(iron_bf16_to_f32(x[i]), 0.0f));
#endif
        }
    }
}

#endif
