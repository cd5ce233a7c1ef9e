/* iron_out.h: the output element of the matrix kernels (gemv.c, gemm.c, qmatmul.h).
 *
 * macro: IRON_OUTPUT_DTYPE, the index in iron.operators.matrix.OUTPUT_DTYPES: 0 bf16 (each
 *   float32 sum rounded once, as every tensor between steps), 1 float32 (the sum itself: a
 *   model's logits, where bf16's 8 significant bits make the likeliest tokens tie).
 */
#ifndef IRON_OUT_H
#define IRON_OUT_H

#include "iron_cpu.h"

#ifndef IRON_OUTPUT_DTYPE
#error "iron_out.h needs IRON_OUTPUT_DTYPE"
#endif
#define OUT_F32 (IRON_OUTPUT_DTYPE == 1)

#if OUT_F32
typedef float out_t;
static inline out_t out_scalar(float f) { return f; }
static inline void out_store8(out_t *p, __m256 v) { _mm256_storeu_ps(p, v); }
#else
typedef uint16_t out_t;
static inline out_t out_scalar(float f) { return iron_f32_to_bf16(f); }
static inline void out_store8(out_t *p, __m256 v) { iron_store8_bf16(p, v); }
#endif

#if defined(__AVX512F__)
/* 16 lanes: bf16 with iron_f32_to_bf16's rounding (vcvtneps2bf16 where the host has it) */
static inline void out_store16(out_t *p, __m512 v) {
#if OUT_F32
    _mm512_storeu_ps(p, v);
#elif defined(__AVX512BF16__)
    _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh(v));
#else
    iron_store8_bf16(p, _mm512_castps512_ps256(v));
    iron_store8_bf16(p + 8, _mm512_extractf32x8_ps(v, 1));
#endif
}
#endif

#endif /* IRON_OUT_H */
