#include "winograd.h"
#include "pool.h"
#include "vmath.h"

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

/* n values of consecutive tiles t0.. for channel c into a packed B operand ([panel][C][NR]), in whole
 * vectors (element-wise stores of the runs that tile rows leave inside a panel were two thirds of
 * the input transform). A run at the start of a panel row stores all of it: the lanes past the run
 * belong to later tiles of this channel, which this thread writes next. A run further in is blended
 * into the row, which the run before it has just brought into cache. (AVX2 masked stores are
 * microcoded on AMD: slower still.) vals must be readable NR floats before and after its n values. */
static inline void store_packed(float *bp, int64_t C, int64_t c, int64_t t0, const float *vals, int64_t n) {
    static const int32_t lane_index[32] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                                           16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
    for (int64_t i = 0; i < n;) {
        int64_t t = t0 + i, j = t % CUVIL_NR, run = CUVIL_NR - j < n - i ? CUVIL_NR - j : n - i;
        float *row = bp + ((t / CUVIL_NR) * C + c) * CUVIL_NR;
        const float *src = vals + i - j;                  /* lane u of the row takes src[u] */
        for (int h = 0; h < 2; h++) {
            cuvil_vf v = cuvil_vload(src + h * CUVIL_VL);
            if (j > 0) {
                cuvil_vi lane = *(const cuvil_vi *)(lane_index + h * CUVIL_VL);
                v = cuvil_vsel(lane >= (int32_t)j, v, cuvil_vload(row + h * CUVIL_VL));
            }
            cuvil_vstore(row + h * CUVIL_VL, v);
        }
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
 * first, on the even and the odd columns apart, so that the column combination per tile reads
 * both in unit stride and every step vectorizes. */
#define WG_ROW (CUVIL_WINOGRAD_MAX_W / 2 + 2)
static void input_task(void *ctx, int64_t c0, int64_t c1) {
    const wg_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t TW = tiles_w(s), T = tiles_h(s) * TW, Wp = 2 * TW + 2, vstride = cuvil_packed_b_size(s->C, T);
    float d[4][CUVIL_WINOGRAD_MAX_W + 4], te[4][WG_ROW], to[4][WG_ROW];
    float v[16][CUVIL_NR + WG_ROW + CUVIL_NR] __attribute__((aligned(64)));   /* NR spare each side */
    for (int64_t c = c0; c < c1; c++) {
        const float *xc = a->x + c * s->H * s->W;
        for (int64_t th = 0; th < tiles_h(s); th++) {
            for (int i = 0; i < 4; i++) padded_row(s, xc, 2 * th - s->ph + i, Wp, d[i]);
            for (int64_t u = 0; u < TW + 1; u++) {        /* B^T d on columns 2u and 2u + 1 */
                float e0 = d[0][2 * u], e1 = d[1][2 * u], e2 = d[2][2 * u], e3 = d[3][2 * u];
                float o0 = d[0][2 * u + 1], o1 = d[1][2 * u + 1], o2 = d[2][2 * u + 1], o3 = d[3][2 * u + 1];
                te[0][u] = e0 - e2, te[1][u] = e1 + e2, te[2][u] = e2 - e1, te[3][u] = e1 - e3;
                to[0][u] = o0 - o2, to[1][u] = o1 + o2, to[2][u] = o2 - o1, to[3][u] = o1 - o3;
            }
            for (int i = 0; i < 4; i++)                   /* then (B^T d) B: tile tw spans columns 2tw .. 2tw + 3 */
                for (int64_t tw = 0; tw < TW; tw++) {
                    v[4 * i + 0][CUVIL_NR + tw] = te[i][tw] - te[i][tw + 1];
                    v[4 * i + 1][CUVIL_NR + tw] = to[i][tw] + te[i][tw + 1];
                    v[4 * i + 2][CUVIL_NR + tw] = te[i][tw + 1] - to[i][tw];
                    v[4 * i + 3][CUVIL_NR + tw] = to[i][tw] - to[i][tw + 1];
                }
            for (int xi = 0; xi < 16; xi++) store_packed(a->v + xi * vstride, s->C, c, th * TW, v[xi] + CUVIL_NR, TW);
        }
        /* the last panel's columns past T: computed by the GEMM and dropped, but never garbage */
        if (T % CUVIL_NR)
            for (int xi = 0; xi < 16; xi++)
                memset(a->v + xi * vstride + ((T / CUVIL_NR) * s->C + c) * CUVIL_NR + T % CUVIL_NR, 0,
                       (size_t)(CUVIL_NR - T % CUVIL_NR) * sizeof(float));
    }
}

/* Y = A^T M A per tile for output channels [o0, o1), then bias, residual and activation: each step a
 * loop over a whole row of tiles, so all of it runs in vectors (per tile it was scalar). */
static void output_task(void *ctx, int64_t o0, int64_t o1) {
    const wg_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t TW = tiles_w(s), T = tiles_h(s) * TW, plane = s->O * T;
    float s0[4][CUVIL_WINOGRAD_MAX_W / 2 + 2], s1[4][CUVIL_WINOGRAD_MAX_W / 2 + 2];
    float rows[2][CUVIL_WINOGRAD_MAX_W + 4] __attribute__((aligned(64)));
    for (int64_t o = o0; o < o1; o++) {
        const float *m = a->m + o * T;
        float *yo = a->y + o * s->OH * s->OW;
        const float *ro = a->residual ? a->residual + o * s->OH * s->OW : 0;
        const cuvil_vf bv = cuvil_vsplat(a->bias ? a->bias[o] : 0.f);
        for (int64_t th = 0; th < tiles_h(s); th++) {
            const float *mt = m + th * TW;
            for (int j = 0; j < 4; j++) {          /* the column combination: s = A^T M, by rows of M */
                const float *m0 = mt + j * plane, *m1 = mt + (4 + j) * plane;
                const float *m2 = mt + (8 + j) * plane, *m3 = mt + (12 + j) * plane;
                for (int64_t tw = 0; tw < TW; tw++) {
                    s0[j][tw] = m0[tw] + m1[tw] + m2[tw];
                    s1[j][tw] = m1[tw] - m2[tw] - m3[tw];
                }
            }
            for (int64_t tw = 0; tw < TW; tw++) {    /* then s A, the two columns of each tile interleaved */
                rows[0][2 * tw] = s0[0][tw] + s0[1][tw] + s0[2][tw];
                rows[0][2 * tw + 1] = s0[1][tw] - s0[2][tw] - s0[3][tw];
                rows[1][2 * tw] = s1[0][tw] + s1[1][tw] + s1[2][tw];
                rows[1][2 * tw + 1] = s1[1][tw] - s1[2][tw] - s1[3][tw];
            }
            for (int r = 0; r < 2 && 2 * th + r < s->OH; r++) {
                int64_t off = (2 * th + r) * s->OW, ow = 0;
                for (; ow + CUVIL_VL <= s->OW; ow += CUVIL_VL) {
                    cuvil_vf v = cuvil_vload(rows[r] + ow) + bv;
                    if (ro) v += cuvil_vload(ro + off + ow);
                    cuvil_vstore(yo + off + ow, cuvil_vact(v, a->act));
                }
                for (; ow < s->OW; ow++)
                    yo[off + ow] = cuvil_act(rows[r][ow] + bv[0] + (ro ? ro[off + ow] : 0.f), a->act);
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
