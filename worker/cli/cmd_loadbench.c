/* worker/cli/cmd_loadbench.c - `redlm bench`: load a running deployment
 * through Redis the way web backends do, and measure it.
 *
 *   redlm bench --redis 127.0.0.1:6379 --clients 4 --requests 100 --out DIR/result.json
 *   redlm bench --rate 5 --sweep 1,2,4 --duration 30 --target pool:fast
 *
 * Each client is a thread with its own Redis connection. It takes the next
 * request number, builds the job (a synthetic user message of --prompt-len
 * words, or a line of --prompts FILE; max_tokens from --output-len, with
 * ignore_eos so the output has exactly that length; a mode drawn from the
 * --think/--auto fractions), XADDs it to the target stream and reads
 * <prefix>out:<id> with XREAD BLOCK from 0-0 until done, timestamping
 * every event on the monotonic clock. A --repeat fraction of the requests
 * re-sends one of --hot K fixed prompts at temperature 0: those are
 * deterministic, so a worker's (or the dispatcher's) result cache answers
 * them after the first time, and the done event says "cached": true.
 *
 * Closed loop (default): --clients N threads each send their next request
 * as soon as the previous one is done. Open loop (--rate R): arrival times
 * are drawn in advance from a Poisson process of R per second; --clients
 * bounds the requests in flight, and a request that finds every client
 * busy waits, its latency still counted from its arrival time (so a slow
 * system cannot hide its queueing by slowing the load: no coordinated
 * omission). --sweep runs the whole measurement once per level (clients,
 * or rates with --rate), one after the other, each from a drained system.
 *
 * A level ends at --requests requests or after --duration seconds of
 * issuing, whichever is first; requests in flight then finish or hit
 * --timeout (and are cancelled through <prefix>cancel:<id>). The first
 * --warmup requests of a level are sent but not counted. Everything is
 * bounded, and Redis must be on a loopback address or a unix socket: a
 * benchmark that floods a queue is not something to point at a shared
 * server by accident.
 *
 * Output: a summary JSON on stdout (one object, the levels without their
 * per-request records), a table on stderr, and with --out FILE the full
 * JSON (per-request records and per-second timelines included) plus two
 * PNG plots made by gnuplot next to it: latency.png (latency, time per
 * output token, tokens/s and requests/s against load, each on its own
 * axes) and throughput.png (output tokens/s and requests/s over time,
 * whole per-second buckets: the partial last one is left out). Without gnuplot
 * the JSON is still written and a warning says why there are no plots.
 * Exit status: 0 when the run completed (failed requests are part of the
 * measurement, counted by code), 1 when it could not run (Redis, no
 * consumer, files), 2 for bad usage.
 *
 * Threads: the main thread parses, starts the clients of a level, joins
 * them and does all the statistics (loadstats.c); a client thread writes
 * only its own requests' records, and takes request numbers under the
 * run's mutex. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "clock.h"
#include "cli_redis.h"
#include "cli_util.h"
#include "cmds.h"
#include "err.h"
#include "event.h"
#include "job.h"
#include "loadstats.h"
#include "rconn.h"
#include "xmux.h"
#include "rcluster.h"

extern char **environ;

#define LB_LEVELS_MAX 32
#define LB_CLIENTS_MAX 1024
#define LB_REQUESTS_MAX 1000000
#define LB_PROMPT_FILE_MAX (64 << 20)
#define LB_HOT_MAX 1024
#define LB_CODE_MAX 32

enum lb_target { LB_TARGET_DISPATCHER, LB_TARGET_POOL, LB_TARGET_POOLS };
enum lb_mode { LB_MODE_NO_THINK, LB_MODE_THINK, LB_MODE_AUTO };
static const char *const mode_names[] = {"no_think", "think", "auto"};

struct lb_opts {
    const char *redis;
    const char *prefix;
    enum lb_target target;
    char pool[JOB_POOL_MAX + 1];  /* LB_TARGET_POOL */
    const char *target_text;
    int clients;                  /* closed loop: the level; open loop: most in flight */
    bool clients_given;
    double rate;                  /* > 0: open loop */
    double levels[LB_LEVELS_MAX]; /* clients or rates, from --sweep or the single value */
    int n_levels;
    int requests, warmup;
    double duration_s, timeout_s;
    struct lst_dist prompt_len, output_len;
    const char *prompts_path;
    double think, auto_frac, repeat;
    int hot;
    double temperature;
    uint64_t seed;
    const char *model;            /* every job's `model`; NULL = none */
    const char *out;
    const char *label;
    bool check, plots;
    bool own_reads;               /* --read own: an XREAD per request, not one shared */
    bool no_bell;                 /* --read all: the shared XREAD blocks on every stream */
    bool own_ids;                 /* --ids own: no id chosen on a request slot (cluster) */
};

/* The prompts of --prompts FILE: each line's prompt fields as a JSON
 * object holding messages (+ tools), prompt or prompt_ids, and optionally
 * max_tokens. Owned by the command, read-only while clients run. */
struct lb_prompts {
    int n;
    cJSON **v; /* (n) */
};

/* One event as the client saw it. */
struct lb_ev {
    double t;  /* seconds since the level started */
    int n_tok; /* token ids in a delta; 0 for done/error */
};

/* One request: written by the client thread that sent it, read by the
 * main thread after the join. Times are seconds since the level started;
 * -1 when the moment never came. */
struct lb_req {
    char id[64];
    bool issued, warmup, repeated;
    enum lb_mode mode;
    int max_tokens;
    double t_sched;  /* arrival: when it was meant to be sent */
    double t_sent;   /* when XADD returned */
    double t_first;  /* first delta carrying tokens */
    double t_last;   /* last delta carrying tokens */
    double t_done;   /* done or error event (or the timeout) */
    bool ok;         /* done with finish_reason stop or length */
    bool cached;
    long prompt_tokens, completion_tokens, delta_tokens;
    char finish[16];
    char code[LB_CODE_MAX]; /* "" or the error: a protocol code, TIMEOUT, REDIS, BAD_EVENT */
    struct lb_ev *ev;       /* (n_ev) */
    int n_ev, cap_ev;
};

/* One level's run, shared by its client threads. */
struct lb_run {
    const struct lb_opts *o;
    const struct lb_prompts *prompts;
    const char *run_id;
    int level_idx;
    double level;
    int n_clients;
    bool open;
    double *arrivals;     /* (o->requests) open loop, else NULL */
    struct lb_req *reqs;  /* (o->requests) */
    double t0;            /* monotonic seconds at the level's start */
    pthread_mutex_t mu;   /* guards next and stop */
    int next;
    bool stop;
    struct xmux_set *mux; /* the shared XREADs requests are read by; NULL: each its own */
    int slots[RCL_MAX_NODES]; /* the request slots ids are chosen on (cluster) */
    int n_slots;
    const char *read;     /* how they were read: shared (on the bell), all, own */
    long long mux_reads, mux_named; /* the shared reader's reads, streams named in them */
    char err_msg[RL_ERR_MSG_MAX]; /* the first connection error, for the report */
};

static void sleep_until(double t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L)
        ts.tv_nsec = 999999999L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* ---- options ---- */

static void lb_usage(FILE *f)
{
    fprintf(f,
"usage: redlm bench [options]\n"
"  load a running deployment through Redis and report throughput and latency\n"
"  --redis ADDR         Redis on a loopback address or unix socket (127.0.0.1:6379)\n"
"  --prefix P           key prefix (redlm:)\n"
"  --target T           dispatcher: XADD to <prefix>requests (default)\n"
"                       pool:NAME: XADD every job to <prefix>jobs:NAME\n"
"                       pools: think jobs to jobs:think, the others to jobs:fast\n"
"  --clients N          closed loop: concurrent clients (4); open loop: most in flight (64)\n"
"  --rate R             open loop: Poisson arrivals at R requests/s\n"
"  --sweep A,B,...      one measurement per level (clients, or rates with --rate)\n"
"  --requests N         requests per level (100)\n"
"  --duration S         stop issuing after S seconds per level (60)\n"
"  --warmup N           the first N requests of a level are not counted (0)\n"
"  --prompt-len N|A..B  words of the synthetic user message (32)\n"
"  --prompts FILE       JSONL prompts: a string, or an object with messages (+tools),\n"
"                       prompt or prompt_ids, and optionally max_tokens\n"
"  --output-len N|A..B  max_tokens, sent with ignore_eos (32)\n"
"  --think F            fraction of requests with mode think (0)\n"
"  --model NAME         the served model every job names (several served: needed)\n"
"  --auto F             fraction sent without a mode (auto: the dispatcher decides) (0)\n"
"  --repeat F           fraction re-sending one of the --hot prompts at temperature 0 (0)\n"
"  --hot K              number of repeated prompts (4)\n"
"  --temperature T      temperature of the other requests (0.7)\n"
"  --seed N             what is sent depends only on this (1); a new seed starts\n"
"                       the result cache cold for the repeated prompts\n"
"  --timeout S          per request, then it is cancelled and counted TIMEOUT (120)\n"
"  --read shared|all|own  read every request's events with one shared XREAD, as\n"
"                       the front door does: blocked on the bell the workers ring,\n"
"                       reading only the streams it names (shared, default), or\n"
"                       blocked on every stream (all, the\n"
"                       shared reader before the bell); or each request with its\n"
"                       own blocking XREAD (own); on a Redis Cluster one shared\n"
"                       XREAD per master\n"
"  --ids slots|own      on a Redis Cluster, every id on one of the request slots\n"
"                       (one per master), so that a worker writes and a reader\n"
"                       reads the requests of one master in one call (slots,\n"
"                       default); or ids in a slot each, as clients that do not\n"
"                       choose theirs make (own)\n"
"  --out FILE           full result JSON; latency.png and throughput.png beside it\n"
"  --label S            a name for this run in the JSON and the plot titles\n"
"  --no-check           skip the check (waiting up to 5 s) that a dispatcher or worker\n"
"                       heartbeat exists\n"
"  --no-plots           do not run gnuplot\n");
}

