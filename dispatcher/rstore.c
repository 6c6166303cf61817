/* dispatcher/rstore.c - stored responses in Redis (rstore.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "pager.h"
#include "rconn.h"
#include "rstore.h"

/* The record's "running" member for run, or NULL when out of memory. */
static cJSON *running_json(const struct rst_running *run)
{
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddBoolToObject(o, "cancel", run->cancel)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* Gives every item of in without an "id" one named after the response. */
static int name_items(cJSON *in, const char *id)
{
    /* the unique end of the response id names its items, as compat.c's
     * output items are named */
    const char *tail = strrchr(id, '_');
    tail = tail ? tail + 1 : id;
    int k = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, in)
    {
        if (!cJSON_IsObject(it) || cJSON_GetObjectItemCaseSensitive(it, "id")) {
            k++;
            continue;
        }
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "type"));
        char iid[RST_ID_MAX + 32];
        snprintf(iid, sizeof iid, "%s_%.*s_in%d",
                 !type || !strcmp(type, "message") ? "msg" : "item", RST_ID_MAX, tail, k++);
        if (!cJSON_AddStringToObject(it, "id", iid))
            return -RL_ENOMEM;
    }
    return 0;
}

struct rst_record {
    cJSON *json;                /* {"owner", "input" | "chain" + "turn", "response",
                                   "running"?}, checked by wrap */
    struct rst_record **chain;  /* the chain's records, oldest first (rst_load_chain) */
    int n_chain;
};

/* The items r's own request added: "turn", or a whole record's "input". */
static const cJSON *items_of(const struct rst_record *r)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(r->json, "turn");
    return t ? t : cJSON_GetObjectItemCaseSensitive(r->json, "input");
}

static const cJSON *chain_ids(const struct rst_record *r)
{
    return cJSON_GetObjectItemCaseSensitive(r->json, "chain");
}

/* Whether ids is a chain: an array of ids, at most RST_CHAIN_MAX. */
static bool is_chain(const cJSON *ids)
{
    if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) > RST_CHAIN_MAX)
        return false;
    const cJSON *id;
    cJSON_ArrayForEach(id, ids)
    {
        if (!cJSON_IsString(id) || strlen(id->valuestring) > RST_ID_MAX)
            return false;
    }
    return true;
}

/* r for a parsed record (taken), or NULL when it is not one (freed) or
 * memory runs out. */
static struct rst_record *wrap(cJSON *rec)
{
    struct rst_record *r = NULL;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(rec, "chain");
    const cJSON *conv = cJSON_GetObjectItemCaseSensitive(rec, "conversation");
    bool whole = cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(rec, "input"));
    bool part = (is_chain(ids) != cJSON_IsString(conv)) &&
                cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(rec, "turn"));
    if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(rec, "owner")) && whole != part &&
        cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(rec, "response")) &&
        (r = calloc(1, sizeof *r))) {
        r->json = rec;
        return r;
    }
    cJSON_Delete(rec);
    return NULL;
}

