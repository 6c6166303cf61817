/* engine/spec.c - draft tokens for speculative decoding: prompt lookup and
 * the per-request adaptation (what and why: spec.h).
 *
 * The adaptation estimates p, the chance that a draft token is right given
 * that those before it were: each verification examined a + 1 positions
 * (a accepted, then the miss) or all d when the whole draft held, and the
 * counts decay by 0.8 per verification, so p follows the request's recent
 * text; it starts at 0.4 (0.8 hits in two tries). Draft position i is
 * reached and kept with probability p^i, so the next draft holds the
 * positions with p^i >= SPEC_MIN_REACH (0.2: a draft row at batch 1 on the
 * CPU costs 5-10 % of a step, BENCHMARKS.md), at most spec_tokens:
 * p = 0.4 gives 1 (the first draft), 1/2 gives 2, 0.6 gives 3, 0.7 and up
 * 4. The first draft is a single token because most of what a request
 * that never repeats itself pays is paid before the first cool-down: from
 * 0.4 two misses reach p < 0.2 (2 draft rows; a prior of 1/2 took 2 + 1 +
 * 1), while one hit lifts p to 0.63 and the next draft to 3.
 *
 * The off-switch bounds the worst case: when p falls so low that not even
 * one position qualifies, or three verifications in a row keep nothing,
 * the request stops drafting for `backoff` decode steps (8, doubling per
 * further miss up to 256; any accepted token resets it) and then probes
 * with a single token. On output that never repeats its context the extra
 * rows cost one single-token probe per 256 tokens once the back-off has
 * grown.
 * Called on the engine's owner thread. */
#include "spec.h"

#include <string.h>

#define BACKOFF_START 8
#define BACKOFF_MAX 256
#define SPEC_MIN_REACH 0.2f
#define DECAY 0.8f

const char *spec_mode_name(enum spec_mode m)
{
    return m == SPEC_NGRAM ? "ngram" : "off";
}

int spec_mode_parse(const char *name, enum spec_mode *out)
{
    if (!name)
        return -1;
    if (!strcmp(name, "off") || !strcmp(name, "none") || !strcmp(name, "")) {
        *out = SPEC_OFF;
        return 0;
    }
    if (!strcmp(name, "ngram")) {
        *out = SPEC_NGRAM;
        return 0;
    }
    return -1;
}

int spec_ngram_propose(const int32_t *tokens, int n_tokens, int n_min, int n_max,
                       int32_t *out, int max_n)
{
    if (max_n <= 0 || n_tokens < 2)
        return 0;
    if (n_min < 1)
        n_min = 1;
    for (int g = n_max; g >= n_min; g--) {
        if (g >= n_tokens)
            continue;
        const int32_t *suf = tokens + n_tokens - g;
        /* latest start p < n_tokens - g: the match ends before the suffix
         * starts to end, so at least one token follows it */
        for (int p = n_tokens - g - 1; p >= 0; p--) {
            if (tokens[p] != suf[0] || memcmp(tokens + p, suf, (size_t)g * sizeof *suf))
                continue;
            int from = p + g, n = n_tokens - from;
            if (n > max_n)
                n = max_n;
            memcpy(out, tokens + from, (size_t)n * sizeof *out);
            return n;
        }
    }
    return 0;
}

/* The positions worth drafting at acceptance p. */
static int size_for(const struct spec_adapt *a, float p)
{
    int d = 0;
    float reach = p;
    while (d < a->k_max && reach >= SPEC_MIN_REACH) {
        d++;
        reach *= p;
    }
    return d;
}

void spec_adapt_init(struct spec_adapt *a, int k_max)
{
    memset(a, 0, sizeof *a);
    a->k_max = k_max > SPEC_MAX_TOKENS ? SPEC_MAX_TOKENS : k_max;
    a->hits = 0.8f;
    a->tries = 2;
    a->k_cur = size_for(a, a->hits / a->tries);
    a->backoff = BACKOFF_START;
}

int spec_adapt_want(struct spec_adapt *a)
{
    if (a->k_max <= 0)
        return 0;
    if (a->cooldown > 0) {
        a->cooldown--;
        return 0;
    }
    return a->k_cur > 0 ? a->k_cur : 1; /* after a cool-down: a probe */
}

void spec_adapt_update(struct spec_adapt *a, int n_drafted, int n_accepted)
{
    if (n_drafted <= 0)
        return;
    int tried = n_accepted < n_drafted ? n_accepted + 1 : n_drafted;
    a->hits = DECAY * a->hits + (float)n_accepted;
    a->tries = DECAY * a->tries + (float)tried;
    a->k_cur = size_for(a, a->hits / a->tries);
    if (n_accepted > 0) {
        a->misses = 0;
        a->backoff = BACKOFF_START;
    } else {
        a->misses++;
    }
    if (a->k_cur == 0 || a->misses >= 3) {
        a->cooldown = a->backoff;
        a->backoff = a->backoff * 2 > BACKOFF_MAX ? BACKOFF_MAX : a->backoff * 2;
        if (a->misses >= 3)
            a->misses = 2; /* the probe after the cool-down decides at once */
    }
}
