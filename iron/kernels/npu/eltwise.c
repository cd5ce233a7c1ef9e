/* Elementwise core kernels: one FIFO element of n bf16 values per call.
 *   add: c = a + b; mul: c = a * b; axpy: c = factor * a + b; silu: c = a * sigmoid(a);
 *   swiglu: out = silu(gate) * up.
 * float32 arithmetic, one rounding to bf16 per output.
 */
#include <math.h>
#include "iron_npu.h"

void add_bf16(const uint16_t *a, const uint16_t *b, uint16_t *c, int32_t n) {
    for (int32_t i = 0; i < n; i++) c[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

void mul_bf16(const uint16_t *a, const uint16_t *b, uint16_t *c, int32_t n) {
    for (int32_t i = 0; i < n; i++) c[i] = f32_to_bf16(bf16_to_f32(a[i]) * bf16_to_f32(b[i]));
}

void axpy_bf16(const uint16_t *a, const uint16_t *b, uint16_t *c, int32_t n, float factor) {
    for (int32_t i = 0; i < n; i++)
        c[i] = f32_to_bf16(factor * bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

void silu_bf16(const uint16_t *a, uint16_t *c, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        float x = bf16_to_f32(a[i]);
        c[i] = f32_to_bf16(x / (1.0f + expf(-x)));
    }
}

void swiglu_bf16(const uint16_t *gate, const uint16_t *up, uint16_t *out, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        float g = bf16_to_f32(gate[i]);
        out[i] = f32_to_bf16(g / (1.0f + expf(-g)) * bf16_to_f32(up[i]));
    }
}
