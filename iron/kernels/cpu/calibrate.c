/* calibrate.c: probes of the host CPU for the cpu cost model (iron/targets/cpu/calibration.py).
 *
 * Not an operator's kernel: four small measurements of the machine, compiled with the kernels'
 * compiler and flags (so the same OpenMP runtime and vector width), each writing the seconds
 * of every repetition into `seconds` (omp_get_wtime); the caller takes the median.
 *
 *   iron_probe_read(p, n, threads, reps, seconds)   one pass summing n floats (n % 64 == 0),
 *                                                   split statically over `threads`: bandwidth
 *   iron_probe_fma(iters, threads, reps, seconds)   `iters` x 8 independent 8-lane FMA chains on
 *                                                   each thread: vector FMA instructions per s
 *   iron_probe_fork(threads, gap, reps, seconds)    an empty `omp parallel` region after `gap`
 *                                                   seconds of the caller's own work (as
 *                                                   between a program's kernels or the tuner's
 *                                                   runs): waking and joining a team
 *   iron_probe_items(x, out, n, tile, reps, seconds)  out = x + x over n bf16 in items of `tile`
 *                                                   (tile % 8 == 0): the cost of a work item
 */
#include <omp.h>

#include "iron_cpu.h"

static volatile float sink;

void iron_probe_read(const float *p, long n, int threads, int reps, double *seconds) {
    for (int r = 0; r < reps; r++) {
        const double t0 = omp_get_wtime();
        float total = 0.0f;
        #pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            const long chunk = n / 64 / nt * 64, lo = t * chunk, hi = t == nt - 1 ? n : lo + chunk;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (long i = lo; i < hi; i += 32) {
                a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
                a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
                a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
                a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
            }
            total += iron_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        }
        seconds[r] = omp_get_wtime() - t0;
        sink = total;
    }
}

void iron_probe_fma(long iters, int threads, int reps, double *seconds) {
    for (int r = 0; r < reps; r++) {
        const double t0 = omp_get_wtime();
        float total = 0.0f;
        #pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
            __m256 a[8];
            for (int j = 0; j < 8; j++) a[j] = _mm256_set1_ps((float)j);
            for (long i = 0; i < iters; i++)
                for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(a[j], m, c);
            for (int j = 1; j < 8; j++) a[0] = _mm256_add_ps(a[0], a[j]);
            total += iron_hsum8(a[0]);
        }
        seconds[r] = omp_get_wtime() - t0;
        sink = total;
    }
}

void iron_probe_fork(int threads, double gap, int reps, double *seconds) {
    for (int r = 0; r < reps; r++) {
        const double idle = omp_get_wtime() + gap;
        while (omp_get_wtime() < idle) {
        }
        const double t0 = omp_get_wtime();
        #pragma omp parallel num_threads(threads)
        {
            if (omp_get_thread_num() == threads) sink = 0.0f; /* never true: a region with a body */
        }
        seconds[r] = omp_get_wtime() - t0;
    }
}

void iron_probe_items(const uint16_t *x, uint16_t *out, long n, long tile, int reps,
                      double *seconds) {
    for (int r = 0; r < reps; r++) {
        const double t0 = omp_get_wtime();
        for (long t = 0; t < n / tile; t++)
            for (long i = t * tile; i < (t + 1) * tile; i += 8) {
                const __m256 v = iron_load8_bf16(x + i);
                iron_store8_bf16(out + i, _mm256_add_ps(v, v));
            }
        seconds[r] = omp_get_wtime() - t0;
    }
}
