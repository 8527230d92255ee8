/* The C harness behind the GEMM numbers in benchmarks/README.md ("Kernel notes"): one GEMM or GEMV
 * of cuvil's kernel library timed alone, without Python or a model around it. Built and run by
 * benchmarks/kernel_ab.py against two revisions of the kernels, interleaved.
 *
 *   gemm_bench M N K THREADS CALLS [rows_written]
 *
 * C = A @ Bp with B packed ahead (the weights of a model), fresh A each call. rows_written: before each
 * call the threads write A split by rows, as a layer norm before the GEMM does, so which core holds
 * which rows of A in its L2 is what a model sees. With M = 1 the call takes the GEMV path, weights
 * streamed from memory (b_cached 0). Prints the median microseconds a call; exits 1 if a sample of C
 * disagrees with a plain dot product (a harness timing a wrong kernel would say nothing). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm.h"
#include "kernels/pool.h"
#include "timing.h"

typedef struct { float *a; int64_t K; float v; } rows_args;

static void write_rows(void *ctx, int64_t r0, int64_t r1) {
    const rows_args *r = ctx;
    for (int64_t i = r0 * r->K; i < r1 * r->K; i++) r->a[i] = r->v + (float)(i & 15) * 0.01f;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s M N K THREADS CALLS [rows_written]\n", argv[0]);
        return 2;
    }
    int64_t M = atoll(argv[1]), N = atoll(argv[2]), K = atoll(argv[3]);
    int threads = atoi(argv[4]), calls = atoi(argv[5]), rows_written = argc > 6 && atoi(argv[6]);
    if (M < 1 || N < 1 || K < 1 || threads < 1 || calls < 1) {
        fprintf(stderr, "M, N, K, THREADS and CALLS must be positive\n");
        return 2;
    }
    float *A = aligned_alloc(64, (size_t)(M * K * 4 + 63) / 64 * 64);
    float *B = malloc((size_t)(K * N) * 4);
    float *Bp = aligned_alloc(64, (size_t)(cuvil_packed_b_size(K, N) * 4 + 63) / 64 * 64);
    float *C = aligned_alloc(64, (size_t)(M * N * 4 + 63) / 64 * 64);
    double *t = malloc(sizeof(double) * calls);
    if (!A || !B || !Bp || !C || !t) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < K * N; i++) B[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    cuvil_pack_b(K, N, B, N, 0, Bp, threads);
    rows_args r = {A, K, 0.f};
    cuvil_parallel_for(threads, M, 1, write_rows, &r);
    for (int i = -2; i < calls; i++) {            /* two calls to warm up */
        if (rows_written) {
            r.v = (float)i * 1e-3f;
            cuvil_parallel_for(threads, M, 1, write_rows, &r);
        }
        double t0 = now_us();
        cuvil_sgemm_packed(M, N, K, A, K, Bp, C, N, 0, threads, 0);
        if (i >= 0) t[i] = now_us() - t0;
    }
    for (int64_t s = 0; s < 64; s++) {          /* spread over C, corners included */
        int64_t i = s * 7 % M, j = s == 63 ? N - 1 : s * 131 % N;
        double want = 0, mag = 0;
        for (int64_t k = 0; k < K; k++) {
            want += (double)A[i * K + k] * B[k * N + j];
            mag += fabs((double)A[i * K + k] * B[k * N + j]);
        }
        if (fabs(C[i * N + j] - want) > 1e-4 * mag + 1e-6) {
            fprintf(stderr, "C[%lld][%lld] = %g, a dot product gives %g\n", (long long)i, (long long)j, C[i * N + j], want);
            return 1;
        }
    }
    qsort(t, calls, sizeof(double), by_value);
    printf("%.3f\n", t[calls / 2]);
    return 0;
}
