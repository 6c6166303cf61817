/* dispatcher/convo.c - the Conversations API in Redis (convo.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "clock.h"
#include "convo.h"
#include "pager.h"
#include "rconn.h"

#define T_INVALID "invalid_request_error"

static void key_of(char *buf, size_t size, const char *prefix, const char *id)
{
    snprintf(buf, size, "%.64sconversation:%.*s", prefix, CNV_ID_MAX, id);
}

static int not_found(struct oai_error *e, const char *id)
{
    oai_error_set(e, 404, T_INVALID, "not_found", "conversation_id",
                  "Conversation with id '%.*s' not found.", CNV_ID_MAX, id);
    return -RL_EINVAL;
}

static int unavailable(struct oai_error *e, const struct rl_err *err)
{
    oai_error_set(e, 503, "server_error", "REDIS_UNAVAILABLE", NULL,
                  "the conversation could not be read or written: %s", err->msg);
    e->retry_after_s = 1;
    return -RL_EINVAL;
}

static int no_memory(struct oai_error *e)
{
    oai_error_set(e, 500, "server_error", "INTERNAL", NULL, "out of memory");
    return -RL_EINVAL;
}

static int bad(struct oai_error *e, const char *param, const char *fmt, const char *what)
{
    oai_error_set(e, 400, T_INVALID, "BAD_VALUE", param, fmt, what);
    return -RL_EINVAL;
}

/* A new item id: prefix then 48 random hex digits, as OpenAI's look. */
static void new_item_id(char out[64], const char *prefix)
{
    unsigned char r[24];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        uint64_t t = (uint64_t)rl_wall_ms() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)out;
        for (size_t i = 0; i < sizeof r; i++)
            r[i] = (unsigned char)(t >> (8 * (i % 8))) ^ (unsigned char)(i * 37);
    }
    int n = snprintf(out, 64, "%s", prefix);
    for (size_t i = 0; i < sizeof r && n < 62; i++)
        n += snprintf(out + n, 64 - (size_t)n, "%02x", r[i]);
}

/* item (an input or output item, changed in place) as a conversation keeps
 * it: a "type" (a bare {role, content} is a message), its text content as
 * content parts, and an "id". Returns 0, -RL_EINVAL with a message into
 * msg (what is wrong with it), or -RL_ENOMEM. */
