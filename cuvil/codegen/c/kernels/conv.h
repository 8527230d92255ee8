/* 2-D convolution and pooling, NCHW (1-D runs as H = 1). General convs are implicit GEMMs: the
 * GEMM asks for each K block of each panel of im2col as it needs it, so the im2col matrix never
 * exists whole; 1x1 stride-1 convs pack their input as the GEMM's B; depthwise convs have a direct
 * kernel; 3x3 stride-1 ones with enough channels go to winograd.h. */
#ifndef CUVIL_CONV_H
#define CUVIL_CONV_H
#include "gemm.h"

typedef struct {
    int64_t N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, groups;
} cuvil_conv_shape;

/* Scratch floats for a packed B of one image and group: a 1x1 conv's input, or the whole im2col
 * (codegen passes it only when the filters span several M blocks of the GEMM, which would each
 * redo an implicit im2col; without scratch the conv is an implicit GEMM). */
int64_t cuvil_conv_scratch(const cuvil_conv_shape *s);
/* y = act(conv(x, w) + bias + residual); bias and residual (shaped like y) may be NULL. wp: the filters
 * packed ahead as GEMM A operands, one cuvil_packed_a_size(O / groups, K) block per group, or NULL. */
void cuvil_conv2d(const cuvil_conv_shape *s, const float *x, const float *w, const float *wp, const float *bias,
                  const float *residual, float *y, int act, float *scratch, int nthreads);

/* An ungrouped conv as the GEMM (pixels x in-channel taps) @ (taps x out channels): the filters packed
 * ahead as the GEMM's B panels (cuvil_pack_b of w as [O][C * KH * KW], trans), the input read as a
 * transposed A, in place for a 1x1 stride-1 unpadded conv and through im2col rows [taps][pixels]
 * otherwise. Its product comes out pixel-major in scratch (cuvil_conv_swapped_scratch floats, the
 * rows after it) and is turned to NCHW with the epilogue. With the pixels as N instead, a 7x7 map's
 * 49 columns fill two 32-wide panels to 77%, a 14x14's 196 seven to 88%. */
int64_t cuvil_conv_swapped_scratch(const cuvil_conv_shape *s);
void cuvil_conv_swapped(const cuvil_conv_shape *s, const float *x, const float *wb, const float *bias,
                        const float *residual, float *y, int act, float *scratch, int nthreads);

/* mode 0: max, 1: avg excluding pads, 2: avg including declared pads (ph1, pw1 = bottom/right pads) */
void cuvil_pool2d(const cuvil_conv_shape *s, int64_t ph1, int64_t pw1, int mode, const float *x, float *y,
                  int nthreads);
#endif
