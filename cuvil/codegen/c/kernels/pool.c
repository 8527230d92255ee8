#define _GNU_SOURCE
#include "pool.h"
#include <stdlib.h>
#ifdef CUVIL_SINGLE_THREAD
/* Targets without threads (wasm32-wasi): every loop runs on the caller, in the chunks the pool would
 * hand out (a task may size its scratch by them), and one set of scratch buffers serves all calls. */
static void serial(int64_t n, int64_t chunk, cuvil_task_fn fn, void *ctx) {
    if (chunk < 1) chunk = 1;
    for (int64_t b = 0; b < n; b += chunk) fn(ctx, b, b + chunk < n ? b + chunk : n);
}

void cuvil_parallel_for(int nthreads, int64_t n, int64_t grain, cuvil_task_fn fn, void *ctx) {
    (void)nthreads;
    int64_t chunk = (n + 3) / 4;
    serial(n, chunk < grain ? grain : chunk, fn, ctx);
}

void cuvil_parallel_chunks(int nthreads, int64_t n, int64_t chunk, cuvil_task_fn fn, void *ctx) {
    (void)nthreads;
    serial(n, chunk, fn, ctx);
}

void cuvil_parallel_guided(int nthreads, int64_t n, int64_t chunk, cuvil_task_fn fn, void *ctx) {
    (void)nthreads;
    serial(n, chunk, fn, ctx);
}

void *cuvil_thread_buffer(int slot, size_t bytes) {
    static void *buf[CUVIL_NUM_BUFS];
    static size_t cap[CUVIL_NUM_BUFS];
    if (bytes > cap[slot]) {
        free(buf[slot]);
        buf[slot] = malloc(bytes + bytes / 4);
        cap[slot] = buf[slot] ? bytes + bytes / 4 : 0;
    }
    return buf[slot];
}
#else
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define MAX_WORKERS 63
#define SPIN_NS 200000            /* a worker spins this long for the next job, then sleeps */

/* One thread's own run of a job's items, [front, back) packed in one word: its owner claims from the
 * front, the others, once out of work of their own, from the back. */
typedef struct { _Alignas(64) _Atomic uint64_t span; } owned_run;

/* What the threads write (next, done) lies on lines of its own, apart from what they only read: each
 * write to a line the other cores read costs every one of them a transfer, and where a host puts two
 * vCPUs far apart (a 400 ns round trip) a parallel region had paid about 2 us in such transfers. */
typedef struct {
    cuvil_task_fn fn;
    void *ctx;
    int64_t n, chunk, grain;      /* grain: the least a guided claim takes */
    int helpers;                  /* workers allowed to join this job */
    int tail;                     /* threads sharing the tail: claims shrink toward its end (guided) */
    int owned;                    /* runs: items split into helpers + 1 owned runs (cuvil_parallel_for) */
    owned_run *runs;
    _Alignas(64) atomic_int_fast64_t next;
    _Alignas(64) atomic_int_fast64_t done;   /* items finished: each thread adds its own once, when out of work */
} job_t;

static pthread_mutex_t submit_lock = PTHREAD_MUTEX_INITIALIZER;   /* one job at a time */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
/* What the submitter posts and every worker's spin reads, on a line of its own (the submit lock's
 * line, taken and given back each region, had been that line's neighbour) */
static struct {
    _Alignas(64) job_t *_Atomic job;
    atomic_uint_fast64_t generation;
    atomic_int sleepers;
    atomic_int stopping;        /* set by the library's destructor: workers leave, and are joined */
} posted;
static struct { _Alignas(64) atomic_int count; } in_job;   /* workers that may be reading posted.job: its owner waits for 0 */
static int nworkers;
static pthread_t workers[MAX_WORKERS];
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

static inline uint64_t span_of(int64_t f, int64_t b) { return (uint64_t)f | (uint64_t)b << 32; }

/* From the front of run r (its owner, `chunk` items) or from its back (a thief, half of what is left,
 * at least the grain); 0 when the run is empty. */
static int64_t claim_run(job_t *j, int r, int thief, int64_t *b) {
    uint64_t cur = atomic_load(&j->runs[r].span);
    for (;;) {
        int64_t f = (int64_t)(cur & 0xffffffffu), e = (int64_t)(cur >> 32), left = e - f;
        if (left <= 0) return 0;
        int64_t c = thief ? (left + 1) / 2 : j->chunk;
        c = c < j->grain ? j->grain : c;
        c = c > left ? left : c;
        uint64_t next = thief ? span_of(f, e - c) : span_of(f + c, e);
        if (atomic_compare_exchange_weak(&j->runs[r].span, &cur, next)) { *b = thief ? e - c : f; return c; }
    }
}

