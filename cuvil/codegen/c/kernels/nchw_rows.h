/* A conv product held pixel-major (rows of output channels) turned into NCHW with its epilogue: the
 * convs of blocked input into channels that fill no block (blocked.c cuvil_conv_blocked_nchw_out, and
 * the integer ones of blocked_dot.c), which compute their rows as for blocked output and store them
 * this way instead of as blocks. */
#ifndef CUVIL_NCHW_ROWS_H
#define CUVIL_NCHW_ROWS_H
#include "transpose.h"
#include "vmath.h"

/* Rows [0, rows) x columns [c0, c1) of an M block's output, row-major in buf (ldb floats a row), into NCHW
 * at y (its first pixel of channel 0, P floats a channel) with the bias (column c's at bias[c], or NULL),
 * the residual (the same layout as y, or NULL) and the activation: VL x VL blocks turned in registers
 * where the target has the transposes (ldb a multiple of VL, c0 of a panel's columns), else one by one.
 * (Stored column by column from the tiles, MobileNetV2's 144 -> 24 channel projection at 56x56 had
 * taken 2.4x the time of one into 32 blocked channels.) */
static inline void cuvil_nchw_from_rows(const float *buf, int64_t ldb, int64_t rows, int64_t c0, int64_t c1, float *y,
                                        const float *res, const float *bias, int64_t P, int act) {
    int64_t r = 0;
#ifdef CUVIL_TRANSPOSE_BLOCK
    float t[CUVIL_VL * CUVIL_VL] __attribute__((aligned(64)));
    for (; r + CUVIL_VL <= rows; r += CUVIL_VL) {
        for (int64_t n = c0; n < c1; n += CUVIL_VL) {        /* a block past c1 reads ldb's padding, unstored */
            transpose_block(buf + r * ldb + n, ldb, t, CUVIL_VL);
            for (int j = 0; j < CUVIL_VL && n + j < c1; j++) {
                cuvil_vf v = cuvil_vload(t + j * CUVIL_VL);
                if (bias) v += cuvil_vsplat(bias[n + j]);
                if (res) v += cuvil_vload(res + (n + j) * P + r);
                cuvil_vstore(y + (n + j) * P + r, cuvil_vact(v, act));
            }
        }
    }
#endif
    for (; r < rows; r++)
        for (int64_t n = c0; n < c1; n++)
            y[n * P + r] = cuvil_act(buf[r * ldb + n] + (bias ? bias[n] : 0.f) + (res ? res[n * P + r] : 0.f), act);
}
#endif
