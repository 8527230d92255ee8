#include "bf16dot.h"
#include "amx.h"
#include "pool.h"

#define DOT_MR 6         /* 6 rows x 4 vectors: 24 accumulators, each A broadcast feeds 4 dot products */
#define DOT_ROW_TILES 8  /* a task's rows: 48, so a panel's B (<= 256 KB at K 2048) serves 8 tiles from L2 */
/* row blocks a thread needs before tasks go by row block (row_block_task): enough to balance the threads */
#define CUVIL_BF16_ROW_TASKS_PER_THREAD 4

typedef struct {
    int64_t M, N, K, K2, np, nrb, R;   /* R: a task's rows (dot_row_block) */
    const float *A;
    int64_t lda;
    uint32_t *Ab;
    const uint32_t *B;
    cuvil_dot_out out;
    int out_of_memory;
} dot_args;

static void round_task(void *ctx, int64_t m0, int64_t m1) {
    const dot_args *g = ctx;
    for (int64_t m = m0; m < m1; m++) cuvil_bf16_round(g->A + m * g->lda, g->K, g->Ab + m * g->K2);
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
/* The same sums in portable C: each pair's products (exact in fp32) added odd first, as the
 * instruction adds them. */
static inline void dot_tile(int mr, const uint32_t *a, int64_t K2, const uint32_t *b, float *out) {
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < CUVIL_BF16_NR; j++) out[r * CUVIL_BF16_NR + j] = 0.f;
    for (int64_t k = 0; k < K2; k++, b += CUVIL_BF16_NR)
        for (int r = 0; r < mr; r++) {
            float lo = cv_bfloat16_to_f32((uint16_t)a[r * K2 + k]), hi = cv_bfloat16_to_f32((uint16_t)(a[r * K2 + k] >> 16));
            float *o = out + r * CUVIL_BF16_NR;
            for (int j = 0; j < CUVIL_BF16_NR; j++) {
                float s = o[j] + hi * cv_bfloat16_to_f32((uint16_t)(b[j] >> 16));
                o[j] = s + lo * cv_bfloat16_to_f32((uint16_t)b[j]);
            }
        }
}
#endif

#if defined(CUVIL_HAVE_AMX) && defined(__AMX_BF16__)
/* amx.h's K tail, by vdpbf16ps */
static void dot_tail_add(int mr, const uint32_t *a, int64_t lda, int64_t kt, const uint32_t *b, void *sums) {
    for (int r = 0; r < mr; r++) {
        float *o = (float *)sums + r * CUVIL_BF16_NR;
        __m512 x0 = _mm512_load_ps(o), x1 = _mm512_load_ps(o + 16), x2 = _mm512_load_ps(o + 32), x3 = _mm512_load_ps(o + 48);
        for (int64_t k = 0; k < kt; k++) {
            const uint32_t *bk = b + k * CUVIL_BF16_NR;
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r * lda + k]);
            x0 = _mm512_dpbf16_ps(x0, av, (__m512bh)_mm512_loadu_si512(bk));
            x1 = _mm512_dpbf16_ps(x1, av, (__m512bh)_mm512_loadu_si512(bk + 16));
            x2 = _mm512_dpbf16_ps(x2, av, (__m512bh)_mm512_loadu_si512(bk + 32));
            x3 = _mm512_dpbf16_ps(x3, av, (__m512bh)_mm512_loadu_si512(bk + 48));
        }
        _mm512_store_ps(o, x0), _mm512_store_ps(o + 16, x1), _mm512_store_ps(o + 32, x2), _mm512_store_ps(o + 48, x3);
    }
}
#endif

void cuvil_bf16_rows(const uint32_t *Ab, int64_t rows, int64_t K2, const uint32_t *Bp, int64_t N, int64_t p0,
                     int64_t p1, const cuvil_dot_out *o) {
#if defined(CUVIL_HAVE_AMX) && defined(__AMX_BF16__)
    /* by depth alone, so that every split of the rows sums a row alike */
    if (K2 >= CUVIL_AMX_K2 && cuvil_amx_ready()) {
        /* amx.h's blocks of 32 rows (TDPBF16PS: 16 x 16 x 32 products an instruction, ~7x vdpbf16ps's rate
         * on one core); the sums of each pair of products round otherwise than vdpbf16ps's (within fp32's
         * rounding of the sum), the same for any split of the rows */
        cuvil_amx_rows(CUVIL_AMX_BF16, Ab, rows, K2, Bp, N, p0, p1, o, dot_tail_add);
        return;
    }
#endif
    float out[DOT_MR * CUVIL_BF16_NR] __attribute__((aligned(64)));
    for (int64_t p = p0; p < p1; p++) {
        int64_t n0 = p * CUVIL_BF16_NR, nc = N - n0 < CUVIL_BF16_NR ? N - n0 : CUVIL_BF16_NR;
        const uint32_t *b = Bp + p * K2 * CUVIL_BF16_NR;
        for (int64_t m0 = 0; m0 < rows; m0 += DOT_MR) {
            int mr = rows - m0 < DOT_MR ? (int)(rows - m0) : DOT_MR;
            const uint32_t *a = Ab + m0 * K2;
            switch (mr) {      /* each row count its own unrolled tile */
            case 6: dot_tile(6, a, K2, b, out); break;
            case 5: dot_tile(5, a, K2, b, out); break;
            case 4: dot_tile(4, a, K2, b, out); break;
            case 3: dot_tile(3, a, K2, b, out); break;
            case 2: dot_tile(2, a, K2, b, out); break;
            default: dot_tile(1, a, K2, b, out); break;
            }
            cuvil_dot_store(o, out, m0, mr, n0, nc);
        }
    }
}

