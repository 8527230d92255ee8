#include "qgemm.h"
#include "gemm.h"
#include "pool.h"
#include <stdlib.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CUVIL_QGEMM_AVX2 1
#endif

/* ---- activation quantization ------------------------------------------------------------ */
void cuvil_quantize_rows(int64_t M, int64_t K, const float *A, int64_t lda, int64_t blk, int8_t *q, float *d) {
    int64_t nb = K / blk;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *x = A + m * lda + b * blk;
            int8_t *qq = q + m * K + b * blk;
            float amax = 0.f;
            for (int64_t i = 0; i < blk; i++) {
                float a = fabsf(x[i]);
                amax = a > amax ? a : amax;
            }
            /* the numpy reference computes d and 1/d in float32 the same way */
            float dd = amax / 127.f, id = dd > 0.f ? 1.f / dd : 0.f;
#ifdef CUVIL_QGEMM_AVX2
            __m256 vid = _mm256_set1_ps(id);
            const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            for (int64_t i = 0; i < blk; i += 32) {
                __m256i v[4];
                for (int u = 0; u < 4; u++)        /* round to nearest even, as np.rint */
                    v[u] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * u), vid));
                __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
                _mm256_storeu_si256((__m256i *)(qq + i), _mm256_permutevar8x32_epi32(p, order));
            }
#else
            for (int64_t i = 0; i < blk; i++) qq[i] = (int8_t)lrintf(x[i] * id);
#endif
            d[m * nb + b] = dd;
        }
    }
}

/* ---- the tiles: MR rows x NC columns, all of K ---------------------------------------------- */
typedef struct {
    int64_t M, N, K, ablock, ldc, nb, wstride, pf;   /* pf: prefetch distance in bytes (the next tile) */
    const int8_t *xq;
    const float *dx, *scales, *residual;
    const void *noff;             /* int4: [M][G] int16 x 16 starting partials (q4_offsets) */
    const uint8_t *W;
    int bits, mr, nc, cb;         /* tile rows, tile columns, columns per task */
    float *C;
} qargs;

/* Columns are stored in groups of four, interleaved 32 bytes at a time (one int4 chunk of 64 K or
 * one int8 block of 32 K per column), so a tile of four columns reads one sequential stream. */
static inline const uint8_t *col_base(const qargs *a, int64_t n) {
    return a->W + (n >> 2) * 4 * a->wstride + (n & 3) * 32;
}
static inline const float *col_scales(const qargs *a, int64_t n) {      /* int4: [N/4][G][4] */
    return a->scales + (n >> 2) * 4 * a->nb + (n & 3);
}

#ifdef CUVIL_QGEMM_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* int4: unsigned nibbles times int8 activations (maddubs), int16 partials summed over the group
 * (at most 4 x 3810). Each partial starts at -maddubs(8, x) summed over the group (noff, made once
 * per row when the activations are quantized), which takes off the + 8 of the nibbles; the sum
 * stays within +-30480, no saturation. SUB = group / 32 is a compile-time constant. */
static inline __attribute__((always_inline)) void q4_tile(const qargs *a, int MR, int NC, int SUB, int64_t m0,
                                                          int64_t n0, float out[4][4]) {
    const int64_t K = a->K, G = a->nb;
    const int8_t *xr[4];
    const float *dxr[4], *dwc[4];
    const __m256i *nor[4];
    const uint8_t *wc[4];
    for (int i = 0; i < MR; i++) {           /* rows past M repeat row m0: computed, not stored */
        int64_t m = m0 + i < a->M ? m0 + i : m0;
        xr[i] = a->xq + m * K, dxr[i] = a->dx + m * G, nor[i] = (const __m256i *)a->noff + m * G;
    }
    for (int j = 0; j < NC; j++) {
        int64_t n = n0 + j < a->N ? n0 + j : n0;
        wc[j] = col_base(a, n), dwc[j] = col_scales(a, n);
    }
    __m256 acc[4][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NC; j++) acc[i][j] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(15);
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 1
    for (int64_t g = 0; g < G; g++) {      /* (unrolling this spills the partials) */
        __m256i p[4][4];
        for (int i = 0; i < MR; i++) {
            __m256i no = _mm256_load_si256(nor[i] + g);
            for (int j = 0; j < NC; j++) p[i][j] = no;
        }
        for (int s = 0; s < SUB; s++) {
            const int64_t k = (g * SUB + s) * 32;
            /* SUB >= 2: groups start on 64-value chunks, so the half is s & 1, known here */
            __m128i shift = _mm_cvtsi32_si128(SUB >= 2 ? (s & 1) * 4 : (int)(g & 1) * 4);
            __m256i w[4];
            if (SUB < 2 || (s & 1) == 0)      /* the same bytes of the next tile's columns: one tile ahead */
                for (int j = 0; j < NC; j++) _mm_prefetch((const char *)(wc[j] + (k >> 6) * 128 + a->pf), _MM_HINT_T0);
            for (int j = 0; j < NC; j++)
                w[j] = _mm256_and_si256(
                    _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(wc[j] + (k >> 6) * 128)), shift), low4);
            for (int i = 0; i < MR; i++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(xr[i] + k));
                for (int j = 0; j < NC; j++) p[i][j] = _mm256_add_epi16(p[i][j], _mm256_maddubs_epi16(w[j], x));
            }
        }
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NC; j++)
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p[i][j], ones)),
                                            _mm256_set1_ps(dwc[j][4 * g] * dxr[i][g]), acc[i][j]);
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NC; j++) out[i][j] = hsum8(acc[i][j]);
}

