/* Grouped convs of narrow groups in the channel-blocked layout (ResNeXt's 32 groups of 4, 8 and 16
 * channels): each output vector of B channels sums, over the g input channels j of its groups and the
 * taps, the filter vector times a vector of those inputs. Where a vector holds several groups (g < B)
 * that input vector is a lane permute of the input pixel's own block (lane l takes lane l / g * g + j);
 * where a group spans whole vectors it is one channel broadcast. Every product is a useful one: run as a
 * GEMM per group (N = g) its tiles had filled g of B lanes, and groups narrower than a block had no
 * blocked kernel at all (NCHW, 15 GFLOP/s for 4-channel groups at 56x56 with a relayout each side). */
#include "blocked.h"
#include "pool.h"
#include "vmath.h"

#define GB_TILE 8           /* output pixels of a row per register tile */

typedef struct {
    const cuvil_conv_shape *s;
    int64_t g;              /* channels per group, in and out */
    const float *x, *w, *bias, *residual;
    float *y;
    int act;
    cuvil_vi masks[CUVIL_BLOCK];  /* g < B: input j's permute, lane l from lane l / g * g + j */
} grouped_args;

/* Lanes l of v -> lane m[l] (a permute by an index vector: vpermps on AVX-512 and AVX2). */
static inline __attribute__((always_inline)) cuvil_vf permute_lanes(cuvil_vf v, cuvil_vi m) {
#ifdef __clang__
    cuvil_vf r;
    for (int l = 0; l < CUVIL_VL; l++) r[l] = v[m[l] & (CUVIL_VL - 1)];
    return r;
#else
    return __builtin_shuffle(v, m);
#endif
}

/* The input vector for input j at pixel offset px (floats from the plane's start) of output block ob:
 * block ob permuted by mj (lane l takes lane l / g * g + j: input j of each lane's group) where g < B,
 * else input channel q g + j broadcast. */
static inline __attribute__((always_inline)) cuvil_vf group_input(const grouped_args *a, int narrow, const float *xn,
                                                                   int64_t plane, int64_t ob, int64_t px, int64_t j,
                                                                   cuvil_vi mj) {
    if (narrow) return permute_lanes(cuvil_vload(xn + ob * plane + px), mj);
    int64_t ic = ob * CUVIL_BLOCK / a->g * a->g + j;
    return cuvil_vsplat(xn[ic / CUVIL_BLOCK * plane + px + ic % CUVIL_BLOCK]);
}

/* The tile's accumulators by name: an array of them had stayed on the stack (cuvil_vf may alias). */
#define GB_TILES(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define GB_ZERO(t) cuvil_vf acc##t = b;
#define GB_STEP(t) if (t < T) acc##t += f * group_input(a, narrow, xn, plane, ob, (row + iw + t * s->sw) * CUVIL_BLOCK, j, mj);
#define GB_OUT(t) if (t < T) store_output(a, acc##t, yrow, rrow, ow + t);

static inline __attribute__((always_inline)) void store_output(const grouped_args *a, cuvil_vf v, float *yrow,
                                                                const float *rrow, int64_t ow) {
    if (rrow) v += cuvil_vload(rrow + ow * CUVIL_BLOCK);
    if (a->act == CUVIL_ACT_RELU) v = cuvil_vrelu(v);
    else if (a->act) v = cuvil_vact(v, a->act);
    cuvil_vstore(yrow + ow * CUVIL_BLOCK, v);
}

/* Output pixels [ow, ow + T) of row oh of block ob, windows inside the map along W when inside, else
 * (T = 1) the taps outside skipped. */
