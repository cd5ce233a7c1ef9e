// Quantized matrix core kernels: a block-quantized W (iron.quant's tiled layout, the bytes the
// bundle stores, streamed as they are) times x vectors rounded to int8 codes per 16 values,
// in the scheme of the cpu kernels (iron/kernels/cpu/qmatmul.h), so that a row's result is
// the cpu's up to the order of float additions:
//
//   qmatrix_quantize: x (bf16) -> per value an int8 code, per block of
//     16 its scale max|x| / 127, per group the sum of the values the codes give back;
//     code = round-half-even(x * (127 / max|x|)) (iron.quant.activation_values);
//   qmatrix_<fmt>: one 16-row tile of W (k values from value k0 of its rows: whole groups)
//     times the quantized vectors into a float32 accumulator (vectors x 16 rows);
//   qmatrix_store: the accumulator rounded once to bf16 into the output tile (qmatrix_store_f32:
//     stored as float32, a model's logits).
//
// A tile is lane-parallel over its 16 rows and never sums across rows: a 64-byte plane of
// 4-bit codes is a 32-lane int16 vector whose lanes 2i and 2i + 1 are the low and high half of
// row i's word, so one shift and one mask give every row's codes 8j + 2s (even lanes) and
// 8j + 2s + 1 (odd lanes); the block's x codes are widened to int16 (aie::unpack), so the
// matching pair of x codes is one 32-bit word, broadcast to the 32 lanes; an int16 x int16 MAC
// into 32-bit lanes (exact) sums the block's 16 products, the
// even and odd lanes are added, converted to float and scaled by the block's x scale. Per group
// the 16 rows' d and offset (the minimum, or -zero * d) come as one 16-lane vector each:
// value = d * (u - zero) + m, u the stored unsigned code, so the result is
// d * sum(u x) + (m - zero d) * sum(x). fp16 parameters (q4_0, q4_1, q8_0) are widened exactly
// (bits << 13 times 2^112), bf16 ones (uint4) by a 16-bit shift.
//
// Four or more vectors at a time take the architecture's MMUL instead of the int16 lane MACs
// (vectors_times: AIE2 4x16x8 int8 x int4, q8_0 int8 x int8; AIE2P 8x8x8 int8): the codes,
// less 8 (q8_0: 128) so that they are int4 (int8), become its B operand, the vectors' x codes
// its A, and 8 (128) times the block's x code sum is added back: the same integer sums, then
// the same float steps in the same order, so each vector's result is the one-vector result bit
// for bit.
//
// Buffers per vector: xq k int8 codes; dx the k/16 block scales padded to a multiple of 16
// floats, xs the k/group group sums padded likewise, so that both are read as aligned 16-lane
// vectors. k, group multiples of 32; the tile's k a multiple of group.
#include <cfloat>
#include <type_traits>

#include "iron_aie.h"

