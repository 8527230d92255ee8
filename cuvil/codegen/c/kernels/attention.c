/* GCC tunes most AVX-512 CPUs to 256-bit auto-vectorization, so the softmax and mask loops below ran
 * at half the width of the hand-written score and P V tiles (a third of MiniLM's attention time).
 * At full width, C harness, interleaved, new/old time: MiniLM's heads (dim 32, 128 rows) 0.87-0.90
 * at 1 and 2 threads, BERT's (dim 64) 0.93-0.95, a TinyLlama decode step 0.94-0.98, causal prefill
 * 1.0. Before any include, so that the inlined helpers take it too. */
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("prefer-vector-width=512")
#endif
#include "attention.h"
#include "pool.h"

#include "half.h"
#include "smath.h"
#include <stdlib.h>
#include "vmath.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef struct {
    const cuvil_attn *a; const float *q; const void *k, *v; float *out; int64_t blocks, qb;
    int out_of_memory;                 /* set by a task that could not widen an fp16 cache's rows */
} attn_args;

#define KT_MAX_FLOATS (1 << 17)    /* 512 KiB of K^T on the task's stack at most */

/* The mask (at offset mo) applied to scores p[0, S) in place. */
static inline void apply_mask(const cuvil_attn *a, int64_t mo, float *p, int64_t S) {
    if (a->mask_kind == 1) {
        const uint8_t *mk = (const uint8_t *)a->mask + mo;
        for (int64_t s = 0; s < S; s++) p[s] = mk[s * a->ms] ? p[s] : -INFINITY;
    } else if (a->mask_kind == 2) {
        const float *mk = (const float *)a->mask + mo;
        for (int64_t s = 0; s < S; s++) p[s] += mk[s * a->ms];
    }
}

/* The mask applied to scores p[0, S), then their max (-inf: all masked). */
static inline float mask_and_max(const cuvil_attn *a, int64_t mo, float *p, int64_t S) {
    apply_mask(a, mo, p, S);
    float m = -INFINITY;
    #pragma omp simd reduction(max:m)
    for (int64_t s = 0; s < S; s++) m = p[s] > m ? p[s] : m;
    return m;
}

/* Gemma 2's cap on the scores p[0, S) of the query at position pos, and a sliding window's dropped
 * keys (-inf, as a mask's): before the max, so the softmax paths below need not know of either. */
static inline void cap_and_window(const cuvil_attn *a, float *p, int64_t S, int64_t pos) {
    if (a->softcap > 0.f) {
        const float c = a->softcap;
        for (int64_t s = 0; s < S; s++) p[s] = c * cuvil_ftanh(p[s] / c);
    }
    if (a->window > 0)
        for (int64_t s = 0; s < pos + 1 - a->window && s < S; s++) p[s] = -INFINITY;
}

/* One query row against keys [0, S): scores from K^T (vectorized over keys), softmax, then P V. */
static void attend_row(const cuvil_attn *a, int64_t b, int64_t h, int64_t l, int64_t pos, const float *qr,
                       const float *kt, int64_t Sp, const float *kb, const float *vb, float *orow, int64_t S,
                       float *sc) {
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
    cap_and_window(a, sc, S, pos);
    const float m = mask_and_max(a, b * a->mb + h * a->mh + l * a->ml, sc, S);
    for (int64_t e = 0; e < a->Ev; e++) orow[e] = 0.f;
    if (m == -INFINITY) return;                  /* a fully masked row attends to nothing */
    float sum = 0.f;
    for (int64_t s = 0; s < S; s++) sc[s] = cuvil_fexp(sc[s] - m);     /* apart from the sum: vectorizes */
    #pragma omp simd reduction(+:sum)
    for (int64_t s = 0; s < S; s++) sum += sc[s];
    const float inv = 1.f / sum;
    for (int64_t s = 0; s < S; s++) {
        const float p = sc[s] * inv;
        if (p == 0.f) continue;
        const float *vr = vb + s * a->vl;
        #pragma omp simd
        for (int64_t e = 0; e < a->Ev; e++) orow[e] += p * vr[e];
    }
}

/* exp(x) for softmax's x = score - max <= 0 (or NaN, kept), lanes below `tiny` left to the caller: on
 * AVX-512 vmath.h's vscalefps form without its clamps (12 instructions). */
