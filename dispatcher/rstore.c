/* dispatcher/rstore.c - stored responses in Redis (rstore.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

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
    cJSON *json; /* {"owner", "input", "response", "running"?}, checked by wrap */
};

/* r for a parsed record (taken), or NULL when it is not one (freed) or
 * memory runs out. */
static struct rst_record *wrap(cJSON *rec)
{
    struct rst_record *r = NULL;
    if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(rec, "owner")) &&
        cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(rec, "input")) &&
        cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(rec, "response")) &&
        (r = malloc(sizeof *r))) {
        r->json = rec;
        return r;
    }
    cJSON_Delete(rec);
    return NULL;
}

int rst_new(const char *owner, const char *id, const char *input, const char *response,
            const struct rst_running *run, struct rst_record **out)
{
    *out = NULL;
    cJSON *rec = cJSON_CreateObject();
    cJSON *in = cJSON_Parse(input), *resp = cJSON_Parse(response);
    cJSON *rj = run ? running_json(run) : NULL;
    int rc = !rec || (run && !rj)                         ? -RL_ENOMEM
             : !cJSON_IsArray(in) || !cJSON_IsObject(resp) ? -RL_EINVAL
             : name_items(in, id) || !cJSON_AddStringToObject(rec, "owner", owner ? owner : "")
                 ? -RL_ENOMEM
                 : 0;
    if (rc) {
        cJSON_Delete(rec);
        cJSON_Delete(rj);
        cJSON_Delete(in);
        cJSON_Delete(resp);
        return rc;
    }
    cJSON_AddItemToObject(rec, "input", in);
    cJSON_AddItemToObject(rec, "response", resp);
    if (rj)
        cJSON_AddItemToObject(rec, "running", rj);
    return (*out = wrap(rec)) ? 0 : -RL_ENOMEM;
}

void rst_free(struct rst_record *r)
{
    if (!r)
        return;
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

char *rst_context(const struct rst_record *r)
{
    /* a new array over the items' copies: r stays as it is */
    cJSON *ctx = cJSON_CreateArray();
    bool ok = ctx != NULL;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(r->json, "input"))
    {
        ok = ok && cJSON_AddItemToArray(ctx, cJSON_Duplicate(it, 1));
    }
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(response_of(r), "output"))
    {
        ok = ok && cJSON_AddItemToArray(ctx, cJSON_Duplicate(it, 1));
    }
    char *s = ok ? cJSON_PrintUnformatted(ctx) : NULL;
    cJSON_Delete(ctx);
    return s;
}

int rst_input_items(const struct rst_record *r, const char *order, int limit, const char *after,
                    char **out, char *msg, size_t size)
{
    *out = NULL;
    bool desc = !order || !strcmp(order, "desc");
    if (!desc && strcmp(order, "asc")) {
        snprintf(msg, size, "order: must be asc or desc");
        return -RL_EINVAL;
    }
    if (limit < 1 || limit > 100) {
        snprintf(msg, size, "limit: must be 1 to 100");
        return -RL_EINVAL;
    }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(r->json, "input");
    int n = cJSON_GetArraySize(in);
    /* the items in the order asked, as an index walk */
    int first = desc ? n - 1 : 0, step = desc ? -1 : 1;
    int i = first;
    if (after) {
        for (; i >= 0 && i < n; i += step) {
            const char *iid = cJSON_GetStringValue(
                cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(in, i), "id"));
            if (iid && !strcmp(iid, after))
                break;
        }
        if (i < 0 || i >= n) {
            snprintf(msg, size, "after: no input item %.*s in this response", RST_ID_MAX, after);
            return -RL_EINVAL;
        }
        i += step;
    }
    cJSON *list = cJSON_CreateObject();
    cJSON *data = cJSON_AddArrayToObject(list, "data");
    int taken = 0;
    const char *first_id = NULL, *last_id = NULL;
    for (; i >= 0 && i < n && taken < limit && data; i += step, taken++) {
        const cJSON *it = cJSON_GetArrayItem(in, i);
        const char *iid = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "id"));
        if (!first_id)
            first_id = iid;
        last_id = iid;
        cJSON_AddItemToArray(data, cJSON_Duplicate(it, 1));
    }
    int rc = 0;
    if (!list || !data || !cJSON_AddStringToObject(list, "object", "list") ||
        !(first_id ? cJSON_AddStringToObject(list, "first_id", first_id)
                   : cJSON_AddNullToObject(list, "first_id")) ||
        !(last_id ? cJSON_AddStringToObject(list, "last_id", last_id)
                  : cJSON_AddNullToObject(list, "last_id")) ||
        !cJSON_AddBoolToObject(list, "has_more", i >= 0 && i < n) ||
        !(*out = cJSON_PrintUnformatted(list)))
        rc = -RL_ENOMEM;
    cJSON_Delete(list);
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

int rst_put(struct rconn *c, const char *prefix, const char *id, const struct rst_record *r,
            int ttl_s, struct rl_err *err)
{
    char key[RST_ID_MAX + 96], ttl[24];
    key_of(key, sizeof key, prefix, id);
    snprintf(ttl, sizeof ttl, "%d", ttl_s);
    char *text = rst_json(r);
    if (!text)
        return rl_errf(err, RL_ENOMEM, "response %s: out of memory", id);
    const char *argv[] = {"SET", key, text, "EX", ttl};
    int rc = rconn_command(c, 5, argv, NULL, NULL, err);
    free(text);
    return rc;
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
    if (rc || !x || x->type != RCONN_STRING) {
        rconn_reply_free(x);
        return rc ? rc : 1; /* nil: none, or expired */
    }
    /* not a record (written by someone else): as good as none */
    struct rst_record *r = wrap(cJSON_ParseWithLength(x->str, x->len));
    rconn_reply_free(x);
    const char *who = r ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r->json, "owner"))
                        : NULL;
    if (!who || strcmp(who, owner ? owner : "")) {
        rst_free(r);
        return 1;
    }
    *out = r;
    return 0;
}

int rst_delete(struct rconn *c, const char *prefix, const char *id, const char *owner,
               struct rl_err *err)
{
    struct rst_record *r = NULL;
    int rc = rst_get(c, prefix, id, owner, 0, &r, err);
    rst_free(r);
    if (rc)
        return rc;
    char key[RST_ID_MAX + 96];
    key_of(key, sizeof key, prefix, id);
    const char *argv[] = {"DEL", key};
    struct rconn_reply *x = NULL;
    rc = rconn_command(c, 2, argv, NULL, &x, err);
    /* 0 deleted: another request deleted it between the two commands */
    bool gone = !rc && x && x->type == RCONN_INTEGER && x->integer == 0;
    rconn_reply_free(x);
    return rc ? rc : gone ? 1 : 0;
}
