/* Channel-blocked convs of one group on the dot-product kernels (compile's precision="bf16" and
 * "int8" where the CPU multiplies in them): each M block's rows of the conv's GEMM, gathered through the
 * pixel and tap tables as cuvil_conv_blocked reads them, converted once into a thread buffer (bf16
 * pairs, or bytes of the quantized input) and multiplied by every panel of the packed filters. */
#include "bf16dot.h"
#include "blocked_input.h"
#include "int8dot.h"
#include "nchw_rows.h"
#include <math.h>

/* ---- bf16 products ------------------------------------------------------------------------ */
/* Image n's output of a bf16 conv into the channel-blocked layout (P pixels): floats, or a bf16 map
 * (links: CUVIL_BF16_OUT, CUVIL_BF16_RES) where its floats would start. */
static cuvil_dot_out bf16_conv_out(float *y, const float *bias, const float *residual, int act, int links, int64_t P) {
    cuvil_dot_out o = {y, 0, bias, residual && !(links & CUVIL_BF16_RES) ? residual : 0, 0, CUVIL_BLOCK,
                       P * CUVIL_BLOCK, CUVIL_BLOCK, CUVIL_BLOCK, 1.f, act};
    if (links & CUVIL_BF16_OUT) o.C16 = (uint16_t *)y;
    if (residual && (links & CUVIL_BF16_RES)) o.res16 = (const uint16_t *)residual;
    return o;
}

/* o from pixel m0 on */
static cuvil_dot_out bf16_conv_out_from(const cuvil_dot_out *o, int64_t m0) {
    cuvil_dot_out r = *o;
    if (r.C16) r.C16 += m0 * CUVIL_BLOCK;
    else r.C += m0 * CUVIL_BLOCK;
    if (r.residual) r.residual += m0 * CUVIL_BLOCK;
    if (r.res16) r.res16 += m0 * CUVIL_BLOCK;
    return r;
}

typedef struct {
    const cuvil_conv_shape *s;
    gathered_source src;          /* x, CB (a group's blocks) and plane always; pix and tap where the conv gathers */
    int direct;
    const uint32_t *wb;
    cuvil_dot_out out;
    int64_t P, K2, mc, ng, np, tasks;   /* K2, np: a group's; tasks: a group's (M blocks x panel groups) */
    uint32_t *shared;             /* all P rows, rounded beforehand by every thread (few M blocks), or 0 */
    int in16;                     /* the input is a bf16 map (CUVIL_BF16_IN): its elements bf16, not floats */
    int out_of_memory;
} bf16_conv;

/* Row m of A (pixel m's K = taps x group g's channels) as bf16 pairs, from the blocked input: each block
 * of channels rounded, or copied from a bf16 map (the same bits: its producer rounded them as this would).
 * Group g's channels are whole blocks (lower_bf16dot.links_bf16), the planes from its first block on. */
static inline void bf16_conv_row(const bf16_conv *a, int64_t g, int64_t m, uint32_t *restrict row) {
    /* the source's fields in locals: stores through row may alias them, and reloading them each block had
     * made the gather a quarter of a 64-channel 3x3 conv's time on AMX tiles */
    const gathered_source *src = &a->src;
    const int64_t taps = a->s->KH * a->s->KW, plane = src->plane, CB = src->CB;
    const int64_t *tap = src->tap, first = g * CB * plane;
    const int direct = a->direct;
    const int64_t pixel = direct ? m : src->pix[m];
    if (a->in16) {
        const uint16_t *x = (const uint16_t *)src->x + first;
        for (int64_t t = 0; t < taps; t++) {
            const uint16_t *p = x + (direct ? pixel : pixel + tap[t]) * CUVIL_BLOCK;
            for (int64_t cb = 0; cb < CB; cb++, p += plane, row += CUVIL_BLOCK / 2) memcpy(row, p, CUVIL_BLOCK * sizeof(uint16_t));
        }
    } else {
        const float *x = src->x + first;
        for (int64_t t = 0; t < taps; t++) {
            const float *p = x + (direct ? pixel : pixel + tap[t]) * CUVIL_BLOCK;
            for (int64_t cb = 0; cb < CB; cb++, p += plane, row += CUVIL_BLOCK / 2) cuvil_bf16_round(p, CUVIL_BLOCK, row);
        }
    }
}

/* Tasks t: conv group t / tasks (RegNet's 64-channel groups: a GEMM each), its M block t % tasks / ng
 * (its rows rounded to bf16 once, into the thread's buffer) over panel group t % ng (panel groups only
 * where there are too few M blocks to keep the threads busy). Group g writes output channels
 * [g Og, g Og + Og): whole blocks, Og P floats (or bf16 values) from the first. */
