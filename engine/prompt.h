/* engine/prompt.h - a job's prompt as the token ids the engine runs.
 *
 * The worker renders every job it admits, and the dispatcher renders the
 * deterministic ones to look up the result cache without a worker; the
 * cache key covers these ids, so both must render through this one
 * function or the dispatcher's lookups would never hit. */
#ifndef RL_PROMPT_H
#define RL_PROMPT_H

#include <stdint.h>

#include "err.h"
#include "event.h"
#include "job.h"

struct tokenizer;

/* Renders j's prompt with the effective mode (JOB_MODE_THINK or
 * JOB_MODE_NO_THINK, see job_mode_on): messages (+ tools) through
 * chat_tokenize (no_think adds the empty think block; the template's tags
 * are tokens, the messages' text never is); prompt text through the
 * tokenizer with its tags live (the sender wrote the template; an
 * embedding job's text gets <|endoftext|> after it, as Qwen3-Embedding's
 * tokenizer adds it: its vector is that token's hidden state); prompt_ids
 * copied as they are (the caller checks them against its vocabulary). On
 * success *ids (malloc'd, caller frees; one spare slot) and *n_ids are
 * set. On failure *code says which protocol error it is: TEMPLATE_ERROR,
 * BAD_VALUE (text without a tokenizer; tok may be NULL), INTERNAL. */
/* A rerank job's instruction when it gives none (Qwen3-Reranker's own). */
#define PROMPT_RERANK_INSTRUCTION \
    "Given a web search query, retrieve relevant passages that answer the query"
/* (rerank jobs: query, document and instruction through Qwen3-Reranker's
 * template, their text never control tokens) */
int prompt_render(const struct job *j, enum job_mode mode, const struct tokenizer *tok,
                  int32_t **ids, int *n_ids, enum ev_code *code, struct rl_err *err);

#endif
