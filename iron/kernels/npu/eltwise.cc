// Element-wise core kernels: one FIFO element of n bf16 values per call (n % IRON_LANES == 0).
//   add: c = a + b; mul: c = a * b; axpy: c = factor * a + b; silu: c = a * sigmoid(a);
//   swiglu: out = silu(gate) * up.
// One vector of IRON_LANES bf16 per step, as mlir-aie's aie_kernels/aie2/add.cc and mul.cc;
// products and sums in float32 accumulators, one rounding to bf16 per output.  SiLU is
// x / (1 + 2^(-x log2 e)) with the API's exp2 (bf16 results, as aie_kernels/aie2p/softmax.cc
// uses it) and inverse: the tanh form of aie_kernels/aie2p/silu.cc, x (1 + tanh(x / 2)) / 2,
// loses every digit of a negative x's result in 1 + tanh when tanh is rounded to bf16.
#include "iron_aie.h"

namespace {
constexpr unsigned V = IRON_LANES;

aie::vector<float, V> widen(const aie::vector<bfloat16, V> &x) {
    aie::accum<accfloat, V> acc;
    acc.from_vector(x);
    return acc.template to_vector<float>();
}

constexpr float kMinusLog2e = -1.44269504088896f;

// sigmoid(x) = 1 / (1 + 2^(-x log2 e)), in float32 but for the exp2's bf16 result
aie::vector<float, V> sigmoid(const aie::vector<float, V> &x) {
    aie::vector<float, V> s = aie::mul(x, kMinusLog2e).template to_vector<float>();
    aie::accum<accfloat, V> one_plus = aie::add(aie::zeros<accfloat, V>(), aie::exp2<bfloat16>(s));
    one_plus = aie::add(one_plus, aie::broadcast<float, V>(1.0f));
    return aie::inv(one_plus.template to_vector<float>());
}
}  // namespace

extern "C" {

void add_bf16(const bfloat16 *a, const bfloat16 *b, bfloat16 *c, int32_t n) {
    for (int32_t i = 0; i < n; i += V)
        aie::store_v(c + i, aie::add(aie::load_v<V>(a + i), aie::load_v<V>(b + i)));
}

void mul_bf16(const bfloat16 *a, const bfloat16 *b, bfloat16 *c, int32_t n) {
    for (int32_t i = 0; i < n; i += V)
        aie::store_v(c + i, aie::mul(aie::load_v<V>(a + i), aie::load_v<V>(b + i))
                                .template to_vector<bfloat16>());
}

void axpy_bf16(const bfloat16 *a, const bfloat16 *b, bfloat16 *c, int32_t n, float factor) {
    for (int32_t i = 0; i < n; i += V) {
        aie::accum<accfloat, V> acc = aie::mul(widen(aie::load_v<V>(a + i)), factor);
        acc = aie::add(acc, aie::load_v<V>(b + i));
        aie::store_v(c + i, acc.template to_vector<bfloat16>());
    }
}

void silu_bf16(const bfloat16 *a, bfloat16 *c, int32_t n) {
    for (int32_t i = 0; i < n; i += V) {
        aie::vector<float, V> x = widen(aie::load_v<V>(a + i));
        aie::store_v(c + i, aie::mul(x, sigmoid(x)).template to_vector<bfloat16>());
    }
}

void swiglu_bf16(const bfloat16 *gate, const bfloat16 *up, bfloat16 *out, int32_t n) {
    for (int32_t i = 0; i < n; i += V) {
        aie::vector<float, V> g = widen(aie::load_v<V>(gate + i));
        aie::vector<float, V> s = aie::mul(g, sigmoid(g)).template to_vector<float>();
        aie::store_v(out + i, aie::mul(s, aie::load_v<V>(up + i)).template to_vector<bfloat16>());
    }
}

}  // extern "C"
