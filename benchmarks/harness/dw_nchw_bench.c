/* The C harness behind the NCHW depthwise numbers in benchmarks/README.md ("Kernel notes"): one
 * depthwise conv of cuvil's kernel library on an NCHW map (channels that fill no block: MobileNetV3's
 * 72, ShuffleNet's 58), timed alone, hot, one thread count.
 *
 *   dw_nchw_bench C H W K STRIDE THREADS CALLS [ACT]
 *
 * Input [1][C][H][W], pad K/2, bias, activation ACT (activations.h codes; 0 none, 1 ReLU, 8 hardswish
 * checked, the default hardswish). Prints the median microseconds a call; exits 1 if any output then
 * disagrees with a plain loop. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/conv.h"
#include "kernels/pool.h"
#include "timing.h"

static double activate(double v, int act) {
    if (act == CUVIL_ACT_RELU) return v > 0 ? v : 0;
    if (act == CUVIL_ACT_HARDSWISH) {
        double r = v + 3 < 0 ? 0 : v + 3 > 6 ? 6 : v + 3;
        return v * r / 6;
    }
    return v;
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: %s C H W K STRIDE THREADS CALLS [ACT]\n", argv[0]);
        return 2;
    }
    int64_t C = atoll(argv[1]), H = atoll(argv[2]), W = atoll(argv[3]), K = atoll(argv[4]), S = atoll(argv[5]);
    int threads = atoi(argv[6]), calls = atoi(argv[7]), act = argc > 8 ? atoi(argv[8]) : CUVIL_ACT_HARDSWISH;
    int64_t P = K / 2, OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    if (C < 1 || H < 1 || W < 1 || K < 1 || S < 1 || threads < 1 || calls < 1 || OH < 1 || OW < 1) {
        fprintf(stderr, "sizes must be positive and leave an output\n");
        return 2;
    }
    cuvil_conv_shape s = {1, C, H, W, C, K, K, OH, OW, S, S, P, P, 1, 1, C};
    float *x = aligned_alloc(64, (size_t)(C * H * W * 4 + 63) / 64 * 64);
    float *w = aligned_alloc(64, (size_t)(C * K * K * 4 + 63) / 64 * 64);
    float *b = aligned_alloc(64, (size_t)(C * 4 + 63) / 64 * 64);
    float *y = aligned_alloc(64, (size_t)(C * OH * OW * 4 + 63) / 64 * 64);
    double *t = malloc(sizeof(double) * calls);
    if (!x || !w || !b || !y || !t) return 1;
    for (int64_t i = 0; i < C * H * W; i++) x[i] = (float)((i * 7919) % 1000) * 1e-2f - 5.f;
    for (int64_t i = 0; i < C * K * K; i++) w[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    for (int64_t i = 0; i < C; i++) b[i] = (float)i * 1e-3f;
    for (int i = -3; i < calls; i++) {
        double t0 = now_us();
        cuvil_conv2d(&s, CUVIL_CONV_DEPTHWISE, x, w, 0, b, 0, y, act, 0, threads);
        if (i >= 0) t[i] = now_us() - t0;
    }
    qsort(t, calls, sizeof(double), by_value);
    printf("%.2f\n", t[calls / 2]);
    fflush(stdout);
    if (act != CUVIL_ACT_NONE && act != CUVIL_ACT_RELU && act != CUVIL_ACT_HARDSWISH) return 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                double want = b[c];
                for (int64_t kh = 0; kh < K; kh++)
                    for (int64_t kw = 0; kw < K; kw++) {
                        int64_t ih = oh * S - P + kh, iw = ow * S - P + kw;
                        if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                            want += (double)x[(c * H + ih) * W + iw] * w[(c * K + kh) * K + kw];
                    }
                want = activate(want, act);
                float got = y[(c * OH + oh) * OW + ow];
                if (fabs(got - want) > 1e-4 * (1 + fabs(want))) {
                    fprintf(stderr, "y[c=%lld][%lld][%lld] = %g, a plain loop gives %g\n", (long long)c,
                            (long long)oh, (long long)ow, got, want);
                    return 1;
                }
            }
    return 0;
}
