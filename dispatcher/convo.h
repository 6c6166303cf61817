/* dispatcher/convo.h - the Conversations API: conversations kept in Redis.
 *
 * OpenAI's Conversations API keeps a conversation's items on the server:
 * a client makes one (POST /v1/conversations), adds and deletes items, and
 * a Responses request naming it (`conversation`) runs its items before
 * its own input, which, with the response's output items, is then added
 * to it. The OpenAI Agents SDK's OpenAIConversationsSession and its
 * conversationId are built on it.
 *
 * A conversation is one Redis list, <prefix>conversation:<id>, with a TTL
 * (conversation_ttl_s, started again by every use): element 0 its own
 * record {"owner", "created_at", "metadata"}, then its items in order,
 * each an item object with an "id" and a "type". One key: a request
 * reads the whole conversation in one LRANGE, adds in one RPUSHX (which
 * never makes again a conversation deleted meanwhile: the list always
 * holds its record), on a cluster as on one instance. owner is the API
 * key's tenant ("" without keys): another tenant's conversation is not
 * found, never its items. A conversation holds at most CNV_ITEMS_MAX
 * items and CNV_BYTES_X x max_bytes of them that a POST adds to; one
 * request adds at most max_bytes (responses_store_max_kb). A response's
 * turn is added past them (its answer is already the client's).
 *
 * Every function answers for a route: 0 and the answer's JSON (malloc'd,
 * the caller's), or -RL_EINVAL with *e filled as the client is to read it
 * (400 bad request, 404 not found, 503 Redis refused or unreachable). */
#ifndef RL_CONVO_H
#define RL_CONVO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "openai.h"

struct rconn;

/* The longest conversation id looked up (ours are 53 characters). */
#define CNV_ID_MAX 128
/* The most items a conversation holds. */
#define CNV_ITEMS_MAX 4096
/* The most items one POST adds (OpenAI's bound). */
#define CNV_ADD_MAX 20
/* The most item JSON a conversation holds that a POST may add to, in
 * max_bytes (responses_store_max_kb): 16 MiB by default. */
#define CNV_BYTES_X 16

/* Where and for whom: one request's view of the store. */
struct cnv_store {
    struct rconn *c;    /* the request's connection */
    const char *prefix; /* the key prefix */
    const char *owner;  /* the tenant, "" without API keys */
    int ttl_s;          /* conversation_ttl_s (> 0) */
    size_t max_bytes;   /* the most item JSON one request adds */
};

/* A POST body (len 0: {}) as cnv_create (need_items false) and cnv_add
 * (true) take it: its items checked and normalised (a "type", content
 * parts, an "id"; at most CNV_ADD_MAX, max_bytes of JSON) into *items (a
 * JSON array, "[]" without any) and its metadata (at most 16 string
 * values) into *metadata (NULL without), both malloc'd. Pure. Returns 0
 * or -RL_EINVAL with *e (400; 500 out of memory). */
int cnv_parse_body(const char *body, size_t len, bool need_items, size_t max_bytes, char **items,
                   char **metadata, struct oai_error *e);

/* POST /v1/conversations {items?, metadata?}: conversation id made,
 * created_s its time. *out: the conversation object. */
int cnv_create(const struct cnv_store *s, const char *id, int64_t created_s, const char *body,
               size_t len, char **out, struct oai_error *e);

/* GET /v1/conversations/{id}. */
int cnv_get(const struct cnv_store *s, const char *id, char **out, struct oai_error *e);

/* POST /v1/conversations/{id} {metadata}: the object as it is now. */
int cnv_update(const struct cnv_store *s, const char *id, const char *body, size_t len,
               char **out, struct oai_error *e);

/* DELETE /v1/conversations/{id}: {"id", "object": "conversation.deleted",
 * "deleted": true}. */
int cnv_delete(const struct cnv_store *s, const char *id, char **out, struct oai_error *e);

/* GET /v1/conversations/{id}/items?order&limit&after: a page (pager.h). */
int cnv_items(const struct cnv_store *s, const char *id, const char *order, int limit,
              const char *after, char **out, struct oai_error *e);

/* POST /v1/conversations/{id}/items {items}: the list of the items added,
 * with their ids. */
int cnv_add(const struct cnv_store *s, const char *id, const char *body, size_t len, char **out,
            struct oai_error *e);

/* GET /v1/conversations/{id}/items/{item}. */
int cnv_item(const struct cnv_store *s, const char *id, const char *item, char **out,
             struct oai_error *e);

/* DELETE /v1/conversations/{id}/items/{item}: the conversation object. */
int cnv_item_delete(const struct cnv_store *s, const char *id, const char *item, char **out,
                    struct oai_error *e);

/* A Responses request naming conversation id: its first upto items (upto
 * < 0: all; Redis reads no more) as a JSON array, malloc'd, into *items,
 * how many into *n. Not found is 400, param "conversation", as the
 * Responses API answers. */
int cnv_context(const struct cnv_store *s, const char *id, int upto, char **items, int *n,
                struct oai_error *e);

/* After a response of conversation id: items (a JSON array: its input
 * items then its output items) added, as POST .../items adds them (but
 * past CNV_ITEMS_MAX too: the answer is already the client's). Returns 0,
 * 1 when the conversation is gone (deleted or expired meanwhile: nothing
 * added), or a negative code with err. */
int cnv_append(const struct cnv_store *s, const char *id, const char *items, struct rl_err *err);

#endif
