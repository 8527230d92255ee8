/* Winograd F(2x2) and F(4x4) for 3x3 stride-1 convs in the channel-blocked layout (blocked.h):
 * every transform runs in vectors across 16 channels of one tile, reading and writing whole 64-byte
 * pixels, and the products are blocked GEMMs with the tiles as rows (no lanes left empty when the
 * tiles do not fill a panel: a 28x28 map's 49 tiles took 64 lanes in winograd4.c). */
#include "blocked.h"
#include "pool.h"
#include "vmath.h"
#include "winograd.h"

typedef struct {
    const cuvil_conv_shape *s;
    int m;
    int64_t TH, TW;
    int64_t parts;              /* group_task: tile-row parts of each group */
    const float *x, *up, *bias, *residual;
    float *v, *prod, *y;        /* transformed input [alpha2][C/16][T][16], products [alpha2][O/16][T][16] */
    int act;
} wgb_args;

static inline int64_t wgb_tiles(const cuvil_conv_shape *s, int m) { return ((s->OH + m - 1) / m) * ((s->OW + m - 1) / m); }

int64_t cuvil_winograd_blocked_scratch(const cuvil_conv_shape *s, int m) {
    return (int64_t)(m + 2) * (m + 2) * (s->C + s->O) * wgb_tiles(s, m);
}

/* B^T along one axis of an alpha x alpha array of vectors: x[i * step], y[i * step] for i < alpha. */
static inline __attribute__((always_inline)) void bt_axis(int m, const cuvil_vf *x, cuvil_vf *y, int step) {
    if (m == 4) WG4_BT(y[0], y[step], y[2 * step], y[3 * step], y[4 * step], y[5 * step],
                       x[0], x[step], x[2 * step], x[3 * step], x[4 * step], x[5 * step]);
    else WG2_BT(y[0], y[step], y[2 * step], y[3 * step], x[0], x[step], x[2 * step], x[3 * step]);
}

/* A^T along one axis: alpha inputs x[i * xs] to m outputs y[i * ys]. */
static inline __attribute__((always_inline)) void at_axis(int m, const cuvil_vf *x, int xs, cuvil_vf *y, int ys) {
    if (m == 4) WG4_AT(y[0], y[ys], y[2 * ys], y[3 * ys], x[0], x[xs], x[2 * xs], x[3 * xs], x[4 * xs], x[5 * xs]);
    else WG2_AT(y[0], y[ys], x[0], x[xs], x[2 * xs], x[3 * xs]);
}

/* Items r = cb * TH + th: one row of tiles of one channel block. */
static inline __attribute__((always_inline)) void input_rows(int m, const wgb_args *a, int64_t r0, int64_t r1) {
    const cuvil_conv_shape *s = a->s;
    const int alpha = m + 2;
    int64_t T = a->TH * a->TW, plane = s->C * T;
    for (int64_t r = r0; r < r1; r++) {
        int64_t cb = r / a->TH, th = r % a->TH;
        const float *xc = a->x + cb * s->H * s->W * CUVIL_BLOCK;
        for (int64_t tw = 0; tw < a->TW; tw++) {
            int64_t t = th * a->TW + tw;
            float *dst = a->v + (cb * T + t) * CUVIL_BLOCK;
            for (int lane = 0; lane < CUVIL_BLOCK; lane += CUVIL_VL) {
                cuvil_vf d[6 * 6], u[6 * 6], v[6 * 6];
                for (int i = 0; i < alpha; i++) {
                    int64_t ih = th * m - s->ph + i;
                    for (int j = 0; j < alpha; j++) {
                        int64_t iw = tw * m - s->pw + j;
                        d[i * alpha + j] = ih >= 0 && ih < s->H && iw >= 0 && iw < s->W
                                           ? cuvil_vload(xc + (ih * s->W + iw) * CUVIL_BLOCK + lane) : cuvil_vsplat(0.f);
                    }
                }
                for (int j = 0; j < alpha; j++) bt_axis(m, d + j, u + j, alpha);              /* B^T d */
                for (int i = 0; i < alpha; i++) bt_axis(m, u + i * alpha, v + i * alpha, 1);  /* (B^T d) B */
                for (int xi = 0; xi < alpha * alpha; xi++) cuvil_vstore(dst + xi * plane + lane, v[xi]);
            }
        }
    }
}