int rst_new(const char *owner, const char *id, const char *input, const struct rst_origin *from,
            const char *response, const struct rst_running *run, struct rst_record **out)
{
    *out = NULL;
    int n_prior = from ? from->n_prior : 0;
    const char *chain = from ? from->chain : NULL;
    const char *conv = from && !chain && from->conversation && from->conversation[0]
                           ? from->conversation
                           : NULL;
    cJSON *rec = cJSON_CreateObject();
    cJSON *in = cJSON_Parse(input), *resp = cJSON_Parse(response);
    cJSON *ids = chain ? cJSON_Parse(chain) : NULL;
    cJSON *rj = run ? running_json(run) : NULL;
    int rc = !rec || (run && !rj) ? -RL_ENOMEM
             : !cJSON_IsArray(in) || !cJSON_IsObject(resp) || n_prior < 0 ||
                     n_prior > cJSON_GetArraySize(in) || (chain && !is_chain(ids)) ||
                     (!chain && !conv && n_prior)
                 ? -RL_EINVAL
                 : 0;
    /* the items that the chain's records hold are not repeated */
    for (int i = 0; !rc && i < n_prior; i++)
        cJSON_DeleteItemFromArray(in, 0);
    if (!rc && (name_items(in, id) || !cJSON_AddStringToObject(rec, "owner", owner ? owner : "")))
        rc = -RL_ENOMEM;
    if (rc) {
        cJSON_Delete(rec);
        cJSON_Delete(rj);
        cJSON_Delete(in);
        cJSON_Delete(resp);
        cJSON_Delete(ids);
        return rc;
    }
    if (ids || conv) {
        if (ids)
            cJSON_AddItemToObject(rec, "chain", ids);
        else if (!cJSON_AddStringToObject(rec, "conversation", conv) ||
                 !cJSON_AddNumberToObject(rec, "conversation_items", n_prior))
            rc = -RL_ENOMEM;
        cJSON_AddItemToObject(rec, "turn", in);
    } else {
        cJSON_AddItemToObject(rec, "input", in);
    }
    cJSON_AddItemToObject(rec, "response", resp);
    if (rj)
        cJSON_AddItemToObject(rec, "running", rj);
    if (rc) {
        cJSON_Delete(rec);
        return rc;
    }
    return (*out = wrap(rec)) ? 0 : -RL_ENOMEM;
}

const char *rst_conversation(const struct rst_record *r)
{
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r->json, "conversation"));
}

int rst_conversation_items(const struct rst_record *r)
{
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(r->json, "conversation_items");
    return cJSON_IsNumber(n) && n->valuedouble > 0 ? (int)n->valuedouble : 0;
}

void rst_free(struct rst_record *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n_chain; i++)
        rst_free(r->chain[i]);
    free(r->chain);
    cJSON_Delete(r->json);
    free(r);
}

bool rst_running(const struct rst_record *r, struct rst_running *out)
{
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(r->json, "running");
    bool running = cJSON_IsObject(run);
    if (out)
        out->cancel = running && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(run, "cancel"));
    return running;
}

int rst_update(struct rst_record *r, const char *response, const struct rst_running *run)
{
    cJSON *rj = run ? running_json(run) : NULL;
    cJSON *resp = !run && response ? cJSON_Parse(response) : NULL;
    if ((run && !rj) || (!run && response && !cJSON_IsObject(resp))) {
        cJSON_Delete(rj);
        bool parsed = resp != NULL;
        cJSON_Delete(resp);
        return run || !parsed ? -RL_ENOMEM : -RL_EINVAL;
    }
    if (resp)
        cJSON_ReplaceItemInObjectCaseSensitive(r->json, "response", resp);
    if (rj && cJSON_GetObjectItemCaseSensitive(r->json, "running"))
        cJSON_ReplaceItemInObjectCaseSensitive(r->json, "running", rj);
    else if (rj)
        cJSON_AddItemToObject(r->json, "running", rj);
    else
        cJSON_DeleteItemFromObjectCaseSensitive(r->json, "running");
    return 0;
}

/* the record's response object (wrap made sure it is one) */
static const cJSON *response_of(const struct rst_record *r)
{
    return cJSON_GetObjectItemCaseSensitive(r->json, "response");
}

char *rst_response(const struct rst_record *r)
{
    return cJSON_PrintUnformatted(response_of(r));
}

const char *rst_response_string(const struct rst_record *r, const char *name)
{
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(response_of(r), name));
}

double rst_response_number(const struct rst_record *r, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(response_of(r), name);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

bool rst_response_true(const struct rst_record *r, const char *name)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(response_of(r), name));
}

/* The conversation up to r as references to the records' items (no
 * copies: the array is only printed or walked, while r lives): each
 * record of the chain's items and output, then r's items, then its output
 * when with_output. NULL when out of memory. */