namespace {
constexpr unsigned QL = 32;    // int16 lanes of a code vector: 16 rows x a pair of values
constexpr unsigned QROWS = 16; // rows of a tile of the layout (iron.quant.TILE)
constexpr int32_t QBLOCK = 16; // values of x per int8 scale (iron.quant.ACTIVATION_BLOCK)
constexpr float MAGIC = 12582912.0f;   // 1.5 * 2^23: x + MAGIC - MAGIC rounds half to even
constexpr float FP16_TO_F32 = 5.192296858534828e33f; // 2^112

int32_t padded(int32_t n) { return (n + 15) / 16 * 16; }

// 16 parameters (d or m of the tile's 16 rows) as float32.
template <bool BF16>
aie::vector<float, QROWS> params(const uint8_t *p) {
    aie::vector<int16, QROWS> h = aie::load_v<QROWS>((const int16 *)p);
    aie::accum<acc32, QROWS> wide;
    wide.from_vector(h);
    aie::vector<int32, QROWS> w = wide.template to_vector<int32>();
    if constexpr (BF16) return aie::upshift(w, 16).template cast_to<float>();
    aie::vector<int32, QROWS> mag = aie::upshift(
        aie::bit_and(w, aie::broadcast<int32, QROWS>(0x7fff)), 13);
    aie::vector<int32, QROWS> sign = aie::upshift(
        aie::bit_and(w, aie::broadcast<int32, QROWS>(0x8000)), 16);
    aie::vector<float, QROWS> f =
        aie::mul(mag.template cast_to<float>(), FP16_TO_F32).template to_vector<float>();
    return aie::bit_or(f.template cast_to<int32>(), sign).template cast_to<float>();
}

// The 16 rows' codes of plane j of a 32-value chunk at cp: u[s] holds codes 8j + 2s (even
// lanes) and 8j + 2s + 1 (odd lanes) of row i in lanes 2i, 2i + 1.  NIB: 4-bit code sets per
// chunk (2: q8_0's low and high nibbles, joined into 8-bit codes).
template <int NIB>
void plane_codes(const uint8_t *cp, int32_t j, aie::vector<int16, QL> *u) {
    const aie::vector<int16, QL> nibble = aie::broadcast<int16, QL>(0xf);
    aie::vector<int16, QL> lo = aie::load_v<QL>((const int16 *)(cp + 64 * j));
    if constexpr (NIB == 1) {
        for (unsigned s = 0; s < 4; s++) u[s] = aie::bit_and(aie::downshift(lo, 4 * s), nibble);
    } else {  // q8_0: the low and high nibbles of codes s = 0, 2 and 1, 3
        // a lane's two bytes each a whole code: nibbles 0 and 2 (or 1 and 3) of the low
        // plane joined with those of the high plane
        const aie::vector<int16, QL> nibbles = aie::broadcast<int16, QL>(0x0f0f);
        const aie::vector<int16, QL> high = aie::broadcast<int16, QL>(int16(0xf0f0));
        const aie::vector<int16, QL> byte = aie::broadcast<int16, QL>(0xff);
        aie::vector<int16, QL> hi = aie::load_v<QL>((const int16 *)(cp + 256 + 64 * j));
        aie::vector<int16, QL> even = aie::bit_or(aie::bit_and(lo, nibbles),
                                                  aie::upshift(aie::bit_and(hi, nibbles), 4));
        aie::vector<int16, QL> odd = aie::bit_or(aie::bit_and(aie::downshift(lo, 4), nibbles),
                                                 aie::bit_and(hi, high));
        u[0] = aie::bit_and(even, byte);
        u[2] = aie::bit_and(aie::downshift(even, 8), byte);
        u[1] = aie::bit_and(odd, byte);
        u[3] = aie::bit_and(aie::downshift(odd, 8), byte);
    }
}

// The group's parameters: d of the 16 rows and the offset (the minimum, or -zero * d).
template <int ZERO, bool MIN, bool BF16>
void group_params(const uint8_t *ps, aie::vector<float, QROWS> &d,
                  aie::vector<float, QROWS> &bias) {
    d = params<BF16>(ps);
    if constexpr (MIN)
        bias = params<BF16>(ps + 2 * QROWS);  // ZERO is 0 with a minimum
    else
        bias = aie::mul(d, -float(ZERO)).template to_vector<float>();
}

// One 16-row tile times one vector, lane-parallel over the rows (see the top of the file).
template <int NIB, int ZERO, bool MIN, bool BF16>
void vector_times(const uint8_t *w, const int8 *xv, const float *dxv, const float *xsv,
                  float *out, int32_t k, int32_t group, int32_t k0, int32_t accumulate) {
    const int32_t chunks = group / 32;
    const int32_t group_bytes = chunks * NIB * 256 + 2 * QROWS * (1 + MIN);
    aie::accum<accfloat, QROWS> y;
    if (accumulate)
        y.from_vector(aie::load_v<QROWS>(out));
    else
        y = aie::zeros<accfloat, QROWS>();
    for (int32_t g = 0; g < k / group; g++) {
        const uint8_t *gp = w + g * group_bytes;
        const int32_t gx = k0 + g * group;  // the group's first value in x
        aie::accum<accfloat, QROWS> sum = aie::zeros<accfloat, QROWS>();
        for (int32_t c = 0; c < chunks; c++) {
            const uint8_t *cp = gp + c * NIB * 256;
            const int32_t first = (gx + 32 * c) / QBLOCK;  // its first block of x
            aie::vector<float, 16> scales = aie::load_v<16>(dxv + first / 16 * 16);
            for (int32_t blk = 0; blk < 2; blk++) {  // planes 2 blk, 2 blk + 1
                aie::vector<int32, 8> pairs =
                    aie::unpack(aie::load_v<QBLOCK>(xv + gx + 32 * c + 16 * blk))
                        .template cast_to<int32>();
                aie::accum<acc32, QL> dot = aie::zeros<acc32, QL>();
                for (int32_t p = 0; p < 2; p++) {
                    aie::vector<int16, QL> u[4];  // codes 8j + 2s (+ 1) of the 16 rows
                    plane_codes<NIB>(cp, 2 * blk + p, u);
                    for (unsigned s = 0; s < 4; s++) {
                        aie::vector<int16, QL> x2 =
                            aie::broadcast<int32, QROWS>(pairs.get(4 * p + s))
                                .template cast_to<int16>();
                        dot = aie::mac(dot, u[s], x2);
                    }
                }
                aie::vector<int32, QL> d32 = dot.template to_vector<int32>();
                aie::vector<int32, QROWS> rows =
                    aie::add(aie::filter_even(d32, 1), aie::filter_odd(d32, 1));
                sum = aie::mac(sum, aie::to_float<float>(rows), scales.get((first + blk) % 16));
            }
        }
        aie::vector<float, QROWS> d, bias;
        group_params<ZERO, MIN, BF16>(gp + chunks * NIB * 256, d, bias);
        y = aie::mac(y, sum.template to_vector<float>(), d);
        const int32_t gg = gx / group;  // the group's index in x
        y = aie::mac(y, bias, aie::load_v<16>(xsv + gg / 16 * 16).get(gg % 16));
    }
    aie::store_v(out, y.template to_vector<float>());
}

// The MMUL of the quantized kernels: int8 x codes (MM vectors x MK values) times the weights'
// codes (MK values x MN rows) into exact 32-bit sums.  AIE2: 4x16x8, one activation block per
// MMUL, int8 x int4 for 4-bit codes and int8 x int8 for q8_0's (AIE-ML shapes of UG1529's
// 8b x 4b and 8b x 8b tables); AIE2P: int8 x int8 8x8x8, mlir-aie's aie_kernels/aie2p/mm.cc
// int8 shape, two per block.  The codes are the weights' unsigned codes less OFF (8, or q8_0's
// 128), so that they are int4 (int8); OFF times the block's x code sum is added back, which
// gives the lane path's integer sums exactly.
constexpr unsigned QMM_AIE2[3] = {4, 16, 8}, QMM_AIE2P[3] = {8, 8, 8};
constexpr unsigned MM = IRON_AIE_ARCH == 20 ? QMM_AIE2[0] : QMM_AIE2P[0];
constexpr unsigned MK = IRON_AIE_ARCH == 20 ? QMM_AIE2[1] : QMM_AIE2P[1];
constexpr unsigned MN = IRON_AIE_ARCH == 20 ? QMM_AIE2[2] : QMM_AIE2P[2];
constexpr int32_t QMMUL_MIN_VECTORS = 4;  // fewer vectors take the lane path
// The element type of the codes in the MMUL: int4 for 4-bit codes on AIE2, else int8.
template <int NIB>
struct QCode {
    using type = int8;
};
#if IRON_AIE_ARCH == 20
template <>
struct QCode<1> {
    using type = int4;
};
#endif
template <int NIB>
using QMMUL = aie::mmul<MM, MK, MN, int8, typename QCode<NIB>::type, acc32>;

// B as the MMUL's code type: narrowed to int4 where the codes are 4-bit on AIE2.
template <int NIB>
aie::vector<typename QCode<NIB>::type, MK * MN> as_codes(const aie::vector<int8, MK * MN> &b) {
    if constexpr (std::is_same<typename QCode<NIB>::type, int8>::value)
        return b;
    else
        return aie::pack(b);
}

// B rows (values) k0 .. k0 + MK of one block, for tile rows half * MN .. + MN, as int8 codes
// less off, from the block's two planes of codes (u[p][s], plane p).
aie::vector<int8, MK * MN> block_codes(const aie::vector<int16, QL> (*u)[4], int32_t k0,
                                       int32_t half, int16 off) {
    const aie::vector<int16, 16> less = aie::broadcast<int16, 16>(off);
    aie::vector<int8, 16> pieces[MK / 2];  // B rows k, k + 1: codes 8p + 2s and 8p + 2s + 1
    for (unsigned q = 0; q < MK / 2; q++) {
        const unsigned k = k0 + 2 * q, p = k / 8, s = (k % 8) / 2;
        aie::vector<int16, 16> pair = aie::concat(
            aie::filter_even(u[p][s], 1).template extract<8>(half),
            aie::filter_odd(u[p][s], 1).template extract<8>(half));
        pieces[q] = aie::pack(aie::sub(pair, less));
    }
#if IRON_AIE_ARCH == 20
    return aie::concat(pieces[0], pieces[1], pieces[2], pieces[3], pieces[4], pieces[5],
                       pieces[6], pieces[7]);
#else
    return aie::concat(pieces[0], pieces[1], pieces[2], pieces[3]);
#endif
}

// x codes of values v0 .. v0 + MK of the block for n vectors (missing ones zero), MM x MK.
aie::vector<int8, MM * MK> block_x(const int8 *const *xv, int32_t n, int32_t at, int32_t v0) {
    aie::vector<int8, 16> half[MM];  // rows' 16 codes; MK 8: two rows' halves per 16 lanes
    for (unsigned b = 0; b < MM; b++)
        half[b] = int32_t(b) < n ? aie::load_v<QBLOCK>(xv[b] + at) : aie::zeros<int8, 16>();
#if IRON_AIE_ARCH == 20
    (void)v0;  // one MMUL takes the whole block
    return aie::concat(half[0], half[1], half[2], half[3]);
#else
    aie::vector<int8, 16> two[MM / 2];  // rows 2r, 2r + 1: their values v0 .. v0 + 8
    for (unsigned r = 0; r < MM / 2; r++) {
        aie::vector<int8, 32> rows = aie::concat(half[2 * r], half[2 * r + 1]);
        two[r] = v0 == 0 ? aie::filter_even(rows, 8) : aie::filter_odd(rows, 8);
    }
    return aie::concat(two[0], two[1], two[2], two[3]);
#endif
}

// One 16-row tile times n (QMMUL_MIN_VECTORS .. MM) vectors through the MMUL: the same integer
// sums and float steps, in the same order, as vector_times per vector.
template <int NIB, int ZERO, bool MIN, bool BF16>
void vectors_times(const uint8_t *w, const int8 *const *xv, const float *const *dxv,
                   const float *const *xsv, float *const *out, int32_t n, int32_t k,
                   int32_t group, int32_t k0, int32_t accumulate) {
    const int32_t chunks = group / 32;
    const int32_t group_bytes = chunks * NIB * 256 + 2 * QROWS * (1 + MIN);
    const int16 off = NIB == 1 ? 8 : 128;
    aie::accum<accfloat, QROWS> y[MM];
    for (int32_t b = 0; b < n; b++) {
        if (accumulate)
            y[b].from_vector(aie::load_v<QROWS>(out[b]));
        else
            y[b] = aie::zeros<accfloat, QROWS>();
    }
    for (int32_t g = 0; g < k / group; g++) {
        const uint8_t *gp = w + g * group_bytes;
        const int32_t gx = k0 + g * group;
        aie::accum<accfloat, QROWS> sum[MM];
        for (int32_t b = 0; b < n; b++) sum[b] = aie::zeros<accfloat, QROWS>();
        for (int32_t c = 0; c < chunks; c++) {
            const uint8_t *cp = gp + c * NIB * 256;
            const int32_t first = (gx + 32 * c) / QBLOCK;
            for (int32_t blk = 0; blk < 2; blk++) {
                const int32_t at = gx + 32 * c + 16 * blk;
                aie::vector<int16, QL> u[2][4];
                for (int32_t p = 0; p < 2; p++) plane_codes<NIB>(cp, 2 * blk + p, u[p]);
                QMMUL<NIB> lo, hi;  // tile rows 0..7 and 8..15
                for (unsigned v0 = 0; v0 < QBLOCK; v0 += MK) {
                    aie::vector<int8, MM * MK> a = block_x(xv, n, at, v0);
                    lo.mac(a, as_codes<NIB>(block_codes(u, v0, 0, off)));
                    hi.mac(a, as_codes<NIB>(block_codes(u, v0, 1, off)));
                }
                for (int32_t b = 0; b < n; b++) {
                    const int32_t xsum = int32_t(aie::reduce_add(
                        aie::unpack(aie::load_v<QBLOCK>(xv[b] + at))));
                    aie::vector<int32, QROWS> rows = aie::add(
                        aie::concat(lo.to_accum().template extract<MN>(b)
                                        .template to_vector<int32>(),
                                    hi.to_accum().template extract<MN>(b)
                                        .template to_vector<int32>()),
                        aie::broadcast<int32, QROWS>(off * xsum));
                    aie::vector<float, 16> scales = aie::load_v<16>(dxv[b] + first / 16 * 16);
                    sum[b] = aie::mac(sum[b], aie::to_float<float>(rows),
                                      scales.get((first + blk) % 16));
                }
            }
        }
        aie::vector<float, QROWS> d, bias;
        group_params<ZERO, MIN, BF16>(gp + chunks * NIB * 256, d, bias);
        const int32_t gg = gx / group;
        for (int32_t b = 0; b < n; b++) {
            y[b] = aie::mac(y[b], sum[b].template to_vector<float>(), d);
            y[b] = aie::mac(y[b], bias, aie::load_v<16>(xsv[b] + gg / 16 * 16).get(gg % 16));
        }
    }
    for (int32_t b = 0; b < n; b++) aie::store_v(out[b], y[b].template to_vector<float>());
}

// The tile times `vectors` vectors: groups of up to MM (at least QMMUL_MIN_VECTORS) through
// the MMUL, the rest one at a time.
template <int NIB, int ZERO, bool MIN, bool BF16>
void tile_times(const uint8_t *w, const int8 *xq, const float *dx, const float *xs,
                float *acc, int32_t k, int32_t vectors, int32_t group, int32_t k0,
                int32_t x_k, int32_t accumulate) {
    int32_t b = 0;
    while (vectors - b >= QMMUL_MIN_VECTORS) {
        const int32_t n = vectors - b < int32_t(MM) ? vectors - b : int32_t(MM);
        const int8 *xv[MM];
        const float *dxv[MM], *xsv[MM];
        float *out[MM];
        for (int32_t i = 0; i < n; i++) {
            xv[i] = xq + (b + i) * x_k;
            dxv[i] = dx + (b + i) * padded(x_k / QBLOCK);
            xsv[i] = xs + (b + i) * padded(x_k / group);
            out[i] = acc + (b + i) * QROWS;
        }
        vectors_times<NIB, ZERO, MIN, BF16>(w, xv, dxv, xsv, out, n, k, group, k0, accumulate);
        b += n;
    }
    for (; b < vectors; b++)
        vector_times<NIB, ZERO, MIN, BF16>(w, xq + b * x_k, dx + b * padded(x_k / QBLOCK),
                                           xs + b * padded(x_k / group), acc + b * QROWS, k,
                                           group, k0, accumulate);
}

}  // namespace

