/* GEMM in bf16 products with fp32 sums (compile's precision="bf16" where the CPU computes in bf16):
 * C = epilogue(bf16(A) @ B), B bf16 weights packed at compile time, A rounded to bf16 (nearest even)
 * as the GEMM reads it, each pair of products added to the fp32 sum as AVX512-BF16's vdpbf16ps adds
 * them (the odd product first). Built on every target: AVX512-BF16 runs the instruction, any other
 * the same arithmetic in portable C (the tests' oracle for layouts and edges on any host; the lowering
 * picks this kernel only where the CPU has the instruction). */
#ifndef CUVIL_BF16DOT_H
#define CUVIL_BF16DOT_H
#include "gemm.h"

/* Panels of CUVIL_BF16_NR columns: Bp[p][k2][j] (uint32) holds B[2 k2][p NR + j] in its low half and
 * B[2 k2 + 1][p NR + j] in its high half, as bf16; zero past K and N (codegen/c/lower_bf16dot.py). */
#define CUVIL_BF16_NR 64
static inline int64_t cuvil_bf16_panels_size(int64_t K, int64_t N) {
    return (N + CUVIL_BF16_NR - 1) / CUVIL_BF16_NR * CUVIL_BF16_NR * ((K + 1) / 2);
}

/* fp32 -> bf16 bit patterns, rounding to nearest even, NaN kept (quieted), as vcvtneps2bf16 does for
 * normal numbers; branch-free so that loops of it vectorize. */
static inline uint32_t cuvil_bf16_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    return (b & 0x7fffffffu) > 0x7f800000u ? (b >> 16) | 0x40u : rounded;
}

/* 16 floats at p -> 8 words of bf16 pairs at out (element 2i low, 2i + 1 high): one vcvtneps2bf16
 * with AVX512-BF16 (which also reads a subnormal input as 0), the bit arithmetic elsewhere. */
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif
static inline void cuvil_bf16_pairs16(const float *p, uint32_t *out) {
#if defined(__AVX512BF16__)
    _mm256_storeu_si256((__m256i *)out, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(p)));
#else
    for (int i = 0; i < 8; i++) out[i] = cuvil_bf16_bits(p[2 * i]) | cuvil_bf16_bits(p[2 * i + 1]) << 16;
#endif
}

/* Where a product goes: element (m, n) at C[n / nb * ldn + m * ldm + n % nb] (row-major: nb past N,
 * ldm = ldc; the channel-blocked layout: nb = CUVIL_BLOCK, ldn = pixels * nb, ldm = nb), the residual
 * in the same layout (res_ldm apart), then act(alpha * sum + bias_row[m] + bias_col[n] + residual). */
typedef struct {
    float *C;
    const float *bias_row, *bias_col, *residual;
    int64_t nb, ldn, ldm, res_ldm;
    float alpha;
    int act;
} cuvil_bf16_out;

/* Rows [0, rows) of A as bf16 pairs (K2 words a row) times panels [p0, p1) of Bp (N columns in all),
 * into o (its C and residual at the block's first row). */
void cuvil_bf16_rows(const uint32_t *Ab, int64_t rows, int64_t K2, const uint32_t *Bp, int64_t N, int64_t p0,
                     int64_t p1, const cuvil_bf16_out *o);

/* C[M, N] (ldc) = epilogue(A[M, K] (lda) @ B); returns 0, or -1 where the buffer for bf16(A) could
 * not be allocated. */
int cuvil_sgemm_bf16dot(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const uint32_t *Bp,
                        float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads);
#endif
