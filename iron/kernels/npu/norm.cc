// RMSNorm core kernels: rows x size bf16 per call (size % IRON_LANES == 0),
// out = x / sqrt(mean(x^2) + eps) [* w], as mlir-aie's aie_kernels/aie2p/rms_norm.cc: squares
// accumulated a vector at a time in float32, one lane reduction, the API's invsqrt, then a
// vector scale (and weight) per step with one rounding to bf16.
#include "iron_aie.h"

namespace {
constexpr unsigned V = IRON_LANES;

void rmsnorm_rows(const bfloat16 *x, const bfloat16 *w, bfloat16 *out, int32_t rows,
                  int32_t size, float eps) {
    for (int32_t r = 0; r < rows; r++) {
        const bfloat16 *xr = x + r * size;
        bfloat16 *o = out + r * size;
        aie::accum<accfloat, V> ss = aie::zeros<accfloat, V>();
        IRON_PIPELINED IRON_MIN_ITERATIONS(1)
        for (int32_t i = 0; i < size; i += V) {
            aie::vector<bfloat16, V> v = aie::load_v<V>(xr + i);
            ss = aie::mac(ss, v, v);
        }
        float mean = aie::reduce_add(ss.template to_vector<float>()) / (float)size;
        float scale = aie::invsqrt(mean + eps);
        IRON_PIPELINED IRON_MIN_ITERATIONS(1)
        for (int32_t i = 0; i < size; i += V) {
            aie::accum<accfloat, V> y = aie::mul(iron_widen(aie::load_v<V>(xr + i)), scale);
            if (w) y = aie::mul(y.template to_vector<float>(), iron_widen(aie::load_v<V>(w + i)));
            aie::store_v(o + i, y.template to_vector<bfloat16>());
        }
    }
}
}  // namespace

extern "C" {

void rmsnorm_bf16(const bfloat16 *x, bfloat16 *out, int32_t rows, int32_t size, float eps) {
    rmsnorm_rows(x, nullptr, out, rows, size, eps);
}

void rmsnorm_weighted_bf16(const bfloat16 *x, const bfloat16 *w, bfloat16 *out, int32_t rows,
                           int32_t size, float eps) {
    rmsnorm_rows(x, w, out, rows, size, eps);
}

}  // extern "C"