static int parse_double(const char *s, double lo, double hi, double *v, const char *what,
                        struct rl_err *err)
{
    if (!s || !*s)
        return rl_errf(err, RL_EINVAL, "%s needs a number", what);
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || *end || x != x)
        return rl_errf(err, RL_EINVAL, "%s: \"%s\" is not a number", what, s);
    if (x < lo || x > hi)
        return rl_errf(err, RL_EINVAL, "%s: %g is out of range [%g, %g]", what, x, lo, hi);
    *v = x;
    return 0;
}

/* "127.0.0.1:6379", "localhost:6379", "[::1]:6379", "unix:/path" or "/path". */
static int check_one_loopback(const char *addr, struct rl_err *err)
{
    if (!strncmp(addr, "unix:", 5) || addr[0] == '/')
        return 0;
    const char *colon = strrchr(addr, ':');
    if (!colon)
        return rl_errf(err, RL_EINVAL, "--redis: \"%s\" is not host:port", addr);
    size_t len = (size_t)(colon - addr);
    char host[64];
    if (len == 0 || len >= sizeof host)
        return rl_errf(err, RL_EINVAL, "--redis: \"%s\" is not host:port", addr);
    memcpy(host, addr, len);
    host[len] = 0;
    if (!strcmp(host, "localhost") || !strcmp(host, "[::1]"))
        return 0;
    unsigned a, b, c, d;
    char tail;
    if (sscanf(host, "%u.%u.%u.%u%c", &a, &b, &c, &d, &tail) == 4 && a == 127 && b < 256 &&
        c < 256 && d < 256)
        return 0;
    return rl_errf(err, RL_EINVAL,
                   "--redis: %s is not a loopback address; redlm bench only loads a deployment "
                   "on this machine (127.0.0.0/8, [::1], localhost or a unix socket)", host);
}

/* Every entry of a cluster's seed list "a:1,b:2" too. */
static int check_loopback(const char *addr, struct rl_err *err)
{
    char seeds[RCL_MAX_NODES][RCL_HOST_MAX + 8];
    int n = strchr(addr, ',') ? rcl_split_seeds(addr, seeds, RCL_MAX_NODES, err) : 0;
    if (n < 0)
        return n;
    if (!n)
        return check_one_loopback(addr, err);
    for (int i = 0; i < n; i++) {
        int rc = check_one_loopback(seeds[i], err);
        if (rc)
            return rc;
    }
    return 0;
}

static int parse_levels(const char *s, struct lb_opts *o, struct rl_err *err)
{
    o->n_levels = 0;
    const char *p = s;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char buf[32];
        if (len == 0 || len >= sizeof buf)
            return rl_errf(err, RL_EINVAL, "--sweep: expected a list like 1,2,4,8, not \"%.40s\"", s);
        if (o->n_levels == LB_LEVELS_MAX)
            return rl_errf(err, RL_EINVAL, "--sweep: at most %d levels", LB_LEVELS_MAX);
        memcpy(buf, p, len);
        buf[len] = 0;
        char *end;
        errno = 0;
        double x = strtod(buf, &end);
        if (errno || *end || !(x > 0))
            return rl_errf(err, RL_EINVAL, "--sweep: \"%s\" is not a positive number", buf);
        o->levels[o->n_levels++] = x;
        p += len + (comma ? 1 : 0);
        if (comma && !*p)
            return rl_errf(err, RL_EINVAL, "--sweep: trailing comma in \"%.40s\"", s);
    }
    if (!o->n_levels)
        return rl_errf(err, RL_EINVAL, "--sweep needs a list like 1,2,4,8");
    return 0;
}

/* Returns 0, 1 for --help, or a negative code. */
static int lb_parse(int argc, char **argv, struct lb_opts *o, struct rl_err *err)
{
    memset(o, 0, sizeof *o);
    o->redis = "127.0.0.1:6379";
    o->prefix = "redlm:";
    o->target = LB_TARGET_DISPATCHER;
    o->target_text = "dispatcher";
    o->clients = 4;
    o->requests = 100;
    o->duration_s = 60;
    o->timeout_s = 120;
    o->prompt_len = (struct lst_dist){32, 32};
    o->output_len = (struct lst_dist){32, 32};
    o->hot = 4;
    o->temperature = 0.7;
    o->seed = 1;
    o->check = o->plots = true;
    const char *sweep = NULL;
    long warmup = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0, takes = 1;
        long n = 0;
        if (!strcmp(f, "-h") || !strcmp(f, "--help"))
            return 1;
        else if (!strcmp(f, "--no-check"))
            o->check = false, takes = 0;
        else if (!strcmp(f, "--no-plots"))
            o->plots = false, takes = 0;
        else if (!v)
            return rl_errf(err, RL_EINVAL, "%s: unknown option, or it needs a value", f);
        else if (!strcmp(f, "--redis"))
            o->redis = v;
        else if (!strcmp(f, "--prefix"))
            o->prefix = v;
        else if (!strcmp(f, "--read")) {
            if (strcmp(v, "shared") && strcmp(v, "all") && strcmp(v, "own"))
                rc = rl_errf(err, RL_EINVAL, "--read: \"%s\" is not shared, all or own", v);
            o->own_reads = !strcmp(v, "own");
            o->no_bell = !strcmp(v, "all");
        } else if (!strcmp(f, "--ids")) {
            if (strcmp(v, "slots") && strcmp(v, "own"))
                rc = rl_errf(err, RL_EINVAL, "--ids: \"%s\" is not slots or own", v);
            o->own_ids = !strcmp(v, "own");
        }
        else if (!strcmp(f, "--target")) {
            o->target_text = v;
            if (!strcmp(v, "dispatcher"))
                o->target = LB_TARGET_DISPATCHER;
            else if (!strcmp(v, "pools"))
                o->target = LB_TARGET_POOLS;
            else if (!strncmp(v, "pool:", 5) && v[5] && strlen(v + 5) <= JOB_POOL_MAX &&
                     strspn(v + 5, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
                         strlen(v + 5)) {
                o->target = LB_TARGET_POOL;
                strcpy(o->pool, v + 5);
            } else
                rc = rl_errf(err, RL_EINVAL, "--target: \"%s\" is not dispatcher, pools or pool:NAME", v);
        } else if (!strcmp(f, "--clients")) {
            rc = cli_parse_int(v, 1, LB_CLIENTS_MAX, &n, f, err);
            o->clients = (int)n;
            o->clients_given = true;
        } else if (!strcmp(f, "--rate"))
            rc = parse_double(v, 1e-3, 1e5, &o->rate, f, err);
        else if (!strcmp(f, "--sweep"))
            sweep = v;
        else if (!strcmp(f, "--requests")) {
            rc = cli_parse_int(v, 1, LB_REQUESTS_MAX, &n, f, err);
            o->requests = (int)n;
        } else if (!strcmp(f, "--warmup"))
            rc = cli_parse_int(v, 0, LB_REQUESTS_MAX, &warmup, f, err);
        else if (!strcmp(f, "--duration"))
            rc = parse_double(v, 0.1, 86400, &o->duration_s, f, err);
        else if (!strcmp(f, "--timeout"))
            rc = parse_double(v, 0.1, 3600, &o->timeout_s, f, err);
        else if (!strcmp(f, "--prompt-len"))
            rc = lst_dist_parse(v, 1, 1 << 20, &o->prompt_len, f, err);
        else if (!strcmp(f, "--output-len"))
            rc = lst_dist_parse(v, 1, JOB_MAX_TOKENS_MAX, &o->output_len, f, err);
        else if (!strcmp(f, "--prompts"))
            o->prompts_path = v;
        else if (!strcmp(f, "--think"))
            rc = parse_double(v, 0, 1, &o->think, f, err);
        else if (!strcmp(f, "--model"))
            o->model = v;
        else if (!strcmp(f, "--auto"))
            rc = parse_double(v, 0, 1, &o->auto_frac, f, err);
        else if (!strcmp(f, "--repeat"))
            rc = parse_double(v, 0, 1, &o->repeat, f, err);
        else if (!strcmp(f, "--hot")) {
            rc = cli_parse_int(v, 1, LB_HOT_MAX, &n, f, err);
            o->hot = (int)n;
        } else if (!strcmp(f, "--temperature"))
            rc = parse_double(v, 0, 2, &o->temperature, f, err);
        else if (!strcmp(f, "--seed")) {
            rc = cli_parse_int(v, 0, (1L << 53), &n, f, err);
            o->seed = (uint64_t)n;
        } else if (!strcmp(f, "--out"))
            o->out = v;
        else if (!strcmp(f, "--label"))
            o->label = v;
        else
            return rl_errf(err, RL_EINVAL, "unknown option %s", f);
        if (rc)
            return rc;
        i += takes;
    }
    int rc = check_loopback(o->redis, err);
    if (rc)
        return rc;
    if (!o->prefix[0] || strlen(o->prefix) > 64)
        return rl_errf(err, RL_EINVAL, "--prefix must have 1 to 64 characters");
    if (warmup >= o->requests)
        return rl_errf(err, RL_EINVAL, "--warmup %ld leaves none of the %d requests to measure",
                       warmup, o->requests);
    o->warmup = (int)warmup;
    if (o->think + o->auto_frac > 1 + 1e-9)
        return rl_errf(err, RL_EINVAL, "--think %g plus --auto %g is more than 1", o->think, o->auto_frac);
    if (o->auto_frac > 0 && o->target != LB_TARGET_DISPATCHER)
        return rl_errf(err, RL_EINVAL, "--auto needs --target dispatcher: only the dispatcher "
                                       "resolves mode auto; a worker refuses it");
    if (o->rate > 0 && !o->clients_given)
        o->clients = 64;
    if (sweep) {
        if ((rc = parse_levels(sweep, o, err)))
            return rc;
        for (int i = 0; i < o->n_levels; i++) {
            if (o->rate > 0 && o->levels[i] > 1e5)
                return rl_errf(err, RL_EINVAL, "--sweep: rate %g is above 100000/s", o->levels[i]);
            if (!(o->rate > 0) && (o->levels[i] != floor(o->levels[i]) || o->levels[i] > LB_CLIENTS_MAX))
                return rl_errf(err, RL_EINVAL, "--sweep: %g is not a number of clients in [1, %d]",
                               o->levels[i], LB_CLIENTS_MAX);
        }
    } else {
        o->n_levels = 1;
        o->levels[0] = o->rate > 0 ? o->rate : o->clients;
    }
    return 0;
}

