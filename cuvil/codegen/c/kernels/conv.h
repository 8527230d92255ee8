/* 2-D convolution and pooling, NCHW (1-D runs as H = 1). General convs are im2col written
 * straight into the GEMM's packed panel layout, then the packed GEMM with a per-channel bias;
 * depthwise convs have a direct kernel. */
#ifndef CUVIL_CONV_H
#define CUVIL_CONV_H
#include "gemm.h"

typedef struct {
    int64_t N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, groups;
} cuvil_conv_shape;

/* Scratch floats the conv needs (packed im2col of one image and group). */
int64_t cuvil_conv_scratch(const cuvil_conv_shape *s);
/* y = act(conv(x, w) + bias + residual); bias and residual (shaped like y) may be NULL. wp: the filters
 * packed ahead as GEMM A operands, one cuvil_packed_a_size(O / groups, K) block per group, or NULL. */
void cuvil_conv2d(const cuvil_conv_shape *s, const float *x, const float *w, const float *wp, const float *bias,
                  const float *residual, float *y, int act, float *scratch, int nthreads);

/* mode 0: max, 1: avg excluding pads, 2: avg including declared pads (ph1, pw1 = bottom/right pads) */
void cuvil_pool2d(const cuvil_conv_shape *s, int64_t ph1, int64_t pw1, int mode, const float *x, float *y,
                  int nthreads);
#endif
