/* Where the dot-product kernels' sums go (bf16dot.c, int8dot.c): a register tile's sums, rows of 64
 * floats, through the fused epilogue into a row-major or channel-blocked output. */
#ifndef CUVIL_DOT_OUT_H
#define CUVIL_DOT_OUT_H
#include "gemm.h"
#include "lowp.h"
#include "vmath.h"

#define CUVIL_DOT_NR 64        /* a tile's columns: one panel of the packed B */
#define CUVIL_DOT_MAX_MR 32    /* a tile's rows at most (int8dot.c's 24 x 1) */

/* The next int8 conv's input as bytes (codegen's int8_out): its padded image, pixel-major (hp x wp
 * pixels of C bytes, blocked_dot.c), into which a conv's output pixel (oh, ow) goes at (oh + ph, ow + pw)
 * where the image holds it, each value as q = clamp(x * inv + zero, 0, CUVIL_I8_LEVELS) rounded. */
typedef struct {
    uint8_t *q;                   /* this image's */
    float inv, zero, top;         /* top: the bytes' top level, CUVIL_I8_LEVELS */
    int64_t OW, C, hp, wp, ph, pw;
} cuvil_byte_image;

/* The border of a byte image (img {hp, wp, ph, pw}: rows and columns outside the H x W map) at the
 * zero point; the conv writing the map fills the rest. */
static inline void cuvil_byte_border(uint8_t *q, const int64_t *img, int64_t H, int64_t W, int64_t C, uint8_t zero) {
    int64_t hp = img[0], wp = img[1], ph = img[2], pw = img[3];
    for (int64_t r = 0; r < hp; r++) {
        uint8_t *row = q + r * wp * C;
        if (r < ph || r >= ph + H) memset(row, zero, wp * C);
        else {
            memset(row, zero, pw * C);
            if (pw + W < wp) memset(row + (pw + W) * C, zero, (wp - pw - W) * C);
        }
    }
}

/* The affine map of [lo, hi] (widened to hold 0) onto bytes 0 .. CUVIL_I8_LEVELS-like `top`:
 * q = clamp(rint(x / scale) + zero, 0, top), zero an integer; scale 1 where the range has no width
 * (all zeros) or no usable value (NaN, inf). The int8 convs' input map and the int8 linear layers'. */
static inline void cuvil_byte_scale(float lo, float hi, float top, float *scale, float *zero) {
    lo = lo < 0.f ? lo : 0.f, hi = hi > 0.f ? hi : 0.f;
    float sc = (hi - lo) / top;
    if (!(sc > 0.f) || !isfinite(sc)) sc = 1.f;
    float z = rintf(-lo / sc);
    *scale = sc, *zero = z < 0.f ? 0.f : z > top ? top : z;
}

/* One float -> its byte (rounded half up: q >= 0, + 0.5 truncated; NaN: 0). */
static inline uint8_t cuvil_to_byte(float x, float inv, float zero, float top) {
    float t = x * inv + (zero + 0.5f);
    t = t > 0.f ? t : 0.f;
    return (uint8_t)(int)(t < top ? t : top);
}

/* A vector of floats already within [0, 255] -> its CUVIL_VL bytes (truncated) at out: on AVX2 by two
 * saturating packs (GCC 12 narrows an 8-lane int vector to bytes one lane at a time, which had made an
 * int8 conv writing bytes slower than one writing floats), elsewhere as GCC narrows it (vpmovdb). */
typedef uint8_t cuvil_byte_vec __attribute__((vector_size(CUVIL_VL)));
#if defined(__AVX2__) && CUVIL_VL == 8
#include <immintrin.h>
static inline void cuvil_store_byte_vec(cuvil_vf t, uint8_t *out) {
    __m256i v = _mm256_cvttps_epi32((__m256)t);
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)out, _mm_packus_epi16(w, w));
}
#else
static inline void cuvil_store_byte_vec(cuvil_vf t, uint8_t *out) {
    cuvil_byte_vec b = __builtin_convertvector(__builtin_convertvector(t, cuvil_vi), cuvil_byte_vec);
    memcpy(out, &b, CUVIL_VL);
}
#endif

/* A vector of floats -> CUVIL_VL bytes at out, as cuvil_to_byte. */
static inline void cuvil_to_bytes(cuvil_vf x, float inv, float zero, float top, uint8_t *out) {
    cuvil_vf t = x * cuvil_vsplat(inv) + cuvil_vsplat(zero + 0.5f), lo = cuvil_vsplat(0.f);
    t = cuvil_vsel(t > lo, t, lo);
    t = cuvil_vsel(t < cuvil_vsplat(top), t, cuvil_vsplat(top));
    cuvil_store_byte_vec(t, out);
}