/* ---- prompts ---- */

static const char *const words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but",
    "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her",
    "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no",
    "time", "water", "river", "stream", "queue", "model", "token", "light", "stone", "city",
    "music", "number", "market", "garden", "winter", "summer", "engine", "window", "story",
    "question", "answer", "reason", "system", "paper", "table", "cloud", "bridge", "forest",
};
#define N_WORDS ((int)(sizeof words / sizeof words[0]))

/* A user message of n words drawn by r, ending in a question mark. */
static char *synth_text(struct lst_rng *r, int n)
{
    size_t cap = (size_t)n * 10 + 16, len = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    for (int i = 0; i < n; i++) {
        const char *w = words[lst_rng_range(r, 0, N_WORDS - 1)];
        len += (size_t)snprintf(s + len, cap - len, "%s%s", i ? " " : "", w);
    }
    snprintf(s + len, cap - len, "?");
    return s;
}

static void prompts_free(struct lb_prompts *p)
{
    for (int i = 0; i < p->n; i++)
        cJSON_Delete(p->v[i]);
    free(p->v);
    p->v = NULL;
    p->n = 0;
}

/* One line of the prompt file into an object holding only the prompt
 * fields; -RL_EINVAL naming the line when it has none or something else. */
static int prompt_line(const char *path, int line, const char *text, cJSON **out, struct rl_err *err)
{
    cJSON *doc = cJSON_Parse(text);
    if (!doc)
        return rl_errf(err, RL_EINVAL, "%s:%d: not JSON", path, line);
    cJSON *o = NULL;
    int rc = 0;
    if (cJSON_IsString(doc)) {
        o = cJSON_CreateObject();
        cJSON *msgs = cJSON_AddArrayToObject(o, "messages");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", doc->valuestring);
        cJSON_Delete(doc);
        *out = o;
        return 0;
    }
    if (!cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        return rl_errf(err, RL_EINVAL, "%s:%d: expected a JSON string or object", path, line);
    }
    int n_prompt = 0;
    for (cJSON *f = doc->child; f; f = f->next) {
        if (!strcmp(f->string, "messages") || !strcmp(f->string, "prompt") ||
            !strcmp(f->string, "prompt_ids"))
            n_prompt++;
        else if (!strcmp(f->string, "max_tokens")) {
            if (!cJSON_IsNumber(f) || f->valuedouble < 1 || f->valuedouble > JOB_MAX_TOKENS_MAX ||
                f->valuedouble != floor(f->valuedouble))
                rc = rl_errf(err, RL_EINVAL, "%s:%d: max_tokens must be an integer in [1, %d]", path,
                             line, JOB_MAX_TOKENS_MAX);
        } else if (strcmp(f->string, "tools"))
            rc = rl_errf(err, RL_EINVAL, "%s:%d: field \"%.40s\" is not one of messages, prompt, "
                                         "prompt_ids, tools, max_tokens", path, line, f->string);
        if (rc)
            break;
    }
    if (!rc && n_prompt != 1)
        rc = rl_errf(err, RL_EINVAL, "%s:%d: needs exactly one of messages, prompt, prompt_ids", path, line);
    if (rc) {
        cJSON_Delete(doc);
        return rc;
    }
    *out = doc;
    return 0;
}

static int prompts_load(const char *path, struct lb_prompts *p, struct rl_err *err)
{
    memset(p, 0, sizeof *p);
    FILE *f = fopen(path, "rb");
    if (!f)
        return rl_errf(err, RL_EIO, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, total = 0;
    ssize_t len;
    int rc = 0, lineno = 0, cap_v = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        total += (size_t)len;
        if (total > LB_PROMPT_FILE_MAX) {
            rc = rl_errf(err, RL_EINVAL, "%s: larger than %d MiB", path, LB_PROMPT_FILE_MAX >> 20);
            break;
        }
        if (strspn(line, " \t\r\n") == (size_t)len)
            continue;
        if (p->n == LB_REQUESTS_MAX) {
            rc = rl_errf(err, RL_EINVAL, "%s: more than %d prompts", path, LB_REQUESTS_MAX);
            break;
        }
        if (p->n == cap_v) {
            cap_v = cap_v ? cap_v * 2 : 64;
            cJSON **nv = realloc(p->v, (size_t)cap_v * sizeof *nv);
            if (!nv) {
                rc = rl_errf(err, RL_ENOMEM, "%s: out of memory", path);
                break;
            }
            p->v = nv;
        }
        if ((rc = prompt_line(path, lineno, line, &p->v[p->n], err)))
            break;
        p->n++;
    }
    if (!rc && ferror(f))
        rc = rl_errf(err, RL_EIO, "%s: read error", path);
    if (!rc && p->n == 0)
        rc = rl_errf(err, RL_EINVAL, "%s: no prompts", path);
    free(line);
    fclose(f);
    if (rc)
        prompts_free(p);
    return rc;
}

/* ---- one request ---- */

/* Builds request i's job. Everything drawn comes from generators seeded
 * by (seed, level, i) or, for a repeated prompt, (seed, level, hot index),
 * so the same options send the same jobs whichever thread sends them. */
static char *build_job(const struct lb_run *run, int i, struct lb_req *q)
{
    const struct lb_opts *o = run->o;
    struct lst_rng r;
    lst_rng_seed(&r, lst_seed_mix(o->seed, (uint64_t)run->level_idx, (uint64_t)i));
    q->repeated = o->repeat > 0 && lst_rng_unit(&r) < o->repeat;
    double u = lst_rng_unit(&r);
    q->mode = u < o->think ? LB_MODE_THINK : u < o->think + o->auto_frac ? LB_MODE_AUTO : LB_MODE_NO_THINK;
    struct lst_rng pr = r; /* draws the prompt and its length */
    if (q->repeated) {
        int k = (int)lst_rng_range(&r, 0, o->hot - 1);
        /* a hot prompt's mode and length are its own: they are in the
         * result-cache key, so they must not change between repeats */
        lst_rng_seed(&pr, lst_seed_mix(o->seed ^ 0x686f74ull, (uint64_t)run->level_idx, (uint64_t)k));
        u = lst_rng_unit(&pr);
        q->mode = u < o->think ? LB_MODE_THINK : u < o->think + o->auto_frac ? LB_MODE_AUTO : LB_MODE_NO_THINK;
    }
    if (run->n_slots) { /* a cluster: the id's window picks its request slot */
        int at = snprintf(q->id, sizeof q->id, "%s-%d-", run->run_id, run->level_idx);
        snprintf(q->id + at, sizeof q->id - (size_t)at, "%.*s-%d", RCL_SLOT_FILL_LEN, "......", i);
        rcl_slot_fill(q->id, strlen(q->id), (size_t)at, run->slots[i % run->n_slots]);
    } else {
        snprintf(q->id, sizeof q->id, "%s-%d-%d", run->run_id, run->level_idx, i);
    }
    cJSON *job = cJSON_CreateObject();
    if (!job)
        return NULL;
    cJSON_AddStringToObject(job, "id", q->id);
    q->max_tokens = lst_dist_draw(&o->output_len, &pr);
    if (run->prompts) {
        const cJSON *src = run->prompts->v[lst_rng_range(&pr, 0, run->prompts->n - 1)];
        for (const cJSON *f = src->child; f; f = f->next) {
            if (!strcmp(f->string, "max_tokens"))
                q->max_tokens = f->valueint;
            else
                cJSON_AddItemToObject(job, f->string, cJSON_Duplicate(f, 1));
        }
    } else {
        char *text = synth_text(&pr, lst_dist_draw(&o->prompt_len, &pr));
        cJSON *msgs = cJSON_AddArrayToObject(job, "messages");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", text ? text : "");
        free(text);
    }
    /* auto is the dispatcher's default for a job without a mode: leaving
     * the field out asks for it with every version of the protocol */
    if (q->mode != LB_MODE_AUTO)
        cJSON_AddStringToObject(job, "mode", mode_names[q->mode]);
    if (o->model)
        cJSON_AddStringToObject(job, "model", o->model);
    cJSON_AddNumberToObject(job, "max_tokens", q->max_tokens);
    cJSON_AddNumberToObject(job, "temperature", q->repeated ? 0 : o->temperature);
    /* a seed of its own (53 bits, exact in JSON), from --seed, level and
     * number: two runs with one --seed send the same jobs, so a run under
     * faults can be compared token by token with a calm one (the soak,
     * tests/bench/bench_fleet.py); without it the worker would derive the
     * seed from the job's id and entry ID, which differ between runs */
    if (!q->repeated)
        cJSON_AddNumberToObject(job, "seed", (double)(lst_seed_mix(o->seed ^ 0x73656564ull,
                                                                   (uint64_t)run->level_idx,
                                                                   (uint64_t)i) >> 11));
    cJSON_AddBoolToObject(job, "ignore_eos", 1);
    char *s = cJSON_PrintUnformatted(job);
    cJSON_Delete(job);
    return s;
}

