/* worker/cli/cmd_client.c - the queue's client side from a terminal:
 * `redlm enqueue` (a job from flags or a file), `redlm tail ID` (a
 * request's events as text), `redlm cancel ID` and `redlm chat` (a
 * conversation through the queue).
 *
 * Where jobs go: by default to <prefix>requests, the dispatcher's stream,
 * which routes `mode` (think, no_think, auto) to a pool; `--pool NAME`
 * writes to <prefix>jobs:NAME instead, straight to the workers of that
 * pool. Either way the job is checked here first with job_parse, the
 * worker's own parser, so a bad job is refused with the code and sentence
 * the worker would have put in its error event, before anything is sent.
 * Every job leaves with an id (the given one, or a generated one), so the
 * command can print it and follow redlm:out:<id>.
 *
 * "mode": "auto" is the dispatcher's to resolve: a job for the dispatcher
 * may carry it even where this build's job_parse (the worker's) knows only
 * think and no_think; such a job is checked with the mode left out.
 *
 * Chat keeps the conversation (a messages array) here, in the client: each
 * turn is a new job with the whole history, so any worker can answer it and
 * the prefix cache makes the repeated history cheap. Ctrl-C while an answer
 * streams sets redlm:cancel:<id> and waits for the job's done event (the
 * worker stops it within a step); the cancelled turn is dropped from the
 * history. SIGINT only sets a flag (this program's one global: a signal
 * handler can reach nothing else); the loops read it. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "cli_redis.h"
#include "rcluster.h"
#include "chat_input.h"
#include "cli_util.h"
#include "cmds.h"
#include "job.h"

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    g_interrupted = 1;
}

/* SIGINT without SA_RESTART, so a prompt's read returns at once. */
static void catch_sigint(void)
{
    cli_on_signal(SIGINT, on_sigint);
}

static bool use_color(const char *when, FILE *f)
{
    if (when && !strcmp(when, "always"))
        return true;
    if (when && !strcmp(when, "never"))
        return false;
    const char *nc = getenv("NO_COLOR");
    return isatty(fileno(f)) && !(nc && *nc);
}

/* ---- checking and sending a job ---- */

/* Checks text as the worker would (and the dispatcher, for "mode": "auto"
 * when to_dispatcher). On success *out is the text to send, with the id
 * added when the job had none (malloc'd), and id the job's id. On a bad
 * job returns -RL_EINVAL with *code set and err the sentence. */