static void bf16_conv_task(void *ctx, int64_t t0, int64_t t1) {
    bf16_conv *a = ctx;
    const int64_t Og = a->s->O / a->s->groups;
    for (int64_t tt = t0; tt < t1; tt++) {
        int64_t g = tt / a->tasks, t = tt % a->tasks;
        int64_t m0 = t / a->ng * a->mc, rows = a->P - m0 < a->mc ? a->P - m0 : a->mc, q = t % a->ng;
        uint32_t *Ab = a->shared ? a->shared + m0 * a->K2
                                 : cuvil_thread_buffer(CUVIL_BUF_DOT_ROWS, (size_t)(a->mc * a->K2) * sizeof(uint32_t));
        if (!Ab) {
            a->out_of_memory = 1;
            return;
        }
        if (!a->shared)
            for (int64_t m = 0; m < rows; m++) bf16_conv_row(a, g, m0 + m, Ab + m * a->K2);
        cuvil_dot_out o = bf16_conv_out_from(&a->out, g * Og * a->P / CUVIL_BLOCK + m0);
        if (o.bias_col) o.bias_col += g * Og;
        cuvil_bf16_rows(Ab, rows, a->K2, a->wb + g * a->np * a->K2 * CUVIL_BF16_NR, Og, q * a->np / a->ng,
                        (q + 1) * a->np / a->ng, &o);
    }
}

static void bf16_conv_round_task(void *ctx, int64_t m0, int64_t m1) {
    const bf16_conv *a = ctx;
    for (int64_t m = m0; m < m1; m++) bf16_conv_row(a, 0, m, a->shared + m * a->K2);
}

int cuvil_conv_blocked_bf16(const cuvil_conv_shape *s, const float *x, const uint32_t *wb, const float *bias,
                            const float *residual, float *y, int act, int links, float *scratch, int nthreads) {
    int64_t P = s->OH * s->OW, in = s->C * s->H * s->W, out = s->O * P, mb, mc = blocked_m_rows(P, 0, 1, CUVIL_MR, &mb);
    int64_t G = s->groups;
    int nt = P * s->O * s->C / G > 65536 ? nthreads : 1;
    /* a group's panels; with groups, the tasks split by group and M block only (no rows rounded beforehand) */
    int64_t np = (s->O / G + CUVIL_BF16_NR - 1) / CUVIL_BF16_NR, ng = G == 1 && nt > 1 && mb < 2 * nt ? cuvil_min(np, 2 * nt) : 1;
    int64_t K2 = s->KH * s->KW * s->C / G / 2;
    /* Split by panels too (few M blocks): each M block's rows are read by several tasks, so all rows are
     * rounded once beforehand, by every thread, into one buffer. Each task had rounded its own (3x3 convs
     * at 14x14, K 2304 and more: each row gathered and rounded 4 times, 1.4x the time on 2 threads of 1). */
    uint32_t *shared = 0;
    if (ng > 1) {
        shared = cuvil_thread_buffer(CUVIL_BUF_APACK, (size_t)(P * K2) * sizeof(uint32_t));
        if (!shared) return -1;
    }
    blocked_input b = blocked_input_tables(s, scratch);
    int in16 = links & CUVIL_BF16_IN;
    for (int64_t n = 0; n < s->N; n++) {
        /* image n of a bf16 map where its floats' image would be (x + n * in), its planes as long in elements */
        const float *xn = blocked_image_of(s, &b, x + n * in, scratch, nthreads, in16 ? CUVIL_BLOCK / 2 : CUVIL_BLOCK);
        bf16_conv a = {s, {xn, b.pix, b.tap, s->C / G / CUVIL_BLOCK, b.hp * b.wp * CUVIL_BLOCK}, b.direct, wb,
                       bf16_conv_out(y + n * out, bias, residual ? residual + n * out : 0, act, links, P),
                       P, K2, mc, ng, np, mb * ng, shared, in16, 0};
        if (shared) cuvil_parallel_for(nt, P, 1, bf16_conv_round_task, &a);
        cuvil_parallel_for(nt, G * mb * ng, 1, bf16_conv_task, &a);
        if (a.out_of_memory) return -1;
    }
    return 0;
}

/* ---- bf16 products from an NCHW input (a network's stem) ------------------------------------ */
/* The input in bf16, zero padded and pixel-major (hp x wp pixels of C values), and A's rows gathered
 * from it in K's order (kh, kw, c), as the blocked convs' filters are ordered: undilated, a filter row's
 * taps are one run of KW x C values. ResNet's 7x7 stem (K 147) had run in fp32 at 1.1 ms, a twentieth of
 * its network in bf16; gathered plane by plane (21 runs of 7 values a row, not 7 of 21), its rows had
 * cost as much as its products. */
