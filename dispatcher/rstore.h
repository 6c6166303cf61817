/* dispatcher/rstore.h - stored responses: the Responses API's `store` and
 * `previous_response_id`, kept in Redis.
 *
 * OpenAI's Responses API keeps a response (store, true by default) so that
 * the next request of a conversation sends only what is new and names the
 * response it follows (previous_response_id); its SDKs, the Agents SDK's
 * previousResponseId and Codex-style agents chain turns that way. The
 * front door runs on many machines and forgets nothing it must not: the
 * record lives in Redis, one string key <prefix>response:<id> with a TTL
 * (responses_store_ttl_s), written before the response's last byte goes
 * out, so that a client that chains at once always finds it.
 *
 * A record is a JSON object:
 *   {"owner": TENANT, "input": [ITEMS], "response": {RESPONSE}}
 * owner is the API key's tenant ("" without keys): another tenant's id is
 * "not found", never another client's answer. input is the conversation
 * as input items up to this response (the previous response's input and
 * output, then this request's input; instructions are not carried, as
 * OpenAI's are not); response is the object the client got. The next
 * turn's context is input then response.output (rst_context).
 *
 * A background response's record is written before its job is queued,
 * "queued", with "running": {"cancel": false}. Its response object holds
 * all that the answer repeats (the request's fields, model, created_at),
 * so the front door rebuilds the answer from it and the job's events
 * (<prefix>out:<id>) whenever it is read, until one read finds it ended
 * and writes the finished record, without "running" (rst_rewrite).
 *
 * The JSON side (rst_record, rst_rewrite, rst_running_of, rst_context,
 * rst_response, rst_input_items) is pure; rst_put, rst_get and rst_delete
 * are one command each on the caller's connection. */
#ifndef RL_RSTORE_H
#define RL_RSTORE_H

#include <stdbool.h>
#include <stddef.h>

#include "err.h"

struct rconn;

/* The longest response id a record is looked up by (ours are 30-40
 * characters); a longer one is not found. */
#define RST_ID_MAX 128

/* A background response still running. */
struct rst_running {
    bool cancel; /* its client cancelled it: said so until it ends */
};

/* The record of response id (its JSON object, compact) for owner, whose
 * input items are input (a JSON array; items without an "id" get one, as
 * the listing of input items needs); run: NULL for a finished response.
 * *out: malloc'd, the caller's. Returns 0, -RL_EINVAL (input or response
 * is not what it should be) or -RL_ENOMEM. */
int rst_record(const char *owner, const char *id, const char *input, const char *response,
               const struct rst_running *run, char **out);

/* record with its response replaced by response (NULL: kept) and its
 * running part by run (NULL: finished), owner and input kept. Returns as
 * rst_record. */
int rst_rewrite(const char *record, const char *response, const struct rst_running *run,
                char **out);

/* Whether record's response is still running: true and *out filled, or
 * false (finished, or not a record). */
bool rst_running_of(const char *record, struct rst_running *out);

/* The conversation that a request naming this record as its
 * previous_response_id continues: input then the response's output items,
 * a JSON array, malloc'd; NULL when out of memory or not a record. */
char *rst_context(const char *record);

/* The stored response object, malloc'd; NULL as rst_context. */
char *rst_response(const char *record);

/* GET /v1/responses/{id}/input_items: the list object
 * {"object": "list", "data": [...], "first_id", "last_id", "has_more"}
 * of the record's input items, order "asc" or "desc" (NULL: desc, as
 * OpenAI's), at most limit (1-100) after the item whose id is after (NULL:
 * from the first). Returns 0 and *out (malloc'd), -RL_EINVAL with msg
 * (order, limit or after is wrong: the message starts with its name and a
 * colon) or -RL_ENOMEM. */
int rst_input_items(const char *record, const char *order, int limit, const char *after,
                    char **out, char *msg, size_t size);

/* SET <prefix>response:<id> record EX ttl_s. Returns 0 or the connection's
 * error (a full Redis answers OOM: -RL_EINVAL with its message). */
int rst_put(struct rconn *c, const char *prefix, const char *id, const char *record, int ttl_s,
            struct rl_err *err);

/* The record of id when owner may read it, its TTL started again (GETEX:
 * a conversation in use does not expire under it). Returns 0 and *record
 * (malloc'd), 1 when there is none or it is another owner's, or a negative
 * code with err. */
int rst_get(struct rconn *c, const char *prefix, const char *id, const char *owner, int ttl_s,
            char **record, struct rl_err *err);

/* Deletes the record of id when owner may. Returns 0, 1 as rst_get, or a
 * negative code with err. */
int rst_delete(struct rconn *c, const char *prefix, const char *id, const char *owner,
               struct rl_err *err);

#endif
