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
        /* the windows inside the row without bounds, the one or two at its ends with them: a run of
         * tiles over a whole tile row meets both ends, and bounds per element had been a third of
         * the transform's time (64 channels at 56x56) */
        int64_t ulo = col0 < 0 ? (-col0 + 3) / 4 : 0, uhi = s->W - col0 >= 0 ? (s->W - col0) / 4 : 0;
        ulo = ulo < nwin ? ulo : nwin;
        uhi = uhi < ulo ? ulo : uhi > nwin ? nwin : uhi;
        for (int64_t u = ulo; u < uhi; u++)
            for (int r = 0; r < 4; r++) dp[r][u] = row[col0 + 4 * u + r];
        for (int end = 0; end < 2; end++)
            for (int64_t u = end ? uhi : 0; u < (end ? nwin : ulo); u++)
                for (int r = 0; r < 4; r++) {
                    int64_t col = col0 + 4 * u + r;
                    dp[r][u] = col >= 0 && col < s->W ? row[col] : 0.f;
                }
    }
}

/* V = B^T d B for lanes [0, NR) of one panel row: d[6 i + j][lane] holds element (i, j) of the patch
 * of the lane's tile; vals[6 i + j][lane] gets V's. In vectors across the lanes (tiles). */
static inline void panel_bt(float d[36][CUVIL_NR], float (*vals)[CUVIL_NR]) {
    for (int v0 = 0; v0 < CUVIL_NR; v0 += CUVIL_VL) {
        cuvil_vf t[6][6];
        for (int j = 0; j < 6; j++)                     /* B^T down each column */
            WG4_BT(t[0][j], t[1][j], t[2][j], t[3][j], t[4][j], t[5][j], cuvil_vload(d[j] + v0),
                   cuvil_vload(d[6 + j] + v0), cuvil_vload(d[12 + j] + v0), cuvil_vload(d[18 + j] + v0),
                   cuvil_vload(d[24 + j] + v0), cuvil_vload(d[30 + j] + v0));
        for (int i = 0; i < 6; i++) {                   /* then along each row */
            cuvil_vf y0, y1, y2, y3, y4, y5;
            WG4_BT(y0, y1, y2, y3, y4, y5, t[i][0], t[i][1], t[i][2], t[i][3], t[i][4], t[i][5]);
            cuvil_vstore(vals[6 * i] + v0, y0);
            cuvil_vstore(vals[6 * i + 1] + v0, y1);
            cuvil_vstore(vals[6 * i + 2] + v0, y2);
            cuvil_vstore(vals[6 * i + 3] + v0, y3);
            cuvil_vstore(vals[6 * i + 4] + v0, y4);
            cuvil_vstore(vals[6 * i + 5] + v0, y5);
        }
    }
}

/* V = B^T d B for the tiles of one packed panel (NR consecutive tiles, possibly over several tile
 * rows) and channel block: each channel's 6x6 patches gathered lane by lane (tile by tile) from the
 * rows' column phases, then transformed in vectors across the panel's tiles and held until stored
 * as whole 64-byte rows. Transformed run by run along the phases instead, its loops had run over a
 * tile row's 4, 7 or 14 tiles in scalars. */