typedef struct {
    const cuvil_conv_shape *s;
    const float *x;               /* this image, NCHW */
    uint16_t *img;
    const int64_t *pix;           /* where output pixel m's window starts, in pixels */
    int64_t hp, wp, K, K2, P, mc, np;
    const uint32_t *wb;
    cuvil_dot_out out;
    int out_of_memory;
} bf16_nchw_conv;

#define BF16_SHORT_RUN 64         /* bytes a gathered run of at most that many is copied as */

/* Rows r of the padded image: each channel's floats rounded VL at a time, then spread C apart. */
static void bf16_nchw_image_task(void *ctx, int64_t r0, int64_t r1) {
    const bf16_nchw_conv *a = ctx;
    const cuvil_conv_shape *s = a->s;
    const int64_t C = s->C;
    uint16_t b[CUVIL_VL];
    for (int64_t r = r0; r < r1; r++) {
        int64_t ih = r - s->ph;
        uint16_t *out = a->img + r * a->wp * C;
        int64_t lo = ih < 0 || ih >= s->H ? a->wp : cuvil_min(s->pw, a->wp), n = lo == a->wp ? 0 : cuvil_min(s->W, a->wp - lo);
        memset(out, 0, lo * C * sizeof(uint16_t));
        for (int64_t c = 0; c < C; c++) {
            const float *p = a->x + (c * s->H + ih) * s->W;
            uint16_t *o = out + lo * C + c;
            int64_t w = 0;
            for (; w + CUVIL_VL <= n; w += CUVIL_VL) {
                cuvil_store_bf16(cuvil_vload(p + w), b);
                for (int j = 0; j < CUVIL_VL; j++) o[(w + j) * C] = b[j];
            }
            for (; w < n; w++) o[w * C] = cv_f32_to_bfloat16(p[w], 0);
        }
        memset(out + (lo + n) * C, 0, (a->wp - lo - n) * C * sizeof(uint16_t));
    }
}

/* Tasks t: M block t, its rows gathered into the thread's buffer and multiplied by every panel. */
static void bf16_nchw_task(void *ctx, int64_t t0, int64_t t1) {
    bf16_nchw_conv *a = ctx;
    const cuvil_conv_shape *s = a->s;
    const int64_t C = s->C, run = s->dw == 1 ? s->KW : 1, runs = s->KH * s->KW / run, span = run * C;
    /* the image's slack: the other half of the floats' place cuvil_conv_nchw_blocked_scratch gives it */
    const int short_runs = span * (int64_t)sizeof(uint16_t) <= BF16_SHORT_RUN &&
                           C * a->hp * a->wp * (int64_t)sizeof(uint16_t) >= BF16_SHORT_RUN;
    for (int64_t t = t0; t < t1; t++) {
        int64_t m0 = t * a->mc, rows = a->P - m0 < a->mc ? a->P - m0 : a->mc;
        uint32_t *Ab = cuvil_thread_buffer(CUVIL_BUF_DOT_ROWS, (size_t)(a->mc * a->K2) * sizeof(uint32_t) + BF16_SHORT_RUN);
        if (!Ab) {
            a->out_of_memory = 1;
            return;
        }
        /* in locals: the rows' stores might alias the arguments, which GCC would then read again each run */
        const uint16_t *img = a->img;
        const int64_t *pix = a->pix + m0;
        const int64_t K = a->K, K2 = a->K2, KW = s->KW, row_step = s->dh * a->wp * C, tap_step = s->dw * C;
        for (int64_t m = 0; m < rows; m++) {
            uint16_t *row = (uint16_t *)(Ab + m * K2);
            const uint16_t *win = img + pix[m] * C;
            /* tap (kh, kw) stepped, not divided out: a division a run had taken as long as the copies */
            for (int64_t i = 0, kh = 0, kw = 0; i < runs; i++, kw = kw + run == KW ? 0 : kw + run, kh += kw == 0) {
                const uint16_t *src = win + kh * row_step + kw * tap_step;
                /* a short run as one fixed copy: its overhang is written over by the next run or row, or
                 * lands in the slack past the rows; the image has slack after it too */
                if (short_runs) memcpy(row + i * span, src, BF16_SHORT_RUN);
                else memcpy(row + i * span, src, span * sizeof(uint16_t));
            }
            if (K % 2) row[K] = 0;                    /* the last pair's high half (its filters' row is 0) */
        }
        cuvil_dot_out o = bf16_conv_out_from(&a->out, m0);
        cuvil_bf16_rows(Ab, rows, a->K2, a->wb, s->O, 0, a->np, &o);
    }
}

