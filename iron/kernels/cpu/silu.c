/* silu: out = x * sigmoid(x) = x / (1 + exp(-x)), elementwise (the loop and its macros:
 * iron_elementwise.h). 8 elements at a time with iron_silu8 (vector exp, iron_cpu.h); the tail
 * of a tile uses expf.
 */
#include "iron_cpu.h"

#define IRON_ARITY 1
#define IRON_ELEMENT8 iron_silu8
static inline float iron_element(float x, float unused) {
    (void)unused;
    return x / (1.0f + expf(-x));
}

#include "iron_elementwise.h"
