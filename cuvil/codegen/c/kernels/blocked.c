#include "blocked.h"
#include <string.h>
#include "blocked_input.h"
#include "int8dot.h"
#include "nchw_rows.h"
#include "pool.h"
#include "transpose.h"
#include "tuning.h"
#include "vmath.h"
#include "wide.h"

/* Channel blocks per K block of the GEMM (pixels per M block: blocked_input.h BLK_MC): one panel's K block of B (256
 * channels x NR floats, 32 KB at NR 32) is reused by every row tile of the M block, whose A (96 x 256
 * floats) stays in L2. */
#define BLK_KB (256 / CUVIL_BLOCK)

/* A conv's NCHW input, zero padded (cuvil_conv_nchw_blocked): the row of channel c, tap row kh that
 * output pixel m reads starts at x + c * plane + kh * dh * wp + pix[m], its taps dw apart. */
typedef struct {
    const float *x;
    const int64_t *pix;
    int64_t C, KH, KW, dh, dw, plane, wp;
} nchw_source;


typedef struct {
    int64_t M, N, K, lda, ldc, np, mb, mc;   /* mb M blocks of mc rows (blocked_m_rows) */
    const float *A, *B, *bias, *residual;
    float *C;
    int act;
    const nchw_source *src;       /* A read from an NCHW input instead (all of K in one block) */
    const gathered_source *gsrc;  /* A gathered from a blocked input instead (A and lda unused) */
} blocked_gemm;

/* The activation over a stored tile of mr pixels x nv vectors of panel p (store_blocked_tile). */
static __attribute__((noinline)) void act_in_place(int mr, int nv, const blocked_gemm *g, int64_t i0, int64_t p, int act) {
    for (int v = 0; v < nv; v++) {
        int64_t n = p * CUVIL_NR + v * CUVIL_VL;
        float *c = g->C + n / CUVIL_BLOCK * g->ldc + n % CUVIL_BLOCK + i0 * CUVIL_BLOCK;
        for (int i = 0; i < mr; i++) cuvil_vstore(c + i * CUVIL_BLOCK, cuvil_vact(cuvil_vload(c + i * CUVIL_BLOCK), act));
    }
}

/* One vector of columns of a tile's mr rows into C at c: the sums x, plus C's partial sums unless `first`,
 * plus bias, the residual (res: at r) and the activation on the `last` K block. The flags are constants
 * wherever this is inlined (store_blocked_tile's dispatch), so a tile's store is straight-line code:
 * tested per vector, they had been about a hundred branches a 6 x 64 tile, a fifth of a 16-channel
 * 1x1 conv's time (MobileNetV2's expand convs: 176 -> 209 GFLOP/s with them constant). */
static inline __attribute__((always_inline)) void store_vector(int mr, const cuvil_vf *x, float *c, const float *r,
                                                               cuvil_vf bias, int first, int last, int res, int act) {
    #pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
        cuvil_vf v = x[i];
        if (!first) v += cuvil_vload(c + i * CUVIL_BLOCK);
        if (last) {
            v += bias;
            if (res) v += cuvil_vload(r + i * CUVIL_BLOCK);
            if (act == CUVIL_ACT_RELU) v = cuvil_vrelu(v);              /* NaN stays NaN, as torch's */
            else if (act == CUVIL_ACT_RELU6) v = cuvil_vrelu6(v);
            else if (act == CUVIL_ACT_HARDSWISH) v = cuvil_vact(v, CUVIL_ACT_HARDSWISH);
        }
        cuvil_vstore(c + i * CUVIL_BLOCK, v);
    }
}

/* store_vector with its flags made constants: one branch a vector, not one per flag and row. act is
 * none or one of the activations the store applies (store_blocked_tile). */
static inline __attribute__((always_inline)) void store_vector_as(int mr, const cuvil_vf *x, float *c, const float *r,
                                                                  cuvil_vf bias, int first, int last, int act) {
    #define ACTS(F, R) switch (act) {                                                                      case CUVIL_ACT_RELU: store_vector(mr, x, c, r, bias, F, 1, R, CUVIL_ACT_RELU); break;                 case CUVIL_ACT_RELU6: store_vector(mr, x, c, r, bias, F, 1, R, CUVIL_ACT_RELU6); break;               case CUVIL_ACT_HARDSWISH: store_vector(mr, x, c, r, bias, F, 1, R, CUVIL_ACT_HARDSWISH); break;         default: store_vector(mr, x, c, r, bias, F, 1, R, CUVIL_ACT_NONE); }
    if (!last) {
        if (first) store_vector(mr, x, c, 0, bias, 1, 0, 0, CUVIL_ACT_NONE);
        else store_vector(mr, x, c, 0, bias, 0, 0, 0, CUVIL_ACT_NONE);
    } else if (first) {
        if (r) ACTS(1, 1) else ACTS(1, 0)
    } else {
        if (r) ACTS(0, 1) else ACTS(0, 0)
    }
    #undef ACTS
}

/* A tile's registers (mr pixels x nv vectors of output channels of panel p) into blocked C: raw partial
 * sums before the last K block, which adds bias, residual and the activation. */
static inline __attribute__((always_inline)) void store_blocked_tile(int mr, int nv, cuvil_vf c0[CUVIL_MR],
                                                                     cuvil_vf c1[CUVIL_MR], const blocked_gemm *g,
                                                                     int64_t i0, int64_t p, int first, int last) {
    /* ReLU, ReLU6 and hardswish (no calls: selects and arithmetic) here; any other activation by
     * act_in_place once the tile is stored: with its calls (every vector register caller-saved) in this
     * code, GCC kept most of a tile's accumulators on the stack through the whole K loop (a load and a
     * store per K block) */
    int act = last ? g->act : CUVIL_ACT_NONE;
    int inline_act = act == CUVIL_ACT_RELU || act == CUVIL_ACT_RELU6 || act == CUVIL_ACT_HARDSWISH ? act : CUVIL_ACT_NONE;
    for (int v = 0; v < nv; v++) {          /* vector v: columns n .. n + VL, inside one block */
        int64_t n = p * CUVIL_NR + v * CUVIL_VL, off = n / CUVIL_BLOCK * g->ldc + n % CUVIL_BLOCK;
        float *c = g->C + off + i0 * CUVIL_BLOCK;
        const float *r = last && g->residual ? g->residual + off + i0 * CUVIL_BLOCK : 0;
        cuvil_vf bias = last && g->bias ? cuvil_vload(g->bias + n) : cuvil_vsplat(0.f);
        store_vector_as(mr, v ? c1 : c0, c, r, bias, first, last, inline_act);
    }
    if (act != inline_act) act_in_place(mr, nv, g, i0, p, act);
}

/* A tile's partial sums over channel blocks [kb0, kb0 + nkb) of a blocked A: its MR pixels of a block sit
 * side by side (a vector each), so each K step's broadcasts read MR vectors in a row. */
static inline __attribute__((always_inline)) void accumulate_blocked(int mr, int nv, const blocked_gemm *g, int64_t i0,
                                                                     int64_t p, int64_t kb0, int64_t nkb,
                                                                     cuvil_vf c0[CUVIL_MR], cuvil_vf c1[CUVIL_MR]) {
    const float *bp = g->B + (p * g->K + kb0 * CUVIL_BLOCK) * CUVIL_NR;
    for (int64_t kb = 0; kb < nkb; kb++) {
        const float *a = g->A + (kb0 + kb) * g->lda + i0 * CUVIL_BLOCK;
        const float *b = bp + kb * CUVIL_BLOCK * CUVIL_NR;
        #pragma GCC unroll 16          /* whole channel blocks: unrolled by 4, each step re-entered the loop */
        for (int kk = 0; kk < CUVIL_BLOCK; kk++) {
            cuvil_vf b0 = cuvil_vload(b + kk * CUVIL_NR), b1 = nv > 1 ? cuvil_vload(b + kk * CUVIL_NR + CUVIL_VL) : b0;
            #pragma GCC unroll 8
            for (int i = 0; i < mr; i++) {
                cuvil_vf av = cuvil_vsplat(a[i * CUVIL_BLOCK + kk]);
                c0[i] = cuvil_fma(c0[i], av, b0);
                if (nv > 1) c1[i] = cuvil_fma(c1[i], av, b1);
            }
        }
    }
}

/* The offset of a gathered K block k = tap t * CB + channel block cb from a pixel's window, then (cb, t)
 * stepped to the next block: without a division per block (one per 8 blocks' FMAs was a tenth of a
 * strided conv's time on AVX2). */
static inline int64_t next_gathered_block(const gathered_source *src, int64_t *cb, int64_t *t) {
    int64_t off = *cb * src->plane + src->tap[*t] * CUVIL_BLOCK;
    if (++*cb == src->CB) *cb = 0, ++*t;
    return off;
}

/* The same with A gathered from the conv's input (g->gsrc): each K block's MR pixels are MR windows'
 * block of channels at one tap, read where they lie instead of from an im2col written out first (3x3 stride
 * 2 at 28x28, 128 channels: a 3.6 MB im2col, out of L2 and back). */
static inline __attribute__((always_inline)) void accumulate_gathered(int mr, int nv, const blocked_gemm *g, int64_t i0,
                                                                      int64_t p, int64_t kb0, int64_t nkb,
                                                                      cuvil_vf c0[CUVIL_MR], cuvil_vf c1[CUVIL_MR]) {
    const gathered_source *src = g->gsrc;
    const float *bp = g->B + (p * g->K + kb0 * CUVIL_BLOCK) * CUVIL_NR, *base[CUVIL_MR];
    #pragma GCC unroll 8
    for (int i = 0; i < mr; i++) base[i] = src->x + src->pix[i0 + i] * CUVIL_BLOCK;
    int64_t cb = kb0 % src->CB, t = kb0 / src->CB;
    for (int64_t kb = 0; kb < nkb; kb++) {
        int64_t off = next_gathered_block(src, &cb, &t);
        const float *ar[CUVIL_MR], *b = bp + kb * CUVIL_BLOCK * CUVIL_NR;
        #pragma GCC unroll 8
        for (int i = 0; i < mr; i++) ar[i] = base[i] + off;
        #pragma GCC unroll 16
        for (int kk = 0; kk < CUVIL_BLOCK; kk++) {
            cuvil_vf b0 = cuvil_vload(b + kk * CUVIL_NR), b1 = nv > 1 ? cuvil_vload(b + kk * CUVIL_NR + CUVIL_VL) : b0;
            #pragma GCC unroll 8
            for (int i = 0; i < mr; i++) {
                cuvil_vf av = cuvil_vsplat(ar[i][kk]);
                c0[i] = cuvil_fma(c0[i], av, b0);
                if (nv > 1) c1[i] = cuvil_fma(c1[i], av, b1);
            }
        }
    }
}

/* The same over all of K with A straight from a padded NCHW input (g->src): K = (c, kh, kw) in the
 * filters' own order, each (c, kh) one run of KW taps along an input row. A stem's 3 channels would
 * fill a 16-channel block to 19% (AVX-512); read this way its 147 taps are all there is, with no im2col and no
 * relayout after. */