static inline cuvil_vf vexp_nonpositive(cuvil_vf x, cuvil_vf tiny) {
#if defined(__AVX512F__)
    __m512 xc = _mm512_max_ps((__m512)x, (__m512)tiny);       /* NaN in x gives tiny: restored below */
    return cuvil_vsel(x != x, x, (cuvil_vf)cuvil_vexp_in_range(xc));
#else
    (void)tiny;
    return cuvil_vexp(x);
#endif
}

/* The max of p[0, S) read in whole vectors (p has room up to S rounded up to VL), lanes past S left out,
 * NaN skipped as mask_and_max skips it. Unmasked rows only (a padding mask's live keys, causal rows):
 * GCC's simd loop ran a row shorter than a vector (MiniLM's 15 live keys) as a scalar chain, and
 * softmax was 46% of that attention's time (C harness: MiniLM's 12 heads at 1 thread 106 -> 54 us). */
static inline float vector_max(const float *p, int64_t S, cuvil_vi lane) {
    cuvil_vf vmax = cuvil_vsplat(-INFINITY), vmax2 = vmax;
    int64_t s = 0;
    for (; s + 2 * CUVIL_VL <= S; s += 2 * CUVIL_VL) {      /* two chains of vmaxps */
        cuvil_vf x = cuvil_vload(p + s), y = cuvil_vload(p + s + CUVIL_VL);
        vmax = cuvil_vsel(x > vmax, x, vmax);
        vmax2 = cuvil_vsel(y > vmax2, y, vmax2);
    }
    for (; s < S; s += CUVIL_VL) {
        cuvil_vf x = cuvil_vload(p + s);
        vmax = cuvil_vsel((lane + (int32_t)s < (int32_t)S) & (x > vmax), x, vmax);
    }
    vmax = cuvil_vsel(vmax2 > vmax, vmax2, vmax);
#if defined(__AVX512F__)
    return _mm512_reduce_max_ps((__m512)vmax);
#else
    for (int w = CUVIL_VL / 2; w > 0; w /= 2)
        for (int i = 0; i < w; i++) vmax[i] = vmax[i] > vmax[i + w] ? vmax[i] : vmax[i + w];
    return vmax[0];
#endif
}

/* A row of scores p[0, S) (room for whole vectors up to Smax) masked, then exp(p - max) in place, with
 * p[S, Smax) = 0 for the P V tile; returns 1 / sum, which P V applies to its output (0 for a fully
 * masked row, left all zeros). The exp, the zeros and the sum in one vector pass, and no pass of
 * p *= 1 / sum: four passes over the row had been a third of MiniLM's attention time. */
static inline float softmax_unscaled(const cuvil_attn *a, int64_t mo, float *p, int64_t S, int64_t Smax) {
    cuvil_vi lane;
    for (int i = 0; i < CUVIL_VL; i++) lane[i] = i;
    const float m = a->mask_kind ? mask_and_max(a, mo, p, S) : vector_max(p, S, lane);
    if (m == -INFINITY) {                        /* a fully masked row attends to nothing */
        for (int64_t s = 0; s < Smax; s++) p[s] = 0.f;
        return 0.f;
    }
    const cuvil_vf vm = cuvil_vsplat(m), zero = cuvil_vsplat(0.f), tiny = cuvil_vsplat(-87.3365478515625f);
    cuvil_vf vsum = zero;
    for (int64_t s = 0; s < Smax; s += CUVIL_VL) {
        cuvil_vf x = cuvil_vload(p + s) - vm;
        /* masked keys (-inf), underflow and the keys past S give exact zeros */
        cuvil_vf e = cuvil_vsel((x < tiny) | (lane + (int32_t)s >= (int32_t)S), zero, vexp_nonpositive(x, tiny));
        cuvil_vstore(p + s, e);
        vsum += e;
    }
    /* a tree sum: a lane-by-lane chain waited on each add; in registers where AVX-512 has the shuffles
     * (GCC took the generic halving through the stack: 5% of MiniLM's attention time) */
#if defined(__AVX512F__)
    return 1.f / _mm512_reduce_add_ps((__m512)vsum);
#else
    for (int w = CUVIL_VL / 2; w > 0; w /= 2)
        for (int i = 0; i < w; i++) vsum[i] += vsum[i + w];
    return 1.f / vsum[0];
#endif
}

