#include "conv.h"
#include "lanes.h"
#include "pool.h"
#include "vmath.h"
#include "tuning.h"
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

/* B of the conv's GEMM, never materialized whole: rows k = (c, kh, kw), columns n = (oh, ow). */
typedef struct { const cuvil_conv_shape *s; const float *x; } im2col_src;

/* Lanes 0, 2, 4, ... of the 2 VL floats at p: one output vector of a stride-2 conv's im2col row.
 * (clang, which builds wasm32, has __builtin_shufflevector with the lanes as constants instead of
 * GCC's __builtin_shuffle with a mask vector.) */
#if CUVIL_VL == 16
#define CUVIL_EVEN_LANES 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#elif CUVIL_VL == 8
#define CUVIL_EVEN_LANES 0, 2, 4, 6, 8, 10, 12, 14
#else
#define CUVIL_EVEN_LANES 0, 2, 4, 6
#endif
static inline cuvil_vf even_lanes(const float *p) {
#ifdef __clang__
    return __builtin_shufflevector(cuvil_vload(p), cuvil_vload(p + CUVIL_VL), CUVIL_EVEN_LANES);
#else
    const cuvil_vi even = {CUVIL_EVEN_LANES};
    return __builtin_shuffle(cuvil_vload(p), cuvil_vload(p + CUVIL_VL), even);
#endif
}

/* dst[j] = src[j * sw] for j in [lo, hi): one run of im2col pixels inside an input row, `room`
 * floats readable from src (to the end of its channel plane). At stride 1 or 2 it goes by whole
 * vectors, the last one overlapping the one before it, or one vector stored in part for a run
 * shorter than VL, wherever the vectors' reads stay in the room. Element by element, a 3x3 stride-2
 * conv onto 28-wide rows (its 32-pixel panels cross rows) spent a fifth of its time here. */
static inline void copy_run(float *dst, const float *src, int64_t lo, int64_t hi, int64_t sw, int64_t room) {
    if (hi > lo && (sw == 1 || sw == 2)) {
        if (hi - lo < CUVIL_VL) {
            if (sw * lo + sw * CUVIL_VL <= room) {
                cuvil_vstore_first(dst + lo, sw == 1 ? cuvil_vload(src + lo) : even_lanes(src + 2 * lo), hi - lo);
                return;
            }
        } else if (sw * hi <= room) {
            for (int64_t j = lo;; j += CUVIL_VL) {
                if (j > hi - CUVIL_VL) j = hi - CUVIL_VL;
                cuvil_vstore(dst + j, sw == 1 ? cuvil_vload(src + j) : even_lanes(src + 2 * j));
                if (j == hi - CUVIL_VL) return;
            }
        }
    }
    if (sw == 1)
        for (int64_t j = lo; j < hi; j++) dst[j] = src[j];
    else if (sw == 2)
        for (int64_t j = lo; j < hi; j++) dst[j] = src[2 * j];
    else
        for (int64_t j = lo; j < hi; j++) dst[j] = src[j * sw];
}

/* Whether every tap of a one-run panel reads inside the image, so that each row of B is two vector
 * loads with no bounds at all (stride 1 or 2). A stride-2 row reads 2 NR floats, one past its last
 * column: inside the plane unless the panel's taps reach its last row. */
static int panel_inside(const cuvil_conv_shape *s, int64_t oh0, int64_t ow0) {
    int64_t ih0 = oh0 * s->sh - s->ph, ih1 = ih0 + (s->KH - 1) * s->dh;
    int64_t iw0 = ow0 * s->sw - s->pw, iw1 = iw0 + (s->KW - 1) * s->dw + (CUVIL_NR - 1) * s->sw;
    if (s->sw != 1 && s->sw != 2) return 0;
    return ih0 >= 0 && iw0 >= 0 && ih1 < s->H && iw1 < s->W && (s->sw == 1 || ih1 < s->H - 1 || iw1 + 1 < s->W);
}

/* Rows [k0, k0 + kc) of a panel that panel_inside: one pointer walk, the tap order (c, kh, kw). The
 * stem conv (7x7 stride 2 over 3 channels, K = 147 for M = 64 filters) spent a quarter of its time in
 * the per-row bounds of the general path. */
static void inside_block(const cuvil_conv_shape *s, const float *x, int64_t oh0, int64_t ow0, int64_t k0,
                         int64_t kc, float *buf) {
    int64_t taps = s->KH * s->KW, c = k0 / taps, kh = k0 % taps / s->KW, kw = k0 % s->KW;
    const float *origin = x + (oh0 * s->sh - s->ph) * s->W + ow0 * s->sw - s->pw;
    for (int64_t k = 0; k < kc; k++) {
        const float *row = origin + (c * s->H + kh * s->dh) * s->W + kw * s->dw;
        float *d = buf + k * CUVIL_NR;
        if (s->sw == 1) {
            cuvil_vstore(d, cuvil_vload(row));
            cuvil_vstore(d + CUVIL_VL, cuvil_vload(row + CUVIL_VL));
        } else {
            cuvil_vstore(d, even_lanes(row));
            cuvil_vstore(d + CUVIL_VL, even_lanes(row + 2 * CUVIL_VL));
        }
        if (++kw == s->KW) {
            kw = 0;
            if (++kh == s->KH) kh = 0, c++;
        }
    }
}