static inline __attribute__((always_inline)) void accumulate_nchw(int mr, int nv, const blocked_gemm *g, int64_t i0,
                                                                  int64_t p, cuvil_vf c0[CUVIL_MR], cuvil_vf c1[CUVIL_MR]) {
    const nchw_source *src = g->src;
    const float *b = g->B + p * g->K * CUVIL_NR;
    for (int64_t c = 0; c < src->C; c++)
        for (int64_t kh = 0; kh < src->KH; kh++, b += src->KW * CUVIL_NR) {
            const float *row = src->x + c * src->plane + kh * src->dh * src->wp, *ar[CUVIL_MR];
            #pragma GCC unroll 8
            for (int i = 0; i < mr; i++) ar[i] = row + src->pix[i0 + i];
            for (int64_t kw = 0; kw < src->KW; kw++) {
                cuvil_vf b0 = cuvil_vload(b + kw * CUVIL_NR), b1 = nv > 1 ? cuvil_vload(b + kw * CUVIL_NR + CUVIL_VL) : b0;
                #pragma GCC unroll 8
                for (int i = 0; i < mr; i++) {
                    cuvil_vf av = cuvil_vsplat(ar[i][kw * src->dw]);
                    c0[i] += av * b0;
                    if (nv > 1) c1[i] += av * b1;
                }
            }
        }
}

/* One tile of mr pixels x nv vectors of output channels of panel p, finished into C (raw partial sums
 * until the last K block, which adds the epilogue). */
/* The lines of C (and of the residual, on the last K block) that a tile of mr pixels x blocks
 * [blk, blk + nblk) of output channels will store, asked for before its K loop: left to the store,
 * each was a wait on L3 (Intel). Not on Zen, whose own prefetchers have these lines in time
 * (benchmarks/README.md, Kernel notes). */
static inline void prefetch_tile_output(const blocked_gemm *g, int64_t i0, int mr, int64_t blk, int nblk, int last) {
    if (!CUVIL_BLOCKED_PREFETCH_OUTPUT) return;        /* tuning.h */
    for (int v = 0; v < nblk; v++) {
        int64_t off = (blk + v) * g->ldc + i0 * CUVIL_BLOCK;
        for (int r = 0; r < mr; r++) {
            __asm__ volatile("");          /* GCC deletes a loop of nothing but prefetches as empty */
            __builtin_prefetch(g->C + off + r * CUVIL_BLOCK, 1, 3);
            if (last && g->residual) __builtin_prefetch(g->residual + off + r * CUVIL_BLOCK, 0, 3);
        }
    }
}

enum { A_BLOCKED, A_NCHW, A_GATHERED };          /* where a tile reads A: g->A, g->src, g->gsrc */

static inline __attribute__((always_inline)) void blocked_tile(int a_from, int mr, int nv, const blocked_gemm *g,
                                                               int64_t i0, int64_t p, int64_t kb0, int64_t nkb, int first,
                                                               int last) {
    cuvil_vf c0[CUVIL_MR], c1[CUVIL_MR];
    prefetch_tile_output(g, i0, mr, p * CUVIL_NR / CUVIL_BLOCK, nv * CUVIL_VL / CUVIL_BLOCK, last);
    #pragma GCC unroll 8
    for (int i = 0; i < CUVIL_MR; i++) c0[i] = c1[i] = cuvil_vsplat(0.f);
    if (a_from == A_NCHW) accumulate_nchw(mr, nv, g, i0, p, c0, c1);
    else if (a_from == A_GATHERED) accumulate_gathered(mr, nv, g, i0, p, kb0, nkb, c0, c1);
    else accumulate_blocked(mr, nv, g, i0, p, kb0, nkb, c0, c1);
    store_blocked_tile(mr, nv, c0, c1, g, i0, p, first, last);
}

/* The store of a full tile out of line, for long K loops: inlined, its code's register needs had GCC
 * keep 9 of AVX2's 12 accumulators on the stack through the whole K loop (a load and a store per K
 * block, on the FMA chains: ResNet-50 blocked in 8s 1.12x NCHW's time). Short K loops keep it inline,
 * where the call and the tile's trip through memory cost more (MobileNetV2's 16-channel 1x1 convs:
 * the network 1.19x the time out of line). */
static __attribute__((noinline)) void store_full_tile(int nv, cuvil_vf c0[CUVIL_MR], cuvil_vf c1[CUVIL_MR],
                                                      const blocked_gemm *g, int64_t i0, int64_t p, int first, int last) {
    store_blocked_tile(CUVIL_MR, nv, c0, c1, g, i0, p, first, last);
}
#define SHORT_K 64          /* channels of a K loop that keeps its store inline */

/* A full MR x nv-vector tile (nv 1 or 2; 1: a panel's last vector of columns) from a blocked or gathered A, its
 * accumulators named (wide.h: CUVIL_TILE_ROWS): the one-vector tiles had gone through blocked_tile's
 * arrays, on the stack. */
static inline __attribute__((always_inline)) void full_tile(int a_from, int short_k, int nv, const blocked_gemm *g,
                                                            int64_t i0, int64_t p, int64_t kb0, int64_t nkb, int first,
                                                            int last) {
    prefetch_tile_output(g, i0, CUVIL_MR, p * CUVIL_NR / CUVIL_BLOCK, nv * CUVIL_VL / CUVIL_BLOCK, last);
    CUVIL_TILE_ROWS(CUVIL_TILE_ZERO)
    const float *bp = g->B + (p * g->K + kb0 * CUVIL_BLOCK) * CUVIL_NR, *base[CUVIL_MR];
    const gathered_source *src = g->gsrc;
    int64_t cb = 0, t = 0;                       /* gathered: K block k = tap t * CB + cb, as accumulate_gathered */
    if (a_from == A_GATHERED) {
        for (int r = 0; r < CUVIL_MR; r++) base[r] = src->x + src->pix[i0 + r] * CUVIL_BLOCK;
        cb = kb0 % src->CB, t = kb0 / src->CB;
    } else
        for (int r = 0; r < CUVIL_MR; r++) base[r] = g->A + kb0 * g->lda + (i0 + r) * CUVIL_BLOCK;
    for (int64_t kb = 0; kb < nkb; kb++) {
        int64_t off = kb * g->lda;
        if (a_from == A_GATHERED) off = next_gathered_block(src, &cb, &t);
        const float *ar[CUVIL_MR], *b = bp + kb * CUVIL_BLOCK * CUVIL_NR;
        for (int r = 0; r < CUVIL_MR; r++) ar[r] = base[r] + off;
        #pragma GCC unroll 16
        for (int k = 0; k < CUVIL_BLOCK; k++) {
            cuvil_vf b0 = cuvil_vload(b + k * CUVIL_NR), b1 = nv > 1 ? cuvil_vload(b + k * CUVIL_NR + CUVIL_VL) : b0;
            CUVIL_TILE_ROWS(CUVIL_TILE_STEP)
        }
    }
    cuvil_vf c0[CUVIL_MR], c1[CUVIL_MR];
    CUVIL_TILE_ROWS(CUVIL_TILE_OUT)
    if (short_k) store_blocked_tile(CUVIL_MR, nv, c0, c1, g, i0, p, first, last);
    else store_full_tile(nv, c0, c1, g, i0, p, first, last);
}

/* full tiles in their own functions, so the edges' switch stays out of their code */
#define FULL_TILE(NAME, A_FROM, SHORT, NV)                                                                  \
    static void NAME(const blocked_gemm *g, int64_t i0, int64_t p, int64_t kb0, int64_t nkb, int first, int last) { \
        full_tile(A_FROM, SHORT, NV, g, i0, p, kb0, nkb, first, last);                                      \
    }
FULL_TILE(blocked_full_tile, A_BLOCKED, 0, 2)
FULL_TILE(blocked_short_tile, A_BLOCKED, 1, 2)
FULL_TILE(blocked_narrow_tile, A_BLOCKED, 0, 1)
FULL_TILE(blocked_narrow_short_tile, A_BLOCKED, 1, 1)
FULL_TILE(gathered_full_tile, A_GATHERED, 0, 2)
FULL_TILE(gathered_short_tile, A_GATHERED, 1, 2)
#undef FULL_TILE

/* A full tile (CUVIL_MR pixels x nv vectors, nv 1 or 2) from an NCHW source (accumulate_nchw's loops)
 * with named accumulators: through blocked_tile's arrays, GCC kept them on the stack (MobileNetV3's and
 * EfficientNet's 24- and 40-channel 1x1 convs into blocks ran at 45 GFLOP/s on AVX-512, 1 thread; a stem
 * into 16 channels, one vector, alike). */
static inline __attribute__((always_inline)) void nchw_tile(int nv, const blocked_gemm *g, int64_t i0, int64_t p) {
    const nchw_source *src = g->src;
    const float *b = g->B + p * g->K * CUVIL_NR;
    int64_t pix[CUVIL_MR];
    for (int r = 0; r < CUVIL_MR; r++) pix[r] = src->pix[i0 + r];
    CUVIL_TILE_ROWS(CUVIL_TILE_ZERO)
    if (src->KH == 1 && src->KW == 1) {
        /* a 1x1 conv's K steps are the channels, a plane apart from each other: the pixels' pointers
         * set once, each step one offset (set per channel, their six adds were a step's most work) */
        const float *ar[CUVIL_MR];
        for (int r = 0; r < CUVIL_MR; r++) ar[r] = src->x + pix[r];
        for (int64_t c = 0, k = 0; c < src->C; c++, k += src->plane, b += CUVIL_NR) {
            cuvil_vf b0 = cuvil_vload(b), b1 = nv > 1 ? cuvil_vload(b + CUVIL_VL) : b0;
            CUVIL_TILE_ROWS(CUVIL_TILE_STEP)
        }
    } else for (int64_t c = 0; c < src->C; c++)
        for (int64_t kh = 0; kh < src->KH; kh++, b += src->KW * CUVIL_NR) {
            const float *row = src->x + c * src->plane + kh * src->dh * src->wp, *ar[CUVIL_MR];
            for (int r = 0; r < CUVIL_MR; r++) ar[r] = row + pix[r];
            for (int64_t kw = 0; kw < src->KW; kw++) {
                int64_t k = kw * src->dw;
                cuvil_vf b0 = cuvil_vload(b + kw * CUVIL_NR), b1 = nv > 1 ? cuvil_vload(b + kw * CUVIL_NR + CUVIL_VL) : b0;
                CUVIL_TILE_ROWS(CUVIL_TILE_STEP)
            }
        }
    cuvil_vf c0[CUVIL_MR], c1[CUVIL_MR];
    CUVIL_TILE_ROWS(CUVIL_TILE_OUT)
    store_blocked_tile(CUVIL_MR, nv, c0, c1, g, i0, p, 1, 1);
}
static void nchw_full_tile(const blocked_gemm *g, int64_t i0, int64_t p) { nchw_tile(2, g, i0, p); }
static void nchw_narrow_tile(const blocked_gemm *g, int64_t i0, int64_t p) { nchw_tile(1, g, i0, p); }

