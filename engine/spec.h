/* engine/spec.h - speculative decoding's draft side: where draft tokens come
 * from and how many to ask for.
 *
 * The engine verifies a request's draft as extra rows of its decode step:
 * at each verified position it samples exactly as plain decoding would (the
 * same RNG draw of the same request), keeps the draft while it equals the
 * sampled token and stops at the first difference, which is already the
 * right next token. Drafts are single tokens with no distribution of their
 * own, so no rejection sampling is needed and the output is bit-identical
 * to plain decoding; a draft only decides how many positions one step
 * computes. Everything here is therefore policy: a bad draft costs time,
 * never correctness.
 *
 *   spec_ngram_propose(): prompt lookup (vLLM's "ngram", llama.cpp's lookup
 *   decoding): the last n tokens (n = 4 down to 1, longest first) matched
 *   against the request's prompt and output, most recent match first; the
 *   tokens that followed the match are the draft.
 *
 *   struct spec_adapt: per request, how many tokens to propose next. Low
 *   acceptance halves the draft and, after repeated misses, stops proposing
 *   for a cool-down that doubles each time, so text that does not repeat
 *   costs almost nothing.
 *
 * Threading: plain functions and a per-request record; the engine's owner
 * thread uses them. */
#ifndef RL_SPEC_H
#define RL_SPEC_H

#include <stdint.h>

#define SPEC_MAX_TOKENS 16  /* spec_tokens at most */
#define SPEC_DEFAULT_TOKENS 4

enum spec_mode {
    SPEC_OFF = 0,   /* plain decoding */
    SPEC_NGRAM,     /* prompt lookup (spec_ngram_propose) */
};

/* "off" / "ngram". */
const char *spec_mode_name(enum spec_mode m);
/* Parses "off"/"none"/"ngram"; returns 0 or -1 when name is none of them. */
int spec_mode_parse(const char *name, enum spec_mode *out);

/* A draft source other than the n-gram lookup (benchmarks' oracles, tests):
 * proposes up to max_n tokens to follow tokens[0 .. n_tokens) (the first
 * n_prompt are the prompt) into out, and returns how many (0 = none).
 * req_user is the request's engine_request.user. Runs on the engine's
 * thread inside engine_step(). */
typedef int (*spec_draft_fn)(void *src_user, void *req_user, const int32_t *tokens,
                             int n_tokens, int n_prompt, int32_t *out, int max_n);

/* Prompt lookup over tokens[0 .. n_tokens): for n = n_max down to n_min,
 * finds the latest earlier occurrence of the last n tokens and copies up to
 * max_n of the tokens that followed it into out. Returns how many (0 when
 * no suffix recurs). O(n_tokens * n_max). */
int spec_ngram_propose(const int32_t *tokens, int n_tokens, int n_min, int n_max,
                       int32_t *out, int max_n);

/* Per-request adaptation (spec.c's essay). Plain record, set up by
 * spec_adapt_init. */
struct spec_adapt {
    int k_max;       /* spec_tokens */
    int k_cur;       /* what the next proposal may hold */
    float hits;      /* decayed count of draft positions accepted ... */
    float tries;     /* ... of those examined: p = hits / tries */
    int misses;      /* verifications in a row that accepted nothing */
    int cooldown;    /* decode steps left without proposing */
    int backoff;     /* the next cool-down's length */
};

void spec_adapt_init(struct spec_adapt *a, int k_max);
/* Called once per decode step of the request: how many tokens to propose
 * now (0 while cooling down). */
int spec_adapt_want(struct spec_adapt *a);
/* A verification's outcome: n_drafted proposed and computed, n_accepted of
 * them kept. */
void spec_adapt_update(struct spec_adapt *a, int n_drafted, int n_accepted);

#endif
