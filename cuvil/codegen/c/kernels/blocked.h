/* The channel-blocked layout ("nchw<B>c", passes/layout.py), B = CUVIL_BLOCK = the target's vector
 * width (16 on AVX-512, 8 on AVX2, 4 on SSE2 / NEON / portable): a [N, C, H, W] tensor stored as
 * [N][C/B][H][W][B], the B channels of one pixel one vector (C a multiple of B). A conv then reads its
 * input in place as the GEMM's A (pixels x channels): each K step broadcasts one channel of MR pixels
 * that sit a vector apart, and the product's vectors of output channels are stored as they come out of
 * the registers, with no packing before and no transpose after. ResNet-50's 1x1 convs in a C harness
 * (AVX-512, 1 thread, hot), blocked / NCHW time: 0.84-0.94x, 105-116 GFLOP/s. Below, "a block" is B
 * channels; the comments' 16 is B on AVX-512. */
#ifndef CUVIL_BLOCKED_H
#define CUVIL_BLOCKED_H
#include "conv.h"

#define CUVIL_BLOCK CUVIL_VL

/* C = act(A @ Bp + bias[n] + residual) with A [K/B][M][B] (lda_blk floats from one block of
 * channels to the next), C and residual [N/B][M][B] (ldc_blk), Bp packed panels ([np][K][NR],
 * cuvil_pack_b). K and N multiples of B; bias and residual may be NULL. */
void cuvil_sgemm_blocked(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda_blk, const float *Bp,
                         float *C, int64_t ldc_blk, const float *bias, const float *residual, int act, int nthreads);

/* A conv of blocked input to blocked output (each group's C and O multiples of B). wb: each group's
 * filters as its GEMM's B, [K = KH * KW * C/G][O/G] with k = (kh * KW + kw) * C/G + c, packed, the
 * groups' one cuvil_packed_b_size apart. A 1x1 stride-1 unpadded conv
 * reads its input in place as the GEMM's A; any other gathers A's rows from it tap by tap (no im2col
 * written), from a zero-padded copy in scratch where it pads (cuvil_conv_blocked_scratch floats, with
 * the pixel and tap offset tables). */
int64_t cuvil_conv_blocked_scratch(const cuvil_conv_shape *s);
void cuvil_conv_blocked(const cuvil_conv_shape *s, const float *x, const float *wb, const float *bias,
                        const float *residual, float *y, int act, float *scratch, int nthreads);

/* cuvil_conv_blocked (groups 1) into NCHW output: channels that fill no block (MobileNetV2's and
 * EfficientNet's projections to 24), computed as whole blocks a block of pixels at a time into a
 * thread buffer and turned into NCHW with the epilogue, so the block of the wide map before them is
 * read once (it had been turned into NCHW by a relayout, then read by an NCHW conv). wb: the filters as
 * cuvil_conv_blocked's, packed with their O columns zero padded to panels. Scratch: cuvil_conv_blocked's.
 * Returns -1 where a thread's buffer for the rows could not be allocated. */
int cuvil_conv_blocked_nchw_out(const cuvil_conv_shape *s, const float *x, const float *wb, const float *bias,
                                const float *residual, float *y, int act, float *scratch, int nthreads);

/* A 1x1 stride-1 conv (groups 1) of x scaled by a gate, one scale per image and input channel
 * (passes/squeeze_excite.py: a squeeze-and-excitation multiply folded into the conv after it): each image runs
 * cuvil_conv_blocked, or cuvil_conv_blocked_nchw_out where nchw_out, with its filters' rows scaled by
 * gate + n * gate_step (0: one gate for every image) into the first
 * cuvil_conv_gated_scratch floats of scratch, the conv's own scratch after them. Returns -1 as
 * cuvil_conv_blocked_nchw_out does. */
int64_t cuvil_conv_gated_scratch(const cuvil_conv_shape *s);
int cuvil_conv_blocked_gated(const cuvil_conv_shape *s, const float *x, const float *wb, const float *gate,
                             int64_t gate_step, const float *bias, const float *residual, float *y, int act,
                             int nchw_out, float *scratch, int nthreads);

/* A depthwise conv (groups = C = O) on the byte image the integer conv before it wrote (precision="int8",
 * passes/quantize.link_int8_convs; depthwise_bytes.c): x pixel-major bytes over range [lo, hi], the padded
 * extent's rows and columns (blocked_input.h; the map itself where no window reaches past it), padding at
 * the zero point; w as cuvil_depthwise_blocked's. Output: blocked floats at y (bias, residual, act
 * fused), or with out_image ({hp, wp, ph, pw}, over out_range) the next integer conv's input bytes at y,
 * as cuvil_conv_blocked_int8 writes them. Scratch: cuvil_depthwise_bytes_scratch floats. */
