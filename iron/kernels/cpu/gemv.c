/* gemv: out[b, m] = sum_k W[m, k] * x[b, k]  (matrix-vector product, decode's hot kernel).
 *
 * args: W (M, K) bf16, or (M, row bytes) uint8 in a quantized format (iron_quant.h),
 *   x (BATCHES, K) bf16 -> out (BATCHES, M) bf16.
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
 * without shuffles, into 2 * UNROLL accumulators per row (at least 4 independent FMA chains
 * in flight), TILE_SIZE_INPUT rows sharing each load of x. A software prefetch 4 KiB ahead
 * covers the hardware prefetcher's stop at page boundaries (measured faster from DRAM).
 *
 * Quantized W (iron_quant.h; the tile kernel per instruction set in gemv_vnni.h and
 * gemv_avx2.h, the rest here): rows come in tiles of 16, one 32-bit lane per row, so a tile is
 * computed in whole registers without summing across lanes; the expansion of its codes is
 * shared by up to VECTORS x vectors per pass. x is rounded to int8 codes per 16 values
 * (quantize_group), so a code times x is an integer product: with AVX512-VNNI one mask (and one
 * shift) turn a plane of codes into bytes, and one vpdpbusd per vector multiplies 4 of them by
 * 4 codes of x broadcast from memory, exactly; per block of x the integer sums are scaled by
 * x's scale, per group by the 16 rows' d, and the term of the minimums and the offsets (a
 * multiple of the group's sum of x) is added. Without it (AVX2) the same masks feed vpmaddubsw,
 * whose 16-bit pair sums one vpmaddwd per block of x widens: the same integer sums and the same
 * float steps, so both builds give the same bits, at about 4x the rate of widening the codes to
 * float32 for FMAs (which left this kernel compute-bound at about 40% of a Zen 3 core's
 * bandwidth).
 */
#include "iron_cpu.h"
#include "iron_quant.h"
#include <float.h>

#if !defined(IRON_M) || !defined(IRON_K) || !defined(IRON_BATCHES) \
    || !defined(IRON_TILE_SIZE_INPUT) || !defined(IRON_TILE_SIZE_OUTPUT) \
    || !defined(IRON_NUM_AIE_COLUMNS)
#error "gemv.c needs IRON_M, IRON_K, IRON_BATCHES, IRON_TILE_SIZE_INPUT, \
IRON_TILE_SIZE_OUTPUT, IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_M % IRON_TILE_SIZE_OUTPUT == 0, "M % tile_size_output == 0");
_Static_assert(IRON_TILE_SIZE_OUTPUT % IRON_TILE_SIZE_INPUT == 0,
               "tile_size_output % tile_size_input == 0");
_Static_assert(QFMT == IRON_FMT_BF16 || (IRON_K % 32 == 0 && IRON_K % QG == 0
                                         && IRON_TILE_SIZE_INPUT == Q_TILE),
               "a quantized W holds whole groups and 32-value chunks, computed a tile of 16 "
               "rows at a time");

#define TI IRON_TILE_SIZE_INPUT

#if QFMT == IRON_FMT_BF16

#define UNROLL (TI >= 2 ? 1 : 2)  /* 16-element steps per iteration: >= 4 FMA chains */
#define KSTEP (16 * UNROLL)
#define K16 (IRON_K / 16 * 16)    /* k below K16 is done 16 at a time, the rest scalar */
#define KP ((IRON_K + 7) / 8 * 8)   /* row stride of the float32 copy of x (32-byte rows) */
#define PREFETCH 2048               /* software prefetch distance in elements of W (4 KiB) */

/* 16 bf16 loaded as 8 u32: the low halves are the even elements, the high halves the odd
 * ones; widening them needs one shift or one mask, no shuffle. x is stored permuted to
 * match: within each 16-block, xp = x[0, 2, .., 14], x[1, 3, .., 15]. */
