/* swiglu: out[r, i] = silu(x[r, i]) * x[r, SIZE + i]  (gate half first, then the up half).
 *
 * args: x (ROWS, 2 * SIZE) bf16 -> out (ROWS, SIZE) bf16.
 * macros:
 *   IRON_ROWS             rows (tokens; 1 in decode)
 *   IRON_SIZE             output columns (half the input width)
 *   IRON_TILE_SIZE        columns per tile; tiles of the SIZE dimension are the parallel items
 *   IRON_NUM_AIE_COLUMNS  worker threads
 *   IRON_NUM_CHANNELS     NPU DMA channels per column; accepted and ignored on the cpu
 * legality (the operator's rules(), asserted below): SIZE % (TILE_SIZE * NUM_AIE_COLUMNS) == 0.
 * 8 columns at a time with iron_silu8 (vector exp, iron_cpu.h), 16 at a time where AVX-512 is
 * there (iron_silu16: the same operations lane for lane, so the same bits, at half the
 * instructions: a batched decode step runs this for every row, and its exp and division were
 * a tenth of the step's growth from 1 row to 4); the tail of a tile uses expf.
 */
#include "iron_cpu.h"

#if !defined(IRON_ROWS) || !defined(IRON_SIZE) || !defined(IRON_TILE_SIZE) \
    || !defined(IRON_NUM_AIE_COLUMNS)
#error "swiglu.c needs IRON_ROWS, IRON_SIZE, IRON_TILE_SIZE, IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_SIZE % (IRON_NUM_AIE_COLUMNS * IRON_TILE_SIZE) == 0,
               "size % (num_aie_columns * tile_size) == 0");

void iron_kernel(void *const *args) {
    const uint16_t *x = args[0];
    uint16_t *out = args[1];

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long t = 0; t < IRON_SIZE / IRON_TILE_SIZE; t++) {
        for (long r = 0; r < IRON_ROWS; r++) {
            const uint16_t *gate = x + r * 2L * IRON_SIZE;
            const uint16_t *up = gate + IRON_SIZE;
            uint16_t *o = out + r * (long)IRON_SIZE;
            const long end = (t + 1) * IRON_TILE_SIZE;
            long i = t * IRON_TILE_SIZE;
#if defined(__AVX512F__)
            for (; i + 16 <= end; i += 16) {
                const __m512 g = iron_load16_bf16(gate + i), u = iron_load16_bf16(up + i);
                iron_store16_bf16(o + i, _mm512_mul_ps(iron_silu16(g), u));
            }
#endif
            for (; i + 8 <= end; i += 8) {
                __m256 g = iron_load8_bf16(gate + i), u = iron_load8_bf16(up + i);
                iron_store8_bf16(o + i, _mm256_mul_ps(iron_silu8(g), u));
            }
            for (; i < end; i++) {
                float g = iron_bf16_to_f32(gate[i]);
                o[i] = iron_f32_to_bf16(g / (1.0f + expf(-g)) * iron_bf16_to_f32(up[i]));
            }
        }
    }
}
