/* runtime: run a whole program of compiled kernels with one call from Python.
 *
 * iron_exec(n, fns, args)                  calls fns[i](args[i]) for i = 0 .. n-1, in order.
 * iron_exec_timed(n, fns, args, seconds)   the same, and adds the wall time of step i
 *                                          (CLOCK_MONOTONIC) into seconds[i].
 * fns[i] is a kernel's iron_kernel; args[i] its argument array (inputs, then outputs).
 * No macros.
 */
#define _POSIX_C_SOURCE 199309L
#include <time.h>

typedef void (*iron_fn)(void *const *);

void iron_exec(int n, const iron_fn *fns, void *const *const *args) {
    for (int i = 0; i < n; i++) fns[i](args[i]);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void iron_exec_timed(int n, const iron_fn *fns, void *const *const *args, double *seconds) {
    double t0 = now();
    for (int i = 0; i < n; i++) {
        fns[i](args[i]);
        double t1 = now();
        seconds[i] += t1 - t0;
        t0 = t1;
    }
}
