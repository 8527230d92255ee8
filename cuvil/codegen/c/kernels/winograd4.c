/* Winograd F(4x4, 3x3) (see winograd.h): the structure of winograd.c with 6x6 input patches and
 * 36 GEMMs. Transforms (Lavin & Gray): V = B^T d B, Y = A^T M A with
 *   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
 *   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
 * Each step runs along a contiguous axis so that it vectorizes: the input rows are split by column
 * phase (mod 4) as they are read, so the per-tile combination reads unit-stride arrays. */
#include "winograd.h"
#include "pool.h"
#include "vmath.h"

static inline int64_t tiles_w4(const cuvil_conv_shape *s) { return (s->OW + 3) / 4; }
static inline int64_t tiles_h4(const cuvil_conv_shape *s) { return (s->OH + 3) / 4; }

int64_t cuvil_winograd4_scratch(const cuvil_conv_shape *s) {
    int64_t T = tiles_h4(s) * tiles_w4(s);
    return 36 * cuvil_packed_b_size(s->C, T) + 36 * s->O * T;
}

typedef struct {
    const cuvil_conv_shape *s;
    const float *x, *up, *bias, *residual;
    float *v, *m, *y;          /* transformed input (36 packed B operands), products [36][O][T], output */
    int act;
} wg4_args;

/* y[0..5] = B^T x for six inputs (any of them vectors or scalars: a macro, so it serves both). */
#define WG4_BT(y0, y1, y2, y3, y4, y5, x0, x1, x2, x3, x4, x5) do { \
    y0 = 4 * (x0) - 5 * (x2) + (x4);                                  \
    y1 = (x3) + (x4) - 4 * ((x1) + (x2));                             \
    y2 = (x4) - (x3) + 4 * ((x1) - (x2));                             \
    y3 = (x4) - (x2) + 2 * ((x3) - (x1));                             \
    y4 = (x4) - (x2) + 2 * ((x1) - (x3));                             \
    y5 = 4 * (x1) - 5 * (x3) + (x5);                                  \
} while (0)

/* Channels per task of the input transform (tasks are panel x channel block). */
#define WG4_CBLOCK 32
/* Windows of 4 columns one run of at most NR tiles reads (its tiles, and the 2 columns past them). */
#define WG4_WIN (CUVIL_NR + 1)

/* Row ih, columns col0 + 4u + r (u < nwin, r < 4), into dp[r][u]; zero outside the image. */
static inline void row_phases(const cuvil_conv_shape *s, const float *xc, int64_t ih, int64_t col0, int64_t nwin,
                              float dp[4][WG4_WIN]) {
    const float *row = xc + ih * s->W;
    if (ih < 0 || ih >= s->H) {
        for (int r = 0; r < 4; r++)
            for (int64_t u = 0; u < nwin; u++) dp[r][u] = 0.f;
    } else if (col0 >= 0 && col0 + 4 * nwin <= s->W) {           /* inside: no bounds per element */
        for (int64_t u = 0; u < nwin; u++)
            for (int r = 0; r < 4; r++) dp[r][u] = row[col0 + 4 * u + r];
    } else {
        for (int64_t u = 0; u < nwin; u++)
            for (int r = 0; r < 4; r++) {
                int64_t col = col0 + 4 * u + r;
                dp[r][u] = col >= 0 && col < s->W ? row[col] : 0.f;
            }
    }
}

/* V = B^T d B for the tiles of one packed panel (NR consecutive tiles, possibly over several tile
 * rows) and channel block; each panel row is computed whole, then stored as one 64-byte row. */
static void input_task4(void *ctx, int64_t k0, int64_t k1) {
    const wg4_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t TW = tiles_w4(s), T = tiles_h4(s) * TW, vstride = cuvil_packed_b_size(s->C, T);
    int64_t cblocks = (s->C + WG4_CBLOCK - 1) / WG4_CBLOCK;
    float dp[6][4][WG4_WIN], tr[6][4][WG4_WIN];
    float held[CUVIL_WINOGRAD_HELD][36][CUVIL_NR] __attribute__((aligned(64)));
    for (int64_t k = k0; k < k1; k++) {
        int64_t p = k / cblocks, c0 = k % cblocks * WG4_CBLOCK, c1 = c0 + WG4_CBLOCK < s->C ? c0 + WG4_CBLOCK : s->C;
        int64_t t0 = p * CUVIL_NR, t1 = t0 + CUVIL_NR < T ? t0 + CUVIL_NR : T;
        memset(held, 0, sizeof held);          /* lanes past T: computed by the GEMM and dropped */
        for (int64_t c = c0; c < c1; c++) {
            int64_t j = (c - c0) % CUVIL_WINOGRAD_HELD;
            float (*vals)[CUVIL_NR] = held[j];
            const float *xc = a->x + c * s->H * s->W;
            for (int64_t t = t0; t < t1;) {    /* the panel's tiles, one run per tile row */
                int64_t th = t / TW, tw0 = t % TW, n = TW - tw0 < t1 - t ? TW - tw0 : t1 - t, lane = t - t0;
                for (int i = 0; i < 6; i++) row_phases(s, xc, 4 * th - s->ph + i, 4 * tw0 - s->pw, n + 1, dp[i]);
                for (int r = 0; r < 4; r++)    /* B^T down each column */
                    for (int64_t u = 0; u < n + 1; u++)
                        WG4_BT(tr[0][r][u], tr[1][r][u], tr[2][r][u], tr[3][r][u], tr[4][r][u], tr[5][r][u],
                               dp[0][r][u], dp[1][r][u], dp[2][r][u], dp[3][r][u], dp[4][r][u], dp[5][r][u]);
                for (int i = 0; i < 6; i++)    /* then along each row: tile u spans columns 4u .. 4u + 5 */
                    for (int64_t u = 0; u < n; u++)
                        WG4_BT(vals[6 * i + 0][lane + u], vals[6 * i + 1][lane + u], vals[6 * i + 2][lane + u],
                               vals[6 * i + 3][lane + u], vals[6 * i + 4][lane + u], vals[6 * i + 5][lane + u],
                               tr[i][0][u], tr[i][1][u], tr[i][2][u], tr[i][3][u], tr[i][0][u + 1], tr[i][1][u + 1]);
                t += n;
            }
            if (j == CUVIL_WINOGRAD_HELD - 1 || c == c1 - 1)
                cuvil_winograd_store_held(a->v, vstride, 36, p * s->C + c - j, j + 1, &held[0][0][0]);
        }
    }
}

