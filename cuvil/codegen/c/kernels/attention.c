#include "attention.h"
#include "pool.h"

#include "smath.h"

typedef struct { const cuvil_attn *a; const float *q, *k, *v; float *out; int64_t blocks; } attn_args;

#define QB 32                      /* query rows per task: they share one transposed copy of K */
#define KT_MAX_FLOATS (1 << 17)    /* 512 KiB of K^T on the task's stack at most */

/* One query row against keys [0, S): scores from K^T (vectorized over keys), softmax, then P V. */
static void attend_row(const cuvil_attn *a, int64_t b, int64_t h, int64_t l, const float *qr, const float *kt,
                       int64_t Sp, const float *kb, const float *vb, float *orow, int64_t S, float *sc) {
    if (kt) {
        for (int64_t s = 0; s < S; s++) sc[s] = 0.f;
        for (int64_t e = 0; e < a->E; e++) {
            const float qe = qr[e] * a->scale, *ke = kt + e * Sp;
            for (int64_t s = 0; s < S; s++) sc[s] += qe * ke[s];
        }
    } else {                       /* K^T too big for the stack: one dot product per key */
        for (int64_t s = 0; s < S; s++) {
            const float *kr = kb + s * a->kl;
            float acc = 0.f;
            #pragma omp simd reduction(+:acc)
            for (int64_t e = 0; e < a->E; e++) acc += qr[e] * kr[e];
            sc[s] = acc * a->scale;
        }
    }
    const int64_t mo = b * a->mb + h * a->mh + l * a->ml;
    if (a->mask_kind == 1) {
        const uint8_t *mk = (const uint8_t *)a->mask + mo;
        for (int64_t s = 0; s < S; s++) sc[s] = mk[s * a->ms] ? sc[s] : -INFINITY;
    } else if (a->mask_kind == 2) {
        const float *mk = (const float *)a->mask + mo;
        for (int64_t s = 0; s < S; s++) sc[s] += mk[s * a->ms];
    }
    float m = -INFINITY;
    for (int64_t s = 0; s < S; s++) m = sc[s] > m ? sc[s] : m;
    for (int64_t e = 0; e < a->Ev; e++) orow[e] = 0.f;
    if (m == -INFINITY) return;                  /* a fully masked row attends to nothing */
    float sum = 0.f;
    for (int64_t s = 0; s < S; s++) { sc[s] = cuvil_fexp(sc[s] - m); sum += sc[s]; }
    const float inv = 1.f / sum;
    for (int64_t s = 0; s < S; s++) {
        const float p = sc[s] * inv;
        if (p == 0.f) continue;
        const float *vr = vb + s * a->vl;
        #pragma omp simd
        for (int64_t e = 0; e < a->Ev; e++) orow[e] += p * vr[e];
    }
}

/* Task t: batch b, head h, query rows [l0, l0 + QB). */
static void attention_task(void *ctx, int64_t t0, int64_t t1) {
    const attn_args *args = ctx;
    const cuvil_attn *a = args->a;
    int64_t group = a->H / (a->Hk > 0 ? a->Hk : 1);
    for (int64_t t = t0; t < t1; t++) {
        int64_t bh = t / args->blocks, l0 = (t % args->blocks) * QB;
        int64_t b = bh / a->H, h = bh % a->H, hk = h / group;
        int64_t l1 = l0 + QB < a->L ? l0 + QB : a->L;
        int64_t off = a->q_offset ? a->q_offset[b] : 0;
        /* keys this block can see: all, or up to its last row's position when causal */
        int64_t S = a->causal && off + l1 < a->S ? off + l1 : a->S;
        int64_t Sp = (S + 15) & ~(int64_t)15;
        const float *kb = args->k + b * a->kb + hk * a->kh;
        const float *vb = args->v + b * a->vb + hk * a->vh;
        int use_kt = a->E * Sp <= KT_MAX_FLOATS && (l1 - l0) > 1;
        float kt[use_kt ? a->E * Sp : 1] __attribute__((aligned(64)));
        if (use_kt)
            for (int64_t s = 0; s < S; s++)
                for (int64_t e = 0; e < a->E; e++) kt[e * Sp + s] = kb[s * a->kl + e];
        float sc[S > 0 ? S : 1] __attribute__((aligned(64)));
        for (int64_t l = l0; l < l1; l++) {
            int64_t pos = l + off;
            int64_t Sr = a->causal && pos + 1 < a->S ? pos + 1 : a->S;   /* causal rows stop at their position */
            attend_row(a, b, h, l, args->q + b * a->qb + h * a->qh + l * a->ql, use_kt ? kt : 0, Sp, kb, vb,
                       args->out + b * a->ob + h * a->oh + l * a->ol, Sr, sc);
        }
    }
}

void cuvil_attention(const cuvil_attn *a, const float *q, const float *k, const float *v, float *out, int nthreads) {
    int64_t blocks = (a->L + QB - 1) / QB;
    attn_args args = {a, q, k, v, out, blocks};
    int64_t tasks = a->B * a->H * blocks;
    cuvil_parallel_for(a->B * a->H * a->L * a->S * a->E > 32768 ? nthreads : 1, tasks, 1, attention_task, &args);
}