static void input_task(void *ctx, int64_t r0, int64_t r1) {
    const wgb_args *a = ctx;
    if (a->m == 4) input_rows(4, a, r0, r1);
    else input_rows(2, a, r0, r1);
}

/* The product at transform point xi of group q (whole channel blocks: conv_plan._winograd_groups) for
 * tiles [t0, t0 + tiles), on this thread. */
static void group_product(const wgb_args *a, int64_t xi, int64_t q, int64_t t0, int64_t tiles) {
    const cuvil_conv_shape *s = a->s;
    int64_t G = s->groups, Cg = s->C / G, Og = s->O / G, T = a->TH * a->TW;
    cuvil_sgemm_blocked(tiles, Og, Cg, a->v + (xi * s->C + q * Cg) * T + t0 * CUVIL_BLOCK, T * CUVIL_BLOCK,
                        a->up + (xi * G + q) * cuvil_packed_b_size(Cg, Og),
                        a->prod + (xi * s->O + q * Og) * T + t0 * CUVIL_BLOCK, T * CUVIL_BLOCK, 0, 0, CUVIL_ACT_NONE, 1);
}

/* The alpha^2 products of each group over all tiles, one GEMM per task (as winograd4.c: product_task4),
 * so that each thread reads its share of the filters; item = xi * groups + group. Grouped convs on more
 * than one thread run group_task instead. */
static void product_task(void *ctx, int64_t i0, int64_t i1) {
    const wgb_args *a = ctx;
    for (int64_t item = i0; item < i1; item++)
        group_product(a, item / a->s->groups, item % a->s->groups, 0, a->TH * a->TW);
}

/* Items r = ob * TH + th: Y = A^T M A for a row of tiles of one output block, then bias, residual
 * and activation, stored pixel by pixel inside the output. */
static inline __attribute__((always_inline)) void output_rows(int m, const wgb_args *a, int64_t r0, int64_t r1,
                                                             int res, int act) {
    const cuvil_conv_shape *s = a->s;
    const int alpha = m + 2;
    int64_t T = a->TH * a->TW, plane = s->O * T;
    for (int64_t r = r0; r < r1; r++) {
        int64_t ob = r / a->TH, th = r % a->TH;
        float *yb = a->y + ob * s->OH * s->OW * CUVIL_BLOCK;
        const float *rb = res ? a->residual + ob * s->OH * s->OW * CUVIL_BLOCK : 0;
        for (int64_t tw = 0; tw < a->TW; tw++) {
            const float *src = a->prod + (ob * T + th * a->TW + tw) * CUVIL_BLOCK;
            for (int lane = 0; lane < CUVIL_BLOCK; lane += CUVIL_VL) {
                cuvil_vf p[6 * 6], q[4 * 6], o[4 * 4];
                for (int xi = 0; xi < alpha * alpha; xi++) p[xi] = cuvil_vload(src + xi * plane + lane);
                for (int j = 0; j < alpha; j++) at_axis(m, p + j, alpha, q + j, alpha);        /* A^T M */
                for (int i = 0; i < m; i++) at_axis(m, q + i * alpha, 1, o + i * m, 1);         /* (A^T M) A */
                cuvil_vf bias = a->bias ? cuvil_vload(a->bias + ob * CUVIL_BLOCK + lane) : cuvil_vsplat(0.f);
                for (int i = 0; i < m && th * m + i < s->OH; i++)
                    for (int j = 0; j < m && tw * m + j < s->OW; j++) {
                        int64_t off = ((th * m + i) * s->OW + tw * m + j) * CUVIL_BLOCK + lane;
                        cuvil_vf v = o[i * m + j] + bias;
                        if (res) v += cuvil_vload(rb + off);
                        if (act == CUVIL_ACT_RELU) v = cuvil_vrelu(v);          /* NaN stays */
                        else if (act) v = cuvil_vact(v, act);
                        cuvil_vstore(yb + off, v);
                    }
            }
        }
    }
}

/* output_rows with the residual and ReLU (or none) as constants: tested per output vector, they were a
 * compare and branch each beside a few adds (as the blocked tiles' stores, blocked.c store_vector_as). */
