#include "int8dot.h"
#include "amx.h"
#include "tuning.h"
#include <math.h>
#include <string.h>
#if defined(__AVX512VNNI__) || defined(__AVX2__)
#include <immintrin.h>
#endif

int cuvil_i8_levels(void) { return CUVIL_I8_LEVELS; }

/* Register tiles of MR rows x NV vectors of 16 columns, 24 int32 accumulators each, by how much of a
 * panel holds columns: 6 x 4 (a whole panel of 64), 8 x 3, 12 x 2, 24 x 1 (MobileNetV2's 16 and 32
 * output channels had run in 6 x 4 tiles three quarters empty: 51 GOP/s). */
#define I8_MAX_MR 24
static inline int i8_rows_for(int nv) { return nv == 4 ? 6 : nv == 3 ? 8 : nv == 2 ? 12 : 24; }

/* Lines of the next panel's weights a tile asks for toward L2, `lines` each K step from `at`: the
 * panel's first tile had read them from L3 at the mesh's pace (CUVIL_I8_PREFETCH_PANEL_K4, tuning.h).
 * Whole tiles only; the rest run the loop without the requests. */
typedef struct {
    const char *at;
    int lines;
} i8_prefetch;
#define I8_NO_PREFETCH ((i8_prefetch){0, 0})   /* a constant: the tile's loop then asks for nothing */

#if defined(__AVX512VNNI__)
/* acc += the four-byte dots of a (unsigned) and b (signed), in place: GCC's intrinsic copies its
 * accumulator (its result is not tied to its input), and 24 of them then spill to the stack */
#define I8_DOT(acc, a, b) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b))

/* A tile's sums stored straight from its registers as the next conv's bytes (cuvil_dot_store_bytes'
 * folded clamp, the same arithmetic to the bit): per column the scale and bias folded with the byte
 * map, per row where its bytes go (0: a pixel the image drops) and its residual's bytes (or 0). Through
 * the float buffer and cuvil_dot_store, MobileNetV2's 16 -> 96 channel expand conv at 112x112 had spent
 * more on the store than on its dot products. */
typedef struct {
    float sc[CUVIL_I8_NR], bc[CUVIL_I8_NR];      /* sc inv; bc inv + zero + 0.5 (+ the residual's shift) */
    uint8_t *row[I8_MAX_MR];
    const uint8_t *res[I8_MAX_MR];
    float rs, qlo, qhi;                           /* the residual bytes' scale inv; the clamp in bytes */
    __mmask16 tail;                               /* the last vector's columns, where it is in part (24: 8) */
} i8_fused;

/* Vector v of row r; with PART (the last vector of a panel that holds fewer columns) only its columns
 * are read and written (MobileNetV2's 24 channels had gone through the float buffer and 8 bytes a row
 * one by one: its project convs wrote bytes slower than they had written NCHW floats). */
static inline __attribute__((always_inline)) __m512i i8_levels_of(const int PART, const i8_fused *f, int r, int v,
                                                                  __m512i acc) {
    __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_load_ps(f->sc + 16 * v), _mm512_load_ps(f->bc + 16 * v));
    if (f->res[r]) {
        const uint8_t *q = f->res[r] + 16 * v;
        __m128i b = PART ? _mm_maskz_loadu_epi8(f->tail, q) : _mm_loadu_si128((const __m128i *)q);
        t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), _mm512_set1_ps(f->rs), t);
    }
    t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(f->qlo)), _mm512_set1_ps(f->qhi));
    return _mm512_cvttps_epi32(t);
}

static inline __attribute__((always_inline)) void i8_store_fused(const int PART, const i8_fused *f, int r, int v,
                                                                 __m512i acc) {
    __m128i bytes = _mm512_cvtepi32_epi8(i8_levels_of(PART, f, r, v, acc));
    if (PART) _mm_mask_storeu_epi8(f->row[r] + 16 * v, f->tail, bytes);
    else _mm_storeu_si128((__m128i *)(f->row[r] + 16 * v), bytes);
}

/* A whole panel's 64 bytes of row r at once: two saturating packs and a permute (levels are within
 * [0, 255], so the packs change nothing) in place of four vpmovdb, each two uops on the port the packs
 * share with vpdpbusd; the store epilogue is most of the time of a conv over 64 input channels. */
