/* The C harness behind the depthwise numbers in benchmarks/README.md ("Kernel notes"): one depthwise
 * conv of cuvil's kernel library timed alone, hot, one thread count, on a channel-blocked map
 * (cuvil_depthwise_blocked) or an NCHW one (cuvil_conv2d's depthwise path: channels that fill no block,
 * MobileNetV3's 72, ShuffleNet's 58).
 *
 *   dw_bench C H W K STRIDE THREADS CALLS [PAD [ACT [LAYOUT]]]
 *
 * Input [1][C/B][H][W][B] (LAYOUT blocked, the default; C a multiple of B) or [1][C][H][W] (nchw), pad
 * PAD (default K/2), bias, activation ACT (activations.h codes; 0 none, 1 ReLU (the default), 7 ReLU6 and
 * 8 hardswish are checked, others run unchecked). Prints the median microseconds a call; exits 1 if any
 * output then disagrees with a plain loop. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/blocked.h"
#include "kernels/pool.h"
#include "timing.h"

typedef struct { const cuvil_conv_shape *s; const float *x, *w, *b; float *y; int act, threads, nchw; } dw_call;

static void run_dw(void *ctx) {
    const dw_call *c = ctx;
    if (c->nchw) cuvil_conv2d(c->s, CUVIL_CONV_DEPTHWISE, c->x, c->w, 0, c->b, 0, c->y, c->act, 0, c->threads);
    else cuvil_depthwise_blocked(c->s, c->x, c->w, c->b, 0, c->y, c->act, c->threads);
}

/* Where channel c of pixel p of a C-channel map of P pixels lies: NCHW, or in blocks of CUVIL_BLOCK. */
static int64_t at(int nchw, int64_t C, int64_t P, int64_t c, int64_t p) {
    (void)C;
    return nchw ? c * P + p : (c / CUVIL_BLOCK * P + p) * CUVIL_BLOCK + c % CUVIL_BLOCK;
}

/* The filter value of channel c at tap t: NCHW as torch's [C][K * K], blocked as [K * K][C]. */
static int64_t tap_at(int nchw, int64_t C, int64_t taps, int64_t c, int64_t t) { return nchw ? c * taps + t : t * C + c; }

static int checked(int act) {
    return act == CUVIL_ACT_NONE || act == CUVIL_ACT_RELU || act == CUVIL_ACT_RELU6 || act == CUVIL_ACT_HARDSWISH;
}

static double activate(double v, int act) {
    if (act == CUVIL_ACT_RELU) return v > 0 ? v : 0;
    if (act == CUVIL_ACT_RELU6) return v < 0 ? 0 : v > 6 ? 6 : v;
    if (act == CUVIL_ACT_HARDSWISH) return v * (v + 3 < 0 ? 0 : v + 3 > 6 ? 6 : v + 3) / 6;
    return v;
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: %s C H W K STRIDE THREADS CALLS [PAD [ACT [LAYOUT]]]\n", argv[0]);
        return 2;
    }
    int64_t C = atoll(argv[1]), H = atoll(argv[2]), W = atoll(argv[3]), K = atoll(argv[4]), S = atoll(argv[5]);
    int threads = atoi(argv[6]), calls = atoi(argv[7]), act = argc > 9 ? atoi(argv[9]) : CUVIL_ACT_RELU;
    int nchw = argc > 10 && !strcmp(argv[10], "nchw");
    int64_t P = argc > 8 ? atoll(argv[8]) : K / 2, OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    if (C < 1 || (!nchw && C % CUVIL_BLOCK) || H < 1 || W < 1 || K < 1 || S < 1 || threads < 1 || calls < 1 ||
        P < 0 || OH < 1 || OW < 1) {
        fprintf(stderr, "sizes must be positive and leave an output, C a multiple of %d when blocked\n", CUVIL_BLOCK);
        return 2;
    }
    cuvil_conv_shape s = {1, C, H, W, C, K, K, OH, OW, S, S, P, P, 1, 1, C};
    float *x = pattern_floats(C * H * W, 7919, 1e-2f, -5.f), *w = pattern_floats(C * K * K, 104729, 1e-3f, -0.5f);
    float *b = pattern_floats(C, 1, 1e-3f, 0.f), *y = pattern_floats(C * OH * OW, 1, 0.f, 0.f);
    if (!x || !w || !b || !y) return 1;
    dw_call call = {&s, x, w, b, y, act, threads, nchw};
    double med = median_us(calls, run_dw, &call);
    if (med < 0) return 1;
    printf("%.2f\n", med);
    fflush(stdout);
    if (!checked(act)) return 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                double want = b[c];
                for (int64_t kh = 0; kh < K; kh++)
                    for (int64_t kw = 0; kw < K; kw++) {
                        int64_t ih = oh * S - P + kh, iw = ow * S - P + kw;
                        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                        want += (double)x[at(nchw, C, H * W, c, ih * W + iw)] * w[tap_at(nchw, C, K * K, c, kh * K + kw)];
                    }
                want = activate(want, act);
                float got = y[at(nchw, C, OH * OW, c, oh * OW + ow)];
                if (fabs(got - want) > 1e-4 * (1 + fabs(want))) {
                    fprintf(stderr, "y[c=%lld][%lld][%lld] = %g, a plain loop gives %g\n", (long long)c,
                            (long long)oh, (long long)ow, got, want);
                    return 1;
                }
            }
    return 0;
}
