/* worker/wopts.c - the worker's option table and its three readers.
 *
 * Every option is one row of `table`: its name in the config file, its
 * flag (the name with '_' -> '-'), type, default, bounds and help. The
 * libconfig loader, the flag parser, --help and --print-config all walk
 * the same rows, so an option cannot be documented in one place and
 * missing in another (Redis's config.c does the same).
 *
 * Order of precedence: table default < config file < flags. The file is
 * read before any other flag is applied whatever its place in argv.
 * Called from main() before anything else runs, and again from the SIGHUP
 * path (wopts_load_file into a copy); single-threaded. */
#include "wopts.h"

#include <errno.h>
#include <libconfig.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum opt_type { OPT_INT, OPT_STR, OPT_BOOL };

struct opt {
    const char *name;
    enum opt_type type;
    size_t off;
    size_t size;       /* bytes of a string field */
    const char *def;   /* default, as text */
    long min, max;     /* OPT_INT bounds */
    const char *help;
};

#define S(f) OPT_STR, offsetof(struct wopts, f), sizeof(((struct wopts *)0)->f)
#define I(f) OPT_INT, offsetof(struct wopts, f), 0
#define B(f) OPT_BOOL, offsetof(struct wopts, f), 0

static const struct opt table[] = {
    {"redis", S(redis), "127.0.0.1:6379", 0, 0, "Redis address: host:port, [v6]:port or unix:/path"},
    {"redis_user", S(redis_user), "", 0, 0, "ACL user for AUTH (empty: password only)"},
    {"redis_password_file", S(redis_password_file), "", 0, 0,
     "file holding the Redis password (empty: no AUTH); re-read at each connect"},
    {"prefix", S(prefix), "redlm:", 0, 0, "prefix of every key"},
    {"group", S(group), "workers", 0, 0, "consumer group on the pool streams"},
    {"name", S(name), "", 0, 0, "consumer name of this worker (empty: hostname-pid)"},
    {"pools", S(pools), "fast,think", 0, 0, "pools served, in priority order (comma list)"},
    {"model", S(model), "", 0, 0, "Hugging Face Qwen3 checkpoint directory"},
    {"backend", S(backend), "cpu", 0, 0, "compute backend: cpu or cuda"},
    {"threads", I(threads), "0", 0, 4096, "backend threads (0: all cores)"},
    {"kv_mb", I(kv_mb), "1024", 1, 1 << 22, "KV-cache budget in MiB"},
    {"max_batch", I(max_batch), "16", 1, 4096, "running sequences at most"},
    {"token_budget", I(token_budget), "512", 1, 1 << 20, "tokens computed per step at most"},
    {"read_block_ms", I(read_block_ms), "1000", 1, 60000,
     "XREADGROUP BLOCK time when nothing runs (bounds how late timers fire when idle)"},
    {"claim_idle_ms", I(claim_idle_ms), "30000", 10, 86400000,
     "reclaim jobs of other consumers idle longer than this"},
    {"claim_interval_ms", I(claim_interval_ms), "5000", 10, 3600000, "how often to XAUTOCLAIM"},
    {"lease_renew_ms", I(lease_renew_ms), "5000", 10, 3600000,
     "renew our running jobs (XCLAIM JUSTID) this often; keep well under claim_idle_ms"},
    {"max_deliveries", I(max_deliveries), "3", 1, 1000,
     "a job delivered more often than this goes to the dead-letter stream"},
    {"cache_ttl_s", I(cache_ttl_s), "3600", 0, 365 * 86400,
     "result-cache TTL for deterministic jobs (0: no cache)"},
    {"heartbeat_ms", I(heartbeat_ms), "2000", 10, 600000, "heartbeat key refresh period"},
    {"heartbeat_ttl_s", I(heartbeat_ttl_s), "10", 1, 3600, "heartbeat key TTL"},
    {"metrics_port", I(metrics_port), "0", 0, 65535,
     "loopback port for /healthz and /metrics (0: off)"},
    {"metrics_addr", S(metrics_addr), "127.0.0.1", 0, 0, "address the metrics endpoint binds"},
    {"drain_timeout_s", I(drain_timeout_s), "30", 0, 86400,
     "SIGTERM: finish running jobs for at most this long (the rest are left to be reclaimed)"},
    {"dead_maxlen", I(dead_maxlen), "100000", 0, 1 << 30,
     "approximate cap of the dead-letter stream (0: none)"},
    {"max_job_kb", I(max_job_kb), "4096", 1, 1 << 20, "job text above this is JOB_TOO_LARGE"},
    {"default_max_tokens", I(default_max_tokens), "1024", 1, 1 << 20,
     "max_tokens of a job that gives none"},
    {"max_max_tokens", I(max_max_tokens), "1048576", 1, 1 << 20, "largest max_tokens accepted"},
    {"default_stream_ttl_s", I(default_stream_ttl_s), "3600", 1, 7 * 86400,
     "out-stream TTL after done when the job gives none"},
    {"publish", B(publish), "false", 0, 0, "also PUBLISH each event on <prefix>tok:<id>"},
    {"log_level", S(log_level), "info", 0, 0, "error, warn, info or debug"},
};
#define N_OPTS (sizeof table / sizeof table[0])

