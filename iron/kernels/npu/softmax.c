/* Softmax core kernel: rows x size bf16 per call, along each row, float32 inside. */
#include <math.h>
#include "iron_npu.h"

void softmax_bf16(const uint16_t *x, uint16_t *out, int32_t rows, int32_t size) {
    for (int32_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + (int64_t)r * size;
        uint16_t *o = out + (int64_t)r * size;
        float m = -INFINITY, sum = 0.0f;
        for (int32_t i = 0; i < size; i++) m = fmaxf(m, bf16_to_f32(xr[i]));
        for (int32_t i = 0; i < size; i++) sum += expf(bf16_to_f32(xr[i]) - m);
        float inv = 1.0f / sum;
        for (int32_t i = 0; i < size; i++) o[i] = f32_to_bf16(expf(bf16_to_f32(xr[i]) - m) * inv);
    }
}
