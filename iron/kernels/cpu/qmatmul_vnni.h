/* qmatmul_vnni.h: the tile kernel of the quantized GEMV and GEMM with AVX512-VNNI: the 16 rows
 * of a tile in the 16 lanes of a zmm, 4-byte dot products with vpdpbusd. Included by
 * qmatmul.h, which defines vectors_t, NG, NC, XB, BB, BIAS_D and PREFETCH; defines acc_t,
 * tile_dot and store_rows. */
#ifndef IRON_QMATMUL_TILE_KERNEL
#define IRON_QMATMUL_TILE_KERNEL

/* *acc += the 4 unsigned bytes of every lane of codes . 4 int8 of x broadcast to every lane,
 * in 32-bit integers (exact). The broadcast is embedded in the instruction's memory operand,
 * which compilers do not fold from _mm512_set1_epi32: a separate broadcast costs a shuffle per
 * vector and plane. */
static inline __attribute__((always_inline)) void dp_codes(__m512i *acc, const __m512i codes,
                                                           const uint32_t *x4) {
#if defined(__GNUC__)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(*acc) : "v"(codes), "m"(*x4));
#else
    *acc = _mm512_dpbusd_epi32(*acc, codes, _mm512_set1_epi32((int)*x4));
#endif
}

/* acc[b] = the 16 rows of a tile times x vectors b0 .. b0 + nb - 1, one float32 lane per row.
 * Per plane of 16 words, one mask (and one shift) make each row's 8 codes into two words of 4
 * bytes (with two code sets, both sets' nibbles into the same bytes), and one vpdpbusd per
 * vector and word multiplies them by 4 codes of x: a chunk's sums
 * are integers, exact, so a row's result does not depend on how many vectors share the pass.
 * Per block of x (XBLOCK: 16 or 32 values) they are scaled by x's scale, per group by the
 * rows' d (16 in one load), and the bias is added. The K-quants take the AVX2 kernel's float
 * steps lane for lane, so both give the same bits: q4_k is q4_1 with the group's d and bias
 * made from the super-block's d, dmin and the group's 6-bit scales; q6_k's scale changes every
 * 16 values (its x_block is 16), so each block's integer sum less 32 times x's codes' sum
 * (exact) is scaled by x's scale and added at once times the block's d sc. */
static inline __attribute__((always_inline)) void tile_dot(const int nb, const uint8_t *tile,
                                                           const vectors_t v, const long b0,
                                                           __m512 *acc) {
    const __m512i nibbles = _mm512_set1_epi32(0x0f0f0f0f);
    for (int b = 0; b < nb; b++) acc[b] = _mm512_setzero_ps();
#if Q_KQUANT
    __m512 dsuper = _mm512_setzero_ps(), dmin = _mm512_setzero_ps();
#endif
    for (long g = 0; g < NG; g++) {
        const uint8_t *gp = q_group(tile, g);
#if QFMT == IRON_FMT_Q6_K
        if (g % Q_SUPER == 0) q_super16(tile, g, &dsuper, &dmin);
#endif
        __m512 sum[BB]; /* sum over the group's chunks of dx * (codes . x codes) */
        for (int c = 0; c < Q_CHUNKS; c++) {
            const uint8_t *cp = gp + c * Q_CHUNK_BYTES;
            const long chunk = g * Q_CHUNKS + c;
            for (int line = 0; line < Q_CHUNK_BYTES; line += 64)
                _mm_prefetch((const char *)cp + PREFETCH + line, _MM_HINT_T0);
            __m512i part[BB][2]; /* per vector: x's two blocks */
            for (int b = 0; b < nb; b++) part[b][0] = part[b][1] = _mm512_setzero_si512();
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
                const __m512i w = _mm512_loadu_si512(cp + 64 * j);
#if Q_NIBBLES == 2
                /* q8_0, q6_k: the high set's nibbles go into bits 4-7 of the low set's code
                 * bytes, u = low + 16 high (at most 255) in one byte, so that one vpdpbusd per
                 * word takes both sets (the same integer sums as two, in half the dot
                 * products); ternary logic 0xca: nibbles ? first : second */
                __m512i w1 = _mm512_loadu_si512(cp + Q_PLANE_AT(1, j));
                if (Q_HIGH_PACKED) /* q6_k: planes j, j + 2 share a word */
                    w1 = _mm512_and_si512(_mm512_srli_epi32(w1, Q_PLANE_SHIFT(1, j)),
                                          _mm512_set1_epi32(Q_HIGH_2BIT));
                const __m512i lo =
                    _mm512_ternarylogic_epi32(nibbles, w, _mm512_slli_epi32(w1, 4), 0xca);
                const __m512i hi =
                    _mm512_ternarylogic_epi32(nibbles, _mm512_srli_epi32(w, 4), w1, 0xca);
#else
                const __m512i lo = _mm512_and_si512(w, nibbles);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(w, 4), nibbles);
#endif
                for (int b = 0; b < nb; b++) {
                    const uint32_t *x4 = v.x8 + ((b0 + b) * NC + chunk) * 8 + 2 * j;
                    dp_codes(&part[b][j / 2], lo, x4);
                    dp_codes(&part[b][j / 2], hi, x4 + 1);
                }
            }
#if QFMT == IRON_FMT_Q6_K
            const __m512 block_d[2] = {q6_k_scale16(tile, g, 2 * c, dsuper),
                                       q6_k_scale16(tile, g, 2 * c + 1, dsuper)};
#endif
            for (int b = 0; b < nb; b++) {
                const long xb = (b0 + b) * XB + XPC * chunk; /* the chunk's first block of x */
#if QFMT == IRON_FMT_Q6_K /* XBLOCK 16 */
                for (int half = 0; half < 2; half++) {
                    const __m512i zero = _mm512_set1_epi32(Q_ZERO * v.xi[xb + half]);
                    const __m512i s = _mm512_sub_epi32(part[b][half], zero);
                    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s),
                                                   _mm512_set1_ps(v.dx[xb + half]));
                    acc[b] = _mm512_fmadd_ps(f, block_d[half], acc[b]);
                }
