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

/* C[M, N] (ldc) = epilogue(A[M, K] (lda) @ B); returns 0, or -1 where the buffer for bf16(A) could
 * not be allocated. */
int cuvil_sgemm_bf16dot(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const uint32_t *Bp,
                        float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads);
#endif
