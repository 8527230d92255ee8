/* GEMM in bf16 products with fp32 sums (compile's precision="bf16" where the CPU computes in bf16):
 * C = epilogue(bf16(A) @ B), B bf16 weights packed at compile time, A rounded to bf16 (nearest even)
 * as the GEMM reads it, each pair of products added to the fp32 sum as AVX512-BF16's vdpbf16ps adds
 * them (the odd product first). Built on every target: AVX512-BF16 runs the instruction, any other
 * the same arithmetic in portable C (the tests' oracle for layouts and edges on any host; the lowering
 * picks this kernel only where the CPU has the instruction). */
#ifndef CUVIL_BF16DOT_H
#define CUVIL_BF16DOT_H
#include "dot_out.h"
#include "lowp.h"
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

/* Panels of CUVIL_BF16_NR columns: Bp[p][k2][j] (uint32) holds B[2 k2][p NR + j] in its low half and
 * B[2 k2 + 1][p NR + j] in its high half, as bf16; zero past K and N (codegen/c/lower_bf16dot.py). */
#define CUVIL_BF16_NR CUVIL_DOT_NR

/* n floats at p -> (n + 1) / 2 words of bf16 pairs at out (element 2i low, 2i + 1 high; a last odd
 * element's high half 0), rounded to nearest even: vcvtneps2bf16 16 floats at a time with AVX512-BF16
 * (which also reads a subnormal input as 0), lowp.h's conversion elsewhere and for the rest. */
static inline void cuvil_bf16_round(const float *p, int64_t n, uint32_t *out) {
    int64_t i = 0;
#if defined(__AVX512BF16__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i / 2), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(p + i)));
#endif
    for (; i + 1 < n; i += 2)
        out[i / 2] = cv_f32_to_bfloat16(p[i], 0) | (uint32_t)cv_f32_to_bfloat16(p[i + 1], 0) << 16;
    if (i < n) out[i / 2] = cv_f32_to_bfloat16(p[i], 0);
}

/* Rows [0, rows) of A as bf16 pairs (K2 words a row) times panels [p0, p1) of Bp (N columns in all),
 * into o (its C and residual at the block's first row). */
void cuvil_bf16_rows(const uint32_t *Ab, int64_t rows, int64_t K2, const uint32_t *Bp, int64_t N, int64_t p0,
                     int64_t p1, const cuvil_dot_out *o);

/* C[M, N] (ldc) = epilogue(A[M, K] (lda) @ B); returns 0, or -1 where the buffer for bf16(A) could
 * not be allocated. */
int cuvil_sgemm_bf16dot(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const uint32_t *Bp,
                        float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads);
#endif
