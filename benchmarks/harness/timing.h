/* What the C harnesses share: a monotonic clock in microseconds and a comparator for qsort on doubles
 * (the medians they print). */
#ifndef CUVIL_HARNESS_TIMING_H
#define CUVIL_HARNESS_TIMING_H
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
#endif