static int check_job(const char *text, size_t len, bool to_dispatcher, char **out,
                     char id[JOB_ID_MAX + 1], const char **code, struct rl_err *err)
{
    struct job_opts jo;
    job_opts_default(&jo);
    struct job *j = NULL;
    struct job_fault fault = {0};
    *out = NULL;
    *code = NULL;
    int rc = job_parse(text, len, &jo, &j, &fault, err);
    cJSON *obj = NULL;
    if (rc == -RL_EINVAL && to_dispatcher && fault.code == EV_CODE_BAD_VALUE &&
        !strcmp(fault.field, "mode")) {
        obj = cJSON_ParseWithLength(text, len);
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(obj, "mode");
        if (cJSON_IsString(m) && !strcmp(m->valuestring, "auto")) {
            cJSON *copy = cJSON_Duplicate(obj, 1);
            cJSON_DeleteItemFromObjectCaseSensitive(copy, "mode");
            char *t = copy ? cJSON_PrintUnformatted(copy) : NULL;
            cJSON_Delete(copy);
            if (!t) {
                cJSON_Delete(obj);
                return rl_errf(err, RL_ENOMEM, "out of memory");
            }
            rc = job_parse(t, strlen(t), &jo, &j, &fault, err);
            free(t);
        }
    }
    if (rc) {
        cJSON_Delete(obj);
        *code = ev_code_name(fault.code ? fault.code : EV_CODE_INTERNAL);
        return rc;
    }
    snprintf(id, JOB_ID_MAX + 1, "%s", j->id);
    bool add_id = j->id_generated;
    job_free(j);
    if (!add_id) {
        cJSON_Delete(obj);
        *out = malloc(len + 1);
        if (!*out)
            return rl_errf(err, RL_ENOMEM, "out of memory");
        memcpy(*out, text, len);
        (*out)[len] = 0;
        return 0;
    }
    if (!obj)
        obj = cJSON_ParseWithLength(text, len);
    if (!obj || !cJSON_AddStringToObject(obj, "id", id) || !(*out = cJSON_PrintUnformatted(obj))) {
        cJSON_Delete(obj);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    cJSON_Delete(obj);
    return 0;
}

/* XADD the job to <prefix>requests, <prefix>requests:<tenant> (a tenant's
 * own intake: the dispatcher's option tenants) or <prefix>jobs:<pool>. */
static int send_job_to(struct rconn *c, const char *prefix, const char *pool, const char *tenant,
                       const char *text, char entry[RCONN_ID_MAX], struct rl_err *err)
{
    char key[CLI_KEY_MAX];
    char rest[CLI_KEY_MAX];
    if (tenant)
        snprintf(rest, sizeof rest, "requests:%s", tenant);
    else
        snprintf(rest, sizeof rest, pool ? "jobs:%s" : "requests", pool);
    int rc = rcl_queue_key(key, CLI_KEY_MAX, rconn_is_cluster(c), prefix, rest) < 0
                 ? rl_errf(err, RL_EINVAL, "key %s%s is too long", prefix, rest) : 0;
    if (rc)
        return rc;
    const char *names[] = {"job"}, *values[] = {text};
    size_t lens[] = {strlen(text)};
    return rconn_xadd(c, key, "*", 0, 1, names, values, lens, entry, NULL, err);
}

static int send_job(struct rconn *c, const char *prefix, const char *pool, const char *text,
                    char entry[RCONN_ID_MAX], struct rl_err *err)
{
    return send_job_to(c, prefix, pool, NULL, text, entry, err);
}

static int check_pool_name(const char *pool, struct rl_err *err)
{
    size_t n = strlen(pool);
    if (!n || n > JOB_POOL_MAX || strspn(pool, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                               "0123456789_-") != n)
        return rl_errf(err, RL_EINVAL, "--pool: \"%s\" is not 1-64 of [A-Za-z0-9_-]", pool);
    return 0;
}

/* ---- following a request ---- */

struct follow_opts {
    bool json;          /* raw events, one per line */
    bool color;
    bool hide_reasoning;
    int timeout_s;      /* give up after this long without an event; 0 = never */
    bool cancel_on_int; /* Ctrl-C cancels the job (chat); else it just stops */
    bool hint;          /* no event after 2 s: say why, if no dispatcher / worker runs */
    const char *pool;   /* where the job went: a pool, or NULL for the dispatcher's stream */
};

/* Said once when a request has had no event for 2 s: a job waits silently
 * in a stream nobody reads, so name the missing reader and the way out. */
static void say_why_waiting(struct rconn *c, const char *prefix, const char *pool)
{
    char pat[CLI_KEY_MAX];
    long n = 0;
    struct rl_err e;
    if (!pool) {
        snprintf(pat, sizeof pat, "%sdispatcher:*", prefix);
        if (!cli_any_key(c, pat, &n, &e) && n == 0)
            fprintf(stderr, "[waiting: no dispatcher is running (no %s heartbeat); the job waits in "
                            "%srequests. Start redlm-dispatcher, or send to a pool directly: --pool fast]\n",
                    pat, prefix);
    }
    snprintf(pat, sizeof pat, "%sworker:*", prefix);
    if (!cli_any_key(c, pat, &n, &e) && n == 0)
        fprintf(stderr, "[waiting: no worker is running (no %s heartbeat); start redlm-worker]\n", pat);
}

/* Reads <prefix>out:<id> from the start and shows it until done. r is
 * initialised here; the caller frees it. Returns 0 when done came, 1 when
 * interrupted or timed out, negative on a Redis failure. */
static int follow(struct rconn *c, const char *prefix, const char *id, const struct follow_opts *fo,
                  struct cli_render *r, struct rl_err *err)
{
    char key[CLI_KEY_MAX];
    int rc = rcl_tagged_key(key, CLI_KEY_MAX, rconn_is_cluster(c), prefix, "out:", id) < 0
                 ? rl_errf(err, RL_EINVAL, "key %sout:%s is too long", prefix, id) : 0;
    if (rc)
        return rc;
    /* --json: the renderer only tracks done and the finish reason */
    cli_render_init(r, fo->json ? NULL : stdout, fo->json ? NULL : stderr, fo->color);
    r->hide_reasoning = fo->hide_reasoning;
    char last[RCONN_ID_MAX] = "0-0";
    int64_t t_event = rl_wall_ms(), t_cancel = 0;
    bool any_event = false, hinted = !fo->hint;
    while (!r->done) {
        if (!hinted && !any_event && rl_wall_ms() - t_event > 2000) {
            hinted = true;
            say_why_waiting(c, prefix, fo->pool);
        }
        if (g_interrupted) {
            g_interrupted = 0;
            if (!fo->cancel_on_int || t_cancel) {
                cli_render_stop(r);
                return 1; /* a second Ctrl-C stops waiting */
            }
            if ((rc = cli_cancel(c, prefix, id, NULL, err)))
                return rc;
            t_cancel = rl_wall_ms();
        }
        /* a cancel nobody acts on (no worker has the job): stop waiting */
        if (t_cancel && rl_wall_ms() - t_cancel > 5000) {
            cli_render_stop(r);
            fprintf(stderr, "[cancel requested; no worker answered within 5 s]\n");
            return 1;
        }
        if (fo->timeout_s && rl_wall_ms() - t_event > (int64_t)fo->timeout_s * 1000) {
            cli_render_stop(r);
            rl_errf(err, RL_EIO, "no event for %s within %d s", id, fo->timeout_s);
            return 1;
        }
        struct rconn_entries es;
        /* short blocks keep Ctrl-C responsive: hiredis retries a read
         * interrupted by the signal, so the flag is seen after the block */
        rc = cli_xread(c, key, last, 256, 200, &es, err);
        if (rc == -RL_EIO) { /* Redis went away: rconn reconnects on the next call */
            struct timespec ts = {0, 200 * 1000000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (rc) {
            cli_render_stop(r);
            return rc;
        }
        for (int i = 0; i < es.n && !r->done; i++) {
            memcpy(last, es.v[i].id, sizeof last);
            size_t n;
            const char *ev = rconn_entry_field(&es.v[i], "event", &n);
            if (!ev)
                continue;
            t_event = rl_wall_ms();
            any_event = true;
            if (fo->json) {
                fwrite(ev, 1, n, stdout);
                fputc('\n', stdout);
                fflush(stdout);
            }
            struct rl_err e2;
            if (cli_render_event(r, ev, n, &e2))
                fprintf(stderr, "[skipped an event: %s]\n", e2.msg);
        }
        rconn_entries_free(&es);
    }
    return 0;
}

/* Exit status of a followed request: 0 done (stop, length, cancelled,
 * deadline), 1 error. */
static int follow_status(const struct cli_render *r)
{
    return r->code[0] || !strcmp(r->finish, "error") ? 1 : 0;
}

/* ---- redlm enqueue ---- */

static void enqueue_usage(void)
{
    fprintf(stderr,
            "usage: redlm enqueue [--message TEXT | --prompt TEXT | --prompt-ids 1,2 | --file F|-] [options]\n"
            "Sends one job and prints its id. The job is checked first, exactly as the\n"
            "worker checks it; a bad one is refused with its code (exit status 3).\n"
            "  --message TEXT       a user message (repeatable); --system TEXT a system one\n"
            "  --prompt TEXT        raw text, tokenized as is\n"
            "  --prompt-ids 1,2,3   token ids\n"
            "  --file F             the job as JSON (- = stdin); flags set fields on top\n"
            "  --id ID              the job id (default: generated)\n"
            "  --mode think|no_think|auto   auto: the dispatcher decides\n"
            "  --model NAME         the served model (needed when several are served)\n"
            "  --max-tokens N  --temperature T  --top-p P  --top-k K  --min-p P  --seed S\n"
            "  --stop TEXT (repeatable)  --ignore-eos  --max-thinking-tokens N  --logprobs N\n"
            "  --priority N  --deadline-ms UNIX_MS  --stream-ttl S  --no-cache  --metadata JSON\n"
            "  --pool NAME          straight to <prefix>jobs:NAME (default: <prefix>requests,\n"
            "                       the dispatcher's stream)\n"
            "  --tenant NAME        to <prefix>requests:NAME, a tenant's own stream (dispatcher\n"
            "                       option tenants); the id printed is NAME:<id>\n"
            "  --follow             then show the events, as redlm tail does\n"
            "  --json               with --follow: raw events\n"
            "%s",
            cli_redis_help);
}

/* Adds a number field parsed from v. */
static int set_number(cJSON *o, const char *name, const char *flag, const char *v, struct rl_err *err)
{
    char *end;
    errno = 0;
    double d = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || errno)
        return rl_errf(err, RL_EINVAL, "%s needs a number", flag);
    cJSON_DeleteItemFromObjectCaseSensitive(o, name);
    return cJSON_AddNumberToObject(o, name, d) ? 0 : rl_errf(err, RL_ENOMEM, "out of memory");
}

static int set_string(cJSON *o, const char *name, const char *v)
{
    cJSON_DeleteItemFromObjectCaseSensitive(o, name);
    return cJSON_AddStringToObject(o, name, v) ? 0 : -RL_ENOMEM;
}

static int add_message(cJSON *o, const char *role, const char *text, struct rl_err *err)
{
    cJSON *ms = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!ms && !(ms = cJSON_AddArrayToObject(o, "messages")))
        return rl_errf(err, RL_ENOMEM, "out of memory");
    if (!cJSON_IsArray(ms))
        return rl_errf(err, RL_EINVAL, "--message: the file's messages is not an array");
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", text)) {
        cJSON_Delete(m);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    cJSON_AddItemToArray(ms, m);
    return 0;
}

static char *read_all(FILE *f, size_t *n)
{
    size_t cap = 4096, len = 0;
    char *b = malloc(cap);
    while (b) {
        size_t k = fread(b + len, 1, cap - len - 1, f);
        len += k;
        if (k == 0)
            break;
        if (cap - len - 1 == 0) {
            char *g = realloc(b, cap * 2);
            if (!g) {
                free(b);
                return NULL;
            }
            b = g;
            cap *= 2;
        }
    }
    if (b) {
        b[len] = 0;
        *n = len;
    }
    return b;
}

/* What `redlm enqueue` was asked: the fields its flags set, on top of an
 * optional file, and what to do with the job. */
struct enqueue_args {
    struct cli_redis_args ra;
    const char *file, *pool; /* pool NULL: the dispatcher's stream */
    const char *tenant;      /* --tenant: <prefix>requests:<tenant>, ids "<tenant>:<id>" */
    bool follow, json, help;
    cJSON *o; /* the fields the flags set (owned by cmd_enqueue) */
};

/* The flags that set a number field of the job. */
static const struct {
    const char *flag, *field;
} enqueue_nums[] = {
    {"--max-tokens", "max_tokens"}, {"--temperature", "temperature"}, {"--top-p", "top_p"},
    {"--top-k", "top_k"}, {"--min-p", "min_p"}, {"--seed", "seed"},
    {"--max-thinking-tokens", "max_thinking_tokens"}, {"--logprobs", "logprobs"},
    {"--priority", "priority"}, {"--deadline-ms", "deadline_ms"},
    {"--stream-ttl", "stream_ttl_s"}, {"--presence-penalty", "presence_penalty"},
    {"--frequency-penalty", "frequency_penalty"},
    {"--repetition-penalty", "repetition_penalty"},
};

static bool enqueue_bare(const char *f)
{
    return !strcmp(f, "--ignore-eos") || !strcmp(f, "--no-cache") || !strcmp(f, "--follow") ||
           !strcmp(f, "--json") || !strcmp(f, "-h") || !strcmp(f, "--help");
}

static int set_prompt_ids(cJSON *o, const char *v, struct rl_err *err)
{
    int32_t *ids;
    int n;
    int rc = cli_parse_ids(v, &ids, &n, err);
    if (rc)
        return rc;
    cJSON *a = cJSON_CreateIntArray((const int *)ids, n);
    free(ids);
    cJSON_DeleteItemFromObjectCaseSensitive(o, "prompt_ids");
    if (!a || !cJSON_AddItemToObject(o, "prompt_ids", a))
        return rl_errf(err, RL_ENOMEM, "out of memory");
    return 0;
}

static int add_stop(cJSON *o, const char *v, struct rl_err *err)
{
    cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (!s)
        s = cJSON_AddArrayToObject(o, "stop");
    if (!cJSON_IsArray(s))
        return rl_errf(err, RL_EINVAL, "--stop: the file's stop is not an array");
    cJSON_AddItemToArray(s, cJSON_CreateString(v));
    return 0;
}

static int set_metadata(cJSON *o, const char *v, struct rl_err *err)
{
    cJSON *m = cJSON_Parse(v);
    if (!m)
        return rl_errf(err, RL_EINVAL, "--metadata: not JSON");
    cJSON_DeleteItemFromObjectCaseSensitive(o, "metadata");
    cJSON_AddItemToObject(o, "metadata", m);
    return 0;
}

/* A flag that takes a value v (NULL at the end of argv). Returns 0 or a
 * negative code when it was one, 1 when f is not such a flag. */
static int enqueue_value_flag(struct enqueue_args *ea, const char *f, const char *v,
                              struct rl_err *err)
{
    for (size_t k = 0; k < sizeof enqueue_nums / sizeof enqueue_nums[0]; k++)
        if (!strcmp(f, enqueue_nums[k].flag))
            return set_number(ea->o, enqueue_nums[k].field, f, v, err);
    if (!strcmp(f, "--file")) /* read before the flags */
        return 0;
    if (!strcmp(f, "--pool")) {
        ea->pool = v;
        return 0;
    }
    if (!strcmp(f, "--tenant") && v) {
        ea->tenant = v;
        return 0;
    }
    if (!v)
        return enqueue_bare(f) ? 1 : rl_errf(err, RL_EINVAL, "%s needs a value (or is unknown)", f);
    if (!strcmp(f, "--message") || !strcmp(f, "-m"))
        return add_message(ea->o, "user", v, err);
    if (!strcmp(f, "--system"))
        return add_message(ea->o, "system", v, err);
    if (!strcmp(f, "--prompt"))
        return set_string(ea->o, "prompt", v);
    if (!strcmp(f, "--id"))
        return set_string(ea->o, "id", v);
    if (!strcmp(f, "--mode"))
        return set_string(ea->o, "mode", v);
    if (!strcmp(f, "--model"))
        return set_string(ea->o, "model", v);
    if (!strcmp(f, "--prompt-ids"))
        return set_prompt_ids(ea->o, v, err);
    if (!strcmp(f, "--stop"))
        return add_stop(ea->o, v, err);
    if (!strcmp(f, "--metadata"))
        return set_metadata(ea->o, v, err);
    return 1;
}

/* A flag without a value; -h / --help sets ea->help. */
static int enqueue_bare_flag(struct enqueue_args *ea, const char *f, struct rl_err *err)
{
    cJSON *o = ea->o;
    if (!strcmp(f, "--ignore-eos"))
        cJSON_DeleteItemFromObjectCaseSensitive(o, "ignore_eos"), cJSON_AddTrueToObject(o, "ignore_eos");
    else if (!strcmp(f, "--no-cache"))
        cJSON_DeleteItemFromObjectCaseSensitive(o, "cache"), cJSON_AddFalseToObject(o, "cache");
    else if (!strcmp(f, "--follow"))
        ea->follow = true;
    else if (!strcmp(f, "--json"))
        ea->json = true;
    else if (!strcmp(f, "-h") || !strcmp(f, "--help"))
        ea->help = true;
    else
        return rl_errf(err, RL_EINVAL, "unknown option %s", f);
    return 0;
}

/* The --file of argv (the last one), found before the other flags so
 * that they go on top of the file whatever their order. */
static const char *enqueue_file(int argc, char **argv)
{
    const char *file = NULL;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--file") && i + 1 < argc)
            file = argv[++i];
    return file;
}

/* Every flag of argv, in order, stopping at the first bad one or at
 * --help. */
static int enqueue_flags(struct enqueue_args *ea, int argc, char **argv, struct rl_err *err)
{
    int rc = 0;
    for (int i = 1; i < argc && !rc && !ea->help; i++) {
        const char *f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int took = cli_redis_flag(&ea->ra, argc, argv, &i, err);
        if (took) {
            rc = took < 0 ? took : 0;
            continue;
        }
        rc = enqueue_value_flag(ea, f, v, err);
        if (rc != 1)
            i++; /* its value */
        else
            rc = enqueue_bare_flag(ea, f, err);
    }
    return rc;
}

/* The job file (- = stdin) into *base; a failure is said on stderr. */
static int read_job_file(const char *file, char **base)
{
    FILE *f = strcmp(file, "-") ? fopen(file, "rb") : stdin;
    size_t n = 0;
    if (!f) {
        fprintf(stderr, "redlm enqueue: %s: %s\n", file, strerror(errno));
        return -1;
    }
    *base = read_all(f, &n);
    if (f != stdin)
        fclose(f);
    if (!*base) {
        fprintf(stderr, "redlm enqueue: %s: out of memory\n", file);
        return -1;
    }
    return 0;
}

/* The text to check: the file as it is when no flag changes it (so its
 * own faults are reported exactly), else the file's object with the flags
 * on top (*o may then be replaced by it). Takes *base when it becomes the
 * text. NULL when out of memory. */
static char *job_text(cJSON **o, char **base)
{
    char *text = NULL;
    if (*base && !cJSON_GetArraySize(*o)) {
        text = *base;
        *base = NULL;
        return text;
    }
    if (*base) {
        cJSON *b = cJSON_Parse(*base);
        if (!cJSON_IsObject(b)) {
            cJSON_Delete(b);
            text = *base; /* job_parse names the fault */
            *base = NULL;
            return text;
        }
        for (cJSON *it = (*o)->child; it; it = it->next)
            cJSON_DeleteItemFromObjectCaseSensitive(b, it->string);
        while ((*o)->child) {
            cJSON *it = cJSON_DetachItemViaPointer(*o, (*o)->child);
            cJSON_AddItemToObject(b, it->string, it);
        }
        cJSON_Delete(*o);
        *o = b;
    }
    return cJSON_PrintUnformatted(*o);
}

/* Checks text as the worker would, sends it, prints its id and, with
 * --follow, its events. Returns the exit status. */
static int enqueue_send(const struct enqueue_args *ea, const char *text, struct rconn **c)
{
    struct rl_err err = {0};
    char id[JOB_ID_MAX + 1], *send = NULL;
    const char *code;
    if (check_job(text, strlen(text), !ea->pool, &send, id, &code, &err)) {
        if (code)
            fprintf(stderr, "redlm enqueue: %s: %s\n", code, err.msg);
        else
            fprintf(stderr, "redlm enqueue: %s\n", err.msg);
        return code ? 3 : 1;
    }
    char entry[RCONN_ID_MAX];
    int rc = cli_redis_connect(c, &ea->ra, "redlm-enqueue", &err);
    if (!rc)
        rc = send_job_to(*c, ea->ra.prefix, ea->pool, ea->tenant, send, entry, &err);
    free(send);
    if (rc) {
        fprintf(stderr, "redlm enqueue: %s\n", err.msg);
        return 1;
    }
    if (ea->tenant) { /* the dispatcher puts it in the tenant's namespace */
        char ns[JOB_ID_MAX + 1];
        if (job_tenant_id(ea->tenant, id, ns)) {
            fprintf(stderr, "redlm enqueue: id %s is too long for tenant %s\n", id, ea->tenant);
            return 1;
        }
        snprintf(id, sizeof id, "%s", ns);
    }
    printf("%s\n", id);
    fflush(stdout);
    if (!ea->follow)
        return 0;
    catch_sigint();
    struct follow_opts fo = {.json = ea->json, .color = use_color(NULL, stdout), .hint = true, .pool = ea->pool};
    struct cli_render r;
    rc = follow(*c, ea->ra.prefix, id, &fo, &r, &err);
    if (rc < 0)
        fprintf(stderr, "redlm enqueue: %s\n", err.msg);
    int status = rc ? 1 : follow_status(&r);
    cli_render_free(&r);
    return status;
}

int cmd_enqueue(int argc, char **argv)
{
    struct enqueue_args ea = {.o = cJSON_CreateObject()};
    cli_redis_args_default(&ea.ra);
    struct rl_err err = {0};
    char *base = NULL, *text = NULL;
    struct rconn *c = NULL;
    int status = 1;
    if (!ea.o)
        goto out;
    if ((ea.file = enqueue_file(argc, argv)) && read_job_file(ea.file, &base))
        goto out;
    int rc = enqueue_flags(&ea, argc, argv, &err);
    if (ea.help) {
        enqueue_usage();
        status = 0;
        goto out;
    }
    if (!rc && ea.tenant && (ea.pool || !job_tenant_ok(ea.tenant)))
        rc = rl_errf(&err, RL_EINVAL, "--tenant: \"%s\" is not 1-%d of [A-Za-z0-9_-], or "
                     "given with --pool", ea.tenant, JOB_TENANT_MAX);
    if (rc || (ea.pool && check_pool_name(ea.pool, &err))) {
        fprintf(stderr, "redlm enqueue: %s\n", err.msg);
        status = 2;
        goto out;
    }
    if (!ea.file && !cJSON_GetArraySize(ea.o)) {
        enqueue_usage();
        status = 2;
        goto out;
    }
    if (!(text = job_text(&ea.o, &base))) {
        fprintf(stderr, "redlm enqueue: out of memory\n");
        goto out;
    }
    status = enqueue_send(&ea, text, &c);
out:
    rconn_free(c);
    cJSON_Delete(ea.o);
    free(base);
    free(text);
    return status;
}

/* ---- redlm tail ---- */

static void tail_usage(void)
{
    fprintf(stderr,
            "usage: redlm tail ID [options]\n"
            "Shows request ID's events from the start until done: the answer on stdout,\n"
            "reasoning apart (dim on a terminal, else between [reasoning] and [/reasoning]\n"
            "lines), then finish reason and usage on stderr. Exit status 1 on an error event.\n"
            "  --json               the raw events, one JSON per line\n"
            "  --no-reasoning       leave the reasoning out\n"
            "  --color auto|always|never\n"
            "  --timeout S          give up after S seconds without an event (default: wait)\n"
            "%s",
            cli_redis_help);
}

int cmd_tail(int argc, char **argv)
{
    struct cli_redis_args ra;
    cli_redis_args_default(&ra);
    struct rl_err err = {0};
    struct follow_opts fo = {0};
    const char *id = NULL, *color = NULL;
    int rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *f = argv[i];
        int took = cli_redis_flag(&ra, argc, argv, &i, &err);
        if (took) {
            rc = took < 0 ? took : 0;
            continue;
        }
        long x;
        if (!strcmp(f, "--json"))
            fo.json = true;
        else if (!strcmp(f, "--no-reasoning"))
            fo.hide_reasoning = true;
        else if (!strcmp(f, "--color") && i + 1 < argc)
            color = argv[++i];
        else if (!strcmp(f, "--timeout") && i + 1 < argc) {
            if (!(rc = cli_parse_int(argv[++i], 0, 1 << 30, &x, f, &err)))
                fo.timeout_s = (int)x;
        } else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            tail_usage();
            return 0;
        } else if (f[0] == '-')
            rc = rl_errf(&err, RL_EINVAL, "unknown option %s (or it needs a value)", f);
        else if (!id)
            id = f;
        else
            rc = rl_errf(&err, RL_EINVAL, "one ID only (got %s and %s)", id, f);
    }
    if (!rc && !id) {
        tail_usage();
        return 2;
    }
    if (rc) {
        fprintf(stderr, "redlm tail: %s\n", err.msg);
        return 2;
    }
    fo.color = use_color(color, stdout);
    struct rconn *c;
    if (cli_redis_open(&c, &ra, "tail"))
        return 1;
    catch_sigint();
    struct cli_render r;
    rc = follow(c, ra.prefix, id, &fo, &r, &err);
    int status = rc ? 1 : follow_status(&r);
    if (rc < 0 || (rc == 1 && err.code))
        fprintf(stderr, "redlm tail: %s\n", err.msg);
    cli_render_free(&r);
    rconn_free(c);
    return status;
}

