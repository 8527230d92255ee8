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

/* Row m of A -> 4 K4 bytes at q, past K the zero point (the weights' padding rows are zero). */
static void row_bytes(const int8_matmul *a, int64_t m, uint8_t *q) {
    const float *x = a->A + m * a->lda, top = (float)CUVIL_I8_LEVELS;
    int64_t k = 0;
    for (; k + CUVIL_VL <= a->K; k += CUVIL_VL) cuvil_to_bytes(cuvil_vload(x + k), a->inv, a->zero, top, q + k);
    for (; k < a->K; k++) q[k] = cuvil_to_byte(x[k], a->inv, a->zero, top);
    memset(q + a->K, (int)a->zero, (size_t)(4 * a->K4 - a->K));
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
        for (int64_t m = 0; m < rows; m++) row_bytes(a, m0 + m, q + m * row);
        cuvil_dot_out o = a->o;
        o.C += m0 * o.ldm;
        if (o.residual) o.residual += m0 * o.res_ldm;
        cuvil_i8_rows((const uint32_t *)q, rows, a->K4, a->Bp, a->N, g * a->np / a->ng, (g + 1) * a->np / a->ng, &o);
    }
}

int cuvil_matmul_int8(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const uint32_t *Bp,
                      const float *wterms, const float *bias, const float *residual, const float *range, float *C,
                      int64_t ldc, int act, int nthreads) {
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
