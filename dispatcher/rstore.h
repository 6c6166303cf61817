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
 * A record is a JSON object, one of
 *   {"owner": TENANT, "chain": [IDS], "turn": [ITEMS], "response": {RESPONSE}}
 *   {"owner": TENANT, "input": [ITEMS], "response": {RESPONSE}}
 * owner is the API key's tenant ("" without keys): another tenant's id is
 * "not found", never another client's answer; response is the object the
 * client got. The first form is a response that continues others: chain
 * names the records of its conversation, oldest first (the previous
 * response's chain, then the previous response), turn the input items its
 * own request added. The second is a conversation's first response (or
 * one whose chain would pass RST_CHAIN_MAX, written whole), input all of
 * it. A conversation of n turns is then kept once, not n times over (each
 * record the whole history: n^2/2), and what bounds a record is its own
 * turn (responses_store_max_kb), not the conversation. A request that
 * continues a record reads its chain's records in one pipeline (GETEX
 * each, so they live on with it) and rst_put keeps them as long as the
 * record it writes (EXPIRE each); one of them expired leaves the records
 * after it nothing to continue. A deleted record stays for them as a
 * tombstone ("deleted": true, only what they read) until it expires. The conversation up to a
 * record is each chain record's items and output, then its own items
 * (rst_continue adds its output: the next turn's context).
 *
 * A background response's record is written before its job is queued,
 * "queued", with "running": {"cancel": false}. Its response object holds
 * all that the answer repeats (the request's fields, model, created_at),
 * so the front door rebuilds the answer from it and the job's events
 * (<prefix>out:<id>) whenever it is read, until one read finds it ended
 * and writes the finished record, without "running" (rst_update).
 *
 * A record is read once (rst_get) into an opaque struct rst_record, the
 * parsed JSON, which every question asks of; only what is written back is
 * printed again (rst_put): a record grows with its conversation, and a
 * client polling a background response would otherwise pay for its whole
 * history several times a poll. The JSON side (rst_new ... rst_input_items)
 * is pure; rst_put, rst_get and rst_delete are one command each on the
 * caller's connection. */
#ifndef RL_RSTORE_H
#define RL_RSTORE_H

#include <stdbool.h>
#include <stddef.h>

#include "err.h"

struct rconn;
struct rst_record; /* a record, parsed: its owner's, freed by rst_free */

/* The longest response id a record is looked up by (ours are 30-40
 * characters); a longer one is not found. */
#define RST_ID_MAX 128

/* The most records a chain names (a conversation's turns before a
 * record; past it a record is written whole): bounds a continuing
 * request's pipeline of GETEX and a record's list of ids (~40 bytes
 * each). */
#define RST_CHAIN_MAX 256

/* A background response still running. */
struct rst_running {
    bool cancel; /* its client cancelled it: said so until it ends */
};

/* Where the conversation before a record is kept, when not in it. */
struct rst_origin {
    int n_prior;              /* the first n_prior items of its input are that */
    const char *chain;        /* in the records of rst_continue's chain (a JSON array) */
    const char *conversation; /* or in this conversation (convo.h; NULL or "": none): a request
                                 that named it */
};

/* The record of response id for owner, whose conversation is input (a
 * JSON array of input items), the first from->n_prior of them kept where
 * from says (from NULL: none, the record holds it all), the rest what
 * this request added (items without an "id" get one, as the listing of
 * input items needs); response is its response object; run: NULL for a
 * finished response. Returns 0 and *out, -RL_EINVAL (input, from or
 * response is not what it should be) or -RL_ENOMEM. */
int rst_new(const char *owner, const char *id, const char *input, const struct rst_origin *from,
            const char *response, const struct rst_running *run, struct rst_record **out);

/* The conversation (convo.h) r's response was made in, or NULL: its
 * context is the conversation's first rst_conversation_items(r) items
 * (rst_continue refuses it: a previous_response_id naming it reads them
 * and continues it with rst_continue_after), and its input items are its
 * own. */
const char *rst_conversation(const struct rst_record *r);
int rst_conversation_items(const struct rst_record *r);

/* before (a JSON array of items: the context r's response had), then r's
 * own input items and output items (rst_continue's gathering, for a record
 * without a chain): the conversation a request naming r
 * continues, a JSON array, malloc'd; NULL when out of memory or before is
 * no array. */
char *rst_continue_after(const struct rst_record *r, const char *before);

void rst_free(struct rst_record *r);

/* Whether r's response is still running: true and *out filled (out may be
 * NULL), or false (finished). */
bool rst_running(const struct rst_record *r, struct rst_running *out);

/* r's running part set to run (its response running still, e.g. now
 * cancelled), or, run NULL, r finished with response as its object (NULL:
 * the object kept). Returns 0, -RL_EINVAL (response is no object) or
 * -RL_ENOMEM; r is unchanged on failure. */
int rst_update(struct rst_record *r, const char *response, const struct rst_running *run);

/* The stored response object as JSON, malloc'd (NULL: out of memory). */
char *rst_response(const struct rst_record *r);

/* Members of the stored response object: a string's value (NULL when it
 * is none), a number's (0 when none), whether one is true. */
const char *rst_response_string(const struct rst_record *r, const char *name);
double rst_response_number(const struct rst_record *r, const char *name);
bool rst_response_true(const struct rst_record *r, const char *name);

/* What a request naming r (whose id is id) as its previous_response_id
 * needs, its chain loaded (rst_load_chain): *context, the conversation
 * it continues (the items up to r and r's output items, a JSON array) of
 * *n_items items, and *chain, the chain of the record it will write (r's,
 * then id; NULL when that would pass RST_CHAIN_MAX: it is written whole).
 * Both malloc'd. Returns 0, -RL_EINVAL (r's chain is not loaded, or r is
 * a conversation's: rst_conversation) or -RL_ENOMEM. */
int rst_continue(const struct rst_record *r, const char *id, char **context, int *n_items,
                 char **chain);

/* GET /v1/responses/{id}/input_items (r's chain loaded): the list object
 * {"object": "list", "data": [...], "first_id", "last_id", "has_more"}
 * of the record's input items, order "asc" or "desc" (NULL: desc, as
 * OpenAI's), at most limit (1-100) after the item whose id is after (NULL:
 * from the first). Returns 0 and *out (malloc'd), -RL_EINVAL with msg
 * (order, limit or after is wrong: the message starts with its name and a
 * colon) or -RL_ENOMEM. */
int rst_input_items(const struct rst_record *r, const char *order, int limit, const char *after,
                    char **out, char *msg, size_t size);

/* The record as it is stored (JSON, compact), malloc'd; NULL when out of
 * memory. */
char *rst_json(const struct rst_record *r);

/* SET <prefix>response:<id> (rst_json) EX ttl_s, and EXPIRE of the
 * records its chain names, in one pipeline. Returns 0 or the
 * connection's error (a full Redis answers OOM: -RL_EINVAL with its
 * message). */
int rst_put(struct rconn *c, const char *prefix, const char *id, const struct rst_record *r,
            int ttl_s, struct rl_err *err);

/* The record of id when owner may read it, its TTL started again when
 * ttl_s > 0 (GETEX: a conversation in use does not expire under it).
 * Returns 0 and *out (the caller's), 1 when there is none, it is another
 * owner's or not a record, or a negative code with err. */
int rst_get(struct rconn *c, const char *prefix, const char *id, const char *owner, int ttl_s,
            struct rst_record **out, struct rl_err *err);

/* rst_put of a record just finished (rst_update with run NULL), its SET
 * with GET: *first is whether the record it replaced was still running, so
 * that of the reads that find a background response ended at once, one
 * only does what is done once (its conversation's turn). */
int rst_put_finished(struct rconn *c, const char *prefix, const char *id,
                     const struct rst_record *r, int ttl_s, bool *first, struct rl_err *err);

/* The input items r's own request added (a JSON array, malloc'd; NULL
 * when out of memory). */
char *rst_turn(const struct rst_record *r);

/* The records r's chain names, read (GETEX each, their TTL started again
 * when ttl_s > 0) in one pipeline into r, for rst_continue and
 * rst_input_items; nothing to do for a record without a chain. Returns 0,
 * 1 when one of them is gone (expired, deleted; its id into missing), or
 * a negative code with err. */
int rst_load_chain(struct rconn *c, const char *prefix, struct rst_record *r, const char *owner,
                   int ttl_s, char *missing, size_t size, struct rl_err *err);

/* Deletes the record of id when owner may: its id is then not found, but
 * what the records that continue it read stays (its items, its output and
 * its chain, marked deleted; SET KEEPTTL) until it expires, or, erase, the
 * key goes (DEL: a record nothing continues yet, such as a background
 * response's whose job was never queued). Returns 0, 1 as rst_get, or a
 * negative code with err. */
int rst_delete(struct rconn *c, const char *prefix, const char *id, const char *owner,
               bool erase, struct rl_err *err);

#endif
