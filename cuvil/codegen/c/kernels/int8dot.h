/* Integer dot products for compile's precision="int8" convs (AVX-512 VNNI; AVX2 vpmaddubsw): rows of A
 * as unsigned bytes (activations quantized with a zero point), B signed bytes (filters, symmetric per
 * output channel) packed at compile time, each lane's four products added into its int32 sum as
 * vpdpbusd adds them (no saturation: a sum stays below 2^31 for K <= CUVIL_I8_MAX_K); on AVX2 by
 * vpmaddubsw + vpmaddwd, A's bytes at most CUVIL_I8_LEVELS. The sums leave as
 * floats through cuvil_dot_store, whose scale_col and bias_col turn them back into the conv's scale.
 * Built on every target: VNNI runs the instruction, any other the same integer sums in portable C
 * (the tests' oracle for layouts and edges on any host; the lowering picks this kernel only where the
 * CPU has the instruction). */
#ifndef CUVIL_INT8DOT_H
#define CUVIL_INT8DOT_H
#include "dot_out.h"

#define CUVIL_I8_NR CUVIL_DOT_NR
#define CUVIL_I8_MAX_K 65792          /* 65792 * 255 * 128 < 2^31 */

/* The activation bytes' top level: 255 where the sums are exact at any byte (vpdpbusd, portable C);
 * 127 on AVX2 without VNNI, whose vpmaddubsw adds two u8 x s8 products into 16 bits with saturation
 * (255 * 127 * 2 would pass 32767; 127 * 128 * 2 does not). cuvil_i8_levels: the build's. */
#if defined(__AVX2__) && !defined(__AVX512VNNI__)
#define CUVIL_I8_LEVELS 127
#else
#define CUVIL_I8_LEVELS 255
#endif
int cuvil_i8_levels(void);

/* Panels of CUVIL_I8_NR columns: Bp[p][k4][j] (uint32) holds B[4 k4 + i][p NR + j] in byte i; zero
 * past K and N (codegen/c/lower_int8dot.py). */

/* Rows [0, rows) of A (K4 words of four bytes a row) times panels [p0, p1) of Bp (N columns in all),
 * into o (its C and residual at the block's first row). */
void cuvil_i8_rows(const uint32_t *Aq, int64_t rows, int64_t K4, const uint32_t *Bp, int64_t N, int64_t p0,
                   int64_t p1, const cuvil_dot_out *o);

/* A 3 x 3 conv's rows of A where they lie in its padded image, instead of copied side by side: output
 * pixel m's window starts at pixel pix[m] of x (C bytes a pixel, C % 4 == 0), its 3 filter rows run_step
 * pixels apart, each 3 pixels side by side; neighbours in an output row `step` pixels apart (the stride);
 * col0 the first row's column of OW. */
typedef struct {
    const uint8_t *x;
    const int64_t *pix;                   /* at the block's first row */
    int64_t C, OW, col0, step, run_step;
} cuvil_i8_window;

/* cuvil_i8_rows over w's windows, into bytes (o's byte image; N a multiple of CUVIL_I8_NR): 0 where it
 * cannot (another output, a build without VNNI), and the caller copies the rows instead. spare: room for
 * 6 rows of K4 words (the tiles an output row's end cuts short are copied). */
int cuvil_i8_window_rows(const cuvil_i8_window *w, int64_t rows, int64_t K4, const uint32_t *Bp, int64_t N,
                         int64_t p0, int64_t p1, const cuvil_dot_out *o, uint8_t *spare);

/* A linear layer of a quantized model on its own activation grid (matmul_q's int8_range: an ONNX QDQ or
 * PT2E model's), or with range 0 each row on its own range (precision="int8" without a grid, where the CPU
 * has AMX tiles): C[M][N] (ldc) = act(A[M][K] (lda) on bytes over range [lo, hi] as an int8 conv maps its
 * input, times Bp (cuvil_i8_rows' panels of the int8 weights) * wterms[n] + bias[n] + residual[M][N]),
 * wterms [2][N] each column's weight scale and that times its integer weights' sum (the zero point's
 * share). int8_matmul.c; nonzero when out of memory. */
int cuvil_matmul_int8(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const uint32_t *Bp,
                      const float *wterms, const float *bias, const float *residual, const float *range, float *C,
                      int64_t ldc, int act, int nthreads);
#endif
