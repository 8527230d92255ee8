#include "gemm.h"
#include "half.h"
#include "lanes.h"
#include "pool.h"
#include "vmath.h"
#include "tuning.h"
#include <stdlib.h>

typedef struct { int64_t K, N; const float *B; int64_t ldb; int trans; float *Bp; } pack_args;

static void pack_task(void *ctx, int64_t p0, int64_t p1) {
    const pack_args *a = ctx;
    int64_t K = a->K, N = a->N, ldb = a->ldb;
    for (int64_t p = p0; p < p1; p++) {
        float *dst = a->Bp + p * K * CUVIL_NR;
        int64_t n0 = p * CUVIL_NR, nr = N - n0 < CUVIL_NR ? N - n0 : CUVIL_NR;
        if (!a->trans && nr == CUVIL_NR) {     /* a whole panel in vectors: the element loop ran at ~3 GB/s */
            for (int64_t k = 0; k < K; k++) {
                const float *src = a->B + k * ldb + n0;
                cuvil_vstore(dst + k * CUVIL_NR, cuvil_vload(src));
                cuvil_vstore(dst + k * CUVIL_NR + CUVIL_VL, cuvil_vload(src + CUVIL_VL));
            }
        } else if (!a->trans) {
            for (int64_t k = 0; k < K; k++) {
                const float *src = a->B + k * ldb + n0;
                int64_t j = 0;
                for (; j < nr; j++) dst[k * CUVIL_NR + j] = src[j];
                for (; j < CUVIL_NR; j++) dst[k * CUVIL_NR + j] = 0.f;
            }
        } else {
            for (int64_t k = 0; k < K; k++)
                for (int64_t j = nr; j < CUVIL_NR; j++) dst[k * CUVIL_NR + j] = 0.f;
            for (int64_t j = 0; j < nr; j++) {
                const float *src = a->B + (n0 + j) * ldb;
                for (int64_t k = 0; k < K; k++) dst[k * CUVIL_NR + j] = src[k];
            }
        }
    }
}

void cuvil_pack_b(int64_t K, int64_t N, const float *B, int64_t ldb, int trans, float *Bp, int nthreads) {
    int64_t np = (N + CUVIL_NR - 1) / CUVIL_NR;
    pack_args a = {K, N, B, ldb, trans, Bp};
    cuvil_parallel_for(np * K > CUVIL_PACK_B_PARALLEL_MIN ? nthreads : 1, np, 1, pack_task, &a);
}

/* A span of bytes (the part of B to prefetch while a tile computes). */
typedef struct { const char *p; int64_t n; } byte_run;

/* One K step of the register tile: row i of A times the nv (1 or 2) B vectors. A is packed
 * ([k][MR]) where lda is 0, else its rows are read in place, lda floats apart. */
static inline __attribute__((always_inline)) void ukernel_step(int mr, int nv, int64_t k, const float *Ap,
                                                                int64_t lda, const float *Bp, int64_t ldb,
                                                                cuvil_vf c0[CUVIL_MR], cuvil_vf c1[CUVIL_MR]) {
    cuvil_vf b0 = cuvil_vload(Bp + k * ldb), b1 = nv > 1 ? cuvil_vload(Bp + k * ldb + CUVIL_VL) : b0;
    /* unrolled early (with finish_tile's row loop), so GCC keeps the tile in 12 registers: left to
     * its late unroller, it rotated accumulators and re-read B (benchmarks/README.md, Kernel notes) */
    #pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
        cuvil_vf a = cuvil_vsplat(lda ? Ap[i * lda + k] : Ap[k * CUVIL_MR + i]);
        c0[i] += a * b0;
        if (nv > 1) c1[i] += a * b1;
    }
}

/* MR x NR register tile over one K block of packed A ([k][MR], see pack_a), left in registers c0/c1
 * (columns [0, VL) and [VL, NR)); rows past mr are copies of the tile's first row. */
static inline __attribute__((always_inline)) void ukernel_loop(int mr, int nv, int64_t kc, const float *Ap, int64_t lda,
                                                                const float *Bp, int64_t ldb,
                                                                cuvil_vf c0[CUVIL_MR], cuvil_vf c1[CUVIL_MR],
                                                                const char *pf, int64_t pf_bytes, int spread) {
    /* unrolled here, or GCC turns the zeroing into memset calls on a stack copy it never reads
     * (two calls per tile: 2-3% of a 1024^3 GEMM) */
    #pragma GCC unroll 8
    for (int i = 0; i < mr; i++) { c0[i] = cuvil_vsplat(0.f); c1[i] = cuvil_vsplat(0.f); }
    int64_t k = 0;
    /* one line of pf toward L2 per 8 steps: spread out, the prefetches of the next B block reach
     * DRAM; as one burst before the tile, most were lost. Steps in eights keep the test out of the
     * inner loop. */
    /* spread: as many lines per 8 steps as cover the slice (few tiles, small M: each carries a third
     * of the next block). Its own loop, in its own copy of the tile (benchmarks/README.md, Kernel notes) */
    const int64_t gb = (kc / 8) * 64;
    const int64_t per = !spread || pf_bytes <= gb ? 1 : pf_bytes <= 2 * gb ? 2 : pf_bytes <= 3 * gb ? 3 : 4;
    if (!spread)
        for (; k + 8 <= kc; k += 8) {
            if ((k << 3) < pf_bytes) __builtin_prefetch(pf + (k << 3), 0, 1);
            #pragma GCC unroll 8
            for (int u = 0; u < 8; u++) ukernel_step(mr, nv, k + u, Ap, lda, Bp, ldb, c0, c1);
        }
    else
        for (; k + 8 <= kc; k += 8) {
            for (int64_t u = 0, b = (k / 8) * per * 64; u < per && b < pf_bytes; u++, b += 64)
                __builtin_prefetch(pf + b, 0, 1);
            #pragma GCC unroll 8
            for (int u = 0; u < 8; u++) ukernel_step(mr, nv, k + u, Ap, lda, Bp, ldb, c0, c1);
        }
    for (; k < kc; k++) ukernel_step(mr, nv, k, Ap, lda, Bp, ldb, c0, c1);
    for (int64_t b = (kc / 8) * per * 64; b < pf_bytes; b += 64) __builtin_prefetch(pf + b, 0, 1);  /* the rest */
}

/* One row (GEMV, batch-1 decode) over S panels at once, fp32 or bf16 (bf16 is the high half of an
 * fp32, widened in registers). Memory bound: S concurrent sequential streams keep more DRAM reads in
 * flight than one (where software prefetch pays on top of them, gemv_panels says). Six, the most whose
 * 12 accumulators stay in AVX2 registers (benchmarks/README.md, Kernel notes). */
/* A bf16 panel row of NR columns, packed so 32-bit lane e holds column e (low half) and column
 * e + VL (high half): one load and two bit operations give both fp32 vectors. */
static inline void cuvil_vload_bf16_pair(const uint16_t *p, cuvil_vf *lo, cuvil_vf *hi) {
    cuvil_vu32 w = *(const cuvil_vu32 *)p;
    *lo = (cuvil_vf)(w << 16);
    *hi = (cuvil_vf)(w & 0xffff0000u);
}
/* Bytes per weight of a B format (gemm.h: the bits, or CUVIL_B_FP16). */
static inline int b_bytes(int bits) { return bits == CUVIL_B_FP16 ? 2 : bits / 8; }
static inline void gemv_load(const void *B, int bits, int64_t i, cuvil_vf *lo, cuvil_vf *hi) {
    if (bits == 16) cuvil_vload_bf16_pair((const uint16_t *)B + i, lo, hi);
    else if (bits == CUVIL_B_FP16)
        *lo = cuvil_vload_f16((const uint16_t *)B + i), *hi = cuvil_vload_f16((const uint16_t *)B + i + CUVIL_VL);
    else *lo = cuvil_vload((const float *)B + i), *hi = cuvil_vload((const float *)B + i + CUVIL_VL);
}

