/* dispatcher/pager.h - OpenAI's cursor pages of items: the list object
 * that GET /v1/responses/{id}/input_items and GET
 * /v1/conversations/{id}/items answer, and by which the SDKs page
 * (`after` the last id seen, while has_more).
 *
 * Pure: a JSON array of items in, a page of it out. */
#ifndef RL_PAGER_H
#define RL_PAGER_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* The longest item id `after` may name (ours are under 80 characters). */
#define PG_ID_MAX 128

/* The page {"object": "list", "data": [...], "first_id", "last_id",
 * "has_more"} of items (a JSON array of objects with "id"), in order "asc"
 * or "desc" (NULL: desc, OpenAI's default), at most limit (1-100) items
 * that follow the item whose id is after (NULL: from the first). what
 * names the items in a message ("input item"). Returns 0 and *out
 * (malloc'd), -RL_EINVAL with msg (order, limit or after is wrong: the
 * message starts with its name and a colon) or -RL_ENOMEM. */
int pg_list(const cJSON *items, const char *order, int limit, const char *after,
            const char *what, char **out, char *msg, size_t size);

#endif