int cuvil_conv_nchw_blocked_bf16(const cuvil_conv_shape *s, const float *x, const uint32_t *wb, const float *bias,
                                 const float *residual, float *y, int act, int links, float *scratch, int nthreads) {
    int64_t P = s->OH * s->OW, out = s->O * P, hp = padded_h(s), wp = padded_w(s), K = s->C * s->KH * s->KW, mb;
    int nt = P * s->O * K > 65536 ? nthreads : 1;
    int64_t mc = blocked_m_rows(P, 0, nt, CUVIL_MR, &mb);
    int64_t *pix = (int64_t *)scratch;            /* then the image: cuvil_conv_nchw_blocked's scratch holds both */
    blocked_pixel_table(s, wp, pix);
    bf16_nchw_conv a = {s, 0, (uint16_t *)(pix + P), pix, hp, wp, K, (K + 1) / 2, P, mc,
                        (s->O + CUVIL_BF16_NR - 1) / CUVIL_BF16_NR, wb, {0}, 0};
    for (int64_t n = 0; n < s->N; n++) {
        a.x = x + n * s->C * s->H * s->W;
        cuvil_parallel_for(s->C * hp * wp > 16384 ? nthreads : 1, hp, 1, bf16_nchw_image_task, &a);
        a.out = bf16_conv_out(y + n * out, bias, residual ? residual + n * out : 0, act, links, P);
        cuvil_parallel_for(nt, mb, 1, bf16_nchw_task, &a);
        if (a.out_of_memory) return -1;
    }
    return 0;
}

/* ---- int8 products ------------------------------------------------------------------------- */
/* The input's range: [lo, hi] over one image (cuvil_conv_blocked_int8 without a calibrated range), in
 * chunks whose partial extremes one thread then combines. */
#define RANGE_CHUNKS 64
typedef struct { const float *x; int64_t n, chunk; float lo[RANGE_CHUNKS], hi[RANGE_CHUNKS]; } range_args;

static void range_task(void *ctx, int64_t c0, int64_t c1) {
    range_args *a = ctx;
    for (int64_t c = c0; c < c1; c++) {
        const float *p = a->x + c * a->chunk;
        int64_t n = a->n - c * a->chunk < a->chunk ? a->n - c * a->chunk : a->chunk, i = 0;
        cuvil_vf lo = cuvil_vsplat(0.f), hi = lo;          /* 0 in the range: padding and zeros stay exact */
        for (; i + CUVIL_VL <= n; i += CUVIL_VL) {
            cuvil_vf v = cuvil_vload(p + i);
            lo = cuvil_vsel(v < lo, v, lo), hi = cuvil_vsel(v > hi, v, hi);
        }
        float l = 0.f, h = 0.f;
        for (int j = 0; j < CUVIL_VL; j++) l = lo[j] < l ? lo[j] : l, h = hi[j] > h ? hi[j] : h;
        for (; i < n; i++) l = p[i] < l ? p[i] : l, h = p[i] > h ? p[i] : h;     /* an NCHW input's tail */
        a->lo[c] = l, a->hi[c] = h;
    }
}

/* The affine map of the input onto bytes: q = clamp(rint(x / scale) + zero, 0, CUVIL_I8_LEVELS). */
typedef struct { float scale, inv, zero; } byte_map;

static byte_map input_byte_map(const float *x, int64_t n, const float *range, int nthreads) {
    float lo = 0.f, hi = 0.f, scale, zero;
    if (range) lo = range[0], hi = range[1];
    else {
        range_args a = {x, n, 0, {0}, {0}};
        int64_t chunks = n / 16384 < 1 ? 1 : n / 16384 > RANGE_CHUNKS ? RANGE_CHUNKS : n / 16384;
        a.chunk = (n / chunks + CUVIL_VL - 1) / CUVIL_VL * CUVIL_VL, chunks = (n + a.chunk - 1) / a.chunk;
        cuvil_parallel_for(chunks > 1 ? nthreads : 1, chunks, 1, range_task, &a);
        for (int64_t c = 0; c < chunks; c++) lo = a.lo[c] < lo ? a.lo[c] : lo, hi = a.hi[c] > hi ? a.hi[c] : hi;
    }
    cuvil_byte_scale(lo, hi, (float)CUVIL_I8_LEVELS, &scale, &zero);
    return (byte_map){scale, 1.f / scale, zero};
}

