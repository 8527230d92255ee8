#include "qgemm.h"
#include "gemm.h"
#include "pool.h"
#include "tuning.h"
#include <stdlib.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define CUVIL_QGEMM_AVX2 1
/* acc + the sums of four u8 x s8 products per 32-bit lane: one VNNI instruction where the target has
 * it (as ggml's Q4_0 x Q8_0), else maddubs and a widening madd. The same integers either way: maddubs
 * cannot saturate here (u <= 128, |s| <= 127: a pair is at most 32512). */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define CUVIL_VNNI 1
static inline __m256i dot4_add(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#elif defined(__AVXVNNI__)
#define CUVIL_VNNI 1
static inline __m256i dot4_add(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#else
static inline __m256i dot4_add(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#endif
#endif

/* ---- activation quantization ------------------------------------------------------------ */
/* One block of blk values (a multiple of 32) -> int8 at q, scale amax / 127; returns the scale and
 * (sum) the bytes' sum. */
static float quantize_block(const float *x, int64_t blk, int8_t *q, int32_t *sum) {
#ifdef CUVIL_QGEMM_AVX2
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vmax = _mm256_setzero_ps();
    for (int64_t i = 0; i < blk; i += 8)     /* max(|x|, m): a NaN leaves m, as the scalar loop below */
        vmax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), absmask), vmax);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
#else
    float amax = 0.f;
    for (int64_t i = 0; i < blk; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
#endif
    /* the numpy reference computes d and 1/d in float32 the same way */
    float dd = amax / 127.f, id = dd > 0.f ? 1.f / dd : 0.f;
#ifdef CUVIL_QGEMM_AVX2
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), ones8 = _mm256_set1_epi8(1);
    __m256i vsum = _mm256_setzero_si256();
    for (int64_t i = 0; i < blk; i += 32) {
        __m256i v[4];
        for (int u = 0; u < 4; u++)        /* round to nearest even, as np.rint */
            v[u] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * u), vid));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permutevar8x32_epi32(p, order));
        vsum = _mm256_add_epi32(vsum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), _mm256_set1_epi16(1)));
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(vsum), _mm256_extracti128_si256(vsum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    *sum = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1)));
#else
    int32_t total = 0;
    for (int64_t i = 0; i < blk; i++) total += q[i] = (int8_t)lrintf(x[i] * id);
    *sum = total;
#endif
    return dd;
}

void cuvil_quantize_rows(int64_t M, int64_t K, int64_t kv, const float *A, int64_t lda, int64_t blk, int8_t *q,
                         float *d, int32_t *xsum) {
    int64_t nb = K / blk;
    float tail[128] __attribute__((aligned(32)));      /* the last block's kv .. K, as zeros (blk <= 128) */
    for (int64_t m = 0; m < M; m++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *x = A + m * lda + b * blk;
            if ((b + 1) * blk > kv) {
                int64_t valid = kv - b * blk > 0 ? kv - b * blk : 0;
                for (int64_t i = 0; i < blk; i++) tail[i] = i < valid ? x[i] : 0.f;
                x = tail;
            }
            int32_t sum;
            d[m * nb + b] = quantize_block(x, blk, q + m * K + b * blk, &sum);
            if (xsum) xsum[m * nb + b] = sum;
        }
    }
}

/* cuvil_quantize_rows over the threads: rows [m0, m1) a task */
typedef struct { int64_t K, kv, lda, blk; const float *A; int8_t *q; float *d; int32_t *xsum; } quantize_job;

static void quantize_task(void *ctx, int64_t m0, int64_t m1) {
    const quantize_job *j = ctx;
    int64_t nb = j->K / j->blk;
    cuvil_quantize_rows(m1 - m0, j->K, j->kv, j->A + m0 * j->lda, j->lda, j->blk, j->q + m0 * j->K, j->d + m0 * nb,
                        j->xsum ? j->xsum + m0 * nb : 0);
}

/* the weight prefetch, one tile ahead (CUVIL_QGEMM_PREFETCH_HINT, _BYTES) and whether decode runs on
 * the 512-bit tiles (CUVIL_QGEMM_DECODE_512), per CPU: tuning.h, from the table in codegen/c/tuning.py. */

/* ---- the tiles: MR rows x NB blocks of eight columns, all of K ------------------------------ */
typedef struct {
    int64_t M, N, K, ablock, ldc, nb, pf;   /* nb: activation blocks per row; pf: prefetch distance (bytes) */
    int64_t nblocks;              /* blocks of eight columns */
    const int8_t *xq;
    const float *dx;
    const void *scales;           /* int4: float16 [N/32][G][32]; int8: float [N/8 * 8] */
    const cuvil_epilogue *ep;     /* bias, residual, activation (gemm.h); NULL: the plain product */
    const void *noff;             /* int4: [M][K / run] int16 x 16 starting partials (q4_offsets) */
    const uint8_t *W;
    int bits, mr, nc, cb;         /* tile rows (8: the last 1-4 rows in a tile of 4, tile_rows), tile blocks, blocks per task */
    float *C;
    const int32_t *xsum;          /* int8 on 512-bit VNNI with M > 1: [M][nb] sums of the activation bytes */
} qargs;

