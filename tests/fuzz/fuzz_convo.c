/* tests/fuzz/fuzz_convo.c - the Conversations API's request bodies
 * (dispatcher/convo.h: cnv_parse_body), as hostile clients send them to
 * POST /v1/conversations and POST /v1/conversations/{id}/items.
 *
 * The first byte chooses: bit 0, items required (an add); bit 1, a bound
 * of 1 KiB on the items' JSON instead of 1 MiB. What is checked: a body
 * either is refused with a 400 and a message (500 only out of memory), or
 * gives a JSON array of at most CNV_ADD_MAX objects, each with a string
 * "id" and a string "type" (a message with a role and its content as
 * parts), no bigger than the bound, and metadata that is an object of at
 * most 16 strings. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dispatcher/convo.h"

static void check_items(const char *items, size_t max_bytes)
{
    cJSON *a = cJSON_Parse(items);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > CNV_ADD_MAX || strlen(items) > max_bytes)
        abort();
    const cJSON *it;
    cJSON_ArrayForEach(it, a)
    {
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "id"));
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "type"));
        if (!cJSON_IsObject(it) || !id || !id[0] || !type)
            abort();
        if (!strcmp(type, "message")) {
            if (!cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "role")) ||
                !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(it, "content")))
                abort();
        }
    }
    cJSON_Delete(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    bool need_items = data[0] & 1;
    size_t max_bytes = data[0] & 2 ? 1024 : 1 << 20;
    char *items = NULL, *metadata = NULL;
    struct oai_error e = {0};
    int rc = cnv_parse_body((const char *)data + 1, size - 1, need_items, max_bytes, &items,
                            &metadata, &e);
    if (rc) {
        if (items || metadata || !e.message[0] || (e.status != 400 && e.status != 500))
            abort();
        return 0;
    }
    if (!items)
        abort();
    check_items(items, max_bytes);
    if (metadata) {
        cJSON *m = cJSON_Parse(metadata);
        if (!cJSON_IsObject(m) || cJSON_GetArraySize(m) > 16)
            abort();
        cJSON_Delete(m);
    }
    free(items);
    free(metadata);
    return 0;
}