#elif XBLOCK == 32 /* the chunk's sums at once: two accumulators ran 1-2% faster than one */
                const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(part[b][0], part[b][1]));
                const __m512 scale = _mm512_set1_ps(v.dx[xb]);
                sum[b] = c == 0 ? _mm512_mul_ps(f, scale) : _mm512_fmadd_ps(f, scale, sum[b]);
#else
                for (int half = 0; half < 2; half++) {
                    const __m512 f = _mm512_cvtepi32_ps(part[b][half]);
                    const __m512 scale = _mm512_set1_ps(v.dx[xb + half]);
                    sum[b] = c == 0 && half == 0 ? _mm512_mul_ps(f, scale)
                                                 : _mm512_fmadd_ps(f, scale, sum[b]);
                }
#endif
            }
        }
#if QFMT == IRON_FMT_Q6_K
        (void)sum; /* its blocks were added as they came */
#else
        const uint8_t *ds = gp + Q_CHUNKS * Q_CHUNK_BYTES;
#if QFMT == IRON_FMT_Q4_K
        __m512 d, bias;
        if (g % Q_SUPER == 0) /* here, not before the group's chunks: 1-2% faster */
            q_super16(tile, g, &dsuper, &dmin);
        q4_k_params16(tile, g, dsuper, dmin, &d, &bias);
        (void)ds;
#else
        const __m512 d = q_load16_params(ds);
#if Q_HAS_MIN
        const __m512 bias = _mm512_fnmadd_ps(_mm512_set1_ps(BIAS_D), d,
                                             q_load16_params(ds + 2 * Q_TILE));
#else
        const __m512 bias = _mm512_mul_ps(_mm512_set1_ps(-BIAS_D), d);
#endif
#endif
        for (int b = 0; b < nb; b++) {
            acc[b] = _mm512_fmadd_ps(sum[b], d, acc[b]);
            acc[b] = _mm512_fmadd_ps(bias, _mm512_set1_ps(v.xs[(b0 + b) * NG + g]), acc[b]);
        }
#endif
    }
}

static inline __attribute__((always_inline)) void store_rows(const __m512 *acc, const int nb,
                                                             out_t *out) {
    for (int b = 0; b < nb; b++) out_store16(out + b * (long)Q_OUT_STRIDE, acc[b]);
}
typedef __m512 acc_t;

#endif /* IRON_QMATMUL_TILE_KERNEL */