static cJSON *gather(const struct rst_record *r, bool with_output)
{
    cJSON *all = cJSON_CreateArray();
    bool ok = all != NULL;
    for (int i = 0; ok && i <= r->n_chain; i++) {
        const struct rst_record *p = i < r->n_chain ? r->chain[i] : r;
        cJSON *it;
        cJSON_ArrayForEach(it, (cJSON *)items_of(p))
        {
            ok = ok && cJSON_AddItemReferenceToArray(all, it);
        }
        if (p == r && !with_output)
            break;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(response_of(p), "output"))
        {
            ok = ok && cJSON_AddItemReferenceToArray(all, it);
        }
    }
    if (!ok) {
        cJSON_Delete(all);
        return NULL;
    }
    return all;
}

char *rst_continue_after(const struct rst_record *r, const char *before)
{
    cJSON *all = cJSON_Parse(before);
    cJSON *own = cJSON_IsArray(all) ? gather(r, true) : NULL; /* its items, its output */
    bool ok = own != NULL;
    const cJSON *it;
    cJSON_ArrayForEach(it, own)
    {
        ok = ok && cJSON_AddItemToArray(all, cJSON_Duplicate(it, 1));
    }
    char *s = ok ? cJSON_PrintUnformatted(all) : NULL;
    cJSON_Delete(own);
    cJSON_Delete(all);
    return s;
}

int rst_continue(const struct rst_record *r, const char *id, char **context, int *n_items,
                 char **chain)
{
    *context = *chain = NULL;
    *n_items = 0;
    const cJSON *ids = chain_ids(r);
    int n = cJSON_GetArraySize(ids);
    if (n != r->n_chain || rst_conversation(r))
        return -RL_EINVAL; /* the context would miss what its chain or conversation holds */
    cJSON *all = gather(r, true);
    /* the chain of the record that follows: r's, then r; past the bound,
     * none (that record is written whole) */
    cJSON *next = n >= RST_CHAIN_MAX ? NULL : ids ? cJSON_Duplicate(ids, 1) : cJSON_CreateArray();
    bool ok = all && (n >= RST_CHAIN_MAX || (next && cJSON_AddItemToArray(
                                                         next, cJSON_CreateString(id))));
    if (ok && !(*context = cJSON_PrintUnformatted(all)))
        ok = false;
    if (ok && next && !(*chain = cJSON_PrintUnformatted(next)))
        ok = false;
    *n_items = ok ? cJSON_GetArraySize(all) : 0;
    cJSON_Delete(all);
    cJSON_Delete(next);
    if (!ok) {
        free(*context);
        free(*chain);
        *context = *chain = NULL;
        return -RL_ENOMEM;
    }
    return 0;
}

int rst_input_items(const struct rst_record *r, const char *order, int limit, const char *after,
                    char **out, char *msg, size_t size)
{
    *out = NULL;
    cJSON *in = gather(r, false);
    int rc = in ? pg_list(in, order, limit, after, "input item", out, msg, size) : -RL_ENOMEM;
    cJSON_Delete(in);
    return rc;
}

static void key_of(char *buf, size_t size, const char *prefix, const char *id)
{
    snprintf(buf, size, "%.64sresponse:%.*s", prefix, RST_ID_MAX, id);
}

char *rst_json(const struct rst_record *r)
{
    return cJSON_PrintUnformatted(r->json);
}

/* SET of r (with GET when first: whether the record it replaced was
 * running into *first) and EXPIRE of its chain's records, one pipeline. */
