/* Integer-dot GEMM for weight-quantized language models (the scheme of ggml's Q4_0 x Q8_0):
 * activations are quantized to int8 per block of `ablock` values along K (scale = amax / 127),
 * products are summed in integers, and the float scales are applied once per block.
 *
 * Weights are stored in blocks of eight columns (N padded with zero columns), in chunks along K; a
 * 32-bit lane is one column, so the integer dot products come out eight columns to a vector. Four
 * blocks make a quad (32 columns, N padded to whole quads), chunk-interleaved: [N/32][chunks][4][32],
 * so a decode step (M = 1), whose tile is a quad, reads the weights as one sequential stream (Zen 5,
 * int4 from DRAM at 2 threads: 42-43 GB/s against 31-36 as four streams side by side). A block's
 * 32-byte chunks:
 *   int4: uint8 [N/8][K/8][32]: chunk c holds K values 8c .. 8c + 7, byte 4j + i holding k = 8c + i
 *         (low nibble) and k = 8c + 4 + i (high nibble) of column j, as value + 8 in [0, 15].
 *         Scales float16 [N/32][K/group][32], group = ablock in {32, 64, 128} (half the bytes of float
 *         ones: 4.25 bits per weight at group 64, where ggml's Q4_0 carries 4.5); the scales of the
 *         four blocks a decode tile reads side by side are one stream, not four (0.8x the time at
 *         group 32, 0.9x at 64).
 *   int8: int8 [N/8][K/4][32]: chunk c holds K values 4c .. 4c + 3, byte 4j + i holding k = 4c + i
 *         of column j. One scale per column (float [N/32 * 32]); ablock in {32, 64, 128}.
 * K must be a multiple of 64 (int4) or of ablock (int8). C[M,N] (ldc) = epilogue(A[M,K] (lda) @ W), the
 * epilogue of gemm.h (bias, residual, activation; NULL: the plain product). A has kv <= K columns: the
 * weights' rows past kv are zero padding to a whole activation block, and A reads as zeros there.
 * Returns nonzero when the activation buffer cannot be allocated. */
#ifndef CUVIL_QGEMM_H
#define CUVIL_QGEMM_H
#include "gemm.h"

int cuvil_qgemm(int64_t M, int64_t N, int64_t K, int64_t kv, const float *A, int64_t lda, const void *W, int bits,
                 const void *scales, int64_t ablock, float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads);

/* Activation quantization: q[M][K] int8, d[M][K/blk] scales (q * d ~ A; A's columns past kv read as 0),
 * xsum (where not NULL) [M][K/blk] the sums of each block's bytes. */
void cuvil_quantize_rows(int64_t M, int64_t K, int64_t kv, const float *A, int64_t lda, int64_t blk, int8_t *q,
                         float *d, int32_t *xsum);
#endif
