#include "norm.h"
#include "pool.h"
#include "vmath.h"
#if defined(__AVX__)
#include <immintrin.h>
#endif

/* The sum of a vector's lanes in double, in a tree: once per row and statistic, so it is most of a row's
 * time where rows are short (ConvNeXt's 96 channels). Widened a half vector at a time where the target
 * has the conversion: a lane at a time, it was 16 conversions and 15 dependent adds. */
static inline double lanes_in_double(cuvil_vf t) {
#if defined(__AVX512F__) && CUVIL_VL == 16
    __m512 v = (__m512)t;
    return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)),
                                              _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))));
#elif defined(__AVX__) && CUVIL_VL == 8
    __m256 v = (__m256)t;
    __m256d d = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
#else
    double h[CUVIL_VL];
    for (int l = 0; l < CUVIL_VL; l++) h[l] = t[l];
    for (int w = CUVIL_VL / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) h[l] += h[l + w];
    return h[0];
#endif
}

typedef struct { int64_t n, inner, chunks; const float *x; float *y; int take_log; } softmax_args;

/* Softmax keeps torch's edges: a NaN is ignored by the max but makes its row (or column) NaN through the
 * sum, an all -inf row is exp(-inf - 0) = 0 everywhere, so 0 / 0 = NaN, and a +inf makes its row NaN. */

/* exp(d) for d = x - max <= 0, exactly 0 where float's exp is (the portable vector exp clamps at -87.3,
 * which left 1e-38 for a masked -inf); NaN stays NaN. */
static inline cuvil_vf softmax_exp(cuvil_vf d) {
    return cuvil_vsel(d < cuvil_vsplat(-103.972084f), cuvil_vsplat(0.f), cuvil_vexp(d));
}

