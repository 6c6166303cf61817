/* dispatcher/anthropic.h - Anthropic's Messages API (POST /v1/messages,
 * POST /v1/messages/count_tokens) over the same jobs.
 *
 * People point Anthropic's SDKs, the AI SDK's Anthropic provider and
 * agents built on them (Claude Code among them: ANTHROPIC_BASE_URL) at
 * local models, as they do with Ollama's and vLLM's /v1/messages. This is
 * that door: pure conversion, no I/O, as openai.c and compat.c (which
 * calls it: compat.h's CPT_ANTHROPIC).
 *
 * Request side: ant_to_chat() rewrites a Messages body into the Chat
 * Completions body it stands for (system, content blocks, tool_use and
 * tool_result, thinking, stop_sequences, tools and tool_choice,
 * output_config.format), which openai.c then parses like any other, so a
 * field means the same on every door. What cannot be served as asked is
 * refused by name (images, documents, server tools); a last assistant
 * message is a prefill the model continues (continue_final_message).
 *
 * Response side: an ant_resp turns the job's events into the Messages
 * stream (message_start, content_block_start / _delta / _stop per block,
 * message_delta with stop_reason and usage, message_stop) or the message
 * object, from one state machine. */
#ifndef RL_ANTHROPIC_H
#define RL_ANTHROPIC_H

#include <stdbool.h>
#include <stdint.h>

#include "openai.h"

struct cJSON;

/* Which body: a message to create, or one to count (count_tokens: no
 * max_tokens, nothing generated). */
enum ant_body { ANT_MESSAGES = 0, ANT_COUNT_TOKENS };

/* The members of root (a Messages body) as the chat body chat (an empty
 * object the caller owns). *omit_thinking: thinking.display "omitted" (the
 * thinking happens, its text is not sent). Returns 0, -RL_EINVAL with *e
 * (400, the member named in param as "messages[1].content[0].type") or
 * -RL_ENOMEM. */
int ant_to_chat(const struct cJSON *root, enum ant_body kind, struct cJSON *chat,
                bool *omit_thinking, struct oai_error *e);

struct ant_resp;

/* id: the message id (also the tool_use ids' root); model: the name to
 * echo. Copied. NULL when out of memory. */
struct ant_resp *ant_resp_create(const char *id, const char *model, bool stream,
                                 bool omit_thinking);
void ant_resp_free(struct ant_resp *r);

/* The job's events, valid and in order (compat.c checks seq and turns
 * error events into errors): the first one that is not an error opens the
 * message (ant_start), then each delta and the done. In stream mode the
 * SSE bytes go to *out. ant_delta returns OAI_MORE, ant_done OAI_END or
 * OAI_FAILED (a done that is not a success: *e), or -RL_ENOMEM. */
int ant_start(struct ant_resp *r, struct text *out);
int ant_delta(struct ant_resp *r, const struct cJSON *ev, struct text *out);
int ant_done(struct ant_resp *r, const struct cJSON *ev, struct text *out, struct oai_error *e);

/* After OAI_END: the message object, malloc'd (NULL: out of memory or not
 * ended); prompt + completion tokens (0 before the end). */
char *ant_body(const struct ant_resp *r);
int64_t ant_total_tokens(const struct ant_resp *r);

/* {"type":"error","error":{"type":"invalid_request_error","message":...}}:
 * the error type from e's status (overloaded_error for 503, rate_limit_error
 * for 429, ...). malloc'd, NULL when out of memory. */
char *ant_error_json(const struct oai_error *e);
/* The same as the stream's `event: error`, and the `event: ping` that keeps
 * a quiet stream alive. */
int ant_stream_error(const struct oai_error *e, struct text *out);
int ant_ping(struct text *out);

/* count_tokens' answer: {"input_tokens": n}, malloc'd. */
char *ant_count_body(int64_t n);

/* GET /v1/models for a client that sent anthropic-version: the OpenAI list
 * object (o, {"object": "list", "data": [...]}) given Anthropic's members
 * too: each model's type, display_name and created_at, the list's
 * has_more, first_id and last_id (Anthropic's SDKs page by them). */
void ant_models_list(struct cJSON *o);

#endif