extern "C" {

void qmatrix_quantize(const bfloat16 *x, int8 *xq, float *dx, float *xs, int32_t k,
                      int32_t vectors, int32_t group, int32_t first) {
    const aie::vector<float, QBLOCK> magic = aie::broadcast<float, QBLOCK>(MAGIC);
    for (int32_t b = 0; b < vectors; b++) {
        const bfloat16 *xb = x + b * k;
        int8 *q = xq + (first + b) * k;
        float *d = dx + (first + b) * padded(k / QBLOCK);
        float *s = xs + (first + b) * padded(k / group);
        for (int32_t i = 0; i < k / QBLOCK; i += 16) {
            aie::vector<float, 16> scales = aie::zeros<float, 16>();
            for (int32_t j = i; j < i + 16 && j < k / QBLOCK; j++) {
                aie::vector<bfloat16, QBLOCK> v = aie::load_v<QBLOCK>(xb + j * QBLOCK);
                const float amax = float(aie::reduce_max(aie::abs(v)));
                const float over = 127.0f / amax;
                scales.set(amax / 127.0f, j - i);
                const float factor = over <= FLT_MAX ? over : 0.0f;
                aie::vector<float, QBLOCK> t =
                    aie::mul(iron_widen(v), factor).template to_vector<float>();
                aie::store_v(q + j * QBLOCK, aie::pack(aie::to_fixed<int16>(
                                                 aie::sub(aie::add(t, magic), magic), 0)));
            }
            aie::store_v(d + i, scales);
        }
        for (int32_t g0 = 0; g0 < k / group; g0 += 16) {
            aie::vector<float, 16> sums = aie::zeros<float, 16>();
            for (int32_t g = g0; g < g0 + 16 && g < k / group; g++) {
                float total = 0.0f;
                for (int32_t c = g * group; c < (g + 1) * group; c += 32) { // as qmatmul.h
                    float chunk = 0.0f;
                    for (int32_t h = c; h < c + 32; h += QBLOCK) {
                        aie::vector<float, 16> sc = aie::load_v<16>(d + h / QBLOCK / 16 * 16);
                        chunk += float(aie::reduce_add(aie::unpack(aie::load_v<QBLOCK>(q + h)))) *
                                 sc.get(h / QBLOCK % 16);
                    }
                    total += chunk;
                }
                sums.set(total, g - g0);
            }
            aie::store_v(s + g0, sums);
        }
    }
}

void qmatrix_q4_0(const uint8_t *w, const int8 *xq, const float *dx, const float *xs,
                  float *acc, int32_t k, int32_t vectors, int32_t group, int32_t k0,
                  int32_t x_k, int32_t accumulate) {
    tile_times<1, 8, false, false>(w, xq, dx, xs, acc, k, vectors, group, k0, x_k, accumulate);
}

void qmatrix_q4_1(const uint8_t *w, const int8 *xq, const float *dx, const float *xs,
                  float *acc, int32_t k, int32_t vectors, int32_t group, int32_t k0,
                  int32_t x_k, int32_t accumulate) {
    tile_times<1, 0, true, false>(w, xq, dx, xs, acc, k, vectors, group, k0, x_k, accumulate);
}

void qmatrix_q8_0(const uint8_t *w, const int8 *xq, const float *dx, const float *xs,
                  float *acc, int32_t k, int32_t vectors, int32_t group, int32_t k0,
                  int32_t x_k, int32_t accumulate) {
    tile_times<2, 128, false, false>(w, xq, dx, xs, acc, k, vectors, group, k0, x_k,
                                     accumulate);
}

void qmatrix_uint4(const uint8_t *w, const int8 *xq, const float *dx, const float *xs,
                   float *acc, int32_t k, int32_t vectors, int32_t group, int32_t k0,
                   int32_t x_k, int32_t accumulate) {
    tile_times<1, 0, true, true>(w, xq, dx, xs, acc, k, vectors, group, k0, x_k, accumulate);
}

void qmatrix_store(const float *acc, bfloat16 *y, int32_t vectors, int32_t y_cols,
                   int32_t row_offset) {
    for (int32_t b = 0; b < vectors; b++) {
        aie::accum<accfloat, QROWS> t;
        t.from_vector(aie::load_v<QROWS>(acc + b * QROWS));
        aie::store_v(y + b * y_cols + row_offset, t.template to_vector<bfloat16>());
    }
}

void qmatrix_store_f32(const float *acc, float *y, int32_t vectors, int32_t y_cols,
                       int32_t row_offset) {
    for (int32_t b = 0; b < vectors; b++)
        aie::store_v(y + b * y_cols + row_offset, aie::load_v<QROWS>(acc + b * QROWS));
}

}  // extern "C"