static void blocked_edge_tile(int mr, int nv, const blocked_gemm *g, int64_t i0, int64_t p, int64_t kb0, int64_t nkb,
                              int first, int last) {
    #define TILE(R, V) g->src ? blocked_tile(A_NCHW, R, V, g, i0, p, kb0, nkb, first, last)            \
                       : g->gsrc ? blocked_tile(A_GATHERED, R, V, g, i0, p, kb0, nkb, first, last)    \
                       : blocked_tile(A_BLOCKED, R, V, g, i0, p, kb0, nkb, first, last)
    #define EDGE(R) case 2 * R: TILE(R, 1); break; case 2 * R + 1: TILE(R, 2); break;
    switch (2 * mr + (nv > 1)) {
    EDGE(1) EDGE(2) EDGE(3) EDGE(4) EDGE(5)
#if CUVIL_MR > 6
    EDGE(6) EDGE(7)
#endif
    EDGE(CUVIL_MR)
    }
    #undef EDGE
    #undef TILE
}

#if CUVIL_VL == 16
/* The wide tile (wide.h) over K blocks of WIDE_KB channel blocks: faster than the 8 x 2 tile alone
 * on Intel AVX-512, K blocks small enough for two panels' B to stay in L1 (benchmarks/README.md,
 * Kernel notes). */
#define WIDE_MR CUVIL_WIDE_MR
#define WIDE_KB CUVIL_BLOCKED_WIDE_KB     /* channel blocks a K block of two panels (per CPU: tuning.h) */

/* Lines [l0, l1) of the two panels' B that the tiles after these will read (b and q, each a K block
 * of up to WIDE_KB * 16 rows of NR floats), for one tile to ask for toward L2 as it runs. */
typedef struct { const char *b, *q; int64_t l0, l1; } b_ahead;

static inline __attribute__((always_inline)) void wide_tile(int a_from, const blocked_gemm *g, int64_t i0, int64_t p,
                                                            int64_t kb0, int64_t nkb, int first, int last,
                                                            const b_ahead *ahead) {
    prefetch_tile_output(g, i0, WIDE_MR, 2 * p, 4, last);
    CUVIL_WIDE_ROWS(CUVIL_WIDE_ZERO)
    const float *bp = g->B + (p * g->K + kb0 * CUVIL_BLOCK) * CUVIL_NR, *bq = bp + g->K * CUVIL_NR;
    int64_t per = (ahead->l1 - ahead->l0 + nkb - 1) / nkb;      /* lines of each panel per channel block */
    /* a gathered A: each pixel's window read from the table once a tile, then (channel block, tap) stepped
     * as accumulate_gathered steps them, not a division and six table reads a block (the same time on
     * Intel, within the noise of ResNet-50's strided convs alone: 0.94-1.05x) */
    const float *win[WIDE_MR], *next[WIDE_MR];
    int64_t cb = 0, t = 0;
    /* the next tile's lines of A, as each K block starts (tuning.h: where L3 is far, Intel) */
    const int ahead_a = CUVIL_BLOCKED_PREFETCH_A && i0 + 2 * WIDE_MR <= g->M;
    if (a_from == A_GATHERED) {
        for (int r = 0; r < WIDE_MR; r++) win[r] = g->gsrc->x + g->gsrc->pix[i0 + r] * CUVIL_BLOCK;
        if (ahead_a)
            for (int r = 0; r < WIDE_MR; r++) next[r] = g->gsrc->x + g->gsrc->pix[i0 + WIDE_MR + r] * CUVIL_BLOCK;
        cb = kb0 % g->gsrc->CB, t = kb0 / g->gsrc->CB;
    }
    for (int64_t kb = 0; kb < nkb; kb++) {
        const float *ar[WIDE_MR], *b = bp + kb * CUVIL_BLOCK * CUVIL_NR, *q = bq + kb * CUVIL_BLOCK * CUVIL_NR;
        for (int64_t l = ahead->l0 + kb * per, e = l + per < ahead->l1 ? l + per : ahead->l1; l < e; l++) {
            __builtin_prefetch(ahead->b + l * 64, 0, 1);
            __builtin_prefetch(ahead->q + l * 64, 0, 1);
        }
        if (a_from == A_GATHERED) {
            int64_t off = next_gathered_block(g->gsrc, &cb, &t);
            for (int r = 0; r < WIDE_MR; r++) ar[r] = win[r] + off;
            if (ahead_a)
                for (int r = 0; r < WIDE_MR; r++) __builtin_prefetch(next[r] + off, 0, 3);
        } else {
            for (int r = 0; r < WIDE_MR; r++) ar[r] = g->A + (kb0 + kb) * g->lda + (i0 + r) * CUVIL_BLOCK;
            if (ahead_a)
                for (int r = 0; r < WIDE_MR; r++) __builtin_prefetch(ar[r] + WIDE_MR * CUVIL_BLOCK, 0, 3);
        }
        for (int k = 0; k < CUVIL_BLOCK; k++) {
            CUVIL_WIDE_LOAD_B(b, q, k)
            CUVIL_WIDE_ROWS(CUVIL_WIDE_STEP)
        }
    }
    cuvil_vf c0[CUVIL_MR], c1[CUVIL_MR], c2[CUVIL_MR], c3[CUVIL_MR];
    CUVIL_WIDE_ROWS(CUVIL_WIDE_OUT)
    store_blocked_tile(WIDE_MR, 2, c0, c1, g, i0, p, first, last);
    store_blocked_tile(WIDE_MR, 2, c2, c3, g, i0, p + 1, first, last);
}
static void blocked_wide_tile(const blocked_gemm *g, int64_t i0, int64_t p, int64_t kb0, int64_t nkb, int first, int last,
                              const b_ahead *ahead) {
    wide_tile(A_BLOCKED, g, i0, p, kb0, nkb, first, last, ahead);
}
static void gathered_wide_tile(const blocked_gemm *g, int64_t i0, int64_t p, int64_t kb0, int64_t nkb, int first,
                               int last, const b_ahead *ahead) {
    wide_tile(A_GATHERED, g, i0, p, kb0, nkb, first, last, ahead);
}

/* The wide tile of a 1x1 conv's NCHW input (all of K at once): the channels are the K steps, a plane
 * apart, each broadcast feeding four FMAs where nchw_full_tile's feeds two (MobileNetV2's and
 * EfficientNet's 24 -> 144 channel convs into blocks). */
static void nchw_wide_tile(const blocked_gemm *g, int64_t i0, int64_t p) {
    const nchw_source *src = g->src;
    const float *b = g->B + p * g->K * CUVIL_NR, *q = b + g->K * CUVIL_NR, *ar[WIDE_MR];
    for (int r = 0; r < WIDE_MR; r++) ar[r] = src->x + src->pix[i0 + r];
    CUVIL_WIDE_ROWS(CUVIL_WIDE_ZERO)
    for (int64_t c = 0, off = 0; c < src->C; c++, off += src->plane) {
        CUVIL_WIDE_LOAD_B(b, q, c)
#define NCHW_WIDE_STEP(r) { cuvil_vf av = cuvil_vsplat(ar[r][off]);                                       \
                            x##r##0 += av * b0, x##r##1 += av * b1, x##r##2 += av * b2, x##r##3 += av * b3; }
        CUVIL_WIDE_ROWS(NCHW_WIDE_STEP)
#undef NCHW_WIDE_STEP
    }
    cuvil_vf c0[CUVIL_MR], c1[CUVIL_MR], c2[CUVIL_MR], c3[CUVIL_MR];
    CUVIL_WIDE_ROWS(CUVIL_WIDE_OUT)
    store_blocked_tile(WIDE_MR, 2, c0, c1, g, i0, p, 1, 1);
    store_blocked_tile(WIDE_MR, 2, c2, c3, g, i0, p + 1, 1, 1);
}

/* The K block of B after block kb0 of panels p, p + 1: the next of theirs, else the first of the next
 * two panels (the task after this one, mostly on the same thread); the weights stream from DRAM
 * once per call where they outgrow L3, and left to the hardware, each block's first tile waited on
 * its 32 KB. */
static b_ahead next_b_block(const blocked_gemm *g, int64_t p, int64_t kb0, int64_t KB) {
    int64_t kb = kb0 + WIDE_KB < KB ? kb0 + WIDE_KB : 0, np = kb ? p : p + 2;
    if (np >= g->np) return (b_ahead){0, 0, 0, 0};
    int64_t nkb = KB - kb < WIDE_KB ? KB - kb : WIDE_KB, q = np + 1 < g->np ? np + 1 : np;
    const float *b = g->B + (np * g->K + kb * CUVIL_BLOCK) * CUVIL_NR;
    return (b_ahead){(const char *)b, (const char *)(b + (q - np) * g->K * CUVIL_NR), 0,
                     nkb * CUVIL_BLOCK * CUVIL_NR * 4 / 64};
}
#define BLOCKED_GROUP 2           /* panels a task takes: the wide tile's two, where it runs */
#else
#define BLOCKED_GROUP 1
#endif

/* Whether the wide tile takes a panel pair whose columns from the first on are n: two whole panels, from
 * a blocked or gathered A or an NCHW source of a 1x1 conv (AVX-512 only). */
static inline int wide_takes(int64_t n, const nchw_source *src) {
    return CUVIL_VL == 16 && n >= 2 * CUVIL_NR && (!src || (src->KH == 1 && src->KW == 1));
}

/* The rows an M block is a multiple of: the wide tile's where it takes the panels (n: all the columns),
 * else the tile's. */
static inline int64_t rows_unit(int64_t n, const nchw_source *src) {
#if CUVIL_VL == 16
    return wide_takes(n, src) ? CUVIL_WIDE_MR : CUVIL_MR;
#else
    return (void)n, (void)src, CUVIL_MR;
#endif
}

/* Panels p and p + 1 (both whole) over rows [m0, m1): wide tiles, the rows left over as edge tiles. */
static int blocked_wide_block(const blocked_gemm *g, int64_t m0, int64_t m1, int64_t p, int64_t KB) {
#if CUVIL_VL == 16
    if (!wide_takes(g->N - p * CUVIL_NR, g->src)) return 0;
    if (g->src) {           /* an NCHW source: all of K in one block */
        int64_t i0 = m0;
        for (; i0 + WIDE_MR <= m1; i0 += WIDE_MR) nchw_wide_tile(g, i0, p);
        for (int64_t q = p; i0 < m1 && q < p + 2; q++) blocked_edge_tile((int)(m1 - i0), 2, g, i0, q, 0, 1, 1, 1);
        return 1;
    }
    for (int64_t kb0 = 0; kb0 < KB; kb0 += WIDE_KB) {
        int64_t nkb = KB - kb0 < WIDE_KB ? KB - kb0 : WIDE_KB, i0 = m0;
        int first = kb0 == 0, last = kb0 + WIDE_KB >= KB;
        b_ahead next = next_b_block(g, p, kb0, KB), share = next;
        for (int64_t t = 0, tiles = (m1 - m0) / WIDE_MR; i0 + WIDE_MR <= m1; i0 += WIDE_MR, t++) {
            share.l0 = next.l1 * t / tiles, share.l1 = next.l1 * (t + 1) / tiles;     /* each tile its share */
            if (g->gsrc) gathered_wide_tile(g, i0, p, kb0, nkb, first, last, &share);
            else blocked_wide_tile(g, i0, p, kb0, nkb, first, last, &share);
        }
        for (int64_t q = p; i0 < m1 && q < p + 2; q++) blocked_edge_tile((int)(m1 - i0), 2, g, i0, q, kb0, nkb, first, last);
    }
    return 1;
#else
    (void)g, (void)m0, (void)m1, (void)p, (void)KB;
    return 0;
#endif
}

