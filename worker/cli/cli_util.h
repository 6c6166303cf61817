/* worker/cli/cli_util.h - small helpers the subcommands share: number and
 * list parsing with clear errors, opening a model on a backend, catching a
 * signal. */
#ifndef RL_CLI_UTIL_H
#define RL_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "err.h"
#include "model.h"

/* Parses "1,2,3" into a malloc'd array (*out, caller frees). */
int cli_parse_ids(const char *s, int32_t **out, int *n, struct rl_err *err);
/* Parses a decimal integer in [lo, hi]; `what` names the flag in errors. */
int cli_parse_int(const char *s, long lo, long hi, long *v, const char *what, struct rl_err *err);

/* One command-line option of a subcommand, for cli_parse_opts. A
 * subcommand lists its options in a table of these (ended by a NULL name)
 * pointing into its own argument record, so the loop, the "needs a value"
 * and "unknown option" errors and the range checks live here once. */
enum cli_opt_type {
    CLI_OPT_FLAG,   /* takes no value: *(int *)field = 1 */
    CLI_OPT_STR,    /* *(const char **)field = the argv string (not copied) */
    CLI_OPT_INT,    /* *(int *)field, a decimal integer in [lo, hi] */
    CLI_OPT_DOUBLE, /* *(double *)field, a number >= lo */
};
struct cli_opt {
    const char *name;  /* "--gen"; NULL ends the table */
    const char *alias; /* another spelling ("-n"), or NULL */
    enum cli_opt_type type;
    void *field;       /* where the value goes (see the type) */
    long lo, hi;       /* CLI_OPT_INT's bounds; CLI_OPT_DOUBLE's minimum */
};
/* Parses argv[1 .. argc) against opts. Returns 0; 1 when -h or --help is
 * given (the caller prints its usage); or RL_EINVAL with err naming the
 * flag (unknown option, missing value, not a number, out of range). Fields
 * of options not given keep what the caller put there. */
int cli_parse_opts(int argc, char **argv, const struct cli_opt *opts, struct rl_err *err);

/* A model loaded on a backend with a KV pool, for the engine commands. */
struct cli_model {
    struct model *model;
    struct backend *be;
    int n_blocks, block_size;
};

struct cli_model_opts {
    const char *dir;
    const char *backend; /* "cpu" (default) or "cuda" */
    int n_threads;       /* 0 = all cores */
    const char *isa;     /* NULL = auto */
    const char *kv;      /* "auto" | "f32" | "bf16" */
    int max_tokens;      /* per forward step */
    int n_blocks, block_size;
    int kv_prefault;     /* be_options.kv_prefault */
    const char *quantize; /* --quantize none|q8_0 (CPU): be_options.quantize */
};

/* What the engine commands (logits, run, bench-engine, and run and
 * bench-engine --speculative) have in common. */
struct cli_engine_args {
    struct cli_model_opts mo; /* --model, --backend, --isa, --threads (--kv: logits,
                                 run, bench-engine only) */
    const char *tokens;       /* --tokens 1,2,3 */
    int all;                  /* logits --all */
    int n_gen;                /* -n, --max-tokens (32) */
    int ignore_eos;           /* --ignore-eos */
    double temperature;       /* --temperature (0) */
    int prompt, gen, batch;   /* bench-engine's shape; defaults: the caller's */
};
#define CLI_ENGINE_N_OPTS 12
/* Writes the entries of the options above that every engine command takes
 * (all but --kv and --all) into opts[0 .. CLI_ENGINE_N_OPTS), pointing into
 * a, and sets their defaults (backend cpu, -n 32, batch 1); the caller adds
 * its own entries and the NULL end. Returns CLI_ENGINE_N_OPTS. */
int cli_engine_opts(struct cli_opt *opts, struct cli_engine_args *a);
/* Sets the bounds of table entry `name` (a command narrowing a shared
 * option); returns -1 when there is none. */
int cli_opt_bounds(struct cli_opt *opts, const char *name, long lo, long hi);

/* Loads with the progress display below on stderr. */
int cli_model_open(struct cli_model *cm, const struct cli_model_opts *o, struct rl_err *err);
void cli_model_close(struct cli_model *cm);

/* Weight-loading progress on stderr, as a be_progress_fn (user = a struct
 * cli_progress): "loading DIR: 12.3/28.0 GB  44%" redrawn in place on a
 * terminal, and only the final line ("... 100%  4.2 s") otherwise, so logs
 * and pipes get one line per load. */
struct cli_progress {
    const char *what; /* the model directory, named in the line */
    int tty;          /* stderr is a terminal */
    double t0;        /* monotonic seconds at init */
};
void cli_progress_init(struct cli_progress *p, const char *what);
void cli_progress_show(void *user, size_t done, size_t total);
/* "12.3/28.0 GB" (or MB below 1 GB) into buf. */
void cli_format_size(char *buf, size_t n, size_t done, size_t total);

/* Calls fn on signal sig, without SA_RESTART, so that a blocking read
 * returns at once and the command's loop sees the flag fn sets. */
void cli_on_signal(int sig, void (*fn)(int));

/* Prints a float so that it reads back to the same value. */
void cli_print_float(float f);

#endif
