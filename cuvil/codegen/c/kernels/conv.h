/* 2-D convolution and pooling, NCHW (1-D runs as H = 1). General convs are implicit GEMMs: the
 * GEMM asks for each K block of each panel of im2col as it needs it, so the im2col matrix never
 * exists whole; 1x1 stride-1 convs pack their input as the GEMM's B; depthwise convs have a direct
 * kernel; 3x3 stride-1 ones with enough channels go to winograd.h (cuvil_conv_path). */
#ifndef CUVIL_CONV_H
#define CUVIL_CONV_H
#include "gemm.h"

typedef struct {
    int64_t N, C, H, W, O, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, groups;
} cuvil_conv_shape;

/* Rows [ih0, ih0 + rows) of an H x W plane of px-float pixels into dst, each as `cols` pixels starting
 * at column -pw, zeros outside the plane: the zero-padded copies of conv.c's depthwise bands and
 * blocked.c's padded inputs. */
static inline void cuvil_pad_rows(const float *x, int64_t H, int64_t W, int64_t px, int64_t ih0, int64_t rows,
                                  int64_t pw, int64_t cols, float *dst) {
    for (int64_t r = 0; r < rows; r++, dst += cols * px) {
        int64_t ih = ih0 + r, inside = ih >= 0 && ih < H;
        int64_t a = inside ? cuvil_min(pw, cols) : cols, e = inside ? cuvil_min(pw + W, cols) : cols;
        memset(dst, 0, a * px * sizeof(float));
        if (e > a) memcpy(dst + a * px, x + (ih * W + a - pw) * px, (e - a) * px * sizeof(float));
        memset(dst + e * px, 0, (cols - e) * px * sizeof(float));
    }
}

/* Along one axis, the taps [k0, k1) of the window of output o whose inputs fall inside [0, size)
 * (start: the input index of tap 0): pooling's windows and the depthwise kernels' edge pixels. */
static inline void cuvil_window_taps(int64_t o, int64_t stride, int64_t pad, int64_t dil, int64_t k, int64_t size,
                                     int64_t *start, int64_t *k0, int64_t *k1) {
    *start = o * stride - pad;
    *k0 = *start >= 0 ? 0 : (-*start + dil - 1) / dil;
    *k1 = k;
    while (*k1 > *k0 && *start + (*k1 - 1) * dil >= size) (*k1)--;
}

/* Output columns [*first, *end) whose windows lie inside the input along W (no tap in the pads). */
static inline void cuvil_inside_columns(const cuvil_conv_shape *s, int64_t *first, int64_t *end) {
    int64_t last_in = s->W - 1 + s->pw - (s->KW - 1) * s->dw;
    *first = (s->pw + s->sw - 1) / s->sw;
    *end = last_in >= 0 ? last_in / s->sw + 1 : 0;
    if (*end > s->OW) *end = s->OW;
}

/* A 1x1, stride-1 conv with no pads at either end: its input is the GEMM's operand as it is (the
 * same rule as codegen/c/conv_plan.py pointwise_conv; OH == H rules out the end pads). */
static inline int cuvil_conv_pointwise(const cuvil_conv_shape *s) {
    return s->KH == 1 && s->KW == 1 && s->sh == 1 && s->sw == 1 && s->ph == 0 && s->pw == 0 && s->OH == s->H &&
           s->OW == s->W;
}

/* How cuvil_conv2d computes a conv: chosen once, at compile time, by codegen/c/conv_plan.py
 * (ConvPlan.path), which also sizes the scratch each path needs. */
typedef enum {
    CUVIL_CONV_DEPTHWISE = 0,     /* one filter per input channel: direct loops, no scratch */
    CUVIL_CONV_INPUT_AS_B = 1,    /* 1x1, stride 1, no pads: the input is the GEMM's B, read in place or
                                   * packed into scratch */
    CUVIL_CONV_IMPLICIT = 2,      /* the GEMM asks for im2col block by block: no scratch */
    CUVIL_CONV_IM2COL = 3,        /* im2col whole into scratch, once: the filters span several M blocks
                                   * of the GEMM, which would each redo an implicit im2col */
} cuvil_conv_path;

/* y = act(conv(x, w) + bias + residual); bias and residual (shaped like y) may be NULL. wp: the filters
 * packed ahead as GEMM A operands, one cuvil_packed_a_size(O / groups, K) block per group, or NULL. */
void cuvil_conv2d(const cuvil_conv_shape *s, cuvil_conv_path path, const float *x, const float *w,
                  const float *wp, const float *bias, const float *residual, float *y, int act, float *scratch,
                  int nthreads);

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
