/* softmax: out = exp(x - max(x)) / sum(exp(x - max(x))), per row, in float32.
 *
 * args: x (ROWS, SIZE) bf16 -> out (ROWS, SIZE) bf16.
 * macros:
 *   IRON_ROWS             rows
 *   IRON_SIZE             row length
 *   IRON_TILE_SIZE        rows per tile; tiles are the parallel items
 *   IRON_NUM_AIE_COLUMNS  worker threads
 * legality (the operator's rules(), asserted below): ROWS % (TILE_SIZE * NUM_AIE_COLUMNS) == 0.
 * The exponentials are kept in a per-thread float32 buffer of SIZE floats (malloc'd when large),
 * computed 8 at a time with iron_exp8 (iron_cpu.h); the tail of a row uses expf.
 */
#include "iron_cpu.h"

#if !defined(IRON_ROWS) || !defined(IRON_SIZE) || !defined(IRON_TILE_SIZE) \
    || !defined(IRON_NUM_AIE_COLUMNS)
#error "softmax.c needs IRON_ROWS, IRON_SIZE, IRON_TILE_SIZE, IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_ROWS % (IRON_NUM_AIE_COLUMNS * IRON_TILE_SIZE) == 0,
               "rows % (num_aie_columns * tile_size) == 0");

/* one row: e[] holds exp(x - max) until the sum is known */
static void softmax_row(const uint16_t *x, uint16_t *out, float *e) {
    const long n8 = IRON_SIZE / 8 * 8; /* the part done 8 at a time */
    const float m = iron_max_bf16(x, IRON_SIZE);
    const __m256 vm = _mm256_set1_ps(m);
    __m256 vs = _mm256_setzero_ps();
    for (long i = 0; i < n8; i += 8) {
        __m256 v = iron_exp8(_mm256_sub_ps(iron_load8_bf16(x + i), vm));
        _mm256_storeu_ps(e + i, v);
        vs = _mm256_add_ps(vs, v);
    }
    float s = iron_hsum8(vs);
    for (long i = n8; i < IRON_SIZE; i++) {
        e[i] = expf(iron_bf16_to_f32(x[i]) - m);
        s += e[i];
    }
    const float inv = 1.0f / s;
    const __m256 vinv = _mm256_set1_ps(inv);
    for (long i = 0; i < n8; i += 8)
        iron_store8_bf16(out + i, _mm256_mul_ps(_mm256_loadu_ps(e + i), vinv));
    for (long i = n8; i < IRON_SIZE; i++) out[i] = iron_f32_to_bf16(e[i] * inv);
}

void iron_kernel(void *const *args) {
    const uint16_t *x = args[0];
    uint16_t *out = args[1];

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long t = 0; t < IRON_ROWS / IRON_TILE_SIZE; t++) {
#if IRON_SIZE <= 16384
        float e[IRON_SIZE];
#else
        float *e = malloc(sizeof(float) * IRON_SIZE);
#endif
        for (long r = t * IRON_TILE_SIZE; r < (t + 1) * IRON_TILE_SIZE; r++)
            softmax_row(x + r * IRON_SIZE, out + r * IRON_SIZE, e);
#if IRON_SIZE > 16384
        free(e);
#endif
    }
}