/* CUVIL_GEMV_STREAMS, CUVIL_GEMV_DRAM_STREAMS and the software prefetch (bytes ahead, locality hint,
 * fp32 too; see gemv_panels) per CPU: tuning.h, from the table in codegen/c/tuning.py. */
static inline __attribute__((always_inline)) void gemv_panels(int S, int bits, int prefetch, int64_t K, const float *A,
                                                              const void *B, float acc[][CUVIL_MR][CUVIL_NR]) {
    /* one stream alone keeps its two K steps in two accumulator pairs, out of each other's way */
    cuvil_vf c[CUVIL_GEMV_STREAMS][2];
    for (int s = 0; s < (S == 1 ? 2 : S); s++) c[s][0] = c[s][1] = cuvil_vsplat(0.f);
    int64_t k = 0;
    /* Two K steps per round, and a software prefetch of each stream's lines some way ahead (per CPU:
     * tuning.h). bf16 costs ~6 vector instructions per 32 bytes where fp32's costs 2 per 64, so the
     * out-of-order window alone held a quarter of the bytes in flight. fp32 weights held in the
     * last-level cache (`prefetch` 0: gemm_args.b_cached) go without (benchmarks/README.md, Kernel notes). */
    if (bits != 32 || (CUVIL_GEMV_PREFETCH_FP32 && prefetch))
        for (; k + 2 <= K; k += 2) {
            for (int s = 0; s < S; s++)
                for (int line = 0; line < 2 * CUVIL_NR * b_bytes(bits); line += 64)
                    __builtin_prefetch((const char *)B + (s * K + k) * CUVIL_NR * b_bytes(bits) + line +
                                       (bits != 32 ? CUVIL_GEMV_PREFETCH_BF16 : CUVIL_GEMV_PREFETCH),
                                       0, CUVIL_GEMV_PREFETCH_HINT);
            #pragma GCC unroll 2
            for (int u = 0; u < 2; u++) {
                cuvil_vf a = cuvil_vsplat(A[k + u]);
                for (int s = 0; s < S; s++) {
                    cuvil_vf lo, hi;
                    gemv_load(B, bits, (s * K + k + u) * CUVIL_NR, &lo, &hi);
                    c[S == 1 ? u : s][0] += a * lo;
                    c[S == 1 ? u : s][1] += a * hi;
                }
            }
        }
    if (S == 1) c[0][0] += c[1][0], c[0][1] += c[1][1];
    for (; k < K; k++) {
        cuvil_vf a = cuvil_vsplat(A[k]);
        for (int s = 0; s < S; s++) {
            cuvil_vf lo, hi;
            gemv_load(B, bits, (s * K + k) * CUVIL_NR, &lo, &hi);
            c[s][0] += a * lo;
            c[s][1] += a * hi;
        }
    }
    for (int s = 0; s < S; s++) { cuvil_vstore(acc[s][0], c[s][0]); cuvil_vstore(acc[s][0] + CUVIL_VL, c[s][1]); }
}

#if defined(__AVX2__) && CUVIL_MR == 6
#include <immintrin.h>
/* Eight columns k..k+7 of six rows into [8][6] (AVX2 targets): two unpacks and a shuffle put rows 0-3 of column k
 * in one 128-bit half, an unpack pairs rows 4-5; a 16- and an 8-byte store per column. */
static inline void pack_a_8k(const float *const rows[6], int64_t k, float *dst) {
    __m256 r[6];
    for (int i = 0; i < 6; i++) r[i] = _mm256_loadu_ps(rows[i] + k);
    __m256 t01l = _mm256_unpacklo_ps(r[0], r[1]), t01h = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t23l = _mm256_unpacklo_ps(r[2], r[3]), t23h = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 p45[2] = {_mm256_unpacklo_ps(r[4], r[5]), _mm256_unpackhi_ps(r[4], r[5])};  /* columns 0,1|4,5 and 2,3|6,7 */
    __m256 q[4] = {_mm256_shuffle_ps(t01l, t23l, 0x44), _mm256_shuffle_ps(t01l, t23l, 0xee),   /* columns 0|4, 1|5 */
                   _mm256_shuffle_ps(t01h, t23h, 0x44), _mm256_shuffle_ps(t01h, t23h, 0xee)};  /* columns 2|6, 3|7 */
    for (int c = 0; c < 8; c++) {
        int half = c >= 4, j = c & 3;
        __m128 rows03 = half ? _mm256_extractf128_ps(q[j], 1) : _mm256_castps256_ps128(q[j]);
        __m128 pair = half ? _mm256_extractf128_ps(p45[j >> 1], 1) : _mm256_castps256_ps128(p45[j >> 1]);
        _mm_storeu_ps(dst + c * 6, rows03);
        if (j & 1) _mm_storeh_pi((__m64 *)(dst + c * 6 + 4), pair);
        else _mm_storel_pi((__m64 *)(dst + c * 6 + 4), pair);
    }
}
#define CUVIL_PACK_A_8K 1
#endif

#if defined(__AVX2__) && CUVIL_MR == 8
#include <immintrin.h>
/* Eight columns k..k+7 of eight rows into [8][8]: the 8x8 transpose of unpacks, shuffles and 128-bit
 * lane swaps, one whole-vector store per column. */
static inline void pack_a_8x8(const float *const rows[8], int64_t k, float *dst) {
    __m256 r[8], t[8], s[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(rows[i] + k);
    for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    for (int h = 0; h < 8; h += 4) {       /* rows h..h+3 of columns 0|4, 1|5, 2|6, 3|7 */
        s[h] = _mm256_shuffle_ps(t[h], t[h + 2], 0x44), s[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], 0xee);
        s[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0x44), s[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0xee);
    }
    for (int c = 0; c < 4; c++) {
        _mm256_storeu_ps(dst + c * 8, _mm256_permute2f128_ps(s[c], s[c + 4], 0x20));
        _mm256_storeu_ps(dst + (c + 4) * 8, _mm256_permute2f128_ps(s[c], s[c + 4], 0x31));
    }
}
#define CUVIL_PACK_A_8X8 1
#endif

/* Rows [i0, i1) (at most MR) x columns [k0, k0 + kc) of A as one tile [kc][MR] (rows past i1
 * repeat row i0): the micro-kernel then reads A in one sequential stream instead of MR rows lda
 * apart, which alias in L1 when lda is a multiple of 1024 floats. Eight columns at a time where
 * the target has the transpose (the scalar loop cost 3% of MiniLM at 1 thread, 13% of the main
 * thread at 2, reading rows the other core had just written). */
static void pack_a(const float *A, int64_t lda, int64_t i0, int64_t i1, int64_t k0, int64_t kc, float *Ap) {
    const float *rows[CUVIL_MR];
    for (int i = 0; i < CUVIL_MR; i++) rows[i] = A + (i0 + i < i1 ? i0 + i : i0) * lda + k0;
    int64_t k = 0;
#ifdef CUVIL_PACK_A_8X8
    for (; k + 8 <= kc; k += 8) pack_a_8x8(rows, k, Ap + k * CUVIL_MR);
#endif
#ifdef CUVIL_PACK_A_8K
    for (; k + 8 <= kc; k += 8) pack_a_8k(rows, k, Ap + k * CUVIL_MR);
#endif
    for (; k < kc; k++)
        for (int i = 0; i < CUVIL_MR; i++) Ap[k * CUVIL_MR + i] = rows[i][k];
}

/* The same tile from A given transposed (A[m][k] = At[k * lda + m]): each K step copies MR consecutive
 * floats, so a 1x1 conv's NCHW input serves as the A of (pixels x channels) with no transpose first. */
