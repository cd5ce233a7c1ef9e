/* GEMV core kernel: rows of W (rows x K) times each of `batches` vectors x (batches x K);
 * results land in y (batches x y_cols) at column row_offset.. (the output tile is y_cols wide).
 * LANES partial sums per dot product, as a vector MAC keeps them.
 */
#include "iron_npu.h"

#define LANES 8

void gemv_bf16(const uint16_t *w, const uint16_t *x, uint16_t *y, int32_t rows, int32_t k,
               int32_t batches, int32_t y_cols, int32_t row_offset) {
    for (int32_t b = 0; b < batches; b++) {
        const uint16_t *xb = x + (int64_t)b * k;
        for (int32_t r = 0; r < rows; r++) {
            const uint16_t *wr = w + (int64_t)r * k;
            float s[LANES] = {0};
            int32_t i = 0;
            for (; i + LANES <= k; i += LANES)
                for (int32_t l = 0; l < LANES; l++)
                    s[l] += bf16_to_f32(wr[i + l]) * bf16_to_f32(xb[i + l]);
            float acc = 0.0f;
            for (; i < k; i++) acc += bf16_to_f32(wr[i]) * bf16_to_f32(xb[i]);
            for (int32_t l = 0; l < LANES; l++) acc += s[l];
            y[(int64_t)b * y_cols + row_offset + r] = f32_to_bf16(acc);
        }
    }
}