/* The activations that are clamps, as their bounds [lo, hi] (none, relu, relu6); 0 for any other. */
static inline int cuvil_act_bounds(int act, float *lo, float *hi) {
    *lo = -INFINITY, *hi = INFINITY;
    switch (act) {
    case CUVIL_ACT_NONE: return 1;
    case CUVIL_ACT_RELU: *lo = 0.f; return 1;
    case CUVIL_ACT_RELU6: *lo = 0.f, *hi = 6.f; return 1;
    default: return 0;
    }
}

/* A byte image's map with a clamp activation folded in: a value x whose scaling is folded into its
 * sums as t = x * inv + zero + 0.5 gives its byte as t clamped to [qlo, qhi] (the activation's bounds
 * in byte space, within 0 .. top) and truncated: one multiply-add, a max and a min a vector, where the
 * activation, the map and its clamp one after another had taken twelve instructions and made a 1x1
 * conv with 16 input channels slower writing bytes than writing floats. The bytes can differ from
 * those steps' at an exact tie (the multiply-adds round elsewhere). */
typedef struct { float inv, z5, qlo, qhi; } cuvil_byte_clamp;

static inline cuvil_byte_clamp cuvil_byte_clamp_of(const cuvil_byte_image *b, float lo, float hi) {
    float z5 = b->zero + 0.5f, qlo = lo * b->inv + z5, qhi = hi * b->inv + z5;
    return (cuvil_byte_clamp){b->inv, z5, qlo > 0.f ? qlo : 0.f, qhi < b->top ? qhi : b->top};
}

/* t (x * inv + zero + 0.5, as above) -> its CUVIL_VL bytes at out */
static inline void cuvil_clamped_bytes(cuvil_vf t, const cuvil_byte_clamp *k, uint8_t *out) {
    cuvil_store_byte_vec(cuvil_vclamp(t, k->qlo, k->qhi), out);
}

static inline uint8_t cuvil_clamped_byte(float t, const cuvil_byte_clamp *k) {
    return (uint8_t)(int)(t < k->qlo ? k->qlo : t > k->qhi ? k->qhi : t);
}

/* Element (m, n) goes to C[n / nb * ldn + m * ldm + n % nb] (row-major: nb past N, ldm = ldc; the
 * channel-blocked layout: nb = CUVIL_BLOCK, ldn = pixels * nb, ldm = nb), the residual in the same
 * layout (res_ldm apart), as act(sum * (scale_col ? scale_col[n] : alpha) + bias_row[m] + bias_col[n]
 * + residual). tests/test_int8dot.py mirrors this struct (DotOut): a field added here goes there too. */
typedef struct {
    float *C;
    const float *bias_row, *bias_col, *residual, *scale_col;
    int64_t nb, ldn, ldm, res_ldm;
    float alpha;
    int act;
    /* bytes: instead of C, element (m, n) goes to the next conv's input bytes as pixel row0 + m,
     * channel col0 + n */
    const cuvil_byte_image *bytes;
    int64_t row0, col0;
    /* res_q: the residual as the bytes an integer conv wrote for its readers (instead of `residual`):
     * element (m, n)'s at res_q[(row0 + m) * res_ld + col0 + n], worth q * res_scale + res_shift */
    const uint8_t *res_q;
    int64_t res_ld;
    float res_scale, res_shift;
    /* bf16 maps (a bf16 conv's output that only bf16 convs read, passes/quantize.link_bf16_convs): C16
     * instead of C, res16 instead of residual, in the same layout, as bf16 bit patterns */
    uint16_t *C16;
    const uint16_t *res16;
} cuvil_dot_out;

/* VL floats -> their bf16 bit patterns at p, rounded to nearest even as bf16dot.h's cuvil_bf16_round
 * rounds them (a reader rounding the floats itself gets the same bits). */
static inline void cuvil_store_bf16(cuvil_vf v, uint16_t *p) {
#if defined(__AVX512BF16__) && CUVIL_VL == 16
    _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh((__m512)v));
#else
    for (int i = 0; i < CUVIL_VL; i++) p[i] = cv_f32_to_bfloat16(v[i], 0);
#endif
}