static inline __attribute__((always_inline)) void i8_store_fused4(const i8_fused *f, int r, const __m512i *acc) {
    __m512i w01 = _mm512_packus_epi32(i8_levels_of(0, f, r, 0, acc[0]), i8_levels_of(0, f, r, 1, acc[1]));
    __m512i w23 = _mm512_packus_epi32(i8_levels_of(0, f, r, 2, acc[2]), i8_levels_of(0, f, r, 3, acc[3]));
    /* lane l of the packs holds 4 bytes of each vector in turn: dword 4 l + v is vector v's lane l */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_si512(f->row[r], _mm512_permutexvar_epi32(order, _mm512_packus_epi16(w01, w23)));
}

/* out[r][j] = the sums of rows [0, mr) of A (bytes in words, K4 apart) times columns [0, 16 NV) of one
 * panel, by vpdpbusd; mr <= MR (a constant in every call but the edge's); with f, bytes instead (PART: the
 * panel's last vector in part). */
static inline __attribute__((always_inline)) void i8_tile_vnni(const int MR, const int NV, const int PART, int mr,
                                                               const uint32_t *a, int64_t K4, const uint32_t *b,
                                                               float *out, const i8_fused *f, i8_prefetch pf) {
    __m512i acc[I8_MAX_MR][4];
#pragma GCC unroll 24
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_si512();
    for (int64_t k = 0; k < K4; k++, b += CUVIL_I8_NR) {
        for (int j = 0; j < pf.lines; j++) __builtin_prefetch(pf.at + (k * pf.lines + j) * 64, 0, 2);
        __m512i bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) bv[v] = _mm512_loadu_si512(b + 16 * v);
#pragma GCC unroll 24
        for (int r = 0; r < MR; r++)
            if (r < mr) {
                __m512i av = _mm512_set1_epi32((int)a[r * K4 + k]);
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++) I8_DOT(acc[r][v], av, bv[v]);
            }
    }
#pragma GCC unroll 24
    for (int r = 0; r < MR; r++)
        if (r < mr && f && NV == 4 && !PART) {
            if (f->row[r]) i8_store_fused4(f, r, acc[r]);
        } else
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++)
                if (r < mr && f) {
                    if (f->row[r]) i8_store_fused(PART && v == NV - 1, f, r, v, acc[r][v]);
                } else if (r < mr) _mm512_store_ps(out + r * CUVIL_I8_NR + 16 * v, _mm512_cvtepi32_ps(acc[r][v]));
}

static inline __attribute__((always_inline)) void i8_tile(const int MR, const int NV, int mr, const uint32_t *a,
                                                          int64_t K4, const uint32_t *b, float *out, i8_prefetch pf) {
    i8_tile_vnni(MR, NV, 0, mr, a, K4, b, out, 0, pf);
}
#elif defined(__AVX2__)
/* AVX2: each lane's four products by vpmaddubsw (pairs into 16 bits; A's bytes <= 127 keep them from
 * saturating) and vpmaddwd against ones (the pairs' sums into 32 bits). Rows r0 .. r0 + R of 16 columns
 * at a time (8 accumulators of 16 registers), the panel's columns [16 v, 16 v + 16). */
static inline __attribute__((always_inline)) void i8_avx2_rows(const int R, int rr, const uint32_t *a, int64_t K4,
                                                               const uint32_t *b, float *out) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[4][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t k = 0; k < K4; k++, b += CUVIL_I8_NR) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)b), b1 = _mm256_loadu_si256((const __m256i *)(b + 8));
        for (int r = 0; r < R; r++)
            if (r < rr) {
                __m256i av = _mm256_set1_epi32((int)a[r * K4 + k]);
                acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(av, b0), ones));
                acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(av, b1), ones));
            }
    }
    for (int r = 0; r < R; r++)
        if (r < rr) {
            _mm256_storeu_ps(out + r * CUVIL_I8_NR, _mm256_cvtepi32_ps(acc[r][0]));
            _mm256_storeu_ps(out + r * CUVIL_I8_NR + 8, _mm256_cvtepi32_ps(acc[r][1]));
        }
}

static inline void i8_tile(const int MR, const int NV, int mr, const uint32_t *a, int64_t K4, const uint32_t *b,
                           float *out, i8_prefetch pf) {
    (void)MR, (void)pf;
    for (int v = 0; v < NV; v++)
        for (int r0 = 0; r0 < mr; r0 += 4) {
            int rr = mr - r0 < 4 ? mr - r0 : 4;
            if (rr == 4) i8_avx2_rows(4, 4, a + r0 * K4, K4, b + 16 * v, out + r0 * CUVIL_I8_NR + 16 * v);
            else i8_avx2_rows(4, rr, a + r0 * K4, K4, b + 16 * v, out + r0 * CUVIL_I8_NR + 16 * v);
        }
}
#else
/* The same integer sums in portable C. */
static inline void i8_tile(const int MR, const int NV, int mr, const uint32_t *a, int64_t K4, const uint32_t *b,
                           float *out, i8_prefetch pf) {
    (void)MR, (void)pf;
    int32_t acc[I8_MAX_MR][CUVIL_I8_NR] = {{0}};
    for (int64_t k = 0; k < K4; k++, b += CUVIL_I8_NR)
        for (int r = 0; r < mr; r++) {
            uint32_t w = a[r * K4 + k];
            for (int j = 0; j < 16 * NV; j++)
                for (int i = 0; i < 4; i++)
                    acc[r][j] += (int32_t)(uint8_t)(w >> 8 * i) * (int32_t)(int8_t)(b[j] >> 8 * i);
        }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < 16 * NV; j++) out[r * CUVIL_I8_NR + j] = (float)acc[r][j];
}
#endif

