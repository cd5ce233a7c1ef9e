/* concat: rows side by side, out[r] = x[r] | y[r].
 *
 * args: x (ROWS, LEFT) bf16, y (ROWS, RIGHT) bf16 -> out (ROWS, LEFT + RIGHT) bf16.
 * macros:
 *   IRON_ROWS, IRON_LEFT, IRON_RIGHT
 */
#include "iron_cpu.h"

#if !defined(IRON_ROWS) || !defined(IRON_LEFT) || !defined(IRON_RIGHT)
#error "concat.c needs IRON_ROWS, IRON_LEFT, IRON_RIGHT"
#endif

void iron_kernel(void *const *args) {
    const uint16_t *x = args[0], *y = args[1];
    uint16_t *out = args[2];

    for (long r = 0; r < IRON_ROWS; r++) {
        uint16_t *o = out + r * (long)(IRON_LEFT + IRON_RIGHT);
        memcpy(o, x + r * (long)IRON_LEFT, sizeof(uint16_t) * IRON_LEFT);
        memcpy(o + IRON_LEFT, y + r * (long)IRON_RIGHT, sizeof(uint16_t) * IRON_RIGHT);
    }
}