static void pack_at(const float *At, int64_t lda, int64_t i0, int64_t i1, int64_t k0, int64_t kc, float *Ap) {
    int mr = (int)(i1 - i0);
    for (int64_t k = 0; k < kc; k++) {
        const float *src = At + (k0 + k) * lda + i0;
        float *d = Ap + k * CUVIL_MR;
        if (mr == CUVIL_MR)
            for (int i = 0; i < CUVIL_MR; i++) d[i] = src[i];
        else
            for (int i = 0; i < CUVIL_MR; i++) d[i] = src[i < mr ? i : 0];
    }
}

/* n <= VL floats at p: the edge panel of a GEMM whose N is no multiple of NR (a 14x14 conv's 196 columns)
 * stays on the register path with lanes.h's masked loads, not round through a buffer */
static inline cuvil_vf load_n(const float *p, int64_t n) { return n >= CUVIL_VL ? cuvil_vload(p) : cuvil_vload_first(p, n); }

/* One vector of a finished tile (its first n lanes real): the partial sums plus what C holds (after
 * the first K block), and on the last K block the epilogue. */
static inline cuvil_vf tile_vector(cuvil_vf v, const float *cin, const float *bin, const float *rin, int first,
                                   int last, float alpha, float br, int act, int64_t n) {
    if (!first) v += load_n(cin, n);
    if (last) {
        v = v * alpha + br;
        if (bin) v += load_n(bin, n);
        if (rin) v += load_n(rin, n);
        if (act) v = cuvil_vact(v, act);
    }
    return v;
}

/* Writes one MR x NR tile: raw partial sums for early K blocks, the epilogue on the last, in
 * vectors (a scalar epilogue would cost as much as the product itself when K is small). */
static inline void store_tile(float acc[CUVIL_MR][CUVIL_NR], int mr, int64_t nr, float *C, int64_t ldc,
                              int64_t i0, int64_t n0, int first, int last, const cuvil_epilogue *ep) {
    const float alpha = ep ? ep->alpha : 1.f;
    const int act = ep ? ep->act : 0;
    const float *bc = last && ep && ep->bias_col ? ep->bias_col + n0 : 0;
    for (int i = 0; i < mr; i++) {
        float *c = C + (i0 + i) * ldc + n0;
        const float *rs = last && ep && ep->residual ? ep->residual + (i0 + i) * ep->ldr + n0 : 0;
        const float br = last && ep && ep->bias_row ? ep->bias_row[i0 + i] : 0.f;
        for (int64_t j = 0; j < nr; j += CUVIL_VL) {
            int64_t w = nr - j < CUVIL_VL ? nr - j : CUVIL_VL;
            const float *cin = c + j, *bin = bc ? bc + j : 0, *rin = rs ? rs + j : 0;
            cuvil_vf v = cuvil_vload(acc[i] + j);
            if (w == CUVIL_VL) {
                cuvil_vstore(c + j, tile_vector(v, cin, bin, rin, first, last, alpha, br, act, CUVIL_VL));
                continue;
            }
            /* a partial vector goes through buffers: padded lanes are computed and dropped */
            float cbuf[CUVIL_VL], bbuf[CUVIL_VL], rbuf[CUVIL_VL], tmp[CUVIL_VL] __attribute__((aligned(64)));
            for (int64_t u = 0; u < CUVIL_VL; u++) {
                cbuf[u] = u < w && !first ? c[j + u] : 0.f;
                bbuf[u] = u < w && bc ? bc[j + u] : 0.f;
                rbuf[u] = u < w && rs ? rs[j + u] : 0.f;
            }
            cuvil_vstore(tmp, tile_vector(v, cbuf, bin ? bbuf : 0, rin ? rbuf : 0, first, last, alpha, br, act, CUVIL_VL));
            for (int64_t u = 0; u < w; u++) c[j + u] = tmp[u];
        }
    }
}

/* The registers of a tile into C, its first mr rows and nr columns; always inlined with first, last,
 * act and nr as constants where they are known, so that the tests and the activation's switch leave
 * the per-vector code (for shallow K, a 1x1 conv's 64-deep tile, the generic form of this store was
 * 30% of the conv's time). */
static inline __attribute__((always_inline)) void finish_tile(int mr, cuvil_vf c0[CUVIL_MR], cuvil_vf c1[CUVIL_MR],
                                                              float *C, int64_t ldc, int64_t i0, int64_t n0,
                                                              int first, int last, const cuvil_epilogue *ep, int act,
                                                              int64_t nr) {
    const float alpha = last && ep ? ep->alpha : 1.f;
    const float *bc = last && ep && ep->bias_col ? ep->bias_col + n0 : 0;
    const float *res = last && ep ? ep->residual : 0, *brow = last && ep ? ep->bias_row : 0;
    const int64_t n1 = nr < CUVIL_VL ? nr : CUVIL_VL, n2 = nr - n1;
    #pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
        float *c = C + (i0 + i) * ldc + n0;
        const float *rs = res ? res + (i0 + i) * ep->ldr + n0 : 0;
        const float br = brow ? brow[i0 + i] : 0.f;
        cuvil_vf v0 = tile_vector(c0[i], c, bc, rs, first, last, alpha, br, act, n1);
        if (n1 == CUVIL_VL) cuvil_vstore(c, v0);
        else cuvil_vstore_first(c, v0, n1);
        if (n2 <= 0) continue;
        cuvil_vf v1 = tile_vector(c1[i], c + CUVIL_VL, bc ? bc + CUVIL_VL : 0, rs ? rs + CUVIL_VL : 0, first, last,
                                  alpha, br, act, n2);
        if (n2 == CUVIL_VL) cuvil_vstore(c + CUVIL_VL, v1);
        else cuvil_vstore_first(c + CUVIL_VL, v1, n2);
    }
}

/* A full MR x NR tile finished straight from the registers: the round trip of the partial sums
 * through acc and store_tile cost ~10% of a 1024^3 GEMM (its C loads wait on the acc stores). */
static inline __attribute__((always_inline)) void full_tile(int64_t kc, const float *Ap, int64_t lda, const float *Bp, int64_t ldb, float *C,
                                                           int64_t ldc, int64_t i0, int64_t n0, int first, int last,
                                                           const cuvil_epilogue *ep, byte_run pf, int spread) {
    cuvil_vf c0[CUVIL_MR], c1[CUVIL_MR];
    ukernel_loop(CUVIL_MR, 2, kc, Ap, lda, Bp, ldb, c0, c1, pf.p, pf.n, spread);
    int act = last && ep ? ep->act : 0;
    if (!last && first) finish_tile(CUVIL_MR, c0, c1, C, ldc, i0, n0, 1, 0, ep, 0, CUVIL_NR);
    else if (!last) finish_tile(CUVIL_MR, c0, c1, C, ldc, i0, n0, 0, 0, ep, 0, CUVIL_NR);
    else if (act == CUVIL_ACT_NONE && first) finish_tile(CUVIL_MR, c0, c1, C, ldc, i0, n0, 1, 1, ep, CUVIL_ACT_NONE, CUVIL_NR);
    else if (act == CUVIL_ACT_RELU && first) finish_tile(CUVIL_MR, c0, c1, C, ldc, i0, n0, 1, 1, ep, CUVIL_ACT_RELU, CUVIL_NR);
    else finish_tile(CUVIL_MR, c0, c1, C, ldc, i0, n0, first, 1, ep, act, CUVIL_NR);
}
static void ukernel_full_tile(int64_t kc, const float *Ap, const float *Bp, float *C, int64_t ldc, int64_t i0,
                              int64_t n0, int first, int last, const cuvil_epilogue *ep, byte_run pf) {
    full_tile(kc, Ap, 0, Bp, CUVIL_NR, C, ldc, i0, n0, first, last, ep, pf, 0);
}
static void ukernel_full_tile_spread(int64_t kc, const float *Ap, const float *Bp, float *C, int64_t ldc, int64_t i0,
                                     int64_t n0, int first, int last, const cuvil_epilogue *ep, byte_run pf) {
    full_tile(kc, Ap, 0, Bp, CUVIL_NR, C, ldc, i0, n0, first, last, ep, pf, 1);
}
/* A's rows read in place, lda floats apart (gemm_driver: a_rows), with no pack before the product. */
static void ukernel_full_tile_rows(int64_t kc, const float *A, int64_t lda, const float *Bp, float *C, int64_t ldc,
                                   int64_t i0, int64_t n0, int first, int last, const cuvil_epilogue *ep, byte_run pf) {
    full_tile(kc, A, lda, Bp, CUVIL_NR, C, ldc, i0, n0, first, last, ep, pf, 0);
}
static void ukernel_full_tile_rows_spread(int64_t kc, const float *A, int64_t lda, const float *Bp, float *C,
                                          int64_t ldc, int64_t i0, int64_t n0, int first, int last,
                                          const cuvil_epilogue *ep, byte_run pf) {
    full_tile(kc, A, lda, Bp, CUVIL_NR, C, ldc, i0, n0, first, last, ep, pf, 1);
}
/* B read in place, ldb floats between its rows (cuvil_sgemm_strided_b): its own copy, so the packed
 * tiles keep their constant stride. */