static inline uint8_t to_byte(float x, byte_map m) { return cuvil_to_byte(x, m.inv, m.zero, (float)CUVIL_I8_LEVELS); }

/* B floats -> B bytes, as to_byte. */
static inline void to_bytes(const float *x, byte_map m, uint8_t *out) {
    cuvil_to_bytes(cuvil_vload(x), m.inv, m.zero, (float)CUVIL_I8_LEVELS, out);
}

/* The quantized image, pixel-major: rows ih of the padded image (hp x wp pixels of C bytes each, the
 * padding at the zero point), so that a pixel's channels are one run of bytes: a 1x1 conv reads its
 * GEMM's rows in place, any other gathers a row as one run per tap. */
typedef struct { const cuvil_conv_shape *s; const float *x; uint8_t *xq; int64_t hp, wp; byte_map m; int nchw; } quantize_args;

/* Pixels [0, n) of an NCHW input's row ih as bytes, pixel-major at out (C bytes a pixel): with a block's
 * channels or more, tiles of VL channels x VL pixels turned in registers (transpose.h), each pixel's
 * vector mapped at once; with fewer (a stem's 3), each channel's VL pixels mapped at once and their bytes
 * spread C apart; value by value for the last pixels. One value at a time, MobileNetV2's 24 -> 144
 * channel convs at 56x56 had taken 0.2 ms, twice a blocked input's. */
static void nchw_row_bytes(const quantize_args *a, int64_t ih, int64_t n, uint8_t *out) {
    const cuvil_conv_shape *s = a->s;
    const int64_t C = s->C, HW = s->H * s->W;
    const float *x = a->x + ih * s->W;
    int64_t w = 0;
    uint8_t b[CUVIL_VL];
    if (C < CUVIL_VL)
        for (; w + CUVIL_VL <= n; w += CUVIL_VL)
            for (int64_t c = 0; c < C; c++) {
                to_bytes(x + c * HW + w, a->m, b);
                for (int j = 0; j < CUVIL_VL; j++) out[(w + j) * C + c] = b[j];
            }
#ifdef CUVIL_TRANSPOSE_BLOCK
    float part[CUVIL_VL * CUVIL_VL] __attribute__((aligned(64))), t[CUVIL_VL * CUVIL_VL] __attribute__((aligned(64)));
    for (; w + CUVIL_VL <= n; w += CUVIL_VL)
        for (int64_t c0 = 0; c0 < C; c0 += CUVIL_VL) {
            int64_t nc = C - c0 < CUVIL_VL ? C - c0 : CUVIL_VL, lds = HW;
            const float *src = x + c0 * HW + w;
            if (nc < CUVIL_VL) {            /* the last channels, padded to a whole tile */
                for (int i = 0; i < CUVIL_VL; i++) cuvil_vstore(part + i * CUVIL_VL, i < nc ? cuvil_vload(src + i * HW) : cuvil_vsplat(0.f));
                src = part, lds = CUVIL_VL;
            }
            transpose_block(src, lds, t, CUVIL_VL);        /* row j: pixel w + j's channels c0 .. */
            for (int j = 0; j < CUVIL_VL; j++) {
                uint8_t *o = out + (w + j) * C + c0;
                to_bytes(t + j * CUVIL_VL, a->m, nc == CUVIL_VL ? o : b);
                if (nc < CUVIL_VL)
                    for (int i = 0; i < nc; i++) o[i] = b[i];
            }
        }
#endif
    for (; w < n; w++)
        for (int64_t c = 0; c < C; c++) out[w * C + c] = to_byte(x[c * HW + w], a->m);
}

static void quantize_task(void *ctx, int64_t r0, int64_t r1) {
    const quantize_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    int64_t plane = s->H * s->W * CUVIL_BLOCK;
    for (int64_t r = r0; r < r1; r++) {
        int64_t ih = r - s->ph;
        uint8_t *out = a->xq + r * a->wp * s->C;
        if (a->nchw && ih >= 0 && ih < s->H) {            /* a net's stem or a layer of channels no block holds */
            int64_t n = s->W < a->wp - s->pw ? s->W : a->wp - s->pw;    /* a strided conv's image drops the last */
            memset(out, (int)a->m.zero, s->pw * s->C);
            nchw_row_bytes(a, ih, n, out + s->pw * s->C);
            memset(out + (s->pw + n) * s->C, (int)a->m.zero, (a->wp - s->pw - n) * s->C);
            continue;
        }
        for (int64_t iw = 0; iw < a->wp; iw++, out += s->C) {
            int64_t w = iw - s->pw;
            if (ih < 0 || ih >= s->H || w < 0 || w >= s->W) {
                memset(out, (int)a->m.zero, s->C);
                continue;
            }
            const float *px = a->x + (ih * s->W + w) * CUVIL_BLOCK;
            for (int64_t cb = 0; cb < s->C / CUVIL_BLOCK; cb++) to_bytes(px + cb * plane, a->m, out + cb * CUVIL_BLOCK);
        }
    }
}

