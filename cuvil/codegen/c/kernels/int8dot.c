#include "int8dot.h"
#if defined(__AVX512VNNI__)
#include <immintrin.h>
#endif

#define I8_MR 6          /* 6 rows x 4 vectors: 24 int32 accumulators, each A broadcast feeds 4 dots */

#if defined(__AVX512VNNI__)
/* acc += the four-byte dots of a (unsigned) and b (signed), in place: GCC's intrinsic copies its
 * accumulator (its result is not tied to its input), and 24 of them then spill to the stack */
#define I8_DOT(acc, a, b) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b))
#define I8_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define I8_ZERO(r) __m512i x##r##0 = _mm512_setzero_si512(), x##r##1 = x##r##0, x##r##2 = x##r##0, x##r##3 = x##r##0;
#define I8_STEP(r)                                                                                        \
    if (r < mr) {                                                                                         \
        __m512i av = _mm512_set1_epi32((int)a[r * K4 + k]);                                               \
        I8_DOT(x##r##0, av, b0); I8_DOT(x##r##1, av, b1); I8_DOT(x##r##2, av, b2); I8_DOT(x##r##3, av, b3);      \
    }
#define I8_OUT(r)                                                                                         \
    if (r < mr) {                                                                                         \
        float *o = out + r * CUVIL_I8_NR;                                                                 \
        _mm512_store_ps(o, _mm512_cvtepi32_ps(x##r##0)), _mm512_store_ps(o + 16, _mm512_cvtepi32_ps(x##r##1)); \
        _mm512_store_ps(o + 32, _mm512_cvtepi32_ps(x##r##2)), _mm512_store_ps(o + 48, _mm512_cvtepi32_ps(x##r##3)); \
    }

/* out[r][j] = the sums of mr rows of A (bytes in words, K4 apart) times one panel, by vpdpbusd. */
static inline __attribute__((always_inline)) void i8_tile(int mr, const uint32_t *a, int64_t K4, const uint32_t *b,
                                                          float *out) {
    I8_ROWS(I8_ZERO)
    for (int64_t k = 0; k < K4; k++, b += CUVIL_I8_NR) {
        __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 16);
        __m512i b2 = _mm512_loadu_si512(b + 32), b3 = _mm512_loadu_si512(b + 48);
        I8_ROWS(I8_STEP)
    }
    I8_ROWS(I8_OUT)
}
#else
/* The same integer sums in portable C. */
static inline void i8_tile(int mr, const uint32_t *a, int64_t K4, const uint32_t *b, float *out) {
    int32_t acc[I8_MR][CUVIL_I8_NR] = {{0}};
    for (int64_t k = 0; k < K4; k++, b += CUVIL_I8_NR)
        for (int r = 0; r < mr; r++) {
            uint32_t w = a[r * K4 + k];
            for (int j = 0; j < CUVIL_I8_NR; j++)
                for (int i = 0; i < 4; i++)
                    acc[r][j] += (int32_t)(uint8_t)(w >> 8 * i) * (int32_t)(int8_t)(b[j] >> 8 * i);
        }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < CUVIL_I8_NR; j++) out[r * CUVIL_I8_NR + j] = (float)acc[r][j];
}
#endif

void cuvil_i8_rows(const uint32_t *Aq, int64_t rows, int64_t K4, const uint32_t *Bp, int64_t N, int64_t p0,
                   int64_t p1, const cuvil_dot_out *o) {
    float out[I8_MR * CUVIL_I8_NR] __attribute__((aligned(64)));
    for (int64_t p = p0; p < p1; p++) {
        int64_t n0 = p * CUVIL_I8_NR, nc = N - n0 < CUVIL_I8_NR ? N - n0 : CUVIL_I8_NR;
        const uint32_t *b = Bp + p * K4 * CUVIL_I8_NR;
        for (int64_t m0 = 0; m0 < rows; m0 += I8_MR) {
            int mr = rows - m0 < I8_MR ? (int)(rows - m0) : I8_MR;
            const uint32_t *a = Aq + m0 * K4;
            switch (mr) {      /* each row count its own unrolled tile */
            case 6: i8_tile(6, a, K4, b, out); break;
            case 5: i8_tile(5, a, K4, b, out); break;
            case 4: i8_tile(4, a, K4, b, out); break;
            case 3: i8_tile(3, a, K4, b, out); break;
            case 2: i8_tile(2, a, K4, b, out); break;
            default: i8_tile(1, a, K4, b, out); break;
            }
            cuvil_dot_store(o, out, m0, mr, n0, nc);
        }
    }
}
