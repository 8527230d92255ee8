/* Linear layers on a quantized model's activation grid (int8dot.h: cuvil_matmul_int8): each task maps
 * its rows of A onto bytes over the fixed range (dot_out.h: cuvil_byte_scale, as the int8 convs map
 * their input) and runs cuvil_i8_rows over its share of the weight panels into row-major C. */
#include "int8dot.h"
#include "pool.h"

typedef struct {
    int64_t M, N, K, lda, K4, mc, ng, np;
    const float *A;
    const uint32_t *Bp;
    float inv, zero;
    int out_of_memory;
    cuvil_dot_out o;
} int8_matmul;

/* K floats at x -> `row` bytes at q over the map (inv, zero), past K the zero point (the weights' padding
 * rows are zero). */
static void row_bytes(const float *x, int64_t K, int64_t row, float inv, float zero, uint8_t *q) {
    const float top = (float)CUVIL_I8_LEVELS;
    int64_t k = 0;
    for (; k + CUVIL_VL <= K; k += CUVIL_VL) cuvil_to_bytes(cuvil_vload(x + k), inv, zero, top, q + k);
    for (; k < K; k++) q[k] = cuvil_to_byte(x[k], inv, zero, top);
    memset(q + K, (int)zero, (size_t)(row - K));
}

/* Tasks t: row block t / ng (mc rows), panel share t % ng of np. */
static void int8_matmul_task(void *ctx, int64_t t0, int64_t t1) {
    int8_matmul *a = ctx;
    int64_t row = 4 * a->K4;
    uint8_t *q = cuvil_thread_buffer(CUVIL_BUF_DOT_ROWS, (size_t)(a->mc * row));
    if (!q) {
        a->out_of_memory = 1;
        return;
    }
    for (int64_t t = t0; t < t1; t++) {
        int64_t m0 = t / a->ng * a->mc, rows = a->M - m0 < a->mc ? a->M - m0 : a->mc, g = t % a->ng;
        for (int64_t m = 0; m < rows; m++) row_bytes(a->A + (m0 + m) * a->lda, a->K, row, a->inv, a->zero, q + m * row);
        cuvil_dot_out o = a->o;
        o.C += m0 * o.ldm;
        if (o.residual) o.residual += m0 * o.res_ldm;
        cuvil_i8_rows((const uint32_t *)q, rows, a->K4, a->Bp, a->N, g * a->np / a->ng, (g + 1) * a->np / a->ng, &o);
    }
}

/* ---- each row on its own range (range 0: precision="int8" without a model's grid, on AMX tiles) ---- */
typedef struct {
    int64_t M, N, K, lda, K4, mc, ng, np;
    const float *A, *wterms;
    const uint32_t *Bp;
    int out_of_memory;
    cuvil_dot_out o;              /* the final store: bias, residual, activation into C */
} int8_rows_matmul;

/* A row's [min, max] with 0 in it, a vector at a time (NaN passes no test, so it widens nothing). */
static void row_range(const float *x, int64_t K, float *lo, float *hi) {
    cuvil_vf vlo = cuvil_vsplat(0.f), vhi = vlo;
    int64_t k = 0;
    for (; k + CUVIL_VL <= K; k += CUVIL_VL) {
        cuvil_vf v = cuvil_vload(x + k);
        vlo = cuvil_vsel(v < vlo, v, vlo), vhi = cuvil_vsel(v > vhi, v, vhi);
    }
    float l = 0.f, h = 0.f;
    for (int i = 0; i < CUVIL_VL; i++) l = vlo[i] < l ? vlo[i] : l, h = vhi[i] > h ? vhi[i] : h;
    for (; k < K; k++) l = x[k] < l ? x[k] : l, h = x[k] > h ? x[k] : h;
    *lo = l, *hi = h;
}

/* Tasks t: row block t / ng (mc rows, each mapped onto bytes over its own [min, max] as an int8 conv maps
 * its input), panel share t % ng; the integer sums (as floats) into the thread's rows, then each element
 * (sum - zero_m * wsum[n]) * scale_m * wscale[n] through cuvil_dot_store's epilogue. */
