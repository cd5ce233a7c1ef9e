/* gemv: out[b, m] = sum_k W[m, k] * x[b, k]  (matrix-vector product, decode's hot kernel).
 *
 * args: W (M, K) bf16, x (BATCHES, K) bf16 -> out (BATCHES, M) bf16.
 * macros:
 *   IRON_M                  rows of W (outputs per batch)
 *   IRON_K                  columns of W (reduction length)
 *   IRON_BATCHES            vectors x multiplied by the same W
 *   IRON_TILE_SIZE_INPUT    rows of W computed together by the register-blocked inner kernel
 *                           (they share each load of x)
 *   IRON_TILE_SIZE_OUTPUT   rows of W per parallel work item (a multiple of TILE_SIZE_INPUT)
 *   IRON_NUM_AIE_COLUMNS    worker threads
 * legality (checked in Python): M % TILE_SIZE_OUTPUT == 0,
 *   TILE_SIZE_OUTPUT % TILE_SIZE_INPUT == 0.
 *
 * Memory-bandwidth bound: x is converted to float32 once per call; W is streamed once, 8 bf16
 * at a time widened to float32 in registers, into TILE_SIZE_INPUT * CHAINS accumulators
 * (CHAINS independent FMA chains per row keep the FMA latency hidden when few rows are
 * blocked together).
 */
#include "iron_cpu.h"

#if !defined(IRON_M) || !defined(IRON_K) || !defined(IRON_BATCHES) \
    || !defined(IRON_TILE_SIZE_INPUT) || !defined(IRON_TILE_SIZE_OUTPUT) \
    || !defined(IRON_NUM_AIE_COLUMNS)
#error "gemv.c needs IRON_M, IRON_K, IRON_BATCHES, IRON_TILE_SIZE_INPUT, \
IRON_TILE_SIZE_OUTPUT, IRON_NUM_AIE_COLUMNS"
#endif

#define TI IRON_TILE_SIZE_INPUT
#define CHAINS (TI >= 4 ? 1 : 4 / TI)  /* accumulators per row of W */
#define KSTEP (8 * CHAINS)             /* k advanced per iteration of the main loop */

/* TI rows of W (row stride K) times one float32 vector xf; results to out[0], out[1], ... */
static inline void gemv_block(const uint16_t *w, const float *xf, uint16_t *out) {
    __m256 acc[TI][CHAINS];
    for (int t = 0; t < TI; t++)
        for (int c = 0; c < CHAINS; c++) acc[t][c] = _mm256_setzero_ps();
    long k = 0;
    for (; k < IRON_K / KSTEP * KSTEP; k += KSTEP) {
        for (int c = 0; c < CHAINS; c++) {
            const __m256 xv = _mm256_loadu_ps(xf + k + 8 * c);
            for (int t = 0; t < TI; t++) {
                const __m256 wv = iron_load8_bf16(w + t * (long)IRON_K + k + 8 * c);
                acc[t][c] = _mm256_fmadd_ps(wv, xv, acc[t][c]);
            }
        }
    }
    for (; k < IRON_K / 8 * 8; k += 8) {
        const __m256 xv = _mm256_loadu_ps(xf + k);
        for (int t = 0; t < TI; t++)
            acc[t][0] = _mm256_fmadd_ps(iron_load8_bf16(w + t * (long)IRON_K + k), xv, acc[t][0]);
    }
    for (int t = 0; t < TI; t++) {
        for (int c = 1; c < CHAINS; c++) acc[t][0] = _mm256_add_ps(acc[t][0], acc[t][c]);
        float s = iron_hsum8(acc[t][0]);
        for (long kk = IRON_K / 8 * 8; kk < IRON_K; kk++)
            s += iron_bf16_to_f32(w[t * (long)IRON_K + kk]) * xf[kk];
        out[t] = iron_f32_to_bf16(s);
    }
}

void iron_kernel(void *const *args) {
    const uint16_t *W = args[0];
    const uint16_t *x = args[1];
    uint16_t *out = args[2];

#if IRON_BATCHES * IRON_K <= 65536
    _Alignas(32) float xf[IRON_BATCHES * IRON_K];
#else
    float *xf = aligned_alloc(32, sizeof(float) * (((long)IRON_BATCHES * IRON_K + 7) / 8 * 8));
#endif
    for (long i = 0; i < (long)IRON_BATCHES * IRON_K; i++) xf[i] = iron_bf16_to_f32(x[i]);

    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static) \
        if (IRON_NUM_AIE_COLUMNS > 1)
    for (long item = 0; item < IRON_M / IRON_TILE_SIZE_OUTPUT; item++) {
        const long m_end = (item + 1) * IRON_TILE_SIZE_OUTPUT;
        for (long m = item * IRON_TILE_SIZE_OUTPUT; m < m_end; m += TI)
            for (long b = 0; b < IRON_BATCHES; b++)
                gemv_block(W + m * IRON_K, xf + b * IRON_K, out + b * (long)IRON_M + m);
    }

#if IRON_BATCHES * IRON_K > 65536
    free(xf);
#endif
}
