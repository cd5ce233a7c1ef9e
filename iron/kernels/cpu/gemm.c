/* gemm: C = A @ B^T  (B in the Linear-weight layout), for prompt prefill.
 *
 * args: A (M, K) bf16, B (N, K) bf16 -> C (M, N) bf16;  C[m, n] = sum_k A[m, k] * B[n, k].
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
#include "iron_quant.h"

#if !defined(IRON_M) || !defined(IRON_K) || !defined(IRON_N) || !defined(IRON_TILE_M) \
    || !defined(IRON_TILE_K) || !defined(IRON_TILE_N) || !defined(IRON_NUM_AIE_COLUMNS)
#error "gemm.c needs IRON_M, IRON_K, IRON_N, IRON_TILE_M, IRON_TILE_K, IRON_TILE_N, \
IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_M % IRON_TILE_M == 0, "M % tile_m == 0");
_Static_assert(IRON_K % IRON_TILE_K == 0, "K % tile_k == 0");
_Static_assert(IRON_N % IRON_TILE_N == 0, "N % tile_n == 0");
_Static_assert(IRON_WEIGHT_FORMAT == 0 || IRON_TILE_N % 16 == 0,
               "tile_n % 16 == 0 for quantized B");

#if QFMT != IRON_FMT_BF16 /* the quantized GEMV's scheme, a prompt row per vector */

#define Q_K IRON_K
#define Q_VECTORS IRON_M
#define Q_OUT_STRIDE IRON_N
#define Q_ITEM_ROWS IRON_TILE_N
#define Q_VECTOR_BLOCK IRON_TILE_M
#include "qmatmul.h"

void iron_kernel(void *const *args) { q_matmul(args[1], args[0], args[2]); }

#else /* bf16 B */

#define NR 16                                     /* columns per packed panel of B */
#define TN_PAD ((IRON_TILE_N + NR - 1) / NR * NR) /* tile width rounded up to panels */
#define PANELS (TN_PAD / NR)
#define CT_FLOATS ((long)IRON_M * TN_PAD)

#if defined(__AVX512BF16__)

#define KP ((IRON_TILE_K + 1) / 2) /* k-pairs per tile */
/* row stride of the A that micro reads: A itself, or its copy with k-tiles padded to KP pairs */
#define A_STRIDE (IRON_TILE_K % 2 ? IRON_K / IRON_TILE_K * 2 * KP : IRON_K)
#define A_TILE_COLS (2 * KP) /* columns of one k-tile in that A */
#define BP_ELEMS ((long)PANELS * KP * NR * 2)
typedef uint16_t packed_t;

/* c (rows x 16 np, row stride TN_PAD) += a (rows x 2 KP, row stride A_STRIDE) @ np panels of bp
 * (panel stride KP * 32). Called with constant rows (8, 4, 2, 1) and np (2, 1), so acc[][]
 * lives in registers. */
static inline __attribute__((always_inline)) void micro(const int rows, const int np,
                                                        const uint16_t *a, const uint16_t *bp,
                                                        float *c) {
    __m512 acc[8][2];
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < np; p++) acc[r][p] = _mm512_loadu_ps(c + r * TN_PAD + p * NR);
    for (int kp = 0; kp < KP; kp++) {
        __m512bh b[2];
        for (int p = 0; p < np; p++)
            b[p] = (__m512bh)_mm512_load_si512(bp + ((long)p * KP + kp) * NR * 2);
        for (int r = 0; r < rows; r++) {
            uint32_t pair;
            memcpy(&pair, a + r * (long)A_STRIDE + 2 * kp, sizeof pair);
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)pair);
            for (int p = 0; p < np; p++) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], av, b[p]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < np; p++) _mm512_storeu_ps(c + r * TN_PAD + p * NR, acc[r][p]);
}

/* B[n0 .. n0+TILE_N, k0 .. k0+TILE_K] -> bp[panel][kp][16][2], an odd TILE_K padded by a zero */
static void pack_b(const void *B, long n0, long k0, uint16_t *bp) {
    for (long n = 0; n < IRON_TILE_N; n++) {
        const uint16_t *row = (const uint16_t *)B + (n0 + n) * IRON_K + k0;
        uint16_t *dst = bp + (n / NR) * (long)KP * NR * 2 + n % NR * 2;
        for (long kp = 0; kp < IRON_TILE_K / 2; kp++) memcpy(dst + kp * NR * 2, row + 2 * kp, 4);
        if (IRON_TILE_K % 2) {
            dst[(KP - 1) * NR * 2] = row[IRON_TILE_K - 1];
            dst[(KP - 1) * NR * 2 + 1] = 0;
        }
    }
}

/* c += the TILE_M rows of a @ np panels: 8 rows at a time, then 4, 2, 1. Called with a
 * constant np, so each micro call keeps constant shapes. */