/* One tile's rows of one panel, NV vectors wide: whole tiles unrolled at their constant height, the
 * rows left over in one tile of their own. */
#define I8_TILE(MR, NV)                                                                                    \
    static void i8_tile_##MR##x##NV(int mr, const uint32_t *a, int64_t K4, const uint32_t *b, float *out,     \
                                    i8_prefetch pf) {                                                      \
        if (mr == MR && pf.lines) i8_tile(MR, NV, MR, a, K4, b, out, pf);                                  \
        else if (mr == MR) i8_tile(MR, NV, MR, a, K4, b, out, I8_NO_PREFETCH);                             \
        else i8_tile(MR, NV, mr, a, K4, b, out, I8_NO_PREFETCH);                                           \
    }
I8_TILE(6, 4)
I8_TILE(8, 3)
I8_TILE(12, 2)
I8_TILE(24, 1)

/* Tile t of a panel's `tiles` asks for its share of the next panel's K4 x 4 lines (the panel after b's),
 * one line a K step where there are 4 tiles or more to share them, 2 or 4 where fewer; none where panels
 * are short (CUVIL_I8_PREFETCH_PANEL_K4: small weights come from L2 in time, and the requests cost). */
static i8_prefetch next_panel_share(const uint32_t *b, int64_t K4, int next, int64_t t, int64_t tiles) {
    if (!CUVIL_I8_PREFETCH_PANEL_K4 || K4 < CUVIL_I8_PREFETCH_PANEL_K4 || !next || t >= 4) return I8_NO_PREFETCH;
    int lines = tiles >= 4 ? 1 : tiles >= 2 ? 2 : 4;
    if (t * lines >= 4) return I8_NO_PREFETCH;
    return (i8_prefetch){(const char *)(b + K4 * CUVIL_I8_NR) + t * lines * K4 * 64, lines};
}

#if defined(__AVX512VNNI__)
/* inlined into the switch, as the tiles had been before they took a prefetch (out of line, MobileNetV2's
 * 16 -> 96 expand conv, 4 K steps a tile, took 1.1x the time) */
#define I8_TILE_FUSED(MR, NV)                                                                              \
    static inline __attribute__((always_inline)) void i8_fused_##MR##x##NV(                               \
        int mr, int part, const uint32_t *a, int64_t K4, const uint32_t *b, const i8_fused *f, i8_prefetch pf) { \
        if (part) i8_tile_vnni(MR, NV, 1, mr, a, K4, b, 0, f, I8_NO_PREFETCH);                             \
        else if (mr == MR && pf.lines) i8_tile_vnni(MR, NV, 0, MR, a, K4, b, 0, f, pf);                    \
        else if (mr == MR) i8_tile_vnni(MR, NV, 0, MR, a, K4, b, 0, f, I8_NO_PREFETCH);                    \
        else i8_tile_vnni(MR, NV, 0, mr, a, K4, b, 0, f, I8_NO_PREFETCH);                                  \
    }
I8_TILE_FUSED(6, 4)
I8_TILE_FUSED(8, 3)
I8_TILE_FUSED(12, 2)
I8_TILE_FUSED(24, 1)

/* The folded byte store's constants (cuvil_dot_store_bytes) for rows of one panel, or 0 where o takes
 * the general store: floats, a float residual, a row bias or an activation that is no clamp. */
static int i8_fused_of(const cuvil_dot_out *o, i8_fused *f, float *z5) {
    cuvil_byte_fold fold;
    if (o->residual || !cuvil_byte_fold_of(o, &fold)) return 0;
    f->rs = fold.rs, f->qlo = fold.k.qlo, f->qhi = fold.k.qhi, *z5 = fold.z5;
    return 1;
}

