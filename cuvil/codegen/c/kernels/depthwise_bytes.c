/* Depthwise convs on bytes (compile's precision="int8", passes/quantize.link_int8_convs): the input is
 * the byte image the integer conv before it wrote over this conv's range, pixel-major (blocked_dot.c:
 * the padded extent's pixels of C bytes each, the padding at the zero point, so that every window lies
 * inside it), and each tap's bytes are widened to floats and multiplied by the filters, scaled by the
 * input's scale, in fp32 (the input's quantization is the only loss). MobileNetV2's expand convs had
 * written 4 bytes a value for these convs to read: at 56x56 x 144 channels 1.8 MB that left the L2.
 * The output: blocked floats, or the next integer conv's input bytes (cuvil_byte_image), as a tile of
 * pixels by channel vectors: a pixel's channels end up side by side, as that image keeps them. */
#include "blocked_input.h"
#include "dot_out.h"
#include "int8dot.h"

typedef struct {
    const cuvil_conv_shape *s;
    const uint8_t *x;
    const float *w, *bias;        /* the filters times the input's scale [KH * KW][C]; the biases less the
                                   * zero point's share */
    const float *residual;
    float *y;
    const cuvil_byte_image *out;  /* the next conv's image, or 0: blocked floats at y */
    cuvil_byte_clamp clamp;       /* with `folded`: out's map and the activation folded into w and bias */
    int folded;
    float lo, hi;                 /* with `clamped` (floats out, no residual): the activation's bounds */
    int clamped;
    int64_t ldx, image;           /* bytes from one image row of pixels to the next, and a whole image's */
    int64_t chunks;               /* channel chunks per output row: the tasks are rows x chunks */
    int act;
} dw_bytes;

/* Output pixels (n, oh, ow + j < ow + T)'s channels [c, c + B), stored: as the next conv's bytes, or as
 * floats (residual and activation fused where they are not folded into the sums). Out of line, a tile
 * a call: with every activation's code inlined into each tile's stores the tiles had not fit the
 * instruction cache, and a call a pixel had made EfficientNet's SiLU depthwise convs slower than fp32's
 * (the tiles store the folded and clamped cases themselves). */
static __attribute__((noinline)) void dw_bytes_store(const dw_bytes *a, int64_t n, int64_t oh, int64_t ow, int64_t c,
                                                     cuvil_vf *acc, int T) {
    const cuvil_conv_shape *s = a->s;
    const cuvil_byte_image *b = a->out;
    for (int j = 0; j < T; j++) {
        cuvil_vf v = acc[j];
        int64_t at = (((n * (s->C / CUVIL_BLOCK) + c / CUVIL_BLOCK) * s->OH + oh) * s->OW + ow + j) * CUVIL_BLOCK;
        if (!a->folded) {
            if (a->residual) v += cuvil_vload(a->residual + at);
            if (a->act) v = cuvil_vact(v, a->act);
        }
        if (!b) {
            cuvil_vstore(a->y + at, v);
            continue;
        }
        int64_t r = oh + b->ph, col = ow + j + b->pw;        /* a strided reader's image may drop the last ones */
        if (r >= b->hp || col >= b->wp) continue;
        uint8_t *q = b->q + ((n * b->hp + r) * b->wp + col) * b->C + c;
        if (a->folded) cuvil_clamped_bytes(v, &a->clamp, q);
        else cuvil_to_bytes(v, b->inv, b->zero, b->top, q);
    }
}

/* T pixels from ow, channels [c, c + B): KW and SW (the filter's width, the stride along W) constants,
 * so that a tap two pixels share is loaded once; xr: the window row of output row oh. The shape in
 * locals: byte stores may alias anything. */
static inline __attribute__((always_inline)) void dw_bytes_pixels(int KW, int SW, int T, const dw_bytes *a,
                                                                  const uint8_t *xr, int64_t n, int64_t oh,
                                                                  int64_t ow, int64_t c) {
    const cuvil_conv_shape *s = a->s;
    const int64_t C = s->C, KH = s->KH, row = s->dh * a->ldx;
    const uint8_t *x0 = xr + ow * SW * C + c;
    const float *w = a->w + c;
    cuvil_vf acc[8], b = cuvil_vload(a->bias + c);
    #pragma GCC unroll 8
    for (int j = 0; j < T; j++) acc[j] = b;
    for (int64_t kh = 0; kh < KH; kh++) {
        #pragma GCC unroll 7
        for (int kw = 0; kw < KW; kw++) {
            cuvil_vf wv = cuvil_vload(w + (kh * KW + kw) * C);
            #pragma GCC unroll 8
            for (int j = 0; j < T; j++) acc[j] += cuvil_vload_bytes(x0 + kh * row + (j * SW + kw) * C) * wv;
        }
    }
    if (a->folded) {
        const cuvil_byte_image *o = a->out;
        int64_t r = oh + o->ph, wp = o->wp;
        if (r >= o->hp) return;
        uint8_t *q = o->q + ((n * o->hp + r) * wp + ow + o->pw) * C + c;
        #pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            if (ow + o->pw + j < wp) cuvil_clamped_bytes(acc[j], &a->clamp, q + j * C);
    } else if (a->clamped) {
        float *y = a->y + (((n * (C / CUVIL_BLOCK) + c / CUVIL_BLOCK) * s->OH + oh) * s->OW + ow) * CUVIL_BLOCK;
        #pragma GCC unroll 8
        for (int j = 0; j < T; j++) cuvil_vstore(y + j * CUVIL_BLOCK, cuvil_vclamp(acc[j], a->lo, a->hi));
    } else
        dw_bytes_store(a, n, oh, ow, c, acc, T);
}

