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
//   qmatrix_store: the accumulator rounded once to bf16 into the output tile.
//
// A tile is lane-parallel over its 16 rows and never sums across rows: a 64-byte plane of
// 4-bit codes is a 32-lane int16 vector whose lanes 2i and 2i + 1 are the low and high half of
// row i's word, so one shift and one mask give every row's codes 8j + 2s (even lanes) and
// 8j + 2s + 1 (odd lanes); the block's x codes are widened to int16 (aie::unpack), so the
// matching pair of x codes is one 32-bit word, broadcast to the 32 lanes; an int16 x int16 MAC into 32-bit lanes (exact) sums the block's 16 products, the
// even and odd lanes are added, converted to float and scaled by the block's x scale. Per group
// the 16 rows' d and offset (the minimum, or -zero * d) come as one 16-lane vector each:
// value = d * (u - zero) + m, u the stored unsigned code, so the result is
// d * sum(u x) + (m - zero d) * sum(x). fp16 parameters (q4_0, q4_1, q8_0) are widened exactly
// (bits << 13 times 2^112), bf16 ones (uint4) by a 16-bit shift.
//
// Buffers per vector: xq k int8 codes; dx the k/16 block scales padded to a multiple of 16
// floats, xs the k/group group sums padded likewise, so that both are read as aligned 16-lane
// vectors. k, group multiples of 32; the tile's k a multiple of group.
#include <cfloat>

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

// NIB: 4-bit code sets per 32-value chunk (2: q8_0's low and high nibbles); ZERO: the code
// offset; MIN: a minimum per group follows the scales; BF16: the parameters are bf16.
template <int NIB, int ZERO, bool MIN, bool BF16>
void tile_times(const uint8_t *w, const int8 *xq, const float *dx, const float *xs,
                float *acc, int32_t k, int32_t vectors, int32_t group, int32_t k0,
                int32_t x_k, int32_t accumulate) {
    const int32_t chunks = group / 32;
    const int32_t group_bytes = chunks * NIB * 256 + 2 * QROWS * (1 + MIN);
    const aie::vector<int16, QL> nibble = aie::broadcast<int16, QL>(0xf);
    // q8_0: a lane's two bytes each a whole code: nibbles 0 and 2 (or 1 and 3) of the low
    // plane joined with those of the high plane
    const aie::vector<int16, QL> nibbles = aie::broadcast<int16, QL>(0x0f0f);
    const aie::vector<int16, QL> high = aie::broadcast<int16, QL>(int16(0xf0f0));
    const aie::vector<int16, QL> byte = aie::broadcast<int16, QL>(0xff);
    for (int32_t b = 0; b < vectors; b++) {
        const int8 *xv = xq + b * x_k;
        const float *dxv = dx + b * padded(x_k / QBLOCK);
        const float *xsv = xs + b * padded(x_k / group);
        aie::accum<accfloat, QROWS> y;
        if (accumulate)
            y.from_vector(aie::load_v<QROWS>(acc + b * QROWS));
        else
            y = aie::zeros<accfloat, QROWS>();
        for (int32_t g = 0; g < k / group; g++) {
            const uint8_t *gp = w + g * group_bytes;
            const int32_t gx = k0 + g * group; // the group's first value in x
            aie::accum<accfloat, QROWS> sum = aie::zeros<accfloat, QROWS>();
            for (int32_t c = 0; c < chunks; c++) {
                const uint8_t *cp = gp + c * NIB * 256;
                const int32_t first = (gx + 32 * c) / QBLOCK; // its first block of x
                aie::vector<float, 16> scales = aie::load_v<16>(dxv + first / 16 * 16);
                for (int32_t blk = 0; blk < 2; blk++) { // planes 2 blk, 2 blk + 1
                    aie::vector<int32, 8> pairs =
                        aie::unpack(aie::load_v<QBLOCK>(xv + gx + 32 * c + 16 * blk))
                            .template cast_to<int32>();
                    aie::accum<acc32, QL> dot = aie::zeros<acc32, QL>();
                    for (int32_t p = 0; p < 2; p++) {
                        const int32_t j = 2 * blk + p;
                        aie::vector<int16, QL> lo = aie::load_v<QL>((const int16 *)(cp + 64 * j));
                        aie::vector<int16, QL> u[4]; // codes 8j + 2s (+ 1) of the 16 rows
                        if constexpr (NIB == 1) {
                            for (unsigned s = 0; s < 4; s++)
                                u[s] = aie::bit_and(aie::downshift(lo, 4 * s), nibble);
                        } else { // q8_0: the low and high nibbles of codes s = 0, 2 and 1, 3
                            aie::vector<int16, QL> hi =
                                aie::load_v<QL>((const int16 *)(cp + 256 + 64 * j));
                            aie::vector<int16, QL> even = aie::bit_or(
                                aie::bit_and(lo, nibbles), aie::upshift(aie::bit_and(hi, nibbles), 4));
                            aie::vector<int16, QL> odd = aie::bit_or(
                                aie::bit_and(aie::downshift(lo, 4), nibbles), aie::bit_and(hi, high));
                            u[0] = aie::bit_and(even, byte);
                            u[2] = aie::bit_and(aie::downshift(even, 8), byte);
                            u[1] = aie::bit_and(odd, byte);
                            u[3] = aie::bit_and(aie::downshift(odd, 8), byte);
                        }
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
            const uint8_t *ps = gp + chunks * NIB * 256;
            aie::vector<float, QROWS> d = params<BF16>(ps);
            aie::vector<float, QROWS> bias;
            if constexpr (MIN)
                bias = params<BF16>(ps + 2 * QROWS); // ZERO is 0 with a minimum
            else
                bias = aie::mul(d, -float(ZERO)).template to_vector<float>();
            y = aie::mac(y, sum.template to_vector<float>(), d);
            const int32_t gg = gx / group; // the group's index in x
            y = aie::mac(y, bias, aie::load_v<16>(xsv + gg / 16 * 16).get(gg % 16));
        }
        aie::store_v(acc + b * QROWS, y.template to_vector<float>());
    }
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

}  // extern "C"