/* A panel as runs of consecutive pixels, each within one output row: lanes [lane, lane + len) are
 * output row oh, columns ow.. For the first RUN_KW kernel columns, what each reads is kept: lanes
 * lane + [lo, hi) from input columns iw + j * sw (the rest of the run reads pads). */
#define RUN_KW 8
typedef struct { int32_t oh, ow, lane, len, iw[RUN_KW], lo[RUN_KW], hi[RUN_KW]; } pixel_run;

static void run_columns(const cuvil_conv_shape *s, const pixel_run *r, int64_t kw, int64_t *iw, int64_t *lo,
                        int64_t *hi) {
    *iw = r->ow * s->sw - s->pw + kw * s->dw;
    *lo = *iw >= 0 ? 0 : (-*iw + s->sw - 1) / s->sw;
    *hi = s->W - *iw <= 0 ? 0 : (s->W - *iw + s->sw - 1) / s->sw;
    *hi = *hi < r->len ? *hi : r->len;
    *hi = *hi > *lo ? *hi : *lo;
}

static int panel_runs(const cuvil_conv_shape *s, int64_t n0, int64_t filled, pixel_run *runs) {
    int nr = 0;
    for (int64_t j = 0; j < filled;) {
        int64_t n = n0 + j, ow = n % s->OW, len = s->OW - ow < filled - j ? s->OW - ow : filled - j;
        pixel_run *r = runs + nr++;
        *r = (pixel_run){.oh = (int32_t)(n / s->OW), .ow = (int32_t)ow, .lane = (int32_t)j, .len = (int32_t)len};
        for (int64_t kw = 0; kw < s->KW && kw < RUN_KW; kw++) {
            int64_t iw, lo, hi;
            run_columns(s, r, kw, &iw, &lo, &hi);
            r->iw[kw] = (int32_t)iw, r->lo[kw] = (int32_t)lo, r->hi[kw] = (int32_t)hi;
        }
        j += len;
    }
    return nr;
}

/* Panel p's rows [k0, k0 + kc) into buf [kc][NR] (the cuvil_b_producer of the conv's GEMM): rows
 * k = (c, kh, kw). A panel that is one run inside the image takes each row in two vector loads;
 * any other is copied run by run, each run's inside part at the conv's stride (a loop per stride,
 * so that 1 and 2 vectorize), its pads left zero. Gathered element by element through per-tap
 * offsets instead, as before, C harness new/old time: the stem (7x7 stride 2) 0.94-0.95, 3x3
 * stride 1 on 56- and 20-wide maps 0.86-0.92, 3x3 stride 2 to 28x28 0.98, to 14x14 1.02-1.04 (a
 * conv ResNet-50 runs with its pixels as rows instead). */
static const float *im2col_block(const void *ctx, int64_t p, int64_t k0, int64_t kc, float *buf) {
    const im2col_src *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t N = s->OH * s->OW, n0 = p * CUVIL_NR, filled = N - n0 < CUVIL_NR ? N - n0 : CUVIL_NR;
    int64_t taps = s->KH * s->KW, c = k0 / taps, kh = k0 % taps / s->KW, kw = k0 % s->KW;
    int64_t oh0 = n0 / s->OW, ow0 = n0 % s->OW;
    if (filled == CUVIL_NR && s->OW - ow0 >= CUVIL_NR && panel_inside(s, oh0, ow0)) {
        inside_block(s, a->x, oh0, ow0, k0, kc, buf);
        return buf;
    }
    pixel_run runs[CUVIL_NR];
    int nruns = panel_runs(s, n0, filled, runs);
    for (int64_t k = 0; k < kc; k++) {
        float *d = buf + k * CUVIL_NR;
        const float *xc = a->x + c * s->H * s->W;
        cuvil_vstore(d, cuvil_vsplat(0.f));
        cuvil_vstore(d + CUVIL_VL, cuvil_vsplat(0.f));
        for (int r = 0; r < nruns; r++) {
            const pixel_run *u = runs + r;
            int64_t ih = u->oh * s->sh - s->ph + kh * s->dh, iw, lo, hi;
            if (ih < 0 || ih >= s->H) continue;
            if (kw < RUN_KW) iw = u->iw[kw], lo = u->lo[kw], hi = u->hi[kw];
            else run_columns(s, u, kw, &iw, &lo, &hi);
            copy_run(d + u->lane, xc + ih * s->W + iw, lo, hi, s->sw, (s->H - ih) * s->W - iw);
        }
        if (++kw == s->KW) {              /* next (c, kh, kw) without dividing */
            kw = 0;
            if (++kh == s->KH) kh = 0, c++;
        }
    }
    return buf;
}

typedef struct { im2col_src src; int64_t K; float *Bp; } im2col_whole;

static void im2col_task(void *ctx, int64_t p0, int64_t p1) {
    const im2col_whole *a = ctx;
    for (int64_t p = p0; p < p1; p++) im2col_block(&a->src, p, 0, a->K, a->Bp + p * a->K * CUVIL_NR);
}

typedef struct {
    const cuvil_conv_shape *s;
    const float *x, *w, *bias, *residual;
    float *y;
    int act;
} direct_args;

