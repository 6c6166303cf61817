/* dispatcher/route.c - the routing policy (see route.h for the order of
 * the rules and the splitter's guarantee).
 *
 * Why a Bresenham accumulator rather than a random draw or a counter
 * reset every 100 requests: a random draw at 0.3 lands 300 +- 15 of 1000
 * on think, and a reset counter sends bursts (30 think in a row, then 70
 * fast). The accumulator interleaves them as evenly as integers allow, so
 * both pools see a steady stream, and the count over any window is within
 * one of the ratio; it is deterministic, so tests can assert it exactly.
 *
 * Several dispatchers each run their own accumulator; the sum of k
 * accumulators is within k of the ratio, which is what "smooth" can mean
 * without shared state.
 *
 * Main thread of the dispatcher only (the router is not locked). */
#include "route.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

void route_split_init(struct route_split *s) { s->acc = ROUTE_PPM / 2; }

bool route_split_next(struct route_split *s, int ratio_ppm)
{
    if (ratio_ppm < 0)
        ratio_ppm = 0;
    if (ratio_ppm > ROUTE_PPM)
        ratio_ppm = ROUTE_PPM;
    s->acc += ratio_ppm;
    if (s->acc >= ROUTE_PPM) {
        s->acc -= ROUTE_PPM;
        return true;
    }
    return false;
}

int route_ratio_ppm(double r)
{
    if (!(r > 0)) /* NaN too */
        return 0;
    if (r >= 1)
        return ROUTE_PPM;
    return (int)(r * ROUTE_PPM + 0.5);
}

static bool word_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

static bool space_char(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

enum route_switch route_soft_switch(const char *text, size_t len)
{
    enum route_switch found = ROUTE_SWITCH_NONE;
    if (!text)
        return found;
    for (size_t i = 0; i < len; i++) {
        if (text[i] != '/' || (i > 0 && !space_char((unsigned char)text[i - 1])))
            continue;
        static const struct {
            const char *word;
            size_t n;
            enum route_switch sw;
        } words[] = {{"/think", 6, ROUTE_SWITCH_THINK}, {"/no_think", 9, ROUTE_SWITCH_NO_THINK}};
        for (int k = 0; k < 2; k++) {
            size_t n = words[k].n;
            if (len - i >= n && !memcmp(text + i, words[k].word, n) &&
                (i + n == len || !word_char((unsigned char)text[i + n])))
                found = words[k].sw;
        }
    }
    return found;
}

char *route_user_text(const struct job *j, size_t *len)
{
    *len = 0;
    if (j->input == JOB_INPUT_PROMPT) {
        char *s = malloc(j->prompt_len + 1);
        if (!s)
            return NULL;
        memcpy(s, j->prompt, j->prompt_len + 1);
        *len = j->prompt_len;
        return s;
    }
    if (j->input != JOB_INPUT_MESSAGES || !j->messages)
        return NULL;
    const cJSON *last = NULL, *m;
    cJSON_ArrayForEach(m, j->messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "user"))
            last = m;
    }
    const cJSON *c = last ? cJSON_GetObjectItemCaseSensitive(last, "content") : NULL;
    if (cJSON_IsString(c)) {
        char *s = strdup(c->valuestring);
        if (s)
            *len = strlen(s);
        return s;
    }
    if (!cJSON_IsArray(c))
        return NULL;
    size_t n = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (cJSON_IsString(t))
            n += strlen(t->valuestring) + 1;
    }
    char *s = malloc(n + 1), *p = s;
    if (!s)
        return NULL;
    cJSON_ArrayForEach(part, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(t))
            continue;
        if (p != s)
            *p++ = '\n';
        size_t l = strlen(t->valuestring);
        memcpy(p, t->valuestring, l);
        p += l;
    }
    *p = 0;
    *len = (size_t)(p - s);
    return s;
}

double route_effective_ratio(const struct route_adapt *a)
{
    if (!a->adaptive)
        return a->ratio;
    bool think_late = a->think_wait_ms > a->threshold_ms;
    bool fast_late = a->fast_wait_ms > a->threshold_ms;
    if (think_late && !fast_late)
        return a->min_ratio < a->ratio ? a->min_ratio : a->ratio;
    if (fast_late && !think_late)
        return a->max_ratio > a->ratio ? a->max_ratio : a->ratio;
    return a->ratio;
}

const char *route_reason_name(enum route_reason r)
{
    switch (r) {
    case ROUTE_BY_POOL: return "pool";
    case ROUTE_BY_MODE: return "mode";
    case ROUTE_BY_SWITCH: return "switch";
    case ROUTE_BY_RULE: return "rule";
    case ROUTE_BY_RATIO: return "ratio";
    }
    return "?";
}

struct router {
    char (*pools)[JOB_POOL_MAX + 1]; /* (n_pools) */
    int n_pools;
    int think, fast;                  /* pool indexes; think -1 when none */
    pcre2_code **rules;               /* (n_rules) */
    int n_rules;
    pcre2_match_data *md;             /* shared by the rules: one thread */
    struct route_split split;
    int ratio_ppm;
    double ratio;
};

void route_free(struct router *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n_rules; i++)
        pcre2_code_free(r->rules[i]);
    free(r->rules);
    pcre2_match_data_free(r->md);
    free(r->pools);
    free(r);
}