static void set_code(struct lb_req *q, const char *code)
{
    if (!q->code[0])
        snprintf(q->code, sizeof q->code, "%s", code);
}

static int add_ev(struct lb_req *q, double t, int n_tok)
{
    if (q->n_ev == q->cap_ev) {
        int cap = q->cap_ev ? q->cap_ev * 2 : 16;
        struct lb_ev *v = realloc(q->ev, (size_t)cap * sizeof *v);
        if (!v)
            return -RL_ENOMEM;
        q->ev = v;
        q->cap_ev = cap;
    }
    q->ev[q->n_ev++] = (struct lb_ev){t, n_tok};
    return 0;
}

/* Reads the done event's usage and cached flag. */
static void read_done(const char *json, size_t len, struct lb_req *q)
{
    cJSON *d = cJSON_ParseWithLength(json, len);
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(d, "usage");
    const cJSON *x;
    if ((x = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens")) && cJSON_IsNumber(x))
        q->completion_tokens = (long)x->valuedouble;
    if ((x = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens")) && cJSON_IsNumber(x))
        q->prompt_tokens = (long)x->valuedouble;
    q->cached = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "cached"));
    if ((x = cJSON_GetObjectItemCaseSensitive(d, "finish_reason")) && cJSON_IsString(x))
        snprintf(q->finish, sizeof q->finish, "%s", x->valuestring);
    cJSON_Delete(d);
}

/* Handles one event; returns true when the request is over. */
static bool on_event(struct lb_req *q, const char *json, size_t len, double t)
{
    struct ev_info info;
    struct rl_err err;
    if (ev_parse(json, len, &info, &err) < 0) {
        set_code(q, "BAD_EVENT");
        q->t_done = t;
        return true;
    }
    bool over = false;
    int n_tok = info.type == EV_TYPE_DELTA ? info.n_token_ids : 0;
    if (add_ev(q, t, n_tok) < 0)
        set_code(q, "CLIENT_NOMEM");
    if (info.type == EV_TYPE_DELTA && n_tok > 0) {
        if (q->t_first < 0)
            q->t_first = t;
        q->t_last = t;
        q->delta_tokens += n_tok;
    } else if (info.type == EV_TYPE_ERROR) {
        /* an error is followed by done(error), or is the only event of a
         * job refused before it ran: either way the request is over */
        if (info.code != EV_CODE_NONE)
            set_code(q, ev_code_name(info.code));
        else { /* a code this build does not know (a newer dispatcher's): keep its name */
            cJSON *d = cJSON_ParseWithLength(json, len);
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(d, "code");
            set_code(q, cJSON_IsString(c) ? c->valuestring : "UNKNOWN_ERROR");
            cJSON_Delete(d);
        }
        q->t_done = t;
        over = true;
    } else if (info.type == EV_TYPE_DONE) {
        read_done(json, len, q);
        q->t_done = t;
        if (info.finish_reason == EV_FINISH_STOP || info.finish_reason == EV_FINISH_LENGTH)
            q->ok = !q->code[0];
        else if (info.finish_reason == EV_FINISH_CANCELLED)
            set_code(q, "CANCELLED");
        else if (info.finish_reason == EV_FINISH_DEADLINE)
            set_code(q, "DEADLINE_EXCEEDED");
        else
            set_code(q, "FINISH_ERROR");
        over = true;
    }
    ev_info_clear(&info);
    return over;
}

static void note_redis_error(struct lb_run *run, const struct rl_err *err)
{
    pthread_mutex_lock(&run->mu);
    if (!run->err_msg[0])
        snprintf(run->err_msg, sizeof run->err_msg, "%s", err->msg);
    pthread_mutex_unlock(&run->mu);
}

/* Reads q's events from out_key (on the shared reader's subscription sub,
 * or with XREADs of its own on c when sub is NULL) until done, an error
 * that ends it, or q's timeout (then it is cancelled). */
static void read_events(struct lb_run *run, struct rconn *c, struct lb_req *q, const char *out_key,
                        struct xmux_sub *sub)
{
    const struct lb_opts *o = run->o;
    struct rl_err err = {0};
    double deadline = q->t_sent + o->timeout_s;
    char last[RCONN_ID_MAX] = "0-0";
    for (;;) {
        double now = rl_mono_s() - run->t0;
        if (now >= deadline) {
            char ck[256];
            rcl_tagged_key(ck, sizeof ck, rconn_is_cluster(c), o->prefix, "cancel:", q->id);
            const char *argv[] = {"SET", ck, "1", "EX", "600"};
            rconn_command(c, 5, argv, NULL, NULL, &err);
            set_code(q, "TIMEOUT");
            q->t_done = now;
            return;
        }
        int block = (int)ceil((deadline - now) * 1000);
        if (block > 1000)
            block = 1000;
        if (block < 1)
            block = 1;
        char bs[16];
        snprintf(bs, sizeof bs, "%d", block);
        const char *argv[] = {"XREAD", "COUNT", "1000", "BLOCK", bs, "STREAMS", out_key, last};
        struct rconn_reply *r = NULL;
        int rc = sub ? xmux_next(sub, block, &r, &err) : rconn_command(c, 8, argv, NULL, &r, &err);
        double t = rl_mono_s() - run->t0; /* every event of this reply arrived now */
        if (rc < 0) {
            rconn_reply_free(r);
            if (rc == -RL_EIO) { /* rconn reconnects; the stream keeps the events */
                note_redis_error(run, &err);
                struct timespec ts = {0, 20 * 1000 * 1000};
                nanosleep(&ts, NULL);
                continue;
            }
            note_redis_error(run, &err);
            set_code(q, "REDIS");
            q->t_done = t;
            return;
        }
        /* nil on timeout, else [[key, [[id, [field, value, ...]], ...]]] */
        bool over = false;
        if (r && r->type == RCONN_ARRAY && r->n_elem >= 1 && r->elem[0].type == RCONN_ARRAY &&
            r->elem[0].n_elem == 2 && r->elem[0].elem[1].type == RCONN_ARRAY) {
            const struct rconn_reply *ents = &r->elem[0].elem[1];
            for (size_t e = 0; e < ents->n_elem && !over; e++) {
                const struct rconn_reply *ent = &ents->elem[e];
                if (ent->type != RCONN_ARRAY || ent->n_elem != 2 || ent->elem[0].type != RCONN_STRING)
                    continue;
                snprintf(last, sizeof last, "%s", ent->elem[0].str);
                const struct rconn_reply *fv = &ent->elem[1];
                const struct rconn_reply *ev = NULL;
                for (size_t k = 0; fv->type == RCONN_ARRAY && k + 1 < fv->n_elem; k += 2)
                    if (fv->elem[k].type == RCONN_STRING && !strcmp(fv->elem[k].str, "event"))
                        ev = &fv->elem[k + 1];
                if (!ev || ev->type != RCONN_STRING) {
                    set_code(q, "BAD_EVENT");
                    q->t_done = t;
                    over = true;
                } else
                    over = on_event(q, ev->str, ev->len, t);
            }
        }
        rconn_reply_free(r);
        if (over)
            return;
    }
}

/* Names q's stream in out_key (256 bytes; the key layout of c's server)
 * and follows it on the shared reader, if any, with xmux flags: *sub
 * (NULL without a reader). false when that failed (q ends, CLIENT_NOMEM). */
static bool follow(struct lb_run *run, struct rconn *c, struct lb_req *q, char *out_key,
                   unsigned flags, struct xmux_sub **sub)
{
    struct rl_err err = {0};
    rcl_tagged_key(out_key, 256, rconn_is_cluster(c), run->o->prefix, "out:", q->id);
    if (run->mux && xmux_set_sub(run->mux, out_key, "0-0", flags, sub, &err) < 0) {
        note_redis_error(run, &err);
        set_code(q, "CLIENT_NOMEM");
        q->t_done = rl_mono_s() - run->t0;
        return false;
    }
    return true;
}

/* Sends request q and reads its stream until it is over or times out. */
static void run_request(struct lb_run *run, struct rconn *c, int i, struct lb_req *q)
{
    const struct lb_opts *o = run->o;
    struct rl_err err = {0};
    char key[256], out_key[256];
    char *job = build_job(run, i, q);
    if (!job) {
        set_code(q, "CLIENT_NOMEM");
        q->t_done = rl_mono_s() - run->t0;
        return;
    }
    char rest[200];
    if (o->target == LB_TARGET_DISPATCHER)
        snprintf(rest, sizeof rest, "requests");
    else
        snprintf(rest, sizeof rest, "jobs:%.64s",
                 o->target == LB_TARGET_POOL ? o->pool : q->mode == LB_MODE_THINK ? "think" : "fast");
    /* the layout is known once connected: a cluster's queue keys share a tag */
    bool known = rconn_ensure(c, NULL) == 0;
    rcl_queue_key(key, sizeof key, rconn_is_cluster(c), o->prefix, rest);
    /* Followed before it is submitted: nothing can have written the stream
     * yet, so the shared reader need not be woken for it (XMUX_UNWRITTEN) */
    struct xmux_sub *sub = NULL;
    if (known && !follow(run, c, q, out_key, XMUX_UNWRITTEN, &sub)) {
        free(job);
        return;
    }
    const char *names[] = {"job"};
    const char *values[] = {job};
    size_t lens[] = {strlen(job)};
    int rc = rconn_xadd(c, key, "*", 0, 1, names, values, lens, NULL, NULL, &err);
    free(job);
    double now = rl_mono_s() - run->t0;
    if (rc < 0) {
        xmux_unsub(sub);
        note_redis_error(run, &err);
        set_code(q, "REDIS");
        q->t_done = now;
        return;
    }
    q->t_sent = now;
    if (!known && !follow(run, c, q, out_key, 0, &sub)) /* the layout known by the XADD */
        return;
    read_events(run, c, q, out_key, sub);
    xmux_unsub(sub);
}

static void *client_main(void *arg)
{
    struct lb_run *run = arg;
    const struct lb_opts *o = run->o;
    struct rconn_opts ro;
    rconn_opts_default(&ro);
    ro.addr = o->redis;
    ro.client_name = "redlm-bench";
    struct rconn *c = NULL;
    struct rl_err err = {0};
    if (rconn_create(&c, &ro, &err) < 0) {
        note_redis_error(run, &err);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&run->mu);
        int i = run->next;
        double now = rl_mono_s() - run->t0;
        double at = run->open ? run->arrivals[i < o->requests ? i : 0] : now;
        if (run->stop || i >= o->requests || at >= o->duration_s || now >= o->duration_s) {
            run->stop = true;
            pthread_mutex_unlock(&run->mu);
            break;
        }
        run->next++;
        pthread_mutex_unlock(&run->mu);
        struct lb_req *q = &run->reqs[i];
        if (run->open)
            sleep_until(run->t0 + at);
        q->issued = true;
        q->warmup = i < o->warmup;
        q->t_sched = at;
        run_request(run, c, i, q);
    }
    rconn_free(c);
    return NULL;
}

/* ---- statistics ---- */

struct lb_level {
    double level;
    int n_clients;
    const char *read;    /* shared: one XREAD blocked on the bell; all: one blocked on
                            every stream; own: one per request (a static string) */
    long long mux_reads, mux_named;
    int issued, measured, completed, n_errors, n_cached;
    long prompt_tokens, output_tokens, delta_tokens;
    double window_s, req_per_s, tok_per_s;
    struct lst_summary ttft, tpot, e2e;          /* ms, completed measured requests */
    struct lst_summary u_ttft, u_tpot, u_e2e;    /* the same, not cached */
    cJSON *errors;                               /* {"CODE": n} */
    struct lst_buckets tl_req, tl_tok;           /* per second since the level's start */
    double tl_end_s;                             /* the level's last event or done, s since
                                                    its start: the last bucket is partial
                                                    unless this is a whole number */
    char err_msg[RL_ERR_MSG_MAX];
};

static cJSON *summary_json(const struct lst_summary *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "n", s->n);
    cJSON_AddNumberToObject(o, "mean", s->mean);
    cJSON_AddNumberToObject(o, "min", s->min);
    cJSON_AddNumberToObject(o, "p50", s->p50);
    cJSON_AddNumberToObject(o, "p90", s->p90);
    cJSON_AddNumberToObject(o, "p99", s->p99);
    cJSON_AddNumberToObject(o, "max", s->max);
    return o;
}

