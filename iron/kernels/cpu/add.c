/* add: out = x + y, elementwise (the loop and its macros: iron_elementwise.h). */
#include "iron_cpu.h"

#define IRON_ARITY 2
static inline float iron_element(float x, float y) { return x + y; }

#include "iron_elementwise.h"