static void i8_fused_panel(const cuvil_dot_out *o, i8_fused *f, float z5, int64_t n0, int64_t nc) {
    float inv = o->bytes->inv;
    for (int64_t j = 0; j < nc; j++) {
        f->sc[j] = (o->scale_col ? o->scale_col[n0 + j] : o->alpha) * inv;
        f->bc[j] = fmaf(o->bias_col ? o->bias_col[n0 + j] : 0.f, inv, z5);
    }
    for (int64_t j = nc; j % 16; j++) f->sc[j] = f->bc[j] = 0.f;      /* the last vector's lanes past N */
}
#endif

#if defined(CUVIL_HAVE_AMX) && defined(__AMX_INT8__) && defined(__AVX512VNNI__)
/* Where cuvil_i8_rows runs on AMX tiles: by depth alone, as bf16dot.c's */
static int amx_takes(int64_t K4) { return K4 >= CUVIL_AMX_K2 && cuvil_amx_ready(); }

/* amx.h's K tail, by vpdpbusd */
static void i8_tail_add(int mr, const uint32_t *a, int64_t lda, int64_t kt, const uint32_t *b, void *sums) {
    for (int r = 0; r < mr; r++) {
        int32_t *o = (int32_t *)sums + r * CUVIL_I8_NR;
        __m512i x[4];
        for (int v = 0; v < 4; v++) x[v] = _mm512_load_si512(o + 16 * v);
        for (int64_t k = 0; k < kt; k++) {
            __m512i av = _mm512_set1_epi32((int)a[r * lda + k]);
            for (int v = 0; v < 4; v++) I8_DOT(x[v], av, _mm512_loadu_si512(b + k * CUVIL_I8_NR + 16 * v));
        }
        for (int v = 0; v < 4; v++) _mm512_store_si512(o + 16 * v, x[v]);
    }
}
#else
static __attribute__((unused)) int amx_takes(int64_t K4) { (void)K4; return 0; }
#endif

#if defined(__AVX512VNNI__)
/* Six output pixels of one output row times a whole panel, their windows read where they lie: pixel r's
 * filter row j (of 3) at a + r lda + j run_step, run_words words each; bytes out as i8_fused_6x4's. Its own
 * loop: the shared tile with a loop over runs had the compiler spill in every tile (1.09x the time). */
static void i8_window_6x4(const uint32_t *a, int64_t lda, int64_t run_step, int64_t run_words, const uint32_t *b,
                          const i8_fused *f, i8_prefetch pf) {
    __m512i acc[6][4];
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[r][v] = _mm512_setzero_si512();
    const char *pa = pf.at;
    for (int j = 0; j < 3; j++, a += run_step)
        for (int64_t k = 0; k < run_words; k++, b += CUVIL_I8_NR, pa += 64 * pf.lines) {
            for (int l = 0; l < pf.lines; l++) __builtin_prefetch(pa + 64 * l, 0, 2);
            __m512i bv[4];
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) bv[v] = _mm512_loadu_si512(b + 16 * v);
#pragma GCC unroll 6
            for (int r = 0; r < 6; r++) {
                __m512i av = _mm512_set1_epi32((int)a[r * lda + k]);
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) I8_DOT(acc[r][v], av, bv[v]);
            }
        }
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++)
        if (f->row[r]) i8_store_fused4(f, r, acc[r]);
}

/* A window's rows side by side in dst (the tiles cut short at an output row's end) */
static void i8_window_copy(const cuvil_i8_window *w, int64_t m, int mr, uint8_t *dst) {
    int64_t span = 3 * w->C;
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < 3; j++) memcpy(dst + (r * 3 + j) * span, w->x + (w->pix[m + r] + j * w->run_step) * w->C, span);
}

