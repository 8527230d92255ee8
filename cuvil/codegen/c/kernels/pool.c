#define _GNU_SOURCE
#include "pool.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#define MAX_WORKERS 63
#define SPIN_NS 200000            /* a worker spins this long for the next job, then sleeps */

typedef struct {
    cuvil_task_fn fn;
    void *ctx;
    int64_t n, chunk, grain;      /* grain: the least a guided claim takes */
    int helpers;                  /* workers allowed to join this job */
    int tail;                     /* threads sharing the tail: claims shrink toward its end (guided) */
    atomic_int_fast64_t next, done;
} job_t;

static pthread_mutex_t submit_lock = PTHREAD_MUTEX_INITIALIZER;   /* one job at a time */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static job_t *_Atomic current;
static atomic_uint_fast64_t generation;
static atomic_int sleepers;
static atomic_int in_job;          /* workers that may be reading `current`: its owner waits for 0 */
static int nworkers;
static __thread int in_worker;

/* One wait of a spin: the CPU's pause for the first PAUSE_SPINS waits, then sched_yield, so that a
 * thread oversubscribed onto a busy core still lets the others run. A yield alone is a system call
 * (about a microsecond in a VM) on every check, paid by each parallel region's join. */
#define PAUSE_SPINS 4096
static inline void relax(int *spins) {
    if (*spins < PAUSE_SPINS) {
        ++*spins;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ volatile("yield");
#endif
    } else
        sched_yield();
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The next chunk [*b, return value): `chunk` items, or with a tail, 1/(2 tail) of what is left once
 * that is less, so the threads run out of work within about one item of each other. */
static int64_t claim(job_t *j, int64_t *b) {
    if (!j->tail) {
        *b = atomic_fetch_add(&j->next, j->chunk);
        return *b < j->n ? (j->n - *b < j->chunk ? j->n - *b : j->chunk) : 0;
    }
    int_fast64_t cur = atomic_load(&j->next);
    for (;;) {
        if (cur >= j->n) return 0;
        int64_t c = (j->n - cur) / (2 * j->tail);
        c = c > j->chunk ? j->chunk : c < j->grain ? j->grain : c;
        if (c > j->n - cur) c = j->n - cur;
        if (atomic_compare_exchange_weak(&j->next, &cur, cur + c)) { *b = cur; return c; }
    }
}

static void run_chunks(job_t *j) {
    for (;;) {
        int64_t b, c = claim(j, &b);
        if (c <= 0) return;
        int64_t e = b + c;
        j->fn(j->ctx, b, e);
        atomic_fetch_add(&j->done, e - b);
    }
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    uint_fast64_t seen = 0;
    in_worker = 1;
    for (;;) {
        int64_t t0 = now_ns();
        int spins = 0;
        while (atomic_load(&generation) == seen) {
            if (now_ns() - t0 > SPIN_NS) {
                pthread_mutex_lock(&sleep_lock);
                atomic_fetch_add(&sleepers, 1);
                while (atomic_load(&generation) == seen) pthread_cond_wait(&wake, &sleep_lock);
                atomic_fetch_sub(&sleepers, 1);
                pthread_mutex_unlock(&sleep_lock);
                break;
            }
            relax(&spins);
        }
        seen = atomic_load(&generation);
        atomic_fetch_add(&in_job, 1);
        job_t *j = atomic_load(&current);
        if (j && id < j->helpers) run_chunks(j);
        atomic_fetch_sub(&in_job, 1);
    }
    return 0;
}

static void ensure_workers(int want) {
    if (want > MAX_WORKERS) want = MAX_WORKERS;
    while (nworkers < want) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, worker, (void *)(intptr_t)nworkers) != 0) break;
        nworkers++;
    }
}

static void submit(int nthreads, int64_t n, int64_t chunk, int64_t grain, int guided, cuvil_task_fn fn, void *ctx) {
    if (n <= 0) return;
    if (chunk < 1) chunk = 1;
    /* serial: one thread asked for, too little work, called from inside a task, or the pool is busy
     * with another caller's job (two Python threads running models at once) */
    if (nthreads <= 1 || n <= chunk || in_worker || pthread_mutex_trylock(&submit_lock) != 0) {
        fn(ctx, 0, n);
        return;
    }
    ensure_workers(nthreads - 1);
    int helpers = nthreads - 1 < nworkers ? nthreads - 1 : nworkers;
    job_t j = {.fn = fn, .ctx = ctx, .n = n, .chunk = chunk, .grain = grain < 1 ? 1 : grain, .helpers = helpers,
               .tail = guided ? helpers + 1 : 0};
    atomic_init(&j.next, 0);
    atomic_init(&j.done, 0);
    atomic_store(&current, &j);
    atomic_fetch_add(&generation, 1);
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&sleep_lock);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&sleep_lock);
    }
    run_chunks(&j);
    int spins = 0;
    while (atomic_load(&j.done) < n) relax(&spins);   /* only chunks already claimed are waited for */
    atomic_store(&current, (job_t *)0);
    while (atomic_load(&in_job) > 0) relax(&spins);   /* no worker still holds a pointer to j */
    pthread_mutex_unlock(&submit_lock);
}

/* ~4 chunks per thread, shrinking toward the end of the job (guided, down to the grain): with equal
 * chunks each region waited on its slowest one. 2 threads, artifacts interleaved in both orders,
 * new/old time: ResNet-50 0.94-0.96 (0.95-0.97 with a co-tenant taking 20% of a core), MiniLM b1
 * 0.96-0.97, BERT-base and MLP b64 0.99-1.01. */
void cuvil_parallel_for(int nthreads, int64_t n, int64_t grain, cuvil_task_fn fn, void *ctx) {
    if (grain < 1) grain = 1;
    if (nthreads < 1) nthreads = 1;
    int64_t chunk = (n + 4 * (int64_t)nthreads - 1) / (4 * (int64_t)nthreads);
    submit(nthreads, n, chunk < grain ? grain : chunk, grain, 1, fn, ctx);
}

void cuvil_parallel_chunks(int nthreads, int64_t n, int64_t chunk, cuvil_task_fn fn, void *ctx) {
    submit(nthreads, n, chunk, 1, 0, fn, ctx);
}

void cuvil_parallel_guided(int nthreads, int64_t n, int64_t chunk, cuvil_task_fn fn, void *ctx) {
    submit(nthreads, n, chunk, 1, 1, fn, ctx);
}
