/* worker/cli/loadstats.h - the arithmetic of `redlm bench` (cmd_loadbench.c),
 * kept apart from Redis and threads so that a unit test can check it with
 * literal cases (tests/unit/test_loadstats.c): a small seeded random number
 * generator, Poisson arrival times, length distributions ("32" or
 * "16..64"), percentiles and summaries, and fixed-width buckets (per-second
 * throughput, histograms). Nothing here allocates except struct
 * lst_buckets, and nothing keeps global state. */
#ifndef RL_CLI_LOADSTATS_H
#define RL_CLI_LOADSTATS_H

#include <stdint.h>

#include "err.h"

/* splitmix64: tiny, fast, and every seed (0 included) gives a good
 * sequence; the benchmark derives one generator per request from (run
 * seed, level, request index), so what a request sends does not depend on
 * which client thread sends it. */
struct lst_rng {
    uint64_t s;
};
void lst_rng_seed(struct lst_rng *r, uint64_t seed);
uint64_t lst_rng_next(struct lst_rng *r);
/* Uniform in [0, 1), 53 bits. */
double lst_rng_unit(struct lst_rng *r);
/* Uniform integer in [lo, hi] (lo <= hi). */
int64_t lst_rng_range(struct lst_rng *r, int64_t lo, int64_t hi);
/* Mixes several integers into one seed (for per-request generators). */
uint64_t lst_seed_mix(uint64_t a, uint64_t b, uint64_t c);

/* One gap of a Poisson process of `rate` events per second: exponential
 * with mean 1/rate seconds (inverse transform of 1 - u, so never log(0)).
 * rate must be > 0. */
double lst_exp_gap(struct lst_rng *r, double rate);
/* Fills t[0..n) with the arrival times in seconds of a Poisson process
 * starting at 0: t[0] is the first gap, t[i] = t[i-1] + gap. */
void lst_poisson_arrivals(struct lst_rng *r, double rate, int n, double *t);

/* A length distribution in tokens: fixed when lo == hi, else uniform over
 * the integers lo..hi. */
struct lst_dist {
    int lo, hi;
};
/* Parses "N" or "A..B" (A <= B) with every value in [min, max]; `what`
 * names the flag in errors. Returns 0 or -RL_EINVAL. */
int lst_dist_parse(const char *s, int min, int max, struct lst_dist *d, const char *what,
                   struct rl_err *err);
int lst_dist_draw(const struct lst_dist *d, struct lst_rng *r);

/* The p-th percentile (0 <= p <= 100) of sorted[0..n), n >= 1, by linear
 * interpolation between the closest ranks (numpy's default): rank
 * p/100*(n-1). */
double lst_percentile(const double *sorted, int n, double p);

struct lst_summary {
    int n;
    double mean, min, max, p50, p90, p99; /* all 0 when n == 0 */
};
/* Sorts v[0..n) in place (ascending) and summarises it; n may be 0. */
void lst_summarize(double *v, int n, struct lst_summary *s);

/* Fixed-width buckets over [0, inf): bucket i holds the weights added at
 * x in [i*width, (i+1)*width). The array grows as needed up to max_n
 * buckets; an x at or beyond max_n*width lands in the last bucket, a
 * negative x in the first, so no weight is ever dropped. */
struct lst_buckets {
    double width;  /* > 0 */
    int max_n;     /* >= 1 */
    int n;         /* buckets in use: 1 + the highest index touched; 0 when empty */
    int cap;
    double *sum;   /* (cap) malloc'd; [0, n) valid */
};
int lst_buckets_init(struct lst_buckets *b, double width, int max_n, struct rl_err *err);
/* Adds w at x. Returns 0 or -RL_ENOMEM. */
int lst_buckets_add(struct lst_buckets *b, double x, double w, struct rl_err *err);
void lst_buckets_free(struct lst_buckets *b);

#endif