static int set_value(struct wopts *o, const struct opt *p, const char *v, const char *where,
                     struct rl_err *err)
{
    char *f = (char *)o + p->off;
    switch (p->type) {
    case OPT_STR:
        if (strlen(v) >= p->size)
            return rl_errf(err, RL_EINVAL, "%s: %s is longer than %zu bytes", where, p->name,
                           p->size - 1);
        strcpy(f, v);
        return 0;
    case OPT_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "1"))
            *(bool *)f = true;
        else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "0"))
            *(bool *)f = false;
        else
            return rl_errf(err, RL_EINVAL, "%s: %s must be true or false, not \"%s\"", where,
                           p->name, v);
        return 0;
    case OPT_INT: {
        errno = 0;
        char *end;
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end)
            return rl_errf(err, RL_EINVAL, "%s: %s must be an integer, not \"%s\"", where,
                           p->name, v);
        if (x < p->min || x > p->max)
            return rl_errf(err, RL_EINVAL, "%s: %s = %ld is out of range [%ld, %ld]", where,
                           p->name, x, p->min, p->max);
        *(int *)f = (int)x;
        return 0;
    }
    }
    return rl_errf(err, RL_EINTERNAL, "bad option type");
}

void wopts_default(struct wopts *o)
{
    memset(o, 0, sizeof *o);
    for (size_t i = 0; i < N_OPTS; i++)
        if (set_value(o, &table[i], table[i].def, "default", NULL))
            abort(); /* a bad row in the table: a bug */
}

static const struct opt *find(const char *name)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (!strcmp(table[i].name, name))
            return &table[i];
    return NULL;
}

int wopts_load_file(struct wopts *o, const char *path, struct rl_err *err)
{
    config_t cf;
    config_init(&cf);
    int rc = 0;
    if (config_read_file(&cf, path) != CONFIG_TRUE) {
        rc = rl_errf(err, RL_EINVAL, "%s:%d: %s",
                     config_error_file(&cf) ? config_error_file(&cf) : path,
                     config_error_line(&cf), config_error_text(&cf));
        goto done;
    }
    config_setting_t *root = config_root_setting(&cf);
    for (int i = 0; i < config_setting_length(root); i++) {
        config_setting_t *s = config_setting_get_elem(root, (unsigned)i);
        const char *name = config_setting_name(s);
        char where[WOPTS_STR_MAX + 32];
        snprintf(where, sizeof where, "%s:%d", path, config_setting_source_line(s));
        const struct opt *p = find(name);
        if (!p) {
            rc = rl_errf(err, RL_EINVAL, "%s: unknown setting \"%s\"", where, name);
            goto done;
        }
        char buf[WOPTS_STR_MAX * 2];
        int t = config_setting_type(s);
        if (p->type == OPT_STR && !strcmp(name, "pools") && t == CONFIG_TYPE_ARRAY) {
            /* pools = ["fast", "think"]: joined back into the comma list */
            buf[0] = 0;
            for (int k = 0; k < config_setting_length(s); k++) {
                const char *e = config_setting_get_string_elem(s, (unsigned)k);
                if (!e) {
                    rc = rl_errf(err, RL_EINVAL, "%s: pools must be strings", where);
                    goto done;
                }
                if (strlen(buf) + strlen(e) + 2 >= sizeof buf) {
                    rc = rl_errf(err, RL_EINVAL, "%s: pools list too long", where);
                    goto done;
                }
                if (k)
                    strcat(buf, ",");
                strcat(buf, e);
            }
        } else if (p->type == OPT_STR && t == CONFIG_TYPE_STRING) {
            snprintf(buf, sizeof buf, "%s", config_setting_get_string(s));
        } else if (p->type == OPT_INT && t == CONFIG_TYPE_INT) {
            snprintf(buf, sizeof buf, "%d", config_setting_get_int(s));
        } else if (p->type == OPT_BOOL && t == CONFIG_TYPE_BOOL) {
            snprintf(buf, sizeof buf, "%s", config_setting_get_bool(s) ? "true" : "false");
        } else {
            rc = rl_errf(err, RL_EINVAL, "%s: %s must be %s", where, name,
                         p->type == OPT_INT ? "an integer" : p->type == OPT_BOOL ? "true or false"
                                                                                 : "a string");
            goto done;
        }
        if ((rc = set_value(o, p, buf, where, err)))
            goto done;
    }
done:
    config_destroy(&cf);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: redlm-worker [-c FILE] [--OPTION VALUE ...]\n"
               "  -c, --config FILE   libconfig file (flags override it)\n"
               "  --print-config      print a documented config with every default\n"
               "options (config name, flag with '-' for '_'):\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        char flag[64];
        snprintf(flag, sizeof flag, "%s", table[i].name);
        for (char *c = flag; *c; c++)
            if (*c == '_')
                *c = '-';
        fprintf(f, "  --%-22s %s (default \"%s\")\n", flag, table[i].help, table[i].def);
    }
}