static int put(struct rconn *c, const char *prefix, const char *id, const struct rst_record *r,
               int ttl_s, bool *first, struct rl_err *err)
{
    char key[RST_ID_MAX + 96], ttl[24];
    key_of(key, sizeof key, prefix, id);
    snprintf(ttl, sizeof ttl, "%d", ttl_s);
    char *text = rst_json(r);
    struct rconn_batch *b = NULL;
    int rc = !text ? rl_errf(err, RL_ENOMEM, "response %s: out of memory", id)
                   : rconn_batch_create(&b, err);
    const char *argv[] = {"SET", key, text, "EX", ttl, "GET"};
    if (!rc)
        rc = rconn_batch_add(b, first ? 6 : 5, argv, NULL, err);
    /* the records it continues live as long as it does: each was read
     * (GETEX) when this one began, which may be long ago for a background
     * response */
    const cJSON *cid;
    cJSON_ArrayForEach(cid, chain_ids(r))
    {
        char ck[RST_ID_MAX + 96];
        key_of(ck, sizeof ck, prefix, cid->valuestring);
        const char *ex[] = {"EXPIRE", ck, ttl};
        if (!rc)
            rc = rconn_batch_add(b, 3, ex, NULL, err);
    }
    if (!rc)
        rc = rconn_batch_exec(c, b, err);
    /* the SET's refusal (a full Redis: OOM) is the one that matters. An
     * EXPIRE refused (an ACL without it) costs only a background
     * response's chain that outlives its GETEX, and one of a record since
     * gone answers 0 */
    const struct rconn_reply *x = !rc ? rconn_batch_reply(b, 0) : NULL;
    if (x && x->type == RCONN_ERROR) {
        rc = rl_errf(err, RL_EINVAL, "%s", x->str ? x->str : "SET refused");
    } else if (x && first && x->type == RCONN_STRING) {
        cJSON *was = cJSON_ParseWithLength(x->str, x->len);
        *first = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(was, "running"));
        cJSON_Delete(was);
    }
    rconn_batch_free(b);
    free(text);
    return rc;
}

int rst_put(struct rconn *c, const char *prefix, const char *id, const struct rst_record *r,
            int ttl_s, struct rl_err *err)
{
    return put(c, prefix, id, r, ttl_s, NULL, err);
}

int rst_put_finished(struct rconn *c, const char *prefix, const char *id,
                     const struct rst_record *r, int ttl_s, bool *first, struct rl_err *err)
{
    *first = false;
    return put(c, prefix, id, r, ttl_s, first, err);
}

char *rst_turn(const struct rst_record *r)
{
    return cJSON_PrintUnformatted(items_of(r));
}

/* The record in reply x for owner: 0 and *out, or 1 when there is none, it
 * is another owner's, not a record, or (unless deleted_too) deleted. */
static int record_of(const struct rconn_reply *x, const char *owner, bool deleted_too,
                     struct rst_record **out)
{
    *out = NULL;
    if (!x || x->type != RCONN_STRING)
        return 1; /* nil: none, or expired */
    /* not a record (written by someone else): as good as none */
    struct rst_record *r = wrap(cJSON_ParseWithLength(x->str, x->len));
    const char *who = r ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r->json, "owner"))
                        : NULL;
    if (!who || strcmp(who, owner ? owner : "") ||
        (!deleted_too && cJSON_GetObjectItemCaseSensitive(r->json, "deleted"))) {
        rst_free(r);
        return 1;
    }
    *out = r;
    return 0;
}

int rst_get(struct rconn *c, const char *prefix, const char *id, const char *owner, int ttl_s,
            struct rst_record **out, struct rl_err *err)
{
    *out = NULL;
    if (strlen(id) > RST_ID_MAX)
        return 1;
    char key[RST_ID_MAX + 96], ttl[24];
    key_of(key, sizeof key, prefix, id);
    snprintf(ttl, sizeof ttl, "%d", ttl_s);
    const char *argv[] = {"GETEX", key, "EX", ttl};
    struct rconn_reply *x = NULL;
    int rc = rconn_command(c, ttl_s > 0 ? 4 : 2, argv, NULL, &x, err);
    if (!rc)
        rc = record_of(x, owner, false, out);
    rconn_reply_free(x);
    return rc;
}

