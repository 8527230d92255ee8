/* Vector exp, erf, tanh for fused epilogues: libm's scalar calls would dominate a GELU after a
 * GEMM. Accurate to a few ulp in the range activations see (exp: ~1e-7 relative; erf: 3.4e-7 abs
 * over [-6, 6], relative accuracy kept near 0). NaN in gives NaN out. */
#ifndef CUVIL_VMATH_H
#define CUVIL_VMATH_H
#include "common.h"
#include "smath.h"
#include "tuning.h"

typedef int32_t cuvil_vi __attribute__((vector_size(CUVIL_VL * 4)));

/* m ? a : b lane by lane (C has no vector ?:); m is a comparison result, all ones or all zeros. */
static inline cuvil_vf cuvil_vsel(cuvil_vi m, cuvil_vf a, cuvil_vf b) {
    return (cuvil_vf)(((cuvil_vi)a & m) | ((cuvil_vi)b & ~m));
}

/* x limited to [lo, hi], for x not NaN (a NaN comes out as a bound: callers that keep NaN select it
 * back). One min and one max where the target has them: the two compares and selects of the
 * portable form made erf's clamps a quarter of a GELU's time. */
#if defined(__AVX512F__) && CUVIL_VL == 16
#include <immintrin.h>
static inline cuvil_vf cuvil_vclamp(cuvil_vf x, float lo, float hi) {
    return (cuvil_vf)_mm512_min_ps(_mm512_max_ps((__m512)x, _mm512_set1_ps(lo)), _mm512_set1_ps(hi));
}
#elif defined(__AVX__) && CUVIL_VL == 8
#include <immintrin.h>
static inline cuvil_vf cuvil_vclamp(cuvil_vf x, float lo, float hi) {
    return (cuvil_vf)_mm256_min_ps(_mm256_max_ps((__m256)x, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
}
#else
static inline cuvil_vf cuvil_vclamp(cuvil_vf x, float lo, float hi) {
    cuvil_vf l = cuvil_vsplat(lo), h = cuvil_vsplat(hi);
    x = cuvil_vsel(x < l, l, x);
    return cuvil_vsel(x > h, h, x);
}
#endif

/* a / c for a constant c, as vdivps rounds it. Where CUVIL_FAST_DIV (tuning.h: Intel AVX-512, whose
 * vdivps zmm issues once in 10-16 cycles) the quotient q = a (1 / c) and one correction q + (a - q c) / c:
 * the remainder is exact in an FMA, so the correction rounds as the division does (checked on all
 * 2^32 floats for c = 6: alike but for quotients below 1e-37). Applied only where the remainder is a
 * number other than 0: a zero leaves q exact and its sign (-0 + 0 is +0), and a NaN comes with a q
 * that is infinite or NaN, as the division gives it. Only for constants: a reciprocal of a variable b
 * (vrcp14ps and a Newton step) made SiLU and sigmoid slower, their exp's FMAs already filling the
 * ports that vdivps leaves free. */
#if defined(__AVX512F__) && CUVIL_VL == 16 && CUVIL_FAST_DIV
static inline cuvil_vf cuvil_vdiv_by(cuvil_vf a, float c) {
    const __m512 y = _mm512_set1_ps(1.f / c);
    __m512 q = _mm512_mul_ps((__m512)a, y), r = _mm512_fnmadd_ps(q, _mm512_set1_ps(c), (__m512)a);
    return (cuvil_vf)_mm512_mask3_fmadd_ps(r, y, q, _mm512_cmp_ps_mask(r, _mm512_setzero_ps(), _CMP_NEQ_OQ));
}
#else
static inline cuvil_vf cuvil_vdiv_by(cuvil_vf a, float c) { return a / cuvil_vsplat(c); }
#endif

/* torch's relu and relu6, NaN kept: one max (and one min) where the target has them, x their second
 * operand, which x86's max and min return where either is NaN (and where both are zeros: -0 stays -0,
 * as the select x < 0 ? 0 : x left it). The compare-and-select forms had cost 5 and 10 instructions a
 * vector on AVX-512 (the compare's mask moved into a vector, then and / andnot / or): MobileNetV2's
 * 16 -> 96 1x1 conv with ReLU6 ran 0.88x as fast as without it. */
#if defined(__AVX512F__) && CUVIL_VL == 16
static inline cuvil_vf cuvil_vrelu(cuvil_vf x) { return (cuvil_vf)_mm512_max_ps(_mm512_setzero_ps(), (__m512)x); }
static inline cuvil_vf cuvil_vrelu6(cuvil_vf x) {
    return (cuvil_vf)_mm512_min_ps(_mm512_set1_ps(6.f), _mm512_max_ps(_mm512_setzero_ps(), (__m512)x));
}
#elif defined(__AVX__) && CUVIL_VL == 8
static inline cuvil_vf cuvil_vrelu(cuvil_vf x) { return (cuvil_vf)_mm256_max_ps(_mm256_setzero_ps(), (__m256)x); }
static inline cuvil_vf cuvil_vrelu6(cuvil_vf x) {
    return (cuvil_vf)_mm256_min_ps(_mm256_set1_ps(6.f), _mm256_max_ps(_mm256_setzero_ps(), (__m256)x));
}
#else
static inline cuvil_vf cuvil_vrelu(cuvil_vf x) { return cuvil_vsel(x < 0, cuvil_vsplat(0.f), x); }
static inline cuvil_vf cuvil_vrelu6(cuvil_vf x) {
    return cuvil_vsel(x < 0, cuvil_vsplat(0.f), cuvil_vsel(x > 6, cuvil_vsplat(6.f), x));
}
#endif

/* The larger of m and x, NaN where either is (torch's max pooling carries a NaN in a window to its
 * output; the select x > m ? x : m had dropped it). x86's max returns its second operand where either
 * is NaN, so max(m, x) carries x's; m's NaN is kept by a select on m's unordered self-compare. */
static inline cuvil_vf cuvil_vmax_nan(cuvil_vf m, cuvil_vf x) {
#if defined(__AVX512F__) && CUVIL_VL == 16
    __m512 r = _mm512_max_ps((__m512)m, (__m512)x);
    return (cuvil_vf)_mm512_mask_mov_ps(r, _mm512_cmp_ps_mask((__m512)m, (__m512)m, _CMP_UNORD_Q), (__m512)m);
#elif defined(__AVX__) && CUVIL_VL == 8
    __m256 r = _mm256_max_ps((__m256)m, (__m256)x);
    return (cuvil_vf)_mm256_blendv_ps(r, (__m256)m, _mm256_cmp_ps((__m256)m, (__m256)m, _CMP_UNORD_Q));
#else
    return cuvil_vsel(m != m, m, cuvil_vsel(x > m, x, cuvil_vsel(x != x, x, m)));
#endif
}

/* CUVIL_VL bytes at p widened to floats: vpmovzxbd + vcvtdq2ps where the target has them (GCC 12
 * turns a byte vector's __builtin_convertvector into one scalar conversion a lane). */
#if defined(__AVX512F__) && CUVIL_VL == 16
static inline cuvil_vf cuvil_vload_bytes(const uint8_t *p) {
    return (cuvil_vf)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
#elif defined(__AVX2__) && CUVIL_VL == 8
static inline cuvil_vf cuvil_vload_bytes(const uint8_t *p) {
    return (cuvil_vf)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
#else
static inline cuvil_vf cuvil_vload_bytes(const uint8_t *p) {
    cuvil_vf v;
    for (int i = 0; i < CUVIL_VL; i++) v[i] = (float)p[i];
    return v;
}
#endif

#if defined(__AVX512F__) && CUVIL_VL == 16
/* exp(x) for x in [-104, 89] (or NaN, kept): the same reduction and polynomial as the portable form
 * below, 2^n by vscalefps (inf past the top of the exponent range, denormals and 0 past the bottom).
 * n is rounded by adding and subtracting 1.5 * 2^23, the multiply by log2(e) fused into the add: two
 * operations where vrndscaleps (two uops on Intel) and its multiply took three. A SiLU vector in L1
 * took 0.89x the time (Intel AVX-512), its exp and division as accurate as before (1.0e-7 relative).
 * Also softmax's exp of x <= 0 (attention.c). */
static inline __m512 cuvil_vexp_in_range(__m512 x) {
    const __m512 shifter = _mm512_set1_ps(12582912.f);
    __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shifter), shifter);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(CUVIL_EXP_P6), r, _mm512_set1_ps(CUVIL_EXP_P5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CUVIL_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CUVIL_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CUVIL_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

/* 15 instructions where the portable form takes 25, which made a SiLU epilogue cost as much as its 1x1
 * conv (EfficientNet's 16 -> 96 channels at 112x112, AVX-512). The clamps keep NaN (max and min return
 * their second operand when either is NaN), so exp(+-inf) is inf and 0. */
static inline cuvil_vf cuvil_vexp(cuvil_vf x) {
    return (cuvil_vf)cuvil_vexp_in_range(
        _mm512_min_ps(_mm512_set1_ps(89.f), _mm512_max_ps(_mm512_set1_ps(-104.f), (__m512)x)));
}
#else
static inline cuvil_vf cuvil_vexp(cuvil_vf x) {
    cuvil_vf xc = cuvil_vclamp(x, -87.3365478515625f, 88.3762626647949f);
    cuvil_vf n = xc * cuvil_vsplat(1.44269504088896341f);
    /* round to nearest: add and subtract 1.5 * 2^23 */
    n = (n + cuvil_vsplat(12582912.f)) - cuvil_vsplat(12582912.f);
    cuvil_vf r = xc - n * cuvil_vsplat(0.693359375f) - n * cuvil_vsplat(-2.12194440e-4f);
    cuvil_vf p = cuvil_vsplat(CUVIL_EXP_P6);
    p = p * r + cuvil_vsplat(CUVIL_EXP_P5);
    p = p * r + cuvil_vsplat(CUVIL_EXP_P4);
    p = p * r + cuvil_vsplat(CUVIL_EXP_P3);
    p = p * r + cuvil_vsplat(CUVIL_EXP_P2);
    p = p * r + cuvil_vsplat(1.f);
    p = p * r + cuvil_vsplat(1.f);
    cuvil_vi e = (__builtin_convertvector(n, cuvil_vi) + 127) << 23;
    cuvil_vf scale;
    memcpy(&scale, &e, sizeof scale);
    cuvil_vf y = p * scale;
    /* NaN kept and exp(x > ln(FLT_MAX)) = inf (the clamp alone left FLT_MAX / 1.4, so SiLU(-inf) came
     * out -inf where torch gives NaN): x * inf is both, from one unordered-or-greater compare */
    return cuvil_vsel(~(x <= cuvil_vsplat(88.7228390f)), x * cuvil_vsplat(INFINITY), y);
}
#endif

/* erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (a least-squares rational fit of degree 5 / 5 in x^2), +-1
 * beyond: 10 FMAs and a division. The exp-based A&S 7.1.26 form it replaces cost 0.94-0.95x more time
 * in a GELU-epilogue GEMM at K = 384 (MiniLM's FFN) and lost relative accuracy near 0 (5e-7 abs
 * where erf is 0.03). */
static inline cuvil_vf cuvil_verf(cuvil_vf x) {
    const cuvil_vf one = cuvil_vsplat(1.f);
    cuvil_vf xc = cuvil_vclamp(x, -4.f, 4.f);
    cuvil_vf z = xc * xc;
    cuvil_vf p = cuvil_vsplat(CUVIL_ERF_P5);                      /* smath.h's coefficients */
    p = p * z + cuvil_vsplat(CUVIL_ERF_P4);
    p = p * z + cuvil_vsplat(CUVIL_ERF_P3);
    p = p * z + cuvil_vsplat(CUVIL_ERF_P2);
    p = p * z + cuvil_vsplat(CUVIL_ERF_P1);
    p = p * z + cuvil_vsplat(CUVIL_ERF_P0);
    cuvil_vf q = cuvil_vsplat(CUVIL_ERF_Q5);
    q = q * z + cuvil_vsplat(CUVIL_ERF_Q4);
    q = q * z + cuvil_vsplat(CUVIL_ERF_Q3);
    q = q * z + cuvil_vsplat(CUVIL_ERF_Q2);
    q = q * z + cuvil_vsplat(CUVIL_ERF_Q1);
    q = q * z + one;
    cuvil_vf y = cuvil_vclamp(xc * p / q, -1.f, 1.f);
    return cuvil_vsel(x != x, x, y);                              /* keep NaN */
}

static inline cuvil_vf cuvil_vtanh(cuvil_vf x) {
    cuvil_vf ax = cuvil_vsel(x < 0, -x, x);
    cuvil_vf e = cuvil_vexp(cuvil_vsplat(-2.f) * cuvil_vclamp(ax, 0.f, 20.f));
    cuvil_vf y = (cuvil_vsplat(1.f) - e) / (cuvil_vsplat(1.f) + e);
    /* small |x|: the series keeps relative accuracy where 1 - e cancels */
    cuvil_vf x2 = x * x;
    cuvil_vf small = ax * (cuvil_vsplat(1.f) + x2 * (cuvil_vsplat(-1.f / 3) + x2 * cuvil_vsplat(2.f / 15)));
    y = cuvil_vsel(ax < cuvil_vsplat(0.0625f), small, y);
    y = cuvil_vsel(x < 0, -y, y);
    return cuvil_vsel(x != x, x, y);
}

/* The epilogue activations (activations.h) on a vector. */
static inline cuvil_vf cuvil_vact(cuvil_vf x, int act) {
    switch (act) {
#define CUVIL_ACT_CASE(NAME, code, scalar, vector) case CUVIL_ACT_##NAME: return vector;
    CUVIL_ACTIVATIONS(CUVIL_ACT_CASE)
#undef CUVIL_ACT_CASE
    default: return x;
    }
}
#endif