void wopts_print_config(FILE *f)
{
    fprintf(f, "# redlm worker configuration (libconfig syntax). Every option is shown\n"
               "# with its default; flags (--name-with-dashes) override this file.\n\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *p = &table[i];
        fprintf(f, "# %s\n", p->help);
        if (p->type == OPT_INT)
            fprintf(f, "%s = %s;", p->name, p->def);
        else if (p->type == OPT_BOOL)
            fprintf(f, "%s = %s;", p->name, p->def);
        else
            fprintf(f, "%s = \"%s\";", p->name, p->def);
        if (p->type == OPT_INT)
            fprintf(f, "  # [%ld, %ld]", p->min, p->max);
        fprintf(f, "\n\n");
    }
}

int wopts_parse_args(struct wopts *o, int argc, char **argv, struct rl_err *err)
{
    /* the file first, so that flags override it wherever they stand */
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(argv[i], "--print-config")) {
            wopts_print_config(stdout);
            return 1;
        }
        if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) {
            if (i + 1 >= argc)
                return rl_errf(err, RL_EINVAL, "%s needs a file", argv[i]);
            snprintf(o->config_file, sizeof o->config_file, "%s", argv[i + 1]);
            int rc = wopts_load_file(o, argv[i + 1], err);
            if (rc)
                return rc;
            i++;
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-c") || !strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (strncmp(a, "--", 2))
            return rl_errf(err, RL_EINVAL, "unexpected argument \"%s\" (see --help)", a);
        char name[64];
        snprintf(name, sizeof name, "%s", a + 2);
        for (char *c = name; *c; c++)
            if (*c == '-')
                *c = '_';
        const struct opt *p = find(name);
        if (!p)
            return rl_errf(err, RL_EINVAL, "unknown flag %s (see --help)", a);
        const char *v;
        if (p->type == OPT_BOOL && (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2)))
            v = "true"; /* --publish alone */
        else if (i + 1 >= argc)
            return rl_errf(err, RL_EINVAL, "%s needs a value", a);
        else
            v = argv[++i];
        int rc = set_value(o, p, v, "flag", err);
        if (rc)
            return rc;
    }
    return 0;
}

int wopts_pools(const struct wopts *o, char bufs[WOPTS_MAX_POOLS][64], struct rl_err *err)
{
    int n = 0;
    const char *s = o->pools;
    while (*s) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 0 || len >= 64)
            return rl_errf(err, RL_EINVAL, "pools: bad pool name in \"%s\"", o->pools);
        if (n == WOPTS_MAX_POOLS)
            return rl_errf(err, RL_EINVAL, "pools: more than %d pools", WOPTS_MAX_POOLS);
        for (size_t k = 0; k < len; k++) {
            char c = s[k];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-'))
                return rl_errf(err, RL_EINVAL, "pools: \"%.*s\" has a character outside "
                               "[A-Za-z0-9_-]", (int)len, s);
        }
        memcpy(bufs[n], s, len);
        bufs[n][len] = 0;
        n++;
        s += len;
        if (*s == ',')
            s++;
    }
    if (n == 0)
        return rl_errf(err, RL_EINVAL, "pools: no pool given");
    return n;
}
