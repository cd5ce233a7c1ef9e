/* gemm: C = A @ B^T  (B in the Linear-weight layout), for prompt prefill.
 *
 * args: A (M, K) bf16, B (N, K) bf16 -> C (M, N) bf16;  C[m, n] = sum_k A[m, k] * B[n, k].
 * macros:
 *   IRON_M                rows of A and C (tokens)
 *   IRON_K                reduction length
 *   IRON_N                rows of B, columns of C (output features)
 *   IRON_TILE_M           rows of A swept together over one packed B tile (cache blocking)
 *   IRON_TILE_K           k-extent of a B tile converted to float32 at once
 *   IRON_TILE_N           columns of C per work item (rows of B per tile)
 *   IRON_NUM_AIE_COLUMNS  worker threads over the N / TILE_N work items
 * legality (checked in Python): M % TILE_M == 0, K % TILE_K == 0, N % TILE_N == 0.
 *
 * A is converted to float32 once per call. Each work item owns the M x TILE_N column block of
 * C, accumulated in float32; for each k-tile the TILE_N x TILE_K tile of B is converted to
 * float32 once and packed into panels of NR = 16 columns ([panel][k][16], zero-padded), then
 * TILE_M rows of A at a time sweep it with an FMA microkernel of up to 6 rows x 16 columns
 * (12 accumulators).
 */
#include <omp.h>

#include "iron_cpu.h"

#if !defined(IRON_M) || !defined(IRON_K) || !defined(IRON_N) || !defined(IRON_TILE_M) \
    || !defined(IRON_TILE_K) || !defined(IRON_TILE_N) || !defined(IRON_NUM_AIE_COLUMNS)
#error "gemm.c needs IRON_M, IRON_K, IRON_N, IRON_TILE_M, IRON_TILE_K, IRON_TILE_N, \
IRON_NUM_AIE_COLUMNS"
#endif

#define NR 16                                     /* columns per packed panel of B */
#define TN_PAD ((IRON_TILE_N + NR - 1) / NR * NR) /* tile width rounded up to panels */
#define PANELS (TN_PAD / NR)
#define BP_FLOATS ((long)PANELS * IRON_TILE_K * NR)
#define CT_FLOATS ((long)IRON_M * TN_PAD)

/* c (rows x 16, row stride TN_PAD) += a (rows x TILE_K, row stride K) @ bp (TILE_K x 16).
 * Called with constant rows (6, 4, 2, 1), so acc[][] lives in registers. */
static inline __attribute__((always_inline)) void micro(const int rows, const float *a,
                                                        const float *bp, float *c) {
    __m256 acc[6][2];
    for (int r = 0; r < rows; r++) {
        acc[r][0] = _mm256_loadu_ps(c + r * TN_PAD);
        acc[r][1] = _mm256_loadu_ps(c + r * TN_PAD + 8);
    }
    for (int k = 0; k < IRON_TILE_K; k++) {
        const __m256 b0 = _mm256_load_ps(bp + k * NR), b1 = _mm256_load_ps(bp + k * NR + 8);
        for (int r = 0; r < rows; r++) {
            const __m256 av = _mm256_broadcast_ss(a + r * (long)IRON_K + k);
            acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_ps(c + r * TN_PAD, acc[r][0]);
        _mm256_storeu_ps(c + r * TN_PAD + 8, acc[r][1]);
    }
}

/* B[n0 .. n0+TILE_N, k0 .. k0+TILE_K] -> bp[panel][k][16] in float32 */
static void pack_b(const uint16_t *B, long n0, long k0, float *bp) {
    for (long n = 0; n < IRON_TILE_N; n++) {
        const uint16_t *row = B + (n0 + n) * IRON_K + k0;
        float *dst = bp + (n / NR) * (long)IRON_TILE_K * NR + n % NR;
        for (long k = 0; k < IRON_TILE_K; k++) dst[k * NR] = iron_bf16_to_f32(row[k]);
    }
}

/* ct (TILE_M rows, row stride TN_PAD) += Af[m0 .. m0+TILE_M, k0 .. k0+TILE_K] @ bp */
static void tile_update(const float *Af, long m0, long k0, const float *bp, float *ct) {
    for (int p = 0; p < PANELS; p++) {
        const float *panel = bp + (long)p * IRON_TILE_K * NR;
        int i = 0;
        for (; i + 6 <= IRON_TILE_M; i += 6)
            micro(6, Af + (m0 + i) * IRON_K + k0, panel, ct + i * TN_PAD + p * NR);
        if (IRON_TILE_M - i >= 4) {
            micro(4, Af + (m0 + i) * IRON_K + k0, panel, ct + i * TN_PAD + p * NR);
            i += 4;
        }
        if (IRON_TILE_M - i >= 2) {
            micro(2, Af + (m0 + i) * IRON_K + k0, panel, ct + i * TN_PAD + p * NR);
            i += 2;
        }
        if (IRON_TILE_M - i >= 1)
            micro(1, Af + (m0 + i) * IRON_K + k0, panel, ct + i * TN_PAD + p * NR);
    }
}

void iron_kernel(void *const *args) {
    const uint16_t *A = args[0];
    const uint16_t *B = args[1];
    uint16_t *C = args[2];

    float *Af = aligned_alloc(64, sizeof(float) * (((long)IRON_M * IRON_K + 15) / 16 * 16));
    /* per thread: one packed B tile, then its M x TILE_N block of C */
    float *work = aligned_alloc(64, sizeof(float) * IRON_NUM_AIE_COLUMNS
                                    * (BP_FLOATS + CT_FLOATS));
    for (long i = 0; i < (long)IRON_M * IRON_K; i++) Af[i] = iron_bf16_to_f32(A[i]);

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long item = 0; item < IRON_N / IRON_TILE_N; item++) {
        const long n0 = item * IRON_TILE_N;
        float *bp = work + omp_get_thread_num() * (BP_FLOATS + CT_FLOATS);
        float *ct = bp + BP_FLOATS;
        memset(ct, 0, sizeof(float) * CT_FLOATS);
        if (IRON_TILE_N % NR) memset(bp, 0, sizeof(float) * BP_FLOATS); /* padded columns */
        for (long k0 = 0; k0 < IRON_K; k0 += IRON_TILE_K) {
            pack_b(B, n0, k0, bp);
            for (long m0 = 0; m0 < IRON_M; m0 += IRON_TILE_M)
                tile_update(Af, m0, k0, bp, ct + m0 * TN_PAD);
        }
        for (long i = 0; i < IRON_M; i++)
            for (long j = 0; j < IRON_TILE_N; j++)
                C[i * IRON_N + n0 + j] = iron_f32_to_bf16(ct[i * TN_PAD + j]);
    }

    free(work);
    free(Af);
}