#define SHORT_RUN 32              /* bytes a gathered row's runs may be copied as, whatever their length */

typedef struct {
    const cuvil_conv_shape *s;
    const uint8_t *xq;            /* the quantized image, pixel-major */
    const int64_t *pix, *tap;     /* where the conv gathers (not direct) */
    int64_t K4, P, mc, ng, np, tasks;   /* tasks: per group (RegNet's groups are GEMMs of their own) */
    int direct, in_place;         /* direct: pixel m reads pixel m, in place where its C bytes are whole words */
    int nchw_out;                 /* the output in NCHW, through cuvil_nchw_from_rows */
    int short_runs;               /* SHORT_RUN bytes may be read from any pixel of the image (an NCHW input's) */
    int64_t window_run_step;      /* > 0: a 3 x 3 conv's rows read where they lie (cuvil_i8_window_rows), its
                                   * filter rows this many pixels apart; 0: copied side by side */
    const uint32_t *wq;
    cuvil_dot_out out;
    int out_of_memory;
} int8_conv;

/* n bytes (a multiple of 64) copied a line at a time, inline: as memcpy calls of a filter row's bytes, 192
 * for ResNet's 3x3 convs over 64 channels, the windows' copy had taken a quarter of their time */
static inline void copy_lines(uint8_t *dst, const uint8_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i += 64) memcpy(dst + i, src + i, 64);
}