static void ukernel_full_tile_strided(int64_t kc, const float *Ap, const float *Bp, int64_t ldb, float *C,
                                      int64_t ldc, int64_t i0, int64_t n0, int first, int last,
                                      const cuvil_epilogue *ep) {
    full_tile(kc, Ap, 0, Bp, ldb, C, ldc, i0, n0, first, last, ep, (byte_run){0, 0}, 0);
}

/* The same for the tiles at the edges (mr < MR rows or nr < NR columns), in their own function so
 * the full tile's code stays as it was; not through a buffer and store_tile element by element
 * (benchmarks/README.md, Kernel notes). */
static inline __attribute__((always_inline)) void edge_tile_rows(int mr, int nv, int64_t kc, const float *Ap, const float *Bp, int64_t ldb,
                                                                 float *C, int64_t ldc, int64_t i0, int64_t n0,
                                                                 int64_t nr, int first, int last,
                                                                 const cuvil_epilogue *ep, byte_run pf) {
    cuvil_vf c0[CUVIL_MR], c1[CUVIL_MR];
    ukernel_loop(mr, nv, kc, Ap, 0, Bp, ldb, c0, c1, pf.p, pf.n, 1);
    finish_tile(mr, c0, c1, C, ldc, i0, n0, first, last, ep, last && ep ? ep->act : 0, nr);
}

static void ukernel_edge_tile(int mr, int64_t kc, const float *Ap, const float *Bp, int64_t ldb, float *C, int64_t ldc, int64_t i0,
                              int64_t n0, int64_t nr, int first, int last, const cuvil_epilogue *ep, byte_run pf) {
    /* constants for the compiler: the register tile unrolls per case; a panel of at most VL columns
     * (the last of a 7x7 conv's 49) multiplies one B vector, not two */
    #define EDGE(R) case 2 * R: edge_tile_rows(R, 2, kc, Ap, Bp, ldb, C, ldc, i0, n0, nr, first, last, ep, pf); break; \
                    case 2 * R + 1: edge_tile_rows(R, 1, kc, Ap, Bp, ldb, C, ldc, i0, n0, nr, first, last, ep, pf); break;
    switch (mr * 2 + (nr <= CUVIL_VL)) {
    EDGE(1) EDGE(2) EDGE(3) EDGE(4) EDGE(5)
#if CUVIL_MR > 6
    EDGE(6) EDGE(7)
#endif
    case 2 * CUVIL_MR + 1: edge_tile_rows(CUVIL_MR, 1, kc, Ap, Bp, ldb, C, ldc, i0, n0, nr, first, last, ep, pf); break;
    default: edge_tile_rows(CUVIL_MR, 2, kc, Ap, Bp, ldb, C, ldc, i0, n0, nr, first, last, ep, pf); break;
    #undef EDGE
    }
}

/* The lines of C and of the residual that the tile's store will touch, requested before its K loop
 * runs: left to the store, each was a miss to DRAM the next tile could not hide (benchmarks/README.md,
 * Kernel notes). The two ends of each row's run cover it. */
static inline void prefetch_tile_output(int mr, int64_t nr, float *C, int64_t ldc, int64_t i0, int64_t n0, int last,
                                        const cuvil_epilogue *ep) {
    const float *res = last && ep ? ep->residual : 0;
    for (int i = 0; i < mr; i++) {
        __asm__ volatile("");      /* GCC deletes a loop of nothing but prefetches as empty */
        float *c = C + (i0 + i) * ldc + n0;
        __builtin_prefetch(c, 1, 3);
        __builtin_prefetch(c + nr - 1, 1, 3);
        if (res) {
            const float *r = res + (i0 + i) * ep->ldr + n0;
            __builtin_prefetch(r, 0, 3);
            __builtin_prefetch(r + nr - 1, 0, 3);
        }
    }
}

/* One tile of mr rows x nr columns over a K block, finished into C. A packed, or where lda is not 0
 * its rows in place (full tiles of packed B only: gemm_task). */
static inline void ukernel_tile(int mr, int64_t nr, int64_t kc, const float *Ap, int64_t lda, const float *Bp,
                                int64_t ldb, float *C, int64_t ldc, int64_t i0, int64_t n0, int first, int last,
                                const cuvil_epilogue *ep, byte_run pf) {
    prefetch_tile_output(mr, nr, C, ldc, i0, n0, last, ep);
    if (lda) {
        if (pf.n > (kc / 8) * 64) ukernel_full_tile_rows_spread(kc, Ap, lda, Bp, C, ldc, i0, n0, first, last, ep, pf);
        else ukernel_full_tile_rows(kc, Ap, lda, Bp, C, ldc, i0, n0, first, last, ep, pf);
        return;
    }
    if (kc > 0 && mr == CUVIL_MR && nr == CUVIL_NR) {
        if (ldb != CUVIL_NR) ukernel_full_tile_strided(kc, Ap, Bp, ldb, C, ldc, i0, n0, first, last, ep);
        else if (pf.n > (kc / 8) * 64) ukernel_full_tile_spread(kc, Ap, Bp, C, ldc, i0, n0, first, last, ep, pf);
        else ukernel_full_tile(kc, Ap, Bp, C, ldc, i0, n0, first, last, ep, pf);
        return;
    }
    if (kc > 0) {                      /* the edge tiles prefetch their slice spread out too */
        ukernel_edge_tile(mr, kc, Ap, Bp, ldb, C, ldc, i0, n0, nr, first, last, ep, pf);
        return;
    }
    for (int64_t b = 0; b < pf.n; b += 64) {
        __asm__ volatile("");
        __builtin_prefetch(pf.p + b, 0, 1);
    }
    float acc[CUVIL_MR][CUVIL_NR];          /* K = 0: the epilogue alone */
    memset(acc, 0, sizeof acc);
    store_tile(acc, mr, nr, C, ldc, i0, n0, first, last, ep);
}

/* B block [kc][NR] as floats: the packed panel itself for fp32, else dequantized into buf.
 * One loop per format, K walked group by group so the scales row is fixed inside the hot loop. */
