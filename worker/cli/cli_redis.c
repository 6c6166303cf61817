/* worker/cli/cli_redis.c - the connection flags, stream reads and event
 * rendering that enqueue, tail, cancel, chat, stats and top share.
 *
 * These are one-shot or interactive client programs, so unlike the worker
 * they try Redis once at start and fail with a sentence naming the address
 * (a user who typed the wrong port should know at once); after that, rconn
 * reconnects on the next command if the connection drops.
 *
 * The renderer turns a request's event stream into terminal text. It keeps
 * the answer (content) apart from the reasoning: a reader of a thinking
 * model's output wants to skim or skip the reasoning, and a script that
 * pipes `redlm tail` wants to cut it out, so on a terminal it is dim and
 * otherwise it sits between marker lines of its own. Text is written
 * exactly as the events hold it; only the markers and a final newline are
 * added. Single-threaded, like every command. */
#include "cli_redis.h"
#include "rcluster.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

const char cli_redis_help[] =
    "  --redis HOST:PORT    Redis address (default $REDLM_REDIS or 127.0.0.1:6379;\n"
    "                       also [v6]:port or unix:/path)\n"
    "  --prefix P           key prefix (default $REDLM_PREFIX or redlm:)\n"
    "  --user NAME          Redis ACL user (with --password-file)\n"
    "  --password-file F    file holding the Redis password\n";

void cli_redis_args_default(struct cli_redis_args *a)
{
    memset(a, 0, sizeof *a);
    const char *e = getenv("REDLM_REDIS");
    a->addr = e && *e ? e : "127.0.0.1:6379";
    e = getenv("REDLM_PREFIX");
    a->prefix = e && *e ? e : "redlm:";
}

int cli_redis_flag(struct cli_redis_args *a, int argc, char **argv, int *i, struct rl_err *err)
{
    const char *f = argv[*i];
    const char **dst = !strcmp(f, "--redis")           ? &a->addr
                       : !strcmp(f, "--prefix")        ? &a->prefix
                       : !strcmp(f, "--user")          ? &a->user
                       : !strcmp(f, "--password-file") ? &a->password_file
                                                       : NULL;
    if (!dst)
        return 0;
    if (*i + 1 >= argc)
        return rl_errf(err, RL_EINVAL, "%s needs a value", f);
    *dst = argv[++*i];
    return 1;
}

