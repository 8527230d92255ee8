#include "conv.h"
#include "pool.h"

int64_t cuvil_conv_scratch(const cuvil_conv_shape *s) {
    int64_t K = (s->C / s->groups) * s->KH * s->KW;
    return cuvil_packed_b_size(K, s->OH * s->OW);
}

/* Bp[p][k][j] with k = (c, kh, kw) and column n = p*NR + j = (oh, ow). */
typedef struct { const cuvil_conv_shape *s; const float *x; int64_t cg; float *Bp; } im2col_args;

static void im2col_task(void *ctx, int64_t p0, int64_t p1) {
    const im2col_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t N = s->OH * s->OW, K = a->cg * s->KH * s->KW;
    for (int64_t p = p0; p < p1; p++) {
        float *dst = a->Bp + p * K * CUVIL_NR;
        int64_t ih0[CUVIL_NR], iw0[CUVIL_NR];
        for (int j = 0; j < CUVIL_NR; j++) {
            int64_t n = p * CUVIL_NR + j;
            ih0[j] = n < N ? (n / s->OW) * s->sh - s->ph : INT64_MIN / 4;
            iw0[j] = n < N ? (n % s->OW) * s->sw - s->pw : INT64_MIN / 4;
        }
        for (int64_t c = 0; c < a->cg; c++)
            for (int64_t kh = 0; kh < s->KH; kh++)
                for (int64_t kw = 0; kw < s->KW; kw++) {
                    float *d = dst + ((c * s->KH + kh) * s->KW + kw) * CUVIL_NR;
                    const float *xc = a->x + c * s->H * s->W;
                    for (int j = 0; j < CUVIL_NR; j++) {
                        int64_t ih = ih0[j] + kh * s->dh, iw = iw0[j] + kw * s->dw;
                        d[j] = (ih >= 0 && ih < s->H && iw >= 0 && iw < s->W) ? xc[ih * s->W + iw] : 0.f;
                    }
                }
    }
}

static void im2col_packed(const cuvil_conv_shape *s, const float *x, int64_t cg, float *Bp, int nthreads) {
    int64_t N = s->OH * s->OW, K = cg * s->KH * s->KW, np = (N + CUVIL_NR - 1) / CUVIL_NR;
    im2col_args a = {s, x, cg, Bp};
    cuvil_parallel_for(np * K > 16384 ? nthreads : 1, np, 1, im2col_task, &a);
}

typedef struct {
    const cuvil_conv_shape *s;
    const float *x, *w, *bias, *residual;
    float *y;
    int act;
} direct_args;

static void depthwise_task(void *ctx, int64_t nc0, int64_t nc1) {
    const direct_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t mult = s->O / s->C;
    for (int64_t nc = nc0; nc < nc1; nc++) {
        int64_t n = nc / s->O, o = nc % s->O, c = o / mult;
        const float *xc = a->x + (n * s->C + c) * s->H * s->W;
        const float *wo = a->w + o * s->KH * s->KW;
        float *yo = a->y + nc * s->OH * s->OW;
        float b = a->bias ? a->bias[o] : 0.f;
        for (int64_t oh = 0; oh < s->OH; oh++)
            for (int64_t ow = 0; ow < s->OW; ow++) {
                float acc = b;
                for (int64_t kh = 0; kh < s->KH; kh++) {
                    int64_t ih = oh * s->sh - s->ph + kh * s->dh;
                    if (ih < 0 || ih >= s->H) continue;
                    for (int64_t kw = 0; kw < s->KW; kw++) {
                        int64_t iw = ow * s->sw - s->pw + kw * s->dw;
                        if (iw >= 0 && iw < s->W) acc += xc[ih * s->W + iw] * wo[kh * s->KW + kw];
                    }
                }
                if (a->residual) acc += a->residual[nc * s->OH * s->OW + oh * s->OW + ow];
                yo[oh * s->OW + ow] = cuvil_act(acc, a->act);
            }
    }
}

static void depthwise(const cuvil_conv_shape *s, const float *x, const float *w, const float *bias,
                      const float *residual, float *y, int act, int nthreads) {
    direct_args a = {s, x, w, bias, residual, y, act};
    cuvil_parallel_for(nthreads, s->N * s->O, 1, depthwise_task, &a);
}

