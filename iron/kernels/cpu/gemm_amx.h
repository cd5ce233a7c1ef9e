/* gemm.c's AMX path (guarded by its own #if): bf16 tiles straight from B's Linear layout.
 * Included by gemm.c after the packed-panel path, which it falls back to when the kernel may not use AMX. */

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) \
    && IRON_K % 32 == 0 && IRON_TILE_N % 16 == 0 && QFMT == IRON_FMT_BF16
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
                    out_t *C) {
    for (int ns = 0; ns < nt; ns++)
        for (int ms = 0; ms < mt; ms++) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_load_ps(out + (16 * ns + i) * 32 + 16 * ms);
            transpose16(r); /* r[j] = column j: 16 n of row m = m0 + 16 ms + j */
            for (int j = 0; j < 16 && m0 + 16 * ms + j < IRON_M; j++)
                out_store16(C + (m0 + 16 * ms + j) * IRON_N + n0 + 16 * ns, r[j]);
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

static void gemm_amx(const uint16_t *A, const uint16_t *B, out_t *C) {
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