static inline __m256 even8(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
static inline __m256 odd8(__m256i v) {
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

static void permute_x(const uint16_t *x, float *xp) {
    for (long k = 0; k < K16; k += 16)
        for (int i = 0; i < 8; i++) {
            xp[k + i] = iron_bf16_to_f32(x[k + 2 * i]);
            xp[k + 8 + i] = iron_bf16_to_f32(x[k + 2 * i + 1]);
        }
    for (long k = K16; k < IRON_K; k++) xp[k] = iron_bf16_to_f32(x[k]);
}

/* TI rows of W (row stride K) times one permuted float32 vector xp -> out[0 .. TI-1] */
static inline void gemv_block(const uint16_t *w, const float *xp, uint16_t *out) {
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
            s += iron_bf16_to_f32(w[t * (long)IRON_K + kk]) * xp[kk];
        out[t] = iron_f32_to_bf16(s);
    }
}

#else /* quantized W, in tiles of 16 rows (iron_quant.h) */

#define NG (IRON_K / QG) /* groups per row */
#define NC (IRON_K / 32) /* 32-value chunks per row */
#define XB (IRON_K / 16) /* blocks of 16 values of x per row, each with its own scale */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define VNNI 1 /* 4-byte dot products with vpdpbusd; else vpmaddubsw + vpmaddwd (AVX2) */
#define VECTORS 4
#else
#define VNNI 0
#define VECTORS 2
#endif
#define BB (IRON_BATCHES < VECTORS ? IRON_BATCHES : VECTORS)
#define PREFETCH 4096 /* software prefetch distance in bytes of W (see the bf16 kernel) */

/* x as the tile kernels read it, per vector (see quantize_group) */
typedef struct {
    const uint32_t *x8; /* per chunk: 4 planes x 2 words of 4 int8 codes, in the planes' order */
    const float *dx;    /* per block of 16: the scale of its codes */
    const float *xs;    /* per group: the sum of the values the codes give back, dx * code */
} vectors_t;

/* A quantized W multiplies x rounded to int8 codes per 16 values (scale = max |x| / 127, round
 * half to even; iron.quant.activation_values), so that a 4-bit code times x is an integer dot
 * product, exact in any order. This rounds group bg % NG of vector bg / NG (the threads share
 * the groups out) and sums its values. The codes of plane j are stored in the order lo/hi
 * below take the plane's nibbles: x 8j + 0, 4, 1, 5 then 2, 6, 3, 7. */
static void quantize_group(const uint16_t *x, const long bg, int8_t *x8, float *dx, float *xs) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const long b = bg / NG;
    xs[bg] = 0.0f;
    for (long c = bg % NG * Q_CHUNKS; c < (bg % NG + 1) * Q_CHUNKS; c++) {
        const long k0 = b * (long)IRON_K + 32 * c;
        __m256i q[4];
        float sum = 0.0f;
        for (int half = 0; half < 2; half++) { /* values 16 half .. 16 half + 15 */
            const __m256 v0 = iron_load8_bf16(x + k0 + 16 * half);
            const __m256 v1 = iron_load8_bf16(x + k0 + 16 * half + 8);
            const float amax = iron_hmax8(_mm256_max_ps(_mm256_and_ps(v0, magnitude),
                                                        _mm256_and_ps(v1, magnitude)));
            const float scale = amax / 127.0f, over = 127.0f / amax;
            const float inv = over <= FLT_MAX ? over : 0.0f; /* max |x| 0 or tiny: codes 0 */
            /* cvtps rounds half to even (the default mode) */
            q[2 * half] = _mm256_cvtps_epi32(_mm256_mul_ps(v0, _mm256_set1_ps(inv)));
            q[2 * half + 1] = _mm256_cvtps_epi32(_mm256_mul_ps(v1, _mm256_set1_ps(inv)));
            const __m256i s = _mm256_add_epi32(q[2 * half], q[2 * half + 1]);
            sum += iron_hsum8(_mm256_cvtepi32_ps(s)) * scale; /* |codes| sum exact */
            dx[b * XB + 2 * c + half] = scale;
        }
        /* packs work per 128-bit half: bytes 4j..4j+3 of the low half are codes 8j..8j+3, of
         * the high half 8j+4..8j+7, so interleaving the halves' bytes gives the order */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                             _mm256_packs_epi32(q[2], q[3]));
        const __m128i lo = _mm256_castsi256_si128(p), hi = _mm256_extracti128_si256(p, 1);
        int8_t *codes = x8 + (b * NC + c) * 32;
        _mm_storeu_si128((__m128i *)codes, _mm_unpacklo_epi8(lo, hi));
        _mm_storeu_si128((__m128i *)(codes + 16), _mm_unpackhi_epi8(lo, hi));
        xs[bg] += sum;
    }
}

