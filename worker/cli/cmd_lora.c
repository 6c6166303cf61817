/* worker/cli/cmd_lora.c - `redlm lora`: the fleet's runtime LoRA adapters
 * from a terminal, for deployments that use the queue and no front door
 * (or want a shell for it):
 *
 *   redlm lora load NAME PATH [--model M] [--timeout S]
 *   redlm lora unload NAME [--model M] [--timeout S]
 *   redlm lora list [--json]
 *
 * load and unload are the front door's POST /v1/load_lora_adapter and
 * /v1/unload_lora_adapter (common/lorafleet.h): the same wish in Redis, the
 * same wait for every live worker of the model, the same answers; they
 * need the rights of the ACL's dispatcher user on loras:* (the admin user
 * has them). list shows, per model, the wish and what each live worker
 * serves and could not load. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_redis.h"
#include "cmds.h"
#include "lorafleet.h"
#include "text.h"

static int usage(const char *why)
{
    if (why)
        fprintf(stderr, "redlm lora: %s\n", why);
    fprintf(stderr,
            "usage: redlm lora load NAME PATH [--model M] [--timeout S]\n"
            "       redlm lora unload NAME [--model M] [--timeout S]\n"
            "       redlm lora list [--json]\n"
            "LoRA adapters loaded and unloaded at runtime on every worker of a model (the\n"
            "front door's /v1/load_lora_adapter): PATH is looked up in each worker's\n"
            "lora_dirs; the command returns once every live worker serves it, or says who\n"
            "could not and why.\n%s",
            cli_redis_help);
    return 2;
}

static void print_list(const cJSON *o)
{
    const cJSON *m, *x, *w;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(o, "models"))
    {
        printf("model %s\n", cJSON_GetObjectItemCaseSensitive(m, "model")->valuestring);
        const cJSON *wished = cJSON_GetObjectItemCaseSensitive(m, "wished");
        printf("  loaded at runtime:");
        if (!cJSON_GetArraySize(wished))
            printf(" none");
        cJSON_ArrayForEach(x, wished)
            printf(" %s (%s)", x->string, cJSON_IsString(x) ? x->valuestring : "?");
        printf("\n");
        cJSON_ArrayForEach(w, cJSON_GetObjectItemCaseSensitive(m, "workers"))
        {
            printf("  %s:", cJSON_GetObjectItemCaseSensitive(w, "name")->valuestring);
            const cJSON *ads = cJSON_GetObjectItemCaseSensitive(w, "adapters");
            if (!cJSON_GetArraySize(ads))
                printf(" no adapter");
            cJSON_ArrayForEach(x, ads)
            {
                const cJSON *n = cJSON_GetObjectItemCaseSensitive(x, "name");
                const cJSON *p = cJSON_GetObjectItemCaseSensitive(x, "lora_path");
                printf(" %s%s%s%s", cJSON_IsString(n) ? n->valuestring : "?",
                       cJSON_IsString(p) ? " (" : " [lora_modules",
                       cJSON_IsString(p) ? p->valuestring : "", cJSON_IsString(p) ? ")" : "]");
            }
            printf("\n");
            cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(w, "failed"))
            {
                const cJSON *n = cJSON_GetObjectItemCaseSensitive(x, "name");
                const cJSON *e = cJSON_GetObjectItemCaseSensitive(x, "error");
                printf("    failed %s: %s\n", cJSON_IsString(n) ? n->valuestring : "?",
                       cJSON_IsString(e) ? e->valuestring : "?");
            }
        }
    }
}

int cmd_lora(int argc, char **argv)
{
    struct cli_redis_args ra;
    cli_redis_args_default(&ra);
    struct rl_err err = {0};
    const char *pos[3] = {NULL, NULL, NULL}, *model = NULL;
    int n_pos = 0, timeout_s = 60;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        int f = cli_redis_flag(&ra, argc, argv, &i, &err);
        if (f < 0)
            return usage(err.msg);
        if (f > 0)
            continue;
        if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
            timeout_s = atoi(argv[++i]);
            if (timeout_s < 1 || timeout_s > 3600)
                return usage("--timeout: 1 to 3600 seconds");
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(NULL);
            return 0;
        } else if (argv[i][0] == '-' || n_pos == 3) {
            char why[160];
            snprintf(why, sizeof why, "unexpected argument %.100s", argv[i]);
            return usage(why);
        } else {
            pos[n_pos++] = argv[i];
        }
    }
    const char *verb = pos[0];
    bool load = verb && !strcmp(verb, "load"), unload = verb && !strcmp(verb, "unload");
    bool list = verb && !strcmp(verb, "list");
    if (!load && !unload && !list)
        return usage(verb ? "the first word is load, unload or list" : NULL);
    if ((load && n_pos != 3) || (unload && n_pos != 2) || (list && n_pos != 1))
        return usage(load ? "load takes NAME and PATH" : unload ? "unload takes NAME"
                                                                : "list takes no name");
    struct rconn *c;
    if (cli_redis_open(&c, &ra, "lora"))
        return 1;
    int status = 0;
    if (list) {
        cJSON *o = NULL;
        if (lfl_list(c, ra.prefix, &o, &err)) {
            fprintf(stderr, "redlm lora list: %s\n", err.msg);
            status = 1;
        } else if (json) {
            char *t = cJSON_PrintUnformatted(o);
            printf("%s\n", t ? t : "{}");
            free(t);
        } else {
            print_list(o);
        }
        cJSON_Delete(o);
        rconn_free(c);
        return status;
    }
    /* the body the front door's route takes */
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "lora_name", pos[1]);
    if (load)
        cJSON_AddStringToObject(b, "lora_path", pos[2]);
    if (model)
        cJSON_AddStringToObject(b, "model", model);
    char *body = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    if (!body) {
        fprintf(stderr, "redlm lora %s: out of memory\n", verb);
        rconn_free(c);
        return 1;
    }
    struct lfl_opts o = {.prefix = ra.prefix, .timeout_ms = timeout_s * 1000, .poll_ms = 100};
    char *ok = NULL;
    struct lfl_error e;
    int rc = load ? lfl_load(c, &o, body, strlen(body), &ok, &e)
                  : lfl_unload(c, &o, body, strlen(body), &ok, &e);
    free(body);
    rconn_free(c);
    if (rc) {
        fprintf(stderr, "redlm lora %s: %s\n", verb, e.message);
        return 1;
    }
    fputs(ok, stdout);
    free(ok);
    return 0;
}
