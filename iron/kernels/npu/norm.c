/* RMSNorm core kernels: rows x size bf16 per call, out = x / sqrt(mean(x^2) + eps) [* w]. */
#include <math.h>
#include "iron_npu.h"

static void rmsnorm_rows(const uint16_t *x, const uint16_t *w, uint16_t *out, int32_t rows,
                         int32_t size, float eps) {
    for (int32_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + (int64_t)r * size;
        uint16_t *o = out + (int64_t)r * size;
        float ss = 0.0f;
        for (int32_t i = 0; i < size; i++) {
            float v = bf16_to_f32(xr[i]);
            ss += v * v;
        }
        float scale = 1.0f / sqrtf(ss / (float)size + eps);
        for (int32_t i = 0; i < size; i++) {
            float v = bf16_to_f32(xr[i]) * scale;
            o[i] = f32_to_bf16(w ? v * bf16_to_f32(w[i]) : v);
        }
    }
}

void rmsnorm_bf16(const uint16_t *x, uint16_t *out, int32_t rows, int32_t size, float eps) {
    rmsnorm_rows(x, 0, out, rows, size, eps);
}

void rmsnorm_weighted_bf16(const uint16_t *x, const uint16_t *w, uint16_t *out, int32_t rows,
                           int32_t size, float eps) {
    rmsnorm_rows(x, w, out, rows, size, eps);
}