static void output_task(void *ctx, int64_t r0, int64_t r1) {
    const wgb_args *a = ctx;
    const int res = a->residual != 0, act = a->act;
    #define OUT(M) do {                                                                                   \
        if (act == CUVIL_ACT_RELU) { if (res) output_rows(M, a, r0, r1, 1, CUVIL_ACT_RELU);                \
                                     else output_rows(M, a, r0, r1, 0, CUVIL_ACT_RELU); }                  \
        else if (act == CUVIL_ACT_NONE) { if (res) output_rows(M, a, r0, r1, 1, CUVIL_ACT_NONE);           \
                                          else output_rows(M, a, r0, r1, 0, CUVIL_ACT_NONE); }             \
        else output_rows(M, a, r0, r1, res, act);                                                          \
    } while (0)
    if (a->m == 4) OUT(4);
    else OUT(2);
    #undef OUT
}

/* Items it = q * parts + part: group q's tile rows [part * TH / parts, (part + 1) * TH / parts), from its
 * input blocks through its products to its output blocks, on one thread. The groups of a grouped conv
 * share nothing, so a thread's transformed input and products stay in its own L2: run by phases (the
 * input by rows, the products by transform point, the output by rows), every phase read what the other
 * core had written, and where the host put the two cores far apart (a core-to-core round trip of 380 ns,
 * not 100) RegNetY's grouped convs ran as slowly on 2 threads as on 1. */
static void group_task(void *ctx, int64_t i0, int64_t i1) {
    const wgb_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t Cb = s->C / s->groups / CUVIL_BLOCK, Ob = s->O / s->groups / CUVIL_BLOCK, alpha2 = (a->m + 2) * (a->m + 2);
    for (int64_t it = i0; it < i1; it++) {
        /* parts <= TH (group_parts): every part has a row */
        int64_t q = it / a->parts, part = it % a->parts;
        int64_t th0 = part * a->TH / a->parts, th1 = (part + 1) * a->TH / a->parts;
        for (int64_t cb = q * Cb; cb < (q + 1) * Cb; cb++) input_task((void *)a, cb * a->TH + th0, cb * a->TH + th1);
        for (int64_t xi = 0; xi < alpha2; xi++) group_product(a, xi, q, th0 * a->TW, (th1 - th0) * a->TW);
        for (int64_t ob = q * Ob; ob < (q + 1) * Ob; ob++) output_task((void *)a, ob * a->TH + th0, ob * a->TH + th1);
    }
}

/* Parts of tile rows a group is split into: the fewest that give every thread as many items (a thread
 * reads the filters of each group it works on, so groups are split only for the balance). */
static int64_t group_parts(int64_t groups, int64_t TH, int nthreads) {
    for (int64_t p = 1; p <= TH; p++)
        if ((groups * p) % nthreads == 0) return p;
    return TH;
}

void cuvil_conv3x3_winograd_blocked(const cuvil_conv_shape *s, int m, const float *x, const float *up,
                                    const float *bias, const float *residual, float *y, int act, float *scratch,
                                    int nthreads) {
    int64_t TH = (s->OH + m - 1) / m, TW = (s->OW + m - 1) / m, T = TH * TW, alpha2 = (m + 2) * (m + 2);
    int64_t in = s->C * s->H * s->W, out = s->O * s->OH * s->OW;
    for (int64_t n = 0; n < s->N; n++) {
        wgb_args a = {s, m, TH, TW, group_parts(s->groups, TH, nthreads), x + n * in, up, bias,
                      residual ? residual + n * out : 0, scratch, scratch + alpha2 * s->C * T, y + n * out, act};
        if (s->groups > 1 && nthreads > 1) {      /* one thread: by phases, as fast (RegNetY 1.009x the time by groups) */
            cuvil_parallel_for(nthreads, s->groups * a.parts, 1, group_task, &a);
            continue;
        }
        cuvil_parallel_for(nthreads, s->C / CUVIL_BLOCK * TH, 1, input_task, &a);
        cuvil_parallel_chunks(nthreads, alpha2 * s->groups, 1, product_task, &a);
        cuvil_parallel_for(nthreads, s->O / CUVIL_BLOCK * TH, 1, output_task, &a);
    }
}
