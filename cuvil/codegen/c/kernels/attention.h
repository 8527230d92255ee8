/* Fused attention: softmax(q k^T * scale + mask) v for every (batch, head, query row) in one
 * pass, scores kept in a stack row; grouped KV heads and arbitrary seq/head strides. */
#ifndef CUVIL_ATTENTION_H
#define CUVIL_ATTENTION_H
#include "common.h"

typedef struct {
    int64_t B, H, Hk, L, S, E, Ev;                 /* batch, query heads, kv heads, q len, kv len, dims */
    int64_t qb, qh, ql, kb, kh, kl, vb, vh, vl, ob, oh, ol;   /* element strides; the last dim is contiguous */
    int mask_kind;                                 /* 0 none, 1 bool (keep where true), 2 additive float */
    const void *mask;
    int64_t mb, mh, ml, ms;                        /* mask strides over (batch, head, q, kv); 0 = broadcast */
    float scale;
    int causal;                                    /* keep kv position s only where s <= q position + offset */
    const int64_t *q_offset;                       /* per batch: tokens already in a KV cache (NULL = 0) */
    float softcap;                                 /* > 0: scores become softcap * tanh(score / softcap) */
    int64_t window;                                /* > 0 (causal): keep only the last `window` positions */
    const int64_t *kv_slot;                        /* per batch: the slot of k and v it reads (NULL = b) */
    int kv_half;                                   /* k and v are IEEE halves (an fp16 KV cache), else floats */
} cuvil_attn;

/* Returns nonzero when the memory to widen an fp16 KV cache's rows could not be had (nothing written). */
int cuvil_attention(const cuvil_attn *a, const float *q, const void *k, const void *v, float *out, int nthreads);
#endif
