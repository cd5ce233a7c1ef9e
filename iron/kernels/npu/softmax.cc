// Softmax core kernel: rows x size bf16 per call (size % IRON_LANES == 0), along each row, as
// mlir-aie's aie_kernels/aie2p/softmax.cc: a vector max and one lane reduction, then
// e^(x - max) (iron_exp: the lookup table on AIE2, exp2 on AIE2P; bf16 results), their
// float32 sum, and a scale by its inverse.
#include "iron_aie.h"

namespace {
constexpr unsigned V = IRON_LANES;
}  // namespace

extern "C" {

void softmax_bf16(const bfloat16 *x, bfloat16 *out, int32_t rows, int32_t size) {
    for (int32_t r = 0; r < rows; r++) {
        const bfloat16 *xr = x + r * size;
        bfloat16 *o = out + r * size;
        aie::vector<bfloat16, V> m = aie::load_v<V>(xr);
        for (int32_t i = V; i < size; i += V) m = aie::max(m, aie::load_v<V>(xr + i));
        aie::vector<float, V> shift = aie::broadcast<float, V>(float(aie::reduce_max(m)));
        aie::accum<accfloat, V> sum = aie::zeros<accfloat, V>();
        IRON_PIPELINED IRON_MIN_ITERATIONS(1)
        for (int32_t i = 0; i < size; i += V) {
            aie::vector<bfloat16, V> e = iron_exp(aie::sub(iron_widen(aie::load_v<V>(xr + i)),
                                                           shift));
            sum = aie::add(sum, e);
            aie::store_v(o + i, e);
        }
        float inv = aie::inv(aie::reduce_add(sum.template to_vector<float>()));
        IRON_PIPELINED IRON_MIN_ITERATIONS(1)
        for (int32_t i = 0; i < size; i += V)
            aie::store_v(o + i, aie::mul(iron_widen(aie::load_v<V>(o + i)), inv)
                                    .template to_vector<bfloat16>());
    }
}

}  // extern "C"
