/* The first n lanes of a vector (0 <= n <= VL) loaded, the rest zero, or stored, the rest of memory
 * left as it is, without touching memory past them: the last, partial vector of a row (conv.c's
 * im2col runs and depthwise bands, gemm.c's edge panels and the strided B's last columns). */
#ifndef CUVIL_LANES_H
#define CUVIL_LANES_H
#include "common.h"

#if defined(__AVX512F__) && CUVIL_VL == 16
#include <immintrin.h>
/* AVX-512 masks lanes itself (element loops had cost ResNet's 7x7 and 14x14 edge panels) */
static inline cuvil_vf cuvil_vload_first(const float *p, int64_t n) {
    return (cuvil_vf)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}
static inline void cuvil_vstore_first(float *p, cuvil_vf v, int64_t n) {
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
}
#elif defined(__AVX2__) && CUVIL_VL == 8
#include <immintrin.h>
static const int32_t cuvil_lane_mask_table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
static inline __m256i cuvil_lane_mask(int64_t n) {
    return _mm256_loadu_si256((const __m256i *)(cuvil_lane_mask_table + 8 - n));
}
static inline cuvil_vf cuvil_vload_first(const float *p, int64_t n) {
    return (cuvil_vf)_mm256_maskload_ps(p, cuvil_lane_mask(n));
}
static inline void cuvil_vstore_first(float *p, cuvil_vf v, int64_t n) {
    _mm256_maskstore_ps(p, cuvil_lane_mask(n), (__m256)v);
}
#else
static inline cuvil_vf cuvil_vload_first(const float *p, int64_t n) {
    cuvil_vf v = cuvil_vsplat(0.f);
    for (int64_t u = 0; u < n; u++) v[u] = p[u];
    return v;
}
static inline void cuvil_vstore_first(float *p, cuvil_vf v, int64_t n) {
    for (int64_t u = 0; u < n; u++) p[u] = v[u];
}
#endif
#endif