static int normalise(cJSON *item, char *msg, size_t size)
{
    if (!cJSON_IsObject(item)) {
        snprintf(msg, size, "must be an object");
        return -RL_EINVAL;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(item, "type");
    if (type && !cJSON_IsString(type)) {
        snprintf(msg, size, "type: must be a string");
        return -RL_EINVAL;
    }
    bool message = !type || !strcmp(type->valuestring, "message");
    if (!type && !cJSON_AddStringToObject(item, "type", "message"))
        return -RL_ENOMEM;
    if (message) {
        const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(item, "role"));
        cJSON *content = cJSON_GetObjectItemCaseSensitive(item, "content");
        if (!role) {
            snprintf(msg, size, "role: required, a string");
            return -RL_EINVAL;
        }
        if (!cJSON_IsString(content) && !cJSON_IsArray(content)) {
            snprintf(msg, size, "content: must be a string or an array of parts");
            return -RL_EINVAL;
        }
        if (cJSON_IsString(content)) { /* as the API lists it: parts */
            cJSON *parts = cJSON_CreateArray(), *part = cJSON_CreateObject();
            if (!parts || !part ||
                !cJSON_AddStringToObject(part, "type", strcmp(role, "assistant") ? "input_text"
                                                                                 : "output_text") ||
                !cJSON_AddStringToObject(part, "text", content->valuestring)) {
                cJSON_Delete(parts);
                cJSON_Delete(part);
                return -RL_ENOMEM;
            }
            cJSON_AddItemToArray(parts, part);
            cJSON_ReplaceItemInObjectCaseSensitive(item, "content", parts);
        }
        if (!cJSON_GetObjectItemCaseSensitive(item, "status") &&
            !cJSON_AddStringToObject(item, "status", "completed"))
            return -RL_ENOMEM;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(item, "id");
    if (id && (!cJSON_IsString(id) || !id->valuestring[0] || strlen(id->valuestring) > PG_ID_MAX)) {
        snprintf(msg, size, "id: must be a string of 1 to %d characters", PG_ID_MAX);
        return -RL_EINVAL;
    }
    if (!id) {
        char iid[64];
        new_item_id(iid, message ? "msg_" : "item_");
        if (!cJSON_AddStringToObject(item, "id", iid))
            return -RL_ENOMEM;
    }
    return 0;
}

/* The bytes of a's JSON into *n. Returns 0 or -RL_ENOMEM. */
static int json_bytes(const cJSON *a, size_t *n)
{
    char *s = cJSON_PrintUnformatted(a);
    *n = s ? strlen(s) : 0;
    free(s);
    return s ? 0 : -RL_ENOMEM;
}

/* The conversation object of record rec (its element 0) and id. */
static char *object_of(const cJSON *rec, const char *id)
{
    cJSON *o = cJSON_CreateObject();
    const cJSON *created = cJSON_GetObjectItemCaseSensitive(rec, "created_at");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(rec, "metadata");
    char *s = NULL;
    if (o && cJSON_AddStringToObject(o, "id", id) &&
        cJSON_AddStringToObject(o, "object", "conversation") &&
        cJSON_AddNumberToObject(o, "created_at", cJSON_IsNumber(created) ? created->valuedouble : 0) &&
        cJSON_AddItemToObject(o, "metadata", meta ? cJSON_Duplicate(meta, 1) : cJSON_CreateObject()))
        s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* metadata as the API takes it: an object of at most 16 string values. */
static int check_metadata(const cJSON *m, struct oai_error *e)
{
    if (!cJSON_IsObject(m))
        return bad(e, "metadata", "%s: must be an object of strings", "metadata");
    int n = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, m)
    {
        if (!cJSON_IsString(v) || strlen(v->string) > 64 || strlen(v->valuestring) > 512 ||
            ++n > 16)
            return bad(e, "metadata", "%s: at most 16 keys of up to 64 characters, each a "
                       "string of up to 512", "metadata");
    }
    return 0;
}

/* items (a JSON array in a request) checked and normalised in place: at
 * most max of them, at most max_bytes together. param names them. */
static int check_items(cJSON *items, int max, size_t max_bytes, const char *param,
                       struct oai_error *e)
{
    if (!cJSON_IsArray(items))
        return bad(e, param, "%s: must be an array of items", param);
    int n = cJSON_GetArraySize(items);
    if (n > max) {
        oai_error_set(e, 400, T_INVALID, "BAD_VALUE", param, "%s: at most %d items a request",
                      param, max);
        return -RL_EINVAL;
    }
    int i = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, items)
    {
        char msg[160];
        int rc = normalise(it, msg, sizeof msg);
        if (rc == -RL_ENOMEM)
            return no_memory(e);
        if (rc) {
            char p[48];
            snprintf(p, sizeof p, "%s[%d]", param, i);
            oai_error_set(e, 400, T_INVALID, "BAD_VALUE", p, "%s: %s", p, msg);
            return -RL_EINVAL;
        }
        i++;
    }
    char *text = cJSON_PrintUnformatted(items);
    size_t bytes = text ? strlen(text) : 0;
    free(text);
    if (!text)
        return no_memory(e);
    if (bytes > max_bytes) {
        oai_error_set(e, 400, T_INVALID, "BAD_VALUE", param, "%s: %zu KiB, over the %zu KiB a "
                      "request adds to a conversation (responses_store_max_kb)", param,
                      bytes / 1024, max_bytes / 1024);
        return -RL_EINVAL;
    }
    return 0;
}

/* Conversation id for s's owner (LRANGE, its TTL started again): *rec its
 * record (element 0) and *items its first upto items (upto < 0: all) as a
 * JSON array; bytes, when not NULL, the size of that array's compact JSON,
 * counted from the reply (the elements are compact JSON as push wrote
 * them), not printed again. Returns 0, 1 (none, another owner's, or not a
 * conversation), or a negative code with err. */
