/* The thread pool every parallel loop runs on. Work is split in chunks that the threads claim (from
 * runs of their own, or a shared counter), and the caller works too: when another process holds a
 * core, the threads that run finish the loop without waiting for the one that does not (OpenMP's
 * barrier would). */
#ifndef CUVIL_POOL_H
#define CUVIL_POOL_H
#include <stddef.h>
#include <stdint.h>

typedef void (*cuvil_task_fn)(void *ctx, int64_t begin, int64_t end);

/* Runs fn(ctx, b, e) over [0, n) on up to nthreads threads, in chunks of at least `grain` items but
 * the last. Thread t (the caller is 0) owns the t-th of nthreads equal runs and claims chunks from its
 * front; a thread out of work takes half of what is left of the fullest other run, from its back. */
void cuvil_parallel_for(int nthreads, int64_t n, int64_t grain, cuvil_task_fn fn, void *ctx);

/* The same in chunks of exactly `chunk` items (the last may be short): memory-bound loops whose
 * threads finish together only if the chunks are small next to the whole. */
void cuvil_parallel_chunks(int nthreads, int64_t n, int64_t chunk, cuvil_task_fn fn, void *ctx);

/* The same with chunks that shrink toward the end (to 1/(2 threads) of what is left, at least one
 * item), so the threads finish within about one item of each other, not one chunk. */
void cuvil_parallel_guided(int nthreads, int64_t n, int64_t chunk, cuvil_task_fn fn, void *ctx);

/* The calling thread's scratch buffer `slot`, at least `bytes` long (grown on demand and kept; its
 * contents are lost when it grows), or NULL when out of memory. Freed when the thread exits, and all
 * of them when the library is unloaded: a long-running process that loads and drops artifacts, or
 * runs them from short-lived threads, keeps no buffers behind. */
enum { CUVIL_BUF_APACK, CUVIL_BUF_QSCRATCH, CUVIL_BUF_LINALG, CUVIL_BUF_DOT_ROWS, CUVIL_BUF_DOT_COLS, CUVIL_BUF_DOT_OUT, CUVIL_NUM_BUFS };
void *cuvil_thread_buffer(int slot, size_t bytes);
#endif