int64_t cuvil_depthwise_bytes_scratch(const cuvil_conv_shape *s);
void cuvil_depthwise_bytes(const cuvil_conv_shape *s, const uint8_t *x, const float *w, const float *bias,
                           const float *range, const float *residual, float *y, const int64_t *out_image,
                           const float *out_range, int act, float *scratch, int nthreads);

/* cuvil_conv_blocked in bf16 products with fp32 sums (kernels/bf16dot.h; groups whose channels are whole
 * blocks both ways): wb the filters as B, in bf16 pair panels (bf16dot.h, CUVIL_BF16_NR columns each), each
 * group's panels after the last group's; the input rounded to bf16 as each M
 * block reads it. links: which of x, the residual and y are bf16 maps instead (a conv's output that only
 * bf16 convs read: the same layout in bf16 bit patterns, image n where its floats' would start; half the
 * bytes to write and read back, and the reader's rounding done once by the writer). Same scratch as
 * cuvil_conv_blocked; returns -1 where a thread's buffer for the rounded rows could not be allocated. */
#define CUVIL_BF16_IN 1       /* links: x is a bf16 map (passes/quantize.link_bf16_convs) */
#define CUVIL_BF16_RES 2      /* the residual is one */
#define CUVIL_BF16_OUT 4      /* y is stored as one */
int cuvil_conv_blocked_bf16(const cuvil_conv_shape *s, const float *x, const uint32_t *wb, const float *bias,
                            const float *residual, float *y, int act, int links, float *scratch, int nthreads);

/* The same from an NCHW input (cuvil_conv_nchw_blocked in bf16 products: a network's stem), wb as for
 * cuvil_conv_blocked_bf16 (K in the order (kh, kw, c)); links: CUVIL_BF16_RES and CUVIL_BF16_OUT.
 * Scratch: cuvil_conv_nchw_blocked's. */
int cuvil_conv_nchw_blocked_bf16(const cuvil_conv_shape *s, const float *x, const uint32_t *wb, const float *bias,
                                 const float *residual, float *y, int act, int links, float *scratch, int nthreads);

/* cuvil_conv_blocked in int8 products with int32 sums (any groups; kernels/int8dot.h): each image
 * quantized to bytes, q = x / scale + zero rounded over [lo, hi] (range: the calibrated or the model's
 * own [lo, hi], or NULL for the image's), the filters as B in signed-byte panels (int8dot.h; each
 * group's after the previous group's) with wterms [2][O]: each output channel's scale and that scale
 * times the sum of its integer filter; the sums scaled back, the bias, residual and act fused. The input
 * (input_kind): CUVIL_I8_IN_BLOCKED floats, CUVIL_I8_IN_NCHW floats (groups 1: any C, a stem's 3 channels
 * too), or CUVIL_I8_IN_BYTES: the bytes the conv before it wrote over this conv's range (its out_image),
 * N images of cuvil_conv_int8_image_bytes each. The output: blocked floats at y (NCHW floats with
 * nchw_out, the residual too: a 1x1 conv into channels that fill no block), or with out_image ({hp, wp,
 * ph, pw} of the next conv's padded image, its input range out_range) that conv's input bytes at y.
 * The residual: blocked floats, or with res_range the bytes an integer conv wrote over that range (its
 * out_image of this conv's OH x OW map, unpadded: O bytes a pixel; blocked output only).
 * K = KH * KW * C / groups at most CUVIL_I8_MAX_K. Scratch: cuvil_conv_blocked_int8_scratch floats.
 * Returns -1 where a thread's buffer for the rows could not be allocated. */
enum { CUVIL_I8_IN_BLOCKED = 0, CUVIL_I8_IN_NCHW = 1, CUVIL_I8_IN_BYTES = 2 };
int64_t cuvil_conv_blocked_int8_scratch(const cuvil_conv_shape *s);
int cuvil_conv_blocked_int8(const cuvil_conv_shape *s, const float *x, const uint32_t *wq, const float *wterms,
                            const float *bias, const float *residual, const float *res_range, const float *range,
                            int input_kind, float *y,
                            int nchw_out, const int64_t *out_image, const float *out_range, int act, float *scratch,
                            int nthreads);

/* A conv of an NCHW input into blocked output (a net's stem, whose few channels fill no block): wb the
 * filters as B in their own order, [K = C * KH * KW][O], packed; K at most CUVIL_NCHW_BLOCKED_MAX_K (no K
 * blocking: one panel's B stays in L2). Scratch: a zero-padded copy of one image and a table per pixel. */
#define CUVIL_NCHW_BLOCKED_MAX_K 1024
int64_t cuvil_conv_nchw_blocked_scratch(const cuvil_conv_shape *s);
void cuvil_conv_nchw_blocked(const cuvil_conv_shape *s, const float *x, const float *wb, const float *bias,
                             const float *residual, float *y, int act, float *scratch, int nthreads);