static int load(const struct cnv_store *s, const char *id, int upto, cJSON **rec, cJSON **items,
                size_t *bytes, struct rl_err *err)
{
    *rec = *items = NULL;
    if (strlen(id) > CNV_ID_MAX)
        return 1;
    char key[CNV_ID_MAX + 96], ttl[24], stop[24];
    key_of(key, sizeof key, s->prefix, id);
    snprintf(ttl, sizeof ttl, "%d", s->ttl_s);
    snprintf(stop, sizeof stop, "%d", upto < 0 ? -1 : upto); /* element 0 is the record */
    const char *range[] = {"LRANGE", key, "0", stop}, *ex[] = {"EXPIRE", key, ttl};
    struct rconn_batch *b = NULL;
    int rc = rconn_batch_create(&b, err);
    if (!rc)
        rc = rconn_batch_add(b, 4, range, NULL, err);
    if (!rc)
        rc = rconn_batch_add(b, 3, ex, NULL, err);
    if (!rc)
        rc = rconn_batch_exec(s->c, b, err);
    const struct rconn_reply *x = rc ? NULL : rconn_batch_reply(b, 0);
    if (!rc && x && x->type == RCONN_ERROR)
        rc = rl_errf(err, RL_EIO, "LRANGE: %s", x->str ? x->str : "");
    if (!rc && (!x || x->type != RCONN_ARRAY || x->n_elem < 1 ||
                x->elem[0].type != RCONN_STRING))
        rc = 1; /* an empty list does not exist: none */
    cJSON *r = !rc ? cJSON_ParseWithLength(x->elem[0].str, x->elem[0].len) : NULL;
    const char *who = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "owner"));
    if (!rc && (!who || strcmp(who, s->owner ? s->owner : "")))
        rc = 1;
    cJSON *a = !rc ? cJSON_CreateArray() : NULL;
    if (!rc && !a)
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
    size_t sum = 2; /* [] */
    for (size_t i = 1; !rc && i < x->n_elem; i++) {
        cJSON *it = x->elem[i].type == RCONN_STRING
                        ? cJSON_ParseWithLength(x->elem[i].str, x->elem[i].len)
                        : NULL;
        if (it && !cJSON_AddItemToArray(a, it)) {
            cJSON_Delete(it);
            rc = rl_errf(err, RL_ENOMEM, "out of memory");
        } else if (it) { /* an element that is no JSON (written by hand) is left out */
            sum += x->elem[i].len + (sum > 2); /* and a comma before all but the first */
        }
    }
    if (bytes)
        *bytes = sum;
    rconn_batch_free(b);
    if (rc) {
        cJSON_Delete(r);
        cJSON_Delete(a);
        return rc;
    }
    *rec = r;
    *items = a;
    return 0;
}

/* load for a route: 0, or -RL_EINVAL with e (404 or 503). */
static int load_for(const struct cnv_store *s, const char *id, cJSON **rec, cJSON **items,
                    struct oai_error *e)
{
    struct rl_err err = {0};
    int rc = load(s, id, -1, rec, items, NULL, &err);
    return rc == 1 ? not_found(e, id) : rc ? unavailable(e, &err) : 0;
}

/* RPUSHX key (each item of items as JSON) and EXPIRE key ttl: the list
 * exists (it holds its record), or nothing is added. Returns 0, 1 (the
 * conversation is gone), or a negative code with err. */
