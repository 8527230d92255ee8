#include "norm.h"

void cuvil_softmax(int64_t outer, int64_t n, int64_t inner, const float *x, float *y, int take_log, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (outer * n * inner > 8192)
    for (int64_t oi = 0; oi < outer * inner; oi++) {
        int64_t o = oi / inner, i = oi % inner;
        const float *xr = x + o * n * inner + i;
        float *yr = y + o * n * inner + i;
        float m = -INFINITY;
        for (int64_t k = 0; k < n; k++) m = xr[k * inner] > m ? xr[k * inner] : m;
        if (m == -INFINITY) m = 0.f;   /* a fully masked row: exp(-inf - 0) = 0, sum 0 -> nan as torch */
        double s = 0.0;
        for (int64_t k = 0; k < n; k++) {
            float e = expf(xr[k * inner] - m);
            if (!take_log) yr[k * inner] = e;
            s += e;
        }
        if (take_log) {
            float ls = (float)log(s);
            for (int64_t k = 0; k < n; k++) yr[k * inner] = xr[k * inner] - m - ls;
        } else {
            float r = (float)(1.0 / s);
            for (int64_t k = 0; k < n; k++) yr[k * inner] *= r;
        }
    }
}

void cuvil_layer_norm(int64_t rows, int64_t n, const float *x, const float *gamma, const float *beta,
                      float eps, int rms, float *y, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (rows * n > 8192)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        /* sums and the centring in double: a float sum over thousands of elements, or a mean
         * rounded to float when it is large against the spread, costs more than 1e-4 */
        double mean = 0.0, ss = 0.0;
        if (!rms) {
            for (int64_t k = 0; k < n; k++) mean += xr[k];
            mean = n ? mean / n : 0.0;
        }
        for (int64_t k = 0; k < n; k++) { double d = xr[k] - mean; ss += d * d; }
        double inv = 1.0 / sqrt((n ? ss / n : 0.0) + eps);
        for (int64_t k = 0; k < n; k++) {
            float v = (float)((xr[k] - mean) * inv);
            if (gamma) v *= gamma[k];
            if (beta && !rms) v += beta[k];
            yr[k] = v;
        }
    }
}

void cuvil_batch_norm(int64_t N, int64_t C, int64_t inner, const float *x, const float *scale,
                      const float *bias, const float *mean, const float *var, float eps, float *y, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (N * C * inner > 8192)
    for (int64_t nc = 0; nc < N * C; nc++) {
        int64_t c = nc % C;
        float a = scale[c] / sqrtf(var[c] + eps), b = bias[c] - mean[c] * a;
        for (int64_t i = 0; i < inner; i++) y[nc * inner + i] = x[nc * inner + i] * a + b;
    }
}