/* N query rows (head hr[r], position lr[r]) sharing one KV head, together: scores and P V as
 * register tiles of N rows x 2 vectors, so each loaded K^T or V vector feeds N FMAs instead of one
 * row's round trip through its score or output row in L1. N is a constant per call site (see
 * attend_rows), so the row loops unroll. Needs K^T (keys padded to a multiple of 2 VL) and Ev a
 * multiple of VL. RB rows at most: 8 (16 accumulators) where there are 32 vector registers (MiniLM's
 * heads, Zen 4, 1 thread: 0.96-0.98x the time of 6; 12 rows were no faster), 6 where there are 16. */
#if CUVIL_VL == 16
#define RB 8
#else
#define RB 6
#endif
static inline __attribute__((always_inline)) void attend_rows_n(
        const int N, const int half, const cuvil_attn *a, int64_t b, const int64_t hr[RB], const int64_t lr[RB],
        int64_t off, const float *const qr[RB], const float *kt, int64_t Sp, const void *vb, float *const orow[RB],
        float *sc, int prefetch_v) {
    const int64_t vsize = half ? 2 : 4;                            /* bytes a V element */
    int64_t Sr[RB], Smax = 0;
    for (int r = 0; r < N; r++) {
        int64_t pos = lr[r] + off;
        Sr[r] = a->causal && pos + 1 < a->S ? pos + 1 : a->S;
        Smax = Sr[r] > Smax ? Sr[r] : Smax;
    }
    for (int64_t s0 = 0; s0 < Smax; s0 += 2 * CUVIL_VL) {          /* scores: Q K^T * scale */
        /* the V rows of these keys toward the cache, for P V below: read there one vector column at
         * a time down a KV cache just streamed in from memory, each pass waited on every row (a
         * decode step: 35% of attention stalled on those loads). The task's first tile only: the
         * later ones find them in cache, and their prefetches, 2 per key and row tile, had been 7% of
         * MiniLM's attention time */
        if (prefetch_v)
            for (int64_t s = s0; s < s0 + 2 * CUVIL_VL && s < Smax; s++)
                for (int64_t e = 0; e < a->Ev; e += 64 / vsize)
                    __builtin_prefetch((const char *)vb + (s * a->vl + e) * vsize, 0, 2);
        cuvil_vf acc[RB][2];
        for (int r = 0; r < N; r++) acc[r][0] = acc[r][1] = cuvil_vsplat(0.f);
        for (int64_t e = 0; e < a->E; e++) {
            cuvil_vf k0 = cuvil_vload(kt + e * Sp + s0), k1 = cuvil_vload(kt + e * Sp + s0 + CUVIL_VL);
            for (int r = 0; r < N; r++) {
                cuvil_vf q = cuvil_vsplat(qr[r][e]);
                acc[r][0] += q * k0, acc[r][1] += q * k1;
            }
        }
        for (int r = 0; r < N; r++) {
            cuvil_vstore(sc + r * Sp + s0, acc[r][0] * a->scale);
            cuvil_vstore(sc + r * Sp + s0 + CUVIL_VL, acc[r][1] * a->scale);
        }
    }
    if (a->softcap > 0.f || a->window > 0)
        for (int r = 0; r < N; r++) cap_and_window(a, sc + r * Sp, Sr[r], lr[r] + off);
    float inv[RB];
    for (int r = 0; r < N; r++)                                    /* mask and softmax, row by row */
        inv[r] = softmax_unscaled(a, b * a->mb + hr[r] * a->mh + lr[r] * a->ml, sc + r * Sp, Sr[r], Smax);
    for (int64_t e0 = 0; e0 < a->Ev; e0 += 2 * CUVIL_VL) {           /* P V */
        int two = e0 + 2 * CUVIL_VL <= a->Ev;
        cuvil_vf acc[RB][2];
        for (int r = 0; r < N; r++) acc[r][0] = acc[r][1] = cuvil_vsplat(0.f);
        for (int64_t s = 0; s < Smax; s++) {
            cuvil_vf v0, v1;
            if (half) {         /* an fp16 cache's V read as halves, widened in registers */
                const uint16_t *vr = (const uint16_t *)vb + s * a->vl + e0;
                v0 = cuvil_vload_f16(vr), v1 = two ? cuvil_vload_f16(vr + CUVIL_VL) : v0;
            } else {
                const float *vr = (const float *)vb + s * a->vl + e0;
                v0 = cuvil_vload(vr), v1 = two ? cuvil_vload(vr + CUVIL_VL) : v0;
            }
            for (int r = 0; r < N; r++) {
                cuvil_vf pr = cuvil_vsplat(sc[r * Sp + s]);
                acc[r][0] += pr * v0, acc[r][1] += pr * v1;
            }
        }
        for (int r = 0; r < N; r++) {
            cuvil_vstore(orow[r] + e0, acc[r][0] * inv[r]);
            if (two) cuvil_vstore(orow[r] + e0 + CUVIL_VL, acc[r][1] * inv[r]);
        }
    }
}