/* Tasks t: M block t / ng x panel group t % ng (BLOCKED_GROUP panels, the last may have fewer), so
 * that consecutive tasks (one thread's run) share A. */
static inline int64_t panel_groups(int64_t np) { return (np + BLOCKED_GROUP - 1) / BLOCKED_GROUP; }
static inline int64_t blocked_groups(const blocked_gemm *g) { return panel_groups(g->np); }

static void blocked_gemm_task(void *ctx, int64_t t0, int64_t t1) {
    const blocked_gemm *g = ctx;
    int64_t KB = g->src ? 1 : g->K / CUVIL_BLOCK, ng = blocked_groups(g);   /* an NCHW source: one K block */
    for (int64_t t = t0; t < t1; t++) {
        int64_t m0 = t / ng * g->mc, m1 = m0 + g->mc < g->M ? m0 + g->mc : g->M, p = t % ng * BLOCKED_GROUP;
        if (blocked_wide_block(g, m0, m1, p, KB)) continue;
        for (int64_t pe = p + BLOCKED_GROUP < g->np ? p + BLOCKED_GROUP : g->np; p < pe; p++) {
            int nv = g->N - p * CUVIL_NR >= CUVIL_NR ? 2 : 1;
            for (int64_t kb0 = 0; kb0 < KB; kb0 += BLK_KB) {
                int64_t nkb = KB - kb0 < BLK_KB ? KB - kb0 : BLK_KB;
                int first = kb0 == 0, last = kb0 + BLK_KB >= KB;
                for (int64_t i0 = m0; i0 < m1; i0 += CUVIL_MR) {
                    int mr = m1 - i0 < CUVIL_MR ? (int)(m1 - i0) : CUVIL_MR;
                    if (mr == CUVIL_MR && g->src) (nv == 2 ? nchw_full_tile : nchw_narrow_tile)(g, i0, p);
                    else if (mr == CUVIL_MR && nv == 2 && g->gsrc)
                        (nkb * CUVIL_BLOCK <= SHORT_K ? gathered_short_tile : gathered_full_tile)(g, i0, p, kb0, nkb, first, last);
                    else if (mr == CUVIL_MR && nv == 2)
                        (nkb * CUVIL_BLOCK <= SHORT_K ? blocked_short_tile : blocked_full_tile)(g, i0, p, kb0, nkb, first, last);
                    else if (mr == CUVIL_MR && !g->gsrc)
                        (nkb * CUVIL_BLOCK <= SHORT_K ? blocked_narrow_short_tile : blocked_narrow_tile)(g, i0, p, kb0, nkb,
                                                                                                       first, last);
                    else blocked_edge_tile(mr, nv, g, i0, p, kb0, nkb, first, last);
                }
            }
        }
    }
}

/* A grouped conv's GEMMs, one per group, as one set of tasks (RegNet's 17 groups at 7x7 have 4 tasks
 * each): group q reads its input channels' blocks, writes its output channels' and has its own packed
 * filters, each that many floats past group 0's (g and src). Groups 1: the conv's one GEMM. */
typedef struct {
    blocked_gemm g;
    gathered_source src;
    int64_t tasks, a_step, b_step, c_step, bias_step;     /* tasks per group; floats from group to group */
} grouped_gemm;

static void grouped_gemm_task(void *ctx, int64_t t0, int64_t t1) {
    const grouped_gemm *gg = ctx;
    for (int64_t t = t0; t < t1;) {
        int64_t q = t / gg->tasks, end = (q + 1) * gg->tasks < t1 ? (q + 1) * gg->tasks : t1;
        blocked_gemm g = gg->g;
        gathered_source src = gg->src;
        if (g.gsrc) src.x += q * gg->a_step, g.gsrc = &src;
        else g.A += q * gg->a_step;
        g.B += q * gg->b_step, g.C += q * gg->c_step;
        if (g.residual) g.residual += q * gg->c_step;
        if (g.bias) g.bias += q * gg->bias_step;
        blocked_gemm_task(&g, t - q * gg->tasks, end - q * gg->tasks);
        t = end;
    }
}

void cuvil_sgemm_blocked(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda_blk, const float *Bp,
                         float *C, int64_t ldc_blk, const float *bias, const float *residual, int act, int nthreads) {
    if (M <= 0 || N <= 0) return;
    int nt = M * N * K > 65536 ? nthreads : 1;
    int64_t np = (N + CUVIL_NR - 1) / CUVIL_NR, mb, mc = blocked_m_rows(M, panel_groups(np), nt, rows_unit(N, 0), &mb);
    blocked_gemm g = {M, N, K, lda_blk, ldc_blk, np, mb, mc, A, Bp, bias, residual, C, act};
    cuvil_parallel_for(nt, mb * blocked_groups(&g), 1, blocked_gemm_task, &g);
}

/* ---- convolution ------------------------------------------------------------------------- */
int64_t cuvil_conv_blocked_scratch(const cuvil_conv_shape *s) {
    if (blocked_direct(s)) return 0;
    int64_t copy = blocked_in_place(s) ? 0 : s->C * padded_h(s) * padded_w(s);
    return copy + 2 * (s->OH * s->OW + s->KH * s->KW);         /* + the int64 tables pix and tap */
}

/* Group 0's GEMM of a blocked conv over image xn (every group's has its shape), `columns` output channels
 * wide: A read in place, or gathered through gg->src. The epilogue (bias, residual, C, act) is left 0. */
static void conv_image_gemm(grouped_gemm *gg, const cuvil_conv_shape *s, const blocked_input *b, const float *xn,
                            const float *wb, int64_t columns, int64_t mb, int64_t mc) {
    int64_t Cg = s->C / s->groups, P = s->OH * s->OW, plane = b->hp * b->wp * CUVIL_BLOCK;
    *gg = (grouped_gemm){{P, columns, s->KH * s->KW * Cg, plane, P * CUVIL_BLOCK, (columns + CUVIL_NR - 1) / CUVIL_NR,
                          mb, mc, xn, wb},
                         {xn, b->pix, b->tap, Cg / CUVIL_BLOCK, plane}};
    if (!b->direct) gg->g.gsrc = &gg->src;         /* grouped_gemm_task points each group's copy at its own */
}

void cuvil_conv_blocked(const cuvil_conv_shape *s, const float *x, const float *wb, const float *bias,
                        const float *residual, float *y, int act, float *scratch, int nthreads) {
    int64_t G = s->groups, Cg = s->C / G, Og = s->O / G, P = s->OH * s->OW, K = s->KH * s->KW * Cg;
    int nt = P * s->O * K > 65536 ? nthreads : 1;
    int64_t in = s->C * s->H * s->W, out = s->O * P, mb;
    int64_t mc = blocked_m_rows(P, G * panel_groups((Og + CUVIL_NR - 1) / CUVIL_NR), nt, rows_unit(Og, 0), &mb);
    blocked_input b = blocked_input_tables(s, scratch);
    for (int64_t n = 0; n < s->N; n++) {
        grouped_gemm gg;
        conv_image_gemm(&gg, s, &b, blocked_image(s, &b, x + n * in, scratch, nthreads), wb, Og, mb, mc);
        gg.g.bias = bias, gg.g.residual = residual ? residual + n * out : 0, gg.g.C = y + n * out, gg.g.act = act;
        gg.a_step = Cg * b.hp * b.wp, gg.b_step = cuvil_packed_b_size(K, Og), gg.c_step = Og * P, gg.bias_step = Og;
        gg.tasks = mb * blocked_groups(&gg.g);
        cuvil_parallel_for(nt, G * gg.tasks, 1, grouped_gemm_task, &gg);
    }
}

/* ---- convolution of a blocked input into NCHW output ------------------------------------- */
typedef struct {
    grouped_gemm gg;              /* the conv's GEMM as cuvil_conv_blocked sets it up, N the output channels
                                     up to whole blocks (the filters' padded columns are 0), no epilogue */
    int64_t O, P;
    float *y;
    const float *bias, *residual;
    int act, out_of_memory;
} nchw_out_gemm;

/* Task t: M block t / ng x panel group t % ng, as blocked_gemm_task's, the block's rows computed into a
 * thread buffer as blocked rows of their own, then turned into NCHW with the epilogue. */
static void nchw_out_task(void *ctx, int64_t t0, int64_t t1) {
    nchw_out_gemm *a = ctx;
    const blocked_gemm *g = &a->gg.g;
    int64_t ng = blocked_groups(g), ldc = g->mc * CUVIL_BLOCK;
    float *buf = cuvil_thread_buffer(CUVIL_BUF_DOT_OUT, (size_t)(g->np * CUVIL_NR * g->mc) * sizeof(float));
    if (!buf) {
        a->out_of_memory = 1;
        return;
    }
    for (int64_t t = t0; t < t1; t++) {
        int64_t m0 = t / ng * g->mc, rows = cuvil_min(g->mc, g->M - m0), q = t % ng;
        blocked_gemm b = *g;                 /* rows [m0, m0 + rows) as a GEMM of its own, into buf */
        gathered_source src;
        b.M = b.mc = rows, b.mb = 1, b.C = buf, b.ldc = ldc;
        if (g->gsrc) src = *g->gsrc, src.pix += m0, b.gsrc = &src;
        else b.A += m0 * CUVIL_BLOCK;
        blocked_gemm_task(&b, q, q + 1);
        int64_t c0 = q * BLOCKED_GROUP * CUVIL_NR, c1 = cuvil_min(c0 + BLOCKED_GROUP * CUVIL_NR, a->O);
        for (int64_t c = c0; c < c1; c += CUVIL_BLOCK)
            cuvil_nchw_from_rows(buf + c / CUVIL_BLOCK * ldc, CUVIL_BLOCK, rows, 0, cuvil_min(CUVIL_BLOCK, c1 - c),
                                 a->y + c * a->P + m0, a->residual ? a->residual + c * a->P + m0 : 0,
                                 a->bias ? a->bias + c : 0, a->P, a->act);
    }
}

int cuvil_conv_blocked_nchw_out(const cuvil_conv_shape *s, const float *x, const float *wb, const float *bias,
                                const float *residual, float *y, int act, float *scratch, int nthreads) {
    int64_t P = s->OH * s->OW, K = s->KH * s->KW * s->C, N = (s->O + CUVIL_BLOCK - 1) / CUVIL_BLOCK * CUVIL_BLOCK;
    int nt = P * N * K > 65536 ? nthreads : 1;
    int64_t in = s->C * s->H * s->W, out = s->O * P, np = (N + CUVIL_NR - 1) / CUVIL_NR, mb;
    int64_t mc = blocked_m_rows(P, panel_groups(np), nt, rows_unit(N, 0), &mb);
    blocked_input b = blocked_input_tables(s, scratch);
    for (int64_t n = 0; n < s->N; n++) {
        nchw_out_gemm a = {.O = s->O, .P = P, .y = y + n * out, .bias = bias,
                           .residual = residual ? residual + n * out : 0, .act = act};
        conv_image_gemm(&a.gg, s, &b, blocked_image(s, &b, x + n * in, scratch, nthreads), wb, N, mb, mc);
        cuvil_parallel_for(nt, mb * blocked_groups(&a.gg.g), 1, nchw_out_task, &a);
        if (a.out_of_memory) return -1;
    }
    return 0;
}

