/* Small in-register transposes (x86 with AVX2 or AVX-512): the conv product's turn to NCHW
 * (conv.c) and the relayouts of the channel-blocked layout (blocked.c). */
#ifndef CUVIL_TRANSPOSE_H
#define CUVIL_TRANSPOSE_H
#include "common.h"

#if defined(__AVX2__) && (CUVIL_VL == 8 || (CUVIL_VL == 16 && defined(__AVX512F__)))
#include <immintrin.h>
/* out[j][i] = src[i][j] for an 8 x 8 block (rows lds floats apart), in registers */
static inline void transpose8(const float *src, int64_t lds, __m256 out[8]) {
    __m256 r[8], u[8], v[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; i += 2) u[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), u[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    for (int i = 0; i < 8; i += 4)
        for (int h = 0; h < 2; h++) {
            v[i + 2 * h] = _mm256_shuffle_ps(u[i + h], u[i + h + 2], 0x44);
            v[i + 2 * h + 1] = _mm256_shuffle_ps(u[i + h], u[i + h + 2], 0xee);
        }
    for (int j = 0; j < 4; j++) {
        out[j] = _mm256_permute2f128_ps(v[j], v[j + 4], 0x20);
        out[j + 4] = _mm256_permute2f128_ps(v[j], v[j + 4], 0x31);
    }
}

/* t[j * ldt + i] = cb[i * ldc + j] for a whole VL x VL block, by 8 x 8 transposes in registers (element by
 * element, turning a 256 -> 1024-channel conv's 14x14 product to NCHW took a third of the GEMM's
 * time). Each row of t is stored as one vector: two 8-float halves, stored apart, stalled the vector
 * load that read them back on store forwarding. */
static inline void transpose_block(const float *cb, int64_t ldc, float *t, int64_t ldt) {
    for (int jb = 0; jb < CUVIL_VL; jb += 8) {
        __m256 lo[8];
        transpose8(cb + jb, ldc, lo);
#if CUVIL_VL == 16
        __m256 hi[8];
        transpose8(cb + 8 * ldc + jb, ldc, hi);
        for (int j = 0; j < 8; j++)
            _mm512_store_ps(t + (jb + j) * ldt, _mm512_castpd_ps(_mm512_insertf64x4(
                                           _mm512_castps_pd(_mm512_castps256_ps512(lo[j])), _mm256_castps_pd(hi[j]), 1)));
#else
        for (int j = 0; j < 8; j++) _mm256_store_ps(t + (jb + j) * ldt, lo[j]);
#endif
    }
}
#define CUVIL_TRANSPOSE_BLOCK 1
#endif
#endif
