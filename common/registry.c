/* common/registry.c - see registry.h. */
#include "registry.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int reg_read_heartbeats(struct rconn *c, const char *prefix, int max,
                        struct rconn_reply **names, struct rconn_reply **hbs, struct rl_err *err)
{
    size_t plen = strlen(prefix);
    char *reg = malloc(plen + sizeof "workers"), stop[16];
    *names = *hbs = NULL;
    if (!reg)
        return rl_errf(err, RL_ENOMEM, "heartbeats: out of memory");
    snprintf(reg, plen + sizeof "workers", "%sworkers", prefix);
    snprintf(stop, sizeof stop, "%d", max > 0 ? max - 1 : 0);
    const char *za[4] = {"ZRANGE", reg, "0", stop};
    int rc = rconn_command(c, 4, za, NULL, names, err);
    if (!rc && (*names)->type != RCONN_ARRAY)
        rc = rl_errf(err, RL_EFORMAT, "ZRANGE %s: not a sorted set", reg);
    free(reg);
    size_t nn = rc ? 0 : (*names)->n_elem;
    const char **argv = rc ? NULL : calloc(nn + 1, sizeof *argv);
    char **keys = rc ? NULL : calloc(nn + 1, sizeof *keys);
    if (!rc && (!argv || !keys))
        rc = rl_errf(err, RL_ENOMEM, "heartbeats: out of memory");
    if (!rc && nn) {
        argv[0] = "MGET";
        for (size_t i = 0; i < nn && !rc; i++) {
            const char *nm = (*names)->elem[i].str ? (*names)->elem[i].str : "";
            size_t len = plen + sizeof "worker:" + strlen(nm);
            if (!(keys[i] = malloc(len)))
                rc = rl_errf(err, RL_ENOMEM, "heartbeats: out of memory");
            else
                snprintf(keys[i], len, "%sworker:%s", prefix, nm);
            argv[i + 1] = keys[i];
        }
        if (!rc)
            rc = rconn_command(c, (int)nn + 1, argv, NULL, hbs, err);
        if (!rc && ((*hbs)->type != RCONN_ARRAY || (*hbs)->n_elem != nn))
            rc = rl_errf(err, RL_EFORMAT, "MGET of the heartbeats: not one reply per worker");
    }
    for (size_t i = 0; keys && i < nn; i++)
        free(keys[i]);
    free(argv);
    free(keys);
    if (rc) {
        rconn_reply_free(*names);
        rconn_reply_free(*hbs);
        *names = *hbs = NULL;
    }
    return rc;
}

int reg_each_heartbeat(struct rconn *c, const char *prefix, int max,
                       void (*fn)(void *ctx, const char *name, const cJSON *hb), void *ctx,
                       struct rl_err *err)
{
    struct rconn_reply *names = NULL, *hbs = NULL;
    int rc = reg_read_heartbeats(c, prefix, max, &names, &hbs, err);
    if (rc)
        return rc;
    for (size_t i = 0; hbs && i < hbs->n_elem && i < names->n_elem; i++) {
        if (hbs->elem[i].type != RCONN_STRING)
            continue; /* expired: not live */
        cJSON *hb = cJSON_ParseWithLength(hbs->elem[i].str, hbs->elem[i].len);
        if (hb)
            fn(ctx, names->elem[i].str ? names->elem[i].str : "?", hb);
        cJSON_Delete(hb);
    }
    rconn_reply_free(names);
    rconn_reply_free(hbs);
    return 0;
}