static inline __attribute__((always_inline)) void grouped_tile(const grouped_args *a, int T, int inside,
                                                               const float *xn, int64_t ob, int64_t oh, int64_t ow,
                                                               float *yrow, const float *rrow) {
    const cuvil_conv_shape *s = a->s;
    const int64_t g = a->g, plane = s->H * s->W * CUVIL_BLOCK, taps = s->KH * s->KW;
    const int narrow = g < CUVIL_BLOCK;
    int64_t ih0, kh0, kh1;
    cuvil_window_taps(oh, s->sh, s->ph, s->dh, s->KH, s->H, &ih0, &kh0, &kh1);
    cuvil_vf b = a->bias ? cuvil_vload(a->bias + ob * CUVIL_BLOCK) : cuvil_vsplat(0.f);
    GB_TILES(GB_ZERO)
    const float *wb = a->w + ob * taps * g * CUVIL_BLOCK;
    for (int64_t kh = kh0; kh < kh1; kh++) {
        int64_t row = (ih0 + kh * s->dh) * s->W;
        for (int64_t kw = 0; kw < s->KW; kw++) {
            int64_t iw = ow * s->sw - s->pw + kw * s->dw;
            if (!inside && (iw < 0 || iw >= s->W)) continue;
            const float *wt = wb + (kh * s->KW + kw) * g * CUVIL_BLOCK;
            for (int64_t j = 0; j < g; j++) {
                cuvil_vf f = cuvil_vload(wt + j * CUVIL_BLOCK);
                cuvil_vi mj = a->masks[narrow ? j : 0];
                GB_TILES(GB_STEP)
            }
        }
    }
    GB_TILES(GB_OUT)
}

/* Registers for the 3-wide tile: an array of vectors that do not alias, so that after its loops are
 * unrolled every element is a register (cuvil_vf may alias, and arrays of it stay in memory). */
typedef float gb_vec __attribute__((vector_size(CUVIL_VL * 4)));

/* grouped_tile for 3-wide windows along W (dilation 1, stride SW 1 or 2) inside the map, T <= GB_TILE
 * outputs: each input pixel's vector for input j formed once (a permute or a broadcast) and multiplied
 * into the up to 3 outputs whose windows hold it, where grouped_tile forms it once per tap (the
 * permutes, one per product, had bounded the kernel: 4-channel groups at 56x56 44 GFLOP/s). */
static inline __attribute__((always_inline)) void grouped_tile3(const grouped_args *a, int T, int SW, int NARROW,
                                                                const float *xn, int64_t ob, int64_t oh, int64_t ow,
                                                                float *yrow, const float *rrow) {
    const cuvil_conv_shape *s = a->s;
    const int64_t g = a->g, plane = s->H * s->W * CUVIL_BLOCK;
    const int64_t cb0 = NARROW ? ob : ob * CUVIL_BLOCK / g * g / CUVIL_BLOCK;   /* the group's first block */
    int64_t ih0, kh0, kh1;
    cuvil_window_taps(oh, s->sh, s->ph, s->dh, s->KH, s->H, &ih0, &kh0, &kh1);
    gb_vec acc[GB_TILE], f[3];
    gb_vec b = a->bias ? (gb_vec)cuvil_vload(a->bias + ob * CUVIL_BLOCK) : (gb_vec)cuvil_vsplat(0.f);
    for (int t = 0; t < T; t++) acc[t] = b;
    const float *wb = a->w + ob * s->KH * 3 * g * CUVIL_BLOCK;
    for (int64_t kh = kh0; kh < kh1; kh++) {
        int64_t px0 = ((ih0 + kh * s->dh) * s->W + ow * SW - s->pw) * CUVIL_BLOCK;
        const float *wt = wb + kh * 3 * g * CUVIL_BLOCK;
        for (int64_t j = 0; j < g; j++) {
            for (int kw = 0; kw < 3; kw++) f[kw] = (gb_vec)cuvil_vload(wt + (kw * g + j) * CUVIL_BLOCK);
            const float *xj = NARROW ? xn + cb0 * plane + px0 : xn + (cb0 + j / CUVIL_BLOCK) * plane + j % CUVIL_BLOCK + px0;
            cuvil_vi mj = a->masks[NARROW ? j : 0];
            #pragma GCC unroll 32
            for (int i = 0; i < (T - 1) * SW + 3; i++) {
                gb_vec p = NARROW ? (gb_vec)permute_lanes(cuvil_vload(xj + i * CUVIL_BLOCK), mj)
                                  : (gb_vec)cuvil_vsplat(xj[i * CUVIL_BLOCK]);
                #pragma GCC unroll 3
                for (int kw = 0; kw < 3; kw++) {
                    int d = i - kw;
                    if (d >= 0 && d % SW == 0 && d / SW < T) acc[d / SW] += f[kw] * p;
                }
            }
        }
    }
    for (int t = 0; t < T; t++) store_output(a, (cuvil_vf)acc[t], yrow, rrow, ow + t);
}