static inline const float *b_block(const void *B, int bits, const float *scales, int64_t group, int64_t N,
                                   int64_t K, int64_t p, int64_t k0, int64_t kc, float *buf) {
    if (bits == CUVIL_B_PRODUCED) {
        const cuvil_b_source *src = B;
        return src->fn(src->ctx, p, k0, kc, buf);
    }
    if (bits == 32) return (const float *)B + p * K * CUVIL_NR + k0 * CUVIL_NR;
    if (bits == 16) {                              /* bf16: the high half of an fp32 */
        const uint16_t *q = (const uint16_t *)B + (p * K + k0) * CUVIL_NR;
        for (int64_t k = 0; k < kc; k++) {
            cuvil_vf lo, hi;
            cuvil_vload_bf16_pair(q + k * CUVIL_NR, &lo, &hi);
            cuvil_vstore(buf + k * CUVIL_NR, lo);
            cuvil_vstore(buf + k * CUVIL_NR + CUVIL_VL, hi);
        }
        return buf;
    }
    if (bits == CUVIL_B_FP16) {
        const uint16_t *q = (const uint16_t *)B + (p * K + k0) * CUVIL_NR;
        for (int64_t k = 0; k < kc; k++) {
            cuvil_vstore(buf + k * CUVIL_NR, cuvil_vload_f16(q + k * CUVIL_NR));
            cuvil_vstore(buf + k * CUVIL_NR + CUVIL_VL, cuvil_vload_f16(q + k * CUVIL_NR + CUVIL_VL));
        }
        return buf;
    }
    const float *sc = scales + p * ((K + group - 1) / group) * CUVIL_NR;
    for (int64_t k = 0; k < kc;) {
        int64_t kk = k0 + k, end = (kk / group + 1) * group - k0;
        if (end > kc) end = kc;
        const float *s = sc + (kk / group) * CUVIL_NR;
        if (bits == 8) {
            const int8_t *q = (const int8_t *)B + (p * K + kk) * CUVIL_NR;
            for (int64_t r = 0; r < end - k; r++)
                for (int j = 0; j < CUVIL_NR; j++) buf[(k + r) * CUVIL_NR + j] = (float)q[r * CUVIL_NR + j] * s[j];
        } else {          /* 4 bits: byte j = column j (low nibble), column j + NR/2 (high); value - 8 */
            const uint8_t *q = (const uint8_t *)B + (p * K + kk) * (CUVIL_NR / 2);
            for (int64_t r = 0; r < end - k; r++) {
                float *d = buf + (k + r) * CUVIL_NR;
                const uint8_t *qr = q + r * (CUVIL_NR / 2);
                for (int j = 0; j < CUVIL_NR / 2; j++) d[j] = (float)((int)(qr[j] & 15) - 8) * s[j];
                for (int j = 0; j < CUVIL_NR / 2; j++)
                    d[j + CUVIL_NR / 2] = (float)((int)(qr[j] >> 4) - 8) * s[j + CUVIL_NR / 2];
            }
        }
        k = end;
    }
    return buf;
}

typedef struct {
    int64_t M, N, K, lda, ldc, group, np, nb, pb, mc;
    int64_t ldb;                  /* floats between the rows of a B block: NR packed, the row stride strided */
    const float *A, *scales;
    const float *ap;              /* A packed in MR-row tiles, or 0 (each task packs its own tiles) */
    const void *B;
    int bits;
    float *C;
    const cuvil_epilogue *ep;
    int a_trans;                  /* A given transposed (pack_at) */
    int pack_in_task;             /* each task packs its own M block of A, K block by K block (ap is 0) */
    int b_cached;                 /* B expected in the last-level cache (gemm.h: cuvil_sgemm_packed) */
    int a_rows;                   /* full tiles read A's rows in place, the rest pack their tile (ap is 0) */
} gemm_args;

/* Tasks t in [t0, t1): each one M block (mc rows) x pb panels, K blocked, epilogue on the last block. */
/* A packed once per call, before the tasks run, into the calling thread's buffer (grown on demand
 * and kept): K block kb, row tile ti at (kb * KC * tiles + ti * kc) * MR. Every task of an M block
 * reads the same tiles, so packing inside the tasks would repeat it for each of them. */
static float *apack_buffer(int64_t n) {
    return cuvil_thread_buffer(CUVIL_BUF_APACK, (size_t)n * sizeof(float));
}

static void pack_a_task(void *ctx, int64_t t0, int64_t t1) {
    const gemm_args *g = ctx;
    float *ap = (float *)g->ap;
    int64_t tiles = (g->M + CUVIL_MR - 1) / CUVIL_MR;
    for (int64_t ti = t0; ti < t1; ti++)
        for (int64_t k0 = 0; k0 < g->K; k0 += CUVIL_KC) {
            int64_t kc = g->K - k0 < CUVIL_KC ? g->K - k0 : CUVIL_KC, i0 = ti * CUVIL_MR;
            (g->a_trans ? pack_at : pack_a)(g->A, g->lda, i0, i0 + CUVIL_MR < g->M ? i0 + CUVIL_MR : g->M, k0, kc,
                                            ap + (k0 * tiles + ti * kc) * CUVIL_MR);
        }
}

/* Rows [k0, k1) of a transposed A into every tile: each row of At (one channel of a 1x1 conv's NCHW
 * input, or one im2col row) is read once, in order, and dealt out MR floats to a tile. Tile by tile
 * (pack_at over K), each line of At was read three times, by strided reads. Eight rows at a time, so
 * that each tile gets 8 x MR floats in a run: one row at a time, the tiles' writes lay kc * MR floats
 * apart (12 KB, a multiple of 4 KB), all in one L1 set, and ShuffleNet's 116 -> 232 channel conv spent
 * 108 of its 500 us packing (benchmarks/README.md, Kernel notes). */
#define PACK_AT_ROWS 8
static void pack_at_task(void *ctx, int64_t k0, int64_t k1) {
    const gemm_args *g = ctx;
    int64_t tiles = (g->M + CUVIL_MR - 1) / CUVIL_MR, full = g->M / CUVIL_MR, rest = g->M - full * CUVIL_MR;
    for (int64_t k = k0, n; k < k1; k += n) {
        int64_t kb = k / CUVIL_KC * CUVIL_KC, kc = g->K - kb < CUVIL_KC ? g->K - kb : CUVIL_KC;
        n = k1 - k < PACK_AT_ROWS ? k1 - k : PACK_AT_ROWS;
        if (n > kb + kc - k) n = kb + kc - k;                     /* rows of one K block */
        const float *src = g->A + k * g->lda;
        float *d = (float *)g->ap + kb * tiles * CUVIL_MR + (k - kb) * CUVIL_MR;
        for (int64_t ti = 0; ti < full; ti++)
            for (int64_t r = 0; r < n; r++)
                memcpy(d + ti * kc * CUVIL_MR + r * CUVIL_MR, src + r * g->lda + ti * CUVIL_MR, CUVIL_MR * sizeof(float));
        if (rest)                         /* the last tile's rows past M repeat row M - 1's start: unused */
            for (int64_t r = 0; r < n; r++)
                for (int i = 0; i < CUVIL_MR; i++)
                    d[full * kc * CUVIL_MR + r * CUVIL_MR + i] = src[r * g->lda + full * CUVIL_MR + (i < rest ? i : 0)];
    }
}

/* The packed tile of rows [i0, i0 + MR) for the K block at k0: in the task's block (packed from row m0)
 * or the call's, or packed now into `tile` when no buffer could be allocated. */
static inline const float *a_tile(const gemm_args *g, const float *block, int64_t m0, int64_t i0, int64_t k0,
                                  int64_t kc, float *tile) {
    if (block) return block + (i0 - m0) / CUVIL_MR * kc * CUVIL_MR;
    if (g->ap) return g->ap + (k0 * ((g->M + CUVIL_MR - 1) / CUVIL_MR) + i0 / CUVIL_MR * kc) * CUVIL_MR;
    (g->a_trans ? pack_at : pack_a)(g->A, g->lda, i0, i0 + CUVIL_MR < g->M ? i0 + CUVIL_MR : g->M, k0, kc, tile);
    return tile;
}

/* Rows [m0, m1) x the K block at k0 of A, packed tile after tile into this thread's buffer (the call's
 * whole-A buffer is not used when tasks pack their own); 0 if it could not be allocated. */
static const float *pack_a_block(const gemm_args *g, int64_t m0, int64_t m1, int64_t k0, int64_t kc) {
    float *block = apack_buffer((m1 - m0 + CUVIL_MR - 1) / CUVIL_MR * CUVIL_MR * kc);
    for (int64_t i0 = m0; block && i0 < m1; i0 += CUVIL_MR)
        pack_a(g->A, g->lda, i0, i0 + CUVIL_MR < m1 ? i0 + CUVIL_MR : m1, k0, kc, block + (i0 - m0) * kc);
    return block;
}

