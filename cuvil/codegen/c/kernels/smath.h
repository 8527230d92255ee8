/* Scalar exp, erf, tanh written branch-free (the same polynomials as vmath.h), so generated
 * pointwise loops that use them still auto-vectorize: a libm call would keep them scalar. */
#ifndef CUVIL_SMATH_H
#define CUVIL_SMATH_H
#include <stdint.h>
#include <string.h>
#include <math.h>

static inline float cuvil_fexp(float x) {
    float xc = x > 88.3762626647949f ? 88.3762626647949f : x;
    xc = xc < -87.3365478515625f ? -87.3365478515625f : xc;
    float n = xc * 1.44269504088896341f;
    n = (n + 12582912.f) - 12582912.f;
    float r = xc - n * 0.693359375f - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
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