/* rb rows with the tile of exactly rb rows: a decode step's 8 query heads per KV head (TinyLlama,
 * Llama-3-8B: 8 and 4) went as 6 + 6, the second tile computing 4 rows only to drop them. half: V in
 * IEEE halves (an fp16 cache). */
static void attend_rows(const cuvil_attn *a, int64_t b, const int64_t hr[RB], const int64_t lr[RB], int rb,
                        int64_t off, const float *const qr[RB], const float *kt, int64_t Sp, const void *vb,
                        int half, float *const orow[RB], float *sc, int prefetch_v) {
#define ROWS_CASE(N) case N:                                                                                \
        if (half) attend_rows_n(N, 1, a, b, hr, lr, off, qr, kt, Sp, vb, orow, sc, prefetch_v);              \
        else attend_rows_n(N, 0, a, b, hr, lr, off, qr, kt, Sp, vb, orow, sc, prefetch_v);                   \
        break;
    switch (rb < RB ? rb : RB) {
    ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6)
#if RB > 6
    ROWS_CASE(7) ROWS_CASE(8)
#endif
    default: break;
    }
#undef ROWS_CASE
}

/* kt[e * Sp + s] = k[s * kl + e] for s < S, e < E, k floats or (half) IEEE halves: in 8 x 8 blocks of
 * vectors where AVX2 has them (element by element it was 15% of MiniLM's attention). */
static inline float key_at(const void *k, int half, int64_t i) {
    return half ? cuvil_f16_to_f32(((const uint16_t *)k)[i]) : ((const float *)k)[i];
}

#if defined(__AVX2__)
#include <immintrin.h>
/* eight elements of k from element i, as floats */
static inline __m256 load8(const void *k, int half, int64_t i) {
    if (!half) return _mm256_loadu_ps((const float *)k + i);
#if defined(__F16C__)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)k + i)));
#else
    float f[8];
    for (int j = 0; j < 8; j++) f[j] = key_at(k, 1, i + j);
    return _mm256_loadu_ps(f);
#endif
}

static void transpose_keys(const void *k, int half, int64_t kl, int64_t S, int64_t E, float *kt, int64_t Sp) {
    int64_t s8 = S / 8 * 8, e8 = E / 8 * 8, esize = half ? 2 : 4;
    for (int64_t s = 0; s < s8; s += 8) {
        /* the next eight keys toward L1: a KV cache comes from memory, and the 8 x 8 blocks read it
         * in an order the hardware prefetcher does not follow */
        for (int64_t r = s + 8; r < s + 16 && r < S; r++)
            for (int64_t e = 0; e < E; e += 64 / esize) __builtin_prefetch((const char *)k + (r * kl + e) * esize, 0, 3);
        for (int64_t e = 0; e < e8; e += 8) {
            __m256 r[8], t[8];
            for (int i = 0; i < 8; i++) r[i] = load8(k, half, (s + i) * kl + e);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4)
                for (int j = 0; j < 2; j++) {
                    r[i + j] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], 0x44);
                    r[i + j + 2] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], 0xEE);
                }
            for (int i = 0; i < 4; i++) {
                t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
                t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
            }
            /* t[i] now holds column e + c(i) with c = 0, 2, 1, 3, 4, 6, 5, 7 */
            static const int col[8] = {0, 2, 1, 3, 4, 6, 5, 7};
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(kt + (e + col[i]) * Sp + s, t[i]);
        }
    }
    for (int64_t s = 0; s < S; s++)                       /* the edges */
        for (int64_t e = s < s8 ? e8 : 0; e < E; e++) kt[e * Sp + s] = key_at(k, half, s * kl + e);
}
#else
static void transpose_keys(const void *k, int half, int64_t kl, int64_t S, int64_t E, float *kt, int64_t Sp) {
    for (int64_t s = 0; s < S; s++)
        for (int64_t e = 0; e < E; e++) kt[e * Sp + s] = key_at(k, half, s * kl + e);
}
#endif