/* Panel p's block at k0 of an fp32 B read in place: packed, or strided (its rows ldb apart). */
static inline const float *b_panel(const gemm_args *g, int64_t p, int64_t k0) {
    if (g->bits == CUVIL_B_STRIDED) return (const float *)g->B + k0 * g->ldb + p * CUVIL_NR;
    return (const float *)g->B + (p * g->K + k0) * CUVIL_NR;
}

/* kc rows of one panel of B read in place (ldb floats apart; its first nr columns, the rest zero: no
 * read past a row's end, see cuvil_sgemm_strided_b) into buf as [kc][NR]. */
static const float *copy_b_block(const float *bp, int64_t ldb, int64_t kc, int64_t nr, float *buf) {
    if (nr == CUVIL_NR)
        for (int64_t k = 0; k < kc; k++) {
            cuvil_vstore(buf + k * CUVIL_NR, cuvil_vload(bp + k * ldb));
            cuvil_vstore(buf + k * CUVIL_NR + CUVIL_VL, cuvil_vload(bp + k * ldb + CUVIL_VL));
        }
    else
        for (int64_t k = 0; k < kc; k++) {
            int64_t n0 = nr < CUVIL_VL ? nr : CUVIL_VL;
            cuvil_vstore(buf + k * CUVIL_NR, cuvil_vload_first(bp + k * ldb, n0));
            cuvil_vstore(buf + k * CUVIL_NR + CUVIL_VL, cuvil_vload_first(bp + k * ldb + CUVIL_VL, nr - n0));
        }
    return buf;
}

/* The bytes of B the task reads after panel p's block at k0 (the next panel's block, or the first
 * panel's of the next K block); none at the task's end and for the formats dequantized into buf. */
static byte_run next_b_block(const gemm_args *g, int64_t p, int64_t p0, int64_t p1, int64_t k0) {
    int64_t pn = p + 1 < p1 ? p + 1 : p0, kn = p + 1 < p1 ? k0 : k0 + CUVIL_KC;
    if (kn >= g->K || g->bits != 32) return (byte_run){0, 0};
    int64_t kc = g->K - kn < CUVIL_KC ? g->K - kn : CUVIL_KC;
    return (byte_run){(const char *)((const float *)g->B + (pn * g->K + kn) * CUVIL_NR), kc * CUVIL_NR * 4};
}

/* Slice `part` of `parts` of the next block, to prefetch toward L2 while row tile `part` of the current
 * block computes: a B block left to the first tile that reads it came slowly from DRAM and made that
 * tile much slower than the rest (benchmarks/README.md, Kernel notes). Locality 1 (prefetcht2): T0
 * pulled the next block into L1, over the block in use. */
static inline byte_run prefetch_slice(byte_run next, int64_t part, int64_t parts) {
    int64_t slice = (next.n / parts + 63) & ~(int64_t)63, b0 = part * slice;
    int64_t n = b0 >= next.n ? 0 : next.n - b0 < slice ? next.n - b0 : slice;
    return (byte_run){next.p + b0, n};
}

/* C[m0:m1, n0:n1] = act(C) in place, the switch outside the loops so each activation is inlined. */
void cuvil_activate_block(float *C, int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int act) {
    #define ACTIVATE(A) for (int64_t i = m0; i < m1; i++) {                                          \
        float *c = C + i * ldc;                                                                       \
        int64_t j = n0;                                                                               \
        for (; j + CUVIL_VL <= n1; j += CUVIL_VL) cuvil_vstore(c + j, cuvil_vact(cuvil_vload(c + j), A)); \
        for (; j < n1; j++) c[j] = cuvil_act(c[j], A);                                                \
    }
    switch (act) {
#define CUVIL_ACT_CASE(NAME, code, scalar, vector) case CUVIL_ACT_##NAME: ACTIVATE(CUVIL_ACT_##NAME); break;
    CUVIL_ACTIVATIONS(CUVIL_ACT_CASE)
#undef CUVIL_ACT_CASE
    default: ACTIVATE(act); break;
    }
    #undef ACTIVATE
}

static void gemm_task(void *ctx, int64_t t0, int64_t t1) {
    const gemm_args *g = ctx;
    float buf[CUVIL_KC * CUVIL_NR] __attribute__((aligned(64)));
    float tile[CUVIL_KC * CUVIL_MR] __attribute__((aligned(64)));
    /* activations past ReLU (GELU, SiLU, ...) run over the task's block of C once its tiles are
     * stored, while it is in cache: in the tiles' epilogue each vector went through cuvil_vact's
     * switch, a call of its own (4.3% of MiniLM's time; its GELU up-projection ran at 60 GF/s to its
     * other GEMMs' 68). The tile functions are left as they are: their K loop's registers shift with
     * any change to their code. */
    cuvil_epilogue plain;
    const cuvil_epilogue *ep = g->ep;
    int post_act = ep && ep->act > CUVIL_ACT_RELU ? ep->act : CUVIL_ACT_NONE;
    if (post_act) plain = *ep, plain.act = CUVIL_ACT_NONE, ep = &plain;
    for (int64_t t = t0; t < t1; t++) {
        int64_t m0 = (t / g->nb) * g->mc, p0 = (t % g->nb) * g->pb;
        int64_t m1 = m0 + g->mc < g->M ? m0 + g->mc : g->M, p1 = p0 + g->pb < g->np ? p0 + g->pb : g->np;
        int64_t k0 = 0;
        do {
            int64_t kc = g->K - k0 < CUVIL_KC ? g->K - k0 : CUVIL_KC;
            int first = k0 == 0, last = k0 + CUVIL_KC >= g->K;
            const float *block = g->pack_in_task && kc > 0 ? pack_a_block(g, m0, m1, k0, kc) : 0;
            if ((g->bits == 32 || g->bits == CUVIL_B_STRIDED) && kc <= CUVIL_GEMM_SHALLOW_K) {
                /* shallow K (1x1 convs, small im2col): rows outer, so each row of C is written in one
                 * run across the task's panels; writing C, not reading B, is what costs here */
                /* a strided B's edge panel: its columns copied once for every row tile */
                int64_t pe = p1 - 1, ne = g->N - pe * CUVIL_NR;
                const float *edge = g->bits == CUVIL_B_STRIDED && ne < CUVIL_NR
                                    ? copy_b_block(b_panel(g, pe, k0), g->ldb, kc, ne, buf) : 0;
                for (int64_t i0 = m0; i0 < m1; i0 += CUVIL_MR) {
                    int mr = (int)(m1 - i0 < CUVIL_MR ? m1 - i0 : CUVIL_MR);
                    const float *ap = kc > 0 ? a_tile(g, block, m0, i0, k0, kc, tile) : 0;
                    for (int64_t p = p0; p < p1; p++) {
                        int64_t n0 = p * CUVIL_NR, nr = g->N - n0 < CUVIL_NR ? g->N - n0 : CUVIL_NR;
                        int in_buf = edge && p == pe;
                        ukernel_tile(mr, nr, kc, ap, 0, in_buf ? edge : b_panel(g, p, k0), in_buf ? CUVIL_NR : g->ldb,
                                     g->C, g->ldc, i0, n0, first, last, ep, (byte_run){0, 0});
                    }
                }
                k0 += CUVIL_KC;
                continue;
            }
            int64_t ntiles = (m1 - m0 + CUVIL_MR - 1) / CUVIL_MR;
            /* B read in place (a 1x1 conv's input) and reused by several row tiles: its block is
             * copied into buf first. Rows N floats apart fall into few L1 sets (56x56: 12544 bytes,
             * 16 of 64 sets), so the block did not stay in L1 between the tiles (benchmarks/README.md,
             * Kernel notes) */
            for (int64_t p = p0; p < p1; p++) {
                int64_t n0 = p * CUVIL_NR, nr = g->N - n0 < CUVIL_NR ? g->N - n0 : CUVIL_NR;
                /* a strided B's edge panel is copied too: its last row would be read past its end */
                int copy_b = g->bits == CUVIL_B_STRIDED && (ntiles > 1 || nr < CUVIL_NR);
                int64_t ldb = copy_b ? CUVIL_NR : g->ldb;
                const float *bp = g->bits == CUVIL_B_STRIDED ? b_panel(g, p, k0)
                                  : b_block(g->B, g->bits, g->scales, g->group, g->N, g->K, p, k0, kc, buf);
                if (copy_b) bp = copy_b_block(bp, g->ldb, kc, nr, buf);
                byte_run next = next_b_block(g, p, p0, p1, k0);
                for (int64_t i0 = m0; i0 < m1; i0 += CUVIL_MR) {
                    int mr = (int)(m1 - i0 < CUVIL_MR ? m1 - i0 : CUVIL_MR);
                    byte_run pf = prefetch_slice(next, (i0 - m0) / CUVIL_MR, ntiles);
                    int rows = g->a_rows && kc > 0 && mr == CUVIL_MR && nr == CUVIL_NR && ldb == CUVIL_NR;
                    const float *ap = rows ? g->A + i0 * g->lda + k0 : kc > 0 ? a_tile(g, block, m0, i0, k0, kc, tile) : 0;
                    ukernel_tile(mr, nr, kc, ap, rows ? g->lda : 0, bp, ldb, g->C, g->ldc, i0, n0, first, last, ep, pf);
                }
            }
            k0 += CUVIL_KC;
        } while (k0 < g->K);
        if (post_act) cuvil_activate_block(g->C, g->ldc, m0, m1, p0 * CUVIL_NR, p1 * CUVIL_NR < g->N ? p1 * CUVIL_NR : g->N, post_act);
    }
}