/* Folds a joined run into lv. Returns 0 or -RL_ENOMEM. */
static int level_stats(const struct lb_run *run, struct lb_level *lv, struct rl_err *err)
{
    const struct lb_opts *o = run->o;
    int n = o->requests, rc = 0;
    memset(lv, 0, sizeof *lv);
    lv->level = run->level;
    lv->n_clients = run->n_clients;
    lv->read = run->read;
    lv->mux_reads = run->mux_reads;
    lv->mux_named = run->mux_named;
    snprintf(lv->err_msg, sizeof lv->err_msg, "%s", run->err_msg);
    lv->errors = cJSON_CreateObject();
    double *v[6];
    for (int k = 0; k < 6; k++)
        v[k] = malloc((size_t)n * sizeof(double));
    int nv[6] = {0};
    if ((rc = lst_buckets_init(&lv->tl_req, 1.0, 1 << 20, err)) ||
        (rc = lst_buckets_init(&lv->tl_tok, 1.0, 1 << 20, err)))
        goto out;
    if (!lv->errors || !v[0] || !v[1] || !v[2] || !v[3] || !v[4] || !v[5]) {
        rc = rl_errf(err, RL_ENOMEM, "statistics: out of memory");
        goto out;
    }
    double t_begin = INFINITY, t_end = -INFINITY;
    for (int i = 0; i < n; i++) {
        const struct lb_req *q = &run->reqs[i];
        if (!q->issued)
            continue;
        lv->issued++;
        /* the timelines show everything that happened, warm-up included */
        for (int e = 0; e < q->n_ev; e++) {
            if (q->ev[e].n_tok && (rc = lst_buckets_add(&lv->tl_tok, q->ev[e].t, q->ev[e].n_tok, err)))
                goto out;
            lv->tl_end_s = fmax(lv->tl_end_s, q->ev[e].t);
        }
        if (q->ok && (rc = lst_buckets_add(&lv->tl_req, q->t_done, 1, err)))
            goto out;
        if (q->ok)
            lv->tl_end_s = fmax(lv->tl_end_s, q->t_done);
        if (q->warmup)
            continue;
        lv->measured++;
        if (q->t_sched < t_begin)
            t_begin = q->t_sched;
        if (q->t_done > t_end)
            t_end = q->t_done;
        if (!q->ok) {
            lv->n_errors++;
            const char *code = q->code[0] ? q->code : "UNKNOWN";
            cJSON *c = cJSON_GetObjectItemCaseSensitive(lv->errors, code);
            if (c)
                cJSON_SetNumberValue(c, c->valuedouble + 1);
            else
                cJSON_AddNumberToObject(lv->errors, code, 1);
            continue;
        }
        lv->completed++;
        lv->n_cached += q->cached;
        lv->prompt_tokens += q->prompt_tokens;
        lv->output_tokens += q->completion_tokens;
        lv->delta_tokens += q->delta_tokens;
        double e2e = (q->t_done - q->t_sched) * 1e3;
        double ttft = q->t_first >= 0 ? (q->t_first - q->t_sched) * 1e3 : e2e;
        v[0][nv[0]++] = ttft;
        v[2][nv[2]++] = e2e;
        if (q->completion_tokens >= 2 && q->t_first >= 0)
            v[1][nv[1]++] = (q->t_last - q->t_first) * 1e3 / (double)(q->completion_tokens - 1);
        if (!q->cached) {
            v[3][nv[3]++] = ttft;
            v[5][nv[5]++] = e2e;
            if (q->completion_tokens >= 2 && q->t_first >= 0)
                v[4][nv[4]++] = (q->t_last - q->t_first) * 1e3 / (double)(q->completion_tokens - 1);
        }
    }
    lv->window_s = t_end > t_begin ? t_end - t_begin : 0;
    if (lv->window_s > 0) {
        lv->req_per_s = lv->completed / lv->window_s;
        lv->tok_per_s = (double)lv->output_tokens / lv->window_s;
    }
    lst_summarize(v[0], nv[0], &lv->ttft);
    lst_summarize(v[1], nv[1], &lv->tpot);
    lst_summarize(v[2], nv[2], &lv->e2e);
    lst_summarize(v[3], nv[3], &lv->u_ttft);
    lst_summarize(v[4], nv[4], &lv->u_tpot);
    lst_summarize(v[5], nv[5], &lv->u_e2e);
out:
    for (int k = 0; k < 6; k++)
        free(v[k]);
    return rc;
}

static void level_free(struct lb_level *lv)
{
    cJSON_Delete(lv->errors);
    lst_buckets_free(&lv->tl_req);
    lst_buckets_free(&lv->tl_tok);
}