int cli_redis_connect(struct rconn **out, const struct cli_redis_args *a, const char *client_name,
                      struct rl_err *err)
{
    *out = NULL;
    if (strlen(a->prefix) > 128)
        return rl_errf(err, RL_EINVAL, "--prefix: longer than 128 characters");
    struct rconn_opts o;
    rconn_opts_default(&o);
    o.addr = a->addr;
    o.user = a->user;
    o.password_file = a->password_file;
    o.client_name = client_name;
    o.connect_timeout_ms = 2000;
    struct rconn *c;
    int rc = rconn_create(&c, &o, err);
    if (rc)
        return rc;
    if ((rc = rconn_ensure(c, err))) {
        /* rconn's sentence names the address already: say it once */
        char lead[CLI_KEY_MAX];
        snprintf(lead, sizeof lead, "redis %s: ", a->addr);
        const char *why = err && !strncmp(err->msg, lead, strlen(lead)) ? err->msg + strlen(lead)
                          : err ? err->msg : "";
        char tmp[RL_ERR_MSG_MAX];
        snprintf(tmp, sizeof tmp, "%s", why);
        rl_errf(err, -rc, "cannot reach Redis at %s: %s", a->addr, tmp);
        rconn_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int cli_redis_open(struct rconn **out, const struct cli_redis_args *a, const char *cmd)
{
    char name[64];
    struct rl_err err = {0};
    snprintf(name, sizeof name, "redlm-%s", cmd);
    int rc = cli_redis_connect(out, a, name, &err);
    if (rc)
        fprintf(stderr, "redlm %s: %s\n", cmd, err.msg);
    return rc;
}

int cli_key(char key[CLI_KEY_MAX], const char *prefix, const char *a, const char *b,
            struct rl_err *err)
{
    int n = snprintf(key, CLI_KEY_MAX, "%s%s%s", prefix, a, b ? b : "");
    if (n < 0 || n >= CLI_KEY_MAX)
        return rl_errf(err, RL_EINVAL, "key %s%s... is too long", prefix, a);
    return 0;
}

int cli_xread(struct rconn *c, const char *key, const char *after, int count, int block_ms,
              struct rconn_entries *out, struct rl_err *err)
{
    memset(out, 0, sizeof *out);
    char cnt[16], blk[16];
    snprintf(cnt, sizeof cnt, "%d", count);
    snprintf(blk, sizeof blk, "%d", block_ms);
    const char *argv[8];
    int n = 0;
    argv[n++] = "XREAD";
    if (block_ms >= 0) {
        argv[n++] = "BLOCK";
        argv[n++] = blk;
    }
    argv[n++] = "COUNT";
    argv[n++] = cnt;
    argv[n++] = "STREAMS";
    argv[n++] = key;
    argv[n++] = after;
    struct rconn_reply *r = NULL;
    int rc = rconn_command(c, n, argv, NULL, &r, err);
    if (rc) {
        rconn_reply_free(r);
        return rc;
    }
    /* nil on timeout; else [[key, [[id, [f, v, ...]], ...]]] */
    if (r->type != RCONN_ARRAY || r->n_elem < 1) {
        rconn_reply_free(r);
        return 0;
    }
    const struct rconn_reply *s = &r->elem[0];
    if (s->type != RCONN_ARRAY || s->n_elem != 2 || s->elem[1].type != RCONN_ARRAY) {
        rconn_reply_free(r);
        return rl_errf(err, RL_EFORMAT, "XREAD %s: unexpected reply", key);
    }
    const struct rconn_reply *es = &s->elem[1];
    out->v = calloc(es->n_elem ? es->n_elem : 1, sizeof *out->v);
    if (!out->v) {
        rconn_reply_free(r);
        return rl_errf(err, RL_ENOMEM, "XREAD: out of memory");
    }
    for (size_t i = 0; i < es->n_elem; i++) {
        const struct rconn_reply *e = &es->elem[i];
        if (e->type != RCONN_ARRAY || e->n_elem != 2 || e->elem[0].type != RCONN_STRING ||
            e->elem[1].type != RCONN_ARRAY || e->elem[1].n_elem % 2)
            continue;
        struct rconn_entry *d = &out->v[out->n];
        snprintf(d->id, sizeof d->id, "%s", e->elem[0].str);
        size_t nf = e->elem[1].n_elem / 2;
        d->fields = calloc(nf ? nf : 1, sizeof *d->fields);
        if (!d->fields) {
            rconn_reply_free(r);
            rconn_entries_free(out);
            return rl_errf(err, RL_ENOMEM, "XREAD: out of memory");
        }
        out->n++;
        for (size_t k = 0; k < nf; k++) {
            const struct rconn_reply *fn = &e->elem[1].elem[2 * k], *fv = &e->elem[1].elem[2 * k + 1];
            if (fn->type != RCONN_STRING || fv->type != RCONN_STRING)
                continue;
            struct rconn_field *f = &d->fields[d->n_fields];
            f->name = malloc(fn->len + 1);
            f->value = malloc(fv->len + 1);
            if (!f->name || !f->value) {
                free(f->name), free(f->value);
                rconn_reply_free(r);
                rconn_entries_free(out);
                return rl_errf(err, RL_ENOMEM, "XREAD: out of memory");
            }
            memcpy(f->name, fn->str, fn->len + 1);
            memcpy(f->value, fv->str, fv->len + 1);
            f->name_len = fn->len;
            f->value_len = fv->len;
            d->n_fields++;
        }
    }
    rconn_reply_free(r);
    return 0;
}

/* The request an id's stream answers: its first event's request.entry
 * (schemas/README.md, "Job identity") into entry; "" when there is no
 * stream yet, no stamp, or no right to read it. */
static void stream_entry(struct rconn *c, const char *prefix, const char *id,
                         char entry[RCONN_ID_MAX])
{
    char key[CLI_KEY_MAX];
    struct rconn_entries ents = {0};
    struct rl_err err;
    entry[0] = 0;
    if (rcl_tagged_key(key, CLI_KEY_MAX, rconn_is_cluster(c), prefix, "out:", id) < 0 ||
        rconn_xrange(c, key, "-", "+", 1, &ents, &err) || ents.n < 1)
        goto out;
    size_t len;
    const char *v = rconn_entry_field(&ents.v[0], "event", &len);
    cJSON *o = v ? cJSON_ParseWithLength(v, len) : NULL;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "request");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(r, "entry");
    if (cJSON_IsString(e) && strlen(e->valuestring) < RCONN_ID_MAX)
        snprintf(entry, RCONN_ID_MAX, "%s", e->valuestring);
    cJSON_Delete(o);
out:
    rconn_entries_free(&ents);
}

int cli_cancel(struct rconn *c, const char *prefix, const char *id, const char *entry,
               struct rl_err *err)
{
    char key[CLI_KEY_MAX], found[RCONN_ID_MAX];
    if (rcl_tagged_key(key, CLI_KEY_MAX, rconn_is_cluster(c), prefix, "cancel:", id) < 0)
        return rl_errf(err, RL_EINVAL, "key %scancel:%s is too long", prefix, id);
    if (!entry || !entry[0]) {
        stream_entry(c, prefix, id, found);
        entry = found;
    }
    /* the request's entry cancels that request only, never a later one
     * under the same id; "1" (nothing known of it yet) whichever runs */
    const char *argv[] = {"SET", key, entry[0] ? entry : "1", "EX", "600"};
    return rconn_command(c, 5, argv, NULL, NULL, err);
}

void cli_random_hex(char *buf, int n)
{
    unsigned char b[64];
    int k = (n + 1) / 2 > 64 ? 64 : (n + 1) / 2;
    if (getrandom(b, (size_t)k, 0) != k) { /* no entropy: time and address still differ */
        uint64_t x = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)buf;
        for (int i = 0; i < k; i++, x = x * 6364136223846793005u + 1442695040888963407u)
            b[i] = (unsigned char)(x >> 56);
    }
    for (int i = 0; i < n && i / 2 < k; i++)
        buf[i] = "0123456789abcdef"[(b[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    buf[n] = 0;
}

/* ---- rendering ---- */

#define DIM "\033[2m"
#define RESET "\033[0m"

void cli_render_init(struct cli_render *r, FILE *out, FILE *info, bool color)
{
    memset(r, 0, sizeof *r);
    r->out = out;
    r->info = info;
    r->color = color;
    r->at_bol = true;
}

void cli_render_free(struct cli_render *r)
{
    free(r->content);
    r->content = NULL;
    r->n_content = r->cap_content = 0;
}

static void put_text(struct cli_render *r, const char *s, size_t n)
{
    if (!n)
        return;
    if (r->out)
        fwrite(s, 1, n, r->out);
    r->at_bol = s[n - 1] == '\n';
}

static void newline(struct cli_render *r)
{
    if (!r->at_bol)
        put_text(r, "\n", 1);
}

static void enter_reasoning(struct cli_render *r)
{
    if (r->in_reasoning)
        return;
    r->in_reasoning = true;
    if (r->color && r->out)
        fputs(DIM, r->out);
    else {
        newline(r);
        put_text(r, "[reasoning]\n", 12);
    }
}

static void leave_reasoning(struct cli_render *r)
{
    if (!r->in_reasoning)
        return;
    r->in_reasoning = false;
    if (r->color) {
        if (r->out)
            fputs(RESET, r->out);
        newline(r);
    } else {
        newline(r);
        put_text(r, "[/reasoning]\n", 13);
    }
}

static int keep_content(struct cli_render *r, const char *s, size_t n)
{
    if (r->n_content + n + 1 > r->cap_content) {
        size_t cap = (r->n_content + n + 1) * 2;
        char *g = realloc(r->content, cap);
        if (!g)
            return -1;
        r->content = g;
        r->cap_content = cap;
    }
    memcpy(r->content + r->n_content, s, n);
    r->n_content += n;
    r->content[r->n_content] = 0;
    return 0;
}

static long long num(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(v) ? (long long)v->valuedouble : 0;
}

void cli_render_stop(struct cli_render *r)
{
    leave_reasoning(r);
    newline(r);
    if (r->out)
        fflush(r->out);
}

int cli_render_event(struct cli_render *r, const char *json, size_t len, struct rl_err *err)
{
    cJSON *ev = cJSON_ParseWithLength(json, len);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(ev, "type");
    if (!ev || !cJSON_IsString(type)) {
        cJSON_Delete(ev);
        return rl_errf(err, RL_EFORMAT, "an event that is not a JSON object with a type");
    }
    if (!strcmp(type->valuestring, "delta")) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(ev, "delta");
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(d, "reasoning_content");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(d, "content");
        if (cJSON_IsString(rs) && rs->valuestring[0] && !r->hide_reasoning) {
            enter_reasoning(r);
            put_text(r, rs->valuestring, strlen(rs->valuestring));
        }
        if (cJSON_IsString(ct) && ct->valuestring[0]) {
            leave_reasoning(r);
            size_t n = strlen(ct->valuestring);
            put_text(r, ct->valuestring, n);
            if (keep_content(r, ct->valuestring, n)) {
                cJSON_Delete(ev);
                return rl_errf(err, RL_ENOMEM, "out of memory");
            }
        }
    } else if (!strcmp(type->valuestring, "error")) {
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(ev, "code");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ev, "message");
        snprintf(r->code, sizeof r->code, "%s", cJSON_IsString(code) ? code->valuestring : "?");
        leave_reasoning(r);
        newline(r);
        if (r->info)
            fprintf(r->info, "[error] %s: %s\n", r->code,
                    cJSON_IsString(msg) ? msg->valuestring : "");
    } else if (!strcmp(type->valuestring, "done")) {
        const cJSON *fin = cJSON_GetObjectItemCaseSensitive(ev, "finish_reason");
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(ev, "usage");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(ev, "timings");
        snprintf(r->finish, sizeof r->finish, "%s", cJSON_IsString(fin) ? fin->valuestring : "?");
        r->done = true;
        leave_reasoning(r);
        newline(r);
        if (r->info)
            fprintf(r->info,
                    "[done] finish_reason=%s prompt_tokens=%lld completion_tokens=%lld "
                    "reasoning_tokens=%lld cached_prompt_tokens=%lld cached=%s queue_ms=%lld "
                    "ttft_ms=%lld total_ms=%lld\n",
                    r->finish, num(u, "prompt_tokens"), num(u, "completion_tokens"),
                    num(u, "reasoning_tokens"), num(u, "cached_prompt_tokens"),
                    cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ev, "cached")) ? "true" : "false",
                    num(t, "queue_ms"), num(t, "ttft_ms"), num(t, "total_ms"));
    }
    if (r->out)
        fflush(r->out);
    if (r->info)
        fflush(r->info);
    cJSON_Delete(ev);
    return 0;
}

int cli_any_key(struct rconn *c, const char *pattern, long *found, struct rl_err *err)
{
    *found = 0;
    /* a cluster's keys are spread over its masters: SCAN each */
    for (int m = 0; m < rconn_n_masters(c) && !*found; m++) {
        char cursor[32] = "0";
        for (int it = 0; it < 10000; it++) {
            const char *argv[] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
            struct rconn_reply *r = NULL;
            int rc = rconn_command_on(c, m, 6, argv, NULL, &r, err);
            if (rc < 0) {
                rconn_reply_free(r);
                return rc;
            }
            if (!r || r->type != RCONN_ARRAY || r->n_elem != 2 || r->elem[0].type != RCONN_STRING ||
                r->elem[1].type != RCONN_ARRAY) {
                rconn_reply_free(r);
                return rl_errf(err, RL_EFORMAT, "SCAN: unexpected reply");
            }
            snprintf(cursor, sizeof cursor, "%s", r->elem[0].str);
            *found += (long)r->elem[1].n_elem;
            rconn_reply_free(r);
            if (*found > 0 || !strcmp(cursor, "0"))
                break;
        }
    }
    return 0;
}