static int push(const struct cnv_store *s, const char *id, const cJSON *items, struct rl_err *err)
{
    int n = cJSON_GetArraySize(items);
    if (!n)
        return 0;
    char key[CNV_ID_MAX + 96], ttl[24];
    key_of(key, sizeof key, s->prefix, id);
    snprintf(ttl, sizeof ttl, "%d", s->ttl_s);
    const char **argv = calloc((size_t)n + 2, sizeof *argv);
    char **texts = calloc((size_t)n, sizeof *texts);
    int rc = !argv || !texts ? rl_errf(err, RL_ENOMEM, "out of memory") : 0;
    int k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, items)
    {
        if (!rc && !(texts[k] = cJSON_PrintUnformatted(it)))
            rc = rl_errf(err, RL_ENOMEM, "out of memory");
        k++;
    }
    struct rconn_batch *b = NULL;
    if (!rc)
        rc = rconn_batch_create(&b, err);
    if (!rc) {
        argv[0] = "RPUSHX";
        argv[1] = key;
        for (int i = 0; i < n; i++)
            argv[2 + i] = texts[i];
        rc = rconn_batch_add(b, n + 2, argv, NULL, err);
    }
    const char *ex[] = {"EXPIRE", key, ttl};
    if (!rc)
        rc = rconn_batch_add(b, 3, ex, NULL, err);
    if (!rc)
        rc = rconn_batch_exec(s->c, b, err);
    const struct rconn_reply *x = rc ? NULL : rconn_batch_reply(b, 0);
    if (!rc && x && x->type == RCONN_ERROR) /* a full Redis: OOM */
        rc = rl_errf(err, RL_EINVAL, "RPUSHX: %s", x->str ? x->str : "");
    else if (!rc && (!x || x->type != RCONN_INTEGER || x->integer == 0))
        rc = 1;
    rconn_batch_free(b);
    for (int i = 0; texts && i < n; i++)
        free(texts[i]);
    free(texts);
    free(argv);
    return rc;
}

/* A POST body (len 0: {}) parsed and checked: its items (required when
 * need_items) normalised in place, its metadata checked. Returns the root
 * (the caller's) or NULL with *e (400). */
static cJSON *parse_body(const char *body, size_t len, bool need_items, size_t max_bytes,
                         struct oai_error *e)
{
    cJSON *root = len ? cJSON_ParseWithLength(body, len) : cJSON_CreateObject();
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        oai_error_set(e, 400, T_INVALID, "BAD_JSON", NULL, "the body is not a JSON object");
        return NULL;
    }
    cJSON *items = cJSON_GetObjectItemCaseSensitive(root, "items");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    int rc = need_items && (!items || cJSON_IsNull(items))
                 ? bad(e, "items", "%s: required, an array of items", "items")
                 : 0;
    if (!rc && items && !cJSON_IsNull(items))
        rc = check_items(items, CNV_ADD_MAX, max_bytes, "items", e);
    if (!rc && meta && !cJSON_IsNull(meta))
        rc = check_metadata(meta, e);
    if (rc) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

int cnv_parse_body(const char *body, size_t len, bool need_items, size_t max_bytes, char **items,
                   char **metadata, struct oai_error *e)
{
    *items = *metadata = NULL;
    cJSON *root = parse_body(body, len, need_items, max_bytes, e);
    if (!root)
        return -RL_EINVAL;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "items");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    *items = cJSON_IsArray(it) ? cJSON_PrintUnformatted(it) : strdup("[]");
    if (meta && !cJSON_IsNull(meta))
        *metadata = cJSON_PrintUnformatted(meta);
    int rc = !*items || (meta && !cJSON_IsNull(meta) && !*metadata) ? no_memory(e) : 0;
    cJSON_Delete(root);
    if (rc) {
        free(*items);
        free(*metadata);
        *items = *metadata = NULL;
    }
    return rc;
}

