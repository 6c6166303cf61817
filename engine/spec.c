/* engine/spec.c - draft tokens for speculative decoding: prompt lookup and
 * the per-request adaptation (what and why: spec.h).
 *
 * The adaptation is a small state machine, chosen so that the worst case
 * is bounded rather than the average tuned:
 *   - a request starts with drafts of 2 (a first guess costs little when
 *     wrong); a proposal accepted whole doubles the next one (up to
 *     spec_tokens) and never shrinks it; a partly accepted one sets the
 *     next size to what was accepted plus one, so a steady acceptance of
 *     m tokens settles at drafts of m + 1;
 *   - a verification that accepts nothing halves the size; two in a row
 *     start a cool-down of `backoff` decode steps without drafts, and each
 *     further miss after a cool-down doubles backoff (up to 256), while any
 *     accepted token brings it back to its start. On output that never
 *     repeats its context, the extra rows cost one single-token probe per
 *     256 tokens once the back-off has grown.
 * Called on the engine's owner thread. */
#include "spec.h"

#include <string.h>

#define BACKOFF_START 8
#define BACKOFF_MAX 256

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

void spec_adapt_init(struct spec_adapt *a, int k_max)
{
    memset(a, 0, sizeof *a);
    a->k_max = k_max > SPEC_MAX_TOKENS ? SPEC_MAX_TOKENS : k_max;
    a->k_cur = a->k_max < 2 ? a->k_max : 2;
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
    return a->k_cur;
}

void spec_adapt_update(struct spec_adapt *a, int n_drafted, int n_accepted)
{
    if (n_drafted <= 0)
        return;
    if (n_accepted > 0) {
        a->misses = 0;
        a->backoff = BACKOFF_START;
        int k = n_accepted + 1;
        if (n_accepted == n_drafted) /* a short draft (little to look up) is no reason to shrink */
            k = 2 * (a->k_cur > n_drafted ? a->k_cur : n_drafted);
        a->k_cur = k > a->k_max ? a->k_max : k;
        return;
    }
    a->k_cur = a->k_cur > 1 ? a->k_cur / 2 : 1;
    if (++a->misses >= 2) {
        a->cooldown = a->backoff;
        a->backoff = a->backoff * 2 > BACKOFF_MAX ? BACKOFF_MAX : a->backoff * 2;
        a->misses = 1; /* the probe after the cool-down decides at once */
    }
}
