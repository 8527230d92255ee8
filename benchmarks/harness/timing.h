/* What the C harnesses share: a monotonic clock in microseconds, a comparator for qsort on doubles
 * (the medians they print), operands filled with a fixed pattern and the median of timed calls. */
#ifndef CUVIL_HARNESS_TIMING_H
#define CUVIL_HARNESS_TIMING_H
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* n floats, 64-byte aligned (NULL where memory ran out), float i = (i * mul) % 1000 * scale + off: varied
 * values that the harnesses' plain loops check the kernels against. */
static float *pattern_floats(int64_t n, int64_t mul, float scale, float off) {
    float *p = aligned_alloc(64, (size_t)(n * 4 + 63) / 64 * 64);
    for (int64_t i = 0; p && i < n; i++) p[i] = (float)((i * mul) % 1000) * scale + off;
    return p;
}

/* The median microseconds of `calls` calls of run(ctx), after three not counted, each call after
 * before(ctx) where given (not timed: a cache flush); -1 where memory ran out. */
static inline double median_us_after(int calls, void (*run)(void *), void *ctx, void (*before)(void *)) {
    double *t = malloc(sizeof(double) * calls), m;
    if (!t) return -1;
    for (int i = -3; i < calls; i++) {
        if (before) before(ctx);
        double t0 = now_us();
        run(ctx);
        if (i >= 0) t[i] = now_us() - t0;
    }
    qsort(t, calls, sizeof(double), by_value);
    m = t[calls / 2];
    free(t);
    return m;
}

static inline double median_us(int calls, void (*run)(void *), void *ctx) { return median_us_after(calls, run, ctx, 0); }
#endif
