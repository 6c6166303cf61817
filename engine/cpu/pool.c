/* engine/cpu/pool.c - persistent worker threads for one parallel loop at a
 * time (see pool.h).
 *
 * Protocol. The pool has a generation counter `gen`. cpu_pool_run():
 *   1. stores fn/arg (plain fields) and pending = n - 1,
 *   2. bumps gen with release order - this publishes fn/arg/pending,
 *   3. if any worker may be asleep (n_sleep > 0), futex-wakes them all,
 *   4. runs fn(arg, 0, n) itself,
 *   5. spins until pending reaches 0 (acquire), which makes every worker's
 *      writes inside fn visible to the caller.
 * A worker remembers the last gen it served. It spins on gen (acquire) for
 * up to SPIN_NS; on a change it reads fn/arg, runs its share and decrements
 * pending (release). After SPIN_NS without work it goes to sleep:
 *   n_sleep += 1 (seq_cst); re-read gen (seq_cst); FUTEX_WAIT(gen, seen).
 * The caller's gen bump and its n_sleep load are seq_cst as well, so by the
 * single total order either the caller sees n_sleep > 0 and wakes, or the
 * worker sees the new gen and does not sleep; and FUTEX_WAIT itself returns
 * at once when gen no longer holds the value it was given. No wakeup is lost.
 *
 * fn/arg are written only while every worker is idle (pending == 0 has been
 * observed with acquire, and each worker read them before its release
 * decrement), and read only after an acquire of the new gen, so they need
 * no atomics: the accesses are ordered by happens-before.
 *
 * Joining (cpu_pool_run_dyn). Each run also publishes `slots` = gen << 32 |
 * (n - 1), stored with release after fn/arg. A worker that
 * sees the new gen joins by a CAS that takes one slot, and only if the gen
 * field still names the gen it woke for; only then does it read fn/arg,
 * run, and decrement pending. cpu_pool_run never closes the run, so every
 * worker joins. cpu_pool_run_dyn closes it when the caller's own fn returns:
 * it swaps slots to zero, and the workers that had not joined (descheduled
 * on a shared machine) are taken off pending, so the caller waits only for
 * the ones that are really running. A late worker's CAS then fails (no
 * slots, or a newer gen), it never touches that run's fn/arg, and it goes
 * straight on to the current gen.
 *
 * Threads are POSIX ones, as the rest of the engine's: ThreadSanitizer
 * follows pthread_create, while glibc starts C11 thrd_create threads past
 * its interceptor and the first instrumented call in one faults inside
 * TSAN (tests/README.md). (The C11 threads had kept <pthread.h> and its
 * <sched.h> away from engine/sched.h when the build searched engine/ with
 * -I; it searches it with -iquote now.)
 *
 * Thread: cpu_pool_run() and cpu_pool_free() from one owner thread. */
#include "cpu/pool.h"
#include "clock.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <linux/futex.h>

/* How long an idle worker spins before sleeping. A decode step issues its
 * runs a few microseconds apart, so 100 us keeps workers hot through a step
 * while an idle server goes quiet within a tenth of a millisecond. */
#define SPIN_NS 100000
/* Spin iterations between clock reads (a vDSO clock read is ~20 ns). */
#define SPIN_CHECK 64

struct cpu_pool;

struct worker {
    struct cpu_pool *pool;
    int ith;
    pthread_t tid;
};

struct cpu_pool {
    int n_threads;            /* including the caller */
    struct worker *workers;   /* (n_threads - 1) */
    cpu_pool_fn fn;           /* current run; see the essay on ordering */
    void *arg;
    _Atomic uint32_t gen;     /* bumped once per run; the futex word */
    _Atomic int pending;      /* workers not yet done with this run */
    _Atomic int n_sleep;      /* workers in (or entering) FUTEX_WAIT */
    _Atomic int stop;         /* set by free; seen with the gen bump */
    _Atomic uint64_t slots;   /* gen << 32 | workers that may still join */
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    /* EAGAIN (value changed) and EINTR both just mean "look again". */
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

/* Waits until gen differs from `seen`; returns the new value. */
static uint32_t wait_gen(struct cpu_pool *p, uint32_t seen)
{
    for (;;) {
        uint64_t t0 = rl_mono_ns();
        for (;;) {
            for (int i = 0; i < SPIN_CHECK; i++) {
                uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
                if (g != seen)
                    return g;
                cpu_relax();
            }
            if (rl_mono_ns() - t0 > SPIN_NS)
                break;
        }
        atomic_fetch_add_explicit(&p->n_sleep, 1, memory_order_seq_cst);
        if (atomic_load_explicit(&p->gen, memory_order_seq_cst) == seen)
            futex_wait(&p->gen, seen);
        atomic_fetch_sub_explicit(&p->n_sleep, 1, memory_order_relaxed);
        uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen)
            return g;
    }
}