/* One element of x at stride `inner` per step of n: the scalar form, for the columns no vector fills. */
static void softmax_strided(const float *xr, int64_t n, int64_t inner, float *yr, int take_log) {
    float m = -INFINITY;
    for (int64_t k = 0; k < n; k++) m = xr[k * inner] > m ? xr[k * inner] : m;
    if (m == -INFINITY) m = 0.f;
    double s = 0.0;
    for (int64_t k = 0; k < n; k++) {
        float e = cuvil_fexp(xr[k * inner] - m);
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

/* A contiguous row in vectors: the max, exp(x - max) in 2 vectors of float lanes (each lane adds about
 * n / (2 VL) terms, then the lanes in double), the scale. A libm expf an element in double had taken
 * 11x torch's time over BERT-sized attention scores. */
static void softmax_row(const float *x, int64_t n, float *y, int take_log) {
    int64_t nv = n / CUVIL_VL * CUVIL_VL, k;
    cuvil_vf vm = cuvil_vsplat(-INFINITY);
    for (k = 0; k < nv; k += CUVIL_VL) {
        cuvil_vf v = cuvil_vload(x + k);
        vm = cuvil_vsel(v > vm, v, vm);
    }
    float m = -INFINITY;
    for (int l = 0; l < CUVIL_VL; l++) m = vm[l] > m ? vm[l] : m;
    for (; k < n; k++) m = x[k] > m ? x[k] : m;
    if (m == -INFINITY) m = 0.f;
    const cuvil_vf mv = cuvil_vsplat(m);
    cuvil_vf acc[2] = {cuvil_vsplat(0.f), cuvil_vsplat(0.f)};
    for (k = 0; k < nv; k += CUVIL_VL) {
        cuvil_vf e = softmax_exp(cuvil_vload(x + k) - mv);
        if (!take_log) cuvil_vstore(y + k, e);
        acc[(k / CUVIL_VL) & 1] += e;
    }
    double s = lanes_in_double(acc[0] + acc[1]);
    for (; k < n; k++) {
        float e = cuvil_fexp(x[k] - m);
        if (!take_log) y[k] = e;
        s += e;
    }
    if (take_log) {
        const float ls = (float)log(s);
        const cuvil_vf lv = cuvil_vsplat(ls);
        for (k = 0; k < nv; k += CUVIL_VL) cuvil_vstore(y + k, cuvil_vload(x + k) - mv - lv);
        for (; k < n; k++) y[k] = x[k] - m - ls;
    } else {
        const float r = (float)(1.0 / s);
        const cuvil_vf rv = cuvil_vsplat(r);
        for (k = 0; k < nv; k += CUVIL_VL) cuvil_vstore(y + k, cuvil_vload(y + k) * rv);
        for (; k < n; k++) y[k] *= r;
    }
}

/* VL columns i0.. of one outer slice, softmax along the strided axis: each lane is a column of its own,
 * its sum kept in double. */
static void softmax_columns(const float *x, int64_t n, int64_t inner, float *y, int take_log) {
    cuvil_vf m = cuvil_vsplat(-INFINITY);
    for (int64_t k = 0; k < n; k++) {
        cuvil_vf v = cuvil_vload(x + k * inner);
        m = cuvil_vsel(v > m, v, m);
    }
    m = cuvil_vsel(m == cuvil_vsplat(-INFINITY), cuvil_vsplat(0.f), m);
    double s[CUVIL_VL] = {0};
    for (int64_t k0 = 0; k0 < n; k0 += 256) {            /* float sums of up to 256 terms, then double */
        cuvil_vf part = cuvil_vsplat(0.f);
        for (int64_t k = k0; k < n && k < k0 + 256; k++) {
            cuvil_vf e = softmax_exp(cuvil_vload(x + k * inner) - m);
            if (!take_log) cuvil_vstore(y + k * inner, e);
            part += e;
        }
        for (int l = 0; l < CUVIL_VL; l++) s[l] += part[l];
    }
    cuvil_vf f;
    for (int l = 0; l < CUVIL_VL; l++) f[l] = take_log ? (float)log(s[l]) : (float)(1.0 / s[l]);
    for (int64_t k = 0; k < n; k++) {
        cuvil_vf v;
        if (take_log) v = cuvil_vload(x + k * inner) - m - f;
        else v = cuvil_vload(y + k * inner) * f;
        cuvil_vstore(y + k * inner, v);
    }
}

/* Items: rows where the axis is the last (inner 1), else chunks of VL columns (the last one's columns
 * one at a time where they fill no vector). */
static void softmax_task(void *ctx, int64_t i0, int64_t i1) {
    const softmax_args *a = ctx;
    const int64_t n = a->n, inner = a->inner;
    for (int64_t it = i0; it < i1; it++) {
        if (inner == 1) {
            softmax_row(a->x + it * n, n, a->y + it * n, a->take_log);
            continue;
        }
        int64_t o = it / a->chunks, c0 = it % a->chunks * CUVIL_VL, off = o * n * inner + c0;
        if (c0 + CUVIL_VL <= inner) softmax_columns(a->x + off, n, inner, a->y + off, a->take_log);
        else
            for (int64_t i = 0; c0 + i < inner; i++) softmax_strided(a->x + off + i, n, inner, a->y + off + i, a->take_log);
    }
}

void cuvil_softmax(int64_t outer, int64_t n, int64_t inner, const float *x, float *y, int take_log, int nthreads) {
    int64_t chunks = inner == 1 ? 1 : (inner + CUVIL_VL - 1) / CUVIL_VL;
    softmax_args a = {n, inner, chunks, x, y, take_log};
    cuvil_parallel_for(outer * n * inner > 8192 ? nthreads : 1, outer * chunks, 1, softmax_task, &a);
}

typedef struct { int64_t n; const float *x, *gamma, *beta; float eps; int rms; float *y; } norm_args;

/* The sum over a row of d = (x - hi) - lo, or of d * d, in 4 vectors of float lanes (each lane adds
 * about n / (4 VL) terms), the vectors past the last 4 in the first; the lanes and the tail under a
 * vector are added in double. (The vectors past the last 4 had been added in that scalar tail, a
 * double's latency each: ConvNeXt's 96 channels, 64 + 32, took 9x the time per value of its 192.) */
static inline __attribute__((always_inline)) double centred_sum(const float *x, int64_t n, float hi, float lo,
                                                                int square) {
    const cuvil_vf vh = cuvil_vsplat(hi), vl = cuvil_vsplat(lo);
    cuvil_vf acc[4] = {cuvil_vsplat(0.f), cuvil_vsplat(0.f), cuvil_vsplat(0.f), cuvil_vsplat(0.f)};
    int64_t k = 0;
    for (; k + 4 * CUVIL_VL <= n; k += 4 * CUVIL_VL)
        for (int j = 0; j < 4; j++) {
            cuvil_vf d = (cuvil_vload(x + k + j * CUVIL_VL) - vh) - vl;
            if (square) acc[j] += d * d;       /* a constant where inlined */
            else acc[j] += d;
        }
    for (int j = 1; k + CUVIL_VL <= n; k += CUVIL_VL, j++) {
        cuvil_vf d = (cuvil_vload(x + k) - vh) - vl;
        if (square) acc[j] += d * d;
        else acc[j] += d;
    }
    /* the 4 vectors as one, then its lanes in double, in a tree: 64 lanes one after another had
     * been most of a 384-wide row's time */
    double s = lanes_in_double((acc[0] + acc[1]) + (acc[2] + acc[3]));
    for (; k < n; k++) {
        float d = (x[k] - hi) - lo;
        s += square ? d * d : d;
    }
    return s;
}

/* y = ((x - hi) - lo) inv, times gamma and plus beta where has_gamma / has_beta (constants where
 * inlined, so that each form is one vector loop: tested in the loop, the branches kept GCC from
 * vectorizing it). */
static inline __attribute__((always_inline)) void scale_row(const float *x, int64_t n, float hi, float lo, float inv,
                                                            const float *gamma, const float *beta, int has_gamma,
                                                            int has_beta, float *y) {
    const cuvil_vf vh = cuvil_vsplat(hi), vl = cuvil_vsplat(lo), vi = cuvil_vsplat(inv);
    int64_t k = 0;
    for (; k + CUVIL_VL <= n; k += CUVIL_VL) {
        cuvil_vf v = ((cuvil_vload(x + k) - vh) - vl) * vi;
        if (has_gamma) v *= cuvil_vload(gamma + k);
        if (has_beta) v += cuvil_vload(beta + k);
        cuvil_vstore(y + k, v);
    }
    for (; k < n; k++) {
        float v = ((x[k] - hi) - lo) * inv;
        if (has_gamma) v *= gamma[k];
        if (has_beta) v += beta[k];
        y[k] = v;
    }
}

/* A row's statistics in float lanes, near the double sums they replaced (those ran at a quarter of
 * the vector width: 1.2% of MiniLM's time at 1 thread, 3.5% at 2): the mean sums x - x[0], so a mean
 * large against the spread does not swamp it, and the centring subtracts the double mean as a float
 * pair hi + lo, which leaves each x - mean accurate to its own size. */
static void norm_task(void *ctx, int64_t r0, int64_t r1) {
    const norm_args *a = ctx;
    const int64_t n = a->n;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = a->x + r * n;
        float *yr = a->y + r * n;
        double mean = !a->rms && n ? xr[0] + centred_sum(xr, n, xr[0], 0.f, 0) / n : 0.0;
        const float hi = (float)mean, lo = (float)(mean - hi);
        const double ss = centred_sum(xr, n, hi, lo, 1);
        const float inv = (float)(1.0 / sqrt((n ? ss / n : 0.0) + a->eps));
        const float *beta = a->rms ? 0 : a->beta;
        if (a->gamma && beta) scale_row(xr, n, hi, lo, inv, a->gamma, beta, 1, 1, yr);
        else if (a->gamma) scale_row(xr, n, hi, lo, inv, a->gamma, 0, 1, 0, yr);
        else scale_row(xr, n, hi, lo, inv, 0, beta, 0, beta != 0, yr);
    }
}

void cuvil_layer_norm(int64_t rows, int64_t n, const float *x, const float *gamma, const float *beta,
                      float eps, int rms, float *y, int nthreads) {
    norm_args a = {n, x, gamma, beta, eps, rms, y};
    cuvil_parallel_for(rows * n > 8192 ? nthreads : 1, rows, 1, norm_task, &a);
}

typedef struct { int64_t CB, hw, cg; const float *x; float eps; float *y; } group_norm_args;

/* The lanes of v summed over each run of cg lanes (the lanes of one group), in double, into g[lane]. */
static void group_lanes(cuvil_vf v, int64_t cg, double *g) {
    float f[CUVIL_VL];
    memcpy(f, &v, sizeof f);
    for (int l = 0; l < CUVIL_VL; l += (int)cg) {
        double s = 0.0;
        for (int k = 0; k < cg; k++) s += f[l + k];
        for (int k = 0; k < cg; k++) g[l + k] = s;
    }
}

/* The per-lane sum over hw pixels of a block's plane of (x - c), or of its square, in 4 vectors. */
static inline __attribute__((always_inline)) cuvil_vf plane_sum(const float *p, int64_t hw, cuvil_vf c, int square) {
    cuvil_vf acc[4] = {cuvil_vsplat(0.f), cuvil_vsplat(0.f), cuvil_vsplat(0.f), cuvil_vsplat(0.f)};
    int64_t i = 0;
    for (; i + 4 <= hw; i += 4)
        for (int j = 0; j < 4; j++) {
            cuvil_vf d = cuvil_vload(p + (i + j) * CUVIL_VL) - c;
            if (square) acc[j] += d * d;
            else acc[j] += d;
        }
    for (; i < hw; i++) {
        cuvil_vf d = cuvil_vload(p + i * CUVIL_VL) - c;
        if (square) acc[0] += d * d;
        else acc[0] += d;
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

/* Items n * CB + cb: one block's plane, its groups of cg lanes (cg dividing the block): the mean
 * (about the first pixel, as norm_task centres a row), the variance about it, then the scaling. */
static void group_norm_task(void *ctx, int64_t i0, int64_t i1) {
    const group_norm_args *a = ctx;
    const double count = (double)a->cg * (double)a->hw;
    for (int64_t i = i0; i < i1; i++) {
        const float *p = a->x + i * a->hw * CUVIL_VL;
        float *q = a->y + i * a->hw * CUVIL_VL;
        cuvil_vf first = a->hw ? cuvil_vload(p) : cuvil_vsplat(0.f);
        double sums[CUVIL_VL], firsts[CUVIL_VL], vars[CUVIL_VL];
        float mean[CUVIL_VL], inv[CUVIL_VL];
        group_lanes(plane_sum(p, a->hw, first, 0), a->cg, sums);
        group_lanes(first, a->cg, firsts);
        for (int l = 0; l < CUVIL_VL; l++) mean[l] = (float)((firsts[l] * (double)a->hw + sums[l]) / count);
        cuvil_vf m;
        memcpy(&m, mean, sizeof m);
        group_lanes(plane_sum(p, a->hw, m, 1), a->cg, vars);
        for (int l = 0; l < CUVIL_VL; l++) inv[l] = (float)(1.0 / sqrt(vars[l] / count + a->eps));
        cuvil_vf s;
        memcpy(&s, inv, sizeof s);
        for (int64_t k = 0; k < a->hw; k++) cuvil_vstore(q + k * CUVIL_VL, (cuvil_vload(p + k * CUVIL_VL) - m) * s);
    }
}

void cuvil_group_norm_blocked(int64_t N, int64_t C, int64_t hw, int64_t groups, const float *x, float eps, float *y,
                              int nthreads) {
    int64_t cg = C / groups;
    if (cg % CUVIL_VL == 0) {        /* each group's blocks one after another: a row of the layer norm */
        cuvil_layer_norm(N * groups, cg * hw, x, 0, 0, eps, 0, y, nthreads);
        return;
    }
    group_norm_args a = {C / CUVIL_VL, hw, cg, x, eps, y};
    cuvil_parallel_for(N * C * hw > 8192 ? nthreads : 1, N * (C / CUVIL_VL), 1, group_norm_task, &a);
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
