#include "attention.h"
#include "pool.h"

typedef struct { const cuvil_attn *a; const float *q, *k, *v; float *out; } attn_args;

static void attention_task(void *ctx, int64_t r0, int64_t r1) {
    const attn_args *args = ctx;
    const cuvil_attn *a = args->a;
    const float *q = args->q, *k = args->k, *v = args->v;
    float *out = args->out;
    int64_t group = a->H / (a->Hk > 0 ? a->Hk : 1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t b = r / (a->H * a->L), h = (r / a->L) % a->H, l = r % a->L, hk = h / group;
        const float *qr = q + b * a->qb + h * a->qh + l * a->ql;
        const float *kb = k + b * a->kb + hk * a->kh;
        const float *vb = v + b * a->vb + hk * a->vh;
        float *orow = out + b * a->ob + h * a->oh + l * a->ol;
        int64_t pos = l + (a->q_offset ? a->q_offset[b] : 0);
        int64_t S = a->causal && pos + 1 < a->S ? pos + 1 : a->S;   /* causal rows stop at their position */
        float sc[S > 0 ? S : 1];
        float m = -INFINITY;
        for (int64_t s = 0; s < S; s++) {
            float x;
            int keep = 1;
            const int64_t mo = b * a->mb + h * a->mh + l * a->ml + s * a->ms;
            if (a->mask_kind == 1) keep = keep && ((const uint8_t *)a->mask)[mo];
            if (keep) {
                const float *kr = kb + s * a->kl;
                float acc = 0.f;
                #pragma omp simd reduction(+:acc)
                for (int64_t e = 0; e < a->E; e++) acc += qr[e] * kr[e];
                x = acc * a->scale;
                if (a->mask_kind == 2) x += ((const float *)a->mask)[mo];
            } else {
                x = -INFINITY;
            }
            sc[s] = x;
            m = x > m ? x : m;
        }
        for (int64_t e = 0; e < a->Ev; e++) orow[e] = 0.f;
        if (m == -INFINITY) continue;                 /* a fully masked row attends to nothing */
        float sum = 0.f;
        for (int64_t s = 0; s < S; s++) { sc[s] = expf(sc[s] - m); sum += sc[s]; }
        float inv = 1.f / sum;
        for (int64_t s = 0; s < S; s++) {
            float p = sc[s] * inv;
            if (p == 0.f) continue;
            const float *vr = vb + s * a->vl;
            #pragma omp simd
            for (int64_t e = 0; e < a->Ev; e++) orow[e] += p * vr[e];
        }
    }
}

void cuvil_attention(const cuvil_attn *a, const float *q, const float *k, const float *v, float *out, int nthreads) {
    int64_t rows = a->B * a->H * a->L;
    attn_args args = {a, q, k, v, out};
    cuvil_parallel_for(rows * a->S * a->E > 32768 ? nthreads : 1, rows, 1, attention_task, &args);
}