/* ---- a gate folded into a 1x1 conv ------------------------------------------------------------- */
int64_t cuvil_conv_gated_scratch(const cuvil_conv_shape *s) { return cuvil_packed_b_size(s->C, s->O); }

/* Panels [p0, p1) of the filters with row k (input channel k: a 1x1 conv's K order) scaled by gate[k]. */
typedef struct { const float *wb, *gate; float *out; int64_t K; } gate_filters;

static void gate_filters_task(void *ctx, int64_t p0, int64_t p1) {
    const gate_filters *a = ctx;
    for (int64_t p = p0; p < p1; p++)
        for (int64_t k = 0, i = p * a->K * CUVIL_NR; k < a->K; k++, i += CUVIL_NR) {
            cuvil_vf g = cuvil_vsplat(a->gate[k]);
            for (int j = 0; j < CUVIL_NR; j += CUVIL_VL)
                *(cuvil_vf *)(a->out + i + j) = cuvil_vload(a->wb + i + j) * g;
        }
}

int cuvil_conv_blocked_gated(const cuvil_conv_shape *s, const float *x, const float *wb, const float *gate,
                             int64_t gate_step, const float *bias, const float *residual, float *y, int act,
                             int nchw_out, float *scratch, int nthreads) {
    int64_t K = s->C, np = (s->O + CUVIL_NR - 1) / CUVIL_NR, in = s->C * s->H * s->W, out = s->O * s->OH * s->OW;
    cuvil_conv_shape one = *s;
    one.N = 1;
    float *w = scratch;
    scratch += cuvil_conv_gated_scratch(s);
    for (int64_t n = 0; n < s->N; n++) {
        gate_filters a = {wb, gate + n * gate_step, w, K};
        cuvil_parallel_for(np * K * CUVIL_NR > 65536 ? nthreads : 1, np, 1, gate_filters_task, &a);
        const float *r = residual ? residual + n * out : 0;
        if (!nchw_out) cuvil_conv_blocked(&one, x + n * in, w, bias, r, y + n * out, act, scratch, nthreads);
        else if (cuvil_conv_blocked_nchw_out(&one, x + n * in, w, bias, r, y + n * out, act, scratch, nthreads))
            return -1;
    }
    return 0;
}

/* ---- channels padded to whole blocks --------------------------------------------------------- */
void cuvil_zero_channels(int64_t N, int64_t C, int64_t HW, int64_t live, int blocked, float *y) {
    typedef int32_t lane_mask __attribute__((vector_size(sizeof(cuvil_vf))));
    for (int64_t n = 0; n < N; n++) {
        float *yn = y + n * C * HW;
        if (!blocked) {
            memset(yn + live * HW, 0, (size_t)((C - live) * HW) * sizeof(float));
            continue;
        }
        for (int64_t b = live / CUVIL_BLOCK; b < C / CUVIL_BLOCK; b++) {
            lane_mask keep;                  /* the block's real channels' lanes: all bits; its padding's: none */
            for (int l = 0; l < CUVIL_BLOCK; l++) keep[l] = b * CUVIL_BLOCK + l < live ? -1 : 0;
            for (float *q = yn + b * HW * CUVIL_BLOCK, *e = q + HW * CUVIL_BLOCK; q < e; q += CUVIL_BLOCK) {
                lane_mask v;                 /* by bits: a NaN times a zero mask would stay NaN */
                memcpy(&v, q, sizeof v);
                v &= keep;
                memcpy(q, &v, sizeof v);
            }
        }
    }
}

/* ---- convolution of an NCHW input into the blocked layout ---------------------------------- */
int64_t cuvil_conv_nchw_blocked_scratch(const cuvil_conv_shape *s) {
    return s->C * padded_h(s) * padded_w(s) + 2 * s->OH * s->OW;
}

void cuvil_conv_nchw_blocked(const cuvil_conv_shape *s, const float *x, const float *wb, const float *bias,
                             const float *residual, float *y, int act, float *scratch, int nthreads) {
    /* read in place where no window reaches past the input (a 1x1 conv: copying it had been a tenth
     * of MobileNetV2's 24 -> 144 channel convs) */
    int in_place = blocked_in_place(s);
    int64_t hp = in_place ? s->H : padded_h(s), wp = in_place ? s->W : padded_w(s), P = s->OH * s->OW, out = s->O * P;
    float *xp = scratch;
    int64_t *pix = (int64_t *)(scratch + (in_place ? 0 : s->C * hp * wp));
    blocked_pixel_table(s, wp, pix);
    nchw_source src = {xp, pix, s->C, s->KH, s->KW, s->dh, s->dw, hp * wp, wp};
    for (int64_t n = 0; n < s->N; n++) {
        const float *xn = x + n * s->C * s->H * s->W;
        if (in_place) src.x = xn;
        else {
            pad_args pa = {s, xn, xp, 1};
            cuvil_parallel_for(s->C * hp * wp > 16384 ? nthreads : 1, s->C * hp, 1, pad_task, &pa);
        }
        int nt = P * s->O * s->C * s->KH * s->KW > 65536 ? nthreads : 1;
        int64_t np = (s->O + CUVIL_NR - 1) / CUVIL_NR, mb, mc = blocked_m_rows(P, panel_groups(np), nt, rows_unit(s->O, &src), &mb);
        blocked_gemm g = {P, s->O, s->C * s->KH * s->KW, 0, P * CUVIL_BLOCK, np, mb, mc,
                          0, wb, bias, residual ? residual + n * out : 0, y + n * out, act, &src};
        cuvil_parallel_for(nt, g.mb * blocked_groups(&g), 1, blocked_gemm_task, &g);
    }
}

/* ---- windows: depthwise convolution and max pooling -------------------------------------- */
/* Lanes [v, v + VL) of output pixel (oh, ow) over its window's taps inside the input (pads skipped):
 * depthwise (1) adds each tap times its filter vector (w + tap * C, the block's channels), max (0)
 * keeps the largest. */
static inline __attribute__((always_inline)) cuvil_vf window(int depthwise, const cuvil_conv_shape *s, const float *xc,
                                                             const float *w, int64_t oh, int64_t ow, int v,
                                                             cuvil_vf acc) {
    int64_t ih0 = oh * s->sh - s->ph, iw0 = ow * s->sw - s->pw;
    /* a window wholly inside the input (most of them) skips the tests, with the shape in locals (the
     * stores may alias *s) and a max in two chains (benchmarks/README.md, Kernel notes) */
    if (ih0 >= 0 && iw0 >= 0 && ih0 + (s->KH - 1) * s->dh < s->H && iw0 + (s->KW - 1) * s->dw < s->W) {
        const int64_t KH = s->KH, KW = s->KW, row = s->dh * s->W * CUVIL_BLOCK, tap = s->dw * CUVIL_BLOCK;
        const float *x0 = xc + (ih0 * s->W + iw0) * CUVIL_BLOCK + v;
        cuvil_vf odd = acc;          /* two chains: a max waits on the one before it */
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++) {
                cuvil_vf e = cuvil_vload(x0 + kh * row + kw * tap);
                if (depthwise) acc += e * cuvil_vload(w + (kh * KW + kw) * s->C);
                else if ((kh * KW + kw) & 1) odd = cuvil_vmax_nan(odd, e);
                else acc = cuvil_vmax_nan(acc, e);
            }
        return depthwise ? acc : cuvil_vmax_nan(acc, odd);
    }
    for (int64_t kh = 0; kh < s->KH; kh++) {
        int64_t ih = ih0 + kh * s->dh;
        if (ih < 0 || ih >= s->H) continue;
        for (int64_t kw = 0; kw < s->KW; kw++) {
            int64_t iw = iw0 + kw * s->dw;
            if (iw < 0 || iw >= s->W) continue;
            cuvil_vf e = cuvil_vload(xc + (ih * s->W + iw) * CUVIL_BLOCK + v);
            if (depthwise) acc += e * cuvil_vload(w + (kh * s->KW + kw) * s->C);
            else acc = cuvil_vmax_nan(acc, e);
        }
    }
    return acc;
}

typedef struct {
    const cuvil_conv_shape *s;
    const float *x, *w, *bias, *residual;
    float *y;
    int act;
    const cuvil_byte_image *out;  /* the next integer conv's input bytes instead of y, or 0 */
    float *row_sums;              /* each output row's sum over its pixels, B floats a row, or 0 */
} blocked_dw;

/* Output row r's sum over its pixels into row_sums, where asked for (the squeeze's mean: the row was just
 * written, so it is read from L1 rather than from the map once it is done). Two chains of adds. */
static inline void dw_row_sum(const blocked_dw *a, int64_t r) {
    if (!a->row_sums) return;
    const int64_t OW = a->s->OW;
    const float *y = a->y + r * OW * CUVIL_BLOCK;
    cuvil_vf s0 = cuvil_vsplat(0.f), s1 = cuvil_vsplat(0.f);
    int64_t ow = 0;
    for (; ow + 1 < OW; ow += 2) s0 += cuvil_vload(y + ow * CUVIL_BLOCK), s1 += cuvil_vload(y + (ow + 1) * CUVIL_BLOCK);
    if (ow < OW) s0 += cuvil_vload(y + ow * CUVIL_BLOCK);
    *(cuvil_vf *)(a->row_sums + r * CUVIL_BLOCK) = s0 + s1;
}

/* T output vectors (activated) from blocked offset off, as the next integer conv's input bytes: each
 * pixel's channels at its place in the byte image, the pixels a strided reader's image drops skipped. */
static __attribute__((noinline)) void dw_store_bytes(const blocked_dw *a, int64_t off, const cuvil_vf *acc, int T) {
    const cuvil_conv_shape *s = a->s;
    const cuvil_byte_image *b = a->out;
    int64_t pix = off / CUVIL_BLOCK, r = pix / s->OW, ow = pix % s->OW, plane = r / s->OH, oh = r % s->OH;
    int64_t CB = s->C / CUVIL_BLOCK, n = plane / CB, c = plane % CB * CUVIL_BLOCK;
    if (oh + b->ph >= b->hp)
        return;
    uint8_t *q = b->q + ((n * b->hp + oh + b->ph) * b->wp + ow + b->pw) * b->C + c;
    for (int j = 0; j < T && ow + j + b->pw < b->wp; j++) cuvil_to_bytes(acc[j], b->inv, b->zero, b->top, q + j * b->C);
}

/* Adjacent output pixels of a row computed together where their windows lie inside the input: each
 * input vector loaded once per filter row for all of them, each filter vector once per tile, and 8 sums
 * in flight cover the FMA's latency at two a cycle (tiles of 4 left an FMA unit idle: 3x3 on 144
 * channels at 56x56 took 13 cycles an output vector where its 9 multiply-adds need 4.5; 8 took 9.5, and
 * a 7x7 filter half the time). The top and bottom rows run tiled over the filter rows inside the map;
 * edge columns go one by one over their clipped windows (dw_clipped): copying them zero-padded, or whole
 * rows, to run them tiled too measured slower on AVX2 (the copies cost what the tiles saved). */
#define DW_TILE 8

/* The sums of T pixels over filter rows [kh0, kh1) from x0, their first window's leftmost input pixel in
 * filter row kh0: KW, SW (the filter's width, the stride along W) and T constants, so the loads' offsets
 * are; each filter row's inputs loaded once into registers for all taps (GCC had folded them into the
 * multiply-adds, loading each up to KW times); kh0, kh1 constants too inside the map (dw_row); dilation
 * 1 along W. */