/* Block b of eight columns (qgemm.h): its first chunk, inside its quad; its chunks follow 128 bytes apart. */
static inline const uint8_t *q_block(const qargs *a, int64_t b) {
    return a->W + (b >> 2) * (a->K * a->bits / 8) * 32 + (b & 3) * 32;
}

/* Weight (k, n) of the eight-column layout (qgemm.h), int4 without its + 8. */
static inline int q_value(const qargs *a, int64_t k, int64_t n) {
    const uint8_t *w = q_block(a, n >> 3) + 4 * (n & 7) + (k & 3);
    if (a->bits == 8) return ((const int8_t *)w)[(k >> 2) * 128];
    uint8_t byte = w[(k >> 3) * 128];
    return (int)((k & 4) ? byte >> 4 : byte & 15) - 8;
}

#ifdef CUVIL_QGEMM_AVX2
/* A tile's rows: activations, their block scales and (int4) the int16 runs' starting values; rows
 * past M repeat row m0 (computed, not stored). */
typedef struct { const int8_t *x[8]; const float *dx[8]; const __m256i *no[8]; } qrows;
static inline __attribute__((always_inline)) qrows q_rows(const qargs *a, int MR, int64_t m0, int64_t runs) {
    qrows r;
    for (int i = 0; i < MR; i++) {
        int64_t m = m0 + i < a->M ? m0 + i : m0;
        r.x[i] = a->xq + m * a->K, r.dx[i] = a->dx + m * a->nb;
        r.no[i] = runs ? (const __m256i *)a->noff + m * runs : 0;
    }
    return r;
}

/* int4, eight columns per vector (layout in qgemm.h): a 32-bit lane is one column, so the integer
 * sums come out as a vector of eight columns (no horizontal sums) and the group's float scaling is
 * one multiply-add per eight columns. maddubs multiplies the unsigned nibbles by four activation bytes
 * broadcast to every lane; int16 partials run over at most 64 values of K (32 products per lane),
 * starting at -8 x the activations they meet (noff, made once per row): the sum is then of
 * (nibble - 8) x activation, within +-8 x 127 x 32, no saturation. With VNNI the partials are int32
 * and each pair of maddubs and adds is one dpbusd. MR rows x NB column blocks, all compile-time
 * constants; U = chunks of eight K per int16 run, UPG = runs per group. */
static inline __attribute__((always_inline)) void q4_tile(const qargs *a, int MR, int NB, int U, int UPG, int64_t m0,
                                                          int64_t b0, __m256 acc[4][4]) {
    const int64_t K = a->K, G = a->nb, runs = K / (8 * U);
    const qrows rw = q_rows(a, MR, m0, runs);
    const int8_t *const *xr = rw.x;
    const float *const *dxr = rw.dx;
    const __m256i *const *nor = rw.no;
    const uint8_t *wc[4];
    const uint16_t *sc[4];
    for (int j = 0; j < NB; j++) {
        int64_t b = b0 + j < a->nblocks ? b0 + j : b0;
        wc[j] = q_block(a, b), sc[j] = (const uint16_t *)a->scales + (b >> 2) * G * 32 + (b & 3) * 8;
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NB; j++) acc[i][j] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
#pragma GCC unroll 1
    for (int64_t g = 0; g < G; g++) {
        __m256i sum[4][4];
        for (int u = 0; u < UPG; u++) {
            const int64_t run = g * UPG + u;
            __m256i p[4][4];
            for (int i = 0; i < MR; i++) {
                __m256i no = _mm256_load_si256(nor[i] + run);
#ifdef CUVIL_VNNI
                no = _mm256_madd_epi16(no, ones);      /* VNNI: the partials are int32 from the start */
#endif
                for (int j = 0; j < NB; j++) p[i][j] = no;
            }
            for (int c = 0; c < U; c++) {
                const int64_t kc = run * U + c;      /* chunk: K values 8kc .. 8kc + 7 */
                __m256i wl[4], wh[4];
                for (int j = 0; j < NB; j++) {
                    if (NB == 1 || !(j & 1))     /* a tile of four blocks reads two lines a chunk */
                        _mm_prefetch((const char *)(wc[j] + kc * 128 + a->pf), CUVIL_QGEMM_PREFETCH_HINT);
                    __m256i w = _mm256_loadu_si256((const __m256i *)(wc[j] + kc * 128));
                    wl[j] = _mm256_and_si256(w, low4);
                    wh[j] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
                }
                for (int i = 0; i < MR; i++) {
                    const __m256i xl = _mm256_set1_epi32(*(const int32_t *)(xr[i] + kc * 8));
                    const __m256i xh = _mm256_set1_epi32(*(const int32_t *)(xr[i] + kc * 8 + 4));
                    for (int j = 0; j < NB; j++)
#ifdef CUVIL_VNNI
                        p[i][j] = dot4_add(dot4_add(p[i][j], wl[j], xl), wh[j], xh);
#else
                        p[i][j] = _mm256_add_epi16(_mm256_add_epi16(p[i][j], _mm256_maddubs_epi16(wl[j], xl)),
                                                   _mm256_maddubs_epi16(wh[j], xh));
#endif
                }
            }
            for (int i = 0; i < MR; i++)
                for (int j = 0; j < NB; j++) {
#ifdef CUVIL_VNNI
                    __m256i s32 = p[i][j];
#else
                    __m256i s32 = _mm256_madd_epi16(p[i][j], ones);
#endif
                    sum[i][j] = u ? _mm256_add_epi32(sum[i][j], s32) : s32;
                }
        }
        for (int j = 0; j < NB; j++) {
            const __m256 sw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc[j] + g * 32)));
            for (int i = 0; i < MR; i++)
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[i][j]), _mm256_mul_ps(sw, _mm256_set1_ps(dxr[i][g])),
                                            acc[i][j]);
        }
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define CUVIL_QGEMM_512 1
/* acc += the four-byte dots of u (unsigned) and s (signed), in place: GCC's intrinsic copies its
 * accumulator (its result is not tied to its input), a register move per product, and 24 of them
 * then spill (as in int8dot.c) */