static cJSON *level_json(const struct lb_opts *o, const struct lb_level *lv, const struct lb_run *run,
                         bool full)
{
    cJSON *j = cJSON_CreateObject();
    bool open = o->rate > 0;
    cJSON_AddStringToObject(j, "loop", open ? "open" : "closed");
    cJSON_AddNumberToObject(j, "level", lv->level);
    cJSON_AddNumberToObject(j, "clients", lv->n_clients);
    cJSON_AddStringToObject(j, "read", lv->read);
    /* the shared reader: its reads, and the streams they named on average */
    cJSON_AddNumberToObject(j, "shared_reads", (double)lv->mux_reads);
    cJSON_AddNumberToObject(j, "streams_per_read",
                            lv->mux_reads ? (double)lv->mux_named / (double)lv->mux_reads : 0);
    if (open)
        cJSON_AddNumberToObject(j, "rate", lv->level);
    else
        cJSON_AddNullToObject(j, "rate");
    cJSON_AddNumberToObject(j, "issued", lv->issued);
    cJSON_AddNumberToObject(j, "warmup", lv->issued - lv->measured);
    cJSON_AddNumberToObject(j, "measured", lv->measured);
    cJSON_AddNumberToObject(j, "completed", lv->completed);
    cJSON_AddNumberToObject(j, "n_errors", lv->n_errors);
    cJSON_AddItemToObject(j, "errors", cJSON_Duplicate(lv->errors, 1));
    cJSON_AddNumberToObject(j, "cached", lv->n_cached);
    cJSON_AddNumberToObject(j, "cached_fraction", lv->completed ? (double)lv->n_cached / lv->completed : 0);
    cJSON_AddNumberToObject(j, "window_s", lv->window_s);
    cJSON_AddNumberToObject(j, "requests_per_s", lv->req_per_s);
    cJSON_AddNumberToObject(j, "output_tokens_per_s", lv->tok_per_s);
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)lv->prompt_tokens);
    cJSON_AddNumberToObject(j, "output_tokens", (double)lv->output_tokens);
    cJSON_AddNumberToObject(j, "delta_tokens", (double)lv->delta_tokens);
    cJSON_AddItemToObject(j, "ttft_ms", summary_json(&lv->ttft));
    cJSON_AddItemToObject(j, "tpot_ms", summary_json(&lv->tpot));
    cJSON_AddItemToObject(j, "e2e_ms", summary_json(&lv->e2e));
    cJSON *u = cJSON_AddObjectToObject(j, "uncached");
    cJSON_AddItemToObject(u, "ttft_ms", summary_json(&lv->u_ttft));
    cJSON_AddItemToObject(u, "tpot_ms", summary_json(&lv->u_tpot));
    cJSON_AddItemToObject(u, "e2e_ms", summary_json(&lv->u_e2e));
    if (lv->err_msg[0])
        cJSON_AddStringToObject(j, "redis_error", lv->err_msg);
    if (!full)
        return j;
    cJSON *tl = cJSON_AddObjectToObject(j, "timeline");
    cJSON_AddNumberToObject(tl, "bucket_s", 1);
    /* the last bucket's real width (the level ended inside it) */
    cJSON_AddNumberToObject(tl, "end_s", round(lv->tl_end_s * 1e3) / 1e3);
    int nb = lv->tl_req.n > lv->tl_tok.n ? lv->tl_req.n : lv->tl_tok.n;
    cJSON *a = cJSON_AddArrayToObject(tl, "requests");
    cJSON *b = cJSON_AddArrayToObject(tl, "output_tokens");
    for (int i = 0; i < nb; i++) {
        cJSON_AddItemToArray(a, cJSON_CreateNumber(i < lv->tl_req.n ? lv->tl_req.sum[i] : 0));
        cJSON_AddItemToArray(b, cJSON_CreateNumber(i < lv->tl_tok.n ? lv->tl_tok.sum[i] : 0));
    }
    cJSON *reqs = cJSON_AddArrayToObject(j, "requests");
    for (int i = 0; i < o->requests; i++) {
        const struct lb_req *q = &run->reqs[i];
        if (!q->issued)
            continue;
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "id", q->id);
        cJSON_AddBoolToObject(r, "warmup", q->warmup);
        cJSON_AddStringToObject(r, "mode", mode_names[q->mode]);
        cJSON_AddBoolToObject(r, "repeated", q->repeated);
        cJSON_AddNumberToObject(r, "max_tokens", q->max_tokens);
        cJSON_AddNumberToObject(r, "sched_ms", round(q->t_sched * 1e6) / 1e3);
        cJSON_AddNumberToObject(r, "ttft_ms", q->t_first >= 0 ? round((q->t_first - q->t_sched) * 1e6) / 1e3 : -1);
        cJSON_AddNumberToObject(r, "e2e_ms", q->t_done >= 0 ? round((q->t_done - q->t_sched) * 1e6) / 1e3 : -1);
        if (q->ok && q->completion_tokens >= 2 && q->t_first >= 0)
            cJSON_AddNumberToObject(r, "tpot_ms", round((q->t_last - q->t_first) * 1e6 /
                                                        (double)(q->completion_tokens - 1)) / 1e3);
        else
            cJSON_AddNullToObject(r, "tpot_ms");
        cJSON_AddNumberToObject(r, "events", q->n_ev);
        cJSON_AddNumberToObject(r, "prompt_tokens", (double)q->prompt_tokens);
        cJSON_AddNumberToObject(r, "completion_tokens", (double)q->completion_tokens);
        cJSON_AddBoolToObject(r, "cached", q->cached);
        cJSON_AddStringToObject(r, "finish_reason", q->finish);
        if (q->code[0])
            cJSON_AddStringToObject(r, "error", q->code);
        else
            cJSON_AddNullToObject(r, "error");
        cJSON_AddItemToArray(reqs, r);
    }
    return j;
}

/* ---- one level ---- */

/* On a Redis Cluster, the request slots (common/rcluster.h) the ids are
 * chosen on: the shared readers' (made for the same map), or asked for
 * when each request reads on its own; none on a single instance, whose ids
 * need no slot, nor when Redis cannot be reached now (the requests then
 * say so themselves). */
static void request_slots(struct lb_run *run)
{
    const int *slots;
    if (run->mux) {
        run->n_slots = xmux_set_slots(run->mux, &slots);
        memcpy(run->slots, slots, sizeof *slots * (size_t)run->n_slots);
        return;
    }
    struct rl_err e;
    struct rconn_opts ro;
    rconn_opts_default(&ro);
    ro.addr = run->o->redis;
    ro.client_name = "redlm-bench";
    struct rconn *c = NULL;
    if (!rconn_create(&c, &ro, &e) && !rconn_wait(c, 2000, &e))
        run->n_slots = rconn_request_slots(c, run->slots, RCL_MAX_NODES);
    rconn_free(c);
}

static int run_level(const struct lb_opts *o, const struct lb_prompts *prompts, const char *run_id,
                     int level_idx, struct lb_run *run, struct rl_err *err)
{
    memset(run, 0, sizeof *run);
    pthread_mutex_init(&run->mu, NULL);
    run->o = o;
    run->prompts = prompts;
    run->run_id = run_id;
    run->level_idx = level_idx;
    run->level = o->levels[level_idx];
    run->open = o->rate > 0;
    run->n_clients = run->open ? o->clients : (int)run->level;
    if (run->n_clients > o->requests)
        run->n_clients = o->requests;
    run->reqs = calloc((size_t)o->requests, sizeof *run->reqs);
    if (!run->reqs)
        return rl_errf(err, RL_ENOMEM, "out of memory for %d requests", o->requests);
    for (int i = 0; i < o->requests; i++) {
        struct lb_req *q = &run->reqs[i];
        q->t_sched = q->t_sent = q->t_first = q->t_last = q->t_done = -1;
    }
    if (run->open) {
        run->arrivals = malloc((size_t)o->requests * sizeof *run->arrivals);
        if (!run->arrivals)
            return rl_errf(err, RL_ENOMEM, "out of memory for %d arrivals", o->requests);
        struct lst_rng r;
        lst_rng_seed(&r, lst_seed_mix(o->seed, 0x617272ull, (uint64_t)level_idx));
        lst_poisson_arrivals(&r, run->level, o->requests, run->arrivals);
    }
    pthread_t *th = calloc((size_t)run->n_clients, sizeof *th);
    if (!th)
        return rl_errf(err, RL_ENOMEM, "out of memory for %d clients", run->n_clients);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024); /* blocked on a socket; 1024 of them fit */
    if (!o->own_reads) {
        struct rconn_opts ro;
        rconn_opts_default(&ro);
        ro.addr = o->redis;
        ro.client_name = "redlm-bench";
        struct rl_err e = {0}, note;
        int rc = xmux_set_create(&run->mux, &ro, o->prefix, !o->no_bell, &note, &e);
        run->read = rc ? "own" : o->no_bell || note.code ? "all" : "shared";
        if (rc && level_idx == 0)
            fprintf(stderr, "redlm bench: each request reads its own stream: %s\n", e.msg);
    } else {
        run->read = "own";
    }
    if (!o->own_ids)
        request_slots(run);
    run->t0 = rl_mono_s();
    int started = 0, rc = 0;
    for (; started < run->n_clients; started++)
        if (pthread_create(&th[started], &attr, client_main, run)) {
            rc = rl_errf(err, RL_EIO, "could not start client thread %d", started);
            pthread_mutex_lock(&run->mu);
            run->stop = true;
            pthread_mutex_unlock(&run->mu);
            break;
        }
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (run->mux) {
        struct xmux_stats st;
        xmux_set_stats(run->mux, &st);
        if (!strcmp(run->read, "shared") && !st.bell_on)
            run->read = "all"; /* a writer did not ring: it went back to blocking on every stream */
        run->mux_reads = st.reads;
        run->mux_named = st.named;
    }
    xmux_set_free(run->mux);
    run->mux = NULL;
    run->n_slots = 0;
    pthread_attr_destroy(&attr);
    free(th);
    return rc;
}

static void run_free(struct lb_run *run)
{
    if (run->reqs)
        for (int i = 0; i < run->o->requests; i++)
            free(run->reqs[i].ev);
    free(run->reqs);
    free(run->arrivals);
    if (run->o)
        pthread_mutex_destroy(&run->mu);
    memset(run, 0, sizeof *run);
}

/* ---- checks and plots ---- */