/* Output row (n, oh), channel blocks [cb0, cb1): tiles of 8 pixels, of 4, then the rest, each over
 * every channel block before the next, so that the tile's input stays in L1 and its output bytes are
 * whole pixels. */
static inline __attribute__((always_inline)) void dw_bytes_row(int KW, int SW, const dw_bytes *a, const uint8_t *xr,
                                                               int64_t n, int64_t oh, int64_t cb0, int64_t cb1) {
    int64_t ow = 0, OW = a->s->OW;
    for (; ow + 8 <= OW; ow += 8)
        for (int64_t cb = cb0; cb < cb1; cb++) dw_bytes_pixels(KW, SW, 8, a, xr, n, oh, ow, cb * CUVIL_BLOCK);
    if (ow + 4 <= OW) {
        for (int64_t cb = cb0; cb < cb1; cb++) dw_bytes_pixels(KW, SW, 4, a, xr, n, oh, ow, cb * CUVIL_BLOCK);
        ow += 4;
    }
    for (int64_t cb = cb0; cb < cb1; cb++)         /* the last 1-3 pixels as one tile */
        switch (OW - ow) {
        case 3: dw_bytes_pixels(KW, SW, 3, a, xr, n, oh, ow, cb * CUVIL_BLOCK); break;
        case 2: dw_bytes_pixels(KW, SW, 2, a, xr, n, oh, ow, cb * CUVIL_BLOCK); break;
        case 1: dw_bytes_pixels(KW, SW, 1, a, xr, n, oh, ow, cb * CUVIL_BLOCK); break;
        default: break;
        }
}

/* A 3x3 filter's row (dw3_bytes_row): where its outputs go, by the kind of store */
enum { DW3_FOLDED, DW3_CLAMPED, DW3_STORE };

/* T pixels from ow of channels [c, c + B) of output row (n, oh), the 9 filter vectors wv in registers:
 * x0 the window row's inputs of pixel 0 at channel c; q (folded: the row's bytes at pixel 0, 0 where the
 * image drops the row) and cols (the pixels it keeps), or y (clamped: the row's floats at pixel 0). */
static inline __attribute__((always_inline)) void dw3_bytes_tile(int SW, int T, int kind, const dw_bytes *a,
                                                                 const uint8_t *x0, int64_t row, const cuvil_vf *wv,
                                                                 cuvil_vf bias, uint8_t *q, int64_t cols, float *y,
                                                                 int64_t n, int64_t oh, int64_t ow, int64_t c) {
    const int64_t C = a->s->C;
    const uint8_t *xt = x0 + ow * SW * C;
    cuvil_vf acc[8];
    #pragma GCC unroll 8
    for (int j = 0; j < T; j++) acc[j] = bias;
    #pragma GCC unroll 3
    for (int kh = 0; kh < 3; kh++)
        #pragma GCC unroll 3
        for (int kw = 0; kw < 3; kw++)
            #pragma GCC unroll 8
            for (int j = 0; j < T; j++) acc[j] += cuvil_vload_bytes(xt + kh * row + (j * SW + kw) * C) * wv[kh * 3 + kw];
    if (kind == DW3_FOLDED) {
        if (!q) return;
        #pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            if (ow + j < cols) cuvil_clamped_bytes(acc[j], &a->clamp, q + (ow + j) * C);
    } else if (kind == DW3_CLAMPED) {
        #pragma GCC unroll 8
        for (int j = 0; j < T; j++) cuvil_vstore(y + (ow + j) * CUVIL_BLOCK, cuvil_vclamp(acc[j], a->lo, a->hi));
    } else
        dw_bytes_store(a, n, oh, ow, c, acc, T);
}

