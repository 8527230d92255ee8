/* Average pooling of a channel-blocked map (blocked.h): each output pixel's B channels one vector, the
 * sum of its window's taps inside the map over their count (mode 1) or over the taps inside the declared
 * pads too (mode 2, count_include_pad; not the ceil_mode overhang), as cuvil_pool2d computes it in NCHW.
 * PoolFormer's 3x3 stride-1 pools (x - pool(x) between blocked convs) had gone to NCHW and back. */
#include "blocked.h"
#include "pool.h"

typedef struct { const cuvil_conv_shape *s; int64_t ph1, pw1; int mode; const float *x; float *y; } avg_args;

/* The taps [0, k) of a window from `start` that mode 2 counts: inside [-pad, size + pad1). */
static int64_t padded_taps(int64_t start, int64_t dil, int64_t k, int64_t pad, int64_t size, int64_t pad1) {
    int64_t n = 0;
    for (int64_t t = 0; t < k; t++) n += start + t * dil >= -pad && start + t * dil < size + pad1;
    return n;
}

/* Output rows r = (n * C / B + cb) * OH + oh in [r0, r1). */
static void avg_pool_task(void *ctx, int64_t r0, int64_t r1) {
    const avg_args *a = ctx;
    const cuvil_conv_shape *s = a->s;
    const int64_t row = s->dh * s->W * CUVIL_BLOCK;
    for (int64_t r = r0; r < r1; r++) {
        int64_t plane = r / s->OH, oh = r % s->OH, ih0, kh0, kh1;
        cuvil_window_taps(oh, s->sh, s->ph, s->dh, s->KH, s->H, &ih0, &kh0, &kh1);
        int64_t rows = a->mode == 2 ? padded_taps(ih0, s->dh, s->KH, s->ph, s->H, a->ph1) : kh1 - kh0;
        const float *xr = a->x + (plane * s->H * s->W + (ih0 + kh0 * s->dh) * s->W) * CUVIL_BLOCK;
        float *d = a->y + r * s->OW * CUVIL_BLOCK;
        for (int64_t ow = 0; ow < s->OW; ow++) {
            int64_t iw0, kw0, kw1;
            cuvil_window_taps(ow, s->sw, s->pw, s->dw, s->KW, s->W, &iw0, &kw0, &kw1);
            int64_t cols = a->mode == 2 ? padded_taps(iw0, s->dw, s->KW, s->pw, s->W, a->pw1) : kw1 - kw0;
            cuvil_vf acc = cuvil_vsplat(0.f);
            for (int64_t kh = kh0; kh < kh1; kh++)
                for (int64_t kw = kw0; kw < kw1; kw++)
                    acc += cuvil_vload(xr + (kh - kh0) * row + (iw0 + kw * s->dw) * CUVIL_BLOCK);
            int64_t n = rows * cols;
            cuvil_vstore(d + ow * CUVIL_BLOCK, acc / cuvil_vsplat((float)(n > 0 ? n : 1)));
        }
    }
}

void cuvil_avg_pool_blocked(const cuvil_conv_shape *s, int64_t ph1, int64_t pw1, int mode, const float *x, float *y,
                            int nthreads) {
    avg_args a = {s, ph1, pw1, mode, x, y};
    int64_t rows = s->N * (s->C / CUVIL_BLOCK) * s->OH;
    cuvil_parallel_for(rows * s->OW * CUVIL_BLOCK > 16384 ? nthreads : 1, rows, 1, avg_pool_task, &a);
}