static void int8_conv_task(void *ctx, int64_t t0, int64_t t1) {
    int8_conv *a = ctx;
    int64_t C = a->s->C, G = a->s->groups, Cg = C / G, Og = a->s->O / G, taps = a->s->KH * a->s->KW;
    for (int64_t tt = t0; tt < t1; tt++) {
        int64_t g = tt / a->tasks, t = tt % a->tasks;        /* group g reads channels [g Cg, g Cg + Cg) */
        int64_t m0 = t / a->ng * a->mc, rows = a->P - m0 < a->mc ? a->P - m0 : a->mc, q = t % a->ng;
        const uint8_t *xq = a->xq + g * Cg;
        const uint32_t *Aq = (const uint32_t *)(xq + m0 * C);    /* a 1x1 conv's rows: the image's pixels */
        cuvil_dot_out o = a->out;          /* group g writes output channels [g Og, g Og + Og) */
        o.C += g * Og * a->P + m0 * CUVIL_BLOCK, o.row0 = m0, o.col0 = g * Og;
        if (o.residual) o.residual += g * Og * a->P + m0 * CUVIL_BLOCK;
        o.scale_col += g * Og, o.bias_col += g * Og;
        int64_t p0 = q * a->np / a->ng, p1 = (q + 1) * a->np / a->ng;
        if (a->window_run_step) {
            uint8_t *spare = cuvil_thread_buffer(CUVIL_BUF_DOT_ROWS, (size_t)(6 * 4 * a->K4 + SHORT_RUN));
            if (!spare) {
                a->out_of_memory = 1;
                return;
            }
            cuvil_i8_window w = {xq, a->pix + m0, C, a->s->OW, m0 % a->s->OW, a->s->sw, a->window_run_step};
            if (cuvil_i8_window_rows(&w, rows, a->K4, a->wq, Og, p0, p1, &o, spare)) continue;
        }
        if (!a->in_place) {
            int64_t row = 4 * a->K4;                    /* bytes: taps * Cg up to whole words */
            uint8_t *rowbuf = cuvil_thread_buffer(CUVIL_BUF_DOT_ROWS, (size_t)(a->mc * row + SHORT_RUN));
            if (!rowbuf) {
                a->out_of_memory = 1;
                return;
            }
            /* row m: each tap's pixel, C bytes; undilated, a filter row's taps are side by side in the
             * image, one run of KW * C bytes (the stem's 3 channels had been 49 copies of 3 bytes) */
            int64_t run = a->s->dw == 1 ? a->s->KW : 1, runs = taps / run;
            /* runs of at most SHORT_RUN bytes (a stem's 3 x 3 or 7 x 3 channels) as one copy of 16 or 32
             * bytes each: its overhang is written over by the next run, the next row, or lands in the
             * SHORT_RUN bytes past the rows; the image it reads past has room after it (short_runs: an NCHW
             * input's, in scratch: the float copy's place, or SHORT_RUN bytes of slack,
             * cuvil_conv_blocked_int8_scratch). As calls of 9 bytes, MobileNetV2's stem had run slower in
             * int8 than in fp32; as calls of 21, ResNet-50's 7x7 stem took 0.64 ms, 2.4x its dot products. */
            int64_t span = run * C;
            int short_runs = a->short_runs && G == 1 && span <= SHORT_RUN;
            for (int64_t m = 0; m < rows; m++) {
                uint8_t *dst = rowbuf + m * row;
                for (int64_t k = 0; k < runs; k++) {
                    const uint8_t *src = xq + (a->direct ? m0 + m : a->pix[m0 + m] + a->tap[k * run]) * C;
                    if (short_runs && span <= 16) memcpy(dst + k * span, src, 16);
                    else if (short_runs) memcpy(dst + k * span, src, SHORT_RUN);
                    else if (G == 1 && span % 64 == 0) copy_lines(dst + k * span, src, span);
                    else if (G == 1) memcpy(dst + k * span, src, span);
                    else for (int64_t j = 0; j < run; j++) memcpy(dst + (k * run + j) * Cg, src + j * C, Cg);
                }
                for (int64_t i = taps * Cg; i < row; i++) dst[i] = 0;    /* (the filters' rows there are 0) */
            }
            Aq = (const uint32_t *)rowbuf;
        }
        if (a->nchw_out) {
            /* the block's sums scaled row-major into a thread buffer, then turned to NCHW */
            int64_t ldb = (Og + CUVIL_VL - 1) / CUVIL_VL * CUVIL_VL;
            float *buf = cuvil_thread_buffer(CUVIL_BUF_DOT_OUT, (size_t)(rows * ldb) * sizeof(float));
            if (!buf) {
                a->out_of_memory = 1;
                return;
            }
            cuvil_dot_out r = {buf, 0, o.bias_col, 0, o.scale_col, INT64_MAX / 2, 0, ldb, 0, 1.f, CUVIL_ACT_NONE, 0, 0, 0};
            /* a residual in bytes (the map pixel-major, as rows are) is added to the rows; a float one, in
             * NCHW, as they are turned */
            r.row0 = o.row0, r.col0 = o.col0, r.res_q = o.res_q, r.res_ld = o.res_ld, r.res_scale = o.res_scale,
            r.res_shift = o.res_shift;
            cuvil_i8_rows(Aq, rows, a->K4, a->wq + g * a->np * a->K4 * CUVIL_I8_NR, Og, p0, p1, &r);
            cuvil_nchw_from_rows(buf, ldb, rows, p0 * CUVIL_I8_NR, cuvil_min(p1 * CUVIL_I8_NR, Og), a->out.C + g * Og * a->P + m0,
                                 a->out.residual ? a->out.residual + g * Og * a->P + m0 : 0, 0, a->P, a->out.act);
            continue;
        }
        cuvil_i8_rows(Aq, rows, a->K4, a->wq + g * a->np * a->K4 * CUVIL_I8_NR, Og, p0, p1, &o);
    }
}

/* Scratch floats: the tables and copy of cuvil_conv_blocked, the quantized image (in the copy's place
 * where there is one, after the tables where the conv reads in place) and two columns' terms. */
static int64_t int8_image_at(const cuvil_conv_shape *s) {
    return blocked_in_place(s) || blocked_direct(s) ? cuvil_conv_blocked_scratch(s) : 0;
}

int64_t cuvil_conv_blocked_int8_scratch(const cuvil_conv_shape *s) {
    int64_t image = blocked_in_place(s) || blocked_direct(s) ? (s->C * s->H * s->W + 3) / 4 : 0;
    /* + SHORT_RUN bytes: a short run's read past the image's last pixel (int8_conv_task short_runs) */
    return (cuvil_conv_blocked_scratch(s) + image + SHORT_RUN / 4 + 15) / 16 * 16 + 2 * s->O;
}

/* Whether a 3 x 3 conv's rows can be read where they lie in its image (cuvil_i8_window_rows): whole words a
 * pixel, one group, undilated, whole panels into bytes, on maps wide enough (CUVIL_I8_WINDOW_MIN_OW, tuning.h:
 * the tiles an output row's end cuts short cost more than the copy saves on narrow maps). */
static int int8_windows(const cuvil_conv_shape *s, int nchw_out) {
    return s->KH == 3 && s->KW == 3 && s->groups == 1 && s->dw == 1 && s->C % 4 == 0 && s->O % CUVIL_I8_NR == 0 &&
           !nchw_out && s->OW >= CUVIL_I8_WINDOW_MIN_OW;
}