static void input_task4(void *ctx, int64_t k0, int64_t k1) {
    const wg4_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t TW = tiles_w4(s), T = tiles_h4(s) * TW, vstride = cuvil_packed_b_size(s->C, T);
    int64_t cblocks = (s->C + WG4_CBLOCK - 1) / WG4_CBLOCK;
    float dp[4][WG4_WIN];
    float d[36][CUVIL_NR] __attribute__((aligned(64)));
    float held[CUVIL_WINOGRAD_HELD][36][CUVIL_NR] __attribute__((aligned(64)));
    for (int64_t k = k0; k < k1; k++) {
        int64_t p = k / cblocks, c0 = k % cblocks * WG4_CBLOCK, c1 = c0 + WG4_CBLOCK < s->C ? c0 + WG4_CBLOCK : s->C;
        int64_t t0 = p * CUVIL_NR, t1 = t0 + CUVIL_NR < T ? t0 + CUVIL_NR : T;
        memset(d, 0, sizeof d);                /* lanes past T: computed by the GEMM and dropped */
        for (int64_t c = c0; c < c1; c++) {
            int64_t j = (c - c0) % CUVIL_WINOGRAD_HELD;
            const float *xc = a->x + c * s->H * s->W;
            for (int64_t t = t0; t < t1;) {    /* the panel's tiles, one run per tile row */
                int64_t th = t / TW, tw0 = t % TW, n = TW - tw0 < t1 - t ? TW - tw0 : t1 - t, lane = t - t0;
                for (int i = 0; i < 6; i++) {
                    row_phases(s, xc, 4 * th - s->ph + i, 4 * tw0 - s->pw, n + 1, dp);
                    float *di = d[6 * i] + lane;   /* column jj of tile u: phase jj % 4 of window u + jj / 4 */
                    for (int64_t u = 0; u < n; u++) {
                        di[u] = dp[0][u], di[CUVIL_NR + u] = dp[1][u], di[2 * CUVIL_NR + u] = dp[2][u];
                        di[3 * CUVIL_NR + u] = dp[3][u], di[4 * CUVIL_NR + u] = dp[0][u + 1];
                        di[5 * CUVIL_NR + u] = dp[1][u + 1];
                    }
                }
                t += n;
            }
            panel_bt(d, held[j]);
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


/* Tiles per chunk of the output transform: whole tile rows, at least this many tiles when a row
 * holds fewer, so that the transform's vectors run across tile rows (14x14 maps have 4 tiles to a
 * row, 28x28 7) */
#define WG4_OUT_TILES 64
#define WG4_OUT_MAX (((CUVIL_WINOGRAD_MAX_W / 4 + 2 > WG4_OUT_TILES ? CUVIL_WINOGRAD_MAX_W / 4 + 2 : WG4_OUT_TILES) \
                      + CUVIL_VL - 1) / CUVIL_VL * CUVIL_VL)

/* Y = A^T M A for tiles [t0, t0 + VL) of one output channel, from its 36 products m[xi * plane + t]
 * into y[r * 4 + c][t - base] (output row r, column c of each tile): vectors across the tiles, the
 * 6 x 6 -> 4 x 6 -> 4 x 4 combinations in registers. */
static inline void tiles_out4(const float *m, int64_t plane, int64_t t0, float (*y)[WG4_OUT_MAX], int64_t base) {
    cuvil_vf sa[4][6];
    for (int l = 0; l < 6; l++) {                   /* A^T M: column l of each tile's M */
        const float *ml = m + l * plane + t0;
        WG4_AT(sa[0][l], sa[1][l], sa[2][l], sa[3][l], cuvil_vload(ml), cuvil_vload(ml + 6 * plane),
               cuvil_vload(ml + 12 * plane), cuvil_vload(ml + 18 * plane), cuvil_vload(ml + 24 * plane),
               cuvil_vload(ml + 30 * plane));
    }
    for (int r = 0; r < 4; r++) {                   /* then (A^T M) A */
        cuvil_vf y0, y1, y2, y3;
        WG4_AT(y0, y1, y2, y3, sa[r][0], sa[r][1], sa[r][2], sa[r][3], sa[r][4], sa[r][5]);
        cuvil_vstore(y[r * 4 + 0] + t0 - base, y0);
        cuvil_vstore(y[r * 4 + 1] + t0 - base, y1);
        cuvil_vstore(y[r * 4 + 2] + t0 - base, y2);
        cuvil_vstore(y[r * 4 + 3] + t0 - base, y3);
    }
}

/* Y = A^T M A for output channels [o0, o1), a chunk of tile rows at a time: the transform in vectors
 * across the chunk's tiles, then each output row gathered from them and finished (bias, residual,
 * activation) in vectors. Row by row, its loops ran over a tile row's 4 or 7 tiles, in scalars. */
static void output_task4(void *ctx, int64_t o0, int64_t o1) {
    const wg4_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t TW = tiles_w4(s), TH = tiles_h4(s), T = TH * TW, plane = s->O * T;
    int64_t rows_per_chunk = TW >= WG4_OUT_TILES ? 1 : WG4_OUT_TILES / TW;
    float y[16][WG4_OUT_MAX] __attribute__((aligned(64)));
    float tail[36][CUVIL_VL] __attribute__((aligned(64)));
    float row[CUVIL_WINOGRAD_MAX_W + 4] __attribute__((aligned(64)));
    for (int64_t o = o0; o < o1; o++) {
        const float *m = a->m + o * T;
        float *yo = a->y + o * s->OH * s->OW;
        const float *ro = a->residual ? a->residual + o * s->OH * s->OW : 0;
        const float b = a->bias ? a->bias[o] : 0.f;
        const cuvil_vf bv = cuvil_vsplat(b);
        for (int64_t th0 = 0; th0 < TH; th0 += rows_per_chunk) {
            int64_t th1 = th0 + rows_per_chunk < TH ? th0 + rows_per_chunk : TH, t0 = th0 * TW, t1 = th1 * TW, t = t0;
            for (; t + CUVIL_VL <= t1; t += CUVIL_VL) tiles_out4(m, plane, t, y, t0);
            if (t < t1) {                  /* the last tiles through a padded copy: M ends at T */
                for (int xi = 0; xi < 36; xi++)
                    for (int64_t u = 0; u < CUVIL_VL; u++) tail[xi][u] = t + u < t1 ? m[xi * plane + t + u] : 0.f;
                tiles_out4(&tail[0][0], CUVIL_VL, 0, y, t0 - t);
            }
            for (int64_t th = th0; th < th1; th++)
                for (int r = 0; r < 4 && 4 * th + r < s->OH; r++) {
                    const float *y0 = y[r * 4] + (th - th0) * TW, *y1 = y[r * 4 + 1] + (th - th0) * TW;
                    const float *y2 = y[r * 4 + 2] + (th - th0) * TW, *y3 = y[r * 4 + 3] + (th - th0) * TW;
                    for (int64_t u = 0; u < TW; u++)
                        row[4 * u] = y0[u], row[4 * u + 1] = y1[u], row[4 * u + 2] = y2[u], row[4 * u + 3] = y3[u];
                    int64_t off = (4 * th + r) * s->OW, ow = 0;
                    for (; ow + CUVIL_VL <= s->OW; ow += CUVIL_VL) {
                        cuvil_vf v = cuvil_vload(row + ow) + bv;
                        if (ro) v += cuvil_vload(ro + off + ow);
                        cuvil_vstore(yo + off + ow, cuvil_vact(v, a->act));
                    }
                    for (; ow < s->OW; ow++) yo[off + ow] = cuvil_act(row[ow] + b + (ro ? ro[off + ow] : 0.f), a->act);
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