#define DOT512(acc, u, s) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "vm"(s))
/* q4_tile on 512-bit vectors (VNNI): a vector is a pair of blocks side by side in their quad (sixteen
 * columns, one 64-byte line a chunk), so a chunk of a quad is two loads, four masks and four dpbusd
 * where the 256-bit tile takes twice as many. MR rows x NP pairs: a quad (NP 2) by tiles of 8 rows,
 * the last 1-4 rows in one of 4 (q_task). Every int4 GEMM of more than one row runs here: the 8-row tile
 * prefetches the next quad and reads DRAM while it multiplies, where the 6 x 64 rows tile it replaced
 * (as q8_rows512) stalled on it; a TinyLlama-shaped step at 2 threads, 16 rows 0.78x the time, 64
 * rows (a prefill chunk) 0.92-0.95x, 128 0.97x (benchmarks/README.md).
 * Decode on Zen keeps the 256-bit tile, which read DRAM faster there; Intel decodes on this one
 * (CUVIL_QGEMM_DECODE_512; numbers: benchmarks/README.md, Kernel notes). */
static inline __attribute__((always_inline)) void q4_tile512(const qargs *a, int MR, int NP, int U, int UPG,
                                                             int64_t m0, int64_t b0, __m512 acc[8][2]) {
    const int64_t K = a->K, G = a->nb, runs = K / (8 * U);
    const qrows rw = q_rows(a, MR, m0, runs);
    const int8_t *const *xr = rw.x;
    const float *const *dxr = rw.dx;
    const __m256i *const *nor = rw.no;
    const uint8_t *wc[2];
    const uint16_t *sc[2];
    for (int j = 0; j < NP; j++) {           /* a pair's second block may be the quad's padding */
        int64_t b = b0 + 2 * j < a->nblocks ? b0 + 2 * j : b0;
        wc[j] = q_block(a, b), sc[j] = (const uint16_t *)a->scales + (b >> 2) * G * 32 + (b & 3) * 8;
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NP; j++) acc[i][j] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(15);
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 1
    for (int64_t g = 0; g < G; g++) {
        __m512i sum[8][2];
        for (int u = 0; u < UPG; u++) {
            const int64_t run = g * UPG + u;
            __m512i p[8][2], q[4][2];        /* q: up to 4 rows, the high nibbles' own sums (more chains) */
            for (int i = 0; i < MR; i++) {   /* the partials start as int32 (see q4_tile) */
                __m512i no = _mm512_broadcast_i64x4(_mm256_madd_epi16(_mm256_load_si256(nor[i] + run), ones));
                for (int j = 0; j < NP; j++) p[i][j] = no;
                if (MR <= 4)
                    for (int j = 0; j < NP; j++) q[i][j] = _mm512_setzero_si512();
            }
            for (int c = 0; c < U; c++) {
                const int64_t kc = run * U + c;
                __m512i wl[2], wh[2];
                for (int j = 0; j < NP; j++) {
                    _mm_prefetch((const char *)(wc[j] + kc * 128 + a->pf), CUVIL_QGEMM_PREFETCH_HINT);
                    __m512i w = _mm512_loadu_si512((const void *)(wc[j] + kc * 128));
                    wl[j] = _mm512_and_si512(w, low4);
                    wh[j] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
                }
                for (int i = 0; i < MR; i++) {
                    const __m512i xl = _mm512_set1_epi32(*(const int32_t *)(xr[i] + kc * 8));
                    const __m512i xh = _mm512_set1_epi32(*(const int32_t *)(xr[i] + kc * 8 + 4));
                    for (int j = 0; j < NP; j++) {
                        DOT512(p[i][j], wl[j], xl);
                        if (MR <= 4) DOT512(q[i][j], wh[j], xh);
                        else DOT512(p[i][j], wh[j], xh);
                    }
                }
            }
            for (int i = 0; i < MR; i++)
                for (int j = 0; j < NP; j++) {
                    if (MR <= 4) p[i][j] = _mm512_add_epi32(p[i][j], q[i][j]);
                    sum[i][j] = u ? _mm512_add_epi32(sum[i][j], p[i][j]) : p[i][j];
                }
        }
        for (int j = 0; j < NP; j++) {
            const __m512 sw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc[j] + g * 32)));
            for (int i = 0; i < MR; i++)
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[i][j]), _mm512_mul_ps(sw, _mm512_set1_ps(dxr[i][g])),
                                            acc[i][j]);
        }
    }
}
#endif

/* -8 x the activations each int16 lane of q4_tile meets in one run (U chunks of eight K): its
 * partials' starting values, per row and run. */
