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
    const float *up;           /* the 16 transformed filters (packed A operands) */
    float *v, *m, *y;          /* transformed input (16 packed B operands), products [16][O][T], output */
    int act;
} wg_args;

/* Input columns col0 .. col0 + n - 1 of row ih, zero outside the image. */
static inline void padded_span(const cuvil_conv_shape *s, const float *xc, int64_t ih, int64_t col0, int64_t n,
                               float *d) {
    if (ih < 0 || ih >= s->H) { memset(d, 0, (size_t)n * sizeof(float)); return; }
    int64_t lo = col0 < 0 ? -col0 : 0, hi = s->W - col0 < n ? s->W - col0 : n;
    if (lo > n) lo = n;
    if (hi < lo) hi = lo;
    for (int64_t j = 0; j < lo; j++) d[j] = 0.f;
    for (int64_t j = lo; j < hi; j++) d[j] = xc[ih * s->W + col0 + j];
    for (int64_t j = hi; j < n; j++) d[j] = 0.f;
}

/* Channels of one task of the input transform (tasks are panel x channel block). */
#define WG_CBLOCK 32

/* V = B^T d B for every 4x4 patch d, one packed panel (NR consecutive tiles, which may span several
 * tile rows) and channel block per task: all NR lanes of a panel row are computed before it is
 * stored, so each store is one whole 64-byte row and consecutive channels write consecutive rows
 * (tile rows outer, channels outer scattered the stores a panel apart and read-modify-wrote the rows
 * that tile rows split: 64 channels at 56x56, that transform ran at ~1.6 GB/s, 38% of the conv). */
static void input_task(void *ctx, int64_t k0, int64_t k1) {
    const wg_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t TW = tiles_w(s), T = tiles_h(s) * TW, vstride = cuvil_packed_b_size(s->C, T);
    int64_t cblocks = (s->C + WG_CBLOCK - 1) / WG_CBLOCK;
    float d[4][2 * CUVIL_NR + 2], te[4][CUVIL_NR + 1], to[4][CUVIL_NR + 1];
    float held[CUVIL_WINOGRAD_HELD][16][CUVIL_NR] __attribute__((aligned(64)));
    for (int64_t k = k0; k < k1; k++) {
        int64_t p = k / cblocks, c0 = k % cblocks * WG_CBLOCK, c1 = c0 + WG_CBLOCK < s->C ? c0 + WG_CBLOCK : s->C;
        int64_t t0 = p * CUVIL_NR, t1 = t0 + CUVIL_NR < T ? t0 + CUVIL_NR : T;
        memset(held, 0, sizeof held);          /* lanes past T: computed by the GEMM and dropped */
        for (int64_t c = c0; c < c1; c++) {
            int64_t j = (c - c0) % CUVIL_WINOGRAD_HELD;
            float (*vals)[CUVIL_NR] = held[j];
            const float *xc = a->x + c * s->H * s->W;
            for (int64_t t = t0; t < t1;) {    /* the panel's tiles, one run per tile row */
                int64_t th = t / TW, tw0 = t % TW, n = TW - tw0 < t1 - t ? TW - tw0 : t1 - t, lane = t - t0;
                for (int i = 0; i < 4; i++) padded_span(s, xc, 2 * th - s->ph + i, 2 * tw0 - s->pw, 2 * n + 2, d[i]);
                for (int64_t u = 0; u < n + 1; u++) {        /* B^T d on columns 2u and 2u + 1 */
                    float e0 = d[0][2 * u], e1 = d[1][2 * u], e2 = d[2][2 * u], e3 = d[3][2 * u];
                    float o0 = d[0][2 * u + 1], o1 = d[1][2 * u + 1], o2 = d[2][2 * u + 1], o3 = d[3][2 * u + 1];
                    te[0][u] = e0 - e2, te[1][u] = e1 + e2, te[2][u] = e2 - e1, te[3][u] = e1 - e3;
                    to[0][u] = o0 - o2, to[1][u] = o1 + o2, to[2][u] = o2 - o1, to[3][u] = o1 - o3;
                }
                for (int i = 0; i < 4; i++)                   /* then (B^T d) B: tile u spans columns 2u .. 2u + 3 */
                    for (int64_t u = 0; u < n; u++) {
                        vals[4 * i + 0][lane + u] = te[i][u] - te[i][u + 1];
                        vals[4 * i + 1][lane + u] = to[i][u] + te[i][u + 1];
                        vals[4 * i + 2][lane + u] = te[i][u + 1] - to[i][u];
                        vals[4 * i + 3][lane + u] = to[i][u] - to[i][u + 1];
                    }
                t += n;
            }
            if (j == CUVIL_WINOGRAD_HELD - 1 || c == c1 - 1)
                cuvil_winograd_store_held(a->v, vstride, 16, p * s->C + c - j, j + 1, &held[0][0][0]);
        }
    }
}

/* The 16 products, one GEMM per task on one thread: evenly split over the threads with one
 * synchronization, where a parallel region per GEMM split each small one (M = 512, N = 16 at 7x7)
 * into a handful of tasks. */
static void product_task(void *ctx, int64_t x0, int64_t x1) {
    const wg_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t T = tiles_h(s) * tiles_w(s), vstride = cuvil_packed_b_size(s->C, T);
    int64_t astride = cuvil_packed_a_size(s->O, s->C);
    for (int64_t xi = x0; xi < x1; xi++)
        cuvil_sgemm_packed_ab(s->O, T, s->C, a->up + xi * astride, a->v + xi * vstride, a->m + xi * s->O * T, T, 0, 1);
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
    int64_t in = s->C * s->H * s->W, out = s->O * s->OH * s->OW;
    for (int64_t n = 0; n < s->N; n++) {
        wg_args a = {.s = s, .x = x + n * in, .bias = bias, .residual = residual ? residual + n * out : 0, .up = up,
                     .v = scratch, .m = scratch + 16 * vstride, .y = y + n * out, .act = act};
        int64_t np = (T + CUVIL_NR - 1) / CUVIL_NR, cblocks = (s->C + WG_CBLOCK - 1) / WG_CBLOCK;
        cuvil_parallel_for(nthreads, np * cblocks, 1, input_task, &a);
        cuvil_parallel_chunks(nthreads, 16, 1, product_task, &a);
        cuvil_parallel_for(nthreads, s->O, 1, output_task, &a);
    }
}