int cuvil_conv_blocked_int8(const cuvil_conv_shape *s, const float *x, const uint32_t *wq, const float *wterms,
                            const float *bias, const float *residual, const float *res_range, const float *range,
                            int input_kind, float *y,
                            int nchw_out, const int64_t *out_image, const float *out_range, int act, float *scratch,
                            int nthreads) {
    int64_t P = s->OH * s->OW, in = s->C * s->H * s->W, out = s->O * P, mb, mc = blocked_m_rows(P, 0, 1, CUVIL_MR, &mb);
    int64_t G = s->groups, np = (s->O / G + CUVIL_I8_NR - 1) / CUVIL_I8_NR;
    /* too few M blocks to share: the panels split into groups too, of two panels at least, so a task asks
     * for its next panel's weights (int8dot.c) and copies its rows' windows for two panels or more (one
     * panel a group at 14x14 on 2 threads: ResNet-50 int8 1.010-1.024x the time) */
    int64_t ng = mb * G >= 2 * nthreads ? 1 : cuvil_max(1, cuvil_min(np / 2, 2 * nthreads));
    blocked_input b = blocked_input_tables(s, scratch);
    uint8_t *xq = (uint8_t *)(scratch + int8_image_at(s));
    float *scale_col = scratch + (cuvil_conv_blocked_int8_scratch(s) - 2 * s->O), *bias_col = scale_col + s->O;
    int64_t image = b.hp * b.wp * s->C, out_bytes = out_image ? out_image[0] * out_image[1] * s->O : 0;
    byte_map om = out_image ? input_byte_map(0, 0, out_range, 1) : (byte_map){1.f, 1.f, 0.f};
    byte_map rm = res_range ? input_byte_map(0, 0, res_range, 1) : (byte_map){1.f, 1.f, 0.f};
    for (int64_t n = 0; n < s->N; n++) {
        byte_map m = input_byte_map(x + n * in, in, range, nthreads);
        /* sum * scale * w_scale[o] - scale * zero * w_scale[o] * sum_k w[k][o] + bias[o]: wterms holds
         * w_scale and w_scale times the filter's sum */
        for (int64_t o = 0; o < s->O; o++)
            scale_col[o] = m.scale * wterms[o], bias_col[o] = (bias ? bias[o] : 0.f) - m.scale * m.zero * wterms[s->O + o];
        if (input_kind == CUVIL_I8_IN_BYTES) xq = (uint8_t *)x + n * image;     /* written by the conv before */
        else {
            quantize_args qa = {s, x + n * in, xq, b.hp, b.wp, m, input_kind == CUVIL_I8_IN_NCHW};
            cuvil_parallel_for(in > 16384 ? nthreads : 1, b.hp, 1, quantize_task, &qa);
        }
        cuvil_byte_image bytes = {0};
        if (out_image) {
            bytes = (cuvil_byte_image){(uint8_t *)y + n * out_bytes, om.inv, om.zero, (float)CUVIL_I8_LEVELS, s->OW,
                                       s->O, out_image[0], out_image[1], out_image[2], out_image[3]};
            cuvil_byte_border(bytes.q, out_image, s->OH, s->OW, s->O, (uint8_t)om.zero);
        }
        int8_conv a = {s, xq, b.pix, b.tap, (s->KH * s->KW * s->C / G + 3) / 4, P, mc, ng, np, mb * ng, b.direct,
                       b.direct && G == 1 && s->C % 4 == 0,
                       nchw_out, input_kind == CUVIL_I8_IN_NCHW, int8_windows(s, nchw_out) ? s->dh * b.wp : 0, wq, {y + n * out, 0, bias_col, 0, scale_col, CUVIL_BLOCK,
                                      P * CUVIL_BLOCK, CUVIL_BLOCK, CUVIL_BLOCK, 1.f, act, out_image ? &bytes : 0, 0, 0}, 0};
        if (residual && res_range)          /* the bytes its producer wrote: the map, pixel-major */
            a.out.res_q = (const uint8_t *)residual + n * P * s->O, a.out.res_ld = s->O, a.out.res_scale = rm.scale,
            a.out.res_shift = -rm.zero * rm.scale;
        else if (residual) a.out.residual = residual + n * out;
        cuvil_parallel_for(P * s->O * s->C / G > 65536 ? nthreads : 1, G * mb * ng, 1, int8_conv_task, &a);
        if (a.out_of_memory) return -1;
    }
    return 0;
}