/* ---- redlm cancel ---- */

int cmd_cancel(int argc, char **argv)
{
    struct cli_redis_args ra;
    cli_redis_args_default(&ra);
    struct rl_err err = {0};
    const char *ids[64];
    int n = 0, rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        int took = cli_redis_flag(&ra, argc, argv, &i, &err);
        if (took)
            rc = took < 0 ? took : 0;
        else if (argv[i][0] == '-' || n == 64)
            rc = rl_errf(&err, RL_EINVAL, "usage: redlm cancel ID... [--redis HOST:PORT] [--prefix P]");
        else
            ids[n++] = argv[i];
    }
    if (!rc && !n)
        rc = rl_errf(&err, RL_EINVAL, "usage: redlm cancel ID... [--redis HOST:PORT] [--prefix P]");
    if (rc) {
        fprintf(stderr, "redlm cancel: %s\n", err.msg);
        return 2;
    }
    struct rconn *c;
    if (cli_redis_open(&c, &ra, "cancel"))
        return 1;
    for (int i = 0; i < n && !rc; i++)
        rc = cli_cancel(c, ra.prefix, ids[i], NULL, &err);
    if (rc)
        fprintf(stderr, "redlm cancel: %s\n", err.msg);
    rconn_free(c);
    return rc ? 1 : 0;
}

