/* gemv: out[b, m] = sum_k W[m, k] * x[b, k]  (matrix-vector product, decode's hot kernel).
 *
 * args: W (M, K) bf16 or f16, or (M, row bytes) uint8 in a quantized format (iron_quant.h),
 *   x (BATCHES, K) bf16 -> out (BATCHES, M) bf16, or float32 (IRON_OUTPUT_DTYPE, iron_out.h).
 * macros:
 *   IRON_M                  rows of W (outputs per batch)
 *   IRON_K                  columns of W (reduction length)
 *   IRON_BATCHES            vectors x multiplied by the same W
 *   IRON_TILE_SIZE_INPUT    rows of W computed together by the register-blocked inner kernel
 *                           (they share each load of x; 16, a tile, for a quantized W)
 *   IRON_TILE_SIZE_OUTPUT   rows of W per parallel work item (a multiple of TILE_SIZE_INPUT)
 *   IRON_NUM_AIE_COLUMNS    worker threads
 *   IRON_WEIGHT_FORMAT, IRON_GROUP_SIZE   how W is stored (iron_quant.h)
 * legality (the operator's rules(), asserted below): M % TILE_SIZE_OUTPUT == 0,
 *   TILE_SIZE_OUTPUT % TILE_SIZE_INPUT == 0.
 *
 * Memory-bandwidth bound: x is converted to float32 once per call (stored permuted, see
 * even8/odd8); W is streamed once, 16 bf16 per 32-byte load widened to float32 in registers
 * without shuffles (f16: converted exactly by F16C's vcvtph2ps, x in its own order), into
 * 2 * UNROLL accumulators per row (at least 4 independent FMA chains in flight),
 * TILE_SIZE_INPUT rows sharing each load of x. A software prefetch 4 KiB ahead
 * covers the hardware prefetcher's stop at page boundaries (measured faster from DRAM).
 *
 * Quantized W: qmatmul.h (x rounded to int8 codes per 16 values, integer dot products on
 * tiles of 16 rows), shared with the GEMM of a quantized B.
 */
#include "iron_cpu.h"
#include "iron_out.h"
#include "iron_quant.h"

#if !defined(IRON_M) || !defined(IRON_K) || !defined(IRON_BATCHES) \
    || !defined(IRON_TILE_SIZE_INPUT) || !defined(IRON_TILE_SIZE_OUTPUT) \
    || !defined(IRON_NUM_AIE_COLUMNS)
#error "gemv.c needs IRON_M, IRON_K, IRON_BATCHES, IRON_TILE_SIZE_INPUT, \
IRON_TILE_SIZE_OUTPUT, IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_M % IRON_TILE_SIZE_OUTPUT == 0, "M % tile_size_output == 0");
_Static_assert(IRON_TILE_SIZE_OUTPUT % IRON_TILE_SIZE_INPUT == 0,
               "tile_size_output % tile_size_input == 0");
_Static_assert(Q_PLAIN || (IRON_K % 32 == 0 && IRON_K % Q_SUPER_VALUES == 0
                                         && IRON_TILE_SIZE_INPUT == Q_TILE),
               "a quantized W holds whole groups and 32-value chunks, computed a tile of 16 "
               "rows at a time");

#define TI IRON_TILE_SIZE_INPUT

#if Q_PLAIN

#define UNROLL (TI >= 2 ? 1 : 2)  /* 16-element steps per iteration: >= 4 FMA chains */
#define KSTEP (16 * UNROLL)
#define K16 (IRON_K / 16 * 16)    /* k below K16 is done 16 at a time, the rest scalar */
#define KP ((IRON_K + 7) / 8 * 8)   /* row stride of the float32 copy of x (32-byte rows) */
#define PREFETCH 2048               /* software prefetch distance in elements of W (4 KiB) */

#if QFMT == IRON_FMT_F16
/* 16 f16 loaded as one 256-bit word: F16C converts each 128-bit half (elements 0-7, 8-15) to
 * float32 exactly (every half is a float32); x stays in its order. */
static inline __m256 even8(__m256i v) { return _mm256_cvtph_ps(_mm256_castsi256_si128(v)); }
static inline __m256 odd8(__m256i v) { return _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1)); }
static inline float w_f32(uint16_t h) { return _cvtsh_ss(h); }
#define X_AT(i) (i) /* the element of a 16-block of x that lane i of even8 | odd8 meets */
#else
/* 16 bf16 loaded as 8 u32: the low halves are the even elements, the high halves the odd
 * ones; widening them needs one shift or one mask, no shuffle. x is stored permuted to
 * match: within each 16-block, xp = x[0, 2, .., 14], x[1, 3, .., 15]. */
