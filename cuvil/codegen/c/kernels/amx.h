/* Intel AMX tiles for the dot-product kernels (bf16dot.c's TDPBF16PS, int8dot.c's TDPBUSD): the permission
 * Linux asks a process to request before its first tile instruction, the tile shapes the kernels
 * configure, and their loop over panels and rows. Built where the compiler targets AMX (-march=native on a
 * CPU that has it); elsewhere empty. */
#ifndef CUVIL_AMX_H
#define CUVIL_AMX_H
#if defined(__AMX_TILE__) && defined(__linux__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "dot_out.h"

#define CUVIL_AMX_K2 16            /* a tile's depth: 16 words of two bf16 (or four bytes) */
#define CUVIL_ARCH_REQ_XCOMP_PERM 0x1023
#define CUVIL_XFEATURE_XTILEDATA 18

/* Whether this process may use the tiles: the first call asks the kernel for them (once; the grant is
 * the process's, for every thread), and a refusal (a kernel without AMX state, a sandbox) keeps the
 * AVX-512 kernels. */
static inline int cuvil_amx_ready(void) {
    static volatile int state;    /* 0 not asked, 1 granted, -1 refused; a race asks twice, harmlessly */
    if (!state) state = syscall(SYS_arch_prctl, CUVIL_ARCH_REQ_XCOMP_PERM, CUVIL_XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    return state > 0;
}

/* LDTILECFG's 64 bytes (palette 1). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} cuvil_amx_config;

/* The dot kernels' tiles for blocks of r0 (1-16) and r1 (0-16) rows: 0-1 and 2-3 the two blocks' sums
 * (16 floats wide each), 4 and 5 the blocks' rows of A (16 words), 6-7 panel slices of B (16 words deep
 * x 16 columns). Loading a configuration zeroes every tile. */
static inline void cuvil_amx_configure(int r0, int r1) {
    cuvil_amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    const uint8_t rows[8] = {r0, r0, r1, r1, r0, r1, CUVIL_AMX_K2, CUVIL_AMX_K2};
    for (int t = 0; t < 8; t++) c.rows[t] = rows[t], c.colsb[t] = rows[t] ? 64 : 0;
    _tile_loadconfig(&c);
}

enum { CUVIL_AMX_BF16, CUVIL_AMX_U8S8 };   /* the products: bf16 pairs into floats, u8 x s8 quads into int32 */
#if defined(__AMX_BF16__)
#define CUVIL_AMX_BF16_DOT(c, x, y) _tile_dpbf16ps(c, x, y)
#else
#define CUVIL_AMX_BF16_DOT(c, x, y) __builtin_trap()
#endif
#if defined(__AMX_INT8__)
#define CUVIL_AMX_U8S8_DOT(c, x, y) _tile_dpbusd(c, x, y)
#else
#define CUVIL_AMX_U8S8_DOT(c, x, y) __builtin_trap()
#endif

/* The sums of mr (1-32) rows of A (words of two bf16 or four bytes, lda words a row) by one 64-column
 * panel of B (the dot kernels' own: 16 words by 16 columns are a tile's rows, 256 bytes apart), over
 * words [0, kb), kb a multiple of 16, into out (mr rows of 64 sums, floats or int32 by kind). Two column
 * halves of 32 rows by 32 columns, each tile of A and of B loaded once for two products. shape: the row
 * split the tiles are configured for (0 at first: a kernel configures on its first call, since another
 * library on this thread may have configured them otherwise). */
static inline __attribute__((always_inline)) void cuvil_amx_block(const int kind, const uint32_t *a0, int64_t lda, int mr,
                                                                  const uint32_t *b, int64_t kb, void *out, int *shape) {
    const int64_t lda_bytes = lda * 4, ldb = 64 * 4;
    int r0 = mr < CUVIL_AMX_K2 ? mr : CUVIL_AMX_K2, r1 = mr - r0;
    const uint32_t *a1 = a0 + CUVIL_AMX_K2 * lda;
#define CUVIL_AMX_DOT(c, x, y) \
    if (kind == CUVIL_AMX_BF16) CUVIL_AMX_BF16_DOT(c, x, y); \
    else CUVIL_AMX_U8S8_DOT(c, x, y);
    for (int h = 0; h < 2; h++) {
        if (r0 + 64 * r1 != *shape) cuvil_amx_configure(r0, r1), *shape = r0 + 64 * r1;
        else {
            _tile_zero(0); _tile_zero(1);
            if (r1) {
                _tile_zero(2); _tile_zero(3);
            }
        }
        const uint32_t *bh = b + h * 32;
        for (int64_t k = 0; k < kb; k += CUVIL_AMX_K2) {
            const uint32_t *bk = bh + k * 64;
            _tile_loadd(4, a0 + k, lda_bytes);
            _tile_loadd(6, bk, ldb);
            CUVIL_AMX_DOT(0, 4, 6)
            _tile_loadd(7, bk + 16, ldb);
            CUVIL_AMX_DOT(1, 4, 7)
            if (r1) {                 /* a block of 16 rows or fewer configures no second row of tiles */
                _tile_loadd(5, a1 + k, lda_bytes);
                CUVIL_AMX_DOT(2, 5, 6)
                CUVIL_AMX_DOT(3, 5, 7)
            }
        }
        uint32_t *oh = (uint32_t *)out + h * 32;
        _tile_stored(0, oh, ldb);
        _tile_stored(1, oh + 16, ldb);
        if (r1) {
            _tile_stored(2, oh + CUVIL_AMX_K2 * 64, ldb);
            _tile_stored(3, oh + CUVIL_AMX_K2 * 64 + 16, ldb);
        }
    }
#undef CUVIL_AMX_DOT
}
/* The K tail's adder: out[r][j] += the products of words [0, kt) of mr rows of A (lda apart) and of a
 * panel's rows (the words a tile's depth leaves over; floats or int32 as the kind's sums). */
typedef void (*cuvil_amx_tail)(int mr, const uint32_t *a, int64_t lda, int64_t kt, const uint32_t *b, void *out);

/* Rows [0, rows) of A (Kw words a row) times panels [p0, p1) of Bp (N columns) into o, on the tiles: blocks
 * of 32 rows, the K tail by `tail`, int32 sums turned to floats for cuvil_dot_store. */
static inline __attribute__((always_inline)) void cuvil_amx_rows(const int kind, const uint32_t *A, int64_t rows,
                                                                 int64_t Kw, const uint32_t *Bp, int64_t N, int64_t p0,
                                                                 int64_t p1, const cuvil_dot_out *o, cuvil_amx_tail tail) {
    float out[2 * CUVIL_AMX_K2 * 64] __attribute__((aligned(64)));
    const int64_t kb = Kw / CUVIL_AMX_K2 * CUVIL_AMX_K2;
    int shape = 0;
    for (int64_t p = p0; p < p1; p++) {
        int64_t n0 = p * 64, nc = N - n0 < 64 ? N - n0 : 64;
        const uint32_t *b = Bp + p * Kw * 64;
        for (int64_t m0 = 0; m0 < rows; m0 += 2 * CUVIL_AMX_K2) {
            int mr = rows - m0 < 2 * CUVIL_AMX_K2 ? (int)(rows - m0) : 2 * CUVIL_AMX_K2;
            cuvil_amx_block(kind, A + m0 * Kw, Kw, mr, b, kb, out, &shape);
            if (kb < Kw) tail(mr, A + m0 * Kw + kb, Kw, Kw - kb, b + kb * 64, out);
            if (kind == CUVIL_AMX_U8S8)
                for (int i = 0; i < mr * 64; i += 16)      /* the sums as floats, in place */
                    _mm512_store_ps(out + i, _mm512_cvtepi32_ps(_mm512_load_si512(out + i)));
            cuvil_dot_store(o, out, m0, mr, n0, nc);
        }
    }
    _tile_release();               /* back to the init state: a context switch saves no tiles */
}
#define CUVIL_HAVE_AMX 1
#endif
#endif
