/* dispatcher/pager.c - OpenAI's cursor pages of items (pager.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "pager.h"

static const char *id_of(const cJSON *item)
{
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(item, "id"));
}

int pg_list(const cJSON *items, const char *order, int limit, const char *after,
            const char *what, char **out, char *msg, size_t size)
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
    int n = cJSON_GetArraySize(items);
    /* the items in the order asked, as an index walk */
    int step = desc ? -1 : 1;
    int i = desc ? n - 1 : 0;
    if (after) {
        for (; i >= 0 && i < n; i += step) {
            const char *iid = id_of(cJSON_GetArrayItem(items, i));
            if (iid && !strcmp(iid, after))
                break;
        }
        if (i < 0 || i >= n) {
            snprintf(msg, size, "after: no %s %.*s here", what, PG_ID_MAX, after);
            return -RL_EINVAL;
        }
        i += step;
    }
    cJSON *list = cJSON_CreateObject();
    cJSON *data = cJSON_AddArrayToObject(list, "data");
    const char *first_id = NULL, *last_id = NULL;
    for (int taken = 0; i >= 0 && i < n && taken < limit && data; i += step, taken++) {
        const cJSON *it = cJSON_GetArrayItem(items, i);
        if (!first_id)
            first_id = id_of(it);
        last_id = id_of(it);
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
