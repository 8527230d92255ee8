/* Scalar exp, erf, tanh written branch-free (the same polynomials as vmath.h), so generated
 * pointwise loops that use them still auto-vectorize: a libm call would keep them scalar. */
#ifndef CUVIL_SMATH_H
#define CUVIL_SMATH_H
#include <stdint.h>
#include <string.h>
#include <math.h>

/* exp(r) on [-ln2/2, ln2/2] as 1 + r + P2 r^2 + ... + P6 r^6: a minimax fit for relative error (9e-8
 * evaluated in float, Horner). Six FMAs where the Cephes form before took eight operations for the same
 * accuracy: an exp-bound SiLU epilogue (EfficientNet) is that much shorter. vmath.h shares them. */
#define CUVIL_EXP_P6 1.3843596680089831e-3f
#define CUVIL_EXP_P5 8.374195545911789e-3f
#define CUVIL_EXP_P4 4.166800528764725e-2f
#define CUVIL_EXP_P3 1.6666430234909058e-1f
#define CUVIL_EXP_P2 4.999999403953552e-1f

/* 2^n scales p in two normal factors, so results below FLT_MIN come out as their subnormals (one factor
 * clamped x at -87.3, leaving 1.2e-38 where exp(-100) is 3.7e-44: softplus(-100) was off by 3e5 x). */
static inline float cuvil_fexp(float x) {
    float xc = x > 88.3762626647949f ? 88.3762626647949f : x;
    xc = xc < -103.972084f ? -103.972084f : xc;
    float n = xc * 1.44269504088896341f;
    n = (n + 12582912.f) - 12582912.f;
    float r = xc - n * 0.693359375f - n * -2.12194440e-4f;
    float p = CUVIL_EXP_P6;
    p = p * r + CUVIL_EXP_P5;
    p = p * r + CUVIL_EXP_P4;
    p = p * r + CUVIL_EXP_P3;
    p = p * r + CUVIL_EXP_P2;
    p = p * r + 1.f;
    p = p * r + 1.f;
    int32_t ni = (int32_t)n, e1 = ((ni >> 1) + 127) << 23, e2 = ((ni - (ni >> 1)) + 127) << 23;
    float s1, s2;
    memcpy(&s1, &e1, 4);
    memcpy(&s2, &e2, 4);
    float y = p * s1 * s2;
    y = x > 88.7228390f ? INFINITY : y;
    y = x < -103.972084f ? 0.f : y;
    return x != x ? x : y;
}

/* log(x): x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) = f - f^2 / 2 + f^3 P(f) for f = m - 1 (the
 * Cephes logf polynomial, ~1 ulp), e ln 2 added in two parts. Subnormals are scaled into the normal
 * range first; x < 0 and NaN give NaN, 0 gives -inf, inf gives inf. Branch-free, so loops of it
 * vectorize (libm's logf kept them scalar: softplus and log1p(exp(x)) ran at 27x eager's time). */
static inline float cuvil_flog(float x) {
    const int sub = x < 1.17549435e-38f;
    float xs = sub ? x * 8388608.f : x;
    int32_t i;
    memcpy(&i, &xs, 4);
    int32_t e = ((i >> 23) & 0xff) - 126 - (sub ? 23 : 0);
    i = (i & 0x007fffff) | 0x3f000000;                        /* m in [0.5, 1) */
    float m;
    memcpy(&m, &i, 4);
    const int low = m < 0.707106781186547524f;
    e -= low;
    float f = low ? m + m - 1.f : m - 1.f;
    float z = f * f;
    float p = 7.0376836292e-2f;
    p = p * f - 1.1514610310e-1f;
    p = p * f + 1.1676998740e-1f;
    p = p * f - 1.2420140846e-1f;
    p = p * f + 1.4249322787e-1f;
    p = p * f - 1.6668057665e-1f;
    p = p * f + 2.0000714765e-1f;
    p = p * f - 2.4999993993e-1f;
    p = p * f + 3.3333331174e-1f;
    float fe = (float)e;
    float y = p * f * z + fe * -2.12194440e-4f - 0.5f * z;
    y = f + y + fe * 0.693359375f;
    y = x == INFINITY ? x : y;
    y = x == 0.f ? -INFINITY : y;
    return x < 0.f || x != x ? NAN : y;
}

/* log(1 + x) as log(u) x / (u - 1), u = 1 + x: the rounding of u cancels (Goldberg), so small x keep
 * their relative accuracy; u = 1 gives x itself. */
static inline float cuvil_flog1p(float x) {
    float u = 1.f + x;
    float d = u - 1.f;
    float y = cuvil_flog(u) * (x / (d == 0.f ? 1.f : d));
    y = d == 0.f ? x : y;
    return x == INFINITY ? x : y;
}

