/* gemm.c's bf16 path with AVX512-BF16: B packed into k-pair panels, tiles of C updated with vdpbf16ps.
 * Included by gemm.c (which defines the instance's constants and NR, TN_PAD, PANELS, CT_FLOATS) only
 * when the compiler targets AVX512-BF16. */


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
