/* worker/cli/loadstats.c - see loadstats.h.
 *
 * The generator is splitmix64 (Steele, Lea and Flood's mixer, the seeder of
 * xoshiro): one 64-bit add and three xor-shift-multiplies per draw, no bad
 * seeds, and good enough for choosing prompt words and arrival gaps; the
 * benchmark needs reproducible draws, not cryptography.
 *
 * Percentiles interpolate linearly between the two closest ranks, as
 * numpy.percentile does by default, so that a reader can recompute a
 * report's figures from its per-request records with one line of Python.
 * Called only from the benchmark's main thread, after the client threads
 * have been joined. */
#include "loadstats.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void lst_rng_seed(struct lst_rng *r, uint64_t seed)
{
    r->s = seed;
}

uint64_t lst_rng_next(struct lst_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double lst_rng_unit(struct lst_rng *r)
{
    return (double)(lst_rng_next(r) >> 11) * 0x1.0p-53;
}

int64_t lst_rng_range(struct lst_rng *r, int64_t lo, int64_t hi)
{
    uint64_t span = (uint64_t)(hi - lo) + 1;
    /* span 0 means the whole 64-bit range; the modulo bias of a span far
     * below 2^64 (ours are lengths and word indices) is negligible */
    return span ? lo + (int64_t)(lst_rng_next(r) % span) : (int64_t)lst_rng_next(r);
}

uint64_t lst_seed_mix(uint64_t a, uint64_t b, uint64_t c)
{
    struct lst_rng r = {a};
    uint64_t x = lst_rng_next(&r) ^ b;
    r.s = x;
    x = lst_rng_next(&r) ^ c;
    r.s = x;
    return lst_rng_next(&r);
}

double lst_exp_gap(struct lst_rng *r, double rate)
{
    /* 1 - u is in (0, 1], so the log is finite */
    return -log(1.0 - lst_rng_unit(r)) / rate;
}

void lst_poisson_arrivals(struct lst_rng *r, double rate, int n, double *t)
{
    double now = 0;
    for (int i = 0; i < n; i++) {
        now += lst_exp_gap(r, rate);
        t[i] = now;
    }
}

static int parse_one(const char *s, const char *end, int min, int max, int *v, const char *what,
                     struct rl_err *err)
{
    char buf[32];
    size_t len = (size_t)(end - s);
    if (len == 0 || len >= sizeof buf)
        return rl_errf(err, RL_EINVAL, "%s: expected N or A..B, not \"%.40s\"", what, s);
    memcpy(buf, s, len);
    buf[len] = 0;
    char *e;
    errno = 0;
    long x = strtol(buf, &e, 10);
    if (errno || *e || e == buf)
        return rl_errf(err, RL_EINVAL, "%s: \"%s\" is not an integer", what, buf);
    if (x < min || x > max)
        return rl_errf(err, RL_EINVAL, "%s: %ld is out of range [%d, %d]", what, x, min, max);
    *v = (int)x;
    return 0;
}

int lst_dist_parse(const char *s, int min, int max, struct lst_dist *d, const char *what,
                   struct rl_err *err)
{
    if (!s || !*s)
        return rl_errf(err, RL_EINVAL, "%s needs N or A..B", what);
    const char *dots = strstr(s, "..");
    int lo, hi, rc;
    if (!dots) {
        if ((rc = parse_one(s, s + strlen(s), min, max, &lo, what, err)))
            return rc;
        hi = lo;
    } else {
        if ((rc = parse_one(s, dots, min, max, &lo, what, err)) ||
            (rc = parse_one(dots + 2, dots + 2 + strlen(dots + 2), min, max, &hi, what, err)))
            return rc;
        if (lo > hi)
            return rl_errf(err, RL_EINVAL, "%s: %d..%d is empty (the low end is above the high)",
                           what, lo, hi);
    }
    d->lo = lo;
    d->hi = hi;
    return 0;
}

int lst_dist_draw(const struct lst_dist *d, struct lst_rng *r)
{
    return d->lo == d->hi ? d->lo : (int)lst_rng_range(r, d->lo, d->hi);
}

double lst_percentile(const double *sorted, int n, double p)
{
    if (n <= 0)
        return 0;
    double rank = p / 100.0 * (n - 1);
    if (rank <= 0)
        return sorted[0];
    if (rank >= n - 1)
        return sorted[n - 1];
    int i = (int)rank;
    double f = rank - i;
    return sorted[i] + f * (sorted[i + 1] - sorted[i]);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void lst_summarize(double *v, int n, struct lst_summary *s)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    if (n <= 0)
        return;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += v[i];
    s->mean = sum / n;
    s->min = v[0];
    s->max = v[n - 1];
    s->p50 = lst_percentile(v, n, 50);
    s->p90 = lst_percentile(v, n, 90);
    s->p99 = lst_percentile(v, n, 99);
}

int lst_buckets_init(struct lst_buckets *b, double width, int max_n, struct rl_err *err)
{
    memset(b, 0, sizeof *b);
    if (!(width > 0) || max_n < 1)
        return rl_errf(err, RL_EINVAL, "buckets: width %g and count %d must be positive", width, max_n);
    b->width = width;
    b->max_n = max_n;
    return 0;
}

int lst_buckets_add(struct lst_buckets *b, double x, double w, struct rl_err *err)
{
    double q = x / b->width;
    int i = q <= 0 || q != q ? 0 : q >= b->max_n ? b->max_n - 1 : (int)q;
    if (i >= b->cap) {
        int cap = b->cap ? b->cap : 64;
        while (cap <= i)
            cap *= 2;
        if (cap > b->max_n)
            cap = b->max_n;
        double *s = realloc(b->sum, (size_t)cap * sizeof *s);
        if (!s)
            return rl_errf(err, RL_ENOMEM, "buckets: out of memory");
        memset(s + b->cap, 0, (size_t)(cap - b->cap) * sizeof *s);
        b->sum = s;
        b->cap = cap;
    }
    if (i >= b->n) /* the new buckets between are zero already */
        b->n = i + 1;
    b->sum[i] += w;
    return 0;
}

void lst_buckets_free(struct lst_buckets *b)
{
    free(b->sum);
    memset(b, 0, sizeof *b);
}
