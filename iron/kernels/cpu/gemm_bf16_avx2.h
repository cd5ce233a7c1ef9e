/* gemm.c's bf16 path with AVX2 + FMA: A and B widened to float32, a 6x16 micro kernel of FMAs.
 * Included by gemm.c (which defines the instance's constants and NR, TN_PAD, PANELS, CT_FLOATS) on
 * hosts without AVX512-BF16, and for an f16 B (converted exactly by F16C) on every host. */


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

#if QFMT == IRON_FMT_F16
/* bp[panel][k .. k+8][n % 16 .. +8] = B[n .. n+8, k .. k+8] (row stride K) converted: the 8x8
 * block of halves transposed in registers (three rounds of unpacks), then each k's 8 halves
 * converted by one vcvtph2ps, exactly as _cvtsh_ss converts them one at a time. */
static inline void pack_f16_8x8(const uint16_t *b, float *dst) {
    __m128i r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = _mm_loadu_si128((const __m128i *)(b + i * (long)IRON_K));
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);     /* k 0..3 of two rows */
        t[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]); /* k 4..7 */
    }
    for (int i = 0; i < 2; i++)
        for (int h = 0; h < 2; h++) {
            u[4 * i + 2 * h] = _mm_unpacklo_epi32(t[4 * i + h], t[4 * i + 2 + h]);
            u[4 * i + 2 * h + 1] = _mm_unpackhi_epi32(t[4 * i + h], t[4 * i + 2 + h]);
        }
    /* u[j'] holds rows 0..3 (j' < 4) or 4..7 of k pairs: u[0] k 0,1; u[1] k 2,3; u[2] k 4,5 */
    for (int j = 0; j < 4; j++) {
        const __m128i lo = _mm_unpacklo_epi64(u[j], u[4 + j]);  /* k 2j, rows 0..7 */
        const __m128i hi = _mm_unpackhi_epi64(u[j], u[4 + j]);  /* k 2j + 1 */
        _mm256_storeu_ps(dst + (2 * j) * NR, _mm256_cvtph_ps(lo));
        _mm256_storeu_ps(dst + (2 * j + 1) * NR, _mm256_cvtph_ps(hi));
    }
}
#endif

/* B[n0 .. n0+TILE_N, k0 .. k0+TILE_K] (bf16 or f16) -> bp[panel][k][16] in float32 */
static void pack_b(const void *B, long n0, long k0, float *bp) {
#if QFMT == IRON_FMT_F16
    const long n8 = IRON_TILE_N / 8 * 8, k8 = IRON_TILE_K / 8 * 8;
    for (long n = 0; n < n8; n += 8)
        for (long k = 0; k < k8; k += 8)
            pack_f16_8x8((const uint16_t *)B + (n0 + n) * IRON_K + k0 + k,
                         bp + (n / NR) * (long)IRON_TILE_K * NR + k * NR + n % NR);
    for (long n = 0; n < IRON_TILE_N; n++) { /* what is left of 8 x 8 blocks */
        float *dst = bp + (n / NR) * (long)IRON_TILE_K * NR + n % NR;
        const uint16_t *b = (const uint16_t *)B + (n0 + n) * IRON_K + k0;
        for (long k = n < n8 ? k8 : 0; k < IRON_TILE_K; k++)
            dst[k * NR] = _cvtsh_ss(b[k]); /* exact */
    }
#else
    for (long n = 0; n < IRON_TILE_N; n++) {
        float *dst = bp + (n / NR) * (long)IRON_TILE_K * NR + n % NR;
        const uint16_t *b = (const uint16_t *)B + (n0 + n) * IRON_K + k0;
        for (long k = 0; k < IRON_TILE_K; k++) dst[k * NR] = iron_bf16_to_f32(b[k]);
    }
#endif
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