/* Rows of the next tile when `rows` rows are left for `tiles` tiles. */
static inline int rb_of(int64_t rows, int64_t tiles) { return (int)((rows + tiles - 1) / tiles); }

/* S keys padded to the score tiles' multiple of 2 VL */
static inline int64_t padded_keys(int64_t S) { return (S + 2 * CUVIL_VL - 1) / (2 * CUVIL_VL) * (2 * CUVIL_VL); }

/* Whether attend_block runs rows [i0, i1) all in tiles (K^T on the stack, V in whole vectors): the
 * only path that reads an fp16 cache's halves as they are. */
static inline int tiles_all_rows(const cuvil_attn *a, int64_t i0, int64_t i1, int64_t S) {
    return a->E * padded_keys(S) <= KT_MAX_FLOATS && (i1 - i0) > 1 && a->Ev % CUVIL_VL == 0 && S > 0;
}

/* Rows [i0, i1) of (batch b, KV head hk) against keys [0, S) at kb / vb (key strides a->kl, a->vl):
 * floats, or (half) an fp16 cache's halves where tiles_all_rows. */
static void attend_block(const cuvil_attn *a, const attn_args *args, int64_t b, int64_t hk, int64_t i0, int64_t i1,
                         int64_t off, int64_t S, const void *kb, const void *vb, int half) {
    const int64_t group = a->H / (a->Hk > 0 ? a->Hk : 1);
    int64_t Sp = padded_keys(S);
    int use_kt = a->E * Sp <= KT_MAX_FLOATS && (i1 - i0) > 1;
    float kt[use_kt ? a->E * Sp : 1] __attribute__((aligned(64)));
    if (use_kt) transpose_keys(kb, half, a->kl, S, a->E, kt, Sp);
    if (use_kt)          /* the padding keys: computed by the score tiles, never NaN */
        for (int64_t e = 0; e < a->E; e++)
            for (int64_t s = S; s < Sp; s++) kt[e * Sp + s] = 0.f;
    float sc[use_kt ? RB * Sp + 1 : S + 1] __attribute__((aligned(64)));
    int64_t i = i0;
    if (tiles_all_rows(a, i0, i1, S))
        /* as few tiles as RB allows, of even rows: 8 rows as 4 + 4, not 6 + 2 */
        for (int64_t tiles = (i1 - i + RB - 1) / RB; tiles > 0; tiles--) {
            int rb = rb_of(i1 - i, tiles);
            int64_t hr[RB], lr[RB];
            const float *qr[RB];
            float *orow[RB];
            for (int r = 0; r < rb; r++) {
                int64_t ir = i + r;
                hr[r] = hk * group + ir / a->L, lr[r] = ir % a->L;
                qr[r] = args->q + b * a->qb + hr[r] * a->qh + lr[r] * a->ql;
                orow[r] = args->out + b * a->ob + hr[r] * a->oh + lr[r] * a->ol;
            }
            attend_rows(a, b, hr, lr, rb, off, qr, kt, Sp, vb, half, orow, sc, i == i0);
            i += rb;
        }
    for (; i < i1 && !half; i++) {
        int64_t h = hk * group + i / a->L, l = i % a->L, pos = l + off;
        int64_t Sr = a->causal && pos + 1 < a->S ? pos + 1 : a->S;   /* causal rows stop at their position */
        attend_row(a, b, h, l, pos, args->q + b * a->qb + h * a->qh + l * a->ql, use_kt ? kt : 0, Sp, kb, vb,
                   args->out + b * a->ob + h * a->oh + l * a->ol, Sr, sc);
    }
}

/* A float mask entry at or below this drops its key: next to a key whose entry is 0,
 * exp(score - max) is an exact 0 for any score below 1e29 */
#define DEAD_CEILING (-1e30f)

