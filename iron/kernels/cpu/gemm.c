/* gemm: C = A @ B^T  (B in the Linear-weight layout), for prompt prefill.
 *
 * args: A (M, K) bf16, B (N, K) bf16 -> C (M, N) bf16, or float32 (IRON_OUTPUT_DTYPE,
 *   iron_out.h);  C[m, n] = sum_k A[m, k] * B[n, k].
 *   B may instead be (N, row bytes) uint8 in a quantized format (iron_quant.h, macros
 *   IRON_WEIGHT_FORMAT and IRON_GROUP_SIZE): the quantized GEMV's scheme then runs
 *   (qmatmul.h), each row of A a vector rounded to int8 codes per 16 values, integer dot
 *   products with B's codes, so that a row of C is bit for bit what the GEMV gives for that
 *   row; a work item is TILE_N rows of B (whole 16-row tiles), TILE_M rows of A sweep each
 *   tile in turn, and TILE_K does not apply (the codes of x stay in L1/L2 across the item).
 *   Everything below is for bf16 B.
 * macros:
 *   IRON_M                rows of A and C (tokens)
 *   IRON_K                reduction length
 *   IRON_N                rows of B, columns of C (output features)
 *   IRON_TILE_M           rows of A swept together over one packed B tile (cache blocking)
 *   IRON_TILE_K           k-extent of a B tile packed at once
 *   IRON_TILE_N           columns of C per work item (rows of B per tile)
 *   IRON_NUM_AIE_COLUMNS  worker threads over the N / TILE_N work items
 * legality (the operator's rules(), asserted below): M % TILE_M == 0, K % TILE_K == 0,
 *   N % TILE_N == 0.
 *
 * Each work item owns the M x TILE_N column block of C, accumulated in float32 (ct, rows of
 * TN_PAD floats). For each k-tile the TILE_N x TILE_K tile of B is packed once into panels of
 * NR = 16 columns (zero-padded), then TILE_M rows of A at a time sweep it with a register-blocked
 * microkernel. Two builds of the same scheme:
 *
 * AVX512_BF16 (e.g. Sapphire Rapids): B stays bf16, packed as k-pairs,
 *   bp[panel][kp][16][2] = B[n0 + 16 panel + j, k0 + 2 kp + {0, 1}]   (one zmm per k-pair),
 *   and vdpbf16ps multiplies a broadcast pair A[m, 2 kp .. 2 kp + 1] by it, adding both products
 *   into 16 float32 lanes (bf16 products are exact in float32; the instruction flushes
 *   subnormals). Microkernel: up to 8 rows x 2 panels (16 zmm accumulators). A is read in
 *   place; only for an odd TILE_K it is copied with each k-tile padded by a zero to KP pairs.
 * otherwise (AVX2 + FMA): A is converted to float32 once per call, B tiles are converted to
 *   float32 and packed as bp[panel][k][16]; microkernel up to 6 rows x 16 columns (12 ymm).
 *
 * On AMX-BF16 hosts (e.g. Sapphire Rapids), when K % 32 == 0 and TILE_N % 16 == 0, a third
 * scheme runs instead, if Linux grants the process the AMX tile state: see gemm_amx below.
 */
#include <omp.h>

#include "iron_cpu.h"
#include "iron_out.h"
#include "iron_quant.h"

#if !defined(IRON_M) || !defined(IRON_K) || !defined(IRON_N) || !defined(IRON_TILE_M) \
    || !defined(IRON_TILE_K) || !defined(IRON_TILE_N) || !defined(IRON_NUM_AIE_COLUMNS)
#error "gemm.c needs IRON_M, IRON_K, IRON_N, IRON_TILE_M, IRON_TILE_K, IRON_TILE_N, \
IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_M % IRON_TILE_M == 0, "M % tile_m == 0");
_Static_assert(IRON_K % IRON_TILE_K == 0, "K % tile_k == 0");
_Static_assert(IRON_N % IRON_TILE_N == 0, "N % tile_n == 0");
_Static_assert(Q_PLAIN || IRON_TILE_N % 16 == 0,
               "tile_n % 16 == 0 for quantized B");