int cnv_create(const struct cnv_store *s, const char *id, int64_t created_s, const char *body,
               size_t len, char **out, struct oai_error *e)
{
    *out = NULL;
    cJSON *root = parse_body(body, len, false, s->max_bytes, e);
    if (!root)
        return -RL_EINVAL;
    cJSON *items = cJSON_GetObjectItemCaseSensitive(root, "items");
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    int rc = 0;
    cJSON *rec = cJSON_CreateObject();
    char *rec_text = NULL;
    if (!rc && (!rec || !cJSON_AddStringToObject(rec, "owner", s->owner ? s->owner : "") ||
                !cJSON_AddNumberToObject(rec, "created_at", (double)created_s) ||
                !cJSON_AddItemToObject(rec, "metadata", meta && !cJSON_IsNull(meta)
                                                            ? cJSON_Duplicate(meta, 1)
                                                            : cJSON_CreateObject()) ||
                !(rec_text = cJSON_PrintUnformatted(rec))))
        rc = no_memory(e);
    /* the record and the items in one RPUSH, then its TTL, in one MULTI: a
     * conversation is there whole or not at all */
    char key[CNV_ID_MAX + 96], ttl[24];
    key_of(key, sizeof key, s->prefix, id);
    snprintf(ttl, sizeof ttl, "%d", s->ttl_s);
    int n = !rc && cJSON_IsArray(items) ? cJSON_GetArraySize(items) : 0; /* <= CNV_ADD_MAX */
    const char *argv[CNV_ADD_MAX + 3];
    char *texts[CNV_ADD_MAX] = {0};
    argv[0] = "RPUSH";
    argv[1] = key;
    argv[2] = rec_text;
    for (int i = 0; !rc && i < n; i++)
        if (!(texts[i] = cJSON_PrintUnformatted(cJSON_GetArrayItem(items, i))))
            rc = no_memory(e);
        else
            argv[3 + i] = texts[i];
    struct rl_err err = {0};
    struct rconn_batch *b = NULL;
    const char *multi[] = {"MULTI"}, *ex[] = {"EXPIRE", key, ttl}, *exec[] = {"EXEC"};
    int r2 = rc ? 0 : rconn_batch_create(&b, &err);
    if (!rc && !r2)
        r2 = rconn_batch_add(b, 1, multi, NULL, &err);
    if (!rc && !r2)
        r2 = rconn_batch_add(b, n + 3, argv, NULL, &err);
    if (!rc && !r2)
        r2 = rconn_batch_add(b, 3, ex, NULL, &err);
    if (!rc && !r2)
        r2 = rconn_batch_add(b, 1, exec, NULL, &err);
    if (!rc && !r2)
        r2 = rconn_batch_exec(s->c, b, &err);
    const struct rconn_reply *x = !rc && !r2 ? rconn_batch_reply(b, 3) : NULL;
    if (!rc && !r2 && (!x || x->type != RCONN_ARRAY || x->n_elem != 2 ||
                       x->elem[0].type != RCONN_INTEGER))
        r2 = rl_errf(&err, RL_EIO, "%s", x && x->type == RCONN_ERROR && x->str
                                             ? x->str
                                             : "the MULTI was refused");
    if (!rc && r2)
        rc = unavailable(e, &err);
    if (!rc && !(*out = object_of(rec, id)))
        rc = no_memory(e);
    rconn_batch_free(b);
    for (int i = 0; i < n; i++)
        free(texts[i]);
    free(rec_text);
    cJSON_Delete(rec);
    cJSON_Delete(root);
    return rc;
}

int cnv_get(const struct cnv_store *s, const char *id, char **out, struct oai_error *e)
{
    *out = NULL;
    cJSON *rec, *items;
    int rc = load_for(s, id, &rec, &items, e);
    if (!rc && !(*out = object_of(rec, id)))
        rc = no_memory(e);
    cJSON_Delete(rec);
    cJSON_Delete(items);
    return rc;
}

/* LSET key 0 of rec: the record rewritten (its metadata). */
static int put_record(const struct cnv_store *s, const char *id, const cJSON *rec,
                      struct oai_error *e)
{
    char key[CNV_ID_MAX + 96];
    key_of(key, sizeof key, s->prefix, id);
    char *text = cJSON_PrintUnformatted(rec);
    if (!text)
        return no_memory(e);
    const char *argv[] = {"LSET", key, "0", text};
    struct rl_err err = {0};
    struct rconn_reply *x = NULL;
    int rc = rconn_command(s->c, 4, argv, NULL, &x, &err);
    free(text);
    bool gone = !rc && x && x->type == RCONN_ERROR; /* ERR no such key: deleted meanwhile */
    rconn_reply_free(x);
    return rc ? unavailable(e, &err) : gone ? not_found(e, id) : 0;
}

int cnv_update(const struct cnv_store *s, const char *id, const char *body, size_t len,
               char **out, struct oai_error *e)
{
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(body, len);
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    int rc = !cJSON_IsObject(root) ? bad(e, "metadata", "%s: the body must be a JSON object "
                                         "with metadata", "metadata")
             : !meta ? bad(e, "metadata", "%s: required", "metadata")
                     : check_metadata(meta, e);
    cJSON *rec = NULL, *items = NULL;
    if (!rc)
        rc = load_for(s, id, &rec, &items, e);
    if (!rc) {
        cJSON_ReplaceItemInObjectCaseSensitive(
            rec, "metadata", cJSON_DetachItemFromObjectCaseSensitive(root, "metadata"));
        rc = put_record(s, id, rec, e);
    }
    if (!rc && !(*out = object_of(rec, id)))
        rc = no_memory(e);
    cJSON_Delete(rec);
    cJSON_Delete(items);
    cJSON_Delete(root);
    return rc;
}