static void q4_offsets(int64_t M, int64_t K, int64_t U, const int8_t *xq, __m256i *noff) {
    const __m256i eight = _mm256_set1_epi8(8);
    for (int64_t m = 0; m < M; m++)
        for (int64_t r = 0; r < K / (8 * U); r++) {
            __m256i o = _mm256_setzero_si256();
            for (int64_t kc = r * U; kc < (r + 1) * U; kc++) {
                const int8_t *x = xq + m * K + kc * 8;
                o = _mm256_sub_epi16(o, _mm256_maddubs_epi16(eight, _mm256_set1_epi32(*(const int32_t *)x)));
                o = _mm256_sub_epi16(o, _mm256_maddubs_epi16(eight, _mm256_set1_epi32(*(const int32_t *)(x + 4))));
            }
            noff[m * (K / (8 * U)) + r] = o;
        }
}

/* int8, eight columns per vector (chunks of four K): the sign trick (|w| unsigned, x with w's sign)
 * against four activation bytes broadcast to every lane, int32 sums per activation block, the
 * activation scale per block and the column scales once at the end. SUB = chunks per block. */
static inline __attribute__((always_inline)) void q8_tile(const qargs *a, int MR, int NB, int SUB, int64_t m0,
                                                          int64_t b0, __m256 acc[4][4]) {
    const int64_t nb = a->nb;
    const qrows rw = q_rows(a, MR, m0, 0);
    const int8_t *const *xr = rw.x, *wc[4];
    const float *const *dxr = rw.dx;
    for (int j = 0; j < NB; j++) {
        int64_t b = b0 + j < a->nblocks ? b0 + j : b0;
        wc[j] = (const int8_t *)q_block(a, b);
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NB; j++) acc[i][j] = _mm256_setzero_ps();
#pragma GCC unroll 1
    for (int64_t blk = 0; blk < nb; blk++) {
        __m256i is[4][4];
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NB; j++) is[i][j] = _mm256_setzero_si256();
        for (int c = 0; c < SUB; c++) {
            const int64_t kc = blk * SUB + c;         /* chunk: K values 4kc .. 4kc + 3 */
            for (int j = 0; j < NB; j++) {
                if (NB == 1 || !(j & 1)) _mm_prefetch((const char *)(wc[j] + kc * 128 + a->pf), CUVIL_QGEMM_PREFETCH_HINT);
                const __m256i w = _mm256_loadu_si256((const __m256i *)(wc[j] + kc * 128)), aw = _mm256_sign_epi8(w, w);
                for (int i = 0; i < MR; i++) {
                    const __m256i x = _mm256_set1_epi32(*(const int32_t *)(xr[i] + kc * 4));
                    is[i][j] = dot4_add(is[i][j], aw, _mm256_sign_epi8(x, w));
                }
            }
        }
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NB; j++)
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[i][j]), _mm256_set1_ps(dxr[i][blk]), acc[i][j]);
    }
    for (int j = 0; j < NB; j++) {
        int64_t b = b0 + j < a->nblocks ? b0 + j : b0;
        const __m256 sw = _mm256_loadu_ps((const float *)a->scales + b * 8);
        for (int i = 0; i < MR; i++) acc[i][j] = _mm256_mul_ps(acc[i][j], sw);
    }
}
#ifdef CUVIL_QGEMM_512
/* q8_tile on 512-bit vectors, pairs of blocks as in q4_tile512. AVX-512 has no sign_epi8, so the
 * activations go unsigned instead (x + 128, a flip of the top bit) and each block's sum over
 * (x + 128) w loses 128 x the sum of w, counted once per tile for all its rows by one more dpbusd.
 * Reached for one row (decode where CUVIL_QGEMM_DECODE_512); more rows take q8_rows512. */
static inline __attribute__((always_inline)) void q8_tile512(const qargs *a, int MR, int NP, int SUB, int64_t m0,
                                                             int64_t b0, __m512 acc[8][2]) {
    const int64_t nb = a->nb;
    const qrows rw = q_rows(a, MR, m0, 0);
    const int8_t *const *xr = rw.x, *wc[2];
    const float *const *dxr = rw.dx;
    int64_t bs[2];
    for (int j = 0; j < NP; j++) {           /* a pair's second block may be the quad's padding */
        bs[j] = b0 + 2 * j < a->nblocks ? b0 + 2 * j : b0;
        wc[j] = (const int8_t *)q_block(a, bs[j]);
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NP; j++) acc[i][j] = _mm512_setzero_ps();
    const __m512i bias = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 1
    for (int64_t blk = 0; blk < nb; blk++) {
        __m512i is[8][2], corr[2];     /* 8 rows: sized for q_task's tile, which int8 never reaches */
        for (int j = 0; j < NP; j++) {
            corr[j] = _mm512_setzero_si512();
            for (int i = 0; i < MR; i++) is[i][j] = _mm512_setzero_si512();
        }
        for (int c = 0; c < SUB; c++) {
            const int64_t kc = blk * SUB + c;         /* chunk: K values 4kc .. 4kc + 3 */
            __m512i w[2];
            for (int j = 0; j < NP; j++) {
                _mm_prefetch((const char *)(wc[j] + kc * 128 + a->pf), CUVIL_QGEMM_PREFETCH_HINT);
                w[j] = _mm512_loadu_si512((const void *)(wc[j] + kc * 128));
                corr[j] = _mm512_dpbusd_epi32(corr[j], bias, w[j]);
            }
            for (int i = 0; i < MR; i++) {
                const __m512i x = _mm512_set1_epi32(*(const int32_t *)(xr[i] + kc * 4) ^ (int32_t)0x80808080);
                for (int j = 0; j < NP; j++) is[i][j] = _mm512_dpbusd_epi32(is[i][j], x, w[j]);
            }
        }
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NP; j++)
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(is[i][j], corr[j])),
                                            _mm512_set1_ps(dxr[i][blk]), acc[i][j]);
    }
    for (int j = 0; j < NP; j++) {           /* scales are padded to whole quads */
        const __m512 sw = _mm512_loadu_ps((const float *)a->scales + bs[j] * 8);
        for (int i = 0; i < MR; i++) acc[i][j] = _mm512_mul_ps(acc[i][j], sw);
    }
}


