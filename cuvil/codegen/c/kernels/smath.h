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

static inline float cuvil_fexp(float x) {
    float xc = x > 88.3762626647949f ? 88.3762626647949f : x;
    xc = xc < -87.3365478515625f ? -87.3365478515625f : xc;
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
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, 4);
    float y = p * scale;
    y = x > 88.7228390f ? INFINITY : y;
    y = x < -103.972084f ? 0.f : y;
    return x != x ? x : y;
}

static inline float cuvil_ferf(float x) {
    float ax = fabsf(x);
    float t = 1.f / (1.f + 0.3275911f * ax);
    float poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f);
    float y = 1.f - poly * t * cuvil_fexp(-ax * ax);
    return x < 0 ? -y : (x != x ? x : y);
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