#if !Q_PLAIN /* the quantized GEMV's scheme, a prompt row per vector */

#define Q_K IRON_K
#define Q_VECTORS IRON_M
#define Q_OUT_STRIDE IRON_N
#define Q_ITEM_ROWS IRON_TILE_N
#define Q_VECTOR_BLOCK IRON_TILE_M
#include "qmatmul.h"

void iron_kernel(void *const *args) { q_matmul(args[1], args[0], args[2]); }

#else /* bf16 or f16 B */

#define NR 16                                     /* columns per packed panel of B */
#define TN_PAD ((IRON_TILE_N + NR - 1) / NR * NR) /* tile width rounded up to panels */
#define PANELS (TN_PAD / NR)
#define CT_FLOATS ((long)IRON_M * TN_PAD)

#if defined(__AVX512BF16__) && QFMT == IRON_FMT_BF16
#define DPBF16 1
#include "gemm_bf16_avx512.h" /* vdpbf16ps on k-pair panels */
#else
#define DPBF16 0
#include "gemm_bf16_avx2.h"   /* float32 FMAs on widened bf16 (f16: converted by F16C) */
#endif

#include "gemm_amx.h"         /* defines AMX where the instance can use it */

void iron_kernel(void *const *args) {
    const uint16_t *A = args[0];
    const void *B = args[1];
    out_t *C = args[2];

#ifdef AMX
    if (amx_permitted()) {
        gemm_amx(A, B, C);
        return;
    }
#endif

    /* A as micro reads it (row stride A_STRIDE): float32 for AVX2; for AVX512_BF16 A itself,
     * or for an odd TILE_K a copy with each k-tile followed by one zero */
#if DPBF16
    uint16_t *copy = NULL;
    const uint16_t *Ap = A;
    if (IRON_TILE_K % 2) {
        copy = calloc((long)IRON_M * A_STRIDE, sizeof(uint16_t));
        for (long m = 0; m < IRON_M; m++)
            for (long t = 0; t < IRON_K / IRON_TILE_K; t++)
                memcpy(copy + m * A_STRIDE + t * A_TILE_COLS, A + m * IRON_K + t * IRON_TILE_K,
                       sizeof(uint16_t) * IRON_TILE_K);
        Ap = copy;
    }
#else
    float *copy = aligned_alloc(64, sizeof(float) * (((long)IRON_M * IRON_K + 15) / 16 * 16));
    for (long i = 0; i < (long)IRON_M * IRON_K; i++) copy[i] = iron_bf16_to_f32(A[i]);
    const float *Ap = copy;
#endif
    /* per thread: one packed B tile, then its M x TILE_N block of C (float32); both sizes are
     * multiples of 64 bytes */
    const long bp_bytes = (sizeof(packed_t) * BP_ELEMS + 63) / 64 * 64;
    const long per_thread = bp_bytes + sizeof(float) * CT_FLOATS;
    char *work = aligned_alloc(64, IRON_NUM_AIE_COLUMNS * per_thread);

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long item = 0; item < IRON_N / IRON_TILE_N; item++) {
        const long n0 = item * IRON_TILE_N;
        packed_t *bp = (packed_t *)(work + omp_get_thread_num() * per_thread);
        float *ct = (float *)((char *)bp + bp_bytes);
        memset(ct, 0, sizeof(float) * CT_FLOATS);
        if (IRON_TILE_N % NR) memset(bp, 0, bp_bytes); /* padded columns */
        for (long k0 = 0; k0 < IRON_K; k0 += IRON_TILE_K) {
            pack_b(B, n0, k0, bp);
            for (long m0 = 0; m0 < IRON_M; m0 += IRON_TILE_M)
                tile_update(Ap, m0, k0 / IRON_TILE_K * A_TILE_COLS, bp, ct + m0 * TN_PAD);
        }
        for (long i = 0; i < IRON_M; i++)
            for (long j = 0; j < IRON_TILE_N; j++)
                C[i * IRON_N + n0 + j] = out_scalar(ct[i * TN_PAD + j]);
    }

    free(work);
    free(copy);
}

#endif /* bf16 or f16 B */
