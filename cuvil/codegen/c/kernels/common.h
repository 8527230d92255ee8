/* Shared definitions of the cuvil kernel library: vector types per target, helpers. */
#ifndef CUVIL_COMMON_H
#define CUVIL_COMMON_H
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* One source for every ISA: GCC vector extensions sized by the target's widest float vector. */
#if defined(__AVX512F__)
#define CUVIL_VL 16
#elif defined(__AVX__)
#define CUVIL_VL 8
#else
#define CUVIL_VL 4            /* SSE2, NEON, generic */
#endif
/* AMD Zen cores, as -march=native names them (GCC 12 reads Zen 4 as znver3 with AVX-512): their
 * streams want software prefetches toward L2 where Intel's want L1 (gemm.c, qgemm.c). */
#if defined(__znver1__) || defined(__znver2__) || defined(__znver3__) || defined(__znver4__) || defined(__znver5__)
#define CUVIL_ZEN 1
#endif

typedef float cuvil_vf __attribute__((vector_size(CUVIL_VL * 4), aligned(4), may_alias));

/* c + a * b, c updated in its own register. Left to GCC, a register tile's FMAs came out in the
 * 132 form plus vmovaps that rotate the accumulators (6 per K step in the blocked conv tile): free where
 * one FMA issues per cycle (Zen 4), a cap where two do (Intel, AVX-512). ResNet-50 on a Sapphire-Rapids
 * class Xeon, old and new artifacts interleaved: 0.92x the time at 1 and 2 threads. */
static inline __attribute__((always_inline)) cuvil_vf cuvil_fma(cuvil_vf c, cuvil_vf a, cuvil_vf b) {
#if defined(__AVX512F__) || defined(__FMA__)
    __asm__("vfmadd231ps %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
    return c;
#else
    return c + a * b;
#endif
}
static inline cuvil_vf cuvil_vload(const float *p) { return *(const cuvil_vf *)p; }
static inline void cuvil_vstore(float *p, cuvil_vf v) { *(cuvil_vf *)p = v; }
/* Broadcast by initializer ({0} + x would add 0.0f first: one more instruction per use). */
#if CUVIL_VL == 16
static inline cuvil_vf cuvil_vsplat(float x) { return (cuvil_vf){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
#elif CUVIL_VL == 8
static inline cuvil_vf cuvil_vsplat(float x) { return (cuvil_vf){x, x, x, x, x, x, x, x}; }
#else
static inline cuvil_vf cuvil_vsplat(float x) { return (cuvil_vf){x, x, x, x}; }
#endif

static inline int64_t cuvil_floordiv(int64_t a, int64_t b) { int64_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t cuvil_mod(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline int64_t cuvil_max(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t cuvil_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* Activations a GEMM or conv epilogue can apply: codes and scalar forms from activations.h, which
 * codegen/c/gen_activations.py generates (lower_nn reads the same codes there). */
#include "activations.h"
enum {
#define CUVIL_ACT_CODE(NAME, code, scalar, vector) CUVIL_ACT_##NAME = code,
    CUVIL_ACTIVATIONS(CUVIL_ACT_CODE)
#undef CUVIL_ACT_CODE
};

static inline float cuvil_act(float x, int act) {
    switch (act) {
#define CUVIL_ACT_CASE(NAME, code, scalar, vector) case CUVIL_ACT_##NAME: return scalar;
    CUVIL_ACTIVATIONS(CUVIL_ACT_CASE)
#undef CUVIL_ACT_CASE
    default: return x;
    }
}
#endif