static inline __attribute__((always_inline)) void dw_tile(int KW, int SW, int T, int kh0, int kh1,
                                                          const cuvil_conv_shape *s, const float *x0,
                                                          const float *w, cuvil_vf *acc) {
    const int64_t row = s->dh * s->W * CUVIL_BLOCK, C = s->C;
    #pragma GCC unroll 7
    for (int kh = kh0; kh < kh1; kh++) {
        const float *xr = x0 + (kh - kh0) * row, *wr = w + kh * KW * C;
        cuvil_vf xv[(DW_TILE - 1) * 2 + 7];
        #pragma GCC unroll 40
        for (int i = 0; i < (T - 1) * SW + KW; i++) xv[i] = cuvil_vload(xr + i * CUVIL_BLOCK);
        #pragma GCC unroll 7
        for (int kw = 0; kw < KW; kw++) {
            cuvil_vf wv = cuvil_vload(wr + kw * C);
            #pragma GCC unroll 16
            for (int j = 0; j < T; j++) acc[j] += xv[j * SW + kw] * wv;
        }
    }
}

/* act on T sums, the switch outside the loops (ReLU and ReLU6 inline): tested per vector in the tiles'
 * stores, with the struct reread after each store (y may alias it), they had cost 4-13% of a 3x3 conv
 * (dw_bench). */
static inline __attribute__((always_inline)) void dw_activate(int T, cuvil_vf *acc, int act) {
    switch (act) {
    case CUVIL_ACT_NONE: break;
    case CUVIL_ACT_RELU:
        #pragma GCC unroll 16
        for (int j = 0; j < T; j++) acc[j] = cuvil_vrelu(acc[j]);     /* NaN stays */
        break;
    case CUVIL_ACT_RELU6:
        #pragma GCC unroll 16
        for (int j = 0; j < T; j++) acc[j] = cuvil_vrelu6(acc[j]);
        break;
    default:
        #pragma GCC unroll 16
        for (int j = 0; j < T; j++) acc[j] = cuvil_vact(acc[j], act);
    }
}

/* residual and activation of one output vector o of a depthwise conv (its bias in acc), stored: the
 * edge pixels' */
static inline void dw_store(const blocked_dw *a, int64_t o, cuvil_vf acc) {
    if (a->residual) acc += cuvil_vload(a->residual + o);
    dw_activate(1, &acc, a->act);
    if (a->out) dw_store_bytes(a, o, &acc, 1);
    else cuvil_vstore(a->y + o, acc);
}

/* T pixels from ow of one output row over filter rows [kh0, kh1) (off: the row's offset in y; xr: the
 * input row of filter row kh0 at the window of output pixel 0, which may lie left of the row: only
 * offsets from it are formed) */
static inline __attribute__((always_inline)) void dw_pixels(int KW, int SW, int T, int kh0, int kh1,
                                                            const blocked_dw *a, const float *xr, int64_t ow,
                                                            const float *w, cuvil_vf bias, int64_t off) {
    cuvil_vf acc[DW_TILE];
    #pragma GCC unroll 8
    for (int j = 0; j < T; j++) acc[j] = bias;
    dw_tile(KW, SW, T, kh0, kh1, a->s, xr + (ow * SW - a->s->pw) * CUVIL_BLOCK, w, acc);
    float *y = a->y + off + ow * CUVIL_BLOCK;
    const float *res = a->residual ? a->residual + off + ow * CUVIL_BLOCK : 0;
    if (res) {
        #pragma GCC unroll 16
        for (int j = 0; j < T; j++) acc[j] += cuvil_vload(res + j * CUVIL_BLOCK);
    }
    dw_activate(T, acc, a->act);
    if (a->out) {
        cuvil_vf sums[DW_TILE];          /* a copy: acc's address taken kept it in memory on every path */
        #pragma GCC unroll 16
        for (int j = 0; j < T; j++) sums[j] = acc[j];
        dw_store_bytes(a, off + ow * CUVIL_BLOCK, sums, T);
        return;
    }
    #pragma GCC unroll 16
    for (int j = 0; j < T; j++) cuvil_vstore(y + j * CUVIL_BLOCK, acc[j]);
}

/* Pixels [ow, end) of a row whose windows lie inside the input along W: tiles of 8, of 4, then the rest. */
static inline __attribute__((always_inline)) void dw_inside(int KW, int SW, int kh0, int kh1, const blocked_dw *a,
                                                            const float *xr, const float *w, cuvil_vf bias,
                                                            int64_t off, int64_t ow, int64_t end) {
    for (; ow + 8 <= end; ow += 8) dw_pixels(KW, SW, 8, kh0, kh1, a, xr, ow, w, bias, off);
    if (ow + 4 <= end) {
        dw_pixels(KW, SW, 4, kh0, kh1, a, xr, ow, w, bias, off);
        ow += 4;
    }
    switch (end - ow) {             /* the last 1-3 pixels as one tile (a 7x7 map's row had been 4 + 1 + 1 + 1) */
    case 3: dw_pixels(KW, SW, 3, kh0, kh1, a, xr, ow, w, bias, off); break;
    case 2: dw_pixels(KW, SW, 2, kh0, kh1, a, xr, ow, w, bias, off); break;
    case 1: dw_pixels(KW, SW, 1, kh0, kh1, a, xr, ow, w, bias, off); break;
    default: break;
    }
}

/* One output row of a 3x3 depthwise conv (dw3_run): its input row of filter row 0 and the offset of the
 * rows after it, the filter vectors (in registers), and where the row goes. */
typedef struct {
    const blocked_dw *a;
    const float *xr, *res;
    float *y;
    int64_t row, pw;
    uint8_t *q;                   /* into bytes: the row's first pixel's channels in the image, 0 where the
                                   * image drops the row (a strided reader's) */
    int64_t cols;                 /* and the pixels of the row the image keeps */
    cuvil_vf wv[9], bias;
} dw3_row_args;

/* T pixels from ow of a 3x3 filter's interior row: the sums of its taps, then the residual and the
 * activation (act a constant; DW3_OTHER: a->act through cuvil_vact) as each vector is stored, into
 * floats or (bytes) the next integer conv's input bytes. */
#define DW3_OTHER (-1)
static inline __attribute__((always_inline)) void dw3_tile(int T, int SW, int act, int bytes, const dw3_row_args *r,
                                                           int64_t ow) {
    const float *x0 = r->xr + (ow * SW - r->pw) * CUVIL_BLOCK;
    cuvil_vf acc[8];
    #pragma GCC unroll 8
    for (int j = 0; j < T; j++) acc[j] = r->bias;
    #pragma GCC unroll 3
    for (int kh = 0; kh < 3; kh++)
        #pragma GCC unroll 3
        for (int kw = 0; kw < 3; kw++)
            #pragma GCC unroll 8
            for (int j = 0; j < T; j++)
                acc[j] += cuvil_vload(x0 + kh * r->row + (j * SW + kw) * CUVIL_BLOCK) * r->wv[kh * 3 + kw];
    #pragma GCC unroll 8
    for (int j = 0; j < T; j++) {
        if (r->res) acc[j] += cuvil_vload(r->res + (ow + j) * CUVIL_BLOCK);
        if (act == CUVIL_ACT_RELU) acc[j] = cuvil_vrelu(acc[j]);              /* NaN stays NaN, as torch's */
        else if (act == CUVIL_ACT_RELU6) acc[j] = cuvil_vrelu6(acc[j]);
        else if (act != CUVIL_ACT_NONE) acc[j] = cuvil_vact(acc[j], act == DW3_OTHER ? r->a->act : act);
        if (!bytes) cuvil_vstore(r->y + (ow + j) * CUVIL_BLOCK, acc[j]);
    }
    if (bytes && r->q) {          /* the row's place in the image taken once (dw_store_bytes divides per tile) */
        const cuvil_byte_image *b = r->a->out;
        #pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            if (ow + j < r->cols) cuvil_to_bytes(acc[j], b->inv, b->zero, b->top, r->q + (ow + j) * b->C);
    }
}

/* Pixels [ow, end) of an output row whose 3x3 windows lie wholly inside the input, in tiles of 8, then 4,
 * then the last 1-3. The 9 filter vectors are loaded once a row (in registers on AVX-512; AVX2's and
 * SSE2's 16 registers spill some beside the 8 sums), and the activation and the
 * output's kind are constants of each copy. dw_inside's general tiles (filter vectors reloaded each tile,
 * the sums' address taken for the byte store on every path, the epilogue's flags read per tile) ran a
 * 3x3 conv at 1.9-2.4 ns an output vector on Zen 5 where this takes 1.4-1.9
 * (benchmarks/harness/dw_bench.c; alike or faster on an AVX2 build). */
static inline __attribute__((always_inline)) void dw3_run(int SW, int act, int bytes, const blocked_dw *a,
                                                          const float *xr, const float *w, cuvil_vf bias,
                                                          int64_t off, int64_t ow, int64_t end) {
    const cuvil_conv_shape *s = a->s;
    dw3_row_args r = {a, xr, a->residual ? a->residual + off : 0, a->y + off, s->dh * s->W * CUVIL_BLOCK, s->pw};
    r.bias = bias;
    if (bytes) {
        const cuvil_byte_image *b = a->out;
        int64_t rows = off / CUVIL_BLOCK / s->OW, plane = rows / s->OH, oh = rows % s->OH, CB = s->C / CUVIL_BLOCK;
        r.q = oh + b->ph < b->hp ? b->q + ((plane / CB * b->hp + oh + b->ph) * b->wp + b->pw) * b->C + plane % CB * CUVIL_BLOCK : 0;
        r.cols = b->wp - b->pw;
    }
    #pragma GCC unroll 9
    for (int t = 0; t < 9; t++) r.wv[t] = cuvil_vload(w + t * s->C);
    for (; ow + 8 <= end; ow += 8) dw3_tile(8, SW, act, bytes, &r, ow);
    if (ow + 4 <= end) {
        dw3_tile(4, SW, act, bytes, &r, ow);
        ow += 4;
    }
    switch (end - ow) {
    case 3: dw3_tile(3, SW, act, bytes, &r, ow); break;
    case 2: dw3_tile(2, SW, act, bytes, &r, ow); break;
    case 1: dw3_tile(1, SW, act, bytes, &r, ow); break;
    default: break;
    }
}

/* dw3_run for stride SW and output kind `bytes`: one copy per activation MobileNets and EfficientNets use
 * (ReLU, ReLU6, hardswish, SiLU, none), the others through cuvil_vact's switch a vector (with ReLU6
 * there, MobileNetV2's first depthwise conv into bytes had taken 1.6x the time) */
static inline __attribute__((always_inline)) void dw3_acts(int SW, int bytes, const blocked_dw *a, const float *xr,
                                                           const float *w, cuvil_vf bias, int64_t off, int64_t ow,
                                                           int64_t end) {
    switch (a->act) {
    case CUVIL_ACT_NONE: dw3_run(SW, CUVIL_ACT_NONE, bytes, a, xr, w, bias, off, ow, end); break;
    case CUVIL_ACT_RELU: dw3_run(SW, CUVIL_ACT_RELU, bytes, a, xr, w, bias, off, ow, end); break;
    case CUVIL_ACT_RELU6: dw3_run(SW, CUVIL_ACT_RELU6, bytes, a, xr, w, bias, off, ow, end); break;
    case CUVIL_ACT_HARDSWISH: dw3_run(SW, CUVIL_ACT_HARDSWISH, bytes, a, xr, w, bias, off, ow, end); break;
    case CUVIL_ACT_SILU: dw3_run(SW, CUVIL_ACT_SILU, bytes, a, xr, w, bias, off, ow, end); break;
    default: dw3_run(SW, DW3_OTHER, bytes, a, xr, w, bias, off, ow, end); break;
    }
}

