/* engine/sample.h - logits processing and sampling for one sequence row.
 *
 * Pipeline, in this order (vLLM's order):
 *   1. repetition penalty (HF: positive logits divided, negative multiplied,
 *      over every token seen in the prompt or the output);
 *   2. frequency penalty (minus f * count in the output) and presence
 *      penalty (minus p once if the token is in the output);
 *   2b. logit_bias added, then banned tokens (min_tokens) to -inf, then a
 *      constraint's mask (sample_next_masked);
 *   3. temperature 0: argmax of the penalised logits, ties to the lower id;
 *      otherwise divide by the temperature and
 *   4. min_p: drop tokens whose probability is below min_p times the top's
 *      (tested in logit space: logit >= max + temperature * ln(min_p));
 *   5. top_k: keep the k most likely (ties broken towards lower ids);
 *   6. top_p: keep the smallest most-likely-first set whose mass, under the
 *      distribution renormalised after 4-5, reaches top_p;
 *   7. draw one uniform number from the request's RNG and invert the CDF.
 * The most likely token always survives 4-6, so the support is never empty.
 *
 * Log-probabilities are the raw model's (log-softmax of the logits as they
 * came in, before penalties and temperature), as OpenAI reports them: they
 * describe the model, not the sampler settings.
 *
 * Determinism: the n-th call of sample_next() on a state consumes exactly
 * the n-th number of that state's stream (one draw per call, greedy
 * included), and nothing outside the state and its inputs affects the
 * choice, so a seeded request gives the same tokens whatever else shares
 * its batch. sample_skip() consumes numbers without a choice, so a caller
 * that keeps "draw n belongs to output token n" (tokens it inserts
 * itself, a request resumed after n published tokens) can keep it.
 * Threading: a state is used by one thread at a time. */
#ifndef RL_SAMPLE_H
#define RL_SAMPLE_H

#include <stdint.h>

#include "err.h"

#define SAMPLE_MAX_LOGPROBS 20

/* Sampling settings of one request. sample_params_default() gives the
 * neutral values (plain sampling at temperature 1, nothing filtered). */
struct sample_params {
    float temperature;        /* >= 0; 0 = greedy */
    int top_k;                /* >= 0; 0 = off (whole vocabulary) */
    float top_p;              /* (0, 1]; 1 = off */
    float min_p;              /* [0, 1]; 0 = off */
    float presence_penalty;   /* subtracted once from tokens in the output;
                                 0 = off, OpenAI range [-2, 2] */
    float frequency_penalty;  /* times the token's output count, subtracted;
                                 0 = off */
    float repetition_penalty; /* > 0; 1 = off; over prompt + output tokens */
    uint64_t seed;            /* seeds the request's RNG (sample_state) */
    int logprobs;             /* nonzero: fill sample_out.logprob and top */
    int n_logprobs;           /* 0..SAMPLE_MAX_LOGPROBS top alternatives,
                                 used when logprobs is set */
    /* OpenAI's logit_bias: bias[i] added to logit bias_ids[i] after the
     * penalties (ids past the row are skipped; a repeated id adds twice).
     * Not owned: the arrays must outlive the calls that use p. */
    const int32_t *bias_ids;  /* (n_bias) ids >= 0 */
    const float *bias;        /* (n_bias) finite, [-100, 100] */
    int n_bias;
    /* Tokens that may not come now (-inf after the bias): the engine's
     * min_tokens, which bans the stop ids until enough tokens came. Not
     * owned, as bias. */
    const int32_t *ban_ids;   /* (n_ban) ids >= 0 */
    int n_ban;
};

struct sample_logprob {
    int32_t id;
    float logprob;            /* raw model log-probability */
};

/* What sample_next() chose. */
struct sample_out {
    int32_t token;
    float logprob;            /* raw logprob of token; 0 unless logprobs */
    int n_top;                /* entries in top (min(n_logprobs, n_vocab)) */
    struct sample_logprob top[SAMPLE_MAX_LOGPROBS]; /* most likely first,
                                 ties to the lower id */
};

/* Per-request state: the RNG stream (xoshiro256** seeded through
 * splitmix64), the set of prompt tokens, output token counts, and scratch
 * memory that grows to what the request's settings need. */
struct sample_state;

void sample_params_default(struct sample_params *p);

/* Checks every field; -RL_EINVAL naming the field, else 0. The engine
 * should call it when a request is submitted. */
int sample_params_check(const struct sample_params *p, struct rl_err *err);

/* Creates a state for one request: seed starts its RNG stream; the prompt
 * tokens (copied, may be NULL when n_prompt is 0) feed the repetition
 * penalty. The caller owns *out and frees it with sample_state_free().
 * Returns 0, -RL_EINVAL (negative token id) or -RL_ENOMEM. */
int sample_state_create(struct sample_state **out, uint64_t seed,
                        const int32_t *prompt, int n_prompt,
                        struct rl_err *err);
void sample_state_free(struct sample_state *st);

/* Counts a token that joined the output without being sampled here (text
 * the engine inserts, e.g. the end-of-thinking phrase), so penalties see
 * it. sample_next() already observes the token it returns. Returns 0,
 * -RL_EINVAL or -RL_ENOMEM. */
int sample_observe(struct sample_state *st, int32_t token,
                   struct rl_err *err);