/* One output of a depthwise plane, every tap bounds-tested (the edge columns, other strides). */
static inline float depthwise_point(const cuvil_conv_shape *s, const float *xc, const float *wo, int64_t oh,
                                    int64_t ow, float acc) {
    for (int64_t kh = 0; kh < s->KH; kh++) {
        int64_t ih = oh * s->sh - s->ph + kh * s->dh;
        if (ih < 0 || ih >= s->H) continue;
        for (int64_t kw = 0; kw < s->KW; kw++) {
            int64_t iw = ow * s->sw - s->pw + kw * s->dw;
            if (iw >= 0 && iw < s->W) acc += xc[ih * s->W + iw] * wo[kh * s->KW + kw];
        }
    }
    return acc;
}

#define DEPTHWISE_MAX_TAPS 64      /* 8x8: the filter's splats kept in a local array up to this */

/* ---- NCHW depthwise: each (image, channel) plane in bands of DW_ROWS output rows. The input rows a
 * band reads are copied into a buffer on the task's stack, zero padded on every side and as wide as
 * the band's whole vectors read, so every tap of every output vector is one plain load (stride 2: the
 * even lanes of two), no edge row or column takes a bounds-tested path, and the DW_ROWS rows'
 * accumulators are independent chains. The kernel before it ran one chain of KH * KW dependent FMAs
 * per vector and its edge columns tap by tap: 4-13 GFLOP/s on MobileNetV3's NCHW depthwise convs
 * (AVX-512, 1 thread), against 26 for the blocked kernel. ---- */
#define DW_ROWS 4
#define DW_BAND_MAX_FLOATS (1 << 14)      /* 64 KiB: a band of 4 rows at 5x5 up to ~2000 columns */

typedef void dw_band_fn(const cuvil_conv_shape *s, const float *band, int64_t cols, const cuvil_vf *wv,
                        float b, const float *res, float *y, int64_t rows, int act);

/* Columns of a band row; at stride 1 whole vectors, so that every row starts on a vector's boundary
 * (dw_tap) */
static inline int64_t dw_band_cols(const cuvil_conv_shape *s) {
    int64_t cols = (s->OW + CUVIL_VL - 1) / CUVIL_VL * CUVIL_VL * s->sw + (s->KW - 1) * s->dw;
    return s->sw == 1 ? (cols + CUVIL_VL - 1) / CUVIL_VL * CUVIL_VL : cols;
}

/* Taps kw = 0 .. KW-1 of a stride-1, undilated row at p (a vector's boundary), for output columns
 * [0, VL): on AVX-512 two aligned loads a VL of taps and valignd between them, where an unaligned
 * 64-byte load per tap had crossed a cache line at every offset but 0 (NCHW depthwise convs ran at
 * 18-35 GFLOP/s against the blocked kernel's 55); elsewhere one load a tap. */
static inline __attribute__((always_inline)) cuvil_vf dw_tap(const float *p, int kw, cuvil_vf lo, cuvil_vf hi) {
#if CUVIL_VL == 16 && defined(__AVX512F__)
    (void)p;
    switch (kw & 15) {
#define DW_ALIGNR(k) case k: return (cuvil_vf)_mm512_alignr_epi32((__m512i)hi, (__m512i)lo, k);
    DW_ALIGNR(0) DW_ALIGNR(1) DW_ALIGNR(2) DW_ALIGNR(3) DW_ALIGNR(4) DW_ALIGNR(5) DW_ALIGNR(6) DW_ALIGNR(7)
    DW_ALIGNR(8) DW_ALIGNR(9) DW_ALIGNR(10) DW_ALIGNR(11) DW_ALIGNR(12) DW_ALIGNR(13) DW_ALIGNR(14) DW_ALIGNR(15)
#undef DW_ALIGNR
    }
    return lo;
#else
    (void)lo, (void)hi;
    return cuvil_vload(p + kw);
#endif
}

static inline int64_t dw_band_rows(const cuvil_conv_shape *s) { return (DW_ROWS - 1) * s->sh + (s->KH - 1) * s->dh + 1; }

/* n outputs (n <= VL) at y: v plus the residual, activated; y may be the residual itself. */
static inline void dw_store(float *y, const float *res, cuvil_vf v, int64_t n, int act) {
    if (n == CUVIL_VL) {
        if (res) v += cuvil_vload(res);
        cuvil_vstore(y, cuvil_vact(v, act));
        return;
    }
    if (res) {
        float r[CUVIL_VL] = {0};
        memcpy(r, res, n * sizeof(float));
        v += cuvil_vload(r);
    }
    cuvil_vstore_first(y, cuvil_vact(v, act), n);
}

/* One band's output rows [0, rows) (rows <= DW_ROWS), a vector of columns at a time; the shape's
 * numbers are parameters so the specializations below unroll the taps and share the loads that rows
 * of one tile have in common. */
