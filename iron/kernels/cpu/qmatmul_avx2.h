/* qmatmul_avx2.h: the tile kernel of the quantized GEMV and GEMM with AVX2: the 16 rows of a
 * tile as two halves of 8 lanes, 4-byte dot products as vpmaddubsw + vpmaddwd. Included by
 * qmatmul.h, which defines vectors_t, NG, NC, XB, BB, BIAS_D and PREFETCH; defines acc_t,
 * tile_dot and store_rows. */
#ifndef IRON_QMATMUL_TILE_KERNEL
#define IRON_QMATMUL_TILE_KERNEL

typedef struct {
    __m256 h[2];
} acc_t;

/* acc[b] = the 16 rows of a tile times x vectors b0 .. b0 + nb - 1, the same arithmetic as
 * the AVX512-VNNI kernel: per block of XBLOCK values of x, every row's integer sum of code
 * times x code, exact (with x_block 32 the two halves' 32-bit sums added), then the same float
 * steps in the same order. AVX2 has no 4-byte dot product:
 * vpmaddubsw multiplies the unsigned code bytes by x's int8 codes and adds pairs into 16-bit
 * lanes (at most 2 * 15 * 127 per pair, 4 such sums per block: no saturation), and one
 * vpmaddwd per block adds the 16-bit pairs into 32-bit lanes. Each 64-byte plane holds the
 * rows 0-7 in its first 32 bytes, 8-15 in the others; both halves are done in one pass, so
 * that each broadcast of x's codes and scales serves the 16 rows (broadcasts per half were
 * a sixth of the loop's instructions, and the kernel is what bounds decode with one core).
 * The K-quants: q4_k is q4_1 with a group's d and minimum made from the super-block's fp16
 * d, dmin and the group's 6-bit scales (exact); q6_k's scale changes every 16 values, so each
 * block's integer sum, less 32 times x's codes' sum (exact: (u - 32) . x codes), is scaled by x's
 * scale and added times the block's d sc. */
