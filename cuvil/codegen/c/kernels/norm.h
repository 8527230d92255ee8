/* Reductions with their prologue/epilogue: softmax, log-softmax, layer norm, RMS norm, group norm, batch norm. */
#ifndef CUVIL_NORM_H
#define CUVIL_NORM_H
#include "common.h"

/* x viewed as [outer, n, inner]; softmax along n. */
void cuvil_softmax(int64_t outer, int64_t n, int64_t inner, const float *x, float *y, int take_log, int nthreads);
/* rows of length n; gamma/beta of length n or NULL. rms != 0 gives RMS norm (beta ignored). */
void cuvil_layer_norm(int64_t rows, int64_t n, const float *x, const float *gamma, const float *beta,
                      float eps, int rms, float *y, int nthreads);

/* A group norm (no affine) of a channel-blocked [N, C, H, W] map ([N][C/B][hw][B], B = CUVIL_VL): each
 * image's groups of C / groups channels normalised over their channels and pixels. Groups of whole
 * blocks are contiguous runs (cuvil_layer_norm's rows); narrower ones (dividing a block) take their
 * statistics from their lanes of each block. */
void cuvil_group_norm_blocked(int64_t N, int64_t C, int64_t hw, int64_t groups, const float *x, float eps, float *y,
                              int nthreads);
/* x viewed as [N, C, inner]. */
void cuvil_batch_norm(int64_t N, int64_t C, int64_t inner, const float *x, const float *scale,
                      const float *bias, const float *mean, const float *var, float eps, float *y, int nthreads);
#endif
