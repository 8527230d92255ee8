/* Two builds of the kernel library (shared libraries, e.g. this tree and an older one) timed on ResNet-50's
 * blocked convs in one process, in alternation: ROUNDS rounds (15 unless given) of the median of 7 calls each, the medians of the
 * rounds and their ratio (B / A), and whether the two outputs are the same bits. On a shared host whose
 * speed comes and goes in phases, separate processes ran 20-40% apart with the same code; alternating in
 * one process puts both builds in the same phase (benchmarks/README.md, the Intel part).
 *
 *   K="-O3 -pthread -fopenmp-simd -fno-math-errno -fno-trapping-math -ffp-contract=fast -std=gnu11 -march=native -fPIC -shared"
 *   cc $K -I cuvil/codegen/c -I cuvil/codegen/c/kernels cuvil/codegen/c/kernels/[a-z]*.c -lm -o /tmp/new.so
 *   (the same from an older checkout's kernels into /tmp/old.so)
 *   cc -O2 -march=native -I cuvil/codegen/c -I cuvil/codegen/c/kernels -I benchmarks/harness \
 *      benchmarks/harness/blocked_ab.c -ldl -o blocked_ab
 *   blocked_ab /tmp/old.so /tmp/new.so THREADS [ROUNDS] [cold]
 *
 * With "cold" the caches are flushed (a 96 MB buffer written over) before each call, as a conv finds them
 * in a network whose weights stream from DRAM: Zen 4's 1x1 convs ran 1.15-1.4x their warm time so, as they
 * did in ResNet-50's profile, where the warm harness had shown them level with OpenVINO's. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "kernels/blocked.h"
#include "kernels/gemm.h"
#include "timing.h"

typedef void conv_fn(const cuvil_conv_shape *, const float *, const float *, const float *, const float *, float *,
                     int, float *, int);
typedef struct { conv_fn *f; cuvil_conv_shape s; const float *x, *wb, *b, *r; float *y, *scratch; int nt; } call;

enum { MAX_ROUNDS = 15, CALLS = 7, FLUSH_BYTES = 96 << 20 };
static volatile char *flush_buffer;      /* set where the caches are flushed before each call */

static void run(void *ctx) {
    call *c = ctx;
    c->f(&c->s, c->x, c->wb, c->b, c->r, c->y, CUVIL_ACT_RELU, c->scratch, c->nt);
}

static void flush_caches(void *ctx) {
    (void)ctx;
    for (int64_t j = 0; j < FLUSH_BYTES; j += 64) flush_buffer[j] += 1;
}

/* in channels, out channels, input size, filter size, stride, padding, with a residual */
static const int SHAPES[][7] = {{128, 128, 56, 3, 2, 1, 0}, {256, 512, 56, 1, 2, 0, 0}, {256, 256, 28, 3, 2, 1, 0},
                                {512, 1024, 28, 1, 2, 0, 0}, {128, 128, 28, 3, 1, 1, 0}, {512, 512, 7, 3, 1, 1, 0},
                                {64, 256, 56, 1, 1, 0, 1}, {256, 64, 56, 1, 1, 0, 0}, {1024, 256, 14, 1, 1, 0, 0}};

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s A.so B.so THREADS [ROUNDS] [cold]\n", argv[0]);
        return 2;
    }
    void *ha = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL), *hb = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!ha || !hb) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    conv_fn *fa = (conv_fn *)dlsym(ha, "cuvil_conv_blocked"), *fb = (conv_fn *)dlsym(hb, "cuvil_conv_blocked");
    void (*pack_b)(int64_t, int64_t, const float *, int64_t, int, float *, int) = dlsym(ha, "cuvil_pack_b");
    int64_t (*scratch_of)(const cuvil_conv_shape *) = dlsym(ha, "cuvil_conv_blocked_scratch");
    int nt = atoi(argv[3]), rounds = argc > 4 ? atoi(argv[4]) : MAX_ROUNDS;
    if (argc > 5 && !strcmp(argv[5], "cold") && !(flush_buffer = calloc(FLUSH_BYTES, 1))) return 2;
    if (rounds < 1 || rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) {
        const int *d = SHAPES[i];
        int C = d[0], O = d[1], H = d[2], K = d[3], S = d[4], P = d[5], OH = (H + 2 * P - K) / S + 1;
        call c = {fa, {.N = 1, .C = C, .H = H, .W = H, .O = O, .KH = K, .KW = K, .OH = OH, .OW = OH, .sh = S, .sw = S,
                       .ph = P, .pw = P, .dh = 1, .dw = 1, .groups = 1}};
        int64_t KK = (int64_t)K * K * C, out = (int64_t)O * OH * OH;
        float *w = pattern_floats(KK * O, 7, 1e-3f, -0.5f), *wb = aligned_alloc(64, cuvil_packed_b_size(KK, O) * 4 + 64);
        pack_b(KK, O, w, O, 0, wb, 1);
        c.wb = wb, c.x = pattern_floats((int64_t)C * H * H, 3, 1e-3f, -0.4f), c.b = pattern_floats(O, 5, 1e-3f, 0.f);
        c.r = d[6] ? pattern_floats(out, 11, 1e-3f, 0.f) : 0;
        c.scratch = pattern_floats(scratch_of(&c.s) + 16, 1, 0, 0), c.nt = nt;
        float *ya = pattern_floats(out, 1, 0, 0), *yb = pattern_floats(out, 1, 0, 0);
        double ta[MAX_ROUNDS], tb[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++) {
            c.f = fa, c.y = ya, ta[r] = median_us_after(CALLS, run, &c, flush_buffer ? flush_caches : 0);
            c.f = fb, c.y = yb, tb[r] = median_us_after(CALLS, run, &c, flush_buffer ? flush_caches : 0);
        }
        qsort(ta, rounds, sizeof(double), by_value);
        qsort(tb, rounds, sizeof(double), by_value);
        printf("%4d -> %4d %dx%d/%d at %dx%d%s: A %7.1f us  B %7.1f us  B/A %.3f  %s\n", C, O, K, K, S, OH, OH,
               c.r ? " +res" : "", ta[rounds / 2], tb[rounds / 2], tb[rounds / 2] / ta[rounds / 2],
               memcmp(ya, yb, sizeof(float) * out) ? "OUTPUTS DIFFER" : "same output");
    }
    return 0;
}