static inline __m256 even8(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
static inline __m256 odd8(__m256i v) {
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}
static inline float w_f32(uint16_t h) { return iron_bf16_to_f32(h); }
#define X_AT(i) ((i) % 8 * 2 + (i) / 8)
#endif

static void permute_x(const uint16_t *x, float *xp) {
    for (long k = 0; k < K16; k += 16)
        for (int i = 0; i < 16; i++) xp[k + i] = iron_bf16_to_f32(x[k + X_AT(i)]);
    for (long k = K16; k < IRON_K; k++) xp[k] = iron_bf16_to_f32(x[k]);
}

/* TI rows of W (row stride K) times one permuted float32 vector xp -> out[0 .. TI-1] */
static inline void gemv_block(const uint16_t *w, const float *xp, out_t *out) {
    __m256 acc[TI][2 * UNROLL];
    for (int t = 0; t < TI; t++)
        for (int c = 0; c < 2 * UNROLL; c++) acc[t][c] = _mm256_setzero_ps();
    long k = 0;
    for (; k < IRON_K / KSTEP * KSTEP; k += KSTEP) {
        for (int u = 0; u < UNROLL; u++) {
            const __m256 xe = _mm256_load_ps(xp + k + 16 * u);
            const __m256 xo = _mm256_load_ps(xp + k + 16 * u + 8);
            for (int t = 0; t < TI; t++) {
                const uint16_t *wk = w + t * (long)IRON_K + k + 16 * u;
                _mm_prefetch((const char *)(wk + PREFETCH), _MM_HINT_T0);
                const __m256i v = _mm256_loadu_si256((const __m256i *)wk);
                acc[t][2 * u] = _mm256_fmadd_ps(even8(v), xe, acc[t][2 * u]);
                acc[t][2 * u + 1] = _mm256_fmadd_ps(odd8(v), xo, acc[t][2 * u + 1]);
            }
        }
    }
    for (; k < K16; k += 16) { /* only when UNROLL = 2 and K % 32 == 16 */
        const __m256 xe = _mm256_load_ps(xp + k), xo = _mm256_load_ps(xp + k + 8);
        for (int t = 0; t < TI; t++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w + t * (long)IRON_K + k));
            acc[t][0] = _mm256_fmadd_ps(even8(v), xe, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(odd8(v), xo, acc[t][1]);
        }
    }
    for (int t = 0; t < TI; t++) {
        for (int c = 1; c < 2 * UNROLL; c++) acc[t][0] = _mm256_add_ps(acc[t][0], acc[t][c]);
        float s = iron_hsum8(acc[t][0]);
        for (long kk = K16; kk < IRON_K; kk++)
            s += w_f32(w[t * (long)IRON_K + kk]) * xp[kk];
        out[t] = out_scalar(s);
    }
}

#else /* quantized W, in tiles of 16 rows (iron_quant.h) */

#define Q_K IRON_K
#define Q_VECTORS IRON_BATCHES
#define Q_OUT_STRIDE IRON_M
#define Q_ITEM_ROWS IRON_TILE_SIZE_OUTPUT
#define Q_VECTOR_BLOCK IRON_BATCHES
#include "qmatmul.h"

void iron_kernel(void *const *args) { q_matmul(args[0], args[1], args[2]); }

#endif /* quantized W */

#if Q_PLAIN
void iron_kernel(void *const *args) {
    const uint16_t *W = args[0];
    const uint16_t *x = args[1];
    out_t *out = args[2];

#if IRON_BATCHES * KP <= 65536
    _Alignas(32) float xf[IRON_BATCHES * KP];
#else
    float *xf = aligned_alloc(32, sizeof(float) * IRON_BATCHES * KP);
#endif
    for (long b = 0; b < IRON_BATCHES; b++) permute_x(x + b * IRON_K, xf + b * KP);

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long item = 0; item < IRON_M / IRON_TILE_SIZE_OUTPUT; item++) {
        const long m_end = (item + 1) * IRON_TILE_SIZE_OUTPUT;
        for (long m = item * IRON_TILE_SIZE_OUTPUT; m < m_end; m += TI)
            for (long b = 0; b < IRON_BATCHES; b++)
                gemv_block(W + m * IRON_K, xf + b * KP, out + b * (long)IRON_M + m);
    }

#if IRON_BATCHES * KP > 65536
    free(xf);
#endif
}
#endif
