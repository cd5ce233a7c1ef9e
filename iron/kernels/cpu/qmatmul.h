/* qmatmul.h: a block-quantized matrix W (iron_quant.h, tiled layout) times x vectors rounded
 * to int8 codes per XBLOCK (16 or 32) values, out[b, m] = sum_k W[m, k] x[b, k]: the quantized
 * GEMV (x one token's vectors) and GEMM (x a prompt chunk's rows) in one scheme, so that a
 * row's result does not depend on how many vectors share the kernel.
 *
 * x is rounded to int8 codes per block of XBLOCK values (quantize_group), so a code times x is
 * an integer product, summed exactly; the tile kernel of the instruction set (qmatmul_vnni.h:
 * vpdpbusd on the 16 rows of a tile in a zmm; qmatmul_avx2.h: vpmaddubsw + vpmaddwd on each
 * half of 8 rows) computes a tile of 16 rows for up to VECTORS vectors per expansion of its
 * codes, in whole registers without summing across lanes; per block of x the integer sums are
 * scaled by x's scale, per group by the 16 rows' d, and the term of the minimums and offsets
 * (a multiple of the group's sum of x) is added. Both give the same bits: same integer sums,
 * same float steps.
 *
 * macros (besides iron_quant.h's): Q_K (row length), Q_VECTORS (x vectors), Q_OUT_STRIDE (out's
 * row stride: W's rows), Q_ITEM_ROWS (rows of W per parallel work item, a multiple of 16),
 * Q_VECTOR_BLOCK (vectors swept over each tile in turn, dividing Q_VECTORS: a block's codes
 * stay in cache while the item's tiles pass), IRON_NUM_AIE_COLUMNS (threads), IRON_X_BLOCK
 * (values of x per int8 scale: 16 when absent, or 32).
 */
#ifndef IRON_QMATMUL_H
#define IRON_QMATMUL_H

#include <float.h>

#include "iron_out.h"
#include "iron_quant.h"

#if !defined(Q_K) || !defined(Q_VECTORS) || !defined(Q_OUT_STRIDE) || !defined(Q_ITEM_ROWS) \
    || !defined(Q_VECTOR_BLOCK)
#error "qmatmul.h needs Q_K, Q_VECTORS, Q_OUT_STRIDE, Q_ITEM_ROWS, Q_VECTOR_BLOCK"
#endif
_Static_assert(Q_K % 32 == 0 && Q_K % Q_SUPER_VALUES == 0 && Q_ITEM_ROWS % Q_TILE == 0
               && Q_VECTORS % Q_VECTOR_BLOCK == 0,
               "a quantized W holds whole groups and 32-value chunks, computed a tile of 16 rows "
               "at a time, its vectors in whole blocks");

#define NG (Q_K / QG) /* groups per row */
#define NC (Q_K / 32) /* 32-value chunks per row */
/* values of x per int8 scale (the operator's x_block): 16, or 32 (one scale per chunk: one
 * conversion and one FMA per chunk instead of two) for a format whose own scales span 32 */
#ifdef IRON_X_BLOCK
#define XBLOCK IRON_X_BLOCK
#else
#define XBLOCK 16
#endif
_Static_assert(XBLOCK == 16 || (XBLOCK == 32 && QFMT != IRON_FMT_Q6_K),
               "x_block is 16, or 32 for a format whose scales span 32 values (not q6_k)");
#define XB (Q_K / XBLOCK) /* blocks of x per row, each with its own scale */
#define XPC (32 / XBLOCK) /* blocks of x per 32-value chunk */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* 4-byte dot products with vpdpbusd; else vpmaddubsw + vpmaddwd (AVX2, the same bits) */
#define VNNI 1
#if QFMT == IRON_FMT_Q6_K
#define VECTORS 4 /* its per-16 block scales take registers: 8 vectors ran 2% slower */
#else
#define VECTORS 8 /* 8 share each expansion of the codes: 8-15% faster than 4 on a prompt */
#endif
#else
#define VNNI 0
#define VECTORS 2
#endif
#define BB (Q_VECTOR_BLOCK < VECTORS ? Q_VECTOR_BLOCK : VECTORS)
/* range IRON_PREFETCH 1 65536: bytes of W ahead, within a row tile's reach (the tuner tries
 * 2-4 KiB) */
