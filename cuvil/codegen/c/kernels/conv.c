#include "conv.h"

int64_t cuvil_conv_scratch(const cuvil_conv_shape *s) {
    int64_t K = (s->C / s->groups) * s->KH * s->KW;
    return cuvil_packed_b_size(K, s->OH * s->OW);
}

/* Bp[p][k][j] with k = (c, kh, kw) and column n = p*NR + j = (oh, ow). */
static void im2col_packed(const cuvil_conv_shape *s, const float *x, int64_t cg, float *Bp, int nthreads) {
    int64_t N = s->OH * s->OW, K = cg * s->KH * s->KW, np = (N + CUVIL_NR - 1) / CUVIL_NR;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (np * K > 16384)
    for (int64_t p = 0; p < np; p++) {
        float *dst = Bp + p * K * CUVIL_NR;
        int64_t ih0[CUVIL_NR], iw0[CUVIL_NR];
        for (int j = 0; j < CUVIL_NR; j++) {
            int64_t n = p * CUVIL_NR + j;
            ih0[j] = n < N ? (n / s->OW) * s->sh - s->ph : INT64_MIN / 4;
            iw0[j] = n < N ? (n % s->OW) * s->sw - s->pw : INT64_MIN / 4;
        }
        for (int64_t c = 0; c < cg; c++)
            for (int64_t kh = 0; kh < s->KH; kh++)
                for (int64_t kw = 0; kw < s->KW; kw++) {
                    float *d = dst + ((c * s->KH + kh) * s->KW + kw) * CUVIL_NR;
                    const float *xc = x + c * s->H * s->W;
                    for (int j = 0; j < CUVIL_NR; j++) {
                        int64_t ih = ih0[j] + kh * s->dh, iw = iw0[j] + kw * s->dw;
                        d[j] = (ih >= 0 && ih < s->H && iw >= 0 && iw < s->W) ? xc[ih * s->W + iw] : 0.f;
                    }
                }
    }
}

static void depthwise(const cuvil_conv_shape *s, const float *x, const float *w, const float *bias,
                      const float *residual, float *y, int act, int nthreads) {
    int64_t mult = s->O / s->C;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t nc = 0; nc < s->N * s->O; nc++) {
        int64_t n = nc / s->O, o = nc % s->O, c = o / mult;
        const float *xc = x + (n * s->C + c) * s->H * s->W;
        const float *wo = w + o * s->KH * s->KW;
        float *yo = y + nc * s->OH * s->OW;
        float b = bias ? bias[o] : 0.f;
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
                if (residual) acc += residual[nc * s->OH * s->OW + oh * s->OW + ow];
                yo[oh * s->OW + ow] = cuvil_act(acc, act);
            }
    }
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

void cuvil_pool2d(const cuvil_conv_shape *s, int64_t ph1, int64_t pw1, int mode, const float *x, float *y,
                  int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t nc = 0; nc < s->N * s->C; nc++) {
        const float *xc = x + nc * s->H * s->W;
        float *yc = y + nc * s->OH * s->OW;
        for (int64_t oh = 0; oh < s->OH; oh++)
            for (int64_t ow = 0; ow < s->OW; ow++) {
                float acc = mode == 0 ? -INFINITY : 0.f;
                int64_t cnt = 0;
                for (int64_t kh = 0; kh < s->KH; kh++) {
                    int64_t ih = oh * s->sh - s->ph + kh * s->dh;
                    for (int64_t kw = 0; kw < s->KW; kw++) {
                        int64_t iw = ow * s->sw - s->pw + kw * s->dw;
                        int inside = ih >= 0 && ih < s->H && iw >= 0 && iw < s->W;
                        if (inside) {
                            float v = xc[ih * s->W + iw];
                            if (mode == 0) acc = (v > acc || v != v) ? v : acc;
                            else acc += v;
                            cnt++;
                        } else if (mode == 2 && ih >= -s->ph && ih < s->H + ph1 && iw >= -s->pw && iw < s->W + pw1) {
                            cnt++;
                        }
                    }
                }
                yc[oh * s->OW + ow] = mode == 0 ? acc : acc / (float)(cnt > 0 ? cnt : 1);
            }
    }
}