/* A value is d (u - Q_ZERO) + m: the dot products give sum u x, the rest is a multiple of the
 * group's sum of x, (m - Q_ZERO d) */
#define BIAS_D ((float)Q_ZERO)

#if VNNI
#include "gemv_vnni.h"
#else
#include "gemv_avx2.h"
#endif

/* one tile times all the x vectors, BB at a time (the last pass takes the rest) */
static inline void tile_times_vectors(const uint8_t *tile, const vectors_t v, uint16_t *out) {
    acc_t acc[BB];
    long b0 = 0;
    for (; b0 + BB <= IRON_BATCHES; b0 += BB) {
        tile_dot(BB, tile, v, b0, acc);
        store_rows(acc, BB, out + b0 * IRON_M);
    }
    switch (IRON_BATCHES - b0) { /* constant nb: accumulators stay in registers */
#if BB > 1
    case 1: tile_dot(1, tile, v, b0, acc); store_rows(acc, 1, out + b0 * IRON_M); break;
#endif
#if BB > 2
    case 2: tile_dot(2, tile, v, b0, acc); store_rows(acc, 2, out + b0 * IRON_M); break;
    case 3: tile_dot(3, tile, v, b0, acc); store_rows(acc, 3, out + b0 * IRON_M); break;
#endif
    default: break;
    }
}

void iron_kernel(void *const *args) {
    const uint8_t *W = args[0];
    const uint16_t *x = args[1];
    uint16_t *out = args[2];

    /* per vector: group sums (NG floats), block scales (XB), then the codes (K bytes) */
    const long floats = (long)IRON_BATCHES * (NG + XB);
    float *xs = aligned_alloc(64, (sizeof(float) * floats + IRON_BATCHES * IRON_K + 63) / 64 * 64);
    float *dx = xs + (long)IRON_BATCHES * NG;
    int8_t *x8 = (int8_t *)(xs + floats);
    const vectors_t v = {(const uint32_t *)x8, dx, xs};

#if IRON_NUM_AIE_COLUMNS > 1
    #pragma omp parallel num_threads(IRON_NUM_AIE_COLUMNS)
#endif
    {
#if IRON_NUM_AIE_COLUMNS > 1
        #pragma omp for schedule(static)
#endif
        for (long bg = 0; bg < (long)IRON_BATCHES * NG; bg++)
            quantize_group(x, bg, x8, dx, xs);
#if IRON_NUM_AIE_COLUMNS > 1
        #pragma omp for schedule(static) /* after the barrier that ends the loop above */
#endif
        for (long item = 0; item < IRON_M / IRON_TILE_SIZE_OUTPUT; item++)
            for (long m = item * IRON_TILE_SIZE_OUTPUT; m < (item + 1) * IRON_TILE_SIZE_OUTPUT;
                 m += Q_TILE)
                tile_times_vectors(W + m / Q_TILE * Q_TILE_BYTES(IRON_K), v, out + m);
    }
    free(xs);
}

#endif /* quantized W */

#if QFMT == IRON_FMT_BF16
void iron_kernel(void *const *args) {
    const uint16_t *W = args[0];
    const uint16_t *x = args[1];
    uint16_t *out = args[2];

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
