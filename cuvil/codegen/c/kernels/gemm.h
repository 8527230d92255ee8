/* fp32 GEMM, BLIS style: B packed into panels of CUVIL_NR columns (at compile time for weights,
 * at run time otherwise), A read in place, MR x NR register tiles, K blocked for L1,
 * (M block x N panels) tasks spread over the threads. C = A @ B (+ bias) (+ act). */
#ifndef CUVIL_GEMM_H
#define CUVIL_GEMM_H
#include "common.h"

#define CUVIL_NR (2 * CUVIL_VL)
/* register tile rows: 8 x 2 vectors on AVX-512 (16 accumulators of 32 registers; against 6 rows, C
 * harness new/old time 0.94-0.96 on M = 128 GEMMs, 0.96-0.98 on large ones, 1 and 2 threads: each pair
 * of B loads feeds 16 FMAs, not 12, and 128 rows are 16 whole tiles, not 21 and an edge of 2); 6 rows
 * (12 accumulators) where there are 16 registers */
#if CUVIL_VL == 16
#define CUVIL_MR 8
#else
#define CUVIL_MR 6
#endif
/* K and M block sizes; the weights packed at compile time follow them (codegen/c/gemm_plan.py GEMM_KC,
 * GEMM_MC, checked by a _Static_assert in each model), so they are not a -D option */
#define CUVIL_KC 384
#define CUVIL_MC 120

/* Packed size in floats of a K x N operand. */
static inline int64_t cuvil_packed_b_size(int64_t K, int64_t N) { return ((N + CUVIL_NR - 1) / CUVIL_NR) * CUVIL_NR * K; }

/* Bp[p][k][j] = B[k][p*NR + j] (zero past N). trans: B is given as N x K (ldb along K). */
void cuvil_pack_b(int64_t K, int64_t N, const float *B, int64_t ldb, int trans, float *Bp, int nthreads);

/* The fused epilogue, applied once as each tile of C is written:
 * C = act(alpha * (A @ B) + bias_row[m] + bias_col[n] + residual[m, n]). Pointers may be NULL. */
typedef struct {
    const float *bias_row, *bias_col, *residual;
    int64_t ldr;
    float alpha;
    int act;
} cuvil_epilogue;

/* C[m0:m1, n0:n1] = act(C) in place, vectorised (the epilogue's activation after the tiles). */
void cuvil_activate_block(float *C, int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int act);

/* C[M,N] (ldc) = epilogue(A[M,K] (lda) @ Bp); ep may be NULL (plain product). b_cached: Bp is
 * expected in the last-level cache (a model whose weights fit in it, called again and again), so a
 * one-row product reads it without the software prefetch that streams from DRAM need. */
void cuvil_sgemm_packed(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *Bp,
                        float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads, int b_cached);

/* The same with A given transposed: A[m][k] = At[k * lda + m] (a 1x1 conv's NCHW input as the A of
 * pixels x channels, conv.h's cuvil_conv_swapped). */
void cuvil_sgemm_at_packed(int64_t M, int64_t N, int64_t K, const float *At, int64_t lda, const float *Bp,
                           float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads);

/* The same with A also packed ahead (constant weights as the left operand, e.g. conv filters):
 * Ap laid out as cuvil_pack_a_size describes, zero rows past M. */
static inline int64_t cuvil_packed_a_size(int64_t M, int64_t K) { return ((M + CUVIL_MR - 1) / CUVIL_MR) * CUVIL_MR * K; }
/* Ap: for each K block k0 (KC deep, kc = its depth), for each tile of MR rows ti:
 * Ap[(k0 * tiles + ti * kc) * MR + k * MR + i] = A[ti * MR + i][k0 + k]. */
void cuvil_sgemm_packed_ab(int64_t M, int64_t N, int64_t K, const float *Ap, const float *Bp,
                           float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads);

/* Weight-only quantized B, dequantized inside the GEMM one K block x NR panel at a time:
 * bits 8: int8 panels [np][K][NR]; bits 4: uint8 panels [np][K][NR/2] (byte j: column j in the low
 * nibble, column j + NR/2 in the high one; value - 8); bits 16: bf16 panels [np][K][NR] (32-bit lane e:
 * column e low, e + VL high); CUVIL_B_FP16: IEEE half panels [np][K][NR] in column order.
 * scales [np][K/group][NR] (NULL for 16-bit formats). */
#define CUVIL_B_FP16 (-16)
void cuvil_sgemm_quant(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const void *Bq, int bits,
                       const float *scales, int64_t group, float *C, int64_t ldc, const cuvil_epilogue *ep,
                       int nthreads);

/* B produced block by block by the caller instead of read from memory (implicit GEMM: a conv's
 * im2col written straight into the micro-kernel's L1 buffer, never into a whole packed copy):
 * fn fills buf with panel p's rows [k0, k0 + kc) as [kc][NR] (zero past N) and returns it. */
typedef const float *(*cuvil_b_producer)(const void *ctx, int64_t p, int64_t k0, int64_t kc, float *buf);
typedef struct { cuvil_b_producer fn; const void *ctx; } cuvil_b_source;
#define CUVIL_B_PRODUCED (-1)
/* C = epilogue(A @ B), A given row-major (lda = K) or packed ahead (Ap, as cuvil_sgemm_packed_ab;
 * A is then NULL), B from src. */
void cuvil_sgemm_produced_b(int64_t M, int64_t N, int64_t K, const float *A, const float *Ap,
                            const cuvil_b_source *src, float *C, int64_t ldc, const cuvil_epilogue *ep,
                            int nthreads);

/* C = epilogue(A @ B) with B read in place, row-major, ldb floats between its rows: no packed copy;
 * A row-major (lda = K) or packed ahead (Ap, A NULL) as in cuvil_sgemm_produced_b.
 * Any N: an edge panel's columns are copied with masked loads (no read past a row's end). A 1x1 conv's
 * input is its B: packing it had been 10-30% of such a conv (the less, the more filters share it). */
#define CUVIL_B_STRIDED (-2)
void cuvil_sgemm_strided_b(int64_t M, int64_t N, int64_t K, const float *A, const float *Ap, const float *B,
                           int64_t ldb, float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads);

/* Generic strided matmul for dtypes without a fast path (double, integers). */
#define CUVIL_NAIVE_MATMUL_DECL(T, NAME) \
    void NAME(int64_t M, int64_t N, int64_t K, const T *A, int64_t lda, const T *B, int64_t ldb, T *C, int64_t ldc);
CUVIL_NAIVE_MATMUL_DECL(double, cuvil_matmul_f64)
CUVIL_NAIVE_MATMUL_DECL(int64_t, cuvil_matmul_i64)
CUVIL_NAIVE_MATMUL_DECL(int32_t, cuvil_matmul_i32)
#endif