static inline __attribute__((always_inline)) void dw_band(const cuvil_conv_shape *s, const float *band,
                                                          int64_t cols, const cuvil_vf *wv, float b,
                                                          const float *res, float *y, int64_t rows, int act,
                                                          int64_t KH, int64_t KW, int64_t sh, int64_t sw,
                                                          int64_t dh, int64_t dw) {
    for (int64_t c0 = 0; c0 < s->OW; c0 += CUVIL_VL) {
        cuvil_vf acc[DW_ROWS];
        for (int r = 0; r < DW_ROWS; r++) acc[r] = cuvil_vsplat(b);
        if (sw == 1 && dw == 1 && KW <= CUVIL_VL + 1)       /* rows start on vectors (dw_band_cols) */
            for (int64_t kh = 0; kh < KH; kh++)
                for (int r = 0; r < DW_ROWS; r++) {
                    const float *p = band + (r * sh + kh * dh) * cols + c0;
                    cuvil_vf lo = cuvil_vload(p), hi = KW > 1 ? cuvil_vload(p + CUVIL_VL) : lo;
                    for (int64_t kw = 0; kw < KW; kw++)
                        acc[r] = cuvil_fma(acc[r], wv[kh * KW + kw], kw == CUVIL_VL ? hi : dw_tap(p, (int)kw, lo, hi));
                }
        else
            for (int64_t kh = 0; kh < KH; kh++)
                for (int64_t kw = 0; kw < KW; kw++)
                    for (int r = 0; r < DW_ROWS; r++) {
                        const float *p = band + (r * sh + kh * dh) * cols + c0 * sw + kw * dw;
                        acc[r] = cuvil_fma(acc[r], wv[kh * KW + kw], sw == 1 ? cuvil_vload(p) : even_lanes(p));
                    }
        int64_t n = cuvil_min(CUVIL_VL, s->OW - c0);
        for (int r = 0; r < rows; r++)
            dw_store(y + r * s->OW + c0, res ? res + r * s->OW + c0 : 0, acc[r], n, act);
    }
}

#define DW_BAND_ARGS const cuvil_conv_shape *s, const float *band, int64_t cols, const cuvil_vf *wv, float b, \
                     const float *res, float *y, int64_t rows, int act
#define DW_SHAPE(K, S) \
    static void dw_band_##K##x##K##_s##S(DW_BAND_ARGS) { dw_band(s, band, cols, wv, b, res, y, rows, act, K, K, S, S, 1, 1); }
/* the filters of MobileNet, EfficientNet and ConvNeXt */
#define DW_SHAPES(X) X(3, 1) X(3, 2) X(5, 1) X(5, 2) X(7, 1)
DW_SHAPES(DW_SHAPE)
static void dw_band_any(DW_BAND_ARGS) { dw_band(s, band, cols, wv, b, res, y, rows, act, s->KH, s->KW, s->sh, s->sw, s->dh, s->dw); }

static dw_band_fn *dw_band_for(const cuvil_conv_shape *s) {
    int square = s->KH == s->KW && s->sh == s->sw && s->dh == 1 && s->dw == 1;
#define DW_PICK(K, S) if (square && s->KH == K && s->sh == S) return dw_band_##K##x##K##_s##S;
    DW_SHAPES(DW_PICK)
#undef DW_PICK
    return dw_band_any;
}

/* cuvil_pad_rows for a whole plane's rows (one float a pixel) by vectors: each row zeroed whole, then
 * its W floats copied over the zeros at pw, the last part-vector by masked load and store. A row of
 * 14-56 floats had been three calls to memset and memcpy, then three loops of their own with scalar
 * heads and tails, which cost more than the taps of a small plane. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))     /* GCC made the loops memset and memcpy calls */
#endif
static inline void dw_pad_rows(const float *x, int64_t H, int64_t W, int64_t ih0, int64_t rows, int64_t pw,
                               int64_t cols, float *dst) {
    const cuvil_vf zero = cuvil_vsplat(0.f);
    const int64_t w = cuvil_max(0, cuvil_min(W, cols - pw));        /* the input columns that land in the row */
    for (int64_t r = 0; r < rows; r++, dst += cols) {
        int64_t ih = ih0 + r, j = 0;
        for (; j + CUVIL_VL <= cols; j += CUVIL_VL) cuvil_vstore(dst + j, zero);
        if (j < cols) cuvil_vstore_first(dst + j, zero, cols - j);
        if (ih < 0 || ih >= H) continue;
        const float *src = x + ih * W;
        float *d = dst + pw;
        for (j = 0; j + CUVIL_VL <= w; j += CUVIL_VL) cuvil_vstore(d + j, cuvil_vload(src + j));
        if (j < w) cuvil_vstore_first(d + j, cuvil_vload_first(src + j, w - j), w - j);
    }
}

/* Whether the banded kernel takes s (strides 1 and 2, filters up to DEPTHWISE_MAX_TAPS, a band that
 * fits its buffer); any other depthwise conv goes output by output through depthwise_point. */
static inline int dw_banded(const cuvil_conv_shape *s) {
    return (s->sw == 1 || s->sw == 2) && s->KH * s->KW <= DEPTHWISE_MAX_TAPS &&
           dw_band_cols(s) * dw_band_rows(s) <= DW_BAND_MAX_FLOATS;
}

