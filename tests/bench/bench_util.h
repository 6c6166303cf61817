/* tests/bench/bench_util.h - what the C benchmarks share: the median of a
 * run's repetitions (each bench alternates its modes and reports medians,
 * BENCHMARKS.md). Header-only (static): each bench is its own binary. */
#ifndef RL_BENCH_UTIL_H
#define RL_BENCH_UTIL_H

#include <stdlib.h>

static int bench_cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v); 0 when n is 0. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_d);
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

#endif