void cuvil_conv2d(const cuvil_conv_shape *s, const float *x, const float *w, const float *bias,
                  const float *residual, float *y, int act, float *scratch, int nthreads) {
    if (s->groups == s->C && s->O % s->C == 0 && s->groups > 1) {
        depthwise(s, x, w, bias, residual, y, act, nthreads);
        return;
    }
    int64_t cg = s->C / s->groups, og = s->O / s->groups, K = cg * s->KH * s->KW, N = s->OH * s->OW;
    int direct = s->KH == 1 && s->KW == 1 && s->sh == 1 && s->sw == 1 && s->ph == 0 && s->pw == 0;
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t g = 0; g < s->groups; g++) {
            const float *xg = x + (n * s->C + g * cg) * s->H * s->W;
            if (direct) cuvil_pack_b(K, N, xg, N, 0, scratch, nthreads);
            else im2col_packed(s, xg, cg, scratch, nthreads);
            cuvil_epilogue ep = {bias ? bias + g * og : 0, 0, residual ? residual + (n * s->O + g * og) * N : 0,
                                 N, 1.f, act};
            cuvil_sgemm_packed(og, N, K, w + g * og * K, K, scratch, y + (n * s->O + g * og) * N, N, &ep, nthreads);
        }
}

typedef struct { const cuvil_conv_shape *s; int64_t ph1, pw1; int mode; const float *x; float *y; } pool_args;

static void pool_task(void *ctx, int64_t nc0, int64_t nc1) {
    const pool_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    for (int64_t nc = nc0; nc < nc1; nc++) {
        const float *xc = a->x + nc * s->H * s->W;
        float *yc = a->y + nc * s->OH * s->OW;
        for (int64_t oh = 0; oh < s->OH; oh++) {
            /* the window rows inside the input, found once per output row, not tested per element */
            int64_t h0 = oh * s->sh - s->ph;
            int64_t kh0 = h0 >= 0 ? 0 : (-h0 + s->dh - 1) / s->dh;
            int64_t kh1 = s->KH;
            while (kh1 > kh0 && h0 + (kh1 - 1) * s->dh >= s->H) kh1--;
            for (int64_t ow = 0; ow < s->OW; ow++) {
                int64_t w0 = ow * s->sw - s->pw;
                int64_t kw0 = w0 >= 0 ? 0 : (-w0 + s->dw - 1) / s->dw;
                int64_t kw1 = s->KW;
                while (kw1 > kw0 && w0 + (kw1 - 1) * s->dw >= s->W) kw1--;
                float acc = a->mode == 0 ? -INFINITY : 0.f;
                for (int64_t kh = kh0; kh < kh1; kh++) {
                    const float *row = xc + (h0 + kh * s->dh) * s->W + w0;
                    for (int64_t kw = kw0; kw < kw1; kw++) {
                        float v = row[kw * s->dw];
                        if (a->mode == 0) acc = (v > acc || v != v) ? v : acc;
                        else acc += v;
                    }
                }
                int64_t cnt = (kh1 - kh0) * (kw1 - kw0);
                if (a->mode == 2) {        /* count the declared pads too, not the ceil_mode overhang */
                    int64_t rh = 0, rw = 0;
                    for (int64_t kh = 0; kh < s->KH; kh++) {
                        int64_t ih = h0 + kh * s->dh;
                        rh += ih >= -s->ph && ih < s->H + a->ph1;
                    }
                    for (int64_t kw = 0; kw < s->KW; kw++) {
                        int64_t iw = w0 + kw * s->dw;
                        rw += iw >= -s->pw && iw < s->W + a->pw1;
                    }
                    cnt = rh * rw;
                }
                yc[oh * s->OW + ow] = a->mode == 0 ? acc : acc / (float)(cnt > 0 ? cnt : 1);
            }
        }
    }
}

void cuvil_pool2d(const cuvil_conv_shape *s, int64_t ph1, int64_t pw1, int mode, const float *x, float *y,
                  int nthreads) {
    pool_args a = {s, ph1, pw1, mode, x, y};
    cuvil_parallel_for(nthreads, s->N * s->C, 1, pool_task, &a);
}