int cnv_delete(const struct cnv_store *s, const char *id, char **out, struct oai_error *e)
{
    *out = NULL;
    cJSON *rec, *items;
    int rc = load_for(s, id, &rec, &items, e);
    cJSON_Delete(rec);
    cJSON_Delete(items);
    if (rc)
        return rc;
    char key[CNV_ID_MAX + 96];
    key_of(key, sizeof key, s->prefix, id);
    const char *argv[] = {"DEL", key};
    struct rl_err err = {0};
    if (rconn_command(s->c, 2, argv, NULL, NULL, &err))
        return unavailable(e, &err);
    cJSON *o = cJSON_CreateObject();
    if (o && cJSON_AddStringToObject(o, "id", id) &&
        cJSON_AddStringToObject(o, "object", "conversation.deleted") &&
        cJSON_AddTrueToObject(o, "deleted"))
        *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return *out ? 0 : no_memory(e);
}

int cnv_items(const struct cnv_store *s, const char *id, const char *order, int limit,
              const char *after, char **out, struct oai_error *e)
{
    *out = NULL;
    cJSON *rec, *items;
    int rc = load_for(s, id, &rec, &items, e);
    char msg[RL_ERR_MSG_MAX];
    int pr = rc ? 0 : pg_list(items, order, limit, after, "item", out, msg, sizeof msg);
    if (pr == -RL_EINVAL) { /* the message leads with the parameter's name */
        char param[16];
        snprintf(param, sizeof param, "%.*s", (int)strcspn(msg, ":"), msg);
        oai_error_set(e, 400, T_INVALID, "BAD_VALUE", param, "%s", msg);
        rc = -RL_EINVAL;
    } else if (pr) {
        rc = no_memory(e);
    }
    cJSON_Delete(rec);
    cJSON_Delete(items);
    return rc;
}

int cnv_add(const struct cnv_store *s, const char *id, const char *body, size_t len, char **out,
            struct oai_error *e)
{
    *out = NULL;
    cJSON *root = parse_body(body, len, true, s->max_bytes, e);
    if (!root)
        return -RL_EINVAL;
    cJSON *add = cJSON_GetObjectItemCaseSensitive(root, "items");
    cJSON *rec = NULL, *items = NULL;
    size_t held = 0, more = 0;
    struct rl_err err = {0};
    int rc = load(s, id, -1, &rec, &items, &held, &err);
    rc = rc == 1 ? not_found(e, id) : rc ? unavailable(e, &err) : 0;
    if (!rc && cJSON_GetArraySize(items) + cJSON_GetArraySize(add) > CNV_ITEMS_MAX) {
        oai_error_set(e, 400, T_INVALID, "BAD_VALUE", "items", "items: the conversation holds "
                      "%d items; it may hold %d", cJSON_GetArraySize(items), CNV_ITEMS_MAX);
        rc = -RL_EINVAL;
    }
    if (!rc && json_bytes(add, &more))
        rc = no_memory(e);
    if (!rc && held + more > CNV_BYTES_X * s->max_bytes) {
        oai_error_set(e, 400, T_INVALID, "BAD_VALUE", "items", "items: the conversation holds "
                      "%zu KiB; it may hold %zu KiB (%d x responses_store_max_kb)", held / 1024,
                      CNV_BYTES_X * s->max_bytes / 1024, CNV_BYTES_X);
        rc = -RL_EINVAL;
    }
    int pr = rc ? 0 : push(s, id, add, &err);
    if (pr == 1)
        rc = not_found(e, id);
    else if (pr)
        rc = unavailable(e, &err);
    char msg[RL_ERR_MSG_MAX];
    if (!rc && pg_list(add, "asc", CNV_ADD_MAX, NULL, "item", out, msg, sizeof msg))
        rc = no_memory(e);
    cJSON_Delete(rec);
    cJSON_Delete(items);
    cJSON_Delete(root);
    return rc;
}