/* One row (batch-1 decode) over fp32 or bf16 panels: all of K at once, so no partial sums of C
 * are stored and reloaded; CUVIL_GEMV_STREAMS panels side by side. */
static void gemv_task(void *ctx, int64_t p0, int64_t p1) {
    const gemm_args *g = ctx;
    float acc[CUVIL_GEMV_STREAMS][CUVIL_MR][CUVIL_NR];
    int esize = b_bytes(g->bits);
    for (int64_t p = p0; p < p1; p += CUVIL_GEMV_STREAMS) {
        int S = p1 - p < CUVIL_GEMV_STREAMS ? (int)(p1 - p) : CUVIL_GEMV_STREAMS;
        const void *b = (const char *)g->B + p * g->K * CUVIL_NR * esize;
        /* constants for the compiler: the loops unroll per case (bf16 always prefetches) */
#define GEMV_CASE(S_, BITS, PF) case (S_) * 100 + (BITS) + (PF) * 1000: gemv_panels(S_, BITS, PF, g->K, g->A, bs, as); break;
#define GEMV_CASES(BITS, PF) GEMV_CASE(1, BITS, PF) GEMV_CASE(2, BITS, PF) GEMV_CASE(3, BITS, PF) \
                             GEMV_CASE(4, BITS, PF) GEMV_CASE(5, BITS, PF) GEMV_CASE(6, BITS, PF)
        _Static_assert(CUVIL_GEMV_STREAMS == 6, "GEMV_CASES lists 1..6 streams");
        int from_dram = g->bits != 32 || !g->b_cached;
        /* weights held in the cache keep the six streams (benchmarks/README.md, Kernel notes) */
        int streams = from_dram ? CUVIL_GEMV_DRAM_STREAMS : S;
        for (int s = 0; s < S; s += streams) {
            const void *bs = (const char *)b + s * g->K * CUVIL_NR * esize;
            float (*as)[CUVIL_MR][CUVIL_NR] = acc + s;
            switch ((S - s < streams ? S - s : streams) * 100 + g->bits + 1000 * from_dram) {
            GEMV_CASES(32, 1) GEMV_CASES(32, 0) GEMV_CASES(16, 1) GEMV_CASES(CUVIL_B_FP16, 1)
            }
        }
#undef GEMV_CASES
#undef GEMV_CASE
        for (int s = 0; s < S; s++) {
            int64_t n0 = (p + s) * CUVIL_NR, nr = g->N - n0 < CUVIL_NR ? g->N - n0 : CUVIL_NR;
            store_tile(acc[s], 1, nr, g->C, g->ldc, 0, n0, 1, 1, g->ep);
        }
    }
}

/* Part t of `parts` equal runs of panels (gemm_driver's GEMV). */
typedef struct { gemm_args g; int64_t parts; } gemv_parts;

static void gemv_part_task(void *ctx, int64_t t0, int64_t t1) {
    const gemv_parts *v = ctx;
    for (int64_t t = t0; t < t1; t++) gemv_task((void *)&v->g, t * v->g.np / v->parts, (t + 1) * v->g.np / v->parts);
}

/* The L1 sets (of 64, 64-byte lines) that MR rows lda floats apart start in. The tiles read A's rows
 * in place where they spread over at least 2 (gemm_driver's a_rows): packed first, A took a pass and a
 * parallel region of its own, reading rows the other core had just written (MiniLM at 2 threads: 5%
 * of its time in pack_a). Rows 4 KB apart (lda 1024) would all share one set. */
static int l1_sets(int64_t lda) {
    if (lda % 16) return CUVIL_MR;                     /* rows not line-aligned: they drift over the sets */
    int64_t step = lda / 16 % 64, g = 64;
    for (int64_t a = step; a; ) { int64_t t = g % a; g = a; a = t; }   /* gcd(step, 64) */
    int64_t sets = step ? 64 / g : 1;
    return sets < CUVIL_MR ? (int)sets : CUVIL_MR;
}