int rst_load_chain(struct rconn *c, const char *prefix, struct rst_record *r, const char *owner,
                   int ttl_s, char *missing, size_t size, struct rl_err *err)
{
    const cJSON *ids = chain_ids(r);
    int n = cJSON_GetArraySize(ids);
    if (!n || r->n_chain)
        return 0;
    char ttl[24];
    snprintf(ttl, sizeof ttl, "%d", ttl_s);
    struct rconn_batch *b = NULL;
    int rc = rconn_batch_create(&b, err);
    const cJSON *cid;
    cJSON_ArrayForEach(cid, ids)
    {
        char key[RST_ID_MAX + 96];
        key_of(key, sizeof key, prefix, cid->valuestring);
        const char *argv[] = {"GETEX", key, "EX", ttl};
        if (!rc)
            rc = rconn_batch_add(b, ttl_s > 0 ? 4 : 2, argv, NULL, err);
    }
    if (!rc)
        rc = rconn_batch_exec(c, b, err);
    if (!rc && !(r->chain = calloc((size_t)n, sizeof *r->chain)))
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
    int i = 0;
    cJSON_ArrayForEach(cid, ids)
    {
        if (rc)
            break;
        const struct rconn_reply *x = rconn_batch_reply(b, i);
        if (x && x->type == RCONN_ERROR) {
            rc = rl_errf(err, RL_EIO, "GETEX %s: %s", cid->valuestring, x->str ? x->str : "");
        } else if (record_of(x, owner, true, &r->chain[i])) {
            snprintf(missing, size, "%s", cid->valuestring);
            rc = 1;
        } else {
            r->n_chain = ++i;
        }
    }
    rconn_batch_free(b);
    if (rc) { /* all or nothing */
        for (int k = 0; k < r->n_chain; k++)
            rst_free(r->chain[k]);
        free(r->chain);
        r->chain = NULL;
        r->n_chain = 0;
    }
    return rc;
}

/* What is left of r once deleted: what the records that continue it read
 * (its items and output, its chain), marked deleted, in place of the
 * rest. */
static char *tombstone(const struct rst_record *r)
{
    cJSON *t = cJSON_CreateObject();
    bool ok = t && cJSON_AddStringToObject(t, "owner", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r->json, "owner"))) &&
              cJSON_AddTrueToObject(t, "deleted");
    static const char *const kept[] = {"chain", "turn", "input"};
    for (size_t i = 0; ok && i < sizeof kept / sizeof *kept; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->json, kept[i]);
        ok = !v || cJSON_AddItemToObject(t, kept[i], cJSON_Duplicate(v, 1));
    }
    cJSON *resp = ok ? cJSON_AddObjectToObject(t, "response") : NULL;
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(response_of(r), "output");
    ok = resp && (!out || cJSON_AddItemToObject(resp, "output", cJSON_Duplicate(out, 1)));
    char *s = ok ? cJSON_PrintUnformatted(t) : NULL;
    cJSON_Delete(t);
    return s;
}

int rst_delete(struct rconn *c, const char *prefix, const char *id, const char *owner,
               bool erase, struct rl_err *err)
{
    struct rst_record *r = NULL;
    int rc = rst_get(c, prefix, id, owner, 0, &r, err);
    char *t = !rc && !erase ? tombstone(r) : NULL;
    rst_free(r);
    if (rc)
        return rc;
    if (!erase && !t)
        return rl_errf(err, RL_ENOMEM, "response %s: out of memory", id);
    char key[RST_ID_MAX + 96];
    key_of(key, sizeof key, prefix, id);
    /* XX: one that expired meanwhile is not made again, without a TTL */
    const char *set[] = {"SET", key, t, "KEEPTTL", "XX"}, *del[] = {"DEL", key};
    struct rconn_reply *x = NULL;
    rc = erase ? rconn_command(c, 2, del, NULL, &x, err) : rconn_command(c, 5, set, NULL, &x, err);
    /* nil, or 0 deleted: it expired (or was erased) between the two commands */
    bool gone = !rc && (!x || x->type == RCONN_NIL || (x->type == RCONN_INTEGER && !x->integer));
    rconn_reply_free(x);
    free(t);
    return rc ? rc : gone ? 1 : 0;
}
