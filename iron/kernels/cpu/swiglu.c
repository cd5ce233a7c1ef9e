/* swiglu: out[r, i] = silu(x[r, i]) * x[r, SIZE + i]  (gate half first, then the up half).
 *
 * args: x (ROWS, 2 * SIZE) bf16 -> out (ROWS, SIZE) bf16.
 * macros:
 *   IRON_ROWS             rows (tokens; 1 in decode)
 *   IRON_SIZE             output columns (half the input width)
 *   IRON_TILE_SIZE        columns per tile; tiles of the SIZE dimension are the parallel items
 *   IRON_NUM_AIE_COLUMNS  worker threads
 *   IRON_NUM_CHANNELS     NPU DMA channels per column; accepted and ignored on the cpu
 * legality (the operator's rules(), asserted below): SIZE % (TILE_SIZE * NUM_AIE_COLUMNS) == 0.
 * 8 columns at a time with iron_silu8 (vector exp, iron_cpu.h), 16 at a time where AVX-512 is
 * there (silu16 below: the same operations lane for lane, so the same bits, at half the
 * instructions: a batched decode step runs this for every row, and its exp and division were
 * a tenth of the step's growth from 1 row to 4); the tail of a tile uses expf.
 */
#include "iron_cpu.h"

#if defined(__AVX512F__)
/* iron_exp8 on 16 lanes, operation for operation (min/max keep a NaN the same way; roundscale
 * with immediate 8 is round_ps's nearest-integer mode; n is integral, so its conversion is
 * exact); underflowing lanes are +0, as andnot makes them there. */
static inline __m512 exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.376f);
    const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(lo, _mm512_min_ps(hi, x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps((__mmask16)~underflow, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}

static inline __m512 load16_bf16(const uint16_t *p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* iron_store8_bf16's rounding on 16 lanes: nearest even, a NaN made quiet. */
static inline void store16_bf16(uint16_t *p, __m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __mmask16 isnan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, isnan, u, _mm512_set1_epi32(0x00400000));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
}

/* iron_silu8 on 16 lanes */
static inline __m512 silu16(__m512 g) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
#endif

#if !defined(IRON_ROWS) || !defined(IRON_SIZE) || !defined(IRON_TILE_SIZE) \
    || !defined(IRON_NUM_AIE_COLUMNS)
#error "swiglu.c needs IRON_ROWS, IRON_SIZE, IRON_TILE_SIZE, IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_SIZE % (IRON_NUM_AIE_COLUMNS * IRON_TILE_SIZE) == 0,
               "size % (num_aie_columns * tile_size) == 0");

void iron_kernel(void *const *args) {
    const uint16_t *x = args[0];
    uint16_t *out = args[1];

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long t = 0; t < IRON_SIZE / IRON_TILE_SIZE; t++) {
        for (long r = 0; r < IRON_ROWS; r++) {
            const uint16_t *gate = x + r * 2L * IRON_SIZE;
            const uint16_t *up = gate + IRON_SIZE;
            uint16_t *o = out + r * (long)IRON_SIZE;
            const long end = (t + 1) * IRON_TILE_SIZE;
            long i = t * IRON_TILE_SIZE;
#if defined(__AVX512F__)
            for (; i + 16 <= end; i += 16) {
                const __m512 g = load16_bf16(gate + i), u = load16_bf16(up + i);
                store16_bf16(o + i, _mm512_mul_ps(silu16(g), u));
            }
#endif
            for (; i + 8 <= end; i += 8) {
                __m256 g = iron_load8_bf16(gate + i), u = iron_load8_bf16(up + i);
                iron_store8_bf16(o + i, _mm256_mul_ps(iron_silu8(g), u));
            }
            for (; i < end; i++) {
                float g = iron_bf16_to_f32(gate[i]);
                o[i] = iron_f32_to_bf16(g / (1.0f + expf(-g)) * iron_bf16_to_f32(up[i]));
            }
        }
    }
}