/* One (image, channel) plane. */
static void depthwise_plane(const cuvil_conv_shape *s, const float *xc, const float *wo, float b, const float *res,
                            float *yo, int act) {
    if (!dw_banded(s)) {
        for (int64_t oh = 0; oh < s->OH; oh++)
            for (int64_t ow = 0, o = oh * s->OW; ow < s->OW; ow++, o++)
                yo[o] = cuvil_act(depthwise_point(s, xc, wo, oh, ow, b) + (res ? res[o] : 0.f), act);
        return;
    }
    float band[DW_BAND_MAX_FLOATS] __attribute__((aligned(64)));
    cuvil_vf wv[DEPTHWISE_MAX_TAPS];
    for (int64_t t = 0; t < s->KH * s->KW; t++) wv[t] = cuvil_vsplat(wo[t]);
    const int64_t cols = dw_band_cols(s), rows = dw_band_rows(s);
    dw_band_fn *run = dw_band_for(s);
    /* stride 1: the whole plane's bands at once where they fit, each input row copied once, not once
     * per band that reads it (1.5x at 3x3, 2x at 5x5); else band by band */
    const int64_t bands = (s->OH + DW_ROWS - 1) / DW_ROWS, all = (bands - 1) * DW_ROWS * s->sh + rows;
    const int whole = s->sw == 1 && all * cols <= DW_BAND_MAX_FLOATS;
    if (whole) dw_pad_rows(xc, s->H, s->W, -s->ph, all, s->pw, cols, band);
    for (int64_t oh = 0; oh < s->OH; oh += DW_ROWS) {
        if (!whole) dw_pad_rows(xc, s->H, s->W, oh * s->sh - s->ph, rows, s->pw, cols, band);
        run(s, whole ? band + oh * s->sh * cols : band, cols, wv, b, res ? res + oh * s->OW : 0, yo + oh * s->OW,
            cuvil_min(DW_ROWS, s->OH - oh), act);
    }
}

static void depthwise_task(void *ctx, int64_t nc0, int64_t nc1) {
    const direct_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t mult = s->O / s->C, plane = s->OH * s->OW;
    for (int64_t nc = nc0; nc < nc1; nc++) {
        int64_t n = nc / s->O, o = nc % s->O, c = o / mult;
        depthwise_plane(s, a->x + (n * s->C + c) * s->H * s->W, a->w + o * s->KH * s->KW, a->bias ? a->bias[o] : 0.f,
                        a->residual ? a->residual + nc * plane : 0, a->y + nc * plane, a->act);
    }
}

static void depthwise(const cuvil_conv_shape *s, const float *x, const float *w, const float *bias,
                      const float *residual, float *y, int act, int nthreads) {
    direct_args a = {s, x, w, bias, residual, y, act};
    cuvil_parallel_for(nthreads, s->N * s->O, 1, depthwise_task, &a);
}

void cuvil_conv2d(const cuvil_conv_shape *s, cuvil_conv_path path, const float *x, const float *w,
                  const float *wp, const float *bias, const float *residual, float *y, int act, float *scratch,
                  int nthreads) {
    if (path == CUVIL_CONV_DEPTHWISE) {
        depthwise(s, x, w, bias, residual, y, act, nthreads);
        return;
    }
    int64_t cg = s->C / s->groups, og = s->O / s->groups, K = cg * s->KH * s->KW, N = s->OH * s->OW;
    int direct = path == CUVIL_CONV_INPUT_AS_B;
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t g = 0; g < s->groups; g++) {
            const float *xg = x + (n * s->C + g * cg) * s->H * s->W;
            cuvil_epilogue ep = {bias ? bias + g * og : 0, 0, residual ? residual + (n * s->O + g * og) * N : 0,
                                 N, 1.f, act};
            float *yg = y + (n * s->O + g * og) * N;
            const float *wg = w ? w + g * og * K : 0, *wpg = wp ? wp + g * cuvil_packed_a_size(og, K) : 0;
            im2col_src src = {s, xg};
            if (path == CUVIL_CONV_IMPLICIT) {   /* im2col block by block inside the GEMM */
                cuvil_b_source b = {im2col_block, &src};
                cuvil_sgemm_produced_b(og, N, K, wg, wpg, &b, yg, N, &ep, nthreads);
                continue;
            }
            /* the input read in place as B, when the filters are no more than the input channels: packing
             * it cost such a conv 10-30% (256 -> 64 at 56x56: 0.83x the time without it). With more
             * filters the packing is a smaller share than the strided rows' TLB misses (64 -> 256: 1.08x),
             * unless K is shallow: there the pack, one thread's pass over the image, held the second
             * thread back (24 -> 72 at 56x56, 8 images, 2 threads: 0.66 ms in place, 1.0-1.7 packed) */
            if (direct && (og <= K || K <= CUVIL_GEMM_SHALLOW_K)) {
                cuvil_sgemm_strided_b(og, N, K, wg, wpg, xg, N, yg, N, &ep, nthreads);
                continue;
            }
            if (direct) cuvil_pack_b(K, N, xg, N, 0, scratch, nthreads);
            else {                       /* im2col whole, once: several M blocks would each redo it */
                im2col_whole whole = {src, K, scratch};
                int64_t np = (N + CUVIL_NR - 1) / CUVIL_NR;
                cuvil_parallel_for(np * K > 16384 ? nthreads : 1, np, 1, im2col_task, &whole);
            }
            if (wp) cuvil_sgemm_packed_ab(og, N, K, wpg, scratch, yg, N, &ep, nthreads);
            else cuvil_sgemm_packed(og, N, K, wg, K, scratch, yg, N, &ep, nthreads, 1);   /* B just written */
        }
}

