/* 3x3 stride-1 convolution by Winograd F(2x2, 3x3), NCHW: each 2x2 output tile comes from a 4x4
 * input patch with 16 multiplies per (in, out) channel pair instead of 36. The 16 elementwise
 * products of transformed tiles are 16 GEMMs (M = out channels, K = in channels, N = tiles) on the
 * packed GEMM; the filters are transformed (U = G g G^T) and packed at compile time
 * (codegen/c/lower_nn.py). */
#ifndef CUVIL_WINOGRAD_H
#define CUVIL_WINOGRAD_H
#include "conv.h"

/* y[0..5] = B^T x for six inputs (any of them vectors or scalars: a macro, so it serves both), F(4x4). */
#define WG4_BT(y0, y1, y2, y3, y4, y5, x0, x1, x2, x3, x4, x5) do { \
    y0 = 4 * (x0) - 5 * (x2) + (x4);                                  \
    y1 = (x3) + (x4) - 4 * ((x1) + (x2));                             \
    y2 = (x4) - (x3) + 4 * ((x1) - (x2));                             \
    y3 = (x4) - (x2) + 2 * ((x3) - (x1));                             \
    y4 = (x4) - (x2) + 2 * ((x1) - (x3));                             \
    y5 = 4 * (x1) - 5 * (x3) + (x5);                                  \
} while (0)

/* y[0..3] = A^T x for six inputs (vectors or scalars, as WG4_BT), F(4x4). */
#define WG4_AT(y0, y1, y2, y3, x0, x1, x2, x3, x4, x5) do {                     \
    __typeof__(x1) p12_ = (x1) + (x2), d12_ = (x1) - (x2), p34_ = (x3) + (x4), d34_ = (x3) - (x4); \
    y0 = (x0) + p12_ + p34_;                                                     \
    y1 = d12_ + 2 * d34_;                                                        \
    y2 = p12_ + 4 * p34_;                                                        \
    y3 = d12_ + 8 * d34_ + (x5);                                                 \
} while (0)

/* The same for F(2x2, 3x3): B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], A^T = [1 1 1 0; 0 1 -1 -1] */
#define WG2_BT(y0, y1, y2, y3, x0, x1, x2, x3) do { \
    y0 = (x0) - (x2); y1 = (x1) + (x2); y2 = (x2) - (x1); y3 = (x1) - (x3); \
} while (0)
#define WG2_AT(y0, y1, x0, x1, x2, x3) do { y0 = (x0) + (x1) + (x2); y1 = (x1) - (x2) - (x3); } while (0)

/* The widest input row the transforms take (their row buffers live on the stack). */
#define CUVIL_WINOGRAD_MAX_W 1024

/* Channels whose transformed panel rows an input transform holds before storing them, so that each
 * of the 16 or 36 operands gets a run of consecutive 64-byte rows. Stored channel by channel, F(4x4)
 * wrote 36 interleaved streams and its input transform stalled on the stores (a third of its time;
 * holding 4: 64 channels at 56x56 0.93x the conv's time, 128 at 28x28 0.95x, 1 and 2 threads). */
#define CUVIL_WINOGRAD_HELD 4

/* Held rows [nc][alpha2][NR] of channels row0.. into the alpha2 operands, vstride floats apart. */
static inline void cuvil_winograd_store_held(float *v, int64_t vstride, int alpha2, int64_t row0, int64_t nc,
                                             const float *held) {
    for (int xi = 0; xi < alpha2; xi++) {
        float *dst = v + xi * vstride + row0 * CUVIL_NR;
        for (int64_t j = 0; j < nc; j++) {
            const float *src = held + (j * alpha2 + xi) * CUVIL_NR;
            cuvil_vstore(dst + j * CUVIL_NR, cuvil_vload(src));
            cuvil_vstore(dst + j * CUVIL_NR + CUVIL_VL, cuvil_vload(src + CUVIL_VL));
        }
    }
}

/* Scratch floats: the transformed input (16 packed B operands) and the 16 products. */
int64_t cuvil_winograd_scratch(const cuvil_conv_shape *s);

/* y = act(conv(x, w) + bias + residual) for KH = KW = 3, strides and dilations 1, groups 1,
 * W <= CUVIL_WINOGRAD_MAX_W. up: 16 A operands (O x C), cuvil_packed_a_size(O, C) floats apart,
 * the one at xi = 4 * i + j holding U[i][j] of every (o, c). */
void cuvil_conv3x3_winograd(const cuvil_conv_shape *s, const float *x, const float *up, const float *bias,
                            const float *residual, float *y, int act, float *scratch, int nthreads);
/* The same by F(4x4, 3x3) (winograd4.c): 4x4 output tiles from 6x6 patches, 36 multiplies per tile
 * and channel pair where F(2x2) spends 64 on the same 16 outputs; 36 GEMMs on tiles a quarter as
 * many, and filters 2.25x the size. up: 36 A operands, U[i][j] at xi = 6 * i + j. */
int64_t cuvil_winograd4_scratch(const cuvil_conv_shape *s);
void cuvil_conv3x3_winograd4(const cuvil_conv_shape *s, const float *x, const float *up, const float *bias,
                             const float *residual, float *y, int act, float *scratch, int nthreads);
#endif
