/* The 6 x 4-vector register tile of the AVX-512 GEMMs (gemm.c, blocked.c): six rows of A times two
 * panels of B (64 columns), 24 accumulators of the 32 registers, so each broadcast of A feeds four
 * FMAs where the 8 x 2 tile's feeds two (the shape of ONNX Runtime's NCHWc kernel). The accumulators
 * are named variables x<row><vector>: held in arrays, or updated by cuvil_fma, GCC kept half of them
 * on the stack. A K step reads A as ar[r][k] and B as the vectors b0..b3. */
#ifndef CUVIL_WIDE_H
#define CUVIL_WIDE_H
#include "gemm.h"        /* CUVIL_MR */

#if CUVIL_VL == 16
#define CUVIL_WIDE_MR 6
#define CUVIL_WIDE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define CUVIL_WIDE_ZERO(r) cuvil_vf x##r##0 = cuvil_vsplat(0.f), x##r##1 = x##r##0, x##r##2 = x##r##0, x##r##3 = x##r##0;
#define CUVIL_WIDE_STEP(r) { cuvil_vf av = cuvil_vsplat(ar[r][k]);                                        \
                             x##r##0 += av * b0, x##r##1 += av * b1, x##r##2 += av * b2, x##r##3 += av * b3; }
/* the accumulators into arrays c0..c3 (vectors 0..3 of each row) for the tile's store */
#define CUVIL_WIDE_OUT(r) c0[r] = x##r##0, c1[r] = x##r##1, c2[r] = x##r##2, c3[r] = x##r##3;
/* K step k of panels b and q ([k][NR] each) */
#define CUVIL_WIDE_LOAD_B(b, q, k)                                                                        \
    cuvil_vf b0 = cuvil_vload((b) + (k) * CUVIL_NR), b1 = cuvil_vload((b) + (k) * CUVIL_NR + CUVIL_VL);  \
    cuvil_vf b2 = cuvil_vload((q) + (k) * CUVIL_NR), b3 = cuvil_vload((q) + (k) * CUVIL_NR + CUVIL_VL);
#endif

/* The MR x nv-vector tile (nv 1 or 2) of the blocked GEMM (blocked.c) with named accumulators y<row><vector>:
 * in arrays, GCC kept 9 of AVX2's 12 on the stack across each K block (a load and a store per block of
 * 8 K steps, on the FMA chains), ResNet-50 blocked in 8s 1.12x the time of NCHW. */
#if CUVIL_MR == 8
#define CUVIL_TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#else
#define CUVIL_TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#endif
#define CUVIL_TILE_ZERO(r) cuvil_vf y##r##0 = cuvil_vsplat(0.f), y##r##1 = y##r##0;
/* a K step: A read as ar[r][k], B as the vectors b0 and, where nv (a constant in scope) is 2, b1 */
#define CUVIL_TILE_STEP(r) { cuvil_vf av = cuvil_vsplat(ar[r][k]);                                        \
                             y##r##0 = cuvil_fma(y##r##0, av, b0);                                        \
                             if (nv > 1) y##r##1 = cuvil_fma(y##r##1, av, b1); }
#define CUVIL_TILE_OUT(r) c0[r] = y##r##0, c1[r] = y##r##1;
#endif