typedef struct { const cuvil_conv_shape *s; const float *c, *bias, *residual; float *y; int act; int64_t ldc; } unswap_args;

#include "transpose.h"

/* Pixels per pass of the transpose: one channel block's rows of y over them stay in L1 (16 KB) */
#define UNSWAP_SPAN 256

/* y[o][p] = act(c[p][o] + bias[o] + residual[o][p]), output channels in blocks of VL. A block's rows
 * over a span of pixels are transposed into t first, then finished row by row, so that residual and
 * y are read and written in runs along their rows (finished tile by tile, VL rows at a time a VL
 * floats each, the residual's loads missed cache: a 256 -> 1024 conv at 14x14 spent 17% of its
 * time here). */
static void unswap_task(void *ctx, int64_t b0, int64_t b1) {
    const unswap_args *a = ctx;
    int64_t O = a->s->O, P = a->s->OH * a->s->OW, ldc = a->ldc;
    float t[CUVIL_VL][UNSWAP_SPAN] __attribute__((aligned(64)));
    for (int64_t b = b0; b < b1; b++) {
        int64_t o0 = b * CUVIL_VL, no = O - o0 < CUVIL_VL ? O - o0 : CUVIL_VL;
        for (int64_t s0 = 0; s0 < P; s0 += UNSWAP_SPAN) {
            int64_t ns = P - s0 < UNSWAP_SPAN ? P - s0 : UNSWAP_SPAN;
            for (int64_t i0 = 0; i0 < ns; i0 += CUVIL_VL) {
                int64_t np = ns - i0 < CUVIL_VL ? ns - i0 : CUVIL_VL;
                const float *cb = a->c + (s0 + i0) * ldc + o0;
#ifdef CUVIL_TRANSPOSE_BLOCK
                if (np == CUVIL_VL && no == CUVIL_VL) {
                    transpose_block(cb, ldc, &t[0][i0], UNSWAP_SPAN);
                    continue;
                }
#endif
                for (int64_t i = 0; i < np; i++)
                    for (int64_t j = 0; j < no; j++) t[j][i0 + i] = cb[i * ldc + j];
            }
            for (int64_t j = 0; j < no; j++) {
                float *yr = a->y + (o0 + j) * P + s0;
                const float *rr = a->residual ? a->residual + (o0 + j) * P + s0 : 0;
                const float bj = a->bias ? a->bias[o0 + j] : 0.f;
                int64_t i = 0;
                for (; i + CUVIL_VL <= ns; i += CUVIL_VL) {
                    cuvil_vf v = cuvil_vload(t[j] + i) + bj;
                    if (rr) v += cuvil_vload(rr + i);
                    cuvil_vstore(yr + i, cuvil_vact(v, a->act));
                }
                for (; i < ns; i++) yr[i] = cuvil_act(t[j][i] + bj + (rr ? rr[i] : 0.f), a->act);
            }
        }
    }
}

/* The product's rows: a vector more than the channels, so that the 8 rows a transpose reads do not
 * share one L1 set when the channels are a power of two (as in most nets) */
static inline int64_t swapped_ldc(const cuvil_conv_shape *s) { return s->O + CUVIL_VL; }

/* A pointwise conv reads its input in place as the transposed A; any other takes its im2col rows
 * first, [K][pixels] after the product in scratch. */
static inline int swapped_in_place(const cuvil_conv_shape *s) { return cuvil_conv_pointwise(s); }

int64_t cuvil_conv_swapped_scratch(const cuvil_conv_shape *s) {
    int64_t P = s->OH * s->OW;
    return swapped_ldc(s) * P + (swapped_in_place(s) ? 0 : s->C * s->KH * s->KW * P);
}

typedef struct { const cuvil_conv_shape *s; const float *x; float *rows; } im2col_rows_args;

/* im2col rows [k0, k1), k = (c, kh, kw): row k holds tap (kh, kw) of channel c for every output
 * pixel, zero where it falls in the padding. Row by row, so the GEMM's transposed pack reads them
 * in order (pack_at_task). */
static void im2col_rows_task(void *ctx, int64_t k0, int64_t k1) {
    const im2col_rows_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t P = s->OH * s->OW;
    for (int64_t k = k0; k < k1; k++) {
        int64_t c = k / (s->KH * s->KW), kh = k / s->KW % s->KH, kw = k % s->KW;
        int64_t iw0 = kw * s->dw - s->pw;          /* the input column of output column 0 */
        /* output columns [lo, hi) read inside the row */
        int64_t lo = iw0 >= 0 ? 0 : (-iw0 + s->sw - 1) / s->sw;
        int64_t hi = s->W - iw0 <= 0 ? 0 : (s->W - iw0 + s->sw - 1) / s->sw;
        hi = hi < s->OW ? hi : s->OW;
        lo = lo < hi ? lo : hi;
        const float *xc = a->x + c * s->H * s->W;
        float *d = a->rows + k * P;
        for (int64_t oh = 0; oh < s->OH; oh++, d += s->OW) {
            int64_t ih = oh * s->sh - s->ph + kh * s->dh;
            if (ih < 0 || ih >= s->H) {
                memset(d, 0, s->OW * sizeof(float));
                continue;
            }
            for (int64_t ow = 0; ow < lo; ow++) d[ow] = 0.f;
            copy_run(d, xc + ih * s->W + iw0, lo, hi, s->sw, (s->H - ih) * s->W - iw0);
            for (int64_t ow = hi; ow < s->OW; ow++) d[ow] = 0.f;
        }
    }
}

