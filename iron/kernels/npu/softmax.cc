// Softmax core kernel: rows x size bf16 per call (size % IRON_LANES == 0), along each row, as
// mlir-aie's aie_kernels/aie2p/softmax.cc: a vector max and one lane reduction, then
// exp2((x - max) * log2(e)) with the API's exp2 (bf16 results), their float32 sum, and a
// scale by its inverse.
#include "iron_aie.h"

namespace {
constexpr unsigned V = IRON_LANES;
constexpr float kLog2e = 1.44269504088896f;
}  // namespace

extern "C" {

void softmax_bf16(const bfloat16 *x, bfloat16 *out, int32_t rows, int32_t size) {
    for (int32_t r = 0; r < rows; r++) {
        const bfloat16 *xr = x + r * size;
        bfloat16 *o = out + r * size;
        aie::vector<bfloat16, V> m = aie::load_v<V>(xr);
        for (int32_t i = V; i < size; i += V) m = aie::max(m, aie::load_v<V>(xr + i));
        aie::vector<float, V> shift = aie::broadcast<float, V>(float(aie::reduce_max(m)) * kLog2e);
        aie::accum<accfloat, V> sum = aie::zeros<accfloat, V>();
        for (int32_t i = 0; i < size; i += V) {
            aie::vector<float, V> s = aie::mul(aie::load_v<V>(xr + i), kLog2e)
                                          .template to_vector<float>();
            aie::vector<bfloat16, V> e = aie::exp2<bfloat16>(aie::sub(s, shift));
            sum = aie::add(sum, e);
            aie::store_v(o + i, e);
        }
        float inv = aie::inv(aie::reduce_add(sum.template to_vector<float>()));
        for (int32_t i = 0; i < size; i += V)
            aie::store_v(o + i, aie::mul(aie::load_v<V>(o + i), inv)
                                    .template to_vector<bfloat16>());
    }
}

}  // extern "C"