/* VL bf16 bit patterns at p -> floats (exact). */
static inline cuvil_vf cuvil_load_bf16(const uint16_t *p) {
#if defined(__AVX512F__) && CUVIL_VL == 16
    return (cuvil_vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
#else
    cuvil_vf v;
    for (int i = 0; i < CUVIL_VL; i++) v[i] = cv_bfloat16_to_f32(p[i]);
    return v;
#endif
}

/* Where element (m, n)'s residual byte is (o->res_q). */
static inline const uint8_t *cuvil_res_byte(const cuvil_dot_out *o, int64_t m, int64_t n) {
    return o->res_q + (o->row0 + m) * o->res_ld + o->col0 + n;
}

/* Element (m, n)'s value but for the activation: the tile's sum (at `sum`) scaled, the biases and the
 * residual (at `at`, n's place in the layout, or its bytes) added; sc, bc: column n's scale and bias
 * vectors. */
static inline cuvil_vf cuvil_dot_vec(const cuvil_dot_out *o, const float *sum, cuvil_vf sc, cuvil_vf bc, int64_t m,
                                     int64_t n, int64_t at) {
    cuvil_vf v = cuvil_vload(sum) * sc + bc;
    if (o->bias_row) v += cuvil_vsplat(o->bias_row[m]);
    if (o->residual) v += cuvil_vload(o->residual + at + m * o->res_ldm);
    if (o->res_q) v += cuvil_vload_bytes(cuvil_res_byte(o, m, n)) * cuvil_vsplat(o->res_scale) + cuvil_vsplat(o->res_shift);
    return v;
}

static inline float cuvil_dot_one(const cuvil_dot_out *o, float sum, int64_t m, int64_t n, int64_t at) {
    return sum * (o->scale_col ? o->scale_col[n] : o->alpha) + (o->bias_row ? o->bias_row[m] : 0.f) +
           (o->bias_col ? o->bias_col[n] : 0.f) + (o->residual ? o->residual[at + m * o->res_ldm] : 0.f) +
           (o->res_q ? *cuvil_res_byte(o, m, n) * o->res_scale + o->res_shift : 0.f);
}

/* The folded byte store's map (cuvil_dot_store_bytes' clamp path; int8dot.c's stores from registers take
 * the same): where o writes bytes with no row bias and a clamp activation, that clamp in byte space, a
 * residual byte's factor rs (its scale times inv) and z5, what the biases fold onto (zero + 0.5 + the
 * residual bytes' shift times inv); 0 where o takes the general store. */
typedef struct { cuvil_byte_clamp k; float rs, z5; } cuvil_byte_fold;

static inline int cuvil_byte_fold_of(const cuvil_dot_out *o, cuvil_byte_fold *f) {
    float lo, hi;
    if (!o->bytes || o->bias_row || !cuvil_act_bounds(o->act, &lo, &hi)) return 0;
    f->k = cuvil_byte_clamp_of(o->bytes, lo, hi);
    f->rs = o->res_scale * f->k.inv, f->z5 = f->k.z5 + (o->res_q ? o->res_shift * f->k.inv : 0.f);
    return 1;
}

/* Where rows m0 .. m0 + mr's bytes start in o->bytes (their pixel's channel col0 + n0), or 0 for a pixel
 * the image drops (a strided conv's last rows or columns, which no window reads): one division for the
 * tile, then pixel by pixel (a division a row had cost a 1x1 conv with 16 input channels 5% of its time). */
static inline void cuvil_byte_rows(const cuvil_dot_out *o, int64_t m0, int mr, int64_t n0, uint8_t **row) {
    const cuvil_byte_image *b = o->bytes;
    int64_t p = o->row0 + m0, r = p / b->OW + b->ph, c = p % b->OW + b->pw;
    for (int i = 0; i < mr; i++) {
        row[i] = r < b->hp && c < b->wp ? b->q + (r * b->wp + c) * b->C + o->col0 + n0 : 0;
        if (++c == b->OW + b->pw) c = b->pw, r++;
    }
}

/* cuvil_dot_store into o->bytes. */
static inline void cuvil_dot_store_bytes(const cuvil_dot_out *o, const float *out, int64_t m0, int mr, int64_t n0,
                                         int64_t nc) {
    uint8_t *row[CUVIL_DOT_MAX_MR];
    cuvil_byte_rows(o, m0, mr, 0, row);
    const cuvil_byte_image *b = o->bytes;
    int64_t j = 0;
    cuvil_byte_fold fold;
    if (cuvil_byte_fold_of(o, &fold)) {
        /* (sum * sc + bc) * inv + zero + 0.5 = sum * (sc inv) + (bc inv + zero + 0.5), and a residual's bytes
         * q, worth q * rs + rsh: + q * (rs inv) + rsh inv; a float residual is added before the map, so that
         * the bytes are the general path's below to the bit (the clamp's bounds mapped as the values are).
         * The general path had made a ResNet block's last conv slower writing bytes than writing floats. */
        cuvil_byte_clamp k = fold.k;
        float rs = fold.rs, z5 = fold.z5;
        for (; j + CUVIL_VL <= nc; j += CUVIL_VL) {
            int64_t n = n0 + j, at = n / o->nb * o->ldn + n % o->nb;
            cuvil_vf sc0 = o->scale_col ? cuvil_vload(o->scale_col + n) : cuvil_vsplat(o->alpha);
            cuvil_vf bc0 = o->bias_col ? cuvil_vload(o->bias_col + n) : cuvil_vsplat(0.f);
            cuvil_vf sc = sc0 * cuvil_vsplat(k.inv), bc = bc0 * cuvil_vsplat(k.inv) + cuvil_vsplat(z5);
            for (int r = 0; r < mr; r++) {
                cuvil_vf t;
                if (o->residual)
                    t = (cuvil_vload(out + r * CUVIL_DOT_NR + j) * sc0 + bc0 + cuvil_vload(o->residual + at + (m0 + r) * o->res_ldm)) *
                        cuvil_vsplat(k.inv) + cuvil_vsplat(k.z5);
                else {
                    t = cuvil_vload(out + r * CUVIL_DOT_NR + j) * sc + bc;
                    if (o->res_q) t += cuvil_vload_bytes(cuvil_res_byte(o, m0 + r, n)) * cuvil_vsplat(rs);
                }
                if (row[r]) cuvil_clamped_bytes(t, &k, row[r] + n);
            }
        }
        for (; j < nc; j++) {
            int64_t n = n0 + j, at = n / o->nb * o->ldn + n % o->nb;
            float sc0 = o->scale_col ? o->scale_col[n] : o->alpha, bc0 = o->bias_col ? o->bias_col[n] : 0.f;
            for (int r = 0; r < mr; r++) {
                float s = out[r * CUVIL_DOT_NR + j], t;
                if (o->residual) t = (s * sc0 + bc0 + o->residual[at + (m0 + r) * o->res_ldm]) * k.inv + k.z5;
                else t = s * (sc0 * k.inv) + (bc0 * k.inv + z5) + (o->res_q ? *cuvil_res_byte(o, m0 + r, n) * rs : 0.f);
                if (row[r]) row[r][n] = cuvil_clamped_byte(t, &k);
            }
        }
        return;
    }
    for (; j + CUVIL_VL <= nc; j += CUVIL_VL) {
        int64_t n = n0 + j, at = n / o->nb * o->ldn + n % o->nb;
        cuvil_vf bc = o->bias_col ? cuvil_vload(o->bias_col + n) : cuvil_vsplat(0.f);
        cuvil_vf sc = o->scale_col ? cuvil_vload(o->scale_col + n) : cuvil_vsplat(o->alpha);
        for (int r = 0; r < mr; r++)
            if (row[r])
                cuvil_to_bytes(cuvil_vact(cuvil_dot_vec(o, out + r * CUVIL_DOT_NR + j, sc, bc, m0 + r, n, at), o->act),
                               b->inv, b->zero, b->top, row[r] + n);
    }
    for (; j < nc; j++) {
        int64_t n = n0 + j, at = n / o->nb * o->ldn + n % o->nb;
        for (int r = 0; r < mr; r++)
            if (row[r])
                row[r][n] = cuvil_to_byte(cuvil_act(cuvil_dot_one(o, out[r * CUVIL_DOT_NR + j], m0 + r, n, at), o->act),
                                          b->inv, b->zero, b->top);
    }
}

/* cuvil_dot_store with a bf16 map as the output (C16) or the residual (res16): a channel-blocked conv's,
 * whose columns fill whole vectors. A function of its own: the two tests a vector it takes had made the
 * float store cost MobileNetV2's bf16 convs 3% (benchmarks.ab, 1 thread). */
static inline void cuvil_dot_store_bf16(const cuvil_dot_out *o, const float *out, int64_t m0, int mr, int64_t n0,
                                        int64_t nc) {
    for (int64_t j = 0; j < nc; j += CUVIL_VL) {
        int64_t n = n0 + j, at = n / o->nb * o->ldn + n % o->nb;
        cuvil_vf bc = o->bias_col ? cuvil_vload(o->bias_col + n) : cuvil_vsplat(0.f);
        cuvil_vf sc = o->scale_col ? cuvil_vload(o->scale_col + n) : cuvil_vsplat(o->alpha);
        for (int r = 0; r < mr; r++) {
            cuvil_vf v = cuvil_dot_vec(o, out + r * CUVIL_DOT_NR + j, sc, bc, m0 + r, n, at);
            if (o->res16) v += cuvil_load_bf16(o->res16 + at + (m0 + r) * o->res_ldm);
            v = cuvil_vact(v, o->act);
            if (o->C16) cuvil_store_bf16(v, o->C16 + at + (m0 + r) * o->ldm);
            else cuvil_vstore(o->C + at + (m0 + r) * o->ldm, v);
        }
    }
}

/* Rows [0, mr) of a tile's sums (out, CUVIL_DOT_NR floats a row), columns [n0, n0 + nc), into o's
 * layout from row m0: column vector by column vector, so each one's place in the layout is one
 * division (per element, the divisions had cost a blocked 1x1 conv with K 64 as much as its dot
 * products). */
static inline void cuvil_dot_store(const cuvil_dot_out *o, const float *out, int64_t m0, int mr, int64_t n0,
                                   int64_t nc) {
    if (o->bytes) {
        cuvil_dot_store_bytes(o, out, m0, mr, n0, nc);
        return;
    }
    if (o->C16 || o->res16) {
        cuvil_dot_store_bf16(o, out, m0, mr, n0, nc);
        return;
    }
    int64_t j = 0;
    for (; j + CUVIL_VL <= nc; j += CUVIL_VL) {          /* a vector never crosses a block (nb % VL == 0) */
        int64_t n = n0 + j, at = n / o->nb * o->ldn + n % o->nb;
        cuvil_vf bc = o->bias_col ? cuvil_vload(o->bias_col + n) : cuvil_vsplat(0.f);
        cuvil_vf sc = o->scale_col ? cuvil_vload(o->scale_col + n) : cuvil_vsplat(o->alpha);
        for (int r = 0; r < mr; r++)
            cuvil_vstore(o->C + at + (m0 + r) * o->ldm,
                         cuvil_vact(cuvil_dot_vec(o, out + r * CUVIL_DOT_NR + j, sc, bc, m0 + r, n, at), o->act));
    }
    if (j < nc) {
        /* the last nc - j < VL columns (one block: nb % VL == 0) as one vector through small buffers: one
         * by one, each element's place had been a 64-bit division and its epilogue scalar (MobileNetV2's
         * int8 144 -> 24 projection into NCHW: 1.6x the time of one into 32 blocked channels) */
        int64_t n = n0 + j, at = n / o->nb * o->ldn + n % o->nb, w = nc - j;
        float sc[CUVIL_VL] __attribute__((aligned(64))), bc[CUVIL_VL] __attribute__((aligned(64)));
        float t[CUVIL_VL] __attribute__((aligned(64)));
        for (int64_t i = 0; i < CUVIL_VL; i++) {
            sc[i] = i < w ? (o->scale_col ? o->scale_col[n + i] : o->alpha) : 0.f;
            bc[i] = i < w && o->bias_col ? o->bias_col[n + i] : 0.f;
        }
        cuvil_dot_out no_res = *o;                    /* the residual's last row may end inside the vector */
        no_res.residual = 0, no_res.res_q = 0;
        for (int r = 0; r < mr; r++) {
            cuvil_vf v = cuvil_dot_vec(&no_res, out + r * CUVIL_DOT_NR + j, cuvil_vload(sc), cuvil_vload(bc), m0 + r, n, at);
            float *c = o->C + at + (m0 + r) * o->ldm;
            if (o->residual || o->res_q) {
                const float *res = o->residual ? o->residual + at + (m0 + r) * o->res_ldm : 0;
                for (int64_t i = 0; i < CUVIL_VL; i++)
                    t[i] = i >= w ? 0.f : res ? res[i] : *cuvil_res_byte(o, m0 + r, n + i) * o->res_scale + o->res_shift;
                v += cuvil_vload(t);
            }
            cuvil_vstore(t, cuvil_vact(v, o->act));
            for (int64_t i = 0; i < w; i++) c[i] = t[i];
        }
    }
}
#endif
