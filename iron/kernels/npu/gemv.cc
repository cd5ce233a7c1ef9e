// GEMV core kernel: rows of W (rows x K) times each of `batches` vectors x (batches x K),
// K % IRON_LANES == 0; results land in y (batches x y_cols) at column row_offset.. (the output
// tile is y_cols wide).  Each dot product is a float32 vector MAC over IRON_LANES bf16 lanes
// and one lane reduction, rounded once to bf16 (gemv_bf16) or stored as the float32 sum
// (gemv_bf16_f32: a model's logits, where bf16's 8 significant bits make the likeliest
// tokens tie).
#include "iron_aie.h"

namespace {
constexpr unsigned V = IRON_LANES;

template <typename Out>
void gemv(const bfloat16 *w, const bfloat16 *x, Out *y, int32_t rows, int32_t k,
          int32_t batches, int32_t y_cols, int32_t row_offset) {
    for (int32_t b = 0; b < batches; b++) {
        const bfloat16 *xb = x + b * k;
        for (int32_t r = 0; r < rows; r++) {
            const bfloat16 *wr = w + r * k;
            aie::accum<accfloat, V> acc = aie::zeros<accfloat, V>();
            for (int32_t i = 0; i < k; i += V)
                acc = aie::mac(acc, aie::load_v<V>(wr + i), aie::load_v<V>(xb + i));
            float dot = aie::reduce_add(acc.template to_vector<float>());
            y[b * y_cols + row_offset + r] = Out(dot);
        }
    }
}
}  // namespace

extern "C" {

void gemv_bf16(const bfloat16 *w, const bfloat16 *x, bfloat16 *y, int32_t rows, int32_t k,
               int32_t batches, int32_t y_cols, int32_t row_offset) {
    gemv(w, x, y, rows, k, batches, y_cols, row_offset);
}

void gemv_bf16_f32(const bfloat16 *w, const bfloat16 *x, float *y, int32_t rows, int32_t k,
                   int32_t batches, int32_t y_cols, int32_t row_offset) {
    gemv(w, x, y, rows, k, batches, y_cols, row_offset);
}

}  // extern "C"
