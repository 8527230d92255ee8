/* Intel AMX tiles for the dot-product kernels (bf16dot.c's TDPBF16PS): the permission Linux asks a
 * process to request before its first tile instruction, and the tile shapes the kernels configure.
 * Built where the compiler targets AMX (-march=native on a CPU that has it); elsewhere empty. */
#ifndef CUVIL_AMX_H
#define CUVIL_AMX_H
#if defined(__AMX_TILE__) && defined(__linux__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

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
#define CUVIL_HAVE_AMX 1
#endif
#endif
