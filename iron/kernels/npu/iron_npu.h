/* Shared helpers of the NPU core kernels: bf16 <-> float32 in plain C.
 *
 * The core kernels are written in portable C so that one source builds with the host compiler
 * (the emulator calls the host build) and with Peano, the AIE compiler of mlir-aie, for the
 * cores. They take whole FIFO elements (buffers) and sizes as arguments, as the functions an
 * mlir-aie design calls with func.call do. bf16 travels as its 16-bit pattern.
 */
#ifndef IRON_NPU_H
#define IRON_NPU_H
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* round to nearest even; NaN stays NaN */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