/* ---- redlm chat ---- */

static void chat_usage(void)
{
    fprintf(stderr,
            "usage: redlm chat [options]\n"
            "A conversation through the queue. Type a message and Enter; the answer streams\n"
            "as it comes, reasoning dim. On a terminal the line can be edited (emacs keys,\n"
            "arrows, Up/Down for history, ~/.editrc). A line ending in \\ continues on the\n"
            "next; \"\"\" opens a block of lines that a line ending in \"\"\" closes.\n"
            "Commands: /think, /no_think, /auto (the mode of the next turns), /reset (forget\n"
            "the conversation), /exit (or Ctrl-D). Ctrl-C while an answer streams cancels it.\n"
            "  --mode think|no_think|auto   starting mode (default: the pool's, or auto)\n"
            "  --system TEXT        a system message first\n"
            "  --max-tokens N  --temperature T  --seed S  --ignore-eos (answers of max-tokens)\n"
            "  --pool NAME          straight to <prefix>jobs:NAME (default: <prefix>requests)\n"
            "  --model NAME         the served model (needed when several are served)\n"
            "  --no-reasoning       do not show the reasoning\n"
            "  --history FILE       line history file (default ~/.redlm_chat_history on a\n"
            "                       terminal; \"\" = this session only)\n"
            "  --color auto|always|never\n"
            "%s",
            cli_redis_help);
}