/* A grouped conv of blocked input whose groups have g = C / groups = O / groups channels each, g dividing
 * a block or a multiple of it (grouped_blocked.c): w as [O / B][KH * KW][g][B], the filter value of
 * output channel ob B + l for the tap and its group's input j at [ob][tap][j][l]; any strides, pads and
 * dilations; bias, residual and act fused. */
void cuvil_conv_grouped_blocked(const cuvil_conv_shape *s, const float *x, const float *w, const float *bias,
                                const float *residual, float *y, int act, int nthreads);

/* A depthwise conv (groups = C = O) of blocked input: w as [KH * KW][C] (each tap's filter values side by
 * side, as the channels of a pixel are), any strides, pads and dilations. */
void cuvil_depthwise_blocked(const cuvil_conv_shape *s, const float *x, const float *w, const float *bias,
                             const float *residual, float *y, int act, int nthreads);
/* The same, with the output's mean over its pixels at mean ([N][C], as an NCHW [N, C, 1, 1]): each
 * output row summed as it is written (the squeeze of a squeeze-and-excitation block,
 * passes/squeeze_excite.py). Scratch: N * C * OH floats, the rows' sums. */
void cuvil_depthwise_blocked_mean(const cuvil_conv_shape *s, const float *x, const float *w, const float *bias,
                                  const float *residual, float *y, int act, float *mean, float *scratch,
                                  int nthreads);
/* The same, its output (bias, residual and act applied) stored as the next integer conv's input bytes
 * at y: the byte image out_image ({hp, wp, ph, pw}) over out_range, as cuvil_conv_blocked_int8 writes it
 * (precision="int8", passes/quantize.link_int8_convs: a depthwise conv after a float stem). */
void cuvil_depthwise_blocked_to_bytes(const cuvil_conv_shape *s, const float *x, const float *w, const float *bias,
                                      const float *residual, uint8_t *y, const int64_t *out_image,
                                      const float *out_range, int act, int nthreads);

/* A 3x3 stride-1 conv of blocked input by Winograd F(m x m, 3x3), m 2 or 4 (winograd.h's transforms,
 * in vectors across a block of channels): the (m + 2)^2 products are blocked GEMMs (tiles x in channels) @
 * (in x out channels). up: the transformed filters U[i][j] as B operands [C][O], packed, one
 * cuvil_packed_b_size(C, O) apart, the one at xi = (m + 2) * i + j holding U[i][j]. */
int64_t cuvil_winograd_blocked_scratch(const cuvil_conv_shape *s, int m);
void cuvil_conv3x3_winograd_blocked(const cuvil_conv_shape *s, int m, const float *x, const float *up,
                                    const float *bias, const float *residual, float *y, int act, float *scratch,
                                    int nthreads);

/* Average pooling of a blocked tensor (C a multiple of B): windows and divisors as cuvil_pool2d's modes
 * 1 and 2 (ph1, pw1: its end pads). */
void cuvil_avg_pool_blocked(const cuvil_conv_shape *s, int64_t ph1, int64_t pw1, int mode, const float *x, float *y,
                            int nthreads);

/* Max pooling of a blocked tensor (C a multiple of B): windows as cuvil_pool2d's mode 0. */
void cuvil_max_pool_blocked(const cuvil_conv_shape *s, const float *x, float *y, int nthreads);
/* The same pool on bytes: x the N maps H x W of C bytes a pixel (an integer conv's output for its
 * readers, pixel-major), y the N maps OH x OW alike; windows over the taps inside the map (each window
 * holds one: pads under the kernel). */
void cuvil_max_pool_bytes(const cuvil_conv_shape *s, const uint8_t *x, uint8_t *y, int nthreads);

/* Channels [live, C) of an [N][C][HW] map set to 0, NCHW (blocked 0) or blocked: the padding a conv
 * whose channels were widened to whole blocks writes past its live ones (passes/pad_channels.py), so
 * that the zero filters which read them add exact zeros whatever its input held (an inf times a zero
 * filter is NaN). */
void cuvil_zero_channels(int64_t N, int64_t C, int64_t HW, int64_t live, int blocked, float *y);

/* [N][C][H*W] <-> [N][C/B][H*W][B] (to_blocked 1: NCHW in; 0: blocked in). */
void cuvil_relayout(int64_t N, int64_t C, int64_t HW, int to_blocked, const float *x, float *y, int nthreads);
/* A blocked [N][C/B][HW][B] map to channels-last [N][HW][C] (to_nhwc) or back: ConvNeXt's permutes
 * around its channels-last LayerNorm and MLP (ir/ops/movement.py: transpose's in_layout / layout). */
void cuvil_blocked_nhwc(int64_t N, int64_t C, int64_t HW, int to_nhwc, const float *x, float *y, int nthreads);
#endif
