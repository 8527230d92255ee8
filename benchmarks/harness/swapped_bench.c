/* The C harness behind the swapped-conv numbers in benchmarks/README.md ("Kernel notes"): a 3x3 stride-2
 * conv of an NCHW map as cuvil_conv_swapped runs it (im2col rows [K][pixels], then the GEMM with A given
 * transposed), timed alone on one thread, beside the same GEMM with A transposed and with A packed ahead
 * (what the packing of the transposed A costs).
 *
 *   cc -O3 -march=native -pthread -I cuvil/codegen/c -I benchmarks/harness benchmarks/harness/swapped_bench.c \
 *      cuvil/codegen/c/kernels/{conv,gemm,pool}.c -lm -o swapped_bench
 *   swapped_bench C H O          (C channels of H x H in, O out: ShuffleNet's 116 28 232)
 *
 * Prints the median microseconds a call and GFLOP/s. Operands are patterns, not checked here: the
 * kernels' results are checked by tests/test_fusion.py (test_conv_swapped_*). */
#include <stdio.h>

#include "kernels/conv.h"
#include "kernels/gemm.h"
#include "timing.h"

enum { CONV, GEMM_A_TRANSPOSED, GEMM_A_PACKED };

typedef struct { cuvil_conv_shape s; float *x, *w, *b, *y, *scratch, *a; int what; } call;

static void run(void *ctx) {
    call *c = ctx;
    int64_t P = c->s.OH * c->s.OW, K = c->s.C * 9, ldc = c->s.O + CUVIL_VL;
    if (c->what == CONV) cuvil_conv_swapped(&c->s, c->x, c->w, c->b, 0, c->y, 1, c->scratch, 1);
    else if (c->what == GEMM_A_TRANSPOSED) cuvil_sgemm_at_packed(P, c->s.O, K, c->a, P, c->w, c->scratch, ldc, 0, 1);
    else cuvil_sgemm_packed_ab(P, c->s.O, K, c->a, c->w, c->scratch, ldc, 0, 1);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: swapped_bench C H O\n");
        return 2;
    }
    int64_t C = atoll(argv[1]), H = atoll(argv[2]), O = atoll(argv[3]), OH = (H + 1) / 2;
    call c = {{.N = 1, .C = C, .H = H, .W = H, .O = O, .KH = 3, .KW = 3, .OH = OH, .OW = OH, .sh = 2, .sw = 2,
               .ph = 1, .pw = 1, .dh = 1, .dw = 1, .groups = 1}};
    int64_t P = OH * OH, K = C * 9;
    c.x = pattern_floats(C * H * H, 7, 0.001f, -0.5f);
    c.w = pattern_floats(cuvil_packed_b_size(K, O), 3, 0.001f, -0.5f);
    c.b = pattern_floats(O, 1, 0.01f, 0);
    c.y = pattern_floats(O * P, 1, 0, 0);
    c.scratch = pattern_floats(cuvil_conv_swapped_scratch(&c.s), 1, 0, 0);
    c.a = pattern_floats(cuvil_packed_a_size(P, K), 5, 0.001f, 0);      /* covers [K][P] too */
    if (!c.x || !c.w || !c.b || !c.y || !c.scratch || !c.a) return 1;
    const char *names[] = {"conv_swapped", "its GEMM, A transposed", "the GEMM, A packed ahead"};
    double flops = 2.0 * P * O * K;
    for (c.what = CONV; c.what <= GEMM_A_PACKED; c.what++) {
        double us = median_us(200, run, &c);
        printf("%-26s %8.1f us %6.0f GFLOP/s\n", names[c.what], us, flops / us / 1e3);
    }
    return 0;
}