int cuvil_i8_window_rows(const cuvil_i8_window *w, int64_t rows, int64_t K4, const uint32_t *Bp, int64_t N,
                         int64_t p0, int64_t p1, const cuvil_dot_out *o, uint8_t *spare) {
    i8_fused f __attribute__((aligned(64)));
    float z5 = 0.f;
    if (N % CUVIL_I8_NR || amx_takes(K4) || !i8_fused_of(o, &f, &z5)) return 0;  /* AMX: rows copied, tiles loaded */
    int64_t words = w->C / 4, tiles = (rows + 5) / 6;
    for (int64_t p = p0; p < p1; p++) {
        int64_t n0 = p * CUVIL_I8_NR;
        const uint32_t *b = Bp + p * K4 * CUVIL_I8_NR;
        i8_fused_panel(o, &f, z5, n0, CUVIL_I8_NR);
        int mr;
        for (int64_t m0 = 0, t = 0, col = w->col0; m0 < rows; m0 += mr, t++) {
            mr = (int)cuvil_min(cuvil_min(6, rows - m0), w->OW - col);
            if ((col += mr) == w->OW) col = 0;
            cuvil_byte_rows(o, m0, mr, n0, f.row);
            for (int r = 0; r < mr; r++) f.res[r] = o->res_q ? cuvil_res_byte(o, m0 + r, n0) : 0;
            i8_prefetch pf = next_panel_share(b, K4, p + 1 < p1, t, tiles);
            if (mr == 6) {
                i8_window_6x4((const uint32_t *)(w->x + w->pix[m0] * w->C), w->step * words, w->run_step * words,
                              K4 / 3, b, &f, pf);
            } else {
                i8_window_copy(w, m0, mr, spare);
                i8_fused_6x4(mr, 0, (const uint32_t *)spare, K4, b, &f, I8_NO_PREFETCH);
            }
        }
    }
    return 1;
}
#else
int cuvil_i8_window_rows(const cuvil_i8_window *w, int64_t rows, int64_t K4, const uint32_t *Bp, int64_t N,
                         int64_t p0, int64_t p1, const cuvil_dot_out *o, uint8_t *spare) {
    (void)w, (void)rows, (void)K4, (void)Bp, (void)N, (void)p0, (void)p1, (void)o, (void)spare;
    return 0;
}
#endif

void cuvil_i8_rows(const uint32_t *Aq, int64_t rows, int64_t K4, const uint32_t *Bp, int64_t N, int64_t p0,
                   int64_t p1, const cuvil_dot_out *o) {
#if defined(CUVIL_HAVE_AMX) && defined(__AMX_INT8__) && defined(__AVX512VNNI__)
    if (amx_takes(K4)) {
        /* amx.h's blocks of 32 rows (TDPBUSD: 16 x 16 x 64 products an instruction): the same integer sums
         * as vpdpbusd's, so the same bytes out as the VNNI kernel's general store */
        cuvil_amx_rows(CUVIL_AMX_U8S8, Aq, rows, K4, Bp, N, p0, p1, o, i8_tail_add);
        return;
    }
#endif
    float out[I8_MAX_MR * CUVIL_I8_NR] __attribute__((aligned(64)));
#if defined(__AVX512VNNI__)
    i8_fused f __attribute__((aligned(64)));
    float z5 = 0.f;
    int fused = i8_fused_of(o, &f, &z5);
#endif
    for (int64_t p = p0; p < p1; p++) {
        int64_t n0 = p * CUVIL_I8_NR, nc = N - n0 < CUVIL_I8_NR ? N - n0 : CUVIL_I8_NR;
        int nv = (int)((nc + 15) / 16), mr_full = i8_rows_for(nv);
        const uint32_t *b = Bp + p * K4 * CUVIL_I8_NR;
#if defined(__AVX512VNNI__)
        int part = nc < 16 * nv;                     /* the panel's last vector holds fewer than 16 columns */
        if (fused) {
            i8_fused_panel(o, &f, z5, n0, nc);
            f.tail = (__mmask16)((1u << (nc - 16 * (nv - 1))) - 1);
        }
#endif
        int64_t tiles = (rows + mr_full - 1) / mr_full;
        for (int64_t m0 = 0, t = 0; m0 < rows; m0 += mr_full, t++) {
            int mr = rows - m0 < mr_full ? (int)(rows - m0) : mr_full;
            const uint32_t *a = Aq + m0 * K4;
            i8_prefetch pf = next_panel_share(b, K4, p + 1 < p1, t, tiles);
#if defined(__AVX512VNNI__)
            if (fused) {
                cuvil_byte_rows(o, m0, mr, n0, f.row);
                for (int r = 0; r < mr; r++) f.res[r] = o->res_q ? cuvil_res_byte(o, m0 + r, n0) : 0;
                switch (nv) {
                case 4: i8_fused_6x4(mr, part, a, K4, b, &f, pf); break;
                case 3: i8_fused_8x3(mr, part, a, K4, b, &f, pf); break;
                case 2: i8_fused_12x2(mr, part, a, K4, b, &f, pf); break;
                default: i8_fused_24x1(mr, part, a, K4, b, &f, pf); break;
                }
                continue;
            }
#endif
            switch (nv) {
            case 4: i8_tile_6x4(mr, a, K4, b, out, pf); break;
            case 3: i8_tile_8x3(mr, a, K4, b, out, pf); break;
            case 2: i8_tile_12x2(mr, a, K4, b, out, pf); break;
            default: i8_tile_24x1(mr, a, K4, b, out, pf); break;
            }
            cuvil_dot_store(o, out, m0, mr, n0, nc);
        }
    }
}