/* The keys of the padding pattern that rows [i0, i1) of (b, hk) share, into idx; their count, or -1
 * where there is nothing to drop or the rows differ (a causal or per-row mask: the dense path). A
 * padded batch's attention then costs its real tokens, not its padded length: MiniLM's benchmark
 * sentences are 15 of 128 tokens. Keys are dropped only where dense attention gives them an exact 0
 * weight: false in a bool mask, or at DEAD_CEILING or below in a float mask whose other keys are 0;
 * a row with no live key keeps the dense path (its softmax is over the masked keys alone). A NaN in
 * a dropped key's V no longer reaches the output (dense: 0 x NaN). */
static int64_t padding_keys(const cuvil_attn *a, int64_t b, int64_t hk, int64_t i0, int64_t i1, int64_t S,
                            int32_t *idx) {
    if (!a->mask_kind || a->causal) return -1;
    const int64_t group = a->H / (a->Hk > 0 ? a->Hk : 1), esize = a->mask_kind == 1 ? 1 : 4;
    const char *base = (const char *)a->mask;
    int64_t first = -1, prev = -1, n = 0;
    for (int64_t i = i0; i < i1; i++) {
        int64_t mo = b * a->mb + (hk * group + i / a->L) * a->mh + (i % a->L) * a->ml;
        if (mo == prev) continue;
        if (first < 0) {
            first = mo;
            for (int64_t s = 0; s < S; s++) {
                int live;
                if (a->mask_kind == 1) live = ((const uint8_t *)a->mask)[mo + s * a->ms] != 0;
                else {
                    float m = ((const float *)a->mask)[mo + s * a->ms];
                    if (m != 0.f && !(m <= DEAD_CEILING)) return -1;     /* a bias, not a padding mask */
                    live = m == 0.f;
                }
                if (live) idx[n++] = (int32_t)s;
            }
            if (n == 0 || n == S) return -1;
        } else if (a->ms == 1) {
            if (memcmp(base + mo * esize, base + first * esize, S * esize)) return -1;
        } else
            for (int64_t s = 0; s < S; s++)
                if (memcmp(base + (mo + s * a->ms) * esize, base + (first + s * a->ms) * esize, esize)) return -1;
        prev = mo;
    }
    return n;
}

/* n rows of E halves (row stride ld) -> n rows of E floats, contiguous. */
static void widen_rows(const uint16_t *src, int64_t ld, int64_t n, int64_t E, float *dst) {
    for (int64_t s = 0; s < n; s++) {
        const uint16_t *r = src + s * ld;
        float *d = dst + s * E;
        int64_t e = 0;
        for (; e + CUVIL_VL <= E; e += CUVIL_VL) cuvil_vstore(d + e, cuvil_vload_f16(r + e));
        for (; e < E; e++) d[e] = cuvil_f16_to_f32(r[e]);
    }
}

/* An fp16 KV cache where the tiles do not take it (one row a block: a decode step without grouped
 * heads; K^T past the stack; a head dim no multiple of VL): the block's S keys and values widened to
 * floats on the heap (a long context does not fit a task's stack), then attended as an fp32 cache's
 * are. Nonzero when memory ran out. */
static int widened_block(const cuvil_attn *a, const attn_args *args, int64_t b, int64_t hk, int64_t i0, int64_t i1,
                         int64_t off, int64_t S, int64_t slot) {
    float *kf = malloc((size_t)(S * a->E + S * a->Ev + 1) * sizeof(float));
    if (!kf) return 1;
    float *vf = kf + S * a->E;
    widen_rows((const uint16_t *)args->k + slot * a->kb + hk * a->kh, a->kl, S, a->E, kf);
    widen_rows((const uint16_t *)args->v + slot * a->vb + hk * a->vh, a->vl, S, a->Ev, vf);
    cuvil_attn wide = *a;
    wide.S = S, wide.kl = a->E, wide.vl = a->Ev, wide.kv_half = 0;
    attend_block(&wide, args, b, hk, i0, i1, off, S, kf, vf, 0);
    free(kf);
    return 0;
}

/* Task t: batch b, KV head hk, rows [i0, i0 + qb) of the rows that read it: row i is query head
 * hk * group + i / L at position i % L. The query heads of a KV group share one K^T, so a decode
 * step (L = 1) attends for all of a group's heads at once. */