static void *worker_main(void *v)
{
    struct worker *w = v;
    struct cpu_pool *p = w->pool;
    uint32_t seen = 0; /* gen starts at 0 and only the owner bumps it */
    for (;;) {
        seen = wait_gen(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_relaxed))
            break;
        uint64_t sl = atomic_load_explicit(&p->slots, memory_order_acquire);
        int joined = 0;
        while (!joined && sl >> 32 == seen && (uint32_t)sl)
            joined = atomic_compare_exchange_weak_explicit(&p->slots, &sl, sl - 1,
                                                           memory_order_acq_rel,
                                                           memory_order_acquire);
        if (!joined)
            continue; /* that run closed without us */
        p->fn(p->arg, w->ith, p->n_threads);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    return NULL;
}

static void bump_and_wake(struct cpu_pool *p)
{
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&p->n_sleep, memory_order_seq_cst) > 0)
        futex_wake_all(&p->gen);
}

/* Stops and joins the first n_started workers. */
static void stop_workers(struct cpu_pool *p, int n_started)
{
    atomic_store_explicit(&p->stop, 1, memory_order_relaxed);
    bump_and_wake(p);
    for (int i = 0; i < n_started; i++)
        pthread_join(p->workers[i].tid, NULL);
}

int cpu_pool_create(struct cpu_pool **out, int n_threads, struct rl_err *err)
{
    *out = NULL;
    if (n_threads < 0 || n_threads > 1024)
        return rl_errf(err, RL_EINVAL, "cpu pool: n_threads %d out of range 0..1024",
                       n_threads);
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)(n > 1024 ? 1024 : n) : 1;
    }
    struct cpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return rl_errf(err, RL_ENOMEM, "cpu pool: out of memory");
    p->n_threads = n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->n_sleep, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->slots, 0);
    int rc = 0, started = 0;
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            rc = rl_errf(err, RL_ENOMEM, "cpu pool: out of memory");
            goto fail;
        }
    }
    for (; started < n_threads - 1; started++) {
        struct worker *w = &p->workers[started];
        w->pool = p;
        w->ith = started + 1;
        int e = pthread_create(&w->tid, NULL, worker_main, w);
        if (e) {
            rc = rl_errf(err, e == EAGAIN ? RL_ENOMEM : RL_EINTERNAL,
                         "cpu pool: cannot start thread %d of %d", started + 1, n_threads);
            goto fail;
        }
    }
    *out = p;
    return 0;
fail:
    stop_workers(p, started);
    free(p->workers);
    free(p);
    return rc;
}

void cpu_pool_free(struct cpu_pool *p)
{
    if (!p)
        return;
    stop_workers(p, p->n_threads - 1);
    free(p->workers);
    free(p);
}

int cpu_pool_n_threads(const struct cpu_pool *p)
{
    return p->n_threads;
}

static void run(struct cpu_pool *p, cpu_pool_fn fn, void *arg, int dyn)
{
    if (p->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    atomic_store_explicit(&p->slots, (uint64_t)g << 32 | (uint32_t)(p->n_threads - 1),
                          memory_order_release);
    bump_and_wake(p); /* seq_cst RMW: also a release of fn/arg/pending */
    fn(arg, 0, p->n_threads);
    if (dyn) {
        uint64_t sl = atomic_exchange_explicit(&p->slots, (uint64_t)g << 32, memory_order_acq_rel);
        atomic_fetch_sub_explicit(&p->pending, (int)(uint32_t)sl, memory_order_relaxed);
    }
    /* Workers run as long as we did, give or take; spin, and yield now and
     * then in case the machine is oversubscribed. */
    for (unsigned i = 1; atomic_load_explicit(&p->pending, memory_order_acquire) != 0; i++) {
        cpu_relax();
        if ((i & 0xffff) == 0)
            sched_yield();
    }
}

void cpu_pool_run(struct cpu_pool *p, cpu_pool_fn fn, void *arg)
{
    run(p, fn, arg, 0);
}

void cpu_pool_run_dyn(struct cpu_pool *p, cpu_pool_fn fn, void *arg)
{
    run(p, fn, arg, 1);
}