/* The item of items whose id is item, or NULL. */
static cJSON *find(const cJSON *items, const char *item)
{
    cJSON *it;
    cJSON_ArrayForEach(it, items)
    {
        const char *iid = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "id"));
        if (iid && !strcmp(iid, item))
            return it;
    }
    return NULL;
}

static int no_item(struct oai_error *e, const char *id, const char *item)
{
    oai_error_set(e, 404, T_INVALID, "not_found", "item_id",
                  "Item with id '%.*s' not found in conversation '%.*s'.", PG_ID_MAX, item,
                  CNV_ID_MAX, id);
    return -RL_EINVAL;
}

int cnv_item(const struct cnv_store *s, const char *id, const char *item, char **out,
             struct oai_error *e)
{
    *out = NULL;
    cJSON *rec, *items;
    int rc = load_for(s, id, &rec, &items, e);
    const cJSON *it = rc ? NULL : find(items, item);
    if (!rc && !it)
        rc = no_item(e, id, item);
    if (!rc && !(*out = cJSON_PrintUnformatted(it)))
        rc = no_memory(e);
    cJSON_Delete(rec);
    cJSON_Delete(items);
    return rc;
}

int cnv_item_delete(const struct cnv_store *s, const char *id, const char *item, char **out,
                    struct oai_error *e)
{
    *out = NULL;
    cJSON *rec, *items;
    int rc = load_for(s, id, &rec, &items, e);
    const cJSON *it = rc ? NULL : find(items, item);
    if (!rc && !it)
        rc = no_item(e, id, item);
    /* LREM of the element as stored: the text printed from it is the same
     * (cJSON prints what it parsed the same way) and no item equals the
     * record, which has no "type" */
    char *text = !rc ? cJSON_PrintUnformatted(it) : NULL;
    if (!rc && !text)
        rc = no_memory(e);
    char key[CNV_ID_MAX + 96];
    key_of(key, sizeof key, s->prefix, id);
    const char *argv[] = {"LREM", key, "1", text};
    struct rl_err err = {0};
    if (!rc && rconn_command(s->c, 4, argv, NULL, NULL, &err))
        rc = unavailable(e, &err);
    if (!rc && !(*out = object_of(rec, id)))
        rc = no_memory(e);
    free(text);
    cJSON_Delete(rec);
    cJSON_Delete(items);
    return rc;
}

int cnv_context(const struct cnv_store *s, const char *id, int upto, char **items_out, int *n,
                struct oai_error *e)
{
    *items_out = NULL;
    *n = 0;
    cJSON *rec, *items;
    struct rl_err err = {0};
    int rc = load(s, id, upto, &rec, &items, NULL, &err);
    if (rc == 1) {
        oai_error_set(e, 400, T_INVALID, "not_found", "conversation",
                      "Conversation with id '%.*s' not found.", CNV_ID_MAX, id);
        return -RL_EINVAL;
    }
    if (rc)
        return unavailable(e, &err);
    *n = cJSON_GetArraySize(items);
    if (!(*items_out = cJSON_PrintUnformatted(items)))
        rc = no_memory(e);
    cJSON_Delete(rec);
    cJSON_Delete(items);
    return rc;
}

int cnv_append(const struct cnv_store *s, const char *id, const char *items, struct rl_err *err)
{
    cJSON *a = cJSON_Parse(items);
    if (!cJSON_IsArray(a)) {
        cJSON_Delete(a);
        return rl_errf(err, RL_EINVAL, "conversation %s: the items are not an array", id);
    }
    cJSON *it;
    int rc = 0;
    cJSON_ArrayForEach(it, a)
    {
        char msg[160];
        int nr = normalise(it, msg, sizeof msg);
        if (nr == -RL_ENOMEM)
            rc = rl_errf(err, RL_ENOMEM, "out of memory");
        else if (nr) /* compat.c made these: never, but say so */
            rc = rl_errf(err, RL_EINVAL, "conversation %s: an item %s", id, msg);
        if (rc)
            break;
    }
    if (!rc)
        rc = push(s, id, a, err);
    cJSON_Delete(a);
    return rc;
}