/* int8 with more than one row (prefill, linear layers of general models) on 512-bit VNNI: MR <= 6 rows
 * x NV / 2 quads (NV vectors of 16 columns, NV = 4: 24 int32 accumulators, as int8dot.c's 6 x 64 tile;
 * q8_tile512's 4 x 32 held 8 and spent one dpbusd in five on its correction). The block's integer sums
 * live in registers, its float sums in `out` (row stride Q8_OUT_LD). The weights go unsigned (w + 128,
 * a flip of the top bit, once per load) against the signed activations broadcast from memory, so a
 * block's sum gains 128 x the row's activation sum over the block (xsum, from quantization), taken off
 * once per block and row. */
#define Q8_OUT_LD 64
static inline __attribute__((always_inline)) void q8_rows512(const qargs *a, const int MR, const int NV,
                                                             const int SUB, int64_t m0, int64_t b0, float *out) {
    const int64_t nb = a->nb, K = a->K, quad = K * 32;   /* rows K bytes apart, the two quads `quad` */
    const int8_t *x = a->xq + m0 * K, *w = (const int8_t *)q_block(a, b0);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < NV; v++) _mm512_store_ps(out + i * Q8_OUT_LD + 16 * v, _mm512_setzero_ps());
#pragma GCC unroll 1
    for (int64_t blk = 0; blk < nb; blk++) {
        __m512i is[6][4];
        for (int i = 0; i < MR; i++)
            for (int v = 0; v < NV; v++) is[i][v] = _mm512_setzero_si512();
#pragma GCC unroll 1
        for (int c = 0; c < SUB; c++, x += 4, w += 128) {    /* chunk: four K values */
            __m512i wv[4];
            for (int v = 0; v < NV; v++) {
                const int8_t *wp = w + (v >> 1) * quad + 64 * (v & 1);
                wv[v] = _mm512_xor_si512(_mm512_loadu_si512((const void *)wp), flip);
            }
            for (int i = 0; i < MR; i++) {
                const __m512i xb = _mm512_set1_epi32(*(const int32_t *)(x + i * K));
                for (int v = 0; v < NV; v++) DOT512(is[i][v], wv[v], xb);
            }
        }
        for (int i = 0; i < MR; i++) {
            const int64_t m = m0 + i;
            const __m512i lost = _mm512_set1_epi32(128 * a->xsum[m * nb + blk]);
            const __m512 dx = _mm512_set1_ps(a->dx[m * nb + blk]);
            for (int v = 0; v < NV; v++) {
                float *o = out + i * Q8_OUT_LD + 16 * v;
                _mm512_store_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(is[i][v], lost)), dx,
                                                   _mm512_load_ps(o)));
            }
        }
    }
    for (int v = 0; v < NV; v++) {           /* scales are padded to whole quads */
        const __m512 sw = _mm512_loadu_ps((const float *)a->scales + (b0 + 2 * v) * 8);
        for (int i = 0; i < MR; i++) {
            float *o = out + i * Q8_OUT_LD + 16 * v;
            _mm512_store_ps(o, _mm512_mul_ps(_mm512_load_ps(o), sw));
        }
    }
}
#endif
#else
#if defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
/* Arm with SDOT (Armv8.2 dotprod: Pi 5, Graviton 2+): the layout's 32-bit lane is one column of four
 * K values, which is what SDOT sums, so a 32-byte chunk is two SDOTs against four activation bytes
 * broadcast, giving eight columns' integer sums. int4 nibbles become value - 8 in int8 first (low
 * nibbles: K 8c..8c+3, high: 8c+4..8c+7). Same integers as tile_scalar; the float steps in its order. */
static inline void block_sums(const qargs *a, const int8_t *x, const uint8_t *w, int64_t blk, int64_t kb,
                              int32x4_t s[2]) {
    s[0] = s[1] = vdupq_n_s32(0);
    if (a->bits == 8) {
        for (int64_t c = kb / 4; c < (kb + blk) / 4; c++) {
            const int8_t *wc = (const int8_t *)w + c * 128;
            int32x4_t xb = vdupq_n_s32(*(const int32_t *)(const void *)(x + 4 * c));
            s[0] = vdotq_s32(s[0], vld1q_s8(wc), vreinterpretq_s8_s32(xb));
            s[1] = vdotq_s32(s[1], vld1q_s8(wc + 16), vreinterpretq_s8_s32(xb));
        }
        return;
    }
    const uint8x16_t low4 = vdupq_n_u8(15);
    const int8x16_t eight = vdupq_n_s8(8);
    for (int64_t c = kb / 8; c < (kb + blk) / 8; c++) {
        const uint8_t *wc = w + c * 128;
        int8x16_t xlo = vreinterpretq_s8_s32(vdupq_n_s32(*(const int32_t *)(const void *)(x + 8 * c)));
        int8x16_t xhi = vreinterpretq_s8_s32(vdupq_n_s32(*(const int32_t *)(const void *)(x + 8 * c + 4)));
        for (int h = 0; h < 2; h++) {
            uint8x16_t v = vld1q_u8(wc + 16 * h);
            s[h] = vdotq_s32(s[h], vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, low4)), eight), xlo);
            s[h] = vdotq_s32(s[h], vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight), xhi);
        }
    }
}

