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

/* The record of its parts (each taken, freed on failure); run NULL: none. */
static int assemble(const char *owner, cJSON *in, cJSON *resp, const struct rst_running *run,
                    char **out)
{
    *out = NULL;
    cJSON *rec = cJSON_CreateObject();
    cJSON *rj = run ? running_json(run) : NULL;
    int rc = 0;
    if (!rec || (run && !rj))
        rc = -RL_ENOMEM;
    else if (!cJSON_IsArray(in) || !cJSON_IsObject(resp))
        rc = -RL_EINVAL;
    else if (!cJSON_AddStringToObject(rec, "owner", owner ? owner : ""))
        rc = -RL_ENOMEM;
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
    if (!(*out = cJSON_PrintUnformatted(rec)))
        rc = -RL_ENOMEM;
    cJSON_Delete(rec);
    return rc;
}

int rst_record(const char *owner, const char *id, const char *input, const char *response,
               const struct rst_running *run, char **out)
{
    cJSON *in = cJSON_Parse(input);
    if (cJSON_IsArray(in) && name_items(in, id)) {
        cJSON_Delete(in);
        return -RL_ENOMEM;
    }
    return assemble(owner, in, cJSON_Parse(response), run, out);
}

int rst_rewrite(const char *record, const char *response, const struct rst_running *run,
                char **out)
{
    cJSON *rec = cJSON_Parse(record);
    cJSON *in = cJSON_DetachItemFromObjectCaseSensitive(rec, "input");
    cJSON *resp = response ? cJSON_Parse(response)
                           : cJSON_DetachItemFromObjectCaseSensitive(rec, "response");
    const char *owner = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec, "owner"));
    int rc = owner ? assemble(owner, in, resp, run, out) : -RL_EINVAL;
    if (!owner) {
        cJSON_Delete(in);
        cJSON_Delete(resp);
    }
    cJSON_Delete(rec);
    return rc;
}

bool rst_running_of(const char *record, struct rst_running *out)
{
    memset(out, 0, sizeof *out);
    cJSON *rec = cJSON_Parse(record);
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(rec, "running");
    bool running = cJSON_IsObject(run);
    out->cancel = running && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(run, "cancel"));
    cJSON_Delete(rec);
    return running;
}

char *rst_context(const char *record)
{
    cJSON *rec = cJSON_Parse(record);
    cJSON *in = cJSON_DetachItemFromObjectCaseSensitive(rec, "input");
    const cJSON *out =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(rec, "response"),
                                         "output");
    char *s = NULL;
    if (cJSON_IsArray(in)) {
        const cJSON *it;
        bool ok = true;
        cJSON_ArrayForEach(it, out)
        {
            ok = ok && cJSON_AddItemToArray(in, cJSON_Duplicate(it, 1));
        }
        if (ok)
            s = cJSON_PrintUnformatted(in);
    }
    cJSON_Delete(in);
    cJSON_Delete(rec);
    return s;
}

char *rst_response(const char *record)
{
    cJSON *rec = cJSON_Parse(record);
    const cJSON *resp = cJSON_GetObjectItemCaseSensitive(rec, "response");
    char *s = cJSON_IsObject(resp) ? cJSON_PrintUnformatted(resp) : NULL;
    cJSON_Delete(rec);
    return s;
}

int rst_input_items(const char *record, const char *order, int limit, const char *after,
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
    cJSON *rec = cJSON_Parse(record);
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(rec, "input");
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
            cJSON_Delete(rec);
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
    cJSON_Delete(rec);
    return rc;
}

static void key_of(char *buf, size_t size, const char *prefix, const char *id)
{
    snprintf(buf, size, "%.64sresponse:%.*s", prefix, RST_ID_MAX, id);
}

int rst_put(struct rconn *c, const char *prefix, const char *id, const char *record, int ttl_s,
            struct rl_err *err)
{
    char key[RST_ID_MAX + 96], ttl[24];
    key_of(key, sizeof key, prefix, id);
    snprintf(ttl, sizeof ttl, "%d", ttl_s);
    const char *argv[] = {"SET", key, record, "EX", ttl};
    return rconn_command(c, 5, argv, NULL, NULL, err);
}

int rst_get(struct rconn *c, const char *prefix, const char *id, const char *owner, int ttl_s,
            char **record, struct rl_err *err)
{
    *record = NULL;
    if (strlen(id) > RST_ID_MAX)
        return 1;
    char key[RST_ID_MAX + 96], ttl[24];
    key_of(key, sizeof key, prefix, id);
    snprintf(ttl, sizeof ttl, "%d", ttl_s);
    const char *argv[] = {"GETEX", key, "EX", ttl};
    struct rconn_reply *r = NULL;
    int rc = rconn_command(c, ttl_s > 0 ? 4 : 2, argv, NULL, &r, err);
    if (rc || !r || r->type != RCONN_STRING) {
        rconn_reply_free(r);
        return rc ? rc : 1; /* nil: none, or expired */
    }
    cJSON *rec = cJSON_ParseWithLength(r->str, r->len);
    const char *who = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec, "owner"));
    bool mine = who && !strcmp(who, owner ? owner : "");
    cJSON_Delete(rec);
    if (mine && !(*record = malloc(r->len + 1)))
        rc = rl_errf(err, RL_ENOMEM, "response %s: out of memory", id);
    else if (mine) {
        memcpy(*record, r->str, r->len);
        (*record)[r->len] = 0;
    }
    rconn_reply_free(r);
    return rc ? rc : mine ? 0 : 1;
}

int rst_delete(struct rconn *c, const char *prefix, const char *id, const char *owner,
               struct rl_err *err)
{
    char *record = NULL;
    int rc = rst_get(c, prefix, id, owner, 0, &record, err);
    free(record);
    if (rc)
        return rc;
    char key[RST_ID_MAX + 96];
    key_of(key, sizeof key, prefix, id);
    const char *argv[] = {"DEL", key};
    struct rconn_reply *r = NULL;
    rc = rconn_command(c, 2, argv, NULL, &r, err);
    /* 0 deleted: another request deleted it between the two commands */
    bool gone = !rc && r && r->type == RCONN_INTEGER && r->integer == 0;
    rconn_reply_free(r);
    return rc ? rc : gone ? 1 : 0;
}