/* The 36 products, one GEMM per task on one thread: 36 tasks split evenly over 2 threads, where a
 * parallel region per GEMM paid its synchronization 36 times on small GEMMs. */
static void product_task4(void *ctx, int64_t x0, int64_t x1) {
    const wg4_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t T = tiles_h4(s) * tiles_w4(s), vstride = cuvil_packed_b_size(s->C, T);
    int64_t astride = cuvil_packed_a_size(s->O, s->C);
    for (int64_t xi = x0; xi < x1; xi++)
        cuvil_sgemm_packed_ab(s->O, T, s->C, a->up + xi * astride, a->v + xi * vstride, a->m + xi * s->O * T, T, 0, 1);
}

/* Y = A^T M A per tile for output channels [o0, o1), then bias, residual and activation, each step
 * over a whole row of tiles. */
static void output_task4(void *ctx, int64_t o0, int64_t o1) {
    const wg4_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t TW = tiles_w4(s), T = tiles_h4(s) * TW, plane = s->O * T;
    float sa[4][6][CUVIL_WINOGRAD_MAX_W / 4 + 2];
    float rows[4][CUVIL_WINOGRAD_MAX_W + 4] __attribute__((aligned(64)));
    for (int64_t o = o0; o < o1; o++) {
        const float *m = a->m + o * T;
        float *yo = a->y + o * s->OH * s->OW;
        const float *ro = a->residual ? a->residual + o * s->OH * s->OW : 0;
        const cuvil_vf bv = cuvil_vsplat(a->bias ? a->bias[o] : 0.f);
        for (int64_t th = 0; th < tiles_h4(s); th++) {
            const float *mt = m + th * TW;
            for (int l = 0; l < 6; l++) {          /* A^T M, column l of each tile's M */
                const float *m0 = mt + l * plane, *m1 = mt + (6 + l) * plane, *m2 = mt + (12 + l) * plane;
                const float *m3 = mt + (18 + l) * plane, *m4 = mt + (24 + l) * plane, *m5 = mt + (30 + l) * plane;
                for (int64_t u = 0; u < TW; u++) {
                    float p12 = m1[u] + m2[u], d12 = m1[u] - m2[u], p34 = m3[u] + m4[u], d34 = m3[u] - m4[u];
                    sa[0][l][u] = m0[u] + p12 + p34;
                    sa[1][l][u] = d12 + 2 * d34;
                    sa[2][l][u] = p12 + 4 * p34;
                    sa[3][l][u] = d12 + 8 * d34 + m5[u];
                }
            }
            for (int r = 0; r < 4; r++)                /* then (A^T M) A, the 4 columns of each tile interleaved */
                for (int64_t u = 0; u < TW; u++) {
                    const float *q0 = sa[r][0], *q1 = sa[r][1], *q2 = sa[r][2], *q3 = sa[r][3], *q4 = sa[r][4];
                    float p12 = q1[u] + q2[u], d12 = q1[u] - q2[u], p34 = q3[u] + q4[u], d34 = q3[u] - q4[u];
                    rows[r][4 * u + 0] = q0[u] + p12 + p34;
                    rows[r][4 * u + 1] = d12 + 2 * d34;
                    rows[r][4 * u + 2] = p12 + 4 * p34;
                    rows[r][4 * u + 3] = d12 + 8 * d34 + sa[r][5][u];
                }
            for (int r = 0; r < 4 && 4 * th + r < s->OH; r++) {
                int64_t off = (4 * th + r) * s->OW, ow = 0;
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

void cuvil_conv3x3_winograd4(const cuvil_conv_shape *s, const float *x, const float *up, const float *bias,
                             const float *residual, float *y, int act, float *scratch, int nthreads) {
    int64_t T = tiles_h4(s) * tiles_w4(s), vstride = cuvil_packed_b_size(s->C, T);
    int64_t in = s->C * s->H * s->W, out = s->O * s->OH * s->OW;
    int64_t np = (T + CUVIL_NR - 1) / CUVIL_NR, cblocks = (s->C + WG4_CBLOCK - 1) / WG4_CBLOCK;
    for (int64_t n = 0; n < s->N; n++) {
        wg4_args a = {s, x + n * in, up, bias, residual ? residual + n * out : 0, scratch, scratch + 36 * vstride,
                      y + n * out, act};
        cuvil_parallel_for(nthreads, np * cblocks, 1, input_task4, &a);
        cuvil_parallel_chunks(nthreads, 36, 1, product_task4, &a);
        cuvil_parallel_for(nthreads, s->O, 1, output_task4, &a);
    }
}