int route_create(struct router **out, const struct route_opts *o, struct rl_err *err)
{
    *out = NULL;
    if (o->n_pools < 1)
        return rl_errf(err, RL_EINVAL, "route: no pools");
    struct router *r = calloc(1, sizeof *r);
    if (!r || !(r->pools = calloc((size_t)o->n_pools, sizeof *r->pools)) ||
        !(r->rules = calloc((size_t)(o->n_rules > 0 ? o->n_rules : 1), sizeof *r->rules))) {
        route_free(r);
        return rl_errf(err, RL_ENOMEM, "route: out of memory");
    }
    r->think = -1;
    r->fast = -1;
    for (int i = 0; i < o->n_pools; i++) {
        if (strlen(o->pools[i]) > JOB_POOL_MAX) {
            route_free(r);
            return rl_errf(err, RL_EINVAL, "route: pool name \"%.64s...\" is too long", o->pools[i]);
        }
        snprintf(r->pools[i], sizeof r->pools[i], "%s", o->pools[i]);
        r->n_pools++;
        if (!strcmp(o->pools[i], "think"))
            r->think = i;
        if (o->default_pool && !strcmp(o->pools[i], o->default_pool) && strcmp(o->pools[i], "think"))
            r->fast = i;
    }
    for (int i = 0; r->fast < 0 && i < r->n_pools; i++)
        if (i != r->think)
            r->fast = i;
    if (r->fast < 0)
        r->fast = r->think; /* "think" is the only pool */
    for (int i = 0; i < o->n_rules; i++) {
        int ecode;
        PCRE2_SIZE eoff;
        r->rules[i] = pcre2_compile((PCRE2_SPTR)o->rules[i], PCRE2_ZERO_TERMINATED,
                                    PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &ecode, &eoff, NULL);
        if (!r->rules[i]) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ecode, msg, sizeof msg);
            route_free(r);
            return rl_errf(err, RL_EINVAL, "think_rules[%d] \"%.80s\": %s at offset %zu", i,
                           o->rules[i], (const char *)msg, (size_t)eoff);
        }
        r->n_rules++;
    }
    if (!(r->md = pcre2_match_data_create(1, NULL))) {
        route_free(r);
        return rl_errf(err, RL_ENOMEM, "route: out of memory");
    }
    route_split_init(&r->split);
    route_set_ratio(r, o->ratio);
    *out = r;
    return 0;
}

void route_set_ratio(struct router *r, double ratio)
{
    r->ratio_ppm = route_ratio_ppm(ratio);
    r->ratio = (double)r->ratio_ppm / ROUTE_PPM;
}

double route_get_ratio(const struct router *r) { return r->ratio; }
int route_think_pool(const struct router *r) { return r->think; }
int route_fast_pool(const struct router *r) { return r->fast; }
int route_n_pools(const struct router *r) { return r->n_pools; }

const char *route_pool_name(const struct router *r, int pool)
{
    return pool >= 0 && pool < r->n_pools ? r->pools[pool] : "";
}

static bool rules_match(struct router *r, const char *text, size_t len)
{
    for (int i = 0; i < r->n_rules; i++)
        if (pcre2_match(r->rules[i], (PCRE2_SPTR)text, len, 0, 0, r->md, NULL) >= 0)
            return true;
    return false;
}

int route_decide(struct router *r, const struct job *j, struct route_decision *d,
                 enum ev_code *code, struct rl_err *err)
{
    memset(d, 0, sizeof *d);
    int think = r->think >= 0 ? r->think : r->fast;
    if (j->pool[0]) {
        for (int i = 0; i < r->n_pools; i++)
            if (!strcmp(r->pools[i], j->pool)) {
                d->pool = i;
                d->mode = job_mode_on(j, r->pools[i]);
                d->reason = ROUTE_BY_POOL;
                return 0;
            }
        *code = EV_CODE_UNKNOWN_POOL;
        return rl_errf(err, RL_EINVAL, "pool: \"%.64s\" is not a configured pool", j->pool);
    }
    if (j->mode == JOB_MODE_THINK || j->mode == JOB_MODE_NO_THINK) {
        d->mode = j->mode;
        d->pool = j->mode == JOB_MODE_THINK ? think : r->fast;
        d->reason = ROUTE_BY_MODE;
        return 0;
    }
    size_t len = 0;
    char *text = route_user_text(j, &len);
    enum route_switch sw = j->input == JOB_INPUT_MESSAGES ? route_soft_switch(text, len)
                                                          : ROUTE_SWITCH_NONE;
    bool rule = sw == ROUTE_SWITCH_NONE && text && rules_match(r, text, len);
    free(text);
    if (sw != ROUTE_SWITCH_NONE) {
        d->mode = sw == ROUTE_SWITCH_THINK ? JOB_MODE_THINK : JOB_MODE_NO_THINK;
        d->pool = sw == ROUTE_SWITCH_THINK ? think : r->fast;
        d->reason = ROUTE_BY_SWITCH;
        return 0;
    }
    d->is_auto = true;
    if (rule) {
        d->reason = ROUTE_BY_RULE;
        d->pool = think;
    } else {
        d->reason = ROUTE_BY_RATIO;
        d->pool = r->think >= 0 && route_split_next(&r->split, r->ratio_ppm) ? r->think : r->fast;
    }
    d->mode = d->pool == r->think ? JOB_MODE_THINK : JOB_MODE_NO_THINK;
    return 0;
}
