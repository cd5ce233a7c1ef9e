/* int8_peak.c: the host's int8 dot-product peak, VPDPBUSD back to back on every thread of an
 * OpenMP team. Built and run by int8_peak.py (-march=native -fopenmp; OMP_NUM_THREADS sets the
 * team).
 *
 * Each thread keeps ACCS independent accumulators (more than the instruction's latency times
 * its issue rate, so nothing waits on a result) and runs ITERS rounds of one VPDPBUSD into
 * each: a zmm one (64 unsigned x signed byte products summed into 16 int32 lanes) with
 * AVX512-VNNI, else AVX-VNNI's ymm one (32). Prints, best of RUNS runs: the team's
 * multiply-adds per second of wall time; the same per second of CPU time of its busiest
 * thread (the rate while it runs: on a shared machine the one to compare); and the bytes of
 * one instruction (64 or 32). The sums' checksum goes to stderr, so that the work cannot be
 * optimised away. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define ACCS 12 /* in-out operands count twice: 12 of asm's 30 */
#define ITERS 2000000L
#define RUNS 9

#if defined(__AVX512VNNI__)
typedef __m512i vec;
#define WIDTH 64
#define DP "vpdpbusd "
static inline vec splat(int v) { return _mm512_set1_epi32(v); }
static inline int lane0(vec v) { return _mm_cvtsi128_si32(_mm512_castsi512_si128(v)); }
static inline vec add(vec a, vec b) { return _mm512_add_epi32(a, b); }
#elif defined(__AVXVNNI__)
typedef __m256i vec;
#define WIDTH 32
#define DP "{vex} vpdpbusd "
static inline vec splat(int v) { return _mm256_set1_epi32(v); }
static inline int lane0(vec v) { return _mm_cvtsi128_si32(_mm256_castsi256_si128(v)); }
static inline vec add(vec a, vec b) { return _mm256_add_epi32(a, b); }
#else
#error "int8_peak.c needs AVX512-VNNI or AVX-VNNI (VPDPBUSD)"
#endif

/* ITERS rounds of ACCS independent VPDPBUSD; returns a lane of their sum. The loop body is
 * assembly: written with the intrinsic, GCC 12 copied every accumulator to another register
 * once per round, which would measure the copies too. */
static int run(int seed) {
    volatile int from_memory[2] = {0x01020304 + seed, 0x01010101};
    const vec a = splat(from_memory[0]), b = splat(from_memory[1]);
    /* separate variables, not an array: GCC 12 stores an array's elements every round */
    vec c0 = a, c1 = a, c2 = a, c3 = a, c4 = a, c5 = a, c6 = a, c7 = a, c8 = a, c9 = a, c10 = a,
        c11 = a;
    for (long n = 0; n < ITERS; n++)
        __asm__(
            DP "%[b], %[a], %[c0]\n\t"
            DP "%[b], %[a], %[c1]\n\t"
            DP "%[b], %[a], %[c2]\n\t"
            DP "%[b], %[a], %[c3]\n\t"
            DP "%[b], %[a], %[c4]\n\t"
            DP "%[b], %[a], %[c5]\n\t"
            DP "%[b], %[a], %[c6]\n\t"
            DP "%[b], %[a], %[c7]\n\t"
            DP "%[b], %[a], %[c8]\n\t"
            DP "%[b], %[a], %[c9]\n\t"
            DP "%[b], %[a], %[c10]\n\t"
            DP "%[b], %[a], %[c11]\n\t"
            : [c0] "+v"(c0), [c1] "+v"(c1), [c2] "+v"(c2), [c3] "+v"(c3),
              [c4] "+v"(c4), [c5] "+v"(c5), [c6] "+v"(c6), [c7] "+v"(c7),
              [c8] "+v"(c8), [c9] "+v"(c9), [c10] "+v"(c10), [c11] "+v"(c11)
            : [a] "v"(a), [b] "v"(b));
    const vec s = add(add(add(c0, c1), add(c2, c3)), add(add(c4, c5), add(c6, c7)));
    return lane0(add(s, add(add(c8, c9), add(c10, c11))));
}

static double thread_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(void) {
    double wall = 1e30, cpu = 1e30;
    int sink = 0;
    for (int r = 0; r < RUNS; r++) {
        double t0 = 0.0, t1 = 0.0, busiest = 0.0;
#pragma omp parallel reduction(+ : sink)
        {
#pragma omp barrier
#pragma omp single
            t0 = omp_get_wtime();
            const double c0 = thread_seconds();
            sink += run(omp_get_thread_num());
            const double used = thread_seconds() - c0;
#pragma omp critical
            busiest = used > busiest ? used : busiest;
#pragma omp barrier
#pragma omp single
            t1 = omp_get_wtime();
        }
        wall = t1 - t0 < wall ? t1 - t0 : wall;
        cpu = busiest < cpu ? busiest : cpu;
    }
    const double macs = (double)omp_get_max_threads() * ITERS * ACCS * WIDTH;
    printf("%.6e %.6e %d\n", macs / wall, macs / cpu, WIDTH);
    fprintf(stderr, "checksum %d\n", sink);
    return 0;
}
