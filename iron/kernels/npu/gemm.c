/* GEMM core kernels: acc (tm x tn, float32) += A (tm x tk) * B^T, B (tn x tk) in Linear-weight
 * layout; zero_f32 clears the accumulator, store_bf16 rounds it into the output tile.
 * Each dot product keeps LANES partial sums (tk % LANES == 0 on both NPUs: tk is a multiple of
 * the MAC shape's 8), the way a vector MAC accumulates; the lanes are added at the end.
 */
#include "iron_npu.h"

#define LANES 8

void zero_f32(float *acc, int32_t n) {
    for (int32_t i = 0; i < n; i++) acc[i] = 0.0f;
}

void gemm_bf16(const uint16_t *a, const uint16_t *b, float *acc, int32_t tm, int32_t tk,
               int32_t tn) {
    for (int32_t i = 0; i < tm; i++)
        for (int32_t j = 0; j < tn; j++) {
            const uint16_t *ar = a + i * tk, *br = b + j * tk;
            float s[LANES] = {0};
            int32_t p = 0;
            for (; p + LANES <= tk; p += LANES)
                for (int32_t l = 0; l < LANES; l++)
                    s[l] += bf16_to_f32(ar[p + l]) * bf16_to_f32(br[p + l]);
            float t = 0.0f;
            for (; p < tk; p++) t += bf16_to_f32(ar[p]) * bf16_to_f32(br[p]);
            for (int32_t l = 0; l < LANES; l++) t += s[l];
            acc[i * tn + j] += t;
        }
}

void store_bf16(const float *acc, uint16_t *c, int32_t n) {
    for (int32_t i = 0; i < n; i++) c[i] = f32_to_bf16(acc[i]);
}