int cmd_chat(int argc, char **argv)
{
    struct cli_redis_args ra;
    cli_redis_args_default(&ra);
    struct rl_err err = {0};
    const char *pool = NULL, *system = NULL, *color = NULL, *mode = NULL;
    const char *max_tokens = NULL, *temperature = NULL, *seed = NULL, *hist_file = NULL;
    const char *model = NULL;
    bool hide = false, ignore_eos = false;
    int rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int took = cli_redis_flag(&ra, argc, argv, &i, &err);
        if (took) {
            rc = took < 0 ? took : 0;
            continue;
        }
        const char **dst = !strcmp(f, "--pool")          ? &pool
                           : !strcmp(f, "--system")      ? &system
                           : !strcmp(f, "--color")       ? &color
                           : !strcmp(f, "--mode")        ? &mode
                           : !strcmp(f, "--max-tokens")  ? &max_tokens
                           : !strcmp(f, "--temperature") ? &temperature
                           : !strcmp(f, "--seed")        ? &seed
                           : !strcmp(f, "--history")     ? &hist_file
                           : !strcmp(f, "--model")       ? &model
                                                         : NULL;
        if (dst && v) {
            *dst = v;
            i++;
        } else if (!strcmp(f, "--no-reasoning"))
            hide = true;
        else if (!strcmp(f, "--ignore-eos"))
            ignore_eos = true;
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            chat_usage();
            return 0;
        } else
            rc = rl_errf(&err, RL_EINVAL, "unknown option %s (or it needs a value)", f);
    }
    if (!rc && pool)
        rc = check_pool_name(pool, &err);
    if (!rc && mode && strcmp(mode, "think") && strcmp(mode, "no_think") && strcmp(mode, "auto"))
        rc = rl_errf(&err, RL_EINVAL, "--mode: \"%s\" is not think, no_think or auto", mode);
    if (rc) {
        fprintf(stderr, "redlm chat: %s\n", err.msg);
        return 2;
    }
    struct rconn *c;
    if (cli_redis_open(&c, &ra, "chat"))
        return 1;
    char cur_mode[16] = "";
    if (mode)
        snprintf(cur_mode, sizeof cur_mode, "%s", mode);
    cJSON *history = cJSON_CreateArray();
    cJSON *params = cJSON_CreateObject();
    struct rl_err e2;
    if (!history || !params ||
        (max_tokens && set_number(params, "max_tokens", "--max-tokens", max_tokens, &e2)) ||
        (temperature && set_number(params, "temperature", "--temperature", temperature, &e2)) ||
        (seed && set_number(params, "seed", "--seed", seed, &e2)) ||
        (model && set_string(params, "model", model))) {
        fprintf(stderr, "redlm chat: %s\n", history && params ? e2.msg : "out of memory");
        cJSON_Delete(history), cJSON_Delete(params);
        rconn_free(c);
        return 2;
    }
    if (ignore_eos)
        cJSON_AddTrueToObject(params, "ignore_eos");
    if (system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", system);
        cJSON_AddItemToArray(history, m);
    }
    bool tty = isatty(STDIN_FILENO);
    bool col = use_color(color, stdout);
    char session[9];
    cli_random_hex(session, 8);
    catch_sigint();
    if (tty)
        fprintf(stderr, "redlm chat on %s%s%s (mode %s). /think /no_think /auto /reset /exit\n",
                ra.addr, pool ? ", pool " : "", pool ? pool : "", cur_mode[0] ? cur_mode : "default");
    /* history: a file in $HOME on a terminal unless told otherwise */
    char hpath[4096] = "";
    if (hist_file)
        snprintf(hpath, sizeof hpath, "%s", hist_file);
    else if (tty && getenv("HOME") && *getenv("HOME"))
        snprintf(hpath, sizeof hpath, "%s/.redlm_chat_history", getenv("HOME"));
    struct chat_input *in = NULL;
    if (chat_input_create(&in, tty, col, hpath, &g_interrupted, &err)) {
        fprintf(stderr, "redlm chat: %s\n", err.msg);
        cJSON_Delete(history), cJSON_Delete(params);
        rconn_free(c);
        return 1;
    }
    struct text msg = {0};
    char *line = NULL;
    int status = 0;
    for (int turn = 1;; turn++) {
        g_interrupted = 0;
        int lr = chat_input_read(in, &msg);
        line = msg.p;
        if (lr == -RL_ENOMEM) {
            fprintf(stderr, "redlm chat: out of memory\n");
            status = 1;
            break;
        }
        if (lr == -1) {
            fputc('\n', stdout);
            break;
        }
        if (lr == -2) {
            fputs("\n(/exit or Ctrl-D to leave)\n", stdout);
            turn--;
            continue;
        }
        if (!line[0]) {
            turn--;
            continue;
        }
        if (line[0] == '/') {
            turn--;
            if (!strcmp(line, "/exit") || !strcmp(line, "/quit") || !strcmp(line, "/bye"))
                break;
            if (!strcmp(line, "/think") || !strcmp(line, "/no_think") || !strcmp(line, "/auto")) {
                snprintf(cur_mode, sizeof cur_mode, "%s", line + 1);
                printf("[mode %s]\n", cur_mode);
            } else if (!strcmp(line, "/reset")) {
                cJSON *keep = system ? cJSON_DetachItemFromArray(history, 0) : NULL;
                cJSON_Delete(history);
                history = cJSON_CreateArray();
                if (keep)
                    cJSON_AddItemToArray(history, keep);
                printf("[conversation cleared]\n");
            } else
                printf("[commands: /think /no_think /auto /reset /exit]\n");
            continue;
        }
        /* the job: the whole conversation plus this message */
        cJSON *user = cJSON_CreateObject();
        cJSON_AddStringToObject(user, "role", "user");
        cJSON_AddStringToObject(user, "content", line);
        cJSON_AddItemToArray(history, user);
        cJSON *job = cJSON_Duplicate(params, 1);
        char id[JOB_ID_MAX + 1];
        snprintf(id, sizeof id, "chat-%s-%d", session, turn);
        cJSON_AddStringToObject(job, "id", id);
        cJSON_AddItemToObject(job, "messages", cJSON_Duplicate(history, 1));
        if (cur_mode[0])
            cJSON_AddStringToObject(job, "mode", cur_mode);
        char *text = cJSON_PrintUnformatted(job);
        cJSON_Delete(job);
        char *send = NULL, got_id[JOB_ID_MAX + 1], entry[RCONN_ID_MAX];
        const char *code = NULL;
        rc = text ? check_job(text, strlen(text), !pool, &send, got_id, &code, &err)
                  : rl_errf(&err, RL_ENOMEM, "out of memory");
        free(text);
        if (!rc)
            rc = send_job(c, ra.prefix, pool, send, entry, &err);
        free(send);
        if (rc) {
            fprintf(stderr, "[not sent: %s%s%s]\n", code ? code : "", code ? ": " : "", err.msg);
            cJSON_DeleteItemFromArray(history, cJSON_GetArraySize(history) - 1);
            continue;
        }
        struct follow_opts fo = {.color = col, .hide_reasoning = hide, .cancel_on_int = true, .hint = true,
                                 .pool = pool};
        struct cli_render r;
        rc = follow(c, ra.prefix, id, &fo, &r, &err);
        if (rc < 0) {
            fprintf(stderr, "redlm chat: %s\n", err.msg);
            cli_render_free(&r);
            status = 1;
            break;
        }
        bool ok = rc == 0 && !r.code[0] &&
                  (!strcmp(r.finish, "stop") || !strcmp(r.finish, "length"));
        if (ok) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddStringToObject(a, "role", "assistant");
            cJSON_AddStringToObject(a, "content", r.content ? r.content : "");
            cJSON_AddItemToArray(history, a);
        } else {
            /* a cancelled or failed turn leaves the conversation as it was */
            if (!strcmp(r.finish, "cancelled") || rc == 1)
                printf("[cancelled]\n");
            cJSON_DeleteItemFromArray(history, cJSON_GetArraySize(history) - 1);
        }
        fflush(stdout);
        cli_render_free(&r);
    }
    text_free(&msg);
    chat_input_free(in);
    cJSON_Delete(history);
    cJSON_Delete(params);
    rconn_free(c);
    return status;
}