void cuvil_conv_swapped(const cuvil_conv_shape *s, const float *x, const float *wb, const float *bias,
                        const float *residual, float *y, int act, float *scratch, int nthreads) {
    int64_t P = s->OH * s->OW, ldc = swapped_ldc(s), K = s->C * s->KH * s->KW;
    float *rows = scratch + ldc * P;
    for (int64_t n = 0; n < s->N; n++) {
        const float *at = x + n * s->C * s->H * s->W;
        if (!swapped_in_place(s)) {
            im2col_rows_args r = {s, at, rows};
            cuvil_parallel_for(K * P > 16384 ? nthreads : 1, K, 16, im2col_rows_task, &r);
            at = rows;
        }
        cuvil_sgemm_at_packed(P, s->O, K, at, P, wb, scratch, ldc, 0, nthreads);
        unswap_args a = {s, scratch, bias, residual ? residual + n * s->O * P : 0, y + n * s->O * P, act, ldc};
        int64_t blocks = (s->O + CUVIL_VL - 1) / CUVIL_VL;
        cuvil_parallel_for(blocks * P > 4096 ? nthreads : 1, blocks, 1, unswap_task, &a);
    }
}

typedef struct { const cuvil_conv_shape *s; int64_t ph1, pw1; int mode; const float *x; float *y; } pool_args;

static inline float pool_combine(int mode, float acc, float v) {
    return mode == 0 ? ((v > acc || v != v) ? v : acc) : acc + v;     /* max propagates NaN, as torch */
}

/* The divisor of an average: the window's positions inside the input, or for mode 2 inside the
 * declared pads too (not the ceil_mode overhang). */
static int64_t pool_count(const pool_args *a, int64_t h0, int64_t kh0, int64_t kh1, int64_t w0, int64_t kw0,
                          int64_t kw1) {
    const cuvil_conv_shape *s = a->s;
    if (a->mode != 2) return (kh1 - kh0) * (kw1 - kw0);
    int64_t rh = 0, rw = 0;
    for (int64_t kh = 0; kh < s->KH; kh++) rh += h0 + kh * s->dh >= -s->ph && h0 + kh * s->dh < s->H + a->ph1;
    for (int64_t kw = 0; kw < s->KW; kw++) rw += w0 + kw * s->dw >= -s->pw && w0 + kw * s->dw < s->W + a->pw1;
    return rh * rw;
}

static inline float pool_finish(const pool_args *a, float acc, int64_t h0, int64_t kh0, int64_t kh1, int64_t w0,
                                int64_t kw0, int64_t kw1) {
    if (a->mode == 0) return acc;
    int64_t cnt = pool_count(a, h0, kh0, kh1, w0, kw0, kw1);
    return acc / (float)(cnt > 0 ? cnt : 1);
}

/* Output columns [o0, o1) of one output row: the window's input rows are combined first over the
 * input columns those outputs read, in one vectorizable pass, then each output reads KW values of
 * that combined row instead of KH x KW. */
