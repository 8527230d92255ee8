/* What the channel-blocked convs share (blocked.c, blocked_dot.c): the input's padded extent, the
 * pixel and tap tables through which a conv gathers its GEMM's rows, the zero-padded copy and the M
 * blocks. Internal to the kernels. */
#ifndef CUVIL_BLOCKED_INPUT_H
#define CUVIL_BLOCKED_INPUT_H
#include "blocked.h"
#include "pool.h"

#define BLK_MC 96             /* pixels per M block (blocked.c: BLK_KB) */
#define BLK_FEW_TASKS 8       /* tasks a thread under which blocked_m_rows splits the pixels between threads */

/* A strided or padded conv's blocked input read in place as its im2col (cuvil_conv_blocked): channel
 * block k = tap * CB + cb of output pixel m starts at x + cb * plane + (pix[m] + tap[k / CB]) * B, x
 * zero padded where the conv pads. */
typedef struct {
    const float *x;
    const int64_t *pix, *tap;
    int64_t CB, plane;
} gathered_source;

/* M blocks of equal size, up to BLK_MC rows, whole register tiles: 196 pixels (14x14) had been two
 * blocks of 96 and one of 4, which ran every weight through the tiles again for 4 rows. With several
 * threads and few tasks (blocks x `groups` panel groups under BLK_FEW_TASKS a thread), a multiple of
 * `threads` blocks (as many as there are row tiles at most), so that each thread's run of tasks (pool.c) is rows
 * of its own: a 7x7 map had been one block, split between 2 threads by output channels, and its 1x1
 * convs ran 1.6-1.7x faster than on 1 thread, split by rows 1.85x; MobileNetV2's 576 -> 96 channel convs
 * at 14x14 (3 blocks x 3 groups) took 0.84x the time in 4 blocks. With many tasks the larger blocks
 * reuse the weights more (MobileNetV1's 512-channel convs at 14x14 in 4 blocks, not 3: 1.02x the
 * network's time). One thread: the blocks as they were. */
static inline int64_t blocked_m_rows(int64_t M, int64_t groups, int threads, int64_t unit, int64_t *mb) {
    int64_t n = (M + BLK_MC - 1) / BLK_MC, tiles = (M + unit - 1) / unit;
    if (threads > 1 && (n < threads || n * groups < BLK_FEW_TASKS * threads))
        n = (n + threads - 1) / threads * threads;
    if (n > tiles) n = tiles;
    int64_t mc = ((M + n - 1) / n + unit - 1) / unit * unit;
    *mb = (M + mc - 1) / mc;
    return mc;
}

static inline int blocked_direct(const cuvil_conv_shape *s) { return cuvil_conv_pointwise(s); }

/* The padded input's rows and columns: every tap of every output pixel inside it. */
static inline int64_t padded_h(const cuvil_conv_shape *s) { return (s->OH - 1) * s->sh + (s->KH - 1) * s->dh + 1; }
static inline int64_t padded_w(const cuvil_conv_shape *s) { return (s->OW - 1) * s->sw + (s->KW - 1) * s->dw + 1; }

/* A gathered conv reads its input in place where no window reaches past it (a 1x1 stride-2 conv);
 * else a zero-padded copy in scratch. */
static inline int blocked_in_place(const cuvil_conv_shape *s) {
    return s->ph == 0 && s->pw == 0 && padded_h(s) <= s->H && padded_w(s) <= s->W;
}

/* A zero-padded copy of one image, rows r = c * hp + ih of `pixel` floats a pixel: an NCHW input's
 * channels (pixel 1) or a blocked input's blocks of channels (pixel B). */
typedef struct { const cuvil_conv_shape *s; const float *x; float *xp; int64_t pixel; } pad_args;

static inline void pad_task(void *ctx, int64_t r0, int64_t r1) {
    const pad_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t hp = padded_h(s), wp = padded_w(s), px = a->pixel;
    for (int64_t r = r0; r < r1; r++)
        cuvil_pad_rows(a->x + r / hp * s->H * s->W * px, s->H, s->W, px, r % hp - s->ph, 1, s->pw, wp,
                       a->xp + r * wp * px);
}

/* A conv's input as its GEMM's A: a 1x1 stride-1 conv (direct) reads it in place; a strided or padded
 * one gathers A's rows from it through the pixel and tap tables (accumulate_gathered), from a
 * zero-padded copy in scratch where it pads. */
typedef struct {
    int direct, in_place;
    int64_t hp, wp, *pix, *tap;
} blocked_input;

/* pix[m]: where output pixel m's window starts in an image of rows wp pixels long (built on every
 * call: row by row, without a division a pixel). */
static inline void blocked_pixel_table(const cuvil_conv_shape *s, int64_t wp, int64_t *pix) {
    for (int64_t oh = 0; oh < s->OH; oh++)
        for (int64_t ow = 0; ow < s->OW; ow++) *pix++ = oh * s->sh * wp + ow * s->sw;
}

static inline blocked_input blocked_input_tables(const cuvil_conv_shape *s, float *scratch) {
    blocked_input b = {blocked_direct(s), 0, 0, 0, 0, 0};
    b.in_place = b.direct || blocked_in_place(s);
    b.hp = b.in_place ? s->H : padded_h(s), b.wp = b.in_place ? s->W : padded_w(s);
    b.pix = (int64_t *)(scratch + (b.in_place ? 0 : s->C * b.hp * b.wp)), b.tap = b.pix + s->OH * s->OW;
    if (!b.direct) {
        blocked_pixel_table(s, b.wp, b.pix);
        for (int64_t t = 0; t < s->KH * s->KW; t++) b.tap[t] = t / s->KW * s->dh * b.wp + t % s->KW * s->dw;
    }
    return b;
}

/* Image xn as A's source: itself, or its zero-padded copy written into scratch; `pixel`: floats a
 * pixel's block of channels takes (CUVIL_BLOCK, or half that for a map in bf16). */
static inline const float *blocked_image_of(const cuvil_conv_shape *s, const blocked_input *b, const float *xn,
                                            float *scratch, int nthreads, int64_t pixel) {
    if (b->in_place) return xn;
    pad_args pa = {s, xn, scratch, pixel};
    cuvil_parallel_for(s->C * b->hp * b->wp > 16384 ? nthreads : 1, s->C / CUVIL_BLOCK * b->hp, 1, pad_task, &pa);
    return scratch;
}

static inline const float *blocked_image(const cuvil_conv_shape *s, const blocked_input *b, const float *xn, float *scratch,
                                         int nthreads) {
    return blocked_image_of(s, b, xn, scratch, nthreads, CUVIL_BLOCK);
}
#endif