static inline __attribute__((always_inline)) void tile_dot(const int nb, const uint8_t *tile,
                                                           const vectors_t v, const long b0,
                                                           acc_t *acc) {
    const __m256i nibbles = _mm256_set1_epi8(0x0f);
    const __m256i ones = _mm256_set1_epi16(1), sixteens = _mm256_set1_epi16(16);
    for (int b = 0; b < nb; b++) acc[b].h[0] = acc[b].h[1] = _mm256_setzero_ps();
    for (long g = 0; g < NG; g++) {
        const uint8_t *gp = q_group(tile, g);
        const uint8_t *ds = gp + Q_CODE_BYTES;
        for (int c = 0; c < Q_CHUNKS; c++)
            for (int line = 0; line < Q_CHUNK_BYTES; line += 64)
                _mm_prefetch((const char *)gp + c * Q_CHUNK_BYTES + PREFETCH + line,
                             _MM_HINT_T0);
        __m256 sum[BB][2]; /* per half: sum over the group's blocks of dx * (codes . x codes) */
        for (int c = 0; c < Q_CHUNKS; c++) {
            const uint8_t *cp = gp + c * Q_CHUNK_BYTES;
            const long chunk = g * Q_CHUNKS + c;
            __m256i chunk_sum[BB][2]; /* x_block 32: the first block's 32-bit sums */
            for (int blk = 0; blk < 2; blk++) { /* planes 2 blk, 2 blk + 1 */
                __m256i part[BB][Q_NIBBLES][2];
                for (int h = 0; h < Q_NIBBLES; h++)
                    for (int p = 0; p < 2; p++) {
                        const int j = 2 * blk + p;
                        __m256i lo[2], hi[2];
                        for (int half = 0; half < 2; half++) {
                            __m256i w = _mm256_loadu_si256(
                                (const __m256i *)(cp + Q_PLANE_AT(h, j) + 32 * half));
                            if (h == 1 && Q_HIGH_PACKED) /* q6_k: planes j, j + 2 share */
                                w = _mm256_and_si256(_mm256_srli_epi32(w, Q_PLANE_SHIFT(h, j)),
                                                     _mm256_set1_epi32(Q_HIGH_2BIT));
                            lo[half] = _mm256_and_si256(w, nibbles);
                            hi[half] = _mm256_and_si256(_mm256_srli_epi32(w, 4), nibbles);
                        }
                        for (int b = 0; b < nb; b++) {
                            const int32_t *x4 = (const int32_t *)v.x8
                                                + ((b0 + b) * NC + chunk) * 8 + 2 * j;
                            const __m256i xl = _mm256_set1_epi32(x4[0]);
                            const __m256i xh = _mm256_set1_epi32(x4[1]);
                            for (int half = 0; half < 2; half++) {
                                const __m256i s = _mm256_add_epi16(
                                    _mm256_maddubs_epi16(lo[half], xl),
                                    _mm256_maddubs_epi16(hi[half], xh));
                                part[b][h][half] = p == 0 ? s
                                                          : _mm256_add_epi16(part[b][h][half], s);
                            }
                        }
                    }
                for (int half = 0; half < 2; half++) {
#if QFMT == IRON_FMT_Q6_K
                    const __m256 block_d = q6_k_scale8(tile, g, 2 * c + blk, half);
#endif
                    for (int b = 0; b < nb; b++) {
                        __m256i s = _mm256_madd_epi16(part[b][0][half], ones);
                        if (Q_NIBBLES == 2) /* q8_0, q6_k: u = low + 16 high */
                            s = _mm256_add_epi32(
                                s, _mm256_madd_epi16(part[b][Q_NIBBLES - 1][half], sixteens));
                        const long xb = (b0 + b) * XB + XPC * chunk + blk / (XBLOCK / 16);
#if QFMT == IRON_FMT_Q6_K
                        s = _mm256_sub_epi32(s, _mm256_set1_epi32(Q_ZERO * v.xi[xb]));
                        const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(s),
                                                       _mm256_broadcast_ss(v.dx + xb));
                        acc[b].h[half] = _mm256_fmadd_ps(f, block_d, acc[b].h[half]);
#else
                        if (XBLOCK == 32 && blk == 0) { /* converted with the second block's */
                            chunk_sum[b][half] = s;
                            continue;
                        }
                        if (XBLOCK == 32) s = _mm256_add_epi32(chunk_sum[b][half], s);
                        const __m256 f = _mm256_cvtepi32_ps(s);
                        const __m256 scale = _mm256_broadcast_ss(v.dx + xb);
                        sum[b][half] = c == 0 && blk == XBLOCK / 16 - 1
                                           ? _mm256_mul_ps(f, scale)
                                           : _mm256_fmadd_ps(f, scale, sum[b][half]);
#endif
                    }
                }
            }
        }
#if QFMT == IRON_FMT_Q6_K
        (void)ds, (void)sum; /* its blocks were added as they came */
#else
        for (int half = 0; half < 2; half++) {
#if QFMT == IRON_FMT_Q4_K
            __m256 d, bias;
            q4_k_params8(tile, g, half, &d, &bias);
            (void)ds;
#else
            const __m256 d = q_load8_params(ds + 16 * half);
#if Q_HAS_MIN
            const __m256 bias = _mm256_fnmadd_ps(_mm256_set1_ps(BIAS_D), d,
                                                 q_load8_params(ds + 2 * Q_TILE + 16 * half));
#else
            const __m256 bias = _mm256_mul_ps(_mm256_set1_ps(-BIAS_D), d);
#endif
#endif
            for (int b = 0; b < nb; b++) {
                acc[b].h[half] = _mm256_fmadd_ps(sum[b][half], d, acc[b].h[half]);
                acc[b].h[half] = _mm256_fmadd_ps(
                    bias, _mm256_broadcast_ss(v.xs + (b0 + b) * NG + g), acc[b].h[half]);
            }
        }
#endif
    }
}

static inline __attribute__((always_inline)) void store_rows(const acc_t *acc, const int nb,
                                                             out_t *out) {
    for (int b = 0; b < nb; b++) {
        out_store8(out + b * (long)Q_OUT_STRIDE, acc[b].h[0]);
        out_store8(out + b * (long)Q_OUT_STRIDE + 8, acc[b].h[1]);
    }
}

#endif /* IRON_QMATMUL_TILE_KERNEL */