#define POOL_ROW_MAX 2048
static void pool_row_strip(const pool_args *a, const float *xc, float *yr, int64_t oh, int64_t o0, int64_t o1) {
    const cuvil_conv_shape *s = a->s;
    float row[POOL_ROW_MAX + 4 * CUVIL_VL];   /* the vector path's loads read past the last column */
    const float *row_end = row + POOL_ROW_MAX + 4 * CUVIL_VL;
    int64_t h0, kh0, kh1;
    cuvil_window_taps(oh, s->sh, s->ph, s->dh, s->KH, s->H, &h0, &kh0, &kh1);
    int64_t c0 = o0 * s->sw - s->pw, c1 = (o1 - 1) * s->sw - s->pw + (s->KW - 1) * s->dw + 1;
    if (c0 < 0) c0 = 0;
    if (c1 > s->W) c1 = s->W;
    const float init = a->mode == 0 ? -INFINITY : 0.f;
    for (int64_t w = c0; w < c1; w++) row[w - c0] = init;
    for (int64_t kh = kh0; kh < kh1; kh++) {
        const float *in = xc + (h0 + kh * s->dh) * s->W;
        if (a->mode == 0) for (int64_t w = c0; w < c1; w++) row[w - c0] = pool_combine(0, row[w - c0], in[w]);
        else for (int64_t w = c0; w < c1; w++) row[w - c0] += in[w];
    }
    /* windows inside the image VL outputs at a time (stride 1 or 2): ResNet's 3x3 stride-2 max pool
     * after the stem took 2.2 ms output by output, PoolFormer's 3x3 stride-1 averages at 56x56 1.9 ms */
    int vec = s->sw == 1 || s->sw == 2;
    int64_t in_lo = (s->pw + s->sw - 1) / s->sw, in_hi = s->W + s->pw - (s->KW - 1) * s->dw;
    in_hi = in_hi > 0 ? (in_hi - 1) / s->sw + 1 : 0;     /* outputs [in_lo, in_hi) see no pad */
    cuvil_vf count = cuvil_vsplat(1.f);                   /* an average's divisor there, the same for all */
    if (a->mode && in_lo < in_hi) {
        int64_t w0, kw0, kw1, n;
        cuvil_window_taps(in_lo, s->sw, s->pw, s->dw, s->KW, s->W, &w0, &kw0, &kw1);
        n = pool_count(a, h0, kh0, kh1, w0, kw0, kw1);
        count = cuvil_vsplat((float)(n > 0 ? n : 1));
    }
    for (int64_t ow = o0; ow < o1; ow++) {
        /* the last 1 to VL - 1 outputs inside the image as one vector too, stored in part (one by one, 7 of
         * each row's 56 in ShuffleNet's 24-channel 3x3 stride-2 pool at 112x112: 82 -> 63 us); the lanes
         * past them read the row's slack, and only where it holds them */
        int64_t n = cuvil_min(CUVIL_VL, cuvil_min(in_hi, o1) - ow);
        const float *rv = row + ow * s->sw - s->pw - c0;
        if (vec && ow >= in_lo && n > 0 && rv + (CUVIL_VL - 1) * s->sw + (s->KW - 1) * s->dw + 2 * CUVIL_VL <= row_end) {
            cuvil_vf acc = cuvil_vsplat(a->mode == 0 ? -INFINITY : 0.f);
            cuvil_vi nan = {0};
            for (int64_t kw = 0; kw < s->KW; kw++) {
                cuvil_vf v = s->sw == 1 ? cuvil_vload(rv + kw * s->dw) : even_lanes(rv + kw * s->dw);
                if (a->mode) acc += v;            /* in the scalar path's order: the same sums */
                else acc = cuvil_vsel(v > acc, v, acc), nan |= v != v;
            }
            if (a->mode) acc = acc / count;
            else acc = cuvil_vsel(nan, cuvil_vsplat(NAN), acc);
            if (n == CUVIL_VL) cuvil_vstore(yr + ow, acc);
            else cuvil_vstore_first(yr + ow, acc, n);
            ow += n - 1;
            continue;
        }
        int64_t w0, kw0, kw1;
        cuvil_window_taps(ow, s->sw, s->pw, s->dw, s->KW, s->W, &w0, &kw0, &kw1);
        const float *r = row + w0 - c0;
        float acc = init;
        int nan = 0;
        /* branch-free (a data-dependent branch per element mispredicts half the time on real data);
         * NaN, which the max instruction would drop, is tracked on the side */
        if (a->mode == 0) for (int64_t kw = kw0; kw < kw1; kw++) {
            float v = r[kw * s->dw];
            acc = v > acc ? v : acc;
            nan |= v != v;
        }
        else for (int64_t kw = kw0; kw < kw1; kw++) acc += r[kw * s->dw];
        yr[ow] = nan ? NAN : pool_finish(a, acc, h0, kh0, kh1, w0, kw0, kw1);
    }
}

/* A window wider than the row buffer: each output combines its KH x KW inputs directly. */
static void pool_wide(const pool_args *a, const float *xc, float *yr, int64_t oh) {
    const cuvil_conv_shape *s = a->s;
    int64_t h0, kh0, kh1;
    cuvil_window_taps(oh, s->sh, s->ph, s->dh, s->KH, s->H, &h0, &kh0, &kh1);
    for (int64_t ow = 0; ow < s->OW; ow++) {
        int64_t w0, kw0, kw1;
        cuvil_window_taps(ow, s->sw, s->pw, s->dw, s->KW, s->W, &w0, &kw0, &kw1);
        float acc = a->mode == 0 ? -INFINITY : 0.f;
        for (int64_t kh = kh0; kh < kh1; kh++)
            for (int64_t kw = kw0; kw < kw1; kw++)
                acc = pool_combine(a->mode, acc, xc[(h0 + kh * s->dh) * s->W + w0 + kw * s->dw]);
        yr[ow] = pool_finish(a, acc, h0, kh0, kh1, w0, kw0, kw1);
    }
}

static void pool_task(void *ctx, int64_t nc0, int64_t nc1) {
    const pool_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    /* outputs per strip so that the input columns they read fit the row buffer */
    int64_t span = (s->KW - 1) * s->dw + 1, step = span <= POOL_ROW_MAX ? (POOL_ROW_MAX - span) / s->sw + 1 : 0;
    for (int64_t nc = nc0; nc < nc1 && !step; nc++)
        for (int64_t oh = 0; oh < s->OH; oh++) pool_wide(a, a->x + nc * s->H * s->W, a->y + (nc * s->OH + oh) * s->OW, oh);
    for (int64_t nc = nc0; nc < nc1 && step; nc++)
        for (int64_t oh = 0; oh < s->OH; oh++)
            for (int64_t o0 = 0; o0 < s->OW; o0 += step)
                pool_row_strip(a, a->x + nc * s->H * s->W, a->y + (nc * s->OH + oh) * s->OW, oh, o0,
                               o0 + step < s->OW ? o0 + step : s->OW);
}

void cuvil_pool2d(const cuvil_conv_shape *s, int64_t ph1, int64_t pw1, int mode, const float *x, float *y,
                  int nthreads) {
    pool_args a = {s, ph1, pw1, mode, x, y};
    cuvil_parallel_for(nthreads, s->N * s->C, 1, pool_task, &a);
}