/* sin and cos of a float, reduced in double: x = n pi/2 + r with pi/2 in three parts of 33 bits (each
 * n * part exact while n < 2^20, and r still good to float's precision far past that), then Taylor
 * polynomials of r in [-pi/4, pi/4] (errors 2e-9 and 1e-10 relative) picked by n mod 4. Branch-free, so
 * loops vectorize: libm's sinf / cosf kept them scalar (sin(x) + cos(x) at 6x eager's time). inf and NaN
 * give NaN. */
static inline void cuvil_sincos_reduced(float x, double *s, double *c, int64_t *q) {
    const double magic = 6755399441055744.0;                       /* 1.5 * 2^52: rounds to an integer */
    double d = (double)x, t = d * 0.636619772367581343 + magic, n = t - magic;
    int64_t bits;
    memcpy(&bits, &t, 8);
    *q = bits & 3;                                                 /* n mod 4, negative n included */
    double r = ((d - n * 1.57079632673412561417e+00) - n * 6.07710050630396597660e-11) - n * 2.02226624879595063154e-21;
    double z = r * r;
    *s = r + r * z * (-1.0 / 6 + z * (1.0 / 120 + z * (-1.0 / 5040 + z * (1.0 / 362880))));
    *c = 1.0 + z * (-0.5 + z * (1.0 / 24 + z * (-1.0 / 720 + z * (1.0 / 40320 + z * (-1.0 / 3628800)))));
}

static inline float cuvil_fsin(float x) {
    double s, c;
    int64_t q;
    cuvil_sincos_reduced(x, &s, &c, &q);
    double y = q & 1 ? c : s;
    return (float)(q & 2 ? -y : y);
}

static inline float cuvil_fcos(float x) {
    double s, c;
    int64_t q;
    cuvil_sincos_reduced(x, &s, &c, &q);
    double y = q & 1 ? s : c;
    return (float)((q + 1) & 2 ? -y : y);
}

/* erf(x) = x P(x^2) / Q(x^2) on [-4, 4], +-1 beyond: a least-squares rational fit of degree 5 / 5 in x^2,
 * its coefficients shared with vmath.h's cuvil_verf (a standalone erf or GELU and an epilogue's agree) */
#define CUVIL_ERF_P5 2.00097880e-06f
#define CUVIL_ERF_P4 2.86950265e-04f
#define CUVIL_ERF_P3 3.91954417e-03f
#define CUVIL_ERF_P2 5.32099340e-02f
#define CUVIL_ERF_P1 1.94178196e-01f
#define CUVIL_ERF_P0 1.12837902e+00f
#define CUVIL_ERF_Q5 3.76954440e-05f
#define CUVIL_ERF_Q4 1.19747822e-03f
#define CUVIL_ERF_Q3 1.52751321e-02f
#define CUVIL_ERF_Q2 1.15635199e-01f
#define CUVIL_ERF_Q1 5.05417514e-01f

/* erf as vmath.h's cuvil_verf computes it: 10 FMAs and a division where the A&S 7.1.26 form it replaces took an exp besides
 * (a standalone GELU at 1.7x eager's time). */
static inline float cuvil_ferf(float x) {
    float xc = x < -4.f ? -4.f : (x > 4.f ? 4.f : x);
    float z = xc * xc;
    float p = CUVIL_ERF_P5;
    p = p * z + CUVIL_ERF_P4;
    p = p * z + CUVIL_ERF_P3;
    p = p * z + CUVIL_ERF_P2;
    p = p * z + CUVIL_ERF_P1;
    p = p * z + CUVIL_ERF_P0;
    float q = CUVIL_ERF_Q5;
    q = q * z + CUVIL_ERF_Q4;
    q = q * z + CUVIL_ERF_Q3;
    q = q * z + CUVIL_ERF_Q2;
    q = q * z + CUVIL_ERF_Q1;
    q = q * z + 1.f;
    float y = xc * p / q;
    y = y < -1.f ? -1.f : (y > 1.f ? 1.f : y);
    return x != x ? x : y;
}

static inline float cuvil_ftanh(float x) {
    float ax = fabsf(x);
    float e = cuvil_fexp(-2.f * (ax > 20.f ? 20.f : ax));
    float y = (1.f - e) / (1.f + e);
    float x2 = x * x;
    float small = ax * (1.f + x2 * (-1.f / 3 + x2 * (2.f / 15)));
    y = ax < 0.0625f ? small : y;
    y = x < 0 ? -y : y;
    return x != x ? x : y;
}
#endif