/* Thread `me`'s next items: its own run first, then the back of the fullest other run. */
static int64_t claim_owned(job_t *j, int me, int64_t *b) {
    int64_t c = claim_run(j, me, 0, b);
    while (c == 0) {
        int victim = -1;
        int64_t most = 0;
        for (int r = 0; r <= j->helpers; r++) {
            uint64_t sp = atomic_load(&j->runs[r].span);
            int64_t left = (int64_t)(sp >> 32) - (int64_t)(sp & 0xffffffffu);
            if (r != me && left > most) most = left, victim = r;
        }
        if (victim < 0) return 0;
        c = claim_run(j, victim, 1, b);
    }
    return c;
}

static void run_chunks(job_t *j, int me) {
    int64_t finished = 0;
    for (;;) {
        int64_t b, c = j->owned ? claim_owned(j, me, &b) : claim(j, &b);
        if (c <= 0) break;
        j->fn(j->ctx, b, b + c);
        finished += c;
    }
    atomic_fetch_add(&j->done, finished);
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    uint_fast64_t seen = 0;
    in_worker = 1;
    for (;;) {
        int64_t t0 = now_ns();
        int spins = 0;
        while (atomic_load(&posted.generation) == seen && !atomic_load(&posted.stopping)) {
            if (now_ns() - t0 > SPIN_NS) {
                pthread_mutex_lock(&sleep_lock);
                atomic_fetch_add(&posted.sleepers, 1);
                while (atomic_load(&posted.generation) == seen && !atomic_load(&posted.stopping)) pthread_cond_wait(&wake, &sleep_lock);
                atomic_fetch_sub(&posted.sleepers, 1);
                pthread_mutex_unlock(&sleep_lock);
                break;
            }
            relax(&spins);
        }
        if (atomic_load(&posted.stopping)) return 0;
        seen = atomic_load(&posted.generation);
        atomic_fetch_add(&in_job.count, 1);
        job_t *j = atomic_load(&posted.job);
        if (j && id < j->helpers) run_chunks(j, id + 1);
        atomic_fetch_sub(&in_job.count, 1);
    }
    return 0;
}

/* A forked child has none of its parent's threads: it starts with no workers (and unheld locks), so
 * it spawns its own when it runs in parallel and its exit does not wait on threads that are not there. */
static void reset_in_child(void) {
    pthread_mutex_init(&submit_lock, 0);
    pthread_mutex_init(&sleep_lock, 0);
    pthread_cond_init(&wake, 0);
    atomic_store(&posted.job, (job_t *)0);
    atomic_store(&posted.sleepers, 0);
    atomic_store(&in_job.count, 0);
    nworkers = 0;
}

/* glibc drops a library's fork handlers when it is unloaded */
static void register_atfork(void) { pthread_atfork(0, 0, reset_in_child); }

static void ensure_workers(int want) {
    static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
    pthread_once(&atfork_once, register_atfork);
    if (want > MAX_WORKERS) want = MAX_WORKERS;
    while (nworkers < want && pthread_create(&workers[nworkers], 0, worker, (void *)(intptr_t)nworkers) == 0)
        nworkers++;
}

static void submit(int nthreads, int64_t n, int64_t chunk, int64_t grain, int guided, int owned, cuvil_task_fn fn,
                   void *ctx) {
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
               .tail = guided ? helpers + 1 : 0, .owned = owned && n < (1LL << 32)};
    owned_run runs[j.owned ? helpers + 1 : 1];
    if (j.owned) {
        j.runs = runs;
        for (int r = 0; r <= helpers; r++)
            atomic_init(&runs[r].span, span_of(n * r / (helpers + 1), n * (r + 1) / (helpers + 1)));
    }
    atomic_init(&j.next, 0);
    atomic_init(&j.done, 0);
    atomic_store(&posted.job, &j);
    atomic_fetch_add(&posted.generation, 1);
    if (atomic_load(&posted.sleepers) > 0) {
        pthread_mutex_lock(&sleep_lock);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&sleep_lock);
    }
    run_chunks(&j, 0);
    int spins = 0;
    while (atomic_load(&j.done) < n) relax(&spins);   /* only chunks already claimed are waited for */
    atomic_store(&posted.job, (job_t *)0);
    while (atomic_load(&in_job.count) > 0) relax(&spins);   /* no worker still holds a pointer to j */
    pthread_mutex_unlock(&submit_lock);
}

