/* tests/unit/test_pool.c - the CPU thread pool: every index runs exactly
 * once per run, results written by workers are visible to the caller when
 * run() returns, and this holds back to back (spinning workers), after idle
 * gaps (sleeping workers woken by futex), with one thread, and with more
 * threads than cores; and dynamic runs, which may leave late workers out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu/pool.h"

#define MAX_T 16

struct job {
    _Atomic int hits[MAX_T]; /* runs of each ith */
    int nth_seen[MAX_T];     /* nth each thread was given */
    uint64_t out[MAX_T];     /* plain writes, read by the caller after run */
    uint64_t round;
};

static void job_fn(void *arg, int ith, int nth)
{
    struct job *j = arg;
    atomic_fetch_add_explicit(&j->hits[ith], 1, memory_order_relaxed);
    j->nth_seen[ith] = nth;
    j->out[ith] = j->round * 1000 + (uint64_t)ith;
}

static void check_runs(int n_threads, int n_runs, int gap_us)
{
    struct cpu_pool *p = NULL;
    struct rl_err err = {0};
    assert_int_equal(cpu_pool_create(&p, n_threads, &err), 0);
    assert_non_null(p);
    assert_int_equal(cpu_pool_n_threads(p), n_threads);
    struct job *j = calloc(1, sizeof *j);
    assert_non_null(j);
    for (int r = 0; r < n_runs; r++) {
        j->round = (uint64_t)r;
        cpu_pool_run(p, job_fn, j);
        for (int i = 0; i < n_threads; i++) {
            if (j->out[i] != (uint64_t)r * 1000 + (uint64_t)i)
                fail_msg("run %d: thread %d output %llu stale", r, i,
                         (unsigned long long)j->out[i]);
            if (j->nth_seen[i] != n_threads)
                fail_msg("run %d: thread %d saw nth %d", r, i, j->nth_seen[i]);
        }
        if (gap_us)
            usleep((useconds_t)gap_us);
    }
    for (int i = 0; i < MAX_T; i++) {
        int want = i < n_threads ? n_runs : 0;
        int got = atomic_load(&j->hits[i]);
        if (got != want)
            fail_msg("%d threads: index %d ran %d times in %d runs", n_threads, i, got, n_runs);
    }
    free(j);
    cpu_pool_free(p);
}

static void test_one_thread(void **state) { (void)state; check_runs(1, 1000, 0); }
static void test_two_threads_back_to_back(void **state) { (void)state; check_runs(2, 50000, 0); }
/* 300 us gaps: beyond the spin window, so workers sleep and get woken. */
static void test_two_threads_sleeping(void **state) { (void)state; check_runs(2, 300, 300); }
static void test_oversubscribed(void **state) { (void)state; check_runs(MAX_T, 1000, 0); }
static void test_mixed_gaps(void **state) { (void)state; check_runs(3, 200, 120); }

/* A real parallel loop: a sum over disjoint slices equals the serial one. */
struct sum_job {
    const uint32_t *v;
    size_t n;
    uint64_t part[MAX_T];
};

static void sum_fn(void *arg, int ith, int nth)
{
    struct sum_job *s = arg;
    size_t a = s->n * (size_t)ith / (size_t)nth, b = s->n * (size_t)(ith + 1) / (size_t)nth;
    uint64_t t = 0;
    for (size_t i = a; i < b; i++)
        t += s->v[i];
    s->part[ith] = t;
}


/* cpu_pool_run_dyn: threads claim items from a counter; every item is done
 * exactly once per run and its (plain) result is visible on return, with
 * static runs mixed in (a worker skipped by a dynamic run must still join
 * the next static one), back to back and oversubscribed (MAX_T threads on
 * 2 cores: workers often miss runs, which is the point). */
#define DYN_ITEMS 64
struct dyn_job {
    _Atomic int next;
    uint32_t done[DYN_ITEMS]; /* round number written by whoever did it */
    uint32_t round;
};