static int preflight(const struct lb_opts *o, struct rl_err *err)
{
    struct rconn_opts ro;
    rconn_opts_default(&ro);
    ro.addr = o->redis;
    struct rconn *c = NULL;
    int rc = rconn_create(&c, &ro, err);
    if (rc < 0)
        return rc;
    if ((rc = rconn_wait(c, 3000, err)) < 0) /* the message names the address */
        goto out;
    if (!o->check)
        goto out;
    char pat[256];
    bool disp = o->target == LB_TARGET_DISPATCHER;
    snprintf(pat, sizeof pat, "%s%s:*", o->prefix, disp ? "dispatcher" : "worker");
    long n = 0;
    /* a deployment started a moment ago may not have written its first
     * heartbeat yet: give it a few seconds */
    for (double until = rl_mono_s() + 5; ; ) {
        if ((rc = cli_any_key(c, pat, &n, err)) < 0)
            goto out;
        if (n > 0 || rl_mono_s() >= until)
            break;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (n == 0)
        rc = disp ? rl_errf(err, RL_ENOTFOUND,
                            "no dispatcher heartbeat (%s) in %s: start redlm-dispatcher, or send "
                            "to the workers directly with --target pool:fast or --target pools "
                            "(--no-check skips this check)", pat, o->redis)
                  : rl_errf(err, RL_ENOTFOUND,
                            "no worker heartbeat (%s) in %s: start redlm-worker with --prefix %s "
                            "(--no-check skips this check)", pat, o->redis, o->prefix);
out:
    rconn_free(c);
    return rc;
}

/* Looks gnuplot up in PATH, so that its absence is one clear warning. */
static bool have_gnuplot(void)
{
    const char *path = getenv("PATH");
    if (!path)
        return false;
    char buf[4096];
    for (const char *p = path; *p;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        if (len && len + 10 < sizeof buf) {
            memcpy(buf, p, len);
            strcpy(buf + len, "/gnuplot");
            if (!access(buf, X_OK))
                return true;
        }
        p += len + (colon ? 1 : 0);
    }
    return false;
}

/* Copies s with the characters a gnuplot string in single quotes cannot
 * hold replaced. */
static void gp_str(char *dst, size_t n, const char *s)
{
    size_t k = 0;
    for (; s && *s && k + 1 < n; s++)
        dst[k++] = (*s == '\'' || *s == '\\' || *s == '\n' || *s == '@') ? '_' : *s;
    dst[k] = 0;
}

static int write_plots(const struct lb_opts *o, const char *dir, const struct lb_level *lv, int n_lv,
                       cJSON *plots, struct rl_err *err)
{
    char dat1[4096], dat2[4096], gp[4096], png1[4096], png2[4096];
    if (snprintf(dat1, sizeof dat1, "%s/load.dat", dir) >= (int)sizeof dat1 ||
        snprintf(dat2, sizeof dat2, "%s/timeline.dat", dir) >= (int)sizeof dat2 ||
        snprintf(gp, sizeof gp, "%s/plots.gp", dir) >= (int)sizeof gp ||
        snprintf(png1, sizeof png1, "%s/latency.png", dir) >= (int)sizeof png1 ||
        snprintf(png2, sizeof png2, "%s/throughput.png", dir) >= (int)sizeof png2)
        return rl_errf(err, RL_EINVAL, "%.200s...: directory name too long", dir);
    FILE *f = fopen(dat1, "w");
    if (!f)
        return rl_errf(err, RL_EIO, "%s: %s", dat1, strerror(errno));
    fprintf(f, "# level ttft_p50 ttft_p90 ttft_p99 e2e_p50 e2e_p90 e2e_p99 tpot_p50 tpot_p90 "
               "tpot_p99 requests_per_s output_tokens_per_s (ms, ms/token, per second)\n");
    for (int i = 0; i < n_lv; i++)
        fprintf(f, "%g %.3f %.3f %.3f %.3f %.3f %.3f %.3f %.3f %.3f %.4f %.3f\n", lv[i].level,
                lv[i].ttft.p50, lv[i].ttft.p90, lv[i].ttft.p99, lv[i].e2e.p50, lv[i].e2e.p90,
                lv[i].e2e.p99, lv[i].tpot.p50, lv[i].tpot.p90, lv[i].tpot.p99, lv[i].req_per_s,
                lv[i].tok_per_s);
    if (fclose(f))
        return rl_errf(err, RL_EIO, "%s: write error", dat1);
    if (!(f = fopen(dat2, "w")))
        return rl_errf(err, RL_EIO, "%s: %s", dat2, strerror(errno));
    double max_x = 0;
    for (int i = 0; i < n_lv; i++) {
        fprintf(f, "# level %g: time_s requests/s output_tokens/s (1 s buckets)\n", lv[i].level);
        int nb = lv[i].tl_req.n > lv[i].tl_tok.n ? lv[i].tl_req.n : lv[i].tl_tok.n;
        /* only whole seconds: the level ends inside its last bucket, whose
         * count over a full second would draw a false drop at the end. A
         * level shorter than a second is one bucket as wide as the level. */
        int whole = (int)floor(lv[i].tl_end_s + 1e-9);
        if (whole > nb)
            whole = nb;
        double w = 1;
        if (whole == 0 && nb > 0) {
            whole = 1;
            w = lv[i].tl_end_s > 0 ? lv[i].tl_end_s : 1;
        }
        /* each second as two points, its start and its end, so that lines
         * draw it as a flat step across its whole width (a lone bucket too) */
        for (int b = 0; b < whole; b++) {
            double r = (b < lv[i].tl_req.n ? lv[i].tl_req.sum[b] : 0) / w;
            double t = (b < lv[i].tl_tok.n ? lv[i].tl_tok.sum[b] : 0) / w;
            fprintf(f, "%g %g %g\n%g %g %g\n", b * w, r, t, (b + 1) * w, r, t);
        }
        if (whole * w > max_x)
            max_x = whole * w;
        if (nb == 0)
            fprintf(f, "0 0 0\n1 0 0\n");
        fprintf(f, "\n\n"); /* a gnuplot data block: `index i` */
    }
    if (fclose(f))
        return rl_errf(err, RL_EIO, "%s: write error", dat2);

    bool open = o->rate > 0;
    const char *xl = open ? "offered load (requests/s, Poisson arrivals)" : "concurrent clients (closed loop)";
    const char *unit = open ? "req/s" : "clients";
    char label[256], qd1[4096], qd2[4096], qp1[4096], qp2[4096];
    gp_str(label, sizeof label, o->label ? o->label : o->target_text);
    gp_str(qd1, sizeof qd1, dat1);
    gp_str(qd2, sizeof qd2, dat2);
    gp_str(qp1, sizeof qp1, png1);
    gp_str(qp2, sizeof qp2, png2);
    /* explicit y ranges with headroom: an autoscaled range ends at the
     * highest point, which then hides under the border or the key */
    double lo = lv[0].level, hi = lv[0].level, y_lat = 0, y_tpot = 0, y_tok = 0, y_req = 0;
    for (int i = 0; i < n_lv; i++) {
        lo = fmin(lo, lv[i].level);
        hi = fmax(hi, lv[i].level);
        y_lat = fmax(y_lat, fmax(lv[i].e2e.p99, lv[i].ttft.p99));
        y_tpot = fmax(y_tpot, lv[i].tpot.p99);
        y_tok = fmax(y_tok, lv[i].tok_per_s);
        y_req = fmax(y_req, lv[i].req_per_s);
    }
#define YTOP(y) ((y) > 0 ? (y) * 1.25 : 1.0)
    if (!(f = fopen(gp, "w")))
        return rl_errf(err, RL_EIO, "%s: %s", gp, strerror(errno));
    fprintf(f, "# made by redlm bench; run: gnuplot %s\n", gp);
    fprintf(f, "set terminal pngcairo size 1300,860 font ',10'\n");
    fprintf(f, "set output '%s'\nset grid\nset key top left box opaque\n", qp1);
    fprintf(f, "set offsets graph 0.05, graph 0.05, 0, 0\n");
    if (hi >= 4 * lo)
        fprintf(f, "set logscale x 2\n");
    if (hi == lo) /* one level: a range around it, not gnuplot's empty-range warning */
        fprintf(f, "set xrange [%g:%g]\n", lo * 0.5, lo * 1.5);
    fprintf(f, "set multiplot layout 2,2 title 'redlm bench: latency and throughput against load (%s)'\n",
            label);
    fprintf(f, "set xlabel '%s'\nset ylabel 'latency (ms)'\nset yrange [0:%g]\n", xl, YTOP(y_lat));
    fprintf(f, "set title 'end-to-end and time to first token'\n");
    fprintf(f, "plot '%s' u 1:5 w lp lw 2 t 'E2E p50', '' u 1:7 w lp lw 2 t 'E2E p99', "
               "'' u 1:2 w lp t 'TTFT p50', '' u 1:4 w lp t 'TTFT p99'\n", qd1);
    fprintf(f, "set title 'time per output token'\nset ylabel 'TPOT (ms/token)'\nset yrange [0:%g]\n",
            YTOP(y_tpot));
    fprintf(f, "plot '%s' u 1:8 w lp lw 2 t 'TPOT p50', '' u 1:9 w lp t 'TPOT p90', "
               "'' u 1:10 w lp t 'TPOT p99'\n", qd1);
    /* tokens/s and requests/s each on axes of their own: on one plot with
     * two y scales the eye compares heights that mean nothing together */
    fprintf(f, "set title 'output token throughput'\nset ylabel 'output tokens/s'\nset yrange [0:%g]\n",
            YTOP(y_tok));
    fprintf(f, "plot '%s' u 1:12 w lp lw 2 t 'output tokens/s'\n", qd1);
    fprintf(f, "set title 'request throughput'\nset ylabel 'completed requests/s'\nset yrange [0:%g]\n",
            YTOP(y_req));
#undef YTOP
    fprintf(f, "plot '%s' u 1:11 w lp lw 2 t 'requests/s'\n", qd1);
    fprintf(f, "unset multiplot\nunset logscale x\nset offsets 0,0,0,0\n");
    fprintf(f, "set output '%s'\nset terminal pngcairo size 1200,720 font ',10'\n", qp2);
    fprintf(f, "set multiplot layout 2,1 title 'redlm bench: throughput over time, 1 s buckets (%s)'\n", label);
    fprintf(f, "set xlabel 'time since the level started (s)'\nset key top right box opaque\n");
    fprintf(f, "set xrange [0:%g]\n", max_x > 0 ? max_x : 1);
    fprintf(f, "set title ''\nset ylabel 'output tokens/s'\nset yrange [0:*]\nset offsets 0, 0, graph 0.15, 0\nplot ");
    for (int i = 0; i < n_lv; i++)
        fprintf(f, "%s'%s' index %d u 1:3 w l lw 2 t '%g %s'", i ? ", " : "", qd2, i, lv[i].level, unit);
    fprintf(f, "\nset ylabel 'completed requests/s'\nplot ");
    for (int i = 0; i < n_lv; i++)
        fprintf(f, "%s'%s' index %d u 1:2 w l lw 2 t '%g %s'", i ? ", " : "", qd2, i, lv[i].level, unit);
    fprintf(f, "\nunset multiplot\n");
    if (fclose(f))
        return rl_errf(err, RL_EIO, "%s: write error", gp);

    char *argv[] = {"gnuplot", gp, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ);
    if (rc)
        return rl_errf(err, RL_EIO, "gnuplot: %s", strerror(rc));
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        return rl_errf(err, RL_EIO, "gnuplot %s failed (status %d)", gp, st);
    cJSON_AddItemToArray(plots, cJSON_CreateString(png1));
    cJSON_AddItemToArray(plots, cJSON_CreateString(png2));
    return 0;
}

static int mkdirs(const char *dir, struct rl_err *err)
{
    char buf[4096];
    size_t n = strlen(dir);
    if (n >= sizeof buf)
        return rl_errf(err, RL_EINVAL, "%s: path too long", dir);
    memcpy(buf, dir, n + 1);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || !*p) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0777) && errno != EEXIST)
                return rl_errf(err, RL_EIO, "mkdir %s: %s", buf, strerror(errno));
            *p = c;
            if (!c)
                break;
        }
    }
    return 0;
}