/* -maddubs(8, x) summed over each group of each row: the starting value of q4_tile's partials. */
static void q4_offsets(int64_t M, int64_t K, int64_t group, const int8_t *xq, __m256i *noff) {
    const __m256i eight = _mm256_set1_epi8(8);
    for (int64_t m = 0; m < M; m++)
        for (int64_t g = 0; g < K / group; g++) {
            __m256i o = _mm256_setzero_si256();
            for (int64_t k = g * group; k < (g + 1) * group; k += 32)
                o = _mm256_sub_epi16(o, _mm256_maddubs_epi16(eight, _mm256_loadu_si256((const __m256i *)(xq + m * K + k))));
            noff[m * (K / group) + g] = o;
        }
}

/* int8: the sign trick (|w| unsigned, x with w's sign), int32 sums per activation block. */
static inline __attribute__((always_inline)) void q8_tile(const qargs *a, int MR, int NC, int SUB, int64_t m0,
                                                          int64_t n0, float out[4][4]) {
    const int64_t K = a->K, nb = a->nb;
    const int8_t *xr[4];
    const float *dxr[4];
    const int8_t *wc[4];
    float sw[4];
    for (int i = 0; i < MR; i++) {
        int64_t m = m0 + i < a->M ? m0 + i : m0;
        xr[i] = a->xq + m * K, dxr[i] = a->dx + m * nb;
    }
    for (int j = 0; j < NC; j++) {
        int64_t n = n0 + j < a->N ? n0 + j : n0;
        wc[j] = (const int8_t *)col_base(a, n), sw[j] = a->scales[n];
    }
    __m256 acc[4][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NC; j++) acc[i][j] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 1
    for (int64_t b = 0; b < nb; b++) {
        __m256i is[4][4];
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NC; j++) is[i][j] = _mm256_setzero_si256();
        for (int s = 0; s < SUB; s++) {
            int64_t k = (b * SUB + s) * 32;
            __m256i w[4], aw[4];
            for (int j = 0; j < NC; j++) {
                _mm_prefetch((const char *)(wc[j] + k * 4 + a->pf), _MM_HINT_T0);
                w[j] = _mm256_loadu_si256((const __m256i *)(wc[j] + k * 4));
                aw[j] = _mm256_sign_epi8(w[j], w[j]);
            }
            for (int i = 0; i < MR; i++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(xr[i] + k));
                for (int j = 0; j < NC; j++)
                    is[i][j] = _mm256_add_epi32(is[i][j], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(aw[j], _mm256_sign_epi8(x, w[j])), ones));
            }
        }
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NC; j++)
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[i][j]), _mm256_set1_ps(dxr[i][b]), acc[i][j]);
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NC; j++) out[i][j] = hsum8(acc[i][j]) * sw[j];
}
#endif

#ifndef CUVIL_QGEMM_AVX2
/* Portable version of both tiles: the same integer sums, one output at a time. */
static void tile_scalar(const qargs *a, int64_t m0, int64_t n0, float out[4][4]) {
    const int64_t K = a->K, nb = a->nb, blk = a->ablock;
    for (int i = 0; i < a->mr; i++)
        for (int j = 0; j < a->nc; j++) {
            int64_t m = m0 + i < a->M ? m0 + i : m0, n = n0 + j < a->N ? n0 + j : n0;
            const int8_t *x = a->xq + m * K;
            float acc = 0.f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t isum = 0;
                for (int64_t k = b * blk; k < (b + 1) * blk; k++) {
                    int w;
                    if (a->bits == 4) {
                        uint8_t byte = col_base(a, n)[(k >> 6) * 128 + (k & 31)];
                        w = (int)((k & 32) ? byte >> 4 : byte & 15) - 8;
                    } else {
                        w = ((const int8_t *)col_base(a, n))[(k >> 5) * 128 + (k & 31)];
                    }
                    isum += w * x[k];
                }
                float sw = a->bits == 4 ? col_scales(a, n)[4 * b] : 1.f;
                acc += sw * a->dx[m * nb + b] * (float)isum;
            }
            out[i][j] = a->bits == 4 ? acc : acc * a->scales[n];
        }
}
#endif