static void tile_dot(const qargs *a, int64_t m0, int64_t b0, float out[4][32]) {
    const int64_t K = a->K, nb = a->nb, blk = a->ablock, G = K / a->ablock;
    for (int i = 0; i < a->mr; i++) {
        int64_t m = m0 + i < a->M ? m0 + i : m0;
        const int8_t *x = a->xq + m * K;
        for (int64_t b = b0; b < b0 + a->nc && b < a->nblocks; b++) {
            const uint8_t *w = q_block(a, b);
            float32x4_t acc[2] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f)};
            for (int64_t g = 0; g < nb; g++) {
                int32x4_t s[2];
                block_sums(a, x, w, blk, g * blk, s);
                float32x4_t dx = vdupq_n_f32(a->dx[m * nb + g]);
                for (int h = 0; h < 2; h++) {
                    float32x4_t sw = a->bits == 4
                        ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)a->scales +
                                                                     ((b >> 2) * G + g) * 32 + (b & 3) * 8 + 4 * h)))
                        : vdupq_n_f32(1.f);
                    acc[h] = vaddq_f32(acc[h], vmulq_f32(vmulq_f32(sw, dx), vcvtq_f32_s32(s[h])));
                }
            }
            if (a->bits == 8)
                for (int h = 0; h < 2; h++) acc[h] = vmulq_f32(acc[h], vld1q_f32((const float *)a->scales + 8 * b + 4 * h));
            vst1q_f32(out[i] + 8 * (b - b0), acc[0]);
            vst1q_f32(out[i] + 8 * (b - b0) + 4, acc[1]);
        }
    }
}
#else
/* IEEE half -> float (the int4 scales), subnormals included. */
static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m + 1024), e - 25);
    return h >> 15 ? -v : v;
}

/* The portable tile: the same integer sums, one output at a time. */
static void tile_scalar(const qargs *a, int64_t m0, int64_t b0, float out[4][32]) {
    const int64_t K = a->K, nb = a->nb, blk = a->ablock, G = K / a->ablock;
    for (int i = 0; i < a->mr; i++)
        for (int64_t n = b0 * 8; n < (b0 + a->nc) * 8 && n < a->nblocks * 8; n++) {
            int64_t m = m0 + i < a->M ? m0 + i : m0;
            const int8_t *x = a->xq + m * K;
            float acc = 0.f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t isum = 0;
                for (int64_t k = b * blk; k < (b + 1) * blk; k++) isum += q_value(a, k, n) * x[k];
                float sw = a->bits == 4 ? half_to_float(((const uint16_t *)a->scales)[((n >> 5) * G + b) * 32 + (n & 31)]) : 1.f;
                acc += sw * a->dx[m * nb + b] * (float)isum;
            }
            out[i][n - b0 * 8] = a->bits == 4 ? acc : acc * ((const float *)a->scales)[n];
        }
}
#endif
#endif

/* Task t: blocks [t cb, (t + 1) cb) (a quad) x all rows, tiles of mr rows x nc blocks; for each tile
 * of rows the quad's blocks in turn, so the lines they share are read from memory once per quad and
 * then from the cache. */
/* A finished tile's `rows` rows from m0 into C through the epilogue: act(alpha * out + bias + residual), each term its
 * own loop (they vectorise) and the activation over the stored tile: a scalar GELU per element had
 * made an int8 MLP at 64 rows 1.2x its fp32 time where the products alone ran at 0.66x. */
static void q_store(const qargs *a, const float *out, int64_t ld, int64_t m0, int64_t rows, int64_t n0, int64_t nc) {
    const cuvil_epilogue *ep = a->ep;
    for (int64_t i = 0; i < rows; i++) {
        float *c = a->C + (m0 + i) * a->ldc + n0;
        for (int64_t j = 0; j < nc; j++) c[j] = out[i * ld + j];
        if (!ep) continue;
        float alpha = ep->alpha, br = ep->bias_row ? ep->bias_row[m0 + i] : 0.f;
        if (alpha != 1.f || br != 0.f)
            for (int64_t j = 0; j < nc; j++) c[j] = alpha * c[j] + br;
        if (ep->bias_col)
            for (int64_t j = 0; j < nc; j++) c[j] += ep->bias_col[n0 + j];
        if (ep->residual) {
            const float *r = ep->residual + (m0 + i) * ep->ldr + n0;
            for (int64_t j = 0; j < nc; j++) c[j] += r[j];
        }
    }
    if (ep && ep->act) cuvil_activate_block(a->C, a->ldc, m0, m0 + rows, n0, n0 + nc, ep->act);
}

