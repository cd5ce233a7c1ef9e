/* amx_depth.c: the AMX-INT8 tile unit's rate when every tile product may only sum DEPTH values
 * (the block of x's int8 rounding that shares one scale), with and without the float steps that
 * scale each product's sums. Built and run by amx_depth.py (-DDEPTH=16|32|64 -DFLOAT=0|1).
 *
 * The shape is a prompt chunk's: out[64, 2048] = x[64, 2048] W[2048, 2048]^T, both threads.
 * Per pass, two 16-row tiles of W (B, their codes already expanded to bytes) meet one tile of 16
 * vectors of x (A): tdpbsud, then the 16 x 16 int32 sums go through memory (a ring LAG deep, so
 * the float steps of product k - LAG overlap the tile unit's product k) to 16 float
 * accumulators per W tile. FLOAT 0: none (the integer sums only); 1: one convert and one
 * multiply-add by x's scale per sum; 2: also W's scales (16, one per W row) times x's first,
 * the fewest steps a kernel on quantized W can take (q4_0 also needs its offset). Prints the
 * best of 20 runs, in seconds. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define M 64
#define N 2048
#define K 2048
#define NK (K / DEPTH) /* tile products per row of out */
#define LAG 3

static void configure(void) {
    struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) c.colsb[t] = 64, c.rows[t] = 16;          /* C: sums */
    c.colsb[2] = DEPTH, c.rows[2] = 16;                                    /* A: x */
    for (int t = 4; t < 6; t++) c.colsb[t] = 64, c.rows[t] = DEPTH / 4;   /* B: W codes */
    _tile_loadconfig(&c);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(void) {
    /* Linux hands out the tile registers' state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA) */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
        fprintf(stderr, "amx_depth: the kernel refused AMX tile data (arch_prctl)\n");
        return 1;
    }
    int8_t *x = aligned_alloc(64, M * K);
    uint8_t *codes = aligned_alloc(64, (size_t)N * K);
    float *dx = aligned_alloc(64, sizeof(float) * M * NK);
    float *dw = aligned_alloc(64, sizeof(float) * N * NK); /* per W tile and product: 16 */
    float *out = aligned_alloc(64, sizeof(float) * M * N);
    srand(1);
    for (int i = 0; i < M * K; i++) x[i] = (int8_t)(rand() % 255 - 127);
    for (size_t i = 0; i < (size_t)N * K; i++) codes[i] = (uint8_t)(rand() & 15);
    for (int i = 0; i < M * NK; i++) dx[i] = 1.0f / (float)(1 + i % 7);
    for (int i = 0; i < N * NK; i++) dw[i] = 1.0f / (float)(1 + i % 5);
    double best = 1e9;
    for (int run = 0; run < 20; run++) {
        const double start = now();
#pragma omp parallel
        {
            configure();
            _Alignas(64) int32_t ring[LAG + 1][2][16][16];
#pragma omp for schedule(static)
            for (int t = 0; t < N / 16; t += 2) {
                const uint8_t *w = codes + (size_t)t * 16 * K;
                for (int b0 = 0; b0 < M; b0 += 16) {
                    __m512 acc[2][16];
                    for (int b = 0; b < 16; b++) acc[0][b] = acc[1][b] = _mm512_setzero_ps();
                    for (int k = 0; k < NK + LAG; k++) {
                        if (k < NK) {
                            _tile_loadd(4, w + (size_t)k * DEPTH * 16, 64);
                            _tile_loadd(5, w + (size_t)16 * K + (size_t)k * DEPTH * 16, 64);
                            _tile_loadd(2, x + b0 * K + k * DEPTH, K);
                            _tile_zero(0);
                            _tile_zero(1);
                            _tile_dpbsud(0, 2, 4);
                            _tile_dpbsud(1, 2, 5);
                            _tile_stored(0, ring[k % (LAG + 1)][0], 64);
                            _tile_stored(1, ring[k % (LAG + 1)][1], 64);
                        }
#if FLOAT
                        if (k >= LAG)
                            for (int h = 0; h < 2; h++)
                                for (int b = 0; b < 16; b++) {
                                    const __m512 s = _mm512_cvtepi32_ps(
                                        _mm512_load_si512(ring[(k - LAG) % (LAG + 1)][h][b]));
                                    __m512 scale = _mm512_set1_ps(dx[(b0 + b) * NK + k - LAG]);
#if FLOAT == 2
                                    scale = _mm512_mul_ps(
                                        scale, _mm512_load_ps(dw + ((t + h) * NK + k - LAG) * 16));
#endif
                                    acc[h][b] = _mm512_fmadd_ps(s, scale, acc[h][b]);
                                }
#endif
                    }
#if !FLOAT /* the last sums, so that the products are not dead code */
                    for (int h = 0; h < 2; h++)
                        for (int b = 0; b < 16; b++)
                            acc[h][b] = _mm512_cvtepi32_ps(_mm512_load_si512(ring[0][h][b]));
#endif
                    for (int h = 0; h < 2; h++)
                        for (int b = 0; b < 16; b++)
                            _mm512_storeu_ps(out + (size_t)(b0 + b) * N + (t + h) * 16, acc[h][b]);
                }
            }
        }
        const double seconds = now() - start;
        if (seconds < best) best = seconds;
    }
    printf("%.9f\n", best);
    return 0;
}