static inline __attribute__((always_inline)) void dw3_row(int SW, const blocked_dw *a, const float *xr,
                                                          const float *w, cuvil_vf bias, int64_t off, int64_t ow,
                                                          int64_t end) {
    if (a->out) dw3_acts(SW, 1, a, xr, w, bias, off, ow, end);
    else dw3_acts(SW, 0, a, xr, w, bias, off, ow, end);
}

/* A row's inside pixels: a 3x3 filter's whole rows by dw3_row; else dw_inside for the filter widths and
 * strides MobileNets, EfficientNets and ConvNeXt use (square filters), one switch a row, the whole filter's
 * rows as constants; 0 for the others (left to window), else 1 */
static int dw_row(const blocked_dw *a, const float *xr, const float *w, cuvil_vf bias, int64_t off,
                  int64_t ow, int64_t end, int kh0, int kh1) {
    const int whole = kh0 == 0 && kh1 == a->s->KH;
    if (whole && a->s->KH == 3 && a->s->KW == 3 && a->s->dw == 1 && (a->s->sw == 1 || a->s->sw == 2)) {
        if (a->s->sw == 1) dw3_row(1, a, xr, w, bias, off, ow, end);
        else dw3_row(2, a, xr, w, bias, off, ow, end);
        return 1;
    }
#define DW_ROW_CASE(KW, SW) case KW * 4 + SW:                                                        \
        if (whole) dw_inside(KW, SW, 0, KW, a, xr, w, bias, off, ow, end);                              \
        else dw_inside(KW, SW, kh0, kh1, a, xr, w, bias, off, ow, end);                                 \
        return 1;
    switch (a->s->dw == 1 && a->s->KH == a->s->KW ? a->s->KW * 4 + a->s->sw : 0) {
    DW_ROW_CASE(3, 1) DW_ROW_CASE(3, 2) DW_ROW_CASE(5, 1) DW_ROW_CASE(5, 2) DW_ROW_CASE(7, 1)
    default: return 0;
    }
#undef DW_ROW_CASE
}

/* Output pixel ow of a row from its filter rows [kh0, kh1) (xk: the input row of kh0) and the filter
 * columns whose inputs lie inside the row: an edge pixel, with no test per tap. */
static inline cuvil_vf dw_clipped(const cuvil_conv_shape *s, const float *xk, const float *w, int64_t kh0,
                                  int64_t kh1, int64_t ow, cuvil_vf acc) {
    const int64_t row = s->dh * s->W * CUVIL_BLOCK, C = s->C, KW = s->KW;
    int64_t iw0, kw0, kw1;
    cuvil_window_taps(ow, s->sw, s->pw, s->dw, KW, s->W, &iw0, &kw0, &kw1);
    for (int64_t kh = kh0; kh < kh1; kh++)
        for (int64_t kw = kw0; kw < kw1; kw++)
            acc += cuvil_vload(xk + (kh - kh0) * row + (iw0 + kw * s->dw) * CUVIL_BLOCK) * cuvil_vload(w + (kh * KW + kw) * C);
    return acc;
}

/* Output rows r = (n * C / B + cb) * OH + oh in [r0, r1): each output pixel's B channels a vector, the
 * taps' B filter values (w [KH * KW][C]) side by side as the input's channels are; tiles of pixels
 * where the windows lie inside the input along W (dw_row, over the filter rows inside the map), the
 * edge columns one by one (dw_clipped); window for the filters dw_row leaves. */
static void depthwise_blocked_task(void *ctx, int64_t r0, int64_t r1) {
    const blocked_dw *a = ctx;
    const cuvil_conv_shape *s = a->s;
    const int64_t CB = s->C / CUVIL_BLOCK;
    /* the first pixel whose window starts inside the input along W, one past the last that ends in it */
    int64_t first, end;
    cuvil_inside_columns(s, &first, &end);
    for (int64_t t = r0; t < r1; t++) {
        /* into bytes, task t is row t / planes of plane t % planes: a thread's run of tasks is whole pixels,
         * whose channels share cache lines there (split by planes, 2 threads wrote the halves of each
         * pixel's 32 bytes: MobileNetV2 1.07x the time) */
        int64_t planes = s->N * CB, r = a->out ? t % planes * s->OH + t / planes : t;
        int64_t plane = r / s->OH, oh = r % s->OH, c = plane % CB * CUVIL_BLOCK;
        const float *xc = a->x + plane * s->H * s->W * CUVIL_BLOCK, *w = a->w + c;
        int64_t off = r * s->OW * CUVIL_BLOCK, ow = 0, ih0, kh0, kh1;
        cuvil_vf bias = a->bias ? cuvil_vload(a->bias + c) : cuvil_vsplat(0.f);
        /* the filter rows whose input rows lie inside the map: all but at the top and bottom edges */
        cuvil_window_taps(oh, s->sh, s->ph, s->dh, s->KH, s->H, &ih0, &kh0, &kh1);
        if (kh0 < kh1 && first < end) {
            const float *xk = xc + (ih0 + kh0 * s->dh) * s->W * CUVIL_BLOCK;
            for (; ow < first; ow++) dw_store(a, off + ow * CUVIL_BLOCK, dw_clipped(s, xk, w, kh0, kh1, ow, bias));
            if (dw_row(a, xk, w, bias, off, first, end, (int)kh0, (int)kh1)) {
                for (ow = end; ow < s->OW; ow++)
                    dw_store(a, off + ow * CUVIL_BLOCK, dw_clipped(s, xk, w, kh0, kh1, ow, bias));
            }
        }
        for (; ow < s->OW; ow++) dw_store(a, off + ow * CUVIL_BLOCK, window(1, s, xc, w, oh, ow, 0, bias));
        dw_row_sum(a, r);
    }
}

/* Small maps a plane at a time from a zero-padded copy on the task's stack, so that every pixel's window
 * lies inside it and every row runs in tiles: at 14x14 and 7x7 a 5x5 filter's edge pixels are half and
 * four fifths of the map, and one by one (window) they had held EfficientNet's depthwise convs to 28-31
 * GFLOP/s. Larger maps keep their edges one by one (a small share of them). */
#define DW_PLANE_MAX_FLOATS (1 << 14)     /* 64 KiB: a 5x5 filter's padded 28x28 map */

static inline int dw_plane_copy_fits(const cuvil_conv_shape *s) {
    /* not a 3x3 stride-2 conv: it copies 4 input pixels an output pixel, and dw3_row's tiles with the
     * edges one by one took 0.6-0.85x its time (dw_bench, Zen 5: 192 channels 28x28 -> 14x14 16.5 -> 9.7
     * us, 576 channels 14x14 -> 7x7 11.5 -> 9.8; stride 1 at 14x14 alike, at 7x7 the copy still wins) */
    if (s->KH == 3 && s->KW == 3 && s->sh == 2 && s->sw == 2)
        return 0;
    return s->dw == 1 && padded_h(s) * padded_w(s) * CUVIL_BLOCK <= DW_PLANE_MAX_FLOATS;
}

/* Planes q = n * C / B + cb in [q0, q1): copied padded, then row by row in tiles over the copy's
 * geometry (a shape without pads whose input is the copy). */
static void depthwise_blocked_plane_task(void *ctx, int64_t q0, int64_t q1) {
    const blocked_dw *a = ctx;
    const cuvil_conv_shape *s = a->s;
    float buf[DW_PLANE_MAX_FLOATS] __attribute__((aligned(64)));
    cuvil_conv_shape ps = *s;
    ps.H = padded_h(s), ps.W = padded_w(s), ps.ph = ps.pw = 0;
    blocked_dw pa = *a;
    pa.s = &ps;
    for (int64_t q = q0; q < q1; q++) {
        cuvil_pad_rows(a->x + q * s->H * s->W * CUVIL_BLOCK, s->H, s->W, CUVIL_BLOCK, -s->ph, ps.H, s->pw, ps.W, buf);
        int64_t c = q % (s->C / CUVIL_BLOCK) * CUVIL_BLOCK;
        const float *w = a->w + c;
        cuvil_vf bias = a->bias ? cuvil_vload(a->bias + c) : cuvil_vsplat(0.f);
        for (int64_t oh = 0; oh < s->OH; oh++) {
            int64_t off = (q * s->OH + oh) * s->OW * CUVIL_BLOCK;
            const float *xr = buf + oh * s->sh * ps.W * CUVIL_BLOCK;
            if (!dw_row(&pa, xr, w, bias, off, 0, s->OW, 0, (int)s->KH))
                for (int64_t ow = 0; ow < s->OW; ow++) dw_store(&pa, off + ow * CUVIL_BLOCK, window(1, &ps, buf, w, oh, ow, 0, bias));
            dw_row_sum(a, q * s->OH + oh);
        }
    }
}

static void depthwise_blocked_run(const blocked_dw *a, int nthreads) {
    const cuvil_conv_shape *s = a->s;
    int64_t planes = s->N * (s->C / CUVIL_BLOCK), rows = planes * s->OH;
    int nt = rows * s->OW * s->KH * s->KW * CUVIL_BLOCK > 65536 ? nthreads : 1;
    if (dw_plane_copy_fits(s) && !a->out) cuvil_parallel_for(nt, planes, 1, depthwise_blocked_plane_task, (void *)a);
    else cuvil_parallel_for(nt, rows, 1, depthwise_blocked_task, (void *)a);
}

void cuvil_depthwise_blocked(const cuvil_conv_shape *s, const float *x, const float *w, const float *bias,
                             const float *residual, float *y, int act, int nthreads) {
    blocked_dw a = {s, x, w, bias, residual, y, act, 0, 0};
    depthwise_blocked_run(&a, nthreads);
}

void cuvil_depthwise_blocked_mean(const cuvil_conv_shape *s, const float *x, const float *w, const float *bias,
                                  const float *residual, float *y, int act, float *mean, float *scratch,
                                  int nthreads) {
    blocked_dw a = {s, x, w, bias, residual, y, act, 0, scratch};
    depthwise_blocked_run(&a, nthreads);
    const cuvil_vf scale = cuvil_vsplat(1.f / (float)(s->OH * s->OW));
    for (int64_t q = 0; q < s->N * (s->O / CUVIL_BLOCK); q++) {     /* plane q: mean + q * B, as in NCHW */
        cuvil_vf sum = cuvil_vsplat(0.f);
        for (int64_t oh = 0; oh < s->OH; oh++) sum += cuvil_vload(scratch + (q * s->OH + oh) * CUVIL_BLOCK);
        *(cuvil_vf *)(mean + q * CUVIL_BLOCK) = sum * scale;
    }
}

