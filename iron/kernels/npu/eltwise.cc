// Element-wise core kernels: one FIFO element of n bf16 values per call (n % IRON_LANES == 0).
//   add: c = a + b; mul: c = a * b; axpy: c = factor * a + b; silu: c = a * sigmoid(a);
//   swiglu: out = silu(gate) * up.
// One vector of IRON_LANES bf16 per step, as mlir-aie's aie_kernels/aie2/add.cc and mul.cc;
// products and sums in float32 accumulators, one rounding to bf16 per output.  SiLU is
// x / (1 + e^-x) with iron_exp (the lookup table on AIE2, the API's exp2 on AIE2P; bf16
// results) and the API's inverse: the tanh form of aie_kernels/aie2p/silu.cc,
// x (1 + tanh(x / 2)) / 2, loses every digit of a negative x's result in 1 + tanh when tanh
// is rounded to bf16.
#include "iron_aie.h"

namespace {
constexpr unsigned V = IRON_LANES;

// sigmoid(x) = 1 / (1 + e^-x), in float32 but for the exponential's bf16 result
aie::vector<float, V> sigmoid(const aie::vector<float, V> &x) {
    aie::vector<float, V> minus = aie::mul(x, -1.0f).template to_vector<float>();
    aie::accum<accfloat, V> one_plus = aie::add(aie::zeros<accfloat, V>(), iron_exp(minus));
    one_plus = aie::add(one_plus, aie::broadcast<float, V>(1.0f));
    return aie::inv(one_plus.template to_vector<float>());
}
}  // namespace

extern "C" {

void add_bf16(const bfloat16 *a, const bfloat16 *b, bfloat16 *c, int32_t n) {
    IRON_PIPELINED IRON_MIN_ITERATIONS(1)
    for (int32_t i = 0; i < n; i += V)
        aie::store_v(c + i, aie::add(aie::load_v<V>(a + i), aie::load_v<V>(b + i)));
}

void mul_bf16(const bfloat16 *a, const bfloat16 *b, bfloat16 *c, int32_t n) {
    IRON_PIPELINED IRON_MIN_ITERATIONS(1)
    for (int32_t i = 0; i < n; i += V)
        aie::store_v(c + i, aie::mul(aie::load_v<V>(a + i), aie::load_v<V>(b + i))
                                .template to_vector<bfloat16>());
}

void axpy_bf16(const bfloat16 *a, const bfloat16 *b, bfloat16 *c, int32_t n, float factor) {
    IRON_PIPELINED IRON_MIN_ITERATIONS(1)
    for (int32_t i = 0; i < n; i += V) {
        aie::accum<accfloat, V> acc = aie::mul(iron_widen(aie::load_v<V>(a + i)), factor);
        acc = aie::add(acc, aie::load_v<V>(b + i));
        aie::store_v(c + i, acc.template to_vector<bfloat16>());
    }
}

void silu_bf16(const bfloat16 *a, bfloat16 *c, int32_t n) {
    IRON_PIPELINED IRON_MIN_ITERATIONS(1)
    for (int32_t i = 0; i < n; i += V) {
        aie::vector<float, V> x = iron_widen(aie::load_v<V>(a + i));
        aie::store_v(c + i, aie::mul(x, sigmoid(x)).template to_vector<bfloat16>());
    }
}

void swiglu_bf16(const bfloat16 *gate, const bfloat16 *up, bfloat16 *out, int32_t n) {
    IRON_PIPELINED IRON_MIN_ITERATIONS(1)
    for (int32_t i = 0; i < n; i += V) {
        aie::vector<float, V> g = iron_widen(aie::load_v<V>(gate + i));
        aie::vector<float, V> s = aie::mul(g, sigmoid(g)).template to_vector<float>();
        aie::vector<float, V> u = iron_widen(aie::load_v<V>(up + i));
        aie::store_v(out + i, aie::mul(s, u).template to_vector<bfloat16>());
    }
}

}  // extern "C"