/* Output pixels [ow, end) of a row whose windows lie inside the map, in tiles of 8, then 4 (a 14-wide
 * map's inside pixels: 8 + 4), as grouped_tile3 with the stride SW; returns where they stopped. */
static inline __attribute__((always_inline)) int64_t grouped_inside3(const grouped_args *a, int SW, const float *xn,
                                                                     int64_t ob, int64_t oh, int64_t ow, int64_t end,
                                                                     float *yrow, const float *rrow) {
    const int narrow = a->g < CUVIL_BLOCK;
    for (; ow + GB_TILE <= end; ow += GB_TILE)
        if (narrow) grouped_tile3(a, GB_TILE, SW, 1, xn, ob, oh, ow, yrow, rrow);
        else grouped_tile3(a, GB_TILE, SW, 0, xn, ob, oh, ow, yrow, rrow);
    for (; ow + GB_TILE / 2 <= end; ow += GB_TILE / 2)
        if (narrow) grouped_tile3(a, GB_TILE / 2, SW, 1, xn, ob, oh, ow, yrow, rrow);
        else grouped_tile3(a, GB_TILE / 2, SW, 0, xn, ob, oh, ow, yrow, rrow);
    return ow;
}

/* Rows r = (n * O / B + ob) * OH + oh of the output. */
static void grouped_task(void *ctx, int64_t r0, int64_t r1) {
    const grouped_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    const int64_t OB = s->O / CUVIL_BLOCK;
    int64_t first, end;
    cuvil_inside_columns(s, &first, &end);
    const int tile3 = s->KW == 3 && s->dw == 1 && (s->sw == 1 || s->sw == 2);
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / (OB * s->OH), ob = r / s->OH % OB, oh = r % s->OH;
        const float *xn = a->x + n * s->C * s->H * s->W;
        int64_t at = ((n * OB + ob) * s->OH + oh) * s->OW * CUVIL_BLOCK;
        float *yrow = a->y + at;
        const float *rrow = a->residual ? a->residual + at : 0;
        int64_t ow = 0;
        for (; ow < s->OW && ow < first; ow++) grouped_tile(a, 1, 0, xn, ob, oh, ow, yrow, rrow);
        if (tile3 && s->sw == 1) ow = grouped_inside3(a, 1, xn, ob, oh, ow, end, yrow, rrow);
        else if (tile3) ow = grouped_inside3(a, 2, xn, ob, oh, ow, end, yrow, rrow);
        for (; ow + GB_TILE <= end; ow += GB_TILE) grouped_tile(a, GB_TILE, 1, xn, ob, oh, ow, yrow, rrow);
        for (; ow < end; ow++) grouped_tile(a, 1, 1, xn, ob, oh, ow, yrow, rrow);
        for (; ow < s->OW; ow++) grouped_tile(a, 1, 0, xn, ob, oh, ow, yrow, rrow);
    }
}

void cuvil_conv_grouped_blocked(const cuvil_conv_shape *s, const float *x, const float *w, const float *bias,
                                const float *residual, float *y, int act, int nthreads) {
    grouped_args a = {s, s->C / s->groups, x, w, bias, residual, y, act};
    for (int64_t j = 0; j < a.g && a.g < CUVIL_BLOCK; j++)
        for (int l = 0; l < CUVIL_VL; l++) a.masks[j][l] = (int32_t)(l / a.g * a.g + j);
    int64_t rows = s->N * (s->O / CUVIL_BLOCK) * s->OH;
    int64_t work = rows * s->OW * s->KH * s->KW * a.g;
    cuvil_parallel_for(work > 65536 ? nthreads : 1, rows, 1, grouped_task, &a);
}