static inline __attribute__((always_inline)) void sweep_rows(const int np, const uint16_t *a,
                                                             const uint16_t *panel, float *c) {
    int i = 0;
    for (; i + 8 <= IRON_TILE_M; i += 8) micro(8, np, a + i * A_STRIDE, panel, c + i * TN_PAD);
    if (IRON_TILE_M - i >= 4) {
        micro(4, np, a + i * A_STRIDE, panel, c + i * TN_PAD);
        i += 4;
    }
    if (IRON_TILE_M - i >= 2) {
        micro(2, np, a + i * A_STRIDE, panel, c + i * TN_PAD);
        i += 2;
    }
    if (IRON_TILE_M - i >= 1) micro(1, np, a + i * A_STRIDE, panel, c + i * TN_PAD);
}

/* ct (TILE_M rows, row stride TN_PAD) += A[m0 .. m0+TILE_M, k-tile at column ka] @ bp */
static void tile_update(const uint16_t *Ap, long m0, long ka, const uint16_t *bp, float *ct) {
    const uint16_t *a = Ap + m0 * A_STRIDE + ka;
    for (int p = 0; p < PANELS; p += 2) {
        const uint16_t *panel = bp + (long)p * KP * NR * 2;
        if (p + 2 <= PANELS) sweep_rows(2, a, panel, ct + p * NR);
        else sweep_rows(1, a, panel, ct + p * NR);
    }
}

#else /* AVX2 + FMA */

#define A_STRIDE IRON_K
#define A_TILE_COLS IRON_TILE_K
#define BP_ELEMS ((long)PANELS * IRON_TILE_K * NR)
typedef float packed_t;

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
static void pack_b(const void *B, long n0, long k0, float *bp) {
    for (long n = 0; n < IRON_TILE_N; n++) {
        float *dst = bp + (n / NR) * (long)IRON_TILE_K * NR + n % NR;
        const uint16_t *b = (const uint16_t *)B + (n0 + n) * IRON_K + k0;
        for (long k = 0; k < IRON_TILE_K; k++) dst[k * NR] = iron_bf16_to_f32(b[k]);
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

#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) \
    && IRON_K % 32 == 0 && IRON_TILE_N % 16 == 0
#define AMX 1
#include <sys/syscall.h>
#include <unistd.h>

/* AMX: C^T = B @ A^T on 16 x 16 float32 tiles, so that B (the weights, by far the larger
 * operand) is loaded into tiles straight from its Linear layout and never repacked: a B tile is
 * 16 rows of B x 32 k (row stride K). Only A is packed, once per call, into the pair layout
 * the second operand of tdpbf16ps needs: at[mb][kc][r][j][2] = A[16 mb + j, 32 kc + 2 r + {0,1}]
 * (rows of A past M are zero). Per work item (TILE_N rows of B) blocks of up to 32 n x 32 m
 * accumulate over all of K in four tile registers, then are written transposed into C.
 * TILE_M and TILE_K do not apply: the hardware fixes the tiles at 16 x 32. */
#define MB ((IRON_M + 15) / 16) /* 16-row blocks of A */
#define KC (IRON_K / 32)        /* 32-wide k chunks */

static int amx_permitted(void) {
    static int state; /* 0 not asked yet, 1 granted, -1 refused (older kernel, no AMX state) */
    if (!state) /* arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): once per process */
        state = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
    return state > 0;
}

static void amx_configure(void) { /* palette 1, every tile 16 rows x 64 bytes */
    struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; }
        config = {.palette = 1};
    for (int t = 0; t < 8; t++) config.colsb[t] = 64, config.rows[t] = 16;
    _tile_loadconfig(&config);
}

/* r[i][j] -> r[j][i] for 16 rows of 16 32-bit lanes (moves only: any 32-bit data) */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* at[mb][kc] = the 16 x 16 block of A's bf16 pairs (rows m, columns k-pairs), transposed */
static void pack_at(const uint16_t *A, uint16_t *at) {
    for (long mb = 0; mb < MB; mb++)
        for (long kc = 0; kc < KC; kc++) {
            __m512 r[16];
            for (long i = 0; i < 16; i++)
                r[i] = 16 * mb + i < IRON_M
                           ? _mm512_loadu_ps(A + (16 * mb + i) * IRON_K + 32 * kc)
                           : _mm512_setzero_ps();
            transpose16(r);
            for (int i = 0; i < 16; i++) _mm512_store_ps(at + ((mb * KC + kc) * 16 + i) * 32, r[i]);
        }
}

/* C[m, n0 + n] = out[n][m - m0] for the nt * 16 x mt * 16 block in out (row stride 32) */
static void write_c(const int nt, const int mt, const float *out, long m0, long n0,
                    uint16_t *C) {
    for (int ns = 0; ns < nt; ns++)
        for (int ms = 0; ms < mt; ms++) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_load_ps(out + (16 * ns + i) * 32 + 16 * ms);
            transpose16(r); /* r[j] = column j: 16 n of row m = m0 + 16 ms + j */
            for (int j = 0; j < 16 && m0 + 16 * ms + j < IRON_M; j++)
                _mm256_storeu_si256((__m256i *)(C + (m0 + 16 * ms + j) * IRON_N + n0 + 16 * ns),
                                    (__m256i)_mm512_cvtneps_pbh(r[j]));
        }
}

