/* worker/cli/cli_redis.h - what the Redis-facing subcommands of build/redlm
 * (enqueue, tail, cancel, chat, stats, top) share: the connection flags,
 * connecting with a clear error, reading streams, and showing events. */
#ifndef RL_CLI_REDIS_H
#define RL_CLI_REDIS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "err.h"
#include "rconn.h"

#define CLI_KEY_MAX 512

/* --redis HOST:PORT (default $REDLM_REDIS or 127.0.0.1:6379), --prefix
 * (default $REDLM_PREFIX or "redlm:"), --user, --password-file. */
struct cli_redis_args {
    const char *addr;
    const char *prefix;
    const char *user;
    const char *password_file;
};

void cli_redis_args_default(struct cli_redis_args *a);
/* If argv[*i] is a connection flag, takes it and its value (advancing *i)
 * and returns 1; returns 0 for any other flag, -RL_EINVAL when the value
 * is missing. */
int cli_redis_flag(struct cli_redis_args *a, int argc, char **argv, int *i, struct rl_err *err);
/* The help lines of those flags. */
extern const char cli_redis_help[];

/* Connects once, now: a client command should say at once that Redis is
 * unreachable rather than retry in silence. Afterwards rconn reconnects
 * by itself on the next command. err: "cannot reach Redis at ADDR: why". */
int cli_redis_connect(struct rconn **out, const struct cli_redis_args *a, const char *client_name,
                      struct rl_err *err);

/* cli_redis_connect for command `redlm CMD` (client name redlm-CMD) that
 * says a failure itself, as "redlm CMD: why" on stderr. Returns 0, or the
 * negative code after saying it. */
int cli_redis_open(struct rconn **out, const struct cli_redis_args *a, const char *cmd);

/* Builds "<prefix><a><b>" into key; -RL_EINVAL when it does not fit. */
int cli_key(char key[CLI_KEY_MAX], const char *prefix, const char *a, const char *b,
            struct rl_err *err);

/* XREAD [BLOCK block_ms] COUNT count STREAMS key after: entries after the
 * ID `after` of one stream; a timeout or a missing stream gives 0 entries.
 * block_ms < 0: no BLOCK. */
int cli_xread(struct rconn *c, const char *key, const char *after, int count, int block_ms,
              struct rconn_entries *out, struct rl_err *err);

/* Whether a key matches pattern, by SCAN over every master: *found > 0
 * when one does (it stops at the first batch holding one, or after 10000
 * iterations a master). */
int cli_any_key(struct rconn *c, const char *pattern, long *found, struct rl_err *err);

/* SET <prefix>cancel:<id> <entry> EX 600: the worker cancels the request
 * of that entry (the ID its XADD returned) at its next step, or before
 * admission. entry NULL or "": the one the id's stream names (its first
 * event's request.entry), else "1" (whichever request runs under the id). */
int cli_cancel(struct rconn *c, const char *prefix, const char *id, const char *entry,
               struct rl_err *err);

/* Renders a request's events as text: deltas' content as it comes, the
 * reasoning apart from it - dim on a terminal, between "[reasoning]" and
 * "[/reasoning]" marker lines otherwise - and the end (done / error) as one
 * line on a second stream. Keeps the state across events of one request. */
struct cli_render {
    FILE *out;          /* the text; NULL = only track the state */
    FILE *info;         /* the done / error line; NULL = none */
    bool color;         /* ANSI dim for reasoning, else marker lines */
    bool hide_reasoning;
    bool in_reasoning;  /* inside the reasoning part now */
    bool at_bol;        /* the last character written to out was '\n' (or none) */
    /* filled at the end: */
    bool done;
    char finish[16];    /* finish_reason, or "" */
    char code[48];      /* the error event's code, or "" */
    char *content;      /* the answer text so far, malloc'd (the caller frees) */
    size_t n_content, cap_content;
};
void cli_render_init(struct cli_render *r, FILE *out, FILE *info, bool color);
/* One event (the `event` field's JSON). Returns 0, or -RL_EFORMAT for an
 * event that does not parse (shown as a warning and skipped by callers). */
int cli_render_event(struct cli_render *r, const char *json, size_t len, struct rl_err *err);
/* Ends the output early (interrupted, timed out): closes the reasoning
 * part (resets the terminal's dim) and the line. */
void cli_render_stop(struct cli_render *r);
void cli_render_free(struct cli_render *r);

/* Random lower-case hex into buf (n digits + NUL). */
void cli_random_hex(char *buf, int n);

#endif
