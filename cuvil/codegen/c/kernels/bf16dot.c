#include "bf16dot.h"
#include "pool.h"
#include "vmath.h"
#include <stdlib.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#define DOT_MR 6         /* 6 rows x 4 vectors: 24 accumulators, each A broadcast feeds 4 dot products */
#define DOT_ROW_TILES 8  /* a task's rows: 48, so a panel's B (<= 256 KB at K 2048) serves 8 tiles from L2 */

/* fp32 -> bf16, rounding to nearest even, NaN kept (quieted), as vcvtneps2bf16 does for normal
 * numbers; branch-free so the conversion loop vectorizes. */
static inline uint32_t bf16_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    return (b & 0x7fffffffu) > 0x7f800000u ? (b >> 16) | 0x40u : rounded;
}

/* Row m of A as K2 words of bf16 pairs (element 2k low, 2k + 1 high; 0 past K). */
static void round_row(const float *a, int64_t K, uint32_t *out) {
    int64_t k2 = 0;
    for (; 2 * k2 + 1 < K; k2++) out[k2] = bf16_bits(a[2 * k2]) | bf16_bits(a[2 * k2 + 1]) << 16;
    if (K & 1) out[k2] = bf16_bits(a[K - 1]);
}

typedef struct {
    int64_t M, N, K, K2, np, nrb;
    const float *A;
    int64_t lda;
    uint32_t *Ab;
    const uint32_t *B;
    float *C;
    int64_t ldc;
    const cuvil_epilogue *ep;
} dot_args;

static void round_task(void *ctx, int64_t m0, int64_t m1) {
    const dot_args *g = ctx;
    for (int64_t m = m0; m < m1; m++) round_row(g->A + m * g->lda, g->K, g->Ab + m * g->K2);
}

#if defined(__AVX512BF16__)
#define DOT_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define DOT_ZERO(r) __m512 x##r##0 = _mm512_setzero_ps(), x##r##1 = x##r##0, x##r##2 = x##r##0, x##r##3 = x##r##0;
#define DOT_STEP(r)                                                                                       \
    if (r < mr) {                                                                                         \
        __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r * K2 + k]);                                   \
        x##r##0 = _mm512_dpbf16_ps(x##r##0, av, b0), x##r##1 = _mm512_dpbf16_ps(x##r##1, av, b1);         \
        x##r##2 = _mm512_dpbf16_ps(x##r##2, av, b2), x##r##3 = _mm512_dpbf16_ps(x##r##3, av, b3);         \
    }
