#include "winograd.h"
#include "pool.h"

static inline int64_t tiles_w(const cuvil_conv_shape *s) { return (s->OW + 1) / 2; }
static inline int64_t tiles_h(const cuvil_conv_shape *s) { return (s->OH + 1) / 2; }

int64_t cuvil_winograd_scratch(const cuvil_conv_shape *s) {
    int64_t T = tiles_h(s) * tiles_w(s);
    return 16 * cuvil_packed_b_size(s->C, T) + 16 * s->O * T;
}

typedef struct {
    const cuvil_conv_shape *s;
    const float *x, *bias, *residual;
    float *v, *m, *y;          /* transformed input (16 packed B operands), products [16][O][T], output */
    int act;
} wg_args;

/* n values of consecutive tiles t0.. for channel c into a packed B operand ([panel][C][NR]). */
static inline void store_packed(float *bp, int64_t C, int64_t c, int64_t t0, const float *vals, int64_t n) {
    for (int64_t i = 0; i < n;) {
        int64_t t = t0 + i, j = t % CUVIL_NR, run = CUVIL_NR - j < n - i ? CUVIL_NR - j : n - i;
        memcpy(bp + ((t / CUVIL_NR) * C + c) * CUVIL_NR + j, vals + i, (size_t)run * sizeof(float));
        i += run;
    }
}

/* Input row ih as columns -pw .. -pw + n - 1, zero outside the image. */
static inline void padded_row(const cuvil_conv_shape *s, const float *xc, int64_t ih, int64_t n, float *d) {
    if (ih < 0 || ih >= s->H) { memset(d, 0, (size_t)n * sizeof(float)); return; }
    int64_t lo = s->pw < n ? s->pw : n, hi = s->pw + s->W < n ? s->pw + s->W : n;
    memset(d, 0, (size_t)lo * sizeof(float));
    memcpy(d + lo, xc + ih * s->W + (lo - s->pw), (size_t)(hi - lo) * sizeof(float));
    memset(d + hi, 0, (size_t)(n - hi) * sizeof(float));
}

/* V = B^T d B for every 4x4 patch d of channels [c0, c1): the row combination along whole rows
 * first (vectorizable), then the column combination per tile. */
static void input_task(void *ctx, int64_t c0, int64_t c1) {
    const wg_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t TW = tiles_w(s), T = tiles_h(s) * TW, Wp = 2 * TW + 2, vstride = cuvil_packed_b_size(s->C, T);
    float d[4][CUVIL_WINOGRAD_MAX_W + 4], t[4][CUVIL_WINOGRAD_MAX_W + 4], v[16][CUVIL_WINOGRAD_MAX_W / 2 + 2];
    for (int64_t c = c0; c < c1; c++) {
        const float *xc = a->x + c * s->H * s->W;
        for (int64_t th = 0; th < tiles_h(s); th++) {
            for (int i = 0; i < 4; i++) padded_row(s, xc, 2 * th - s->ph + i, Wp, d[i]);
            for (int64_t u = 0; u < Wp; u++) {
                t[0][u] = d[0][u] - d[2][u];
                t[1][u] = d[1][u] + d[2][u];
                t[2][u] = d[2][u] - d[1][u];
                t[3][u] = d[1][u] - d[3][u];
            }
            for (int i = 0; i < 4; i++)
                for (int64_t tw = 0; tw < TW; tw++) {
                    const float *r = t[i] + 2 * tw;
                    v[4 * i + 0][tw] = r[0] - r[2];
                    v[4 * i + 1][tw] = r[1] + r[2];
                    v[4 * i + 2][tw] = r[2] - r[1];
                    v[4 * i + 3][tw] = r[1] - r[3];
                }
            for (int xi = 0; xi < 16; xi++) store_packed(a->v + xi * vstride, s->C, c, th * TW, v[xi], TW);
        }
        /* the last panel's columns past T: computed by the GEMM and dropped, but never garbage */
        if (T % CUVIL_NR)
            for (int xi = 0; xi < 16; xi++)
                memset(a->v + xi * vstride + ((T / CUVIL_NR) * s->C + c) * CUVIL_NR + T % CUVIL_NR, 0,
                       (size_t)(CUVIL_NR - T % CUVIL_NR) * sizeof(float));
    }
}

/* Y = A^T M A per tile for output channels [o0, o1), then bias, residual and activation. */
static void output_task(void *ctx, int64_t o0, int64_t o1) {
    const wg_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t TW = tiles_w(s), T = tiles_h(s) * TW, plane = s->O * T;
    float rows[2][CUVIL_WINOGRAD_MAX_W + 4];
    for (int64_t o = o0; o < o1; o++) {
        const float *m = a->m + o * T;
        float *yo = a->y + o * s->OH * s->OW;
        const float *ro = a->residual ? a->residual + o * s->OH * s->OW : 0;
        const float b = a->bias ? a->bias[o] : 0.f;
        for (int64_t th = 0; th < tiles_h(s); th++) {
            const float *mt = m + th * TW;
            for (int64_t tw = 0; tw < TW; tw++) {
                float s0[4], s1[4];
                for (int j = 0; j < 4; j++) {
                    float m0 = mt[j * plane + tw], m1 = mt[(4 + j) * plane + tw];
                    float m2 = mt[(8 + j) * plane + tw], m3 = mt[(12 + j) * plane + tw];
                    s0[j] = m0 + m1 + m2;
                    s1[j] = m1 - m2 - m3;
                }
                rows[0][2 * tw] = s0[0] + s0[1] + s0[2], rows[0][2 * tw + 1] = s0[1] - s0[2] - s0[3];
                rows[1][2 * tw] = s1[0] + s1[1] + s1[2], rows[1][2 * tw + 1] = s1[1] - s1[2] - s1[3];
            }
            for (int r = 0; r < 2 && 2 * th + r < s->OH; r++) {
                int64_t off = (2 * th + r) * s->OW;
                for (int64_t ow = 0; ow < s->OW; ow++)
                    yo[off + ow] = cuvil_act(rows[r][ow] + b + (ro ? ro[off + ow] : 0.f), a->act);
            }
        }
    }
}

void cuvil_conv3x3_winograd(const cuvil_conv_shape *s, const float *x, const float *up, const float *bias,
                            const float *residual, float *y, int act, float *scratch, int nthreads) {
    int64_t T = tiles_h(s) * tiles_w(s), vstride = cuvil_packed_b_size(s->C, T);
    int64_t astride = cuvil_packed_a_size(s->O, s->C), in = s->C * s->H * s->W, out = s->O * s->OH * s->OW;
    for (int64_t n = 0; n < s->N; n++) {
        wg_args a = {s, x + n * in, bias, residual ? residual + n * out : 0, scratch, scratch + 16 * vstride,
                     y + n * out, act};
        cuvil_parallel_for(nthreads, s->C, 1, input_task, &a);
        for (int xi = 0; xi < 16; xi++)
            cuvil_sgemm_packed_ab(s->O, T, s->C, up + xi * astride, a.v + xi * vstride, a.m + xi * s->O * T, T, 0,
                                  nthreads);
        cuvil_parallel_for(nthreads, s->O, 1, output_task, &a);
    }
}