/* Rows of the tile at m0: a->mr, but the last 1-4 rows after tiles of 8 in a tile of 4 (12 rows as
 * 8 + 4, not 8 + 8 with four repeated). */
static inline int64_t tile_rows(const qargs *a, int64_t m0) { return a->mr == 8 && a->M - m0 <= 4 ? 4 : a->mr; }

static void q_task(void *ctx, int64_t t0, int64_t t1) {
    const qargs *a = ctx;
    float out[8][32] __attribute__((aligned(64)));
    for (int64_t t = t0; t < t1; t++)
      for (int64_t m0 = 0, mr = tile_rows(a, 0); m0 < a->M; m0 += mr, mr = tile_rows(a, m0))
        for (int64_t b0 = t * a->cb; b0 < (t + 1) * a->cb && b0 < a->nblocks; b0 += a->nc) {
#ifdef CUVIL_QGEMM_AVX2
            __m256 acc[4][4];
            /* the tiles take their shape and K steps as constants: one instance per case */
#define CUVIL_QTILE(MR, NB) do {                                                                            \
                if (a->bits == 4) switch (a->ablock) { case 32: q4_tile(a, MR, NB, 4, 1, m0, b0, acc); break;  \
                                                      case 64: q4_tile(a, MR, NB, 8, 1, m0, b0, acc); break;  \
                                                      default: q4_tile(a, MR, NB, 8, 2, m0, b0, acc); }       \
                else switch (a->ablock) { case 32: q8_tile(a, MR, NB, 8, m0, b0, acc); break;                 \
                                          case 64: q8_tile(a, MR, NB, 16, m0, b0, acc); break;                \
                                          default: q8_tile(a, MR, NB, 32, m0, b0, acc); }                     \
                for (int i = 0; i < MR; i++)                                                                \
                    for (int j = 0; j < NB; j++) _mm256_store_ps(out[i] + 8 * j, acc[i][j]);                 \
            } while (0)
#ifdef CUVIL_QGEMM_512
#define CUVIL_QTILE512(MR, NP) do {                                                                         \
                __m512 acc5[8][2];                                                                          \
                if (a->bits == 4) switch (a->ablock) { case 32: q4_tile512(a, MR, NP, 4, 1, m0, b0, acc5); break; \
                                                      case 64: q4_tile512(a, MR, NP, 8, 1, m0, b0, acc5); break; \
                                                      default: q4_tile512(a, MR, NP, 8, 2, m0, b0, acc5); }      \
                else switch (a->ablock) { case 32: q8_tile512(a, MR, NP, 8, m0, b0, acc5); break;                \
                                          case 64: q8_tile512(a, MR, NP, 16, m0, b0, acc5); break;               \
                                          default: q8_tile512(a, MR, NP, 32, m0, b0, acc5); }                    \
                for (int i = 0; i < MR; i++)                                                                \
                    for (int j = 0; j < NP; j++) _mm512_store_ps(out[i] + 16 * j, acc5[i][j]);              \
            } while (0)
            if (mr == 8) CUVIL_QTILE512(8, 2);        /* int4 of more than one row (int8: rows_task512) */
            else if (mr == 4) CUVIL_QTILE512(4, 2);
            else if (CUVIL_QGEMM_DECODE_512) CUVIL_QTILE512(1, 2);
            else
#undef CUVIL_QTILE512
#endif
            if (a->mr == 1) CUVIL_QTILE(1, 4);
            else if (a->nc == 2) CUVIL_QTILE(4, 2);
            else CUVIL_QTILE(4, 1);
#undef CUVIL_QTILE
#elif defined(__ARM_FEATURE_DOTPROD)
            tile_dot(a, m0, b0, out);
#else
            tile_scalar(a, m0, b0, out);
#endif
            int64_t n0 = b0 * 8, nc = a->N - n0 < a->nc * 8 ? a->N - n0 : a->nc * 8;
            q_store(a, &out[0][0], 32, m0, a->M - m0 < mr ? a->M - m0 : mr, n0, nc);
        }
}

#ifdef CUVIL_QGEMM_512
/* int8 of more than one row on 512-bit VNNI: task t is blocks
 * [8t, 8t + 8) (two quads; the last task may hold one) x all rows, in tiles of six rows and the rows
 * left over, the weights of a task read from memory by its first tile and from the cache by the rest.
 * (Rows split evenly instead, 8 as 4 + 4: int8 at 8 rows 1.07x the time of 6 + 2, benchmarks.qgemv.) */
static void rows_task512(void *ctx, int64_t t0, int64_t t1) {
    const qargs *a = ctx;
    float out[6 * Q8_OUT_LD] __attribute__((aligned(64)));
    const int sub = (int)(a->ablock / 4);
    for (int64_t t = t0; t < t1; t++) {
        const int64_t b0 = 8 * t;
        const int two = b0 + 4 < a->nblocks;
        for (int64_t m0 = 0; m0 < a->M; m0 += 6) {
            const int64_t rows = a->M - m0 < 6 ? a->M - m0 : 6;
#define ROWS_TILE(MR) do { if (two) q8_rows512(a, MR, 4, sub, m0, b0, out);                                 \
                           else q8_rows512(a, MR, 2, sub, m0, b0, out); } while (0)
            switch (rows) {
            case 1: ROWS_TILE(1); break;
            case 2: ROWS_TILE(2); break;
            case 3: ROWS_TILE(3); break;
            case 4: ROWS_TILE(4); break;
            case 5: ROWS_TILE(5); break;
            default: ROWS_TILE(6);
            }
#undef ROWS_TILE
            int64_t n0 = b0 * 8, nc = a->N - n0 < 64 ? a->N - n0 : 64;
            q_store(a, out, Q8_OUT_LD, m0, rows, n0, nc);
        }
    }
}
#endif

