/* axpy: out = scalar_factor * x + y, elementwise (the loop and its macros:
 * iron_elementwise.h), plus IRON_SCALAR_FACTOR_BITS, the float32 bit pattern of scalar_factor.
 */
#include "iron_cpu.h"

#ifndef IRON_SCALAR_FACTOR_BITS
#error "axpy.c needs IRON_SCALAR_FACTOR_BITS"
#endif

#define IRON_ARITY 2
static inline float iron_element(float x, float y) {
    return iron_f32_from_bits(IRON_SCALAR_FACTOR_BITS) * x + y;
}

#include "iron_elementwise.h"