#ifdef IRON_PREFETCH /* the GEMV's tunable software prefetch distance, bytes of W */
#define PREFETCH IRON_PREFETCH
#else /* the GEMM: a tile of W is reused by every vector of the chunk */
#define PREFETCH 4096
#endif

/* x as the tile kernels read it, per vector (see quantize_group) */
typedef struct {
    const uint32_t *x8; /* per chunk: 4 planes x 2 words of 4 int8 codes, in the planes' order */
    const float *dx;    /* per block of x: the scale of its codes */
    const float *xs;    /* per group: the sum of the values the codes give back, dx * code */
    const int32_t *xi;  /* per block of x: the sum of its codes (q6_k's offset of 32) */
} vectors_t;

/* A quantized W multiplies x rounded to int8 codes per XBLOCK values (scale = max |x| / 127,
 * round half to even; iron.quant.activation_values), so that a 4-bit code times x is an
 * integer dot product, exact in any order. This rounds group bg % NG of vector bg / NG (the
 * threads share the groups out) and sums its values. The codes of plane j are stored in the
 * order lo/hi below take the plane's nibbles: x 8j + 0, 4, 1, 5 then 2, 6, 3, 7. */
static void quantize_group(const uint16_t *x, const long bg, int8_t *x8, float *dx, float *xs,
                           int32_t *xi) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const long b = bg / NG;
    xs[bg] = 0.0f;
    for (long c = bg % NG * Q_CHUNKS; c < (bg % NG + 1) * Q_CHUNKS; c++) {
        const long k0 = b * (long)Q_K + 32 * c;
        __m256i q[4];
        float sum = 0.0f;
        __m256 v[4]; /* values 8i .. 8i + 7 */
        for (int i = 0; i < 4; i++) v[i] = iron_load8_bf16(x + k0 + 8 * i);
        for (int blk = 0; blk < XPC; blk++) { /* values XBLOCK blk .. XBLOCK (blk + 1) - 1 */
            const int i0 = blk * XBLOCK / 8, i1 = i0 + XBLOCK / 8;
            __m256 mag = _mm256_and_ps(v[i0], magnitude);
            for (int i = i0 + 1; i < i1; i++)
                mag = _mm256_max_ps(mag, _mm256_and_ps(v[i], magnitude));
            const float amax = iron_hmax8(mag);
            const float scale = amax / 127.0f, over = 127.0f / amax;
            const float inv = over <= FLT_MAX ? over : 0.0f; /* max |x| 0 or tiny: codes 0 */
            /* cvtps rounds half to even (the default mode) */
            __m256i s = _mm256_setzero_si256();
            for (int i = i0; i < i1; i++) {
                q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
                s = _mm256_add_epi32(s, q[i]);
            }
            const float codes_sum = iron_hsum8(_mm256_cvtepi32_ps(s)); /* an integer, exact */
            sum += codes_sum * scale;
            dx[b * XB + XPC * c + blk] = scale;
            xi[b * XB + XPC * c + blk] = (int32_t)codes_sum;
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
#include "qmatmul_vnni.h"
#else
#include "qmatmul_avx2.h"
#endif

/* a tile of W times the vectors v0 .. v0 + Q_VECTOR_BLOCK - 1, BB at a time (the last pass
 * takes the rest); out points at the tile's first row of vector 0 */
static inline void tile_times_vectors(const uint8_t *tile, const vectors_t v, const long v0,
                                      out_t *out) {
    acc_t acc[BB];
    long b0 = v0;
    for (; b0 + BB <= v0 + Q_VECTOR_BLOCK; b0 += BB) {
        tile_dot(BB, tile, v, b0, acc);
        store_rows(acc, BB, out + b0 * Q_OUT_STRIDE);
    }
#define Q_REST(n)                                                                         \
    case n: tile_dot(n, tile, v, b0, acc); store_rows(acc, n, out + b0 * Q_OUT_STRIDE); break;
    switch (v0 + Q_VECTOR_BLOCK - b0) { /* constant nb: accumulators stay in registers */
#if BB > 1
    Q_REST(1)
#endif
#if BB > 2
    Q_REST(2) Q_REST(3)
#endif
#if BB > 4
    Q_REST(4) Q_REST(5) Q_REST(6) Q_REST(7)
#endif
    default: break;
    }
#undef Q_REST
}

/* the rows of work item item of W times the rounded vectors v */
static inline void q_items(const uint8_t *W, const vectors_t v, out_t *out, const long item) {
    for (long v0 = 0; v0 < Q_VECTORS; v0 += Q_VECTOR_BLOCK)
        for (long m = item * Q_ITEM_ROWS; m < (item + 1) * Q_ITEM_ROWS; m += Q_TILE)
            tile_times_vectors(W + m / Q_TILE * Q_TILE_BYTES(Q_K), v, v0, out + m);
}

/* x rounded: per vector, group sums (NG floats), block scales (XB), block code sums (XB
 * int32), then the codes (K bytes) */
#define X_FLOATS ((long)Q_VECTORS * (NG + 2 * XB))
#define X_BYTES ((sizeof(float) * X_FLOATS + (long)Q_VECTORS * Q_K + 63) / 64 * 64)
static inline vectors_t x_buffer(float *xs) {
    float *dx = xs + (long)Q_VECTORS * NG;
    return (vectors_t){(const uint32_t *)(xs + X_FLOATS), dx, xs,
                       (const int32_t *)(dx + (long)Q_VECTORS * XB)};
}

static inline void round_group(const uint16_t *x, const long bg, const vectors_t v) {
    quantize_group(x, bg, (int8_t *)v.x8, (float *)v.dx, (float *)v.xs, (int32_t *)v.xi);
}

/* Decode's few vectors: every thread rounds all of x itself, into its own stack, and goes
 * straight on to its rows: rounding 576 to 8192 values costs less than the barrier that
 * sharing it out needs, and a barrier waits for the slowest thread's wake-up. */
#define Q_PRIVATE_X (Q_VECTORS <= 4)

/* out (Q_VECTORS, Q_OUT_STRIDE) bf16 or float32 (iron_out.h) = x (Q_VECTORS, Q_K) bf16 times
 * the rows of W */
static void q_matmul(const uint8_t *W, const uint16_t *x, out_t *out) {
#if Q_PRIVATE_X
#if IRON_NUM_AIE_COLUMNS > 1
    #pragma omp parallel num_threads(IRON_NUM_AIE_COLUMNS)
#endif
    {
        _Alignas(64) float xs[X_BYTES / sizeof(float)];
        const vectors_t v = x_buffer(xs);
        for (long bg = 0; bg < (long)Q_VECTORS * NG; bg++) round_group(x, bg, v);
#if IRON_NUM_AIE_COLUMNS > 1
        #pragma omp for schedule(static) nowait
#endif
        for (long item = 0; item < Q_OUT_STRIDE / Q_ITEM_ROWS; item++) q_items(W, v, out, item);
    }
#else
    float *xs = aligned_alloc(64, X_BYTES);
    const vectors_t v = x_buffer(xs);
#if IRON_NUM_AIE_COLUMNS > 1
    #pragma omp parallel num_threads(IRON_NUM_AIE_COLUMNS)
#endif
    {
#if IRON_NUM_AIE_COLUMNS > 1
        #pragma omp for schedule(static)
#endif
        for (long bg = 0; bg < (long)Q_VECTORS * NG; bg++) round_group(x, bg, v);
#if IRON_NUM_AIE_COLUMNS > 1
        #pragma omp for schedule(static) /* after the barrier that ends the loop above */
#endif
        for (long item = 0; item < Q_OUT_STRIDE / Q_ITEM_ROWS; item++) q_items(W, v, out, item);
    }
    free(xs);
#endif
}

#endif /* IRON_QMATMUL_H */