static void dyn_fn(void *arg, int ith, int nth)
{
    (void)ith, (void)nth;
    struct dyn_job *j = arg;
    for (int i; (i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < DYN_ITEMS;)
        j->done[i] = j->round;
}

static void check_dyn(int n_threads, int n_runs)
{
    struct cpu_pool *p = NULL;
    assert_int_equal(cpu_pool_create(&p, n_threads, NULL), 0);
    struct dyn_job *d = calloc(1, sizeof *d);
    struct job *j = calloc(1, sizeof *j);
    assert_non_null(d);
    assert_non_null(j);
    for (int r = 1; r <= n_runs; r++) {
        atomic_store(&d->next, 0);
        d->round = (uint32_t)r;
        cpu_pool_run_dyn(p, dyn_fn, d);
        for (int i = 0; i < DYN_ITEMS; i++)
            if (d->done[i] != (uint32_t)r)
                fail_msg("%d threads, dyn run %d: item %d has round %u", n_threads, r, i, d->done[i]);
        if (r % 7 == 0) { /* a static run: every ith exactly once */
            memset(j->hits, 0, sizeof j->hits);
            j->round = (uint64_t)r;
            cpu_pool_run(p, job_fn, j);
            for (int i = 0; i < n_threads; i++)
                if (atomic_load(&j->hits[i]) != 1 || j->out[i] != (uint64_t)r * 1000 + (uint64_t)i)
                    fail_msg("%d threads, static run after dyn %d: thread %d hits %d", n_threads, r,
                             i, atomic_load(&j->hits[i]));
        }
    }
    free(d), free(j);
    cpu_pool_free(p);
}

static void test_dyn_runs(void **state)
{
    (void)state;
    check_dyn(1, 100);
    check_dyn(2, 2000);
    check_dyn(MAX_T, 100);
}

static void test_parallel_sum(void **state)
{
    (void)state;
    struct cpu_pool *p;
    assert_int_equal(cpu_pool_create(&p, 4, NULL), 0);
    size_t n = 1 << 20;
    uint32_t *v = malloc(n * sizeof *v);
    assert_non_null(v);
    uint64_t want = 0;
    for (size_t i = 0; i < n; i++) {
        v[i] = (uint32_t)(i * 2654435761u);
        want += v[i];
    }
    struct sum_job s = {.v = v, .n = n};
    for (int r = 0; r < 50; r++) {
        memset(s.part, 0, sizeof s.part);
        cpu_pool_run(p, sum_fn, &s);
        uint64_t got = 0;
        for (int i = 0; i < 4; i++)
            got += s.part[i];
        assert_int_equal(got, want);
    }
    free(v);
    cpu_pool_free(p);
}

static void test_create_args(void **state)
{
    (void)state;
    struct cpu_pool *p = (struct cpu_pool *)(uintptr_t)1;
    struct rl_err err = {0};
    assert_int_equal(cpu_pool_create(&p, -1, &err), -RL_EINVAL);
    assert_int_equal(err.code, RL_EINVAL);
    assert_null(p);
    assert_int_equal(cpu_pool_create(&p, 0, &err), 0);
    long want = sysconf(_SC_NPROCESSORS_ONLN);
    assert_int_equal(cpu_pool_n_threads(p), want > 0 ? want : 1);
    cpu_pool_free(p);
    cpu_pool_free(NULL);
    /* create and free without ever running */
    for (int i = 0; i < 20; i++) {
        assert_int_equal(cpu_pool_create(&p, 3, NULL), 0);
        cpu_pool_free(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_args),
        cmocka_unit_test(test_one_thread),
        cmocka_unit_test(test_two_threads_back_to_back),
        cmocka_unit_test(test_two_threads_sleeping),
        cmocka_unit_test(test_mixed_gaps),
        cmocka_unit_test(test_oversubscribed),
        cmocka_unit_test(test_parallel_sum),
        cmocka_unit_test(test_dyn_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