/* Thread t owns the t-th of nthreads equal runs of the items and works through it in ~4 chunks; a
 * thread out of work takes half of what is left of the fullest other run, from its back. Two loops
 * over the same rows one after the other then give each thread the rows it wrote itself, still in
 * its own L2 (a GEMM split by rows after a layer norm split alike; from a shared counter, the rows
 * fell to whichever thread came first, and half of them crossed between the cores). The stealing
 * keeps what the guided chunks had given: with equal chunks each region waited on its slowest one
 * (ResNet-50 at 2 threads took 1.04-1.06x the time). */
void cuvil_parallel_for(int nthreads, int64_t n, int64_t grain, cuvil_task_fn fn, void *ctx) {
    if (grain < 1) grain = 1;
    if (nthreads < 1) nthreads = 1;
    int64_t chunk = (n + 4 * (int64_t)nthreads - 1) / (4 * (int64_t)nthreads);
    submit(nthreads, n, chunk < grain ? grain : chunk, grain, 0, 1, fn, ctx);
}

void cuvil_parallel_chunks(int nthreads, int64_t n, int64_t chunk, cuvil_task_fn fn, void *ctx) {
    submit(nthreads, n, chunk, 1, 0, 0, fn, ctx);
}

void cuvil_parallel_guided(int nthreads, int64_t n, int64_t chunk, cuvil_task_fn fn, void *ctx) {
    submit(nthreads, n, chunk, 1, 1, 0, fn, ctx);
}

/* ---- per-thread scratch buffers, and what unloading the library releases ---------------------- */
typedef struct thread_bufs {
    void *buf[CUVIL_NUM_BUFS];
    size_t cap[CUVIL_NUM_BUFS];
    struct thread_bufs *prev, *next;
} thread_bufs;

static pthread_mutex_t bufs_lock = PTHREAD_MUTEX_INITIALIZER;
static thread_bufs *all_bufs;                 /* every thread's, so the destructor can free them */
static pthread_key_t bufs_key;
static pthread_once_t bufs_once = PTHREAD_ONCE_INIT;
static int bufs_key_made;
static __thread thread_bufs *my_bufs;

static void free_bufs(thread_bufs *b) {       /* with bufs_lock held */
    for (int i = 0; i < CUVIL_NUM_BUFS; i++) free(b->buf[i]);
    if (b->prev) b->prev->next = b->next; else all_bufs = b->next;
    if (b->next) b->next->prev = b->prev;
    free(b);
}

static void thread_exit(void *p) {
    pthread_mutex_lock(&bufs_lock);
    free_bufs(p);
    pthread_mutex_unlock(&bufs_lock);
}

static void make_key(void) { bufs_key_made = pthread_key_create(&bufs_key, thread_exit) == 0; }

void *cuvil_thread_buffer(int slot, size_t bytes) {
    thread_bufs *b = my_bufs;
    if (!b) {
        pthread_once(&bufs_once, make_key);
        if (!(b = calloc(1, sizeof *b))) return 0;
        pthread_mutex_lock(&bufs_lock);
        b->next = all_bufs;
        if (all_bufs) all_bufs->prev = b;
        all_bufs = b;
        pthread_mutex_unlock(&bufs_lock);
        if (bufs_key_made) pthread_setspecific(bufs_key, b);
        my_bufs = b;
    }
    if (bytes > b->cap[slot]) {           /* a quarter more: a size that creeps up grows rarely */
        size_t cap = bytes + bytes / 4;
        free(b->buf[slot]);
        b->buf[slot] = malloc(cap);
        b->cap[slot] = b->buf[slot] ? cap : 0;
    }
    return b->buf[slot];
}

/* Runs when the library is unloaded (dlclose of the last reference, or process exit): the workers
 * leave their loop and are joined, so none is left running code that is about to be unmapped, and
 * every thread's buffers are freed. The runtime unloads an artifact only when no run is in flight. */
__attribute__((destructor)) static void pool_shutdown(void) {
    atomic_store(&posted.stopping, 1);
    pthread_mutex_lock(&sleep_lock);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&sleep_lock);
    for (int i = 0; i < nworkers; i++) pthread_join(workers[i], 0);
    nworkers = 0;
    if (bufs_key_made) pthread_key_delete(bufs_key);
    pthread_mutex_lock(&bufs_lock);
    while (all_bufs) free_bufs(all_bufs);
    pthread_mutex_unlock(&bufs_lock);
}
#endif
