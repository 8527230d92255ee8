#include "norm.h"
#include "pool.h"

typedef struct { int64_t n, inner; const float *x; float *y; int take_log; } softmax_args;

static void softmax_task(void *ctx, int64_t r0, int64_t r1) {
    const softmax_args *a = ctx;
    int64_t n = a->n, inner = a->inner;
    for (int64_t oi = r0; oi < r1; oi++) {
        int64_t o = oi / inner, i = oi % inner;
        const float *xr = a->x + o * n * inner + i;
        float *yr = a->y + o * n * inner + i;
        float m = -INFINITY;
        for (int64_t k = 0; k < n; k++) m = xr[k * inner] > m ? xr[k * inner] : m;
        if (m == -INFINITY) m = 0.f;   /* a fully masked row: exp(-inf - 0) = 0, sum 0 -> nan as torch */
        double s = 0.0;
        for (int64_t k = 0; k < n; k++) {
            float e = expf(xr[k * inner] - m);
            if (!a->take_log) yr[k * inner] = e;
            s += e;
        }
        if (a->take_log) {
            float ls = (float)log(s);
            for (int64_t k = 0; k < n; k++) yr[k * inner] = xr[k * inner] - m - ls;
        } else {
            float r = (float)(1.0 / s);
            for (int64_t k = 0; k < n; k++) yr[k * inner] *= r;
        }
    }
}

void cuvil_softmax(int64_t outer, int64_t n, int64_t inner, const float *x, float *y, int take_log, int nthreads) {
    softmax_args a = {n, inner, x, y, take_log};
    cuvil_parallel_for(outer * n * inner > 8192 ? nthreads : 1, outer * inner, 1, softmax_task, &a);
}

typedef struct { int64_t n; const float *x, *gamma, *beta; float eps; int rms; float *y; } norm_args;

static void norm_task(void *ctx, int64_t r0, int64_t r1) {
    const norm_args *a = ctx;
    int64_t n = a->n;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = a->x + r * n;
        float *yr = a->y + r * n;
        /* sums and the centring in double: a float sum over thousands of elements, or a mean
         * rounded to float when it is large against the spread, costs more than 1e-4 */
        double mean = 0.0, ss = 0.0;
        /* omp simd: the double sums may be reassociated across lanes, so the loops vectorize */
        if (!a->rms) {
            #pragma omp simd reduction(+:mean)
            for (int64_t k = 0; k < n; k++) mean += xr[k];
            mean = n ? mean / n : 0.0;
        }
        #pragma omp simd reduction(+:ss)
        for (int64_t k = 0; k < n; k++) { double d = xr[k] - mean; ss += d * d; }
        double inv = 1.0 / sqrt((n ? ss / n : 0.0) + a->eps);
        for (int64_t k = 0; k < n; k++) {
            float v = (float)((xr[k] - mean) * inv);
            if (a->gamma) v *= a->gamma[k];
            if (a->beta && !a->rms) v += a->beta[k];
            yr[k] = v;
        }
    }
}

void cuvil_layer_norm(int64_t rows, int64_t n, const float *x, const float *gamma, const float *beta,
                      float eps, int rms, float *y, int nthreads) {
    norm_args a = {n, x, gamma, beta, eps, rms, y};
    cuvil_parallel_for(rows * n > 8192 ? nthreads : 1, rows, 1, norm_task, &a);
}

typedef struct { int64_t C, inner; const float *x, *scale, *bias, *mean, *var; float eps; float *y; } bn_args;

static void bn_task(void *ctx, int64_t nc0, int64_t nc1) {
    const bn_args *a = ctx;
    for (int64_t nc = nc0; nc < nc1; nc++) {
        int64_t c = nc % a->C;
        float s = a->scale[c] / sqrtf(a->var[c] + a->eps), b = a->bias[c] - a->mean[c] * s;
        for (int64_t i = 0; i < a->inner; i++) a->y[nc * a->inner + i] = a->x[nc * a->inner + i] * s + b;
    }
}

void cuvil_batch_norm(int64_t N, int64_t C, int64_t inner, const float *x, const float *scale,
                      const float *bias, const float *mean, const float *var, float eps, float *y, int nthreads) {
    bn_args a = {C, inner, x, scale, bias, mean, var, eps, y};
    cuvil_parallel_for(N * C * inner > 8192 ? nthreads : 1, N * C, 1, bn_task, &a);
}