/* Output row (n, oh) of a 3x3 filter, channel blocks [cb0, cb1) one after another, each over the whole row
 * in tiles of 8 pixels, then 4, then the last 1-3, its 9 filter vectors loaded once (in registers on
 * AVX-512; 16-register targets spill some). dw_bytes_row's
 * order (each tile over every channel block) reloaded them each tile: 10-11 cycles an output vector on
 * Zen 5 where the 9 multiply-adds need 4.5. A row's bytes (3 input rows) stay in L1 across its blocks. */
static inline __attribute__((always_inline)) void dw3_bytes_row(int SW, int kind, const dw_bytes *a, const uint8_t *xr,
                                                                int64_t n, int64_t oh, int64_t cb0, int64_t cb1) {
    const cuvil_conv_shape *s = a->s;
    const int64_t C = s->C, OW = s->OW, row = s->dh * a->ldx;
    uint8_t *q = 0;
    int64_t cols = 0;
    if (kind == DW3_FOLDED) {
        const cuvil_byte_image *o = a->out;
        q = oh + o->ph < o->hp ? o->q + ((n * o->hp + oh + o->ph) * o->wp + o->pw) * C : 0;
        cols = o->wp - o->pw;
    }
    for (int64_t cb = cb0; cb < cb1; cb++) {
        int64_t c = cb * CUVIL_BLOCK, ow = 0;
        cuvil_vf wv[9], bias = cuvil_vload(a->bias + c);
        #pragma GCC unroll 9
        for (int t = 0; t < 9; t++) wv[t] = cuvil_vload(a->w + t * C + c);
        const uint8_t *x0 = xr + c;
        uint8_t *qc = q ? q + c : 0;
        float *y = kind == DW3_CLAMPED ? a->y + ((n * (C / CUVIL_BLOCK) + cb) * s->OH + oh) * OW * CUVIL_BLOCK : 0;
#define DW3_TILE(T) dw3_bytes_tile(SW, T, kind, a, x0, row, wv, bias, qc, cols, y, n, oh, ow, c)
        for (; ow + 8 <= OW; ow += 8) DW3_TILE(8);
        if (ow + 4 <= OW) {
            DW3_TILE(4);
            ow += 4;
        }
        switch (OW - ow) {
        case 3: DW3_TILE(3); break;
        case 2: DW3_TILE(2); break;
        case 1: DW3_TILE(1); break;
        default: break;
        }
#undef DW3_TILE
    }
}

/* dw3_bytes_row for stride SW, one copy per kind of store */
static inline __attribute__((always_inline)) void dw3_bytes_rows(int SW, const dw_bytes *a, const uint8_t *xr, int64_t n,
                                                                 int64_t oh, int64_t cb0, int64_t cb1) {
    if (a->folded) dw3_bytes_row(SW, DW3_FOLDED, a, xr, n, oh, cb0, cb1);
    else if (a->clamped) dw3_bytes_row(SW, DW3_CLAMPED, a, xr, n, oh, cb0, cb1);
    else dw3_bytes_row(SW, DW3_STORE, a, xr, n, oh, cb0, cb1);
}

/* Any other filter width, stride or dilation along W: pixel by pixel, the taps' offsets at run time. */
static void dw_bytes_row_any(const dw_bytes *a, const uint8_t *xr, int64_t n, int64_t oh, int64_t cb0, int64_t cb1) {
    const cuvil_conv_shape *s = a->s;
    const int64_t C = s->C;
    for (int64_t ow = 0; ow < s->OW; ow++)
        for (int64_t cb = cb0; cb < cb1; cb++) {
            int64_t c = cb * CUVIL_BLOCK;
            cuvil_vf acc = cuvil_vload(a->bias + c);
            for (int64_t kh = 0; kh < s->KH; kh++)
                for (int64_t kw = 0; kw < s->KW; kw++)
                    acc += cuvil_vload_bytes(xr + kh * s->dh * a->ldx + (ow * s->sw + kw * s->dw) * C + c) *
                           cuvil_vload(a->w + (kh * s->KW + kw) * C + c);
            dw_bytes_store(a, n, oh, ow, c, &acc, 1);
        }
}

