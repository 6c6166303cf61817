/* engine/cpu/pool.h - a fixed pool of worker threads for one parallel loop
 * at a time.
 *
 * cpu_pool_run() wakes the workers, runs fn on every thread (the caller is
 * thread 0) and returns when all have finished. Workers spin briefly between
 * runs, because a decode step issues hundreds of runs a few microseconds
 * apart, then sleep on a futex so an idle server burns no CPU. */
#ifndef RL_CPU_POOL_H
#define RL_CPU_POOL_H

#include "err.h"

struct cpu_pool; /* opaque */

typedef void (*cpu_pool_fn)(void *arg, int ith, int nth);

/* n_threads counts the caller; 0 = the number of online CPUs. */
int cpu_pool_create(struct cpu_pool **out, int n_threads, struct rl_err *err);
void cpu_pool_free(struct cpu_pool *p);
int cpu_pool_n_threads(const struct cpu_pool *p);

/* Runs fn(arg, ith, nth) for ith = 0..nth-1 concurrently; returns when all
 * are done. Not reentrant: call from one thread, never from inside fn. */
void cpu_pool_run(struct cpu_pool *p, cpu_pool_fn fn, void *arg);

/* The same for an fn whose threads take their work from a shared counter
 * until none is left, so that the caller's fn(arg, 0, n) alone would do all
 * of it: returns as soon as the caller's share is done and every worker
 * that had started has finished; a worker that had not started by then
 * (its core taken by another process) skips this run. Some ith may never
 * be called - fn must not split work by ith. */
void cpu_pool_run_dyn(struct cpu_pool *p, cpu_pool_fn fn, void *arg);

#endif