/* A task's rows: 48 (8 register tiles of 6), or on AMX tiles 64 (two blocks of 32: 48 left one of 16) */
static int64_t dot_row_block(int64_t K2) {
#if defined(CUVIL_HAVE_AMX) && defined(__AMX_BF16__)
    if (K2 >= CUVIL_AMX_K2 && cuvil_amx_ready()) return 64;
#endif
    (void)K2;
    return DOT_ROW_TILES * DOT_MR;
}

/* Tasks t (few rows): panel t / nrb over row block t % nrb, so a thread's run keeps one panel of B in
 * cache across the row blocks; A rounded beforehand, by all threads. */
static void dot_task(void *ctx, int64_t t0, int64_t t1) {
    const dot_args *g = ctx;
    for (int64_t t = t0; t < t1; t++) {
        int64_t p = t / g->nrb, m0 = t % g->nrb * g->R;
        int64_t rows = g->M - m0 < g->R ? g->M - m0 : g->R;
        cuvil_dot_out o = g->out;
        o.C += m0 * o.ldm;
        if (o.residual) o.residual += m0 * o.res_ldm;
        if (o.bias_row) o.bias_row += m0;
        cuvil_bf16_rows(g->Ab + m0 * g->K2, rows, g->K2, g->B, g->N, p, p + 1, &o);
    }
}

/* Tasks t (many rows): row block t, rounded into the thread's own buffer and multiplied by every panel
 * while it is in cache. Rounding A in a pass of its own wrote it out (MiniLM b32: 3 MB a layer) and each
 * panel's tasks read it back from L3. */
static void row_block_task(void *ctx, int64_t t0, int64_t t1) {
    dot_args *g = ctx;
    const int64_t R = g->R;
    uint32_t *ab = cuvil_thread_buffer(CUVIL_BUF_DOT_ROWS, (size_t)(R * g->K2) * sizeof(uint32_t));
    if (!ab) {
        g->out_of_memory = 1;
        return;
    }
    for (int64_t t = t0; t < t1; t++) {
        int64_t m0 = t * R, rows = g->M - m0 < R ? g->M - m0 : R;
        for (int64_t m = 0; m < rows; m++) cuvil_bf16_round(g->A + (m0 + m) * g->lda, g->K, ab + m * g->K2);
        cuvil_dot_out o = g->out;
        o.C += m0 * o.ldm;
        if (o.residual) o.residual += m0 * o.res_ldm;
        if (o.bias_row) o.bias_row += m0;
        cuvil_bf16_rows(ab, rows, g->K2, g->B, g->N, 0, g->np, &o);
    }
}

int cuvil_sgemm_bf16dot(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const uint32_t *Bp,
                        float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads) {
    if (M <= 0 || N <= 0) return 0;
    int64_t K2 = (K + 1) / 2, R = dot_row_block(K2), nrb = (M + R - 1) / R;
    cuvil_dot_out o = {C, ep ? ep->bias_row : 0, ep ? ep->bias_col : 0, ep ? ep->residual : 0, 0, INT64_MAX / 2, 0, ldc,
                        ep ? ep->ldr : 0, ep ? ep->alpha : 1.f, ep ? ep->act : CUVIL_ACT_NONE};
    dot_args g = {M, N, K, K2, (N + CUVIL_BF16_NR - 1) / CUVIL_BF16_NR, nrb, R, A, lda, 0, Bp, o, 0};
    if (nrb >= CUVIL_BF16_ROW_TASKS_PER_THREAD * nthreads) {
        cuvil_parallel_for(nthreads, nrb, 1, row_block_task, &g);
        return g.out_of_memory ? -1 : 0;
    }
    uint32_t *Ab = cuvil_thread_buffer(CUVIL_BUF_APACK, (size_t)(M * K2) * sizeof(uint32_t) + 64);
    if (!Ab) return -1;
    g.Ab = Ab;
    cuvil_parallel_for(M * K > 16384 ? nthreads : 1, M, 1, round_task, &g);
    cuvil_parallel_for(M * N * K > 65536 ? nthreads : 1, g.np * g.nrb, 1, dot_task, &g);
    return 0;
}