/* out (nt * 16 rows n, mt * 16 columns m, row stride 32 floats) = w (nt * 16 rows of B) @ the
 * mt blocks of at starting at at. Called with constant nt, mt in {1, 2}: tile numbers are
 * immediates. Tiles 0-3 accumulate, 4-5 hold B, 6-7 hold A^T.
 *
 * A tile load reads one cache line from each of 16 rows of B, too short a stream per row for
 * the hardware prefetchers: each k step also prefetches that line of the next 32 rows
 * (``ahead`` of them, up to the end of B), so the next block arrives while this one computes. */
static inline __attribute__((always_inline)) void amx_block(const int nt, const int mt,
                                                            const uint16_t *w, const long ahead,
                                                            const uint16_t *at, float *out) {
    _tile_zero(0);
    if (mt == 2) _tile_zero(1);
    if (nt == 2) _tile_zero(2);
    if (nt == 2 && mt == 2) _tile_zero(3);
    for (long kc = 0; kc < KC; kc++) {
        for (long r = 32; r < 32 + ahead; r++)
            _mm_prefetch((const char *)(w + r * IRON_K + kc * 32), _MM_HINT_T1);
        _tile_loadd(4, w + kc * 32, IRON_K * 2);
        if (nt == 2) _tile_loadd(5, w + 16L * IRON_K + kc * 32, IRON_K * 2);
        _tile_loadd(6, at + kc * 512, 64);
        if (mt == 2) _tile_loadd(7, at + (KC + kc) * 512L, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (mt == 2) _tile_dpbf16ps(1, 4, 7);
        if (nt == 2) _tile_dpbf16ps(2, 5, 6);
        if (nt == 2 && mt == 2) _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 128);
    if (mt == 2) _tile_stored(1, out + 16, 128);
    if (nt == 2) _tile_stored(2, out + 16 * 32, 128);
    if (nt == 2 && mt == 2) _tile_stored(3, out + 16 * 32 + 16, 128);
}

static void gemm_amx(const uint16_t *A, const uint16_t *B, uint16_t *C) {
    uint16_t *at = aligned_alloc(64, sizeof(uint16_t) * MB * KC * 512);
    pack_at(A, at);
#if IRON_NUM_AIE_COLUMNS > 1
    #pragma omp parallel num_threads(IRON_NUM_AIE_COLUMNS)
#endif
    {
        _Alignas(64) float out[32 * 32];
        amx_configure();
#if IRON_NUM_AIE_COLUMNS > 1
        #pragma omp for schedule(static)
#endif
        for (long item = 0; item < IRON_N / IRON_TILE_N; item++) {
            for (long n0 = item * IRON_TILE_N; n0 < (item + 1) * IRON_TILE_N; n0 += 32) {
                const int nt = (item + 1) * IRON_TILE_N - n0 >= 32 ? 2 : 1;
                for (long mb = 0; mb < MB; mb += 2) {
                    const int mt = MB - mb >= 2 ? 2 : 1;
                    const uint16_t *w = B + n0 * IRON_K, *a = at + mb * KC * 512;
                    const long rest = IRON_N - n0 - 32, ahead = mb ? 0 : rest < 32 ? rest : 32;
                    if (nt == 2 && mt == 2) amx_block(2, 2, w, ahead, a, out);
                    else if (nt == 2) amx_block(2, 1, w, ahead, a, out);
                    else if (mt == 2) amx_block(1, 2, w, ahead, a, out);
                    else amx_block(1, 1, w, ahead, a, out);
                    write_c(nt, mt, out, 16 * mb, n0, C);
                }
            }
        }
        _tile_release();
    }
    free(at);
}
#endif

void iron_kernel(void *const *args) {
    const uint16_t *A = args[0];
    const void *B = args[1];
    uint16_t *C = args[2];

#ifdef AMX
    if (amx_permitted()) {
        gemm_amx(A, B, C);
        return;
    }
#endif

    /* A as micro reads it (row stride A_STRIDE): float32 for AVX2; for AVX512_BF16 A itself,
     * or for an odd TILE_K a copy with each k-tile followed by one zero */
#if defined(__AVX512BF16__)
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
                C[i * IRON_N + n0 + j] = iron_f32_to_bf16(ct[i * TN_PAD + j]);
    }

    free(work);
    free(copy);
}

#endif /* bf16 B */
