/* Where the dot-product kernels' sums go (bf16dot.c, int8dot.c): a register tile's sums, rows of 64
 * floats, through the fused epilogue into a row-major or channel-blocked output. */
#ifndef CUVIL_DOT_OUT_H
#define CUVIL_DOT_OUT_H
#include "gemm.h"
#include "vmath.h"

#define CUVIL_DOT_NR 64        /* a tile's columns: one panel of the packed B */

/* Element (m, n) goes to C[n / nb * ldn + m * ldm + n % nb] (row-major: nb past N, ldm = ldc; the
 * channel-blocked layout: nb = CUVIL_BLOCK, ldn = pixels * nb, ldm = nb), the residual in the same
 * layout (res_ldm apart), as act(sum * (scale_col ? scale_col[n] : alpha) + bias_row[m] + bias_col[n]
 * + residual). */
typedef struct {
    float *C;
    const float *bias_row, *bias_col, *residual, *scale_col;
    int64_t nb, ldn, ldm, res_ldm;
    float alpha;
    int act;
} cuvil_dot_out;

/* Rows [0, mr) of a tile's sums (out, CUVIL_DOT_NR floats a row), columns [n0, n0 + nc), into o's
 * layout from row m0: column vector by column vector, so each one's place in the layout is one
 * division (per element, the divisions had cost a blocked 1x1 conv with K 64 as much as its dot
 * products). */
static inline void cuvil_dot_store(const cuvil_dot_out *o, const float *out, int64_t m0, int mr, int64_t n0,
                                   int64_t nc) {
    int64_t j = 0;
    for (; j + CUVIL_VL <= nc; j += CUVIL_VL) {          /* a vector never crosses a block (nb % VL == 0) */
        int64_t n = n0 + j, at = n / o->nb * o->ldn + n % o->nb;
        cuvil_vf bc = o->bias_col ? cuvil_vload(o->bias_col + n) : cuvil_vsplat(0.f);
        cuvil_vf sc = o->scale_col ? cuvil_vload(o->scale_col + n) : cuvil_vsplat(o->alpha);
        for (int r = 0; r < mr; r++) {
            int64_t m = m0 + r;
            cuvil_vf v = cuvil_vload(out + r * CUVIL_DOT_NR + j) * sc + bc;
            if (o->bias_row) v += cuvil_vsplat(o->bias_row[m]);
            if (o->residual) v += cuvil_vload(o->residual + at + m * o->res_ldm);
            cuvil_vstore(o->C + at + m * o->ldm, cuvil_vact(v, o->act));
        }
    }
    for (; j < nc; j++) {
        int64_t n = n0 + j, at = n / o->nb * o->ldn + n % o->nb;
        float sc = o->scale_col ? o->scale_col[n] : o->alpha;
        for (int r = 0; r < mr; r++) {
            int64_t m = m0 + r;
            float v = out[r * CUVIL_DOT_NR + j] * sc + (o->bias_row ? o->bias_row[m] : 0.f) +
                      (o->bias_col ? o->bias_col[n] : 0.f) + (o->residual ? o->residual[at + m * o->res_ldm] : 0.f);
            o->C[at + m * o->ldm] = cuvil_act(v, o->act);
        }
    }
}
#endif