/* Tasks t = ((n * OH + oh) * chunks + chunk): one output row's chunk of channel blocks. */
static void dw_bytes_task(void *ctx, int64_t t0, int64_t t1) {
    const dw_bytes *a = ctx;
    const cuvil_conv_shape *s = a->s;
    const int64_t CB = s->C / CUVIL_BLOCK;
    for (int64_t t = t0; t < t1; t++) {
        int64_t r = t / a->chunks, k = t % a->chunks, n = r / s->OH, oh = r % s->OH;
        int64_t cb0 = k * CB / a->chunks, cb1 = (k + 1) * CB / a->chunks;
        const uint8_t *xr = a->x + n * a->image + oh * s->sh * a->ldx;
        switch (s->dw == 1 ? s->KW * 4 + s->sw : 0) {
        case 3 * 4 + 1:           /* 3 wide and 3 tall: the 3x3 rows; 3 wide, any other height: tiles */
            if (s->KH == 3) dw3_bytes_rows(1, a, xr, n, oh, cb0, cb1);
            else dw_bytes_row(3, 1, a, xr, n, oh, cb0, cb1);
            break;
        case 3 * 4 + 2:
            if (s->KH == 3) dw3_bytes_rows(2, a, xr, n, oh, cb0, cb1);
            else dw_bytes_row(3, 2, a, xr, n, oh, cb0, cb1);
            break;
        case 5 * 4 + 1: dw_bytes_row(5, 1, a, xr, n, oh, cb0, cb1); break;
        case 5 * 4 + 2: dw_bytes_row(5, 2, a, xr, n, oh, cb0, cb1); break;
        case 7 * 4 + 1: dw_bytes_row(7, 1, a, xr, n, oh, cb0, cb1); break;
        default: dw_bytes_row_any(a, xr, n, oh, cb0, cb1);
        }
    }
}

int64_t cuvil_depthwise_bytes_scratch(const cuvil_conv_shape *s) { return (s->KH * s->KW + 1) * s->C; }

void cuvil_depthwise_bytes(const cuvil_conv_shape *s, const uint8_t *x, const float *w, const float *bias,
                           const float *range, const float *residual, float *y, const int64_t *out_image,
                           const float *out_range, int act, float *scratch, int nthreads) {
    const int64_t taps = s->KH * s->KW, C = s->C, rows = s->N * s->OH, CB = C / CUVIL_BLOCK;
    float scale, zero;
    cuvil_byte_scale(range[0], range[1], (float)CUVIL_I8_LEVELS, &scale, &zero);
    /* sum_t (q_t - zero) scale w_t + bias = sum_t q_t (scale w_t) + (bias - zero sum_t scale w_t) */
    float *ws = scratch, *bs = scratch + taps * C;     /* tap-major loops: vectors over the channels */
    for (int64_t c = 0; c < C; c++) bs[c] = 0.f;
    for (int64_t t = 0; t < taps; t++)
        for (int64_t c = 0; c < C; c++) bs[c] += ws[t * C + c] = scale * w[t * C + c];
    for (int64_t c = 0; c < C; c++) bs[c] = (bias ? bias[c] : 0.f) - zero * bs[c];
    int in_place = blocked_in_place(s);           /* the image the writer made (lower_int8dot.int8_input_image) */
    int64_t ldx = (in_place ? s->W : padded_w(s)) * C, image = (in_place ? s->H : padded_h(s)) * ldx;
    cuvil_byte_image bytes = {0};
    if (out_image) {
        float oscale, ozero;
        cuvil_byte_scale(out_range[0], out_range[1], (float)CUVIL_I8_LEVELS, &oscale, &ozero);
        bytes = (cuvil_byte_image){(uint8_t *)y, 1.f / oscale, ozero, (float)CUVIL_I8_LEVELS, s->OW, s->O,
                                   out_image[0], out_image[1], out_image[2], out_image[3]};
        for (int64_t n = 0; n < s->N; n++)
            cuvil_byte_border(bytes.q + n * bytes.hp * bytes.wp * s->O, out_image, s->OH, s->OW, s->O, (uint8_t)ozero);
    }
    float lo = 0.f, hi = 0.f;
    int clamp_act = !residual && cuvil_act_bounds(act, &lo, &hi), folded = out_image && clamp_act;
    if (folded) {                 /* the sums come out as the next conv's t (dot_out.h cuvil_byte_clamp) */
        for (int64_t i = 0; i < taps * C; i++) ws[i] *= bytes.inv;
        for (int64_t c = 0; c < C; c++) bs[c] = bs[c] * bytes.inv + (bytes.zero + 0.5f);
    }
    int nt = rows * s->OW * taps * C > 65536 ? nthreads : 1;
    /* a small map's few rows split by channels too, so that every thread has several tasks */
    int64_t chunks = nt > 1 ? cuvil_min(CB, (16 * nt + rows - 1) / rows) : 1;
    dw_bytes a = {s, x, ws, bs, residual, y, out_image ? &bytes : 0,
                  folded ? cuvil_byte_clamp_of(&bytes, lo, hi) : (cuvil_byte_clamp){0}, folded, lo, hi,
                  clamp_act && !out_image, ldx, image, chunks, act};
    cuvil_parallel_for(nt, rows * chunks, 1, dw_bytes_task, &a);
}
