/* IEEE half precision <-> float: F16C / AVX-512 conversions where the target has them, bit operations
 * elsewhere. Used by fp16 weight panels (gemm.c) and fp16 KV caches (llm.c, attention.c). */
#ifndef CUVIL_HALF_H
#define CUVIL_HALF_H
#include "common.h"
#include <string.h>
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef uint32_t cuvil_vu32 __attribute__((vector_size(CUVIL_VL * 4), aligned(4), may_alias));

/* VL halves -> VL floats (the bit path: exponent rebias by a multiply, which also gets subnormals
 * right; infinities and NaNs by an OR). */
static inline cuvil_vf cuvil_vload_f16(const uint16_t *p) {
#if defined(__AVX512F__) && CUVIL_VL == 16
    return (cuvil_vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif defined(__F16C__) && CUVIL_VL == 8
    return (cuvil_vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    typedef uint16_t vu16 __attribute__((vector_size(CUVIL_VL * 2), aligned(2)));
    cuvil_vu32 h = __builtin_convertvector(*(const vu16 *)p, cuvil_vu32);
    cuvil_vu32 e = h & 0x7fffu;
    cuvil_vf f = (cuvil_vf)(e << 13) * cuvil_vsplat(0x1p112f);
    cuvil_vu32 special = (cuvil_vu32)(e >= 0x7c00u) & 0x7f800000u;
    return (cuvil_vf)((cuvil_vu32)f | special | ((h & 0x8000u) << 16));
#endif
}

static inline float cuvil_f16_to_f32(uint16_t h) {
    uint32_t e = h & 0x7fffu, u;
    float f;
    u = e << 13;
    memcpy(&f, &u, 4);
    f *= 0x1p112f;
    memcpy(&u, &f, 4);
    u |= (e >= 0x7c00u ? 0x7f800000u : 0u) | ((uint32_t)(h & 0x8000u) << 16);
    memcpy(&f, &u, 4);
    return f;
}

/* float -> half, rounded to nearest even; past the half range: infinity; NaN stays NaN. */
static inline uint16_t cuvil_f32_to_f16(float x) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(x, 0);
#else
    uint32_t f, sign;
    memcpy(&f, &x, 4);
    sign = (f >> 16) & 0x8000u;
    f &= 0x7fffffffu;
    if (f >= 0x47800000u)                           /* 65536 and up, infinities, NaN */
        return (uint16_t)(sign | (f > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (f < 0x38800000u) {                          /* below 2^-14: a subnormal half (or zero) */
        /* adding 0.5 (as a float) puts the half's subnormal bits in the low mantissa, rounded to even */
        const uint32_t magic_u = 126u << 23;
        float m, v;
        memcpy(&m, &magic_u, 4);
        memcpy(&v, &f, 4);
        v += m;
        memcpy(&f, &v, 4);
        return (uint16_t)(sign | (f - magic_u));
    }
    f += 0xc8000fffu + ((f >> 13) & 1u);            /* rebias the exponent (-112 << 23), round to even */
    return (uint16_t)(sign | (f >> 13));
#endif
}
#endif