static void int8_rows_task(void *ctx, int64_t t0, int64_t t1) {
    int8_rows_matmul *a = ctx;
    const int64_t row = 4 * a->K4, N = a->N;
    const float top = (float)CUVIL_I8_LEVELS, *wscale = a->wterms, *wzero = a->wterms + N;
    uint8_t *q = cuvil_thread_buffer(CUVIL_BUF_DOT_ROWS, (size_t)(a->mc * row + a->mc * 2 * sizeof(float)));
    float *sums = cuvil_thread_buffer(CUVIL_BUF_DOT_OUT, (size_t)(a->mc * N) * sizeof(float));
    if (!q || !sums) {
        a->out_of_memory = 1;
        return;
    }
    float *rs = (float *)(q + a->mc * row);          /* each row's scale and zero point */
    float tile[CUVIL_DOT_MAX_MR * CUVIL_DOT_NR] __attribute__((aligned(64)));
    for (int64_t t = t0; t < t1; t++) {
        int64_t m0 = t / a->ng * a->mc, rows = a->M - m0 < a->mc ? a->M - m0 : a->mc, g = t % a->ng;
        int64_t p0 = g * a->np / a->ng, p1 = (g + 1) * a->np / a->ng;
        for (int64_t m = 0; m < rows; m++) {
            const float *x = a->A + (m0 + m) * a->lda;
            float lo, hi, scale, zero;
            row_range(x, a->K, &lo, &hi);
            cuvil_byte_scale(lo, hi, top, &scale, &zero);
            rs[2 * m] = scale, rs[2 * m + 1] = zero;
            row_bytes(x, a->K, row, 1.f / scale, zero, q + m * row);
        }
        cuvil_dot_out raw = {sums, 0, 0, 0, 0, (N + 15) / 16 * 16, 0, N, 0, 1.f, CUVIL_ACT_NONE, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        cuvil_i8_rows((const uint32_t *)q, rows, a->K4, a->Bp, N, p0, p1, &raw);
        cuvil_dot_out o = a->o;
        o.C += m0 * o.ldm;
        if (o.residual) o.residual += m0 * o.res_ldm;
        for (int64_t r0 = 0; r0 < rows; r0 += CUVIL_DOT_MAX_MR) {
            int mr = rows - r0 < CUVIL_DOT_MAX_MR ? (int)(rows - r0) : CUVIL_DOT_MAX_MR;
            for (int64_t p = p0; p < p1; p++) {
                int64_t n0 = p * CUVIL_DOT_NR, nc = N - n0 < CUVIL_DOT_NR ? N - n0 : CUVIL_DOT_NR;
                for (int r = 0; r < mr; r++) {
                    float sc = rs[2 * (r0 + r)], sz = sc * rs[2 * (r0 + r) + 1];
                    const float *s = sums + (r0 + r) * N + n0;
                    for (int64_t j = 0; j < nc; j++)
                        tile[r * CUVIL_DOT_NR + j] = s[j] * (sc * wscale[n0 + j]) - sz * wzero[n0 + j];
                }
                cuvil_dot_store(&o, tile, r0, mr, n0, nc);
            }
        }
    }
}

static int matmul_int8_rows(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const uint32_t *Bp,
                            const float *wterms, const float *bias, const float *residual, float *C, int64_t ldc,
                            int act, int nthreads) {
    int64_t mc = 96, mb = (M + mc - 1) / mc, np = (N + CUVIL_I8_NR - 1) / CUVIL_I8_NR;
    /* panel shares only where the row blocks cannot keep the threads busy: each share maps its rows anew */
    int64_t ng = mb >= nthreads ? 1 : np < nthreads ? np : nthreads;
    int8_rows_matmul a = {M, N, K, lda, (K + 3) / 4, mc, ng, np, A, wterms, Bp, 0,
                          {C, 0, bias, residual, 0, (N + 15) / 16 * 16, 0, ldc, N, 1.f, act, 0, 0, 0, 0, 0, 0, 0, 0, 0}};
    cuvil_parallel_for(M * N * K > 65536 ? nthreads : 1, mb * ng, 1, int8_rows_task, &a);
    return a.out_of_memory ? -1 : 0;
}

int cuvil_matmul_int8(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const uint32_t *Bp,
                      const float *wterms, const float *bias, const float *residual, const float *range, float *C,
                      int64_t ldc, int act, int nthreads) {
    if (!range) return matmul_int8_rows(M, N, K, A, lda, Bp, wterms, bias, residual, C, ldc, act, nthreads);
    float scale, zero;
    cuvil_byte_scale(range[0], range[1], (float)CUVIL_I8_LEVELS, &scale, &zero);
    float *cols = cuvil_thread_buffer(CUVIL_BUF_DOT_COLS, (size_t)(2 * N) * sizeof(float));
    if (!cols) return -1;
    /* sum * scale * w_scale[n] - scale * zero * w_scale[n] * sum_k w[k][n] + bias[n] */
    for (int64_t n = 0; n < N; n++)
        cols[n] = scale * wterms[n], cols[N + n] = (bias ? bias[n] : 0.f) - scale * zero * wterms[N + n];
    int64_t mc = 96, mb = (M + mc - 1) / mc, np = (N + CUVIL_I8_NR - 1) / CUVIL_I8_NR;
    int64_t ng = mb >= 2 * nthreads ? 1 : np < 2 * nthreads ? np : 2 * nthreads;
    int8_matmul a = {M, N, K, lda, (K + 3) / 4, mc, ng, np, A, Bp, 1.f / scale, zero, 0,
                     {C, 0, cols + N, residual, cols, (N + 15) / 16 * 16, 0, ldc, N, 1.f, act, 0, 0, 0}};
    cuvil_parallel_for(M * N * K > 65536 ? nthreads : 1, mb * ng, 1, int8_matmul_task, &a);
    return a.out_of_memory ? -1 : 0;
}