/* The one GEMM driver: (M block x N panels) tasks over the threads. */
static void gemm_driver(int64_t M, int64_t N, int64_t K, const float *A, const float *Ap, int64_t lda, int a_trans,
                        const void *B, int64_t ldb, int bits, const float *scales, int64_t group, float *C,
                        int64_t ldc, const cuvil_epilogue *ep, int nthreads, int b_cached) {
    if (M <= 0 || N <= 0) return;
    int64_t np = (N + CUVIL_NR - 1) / CUVIL_NR;
    if (M == 1 && A && K > 0 && (bits == 32 || bits == 16 || bits == CUVIL_B_FP16) && (!a_trans || lda == 1)) {
        gemv_parts v = {{M, N, K, lda, ldc, group, np, 0, 0, 1, ldb, A, scales, 0, B, bits, C, ep, 0, 0, b_cached}, 1};
        int nt = N * K > CUVIL_GEMV_PARALLEL_MIN && nthreads > 1 ? nthreads : 1;
        /* few stream groups a thread: equal parts, one a thread (chunks of one stream group left a
         * thread with one more); more keep the chunks, claimed as threads come free (benchmarks/README.md,
         * Kernel notes) */
        if (np <= CUVIL_GEMV_EQUAL_PARTS_GROUPS * CUVIL_GEMV_STREAMS * nt) {
            v.parts = nt;
            cuvil_parallel_chunks(nt, nt, 1, gemv_part_task, &v);
        } else
            cuvil_parallel_guided(nt, np, CUVIL_GEMV_STREAMS, gemv_task, &v.g);
        return;
    }
    /* M blocks of equal size, up to 1.5 MC rows (the A block stays in L2): 128 rows were a block of
     * 120 and one of 8, which streamed every weight twice, the second time for 8 rows */
    int64_t mb = (M + CUVIL_MC * 3 / 2 - 1) / (CUVIL_MC * 3 / 2), pb, nb;
    int64_t tiles = (M + CUVIL_MR - 1) / CUVIL_MR;
    /* A larger than L2 and few panels (MiniLM at batch 32): one task per M block takes every panel and
     * packs the block's A itself, K block by K block, where it stays in L2; packed whole ahead, A went
     * out to L3 and back. Over more panels each task streams too much of B from L3 (benchmarks/README.md,
     * Kernel notes) */
    int in_task = !Ap && !a_trans && A && bits == 32 && tiles * CUVIL_MR * K * 4 > CUVIL_GEMM_IN_TASK_MIN_A_BYTES &&
                  np <= CUVIL_GEMM_IN_TASK_MAX_PANELS && mb >= CUVIL_GEMM_IN_TASK_MIN_BLOCKS_PER_THREAD * nthreads;
    if (in_task) {
        pb = np, nb = 1;
        while (mb < CUVIL_GEMM_TASKS_PER_THREAD * nthreads && mb % nthreads) mb++;   /* even over the threads */
    }
    /* Enough rows a thread and B not much larger than A: M blocks in a multiple of the threads, so each
     * thread's own run of tasks (cuvil_parallel_for) is its rows across every panel, the rows a layer
     * norm or the GEMM before wrote on that core, still in its L2. Split by panels, each thread read all
     * of A, half of it from the other core; split by rows, each reads all of B (benchmarks/README.md,
     * Kernel notes). */
    else if (nthreads > 1 && bits == 32 && M >= CUVIL_GEMM_ROWS_MIN_PER_THREAD * nthreads &&
             N <= CUVIL_GEMM_ROWS_MAX_N_OVER_M * M) {
        mb = (mb + nthreads - 1) / nthreads * nthreads;
        pb = np * mb >= CUVIL_GEMM_TASKS_PER_THREAD * nthreads ? CUVIL_GEMM_PANELS_PER_TASK : 1;
        nb = (np + pb - 1) / pb;
    }
    else for (;;) {
        /* panels per task: enough tasks for every thread, few enough to reuse A from cache */
        pb = np * mb >= CUVIL_GEMM_TASKS_PER_THREAD * nthreads ? CUVIL_GEMM_PANELS_PER_TASK : 1;
        if ((bits == 32 || bits == CUVIL_B_STRIDED) && K <= CUVIL_GEMM_SHALLOW_K &&
            np * mb >= CUVIL_GEMM_SHALLOW_MIN_PANELS_PER_THREAD * nthreads)
            pb = CUVIL_GEMM_SHALLOW_PANELS_PER_TASK;  /* shallow K: longer runs of C rows */
        nb = (np + pb - 1) / pb;
        /* B produced inside the tasks (a conv's implicit im2col): every M block produces it again, so
         * single panels per task come first, and M is split only for want of tasks (benchmarks/README.md,
         * Kernel notes) */
        if (bits == CUVIL_B_PRODUCED && nthreads > 1 && pb > 1 && mb * nb < CUVIL_GEMM_TASKS_PER_THREAD * nthreads &&
            mb * nb % nthreads) {
            pb = 1, nb = np;
            if (mb * nb >= CUVIL_GEMM_PRODUCED_MIN_TASKS_PER_THREAD * nthreads) break;
        }
        /* few tasks: one more M block until they split evenly over the threads (3 tasks on 2 threads
         * left one idle a third of the time: the Winograd products of a 512-channel conv at 7x7) */
        if (nthreads <= 1 || mb * nb >= CUVIL_GEMM_TASKS_PER_THREAD * nthreads || mb * nb % nthreads == 0 || mb * CUVIL_MR >= M) break;
        mb++;
    }
    int64_t mc = ((M + mb - 1) / mb + CUVIL_MR - 1) / CUVIL_MR * CUVIL_MR;
    int a_rows = !Ap && !a_trans && A && bits == 32 && !in_task && M >= CUVIL_MR && K > CUVIL_GEMM_SHALLOW_K && l1_sets(lda) >= 2;
    gemm_args g = {M, N, K, lda, ldc, group, np, nb, pb, mc, ldb, A, scales,
                   Ap || in_task || a_rows ? Ap : apack_buffer(tiles * CUVIL_MR * K), B, bits, C, ep, a_trans, in_task};
    g.a_rows = a_rows;
    /* in parallel from small sizes on: the rows were mostly just written, half by the other core */
    if (g.ap && !Ap && a_trans) cuvil_parallel_for(M * K > CUVIL_GEMM_PACK_A_PARALLEL_MIN ? nthreads : 1, K, 16, pack_at_task, &g);
    else if (g.ap && !Ap) cuvil_parallel_for(M * K > CUVIL_GEMM_PACK_A_PARALLEL_MIN ? nthreads : 1, tiles, 1, pack_a_task, &g);
    cuvil_parallel_for(M * N * K > CUVIL_GEMM_PARALLEL_MIN_FLOPS ? nthreads : 1, mb * nb, 1, gemm_task, &g);
}

void cuvil_sgemm_packed(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *Bp,
                        float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads, int b_cached) {
    gemm_driver(M, N, K, A, 0, lda, 0, Bp, CUVIL_NR, 32, 0, 1, C, ldc, ep, nthreads, b_cached);
}

void cuvil_sgemm_at_packed(int64_t M, int64_t N, int64_t K, const float *At, int64_t lda, const float *Bp,
                           float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads) {
    gemm_driver(M, N, K, At, 0, lda, 1, Bp, CUVIL_NR, 32, 0, 1, C, ldc, ep, nthreads, 0);
}

void cuvil_sgemm_packed_ab(int64_t M, int64_t N, int64_t K, const float *Ap, const float *Bp,
                           float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads) {
    gemm_driver(M, N, K, 0, Ap, K, 0, Bp, CUVIL_NR, 32, 0, 1, C, ldc, ep, nthreads, 0);
}

void cuvil_sgemm_strided_b(int64_t M, int64_t N, int64_t K, const float *A, const float *Ap, const float *B,
                           int64_t ldb, float *C, int64_t ldc, const cuvil_epilogue *ep, int nthreads) {
    gemm_driver(M, N, K, Ap ? 0 : A, Ap, K, 0, B, ldb, CUVIL_B_STRIDED, 0, 1, C, ldc, ep, nthreads, 0);
}

void cuvil_sgemm_produced_b(int64_t M, int64_t N, int64_t K, const float *A, const float *Ap,
                            const cuvil_b_source *src, float *C, int64_t ldc, const cuvil_epilogue *ep,
                            int nthreads) {
    gemm_driver(M, N, K, Ap ? 0 : A, Ap, K, 0, src, CUVIL_NR, CUVIL_B_PRODUCED, 0, 1, C, ldc, ep, nthreads, 0);
}

void cuvil_sgemm_quant(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const void *Bq, int bits,
                       const float *scales, int64_t group, float *C, int64_t ldc, const cuvil_epilogue *ep,
                       int nthreads) {
    gemm_driver(M, N, K, A, 0, lda, 0, Bq, CUVIL_NR, bits, scales, group > 0 ? group : K, C, ldc, ep, nthreads, 0);
}

#define CUVIL_NAIVE_MATMUL(T, NAME)                                                                 \
void NAME(int64_t M, int64_t N, int64_t K, const T *A, int64_t lda, const T *B, int64_t ldb, T *C, int64_t ldc) { \
    for (int64_t i = 0; i < M; i++) {                                                               \
        for (int64_t j = 0; j < N; j++) C[i * ldc + j] = 0;                                         \
        for (int64_t k = 0; k < K; k++) {                                                           \
            T a = A[i * lda + k];                                                                   \
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] += a * B[k * ldb + j];                   \
        }                                                                                           \
    }                                                                                               \
}
CUVIL_NAIVE_MATMUL(double, cuvil_matmul_f64)
CUVIL_NAIVE_MATMUL(int64_t, cuvil_matmul_i64)
CUVIL_NAIVE_MATMUL(int32_t, cuvil_matmul_i32)