/* Blocks in a prefill tile of 4 rows (256-bit tiles): two, side by side in the quad, read whole
 * 64-byte lines (benchmarks/README.md, Kernel notes). With 512-bit VNNI a tile takes a whole quad
 * (q4_tile512, q8_tile512). */
/* (CUVIL_QGEMM_PREFILL_BLOCKS per CPU: tuning.h) */
/* Quantized activations live in a per-thread buffer that grows and is kept: no allocation per call. */

int cuvil_qgemm(int64_t M, int64_t N, int64_t K, int64_t kv, const float *A, int64_t lda, const void *W, int bits,
                const void *scales, int64_t ablock, float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads) {
    if (M <= 0 || N <= 0) return 0;
    int64_t nb = K / ablock, run = ablock < 64 ? ablock : 64;      /* int4: K values per int16 run */
    size_t need = (size_t)(M * K + 64) + sizeof(float) * (size_t)(M * nb) + 32 * (size_t)(M * (K / run)) + 128;
    void *scratch = cuvil_thread_buffer(CUVIL_BUF_QSCRATCH, need);
    if (!scratch) return 1;
    int8_t *xq = scratch;
    float *dx = (float *)(((uintptr_t)(xq + M * K) + 63) & ~(uintptr_t)63);
    void *noff = (void *)(((uintptr_t)(dx + M * nb) + 63) & ~(uintptr_t)63);
#ifdef CUVIL_QGEMM_512
    /* int8 rows on q8_rows512 (int4 rows stay on q4_tile512's quads); noff's room holds the activation sums */
    int32_t *xsum = M > 1 && bits == 8 ? noff : 0;
#else
    int32_t *xsum = 0;
#endif
    quantize_job qj = {K, kv, lda, ablock, A, xq, dx, xsum};
    cuvil_parallel_for(M * K >= 1 << 15 ? nthreads : 1, M, 1, quantize_task, &qj);
#ifdef CUVIL_QGEMM_512
    if (xsum) {      /* rows on 512-bit VNNI: tasks of two quads (rows_task512); no software prefetch
                      * (the same time without it: MLP b64 in int8, benchmarks.ab) */
        int64_t nblocks = (N + 7) / 8, tasks = (nblocks + 7) / 8;
        qargs a = {M, N, K, ablock, ldc, nb, 0, nblocks, xq, dx, scales, ep, noff, W, bits, 6, 8, 8, C, xsum};
        cuvil_parallel_for(M * N * K > 65536 ? nthreads : 1, tasks, 1, rows_task512, &a);
        return 0;
    }
#endif
#ifdef CUVIL_QGEMM_AVX2
    if (bits == 4) q4_offsets(M, K, run / 8, xq, noff);
#endif
    /* Tasks are quads (qgemm.h: four blocks, 32 columns, read as one stream). One row (decode, memory
     * bound): a tile is a quad, one equal run of quads a thread, so each thread reads one stretch of
     * memory and its prefetch (one quad ahead; on Intel 2 KB) stays in its own stretch. Claimed two tiles at a time,
     * the threads took turns, and each prefetched the tile the other would read (benchmarks/README.md,
     * Kernel notes). More rows: tiles of 4 rows x nc blocks (512-bit VNNI, int4: 8 rows, the last 1-4 in a
     * tile of 4), a quad per task. */
    int64_t nblocks = (N + 7) / 8, quad_bytes = 4 * K * bits;
    int64_t pf = M == 1 && CUVIL_QGEMM_PREFETCH_BYTES ? CUVIL_QGEMM_PREFETCH_BYTES : quad_bytes;
    int64_t nc = M == 1 ? 4 : CUVIL_QGEMM_PREFILL_BLOCKS;
#ifdef CUVIL_QGEMM_512
    /* 5-8 rows one tile of 8, which unpacks each chunk's nibbles once where two of 4 unpacked them twice
     * (8 rows: 0.85x the decode step). 2 and 3 rows stay on the tile of 4: from cache a tile of 2 is 0.83x
     * its time, but from DRAM the decode step took 1.06-1.08x (benchmarks/README.md) */
    const int mr = M == 1 ? 1 : M > 4 ? 8 : 4;
#else
    const int mr = M == 1 ? 1 : 4;
#endif
    qargs a = {M, N, K, ablock, ldc, nb, pf, nblocks, xq, dx, scales, ep, noff, W, bits, mr, (int)nc, 4, C, 0};
    int64_t nquads = (nblocks + 3) / 4, work = M * N * K > 65536;
    if (M == 1) cuvil_parallel_chunks(work ? nthreads : 1, nquads, (nquads + nthreads - 1) / nthreads, q_task, &a);
    else cuvil_parallel_for(work ? nthreads : 1, nquads, 1, q_task, &a);
    return 0;
}