static int write_file(const char *path, const char *text, struct rl_err *err)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return rl_errf(err, RL_EIO, "%s: %s", path, strerror(errno));
    fputs(text, f);
    fputc('\n', f);
    if (fclose(f))
        return rl_errf(err, RL_EIO, "%s: write error", path);
    return 0;
}

static void print_table(const struct lb_opts *o, const struct lb_level *lv, int n)
{
    /* units in the header, so a pasted table still says what it measures */
    fprintf(stderr, "%12s %7s %8s %13s %13s %17s %12s %12s %6s %6s\n",
            o->rate > 0 ? "rate (req/s)" : "clients", "req/s", "tok/s", "ttft p50 (ms)",
            "ttft p99 (ms)", "tpot p50 (ms/tok)", "e2e p50 (ms)", "e2e p99 (ms)", "errors", "cached");
    for (int i = 0; i < n; i++)
        fprintf(stderr, "%12g %7.2f %8.1f %13.1f %13.1f %17.2f %12.1f %12.1f %6d %5.0f%%\n", lv[i].level,
                lv[i].req_per_s, lv[i].tok_per_s, lv[i].ttft.p50, lv[i].ttft.p99, lv[i].tpot.p50,
                lv[i].e2e.p50, lv[i].e2e.p99, lv[i].n_errors,
                lv[i].completed ? 100.0 * lv[i].n_cached / lv[i].completed : 0);
}

int cmd_loadbench(int argc, char **argv)
{
    struct lb_opts o;
    struct rl_err err = {0};
    int rc = lb_parse(argc, argv, &o, &err);
    if (rc > 0) {
        lb_usage(stdout);
        return 0;
    }
    if (rc < 0) {
        fprintf(stderr, "redlm bench: %s\n", err.msg);
        return 2;
    }
    struct lb_prompts prompts = {0};
    struct lb_level lv[LB_LEVELS_MAX];
    struct lb_run runs[LB_LEVELS_MAX];
    int n_done = 0, status = 1;
    cJSON *full = NULL, *summary = NULL;
    memset(runs, 0, sizeof runs);
    if (o.prompts_path && (rc = prompts_load(o.prompts_path, &prompts, &err)) < 0)
        goto out;
    if ((rc = preflight(&o, &err)) < 0)
        goto out;
    char run_id[32];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(run_id, sizeof run_id, "lb%08llx",
             (unsigned long long)(lst_seed_mix((uint64_t)ts.tv_nsec, (uint64_t)ts.tv_sec,
                                               (uint64_t)getpid()) & 0xffffffffull));
    int64_t started_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    for (int l = 0; l < o.n_levels; l++) {
        fprintf(stderr, "redlm bench: level %g %s: %d requests at most, %g s at most\n", o.levels[l],
                o.rate > 0 ? "requests/s" : "clients", o.requests, o.duration_s);
        rc = run_level(&o, prompts.n ? &prompts : NULL, run_id, l, &runs[l], &err);
        n_done = l + 1;
        if (rc < 0 || (rc = level_stats(&runs[l], &lv[l], &err)) < 0) {
            n_done = l; /* lv[l] is not filled */
            goto out;
        }
        if (lv[l].err_msg[0])
            fprintf(stderr, "redlm bench: redis trouble during the level: %s\n", lv[l].err_msg);
    }
    print_table(&o, lv, n_done);

    full = cJSON_CreateObject();
    summary = cJSON_CreateObject();
    cJSON *docs[2] = {full, summary};
    for (int d = 0; d < 2; d++) {
        cJSON *j = docs[d];
        cJSON_AddStringToObject(j, "tool", "redlm bench");
        if (o.label)
            cJSON_AddStringToObject(j, "label", o.label);
        cJSON_AddStringToObject(j, "run_id", run_id);
        cJSON_AddNumberToObject(j, "started_ms", (double)started_ms);
        cJSON_AddStringToObject(j, "redis", o.redis);
        cJSON_AddStringToObject(j, "prefix", o.prefix);
        cJSON_AddStringToObject(j, "target", o.target_text);
        cJSON *op = cJSON_AddObjectToObject(j, "options");
        cJSON_AddStringToObject(op, "loop", o.rate > 0 ? "open" : "closed");
        cJSON_AddStringToObject(op, "read", o.own_reads ? "own" : o.no_bell ? "all" : "shared");
        cJSON_AddStringToObject(op, "ids", o.own_ids ? "own" : "slots");
        cJSON_AddNumberToObject(op, "clients", o.clients);
        cJSON_AddNumberToObject(op, "requests", o.requests);
        cJSON_AddNumberToObject(op, "duration_s", o.duration_s);
        cJSON_AddNumberToObject(op, "warmup", o.warmup);
        cJSON_AddNumberToObject(op, "timeout_s", o.timeout_s);
        if (o.prompts_path)
            cJSON_AddStringToObject(op, "prompts", o.prompts_path);
        cJSON_AddNumberToObject(op, "prompt_words_min", o.prompt_len.lo);
        cJSON_AddNumberToObject(op, "prompt_words_max", o.prompt_len.hi);
        cJSON_AddNumberToObject(op, "output_len_min", o.output_len.lo);
        cJSON_AddNumberToObject(op, "output_len_max", o.output_len.hi);
        cJSON_AddNumberToObject(op, "think", o.think);
        cJSON_AddNumberToObject(op, "auto", o.auto_frac);
        cJSON_AddNumberToObject(op, "repeat", o.repeat);
        cJSON_AddNumberToObject(op, "hot", o.hot);
        cJSON_AddNumberToObject(op, "temperature", o.temperature);
        cJSON_AddNumberToObject(op, "seed", (double)o.seed);
        cJSON *levels = cJSON_AddArrayToObject(j, "levels");
        for (int l = 0; l < n_done; l++)
            cJSON_AddItemToArray(levels, level_json(&o, &lv[l], &runs[l], d == 0));
    }
    cJSON *plots = cJSON_AddArrayToObject(full, "plots");
    if (o.out) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", o.out);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            strcpy(dir, ".");
        if (slash && dir[0] && (rc = mkdirs(dir, &err)) < 0)
            goto out;
        if (!o.plots)
            ;
        else if (!have_gnuplot())
            fprintf(stderr, "redlm bench: gnuplot is not installed (apt-get install gnuplot-nox); "
                            "writing the JSON without plots\n");
        else if ((rc = write_plots(&o, slash && !dir[0] ? "/" : dir, lv, n_done, plots, &err)) < 0)
            fprintf(stderr, "redlm bench: no plots: %s\n", err.msg);
        char *text = cJSON_Print(full);
        if (!text) {
            rc = rl_errf(&err, RL_ENOMEM, "out of memory writing the result");
            goto out;
        }
        rc = write_file(o.out, text, &err);
        free(text);
        if (rc < 0)
            goto out;
        cJSON_AddItemToObject(summary, "out", cJSON_CreateString(o.out));
        cJSON_AddItemToObject(summary, "plots", cJSON_Duplicate(plots, 1));
    }
    char *s = cJSON_PrintUnformatted(summary);
    if (s)
        printf("%s\n", s);
    free(s);
    status = 0; /* failed requests are a measurement (errors by code), not a failure to run */
out:
    if (status == 1)
        fprintf(stderr, "redlm bench: %s\n", err.msg);
    cJSON_Delete(full);
    cJSON_Delete(summary);
    for (int l = 0; l < n_done; l++)
        level_free(&lv[l]);
    for (int l = 0; l < o.n_levels; l++)
        if (runs[l].o)
            run_free(&runs[l]);
    prompts_free(&prompts);
    return status;
}