void cuvil_depthwise_blocked_to_bytes(const cuvil_conv_shape *s, const float *x, const float *w, const float *bias,
                                      const float *residual, uint8_t *y, const int64_t *out_image,
                                      const float *out_range, int act, int nthreads) {
    float scale, zero;
    cuvil_byte_scale(out_range[0], out_range[1], (float)CUVIL_I8_LEVELS, &scale, &zero);
    cuvil_byte_image bytes = {y, 1.f / scale, zero, (float)CUVIL_I8_LEVELS, s->OW, s->O,
                              out_image[0], out_image[1], out_image[2], out_image[3]};
    for (int64_t n = 0; n < s->N; n++)
        cuvil_byte_border(y + n * bytes.hp * bytes.wp * s->O, out_image, s->OH, s->OW, s->O, (uint8_t)zero);
    blocked_dw a = {s, x, w, bias, residual, 0, act, &bytes, 0};
    depthwise_blocked_run(&a, nthreads);
}

typedef struct { const cuvil_conv_shape *s; const float *x; float *y; } blocked_pool;

/* T pixels from ow of a pooled row whose windows lie inside the input along W, over the filter rows
 * [kh0, kh1) (xr: the input row of kh0; any number of them): K (the window's width) and SW constants,
 * each input vector of a filter row loaded once for the T windows it falls in. */
static inline __attribute__((always_inline)) void pool_tile(int K, int SW, int T, const cuvil_conv_shape *s,
                                                            const float *xr, int64_t kh0, int64_t kh1, int64_t ow,
                                                            float *d) {
    const float *x0 = xr + (ow * SW - s->pw) * CUVIL_BLOCK;
    const int64_t row = s->dh * s->W * CUVIL_BLOCK;
    cuvil_vf acc[8];
    #pragma GCC unroll 8
    for (int j = 0; j < T; j++) acc[j] = cuvil_vsplat(-INFINITY);
    for (int64_t kh = kh0; kh < kh1; kh++)
        #pragma GCC unroll 3
        for (int kw = 0; kw < K; kw++)
            #pragma GCC unroll 8
            for (int j = 0; j < T; j++)
                acc[j] = cuvil_vmax_nan(acc[j], cuvil_vload(x0 + (kh - kh0) * row + (j * SW + kw) * CUVIL_BLOCK));
    #pragma GCC unroll 8
    for (int j = 0; j < T; j++) cuvil_vstore(d + (ow + j) * CUVIL_BLOCK, acc[j]);
}

/* Pixels [ow, end) of a pooled row in tiles of 8, then 4, then one by one (pool_tile). */
static inline __attribute__((always_inline)) void pool_inside(int K, int SW, const cuvil_conv_shape *s,
                                                              const float *xr, int64_t kh0, int64_t kh1,
                                                              int64_t ow, int64_t end, float *d) {
    for (; ow + 8 <= end; ow += 8) pool_tile(K, SW, 8, s, xr, kh0, kh1, ow, d);
    if (ow + 4 <= end) {
        pool_tile(K, SW, 4, s, xr, kh0, kh1, ow, d);
        ow += 4;
    }
    for (; ow < end; ow++) pool_tile(K, SW, 1, s, xr, kh0, kh1, ow, d);
}

/* Output rows r = (n * C / B + cb) * OH + oh in [r0, r1): each pixel's B channels in vectors. The
 * pixels whose windows lie inside the input along W in tiles (windows 2 or 3 wide, any height, strides 1
 * and 2 along W, undilated along W: ResNet's, SqueezeNet's and VGG's pools), over the window's rows inside the map; the
 * rest one by one (window). One window at a time, the 3x3 stride-2 pool after SqueezeNet's first conv
 * took 36 cycles an output vector. */
static void max_pool_blocked_task(void *ctx, int64_t r0, int64_t r1) {
    const blocked_pool *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t first, end;
    cuvil_inside_columns(s, &first, &end);
    int tiled = s->dw == 1 && (s->KW == 2 || s->KW == 3) && (s->sw == 1 || s->sw == 2) && first < end;
    for (int64_t r = r0; r < r1; r++) {
        int64_t plane = r / s->OH, oh = r % s->OH, ow = 0, ih0, kh0, kh1;
        const float *xc = a->x + plane * s->H * s->W * CUVIL_BLOCK;
        float *d = a->y + r * s->OW * CUVIL_BLOCK;
        cuvil_window_taps(oh, s->sh, s->ph, s->dh, s->KH, s->H, &ih0, &kh0, &kh1);
        if (tiled && kh0 < kh1) {
            const float *xr = xc + (ih0 + kh0 * s->dh) * s->W * CUVIL_BLOCK;
            for (; ow < first; ow++) cuvil_vstore(d + ow * CUVIL_BLOCK, window(0, s, xc, 0, oh, ow, 0, cuvil_vsplat(-INFINITY)));
            switch (s->KW * 4 + s->sw) {
            case 2 * 4 + 1: pool_inside(2, 1, s, xr, kh0, kh1, ow, end, d); break;
            case 2 * 4 + 2: pool_inside(2, 2, s, xr, kh0, kh1, ow, end, d); break;
            case 3 * 4 + 1: pool_inside(3, 1, s, xr, kh0, kh1, ow, end, d); break;
            default: pool_inside(3, 2, s, xr, kh0, kh1, ow, end, d); break;
            }
            ow = end;
        }
        for (; ow < s->OW; ow++)
            for (int v = 0; v < CUVIL_BLOCK; v += CUVIL_VL)
                cuvil_vstore(d + ow * CUVIL_BLOCK + v, window(0, s, xc, 0, oh, ow, v, cuvil_vsplat(-INFINITY)));
    }
}

void cuvil_max_pool_blocked(const cuvil_conv_shape *s, const float *x, float *y, int nthreads) {
    blocked_pool a = {s, x, y};
    int64_t rows = s->N * (s->C / CUVIL_BLOCK) * s->OH;
    cuvil_parallel_for(rows * s->OW * CUVIL_BLOCK > 16384 ? nthreads : 1, rows, 1, max_pool_blocked_task, &a);
}

typedef struct { const cuvil_conv_shape *s; const uint8_t *x; uint8_t *y; } byte_pool;

/* Output rows r = n * OH + oh in [r0, r1): each pixel's C bytes the maximum of its window's (vpmaxub). */
static void max_pool_bytes_task(void *ctx, int64_t r0, int64_t r1) {
    const byte_pool *a = ctx;
    const cuvil_conv_shape *s = a->s;
    const int64_t C = s->C;
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / s->OH, oh = r % s->OH;
        uint8_t *d = a->y + r * s->OW * C;
        for (int64_t ow = 0; ow < s->OW; ow++, d += C) {
            int first = 1;
            for (int64_t kh = 0; kh < s->KH; kh++) {
                int64_t ih = oh * s->sh - s->ph + kh * s->dh;
                if (ih < 0 || ih >= s->H) continue;
                for (int64_t kw = 0; kw < s->KW; kw++) {
                    int64_t iw = ow * s->sw - s->pw + kw * s->dw;
                    if (iw < 0 || iw >= s->W) continue;
                    const uint8_t *p = a->x + ((n * s->H + ih) * s->W + iw) * C;
                    if (first) memcpy(d, p, C), first = 0;
                    else
                        for (int64_t c = 0; c < C; c++) d[c] = p[c] > d[c] ? p[c] : d[c];
                }
            }
            if (first) memset(d, 0, C);
        }
    }
}

void cuvil_max_pool_bytes(const cuvil_conv_shape *s, const uint8_t *x, uint8_t *y, int nthreads) {
    byte_pool a = {s, x, y};
    int64_t rows = s->N * s->OH;
    cuvil_parallel_for(rows * s->OW * s->C > 65536 ? nthreads : 1, rows, 1, max_pool_bytes_task, &a);
}

/* ---- relayout ---------------------------------------------------------------------------- */
typedef struct { int64_t C, HW; int to_blocked; const float *x; float *y; } relayout_args;

/* B x B squares of (channel, pixel) turned over: the NCHW side's rows are HW floats apart, the
 * blocked side's B. */
static inline void turn_block(const float *src, int64_t lds, float *dst, int64_t ldd, int64_t rows, int64_t cols) {
#if defined(CUVIL_TRANSPOSE_BLOCK) && CUVIL_BLOCK % 8 == 0
    if (rows == CUVIL_BLOCK && cols == CUVIL_BLOCK) {
        for (int i = 0; i < CUVIL_BLOCK; i += 8)
            for (int j = 0; j < CUVIL_BLOCK; j += 8) {
                __m256 t[8];
                transpose8(src + i * lds + j, lds, t);
                for (int u = 0; u < 8; u++) _mm256_storeu_ps(dst + (j + u) * ldd + i, t[u]);
            }
        return;
    }
#endif
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) dst[j * ldd + i] = src[i * lds + j];
}

/* Tasks: one (image, channel block) plane each. */
static void relayout_task(void *ctx, int64_t q0, int64_t q1) {
    const relayout_args *a = ctx;
    for (int64_t q = q0; q < q1; q++) {
        const float *src = a->x + q * CUVIL_BLOCK * a->HW;
        float *dst = a->y + q * CUVIL_BLOCK * a->HW;
        for (int64_t p = 0; p < a->HW; p += CUVIL_BLOCK) {
            int64_t n = a->HW - p < CUVIL_BLOCK ? a->HW - p : CUVIL_BLOCK;
            if (a->to_blocked) turn_block(src + p, a->HW, dst + p * CUVIL_BLOCK, CUVIL_BLOCK, CUVIL_BLOCK, n);
            else turn_block(src + p * CUVIL_BLOCK, CUVIL_BLOCK, dst + p, a->HW, n, CUVIL_BLOCK);
        }
    }
}

/* Tasks: one (image, pixel) each, its C / B vectors moved between the planes and the pixel's row. */
static void blocked_nhwc_task(void *ctx, int64_t p0, int64_t p1) {
    const relayout_args *a = ctx;
    const int64_t C = a->C, HW = a->HW, planes = C / CUVIL_BLOCK;
    for (int64_t p = p0; p < p1; p++) {
        int64_t n = p / HW, px = p % HW;
        const int64_t plane0 = n * C * HW + px * CUVIL_BLOCK;     /* pixel px of block 0 of image n */
        for (int64_t cb = 0; cb < planes; cb++) {
            if (a->to_blocked) cuvil_vstore(a->y + plane0 + cb * HW * CUVIL_BLOCK, cuvil_vload(a->x + p * C + cb * CUVIL_BLOCK));
            else cuvil_vstore(a->y + p * C + cb * CUVIL_BLOCK, cuvil_vload(a->x + plane0 + cb * HW * CUVIL_BLOCK));
        }
    }
}

void cuvil_blocked_nhwc(int64_t N, int64_t C, int64_t HW, int to_nhwc, const float *x, float *y, int nthreads) {
    relayout_args a = {C, HW, !to_nhwc, x, y};
    cuvil_parallel_for(N * C * HW > 16384 ? nthreads : 1, N * HW, 64, blocked_nhwc_task, &a);
}

void cuvil_relayout(int64_t N, int64_t C, int64_t HW, int to_blocked, const float *x, float *y, int nthreads) {
    relayout_args a = {C, HW, to_blocked, x, y};
    int64_t planes = N * C / CUVIL_BLOCK;
    cuvil_parallel_for(planes * HW * CUVIL_BLOCK > 16384 ? nthreads : 1, planes, 1, relayout_task, &a);
}