/* Consumes the next n numbers of the stream (n <= 0: none), exactly as n
 * calls of sample_next() would, without choosing anything: what a resumed
 * request does for the tokens an earlier run already drew, and what the
 * engine does for a token it inserts. */
void sample_skip(struct sample_state *st, int64_t n);

/* How many times token occurs in the output so far. */
int sample_output_count(const struct sample_state *st, int32_t token);

/* Picks the next token from logits (n_vocab floats, one row of be_batch
 * logits). The row is used as scratch during the call - penalised entries
 * are written - and restored exactly before return, so the caller sees it
 * unchanged. Fills *out, counts the token as output (sample_observe), and
 * returns 0; -RL_EINVAL for bad params, a row holding a NaN or +inf (a
 * broken checkpoint: the message says so) or a row without a finite value,
 * -RL_ENOMEM when scratch could not grow (nothing consumed then). */
int sample_next(struct sample_state *st, const struct sample_params *p,
                float *logits, int n_vocab, struct sample_out *out,
                struct rl_err *err);

/* sample_next() over the tokens a constraint allows: mask holds
 * (n_vocab + 31) / 32 words, bit id % 32 of word id / 32 set = id allowed.
 * The raw logprobs (out->logprob, out->top) are computed before the mask,
 * so they stay the model's; then, after the penalties, every disallowed
 * entry is set to -inf, and steps 3-7 run as usual: over the allowed tokens
 * the choice and the draw are exactly those of sample_next(). The row's
 * disallowed entries may be left at -inf (the rest is restored). mask NULL is
 * sample_next(). Also -RL_EINVAL when the mask allows nothing finite. */
int sample_next_masked(struct sample_state *st, const struct sample_params *p,
                       float *logits, int n_vocab, const uint32_t *mask,
                       struct sample_out *out, struct rl_err *err);

/* ---- sampling from a reduced candidate set (issue 25) ----
 *
 * A GPU backend need not send a whole 151,936-float row to the host: it
 * can send the row's SAMPLE_CANDS best entries (ranked by the one order:
 * higher logit first, lower id on ties) and a count of NaN / +inf entries.
 * sample_next_reduced() then samples from those, and the result - token,
 * the draw consumed, the state's counts - is bit for bit what
 * sample_next_masked() gives on the full row, or it says it cannot prove
 * that and the caller samples the full row. It can prove it when every
 * token the full sampler could pick is in the set:
 *   - greedy, or top_k <= SAMPLE_CANDS, with at least top_k (greedy: 1)
 *     members still ranked at or above the set's last entry after the
 *     penalties and the mask (which only lower logits: a token outside
 *     ranked below that entry before, and still does);
 *   - or min_p whose floor lies above the set's last entry (nothing outside
 *     passes it), with or without top_p - the draw then sums the same terms
 *     in the same order as the full row's;
 * and never when logprobs are asked (they need the whole row's
 * log-sum-exp), with a logit_bias or a ban (a bias can raise a token from
 * outside the set; a banned token in the set is left to the full row for
 * simplicity), when a penalty can raise a logit (repetition_penalty < 1,
 * a negative frequency or presence penalty: a token outside may climb in),
 * or when the row has a NaN or +inf (the full row's error names them).
 * top_p alone (no top_k <= SAMPLE_CANDS, no min_p) needs the whole row's
 * normaliser: full row. */
#define SAMPLE_CANDS 64

struct sample_cand {
    float z;                  /* raw logit (as the backend produced it) */
    int32_t id;
};

/* One row's candidate set; plain data, the layout a device writes. */
struct sample_cands {
    int32_t n;                /* entries in c: min(SAMPLE_CANDS, n_vocab) */
    int32_t n_bad;            /* NaN or +inf entries in the whole row */
    struct sample_cand c[SAMPLE_CANDS]; /* ranked: z desc, id asc; -inf
                                 entries rank by id like any others */
};

/* The reference of what a device computes: the set of a full row (host
 * memory, n_vocab floats, unchanged). */
void sample_cands_from_row(const float *logits, int n_vocab, struct sample_cands *cs);

/* Whether a row with these settings can ever be sampled from a set (the
 * static half of the rules above): an engine asks the backend for a set
 * only for such rows, and for the whole row otherwise. */
int sample_params_reducible(const struct sample_params *p);

/* sample_next_masked() from cs instead of the full row (n_vocab: the
 * row's length; mask as there, may be NULL). Returns 0 with *out filled
 * and the draw consumed exactly as sample_next_masked() on the full row
 * would; 1 when the set cannot prove that (nothing consumed or changed:
 * sample the full row instead); -RL_EINVAL for bad params, -RL_ENOMEM. */
int sample_next_reduced(struct sample_state *st, const struct sample_params *p,
                        const struct sample_cands *cs, int n_vocab, const uint32_t *mask,
                        struct sample_out *out, struct rl_err *err);

/* Applies steps 1-2 (penalties) to logits in place and leaves them so:
 * what sample_next() would sample from at temperature 1, for tests and for
 * callers that want processed rather than raw log-probabilities. */
void sample_apply_penalties(struct sample_state *st,
                            const struct sample_params *p, float *logits,
                            int n_vocab);

/* The next raw number of a state's stream, in [0, 1) with 53 bits, for
 * tests of the stream itself; consuming it shifts later samples. */
double sample_rng_uniform(struct sample_state *st);

#endif
