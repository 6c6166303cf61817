/* common/cache.c - replaying a result-cache value (see cache.h). Pure: no
 * Redis, no clock; called from the worker's and the dispatcher's main
 * threads. */
#include "cache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

void cache_events_free(char **events, int n)
{
    for (int i = 0; i < n; i++)
        free(events[i]);
    free(events);
}

int cache_replay_events(const char *value, size_t len, const char *key, int64_t t0, int64_t now,
                        const cJSON *metadata, char ***events, int *n_out, struct rl_err *err)
{
    *events = NULL;
    *n_out = 0;
    cJSON *a = cJSON_ParseWithLength(value, len);
    int n = a && cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
    int rc = 0;
    char **ev = NULL;
    if (n < 1) {
        rc = rl_errf(err, RL_EFORMAT, "%s: not a non-empty JSON array", key);
        goto out;
    }
    /* the whole list first: a value cut short must replay nothing */
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_GetArrayItem(a, i);
        cJSON *seq = cJSON_GetObjectItemCaseSensitive(e, "seq");
        cJSON *type = cJSON_GetObjectItemCaseSensitive(e, "type");
        bool last = i == n - 1;
        if (!cJSON_IsNumber(seq) || seq->valuedouble != i || !cJSON_IsString(type) ||
            (!strcmp(type->valuestring, "done") != last)) {
            rc = rl_errf(err, RL_EFORMAT, "%s: event %d is not seq %d of a complete list", key,
                         i, i);
            goto out;
        }
    }
    if (t0 <= 0 || t0 > now)
        t0 = now;
    cJSON *done = cJSON_GetArrayItem(a, n - 1);
    cJSON *t = cJSON_CreateObject();
    if (!t || !cJSON_AddNumberToObject(t, "queue_ms", (double)(now - t0)) ||
        !cJSON_AddNumberToObject(t, "ttft_ms", (double)(now - t0)) ||
        !cJSON_AddNumberToObject(t, "total_ms", (double)(now - t0))) {
        cJSON_Delete(t);
        goto oom;
    }
    cJSON_ReplaceItemInObjectCaseSensitive(done, "cached", cJSON_CreateTrue());
    cJSON_ReplaceItemInObjectCaseSensitive(done, "timings", t);
    cJSON_DeleteItemFromObjectCaseSensitive(done, "metadata");
    if (metadata)
        cJSON_AddItemToObject(done, "metadata", cJSON_Duplicate(metadata, 1));
    if (!(ev = calloc((size_t)n, sizeof *ev)))
        goto oom;
    for (int i = 0; i < n; i++)
        if (!(ev[i] = cJSON_PrintUnformatted(cJSON_GetArrayItem(a, i))))
            goto oom;
    *events = ev;
    *n_out = n;
    ev = NULL;
    goto out;
oom:
    rc = rl_errf(err, RL_ENOMEM, "cache: out of memory replaying %s", key);
out:
    if (ev)
        cache_events_free(ev, n);
    cJSON_Delete(a);
    return rc;
}