static void attention_task(void *ctx, int64_t t0, int64_t t1) {
    const attn_args *args = ctx;
    const cuvil_attn *a = args->a;
    const int64_t Hk = a->Hk > 0 ? a->Hk : 1, rows = a->H / Hk * a->L;
    for (int64_t t = t0; t < t1; t++) {
        int64_t bh = t / args->blocks, i0 = (t % args->blocks) * args->qb;
        int64_t b = bh / Hk, hk = bh % Hk;
        int64_t i1 = i0 + args->qb < rows ? i0 + args->qb : rows;
        int64_t off = a->q_offset ? a->q_offset[b] : 0;
        /* keys this block can see: all, or up to its last position when causal */
        int64_t lmax = i0 / a->L == (i1 - 1) / a->L ? (i1 - 1) % a->L : a->L - 1;
        int64_t S = a->causal && off + lmax + 1 < a->S ? off + lmax + 1 : a->S;
        const int64_t slot = a->kv_slot ? a->kv_slot[b] : b;
        if (a->kv_half && tiles_all_rows(a, i0, i1, S)) {      /* the halves read where they lie */
            attend_block(a, args, b, hk, i0, i1, off, S, (const uint16_t *)args->k + slot * a->kb + hk * a->kh,
                         (const uint16_t *)args->v + slot * a->vb + hk * a->vh, 1);
            continue;
        }
        if (a->kv_half) {
            if (widened_block(a, args, b, hk, i0, i1, off, S, slot)) __atomic_store_n((int *)&args->out_of_memory, 1, __ATOMIC_RELAXED);
            continue;
        }
        const float *kb = (const float *)args->k + slot * a->kb + hk * a->kh;
        const float *vb = (const float *)args->v + slot * a->vb + hk * a->vh;
        int small = S * (a->E + a->Ev) <= KT_MAX_FLOATS / 2;   /* the gathered rows on the stack too */
        int32_t idx[small ? S : 1];
        int64_t n = small ? padding_keys(a, b, hk, i0, i1, S, idx) : -1;
        if (n < 0) {
            attend_block(a, args, b, hk, i0, i1, off, S, kb, vb, 0);
            continue;
        }
        /* the live keys' K and V rows gathered, attended without a mask */
        float kc[n * a->E + 1] __attribute__((aligned(64))), vc[n * a->Ev + 1] __attribute__((aligned(64)));
        for (int64_t j = 0; j < n; j++) {
            memcpy(kc + j * a->E, kb + idx[j] * a->kl, a->E * sizeof(float));
            memcpy(vc + j * a->Ev, vb + idx[j] * a->vl, a->Ev * sizeof(float));
        }
        cuvil_attn live = *a;
        live.S = n, live.kl = a->E, live.vl = a->Ev, live.mask_kind = 0, live.mask = 0;
        attend_block(&live, args, b, hk, i0, i1, off, n, kc, vc, 0);
    }
}

/* Rows of a KV head are split into as few blocks as keep every thread busy (about 3 tasks per
 * thread, 1 for a decode step): each block transposes K once, so 48-row blocks made MiniLM (12
 * heads, 128 rows) transpose every head's K three times at one thread, 15% of its attention time. */
int cuvil_attention(const cuvil_attn *a, const float *q, const void *k, const void *v, float *out, int nthreads) {
    int64_t Hk = a->Hk > 0 ? a->Hk : 1, rows = a->H / Hk * a->L, heads = a->B * Hk;
    /* a decode step (one row per query head) only as many blocks as give every thread a task: each
     * further block reads the head's K and V from memory once more (2 threads, 4 KV heads: 0.75x) */
    int64_t per_thread = a->L == 1 ? 1 : 3, nt = nthreads > 1 ? nthreads : 1;
    int64_t blocks = (per_thread * nt + heads - 1) / heads, most = (rows + RB - 1) / RB;
    blocks = blocks < 1 ? 1 : blocks > most ? most : blocks;
    int64_t qb = ((rows + blocks - 1) / blocks + RB - 1) / RB * RB;
    blocks = qb > 0 ? (rows + qb - 1) / qb : 1;
    attn_args args = {a, q, k, v, out, blocks, qb > 0 ? qb : 1, 0};
    int64_t tasks = a->B * Hk * blocks;
    cuvil_parallel_for(a->B * a->H * a->L * a->S * a->E > 32768 ? nthreads : 1, tasks, 1, attention_task, &args);
    return __atomic_load_n(&args.out_of_memory, __ATOMIC_RELAXED);
}