/* Task t: a block of cb columns x all rows. Rows go in MR-row tiles, and each tile visits every
 * column of the block while its quantized rows sit in L1 (the block's weights stay in L1 too). */
static void qgemm_task(void *ctx, int64_t t0, int64_t t1) {
    const qargs *a = ctx;
    float out[4][4];
    for (int64_t t = t0; t < t1; t++)
      for (int64_t m0 = 0; m0 < a->M; m0 += a->mr)
        for (int64_t n0 = t * a->cb; n0 < (t + 1) * a->cb && n0 < a->N; n0 += a->nc) {
#ifdef CUVIL_QGEMM_AVX2
            /* the tiles take MR, NC and SUB as constants: one instance per case */
#define CUVIL_QTILE(tile, MR, NC) switch (a->ablock) { case 32: tile(a, MR, NC, 1, m0, n0, out); break; \
                                                 case 64: tile(a, MR, NC, 2, m0, n0, out); break;   \
                                                 default: tile(a, MR, NC, 4, m0, n0, out); }
            if (a->bits == 4 && a->mr == 1) CUVIL_QTILE(q4_tile, 1, 4)
            else if (a->bits == 4) CUVIL_QTILE(q4_tile, 4, 1)
            else if (a->mr == 1) CUVIL_QTILE(q8_tile, 1, 4)
            else CUVIL_QTILE(q8_tile, 4, 1)
#undef CUVIL_QTILE
#else
            tile_scalar(a, m0, n0, out);
#endif
            int64_t mr = a->M - m0 < a->mr ? a->M - m0 : a->mr, nc = a->N - n0 < a->nc ? a->N - n0 : a->nc;
            for (int64_t i = 0; i < mr; i++)
                for (int64_t j = 0; j < nc; j++) {
                    int64_t o = (m0 + i) * a->ldc + n0 + j;
                    a->C[o] = out[i][j] + (a->residual ? a->residual[o] : 0.f);
                }
        }
}

/* Quantized activations live in a per-thread buffer that grows and is kept: no allocation per call. */
static __thread void *scratch;
static __thread size_t scratch_cap;

int cuvil_qgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const void *W, int bits,
                const float *scales, int64_t ablock, float *C, int64_t ldc, const float *residual, int nthreads) {
    if (M <= 0 || N <= 0) return 0;
    if (bits == 4 && M >= CUVIL_QGEMM_DEQUANT_ROWS) {
        cuvil_epilogue ep = {0, 0, residual, ldc, 1.f, 0};
        cuvil_sgemm_q4_columns(M, N, K, A, lda, W, scales, ablock, C, ldc, &ep, nthreads);
        return 0;
    }
    int64_t nb = K / ablock;
    size_t need = (size_t)(M * K + 64) + sizeof(float) * (size_t)(M * nb) + 32 * (size_t)(M * nb) + 128;
    if (need > scratch_cap) {
        free(scratch);
        scratch_cap = need + need / 4;
        scratch = malloc(scratch_cap);
        if (!scratch) { scratch_cap = 0; return 1; }
    }
    int8_t *xq = scratch;
    float *dx = (float *)(((uintptr_t)(xq + M * K) + 63) & ~(uintptr_t)63);
    void *noff = (void *)(((uintptr_t)(dx + M * nb) + 63) & ~(uintptr_t)63);
    cuvil_quantize_rows(M, K, A, lda, ablock, xq, dx);
#ifdef CUVIL_QGEMM_AVX2
    if (bits == 4) q4_offsets(M, K, ablock, xq, noff);
#endif
    int64_t wstride = bits == 4 ? K / 2 : K;
    qargs a = {M, N, K, ablock, ldc, nb, wstride, 4 * wstride, xq, dx, scales, residual, noff, W, bits,
               M == 1 ? 1 : 4, M == 1 ? 4 : 1, M == 1 ? 4 : 16, C};
    int64_t ntiles = (N + a.cb - 1) / a.cb;
    /* one row (decode, memory bound): chunks of 16 tiles (64 columns) claimed one at a time, so
     * the threads finish together (~4 chunks per thread left one idle for up to a chunk's stream at
     * the end of each projection); more rows: ~4 chunks per thread */
    if (M == 1) cuvil_parallel_chunks(N * K > 65536 ? nthreads : 1, ntiles, 16, qgemm_task, &a);
    else cuvil_parallel_for(M * N * K > 65536 ? nthreads : 1, ntiles, 1, qgemm_task, &a);
    return 0;
}
