/* The round trip of one cache line between two cores: thread A writes a counter, thread B sees it and
 * writes it back, N times. A VM's two vCPUs on one core complex (shared L3) take about 100 ns; on this
 * project's shared host they sometimes took 400 ns, and then every loop whose threads read what the
 * other had written ran as if on one core (benchmarks/README.md). Prints the mean in nanoseconds.
 * Build: cc -O2 -pthread core_latency.c; run with the two cores to pin (default 0 1). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ROUNDS 200000
static _Alignas(64) _Atomic long counter;
static int cores[2] = {0, 1};

static void pin(int core) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *echo(void *arg) {
    (void)arg;
    pin(cores[1]);
    for (long i = 0; i < ROUNDS; i++) {
        while (atomic_load_explicit(&counter, memory_order_acquire) != 2 * i + 1) {}
        atomic_store_explicit(&counter, 2 * i + 2, memory_order_release);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3) cores[0] = atoi(argv[1]), cores[1] = atoi(argv[2]);
    pin(cores[0]);
    pthread_t t;
    if (pthread_create(&t, 0, echo, 0)) return 1;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < ROUNDS; i++) {
        atomic_store_explicit(&counter, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&counter, memory_order_acquire) != 2 * i + 2) {}
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, 0);
    printf("%.0f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / ROUNDS);
    return 0;
}