#define DOT_OUT(r)                                                                                        \
    if (r < mr) {                                                                                         \
        _mm512_store_ps(out + r * CUVIL_BF16_NR, x##r##0), _mm512_store_ps(out + r * CUVIL_BF16_NR + 16, x##r##1); \
        _mm512_store_ps(out + r * CUVIL_BF16_NR + 32, x##r##2), _mm512_store_ps(out + r * CUVIL_BF16_NR + 48, x##r##3); \
    }

/* out[r][j] = the sums of mr rows of A (bf16 pairs, K2 apart) times one panel, by vdpbf16ps. */
static inline __attribute__((always_inline)) void dot_tile(int mr, const uint32_t *a, int64_t K2, const uint32_t *b,
                                                           float *out) {
    DOT_ROWS(DOT_ZERO)
    for (int64_t k = 0; k < K2; k++, b += CUVIL_BF16_NR) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
        __m512bh b2 = (__m512bh)_mm512_loadu_si512(b + 32), b3 = (__m512bh)_mm512_loadu_si512(b + 48);
        DOT_ROWS(DOT_STEP)
    }
    DOT_ROWS(DOT_OUT)
}
#else
static inline float bf16_float(uint32_t h) {
    uint32_t b = h << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* The same sums in portable C: each pair's products (exact in fp32) added odd first, as the
 * instruction adds them. */
static inline void dot_tile(int mr, const uint32_t *a, int64_t K2, const uint32_t *b, float *out) {
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < CUVIL_BF16_NR; j++) out[r * CUVIL_BF16_NR + j] = 0.f;
    for (int64_t k = 0; k < K2; k++, b += CUVIL_BF16_NR)
        for (int r = 0; r < mr; r++) {
            float lo = bf16_float(a[r * K2 + k] & 0xffffu), hi = bf16_float(a[r * K2 + k] >> 16);
            float *o = out + r * CUVIL_BF16_NR;
            for (int j = 0; j < CUVIL_BF16_NR; j++) {
                float s = o[j] + hi * bf16_float(b[j] >> 16);
                o[j] = s + lo * bf16_float(b[j] & 0xffffu);
            }
        }
}
#endif

/* A tile's sums into C: act(alpha * sum + bias_row[m] + bias_col[n] + residual[m, n]) for rows
 * [m0, m0 + mr) and columns [n0, n0 + nc). */
static void store_tile(const dot_args *g, const float *out, int64_t m0, int mr, int64_t n0, int64_t nc) {
    const cuvil_epilogue *ep = g->ep;
    float alpha = ep ? ep->alpha : 1.f;
    int act = ep ? ep->act : CUVIL_ACT_NONE;
    for (int r = 0; r < mr; r++) {
        int64_t m = m0 + r;
        float *c = g->C + m * g->ldc + n0;
        const float *o = out + r * CUVIL_BF16_NR;
        const float *bc = ep && ep->bias_col ? ep->bias_col + n0 : 0;
        const float *res = ep && ep->residual ? ep->residual + m * ep->ldr + n0 : 0;
        float br = ep && ep->bias_row ? ep->bias_row[m] : 0.f;
        int64_t j = 0;
        for (; j + CUVIL_VL <= nc; j += CUVIL_VL) {
            cuvil_vf v = cuvil_vload(o + j) * cuvil_vsplat(alpha) + cuvil_vsplat(br);
            if (bc) v += cuvil_vload(bc + j);
            if (res) v += cuvil_vload(res + j);
            if (act == CUVIL_ACT_RELU) v = cuvil_vsel(v < 0.f, cuvil_vsplat(0.f), v);
            cuvil_vstore(c + j, v);
        }
        for (; j < nc; j++) {
            float v = o[j] * alpha + br + (bc ? bc[j] : 0.f) + (res ? res[j] : 0.f);
            c[j] = act == CUVIL_ACT_RELU ? cuvil_act(v, act) : v;
        }
    }
    if (act != CUVIL_ACT_NONE && act != CUVIL_ACT_RELU) cuvil_activate_block(g->C, g->ldc, m0, m0 + mr, n0, n0 + nc, act);
}

/* Tasks t: panel t / nrb over row block t % nrb, so a thread's run keeps one panel of B in cache
 * across the row blocks. */
static void dot_task(void *ctx, int64_t t0, int64_t t1) {
    const dot_args *g = ctx;
    float out[DOT_MR * CUVIL_BF16_NR] __attribute__((aligned(64)));
    for (int64_t t = t0; t < t1; t++) {
        int64_t p = t / g->nrb, rb = t % g->nrb;
        int64_t n0 = p * CUVIL_BF16_NR, nc = g->N - n0 < CUVIL_BF16_NR ? g->N - n0 : CUVIL_BF16_NR;
        int64_t m1 = (rb + 1) * DOT_ROW_TILES * DOT_MR;
        if (m1 > g->M) m1 = g->M;
        const uint32_t *b = g->B + p * g->K2 * CUVIL_BF16_NR;
        for (int64_t m0 = rb * DOT_ROW_TILES * DOT_MR; m0 < m1; m0 += DOT_MR) {
            int mr = m1 - m0 < DOT_MR ? (int)(m1 - m0) : DOT_MR;
            const uint32_t *a = g->Ab + m0 * g->K2;
            switch (mr) {      /* each row count its own unrolled tile */
            case 6: dot_tile(6, a, g->K2, b, out); break;
            case 5: dot_tile(5, a, g->K2, b, out); break;
            case 4: dot_tile(4, a, g->K2, b, out); break;
            case 3: dot_tile(3, a, g->K2, b, out); break;
            case 2: dot_tile(2, a, g->K2, b, out); break;
            default: dot_tile(1, a, g->K2, b, out); break;
            }
            store_tile(g, out, m0, mr, n0, nc);
        }
    }
}

int cuvil_sgemm_bf16dot(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const uint32_t *Bp,
                        float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads) {
    if (M <= 0 || N <= 0) return 0;
    int64_t K2 = (K + 1) / 2;
    uint32_t *Ab = cuvil_thread_buffer(CUVIL_BUF_APACK, (size_t)(M * K2) * sizeof(uint32_t) + 64);
    if (!Ab) return -1;
    dot_args g = {M, N, K, K2, (N + CUVIL_BF16_NR - 1) / CUVIL_BF16_NR,
                  (M + DOT_ROW_TILES * DOT_MR - 1) / (DOT_ROW_TILES * DOT_MR), A, lda, Ab, Bp, C, ldc, ep};
    cuvil_parallel_for(M * K > 16384 ? nthreads : 1, M, 1, round_task, &g);
    cuvil_parallel_for(M * N * K > 65536 ? nthreads : 1, g.np * g.nrb, 1, dot_task, &g);
    return 0;
}
