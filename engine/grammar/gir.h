/* engine/grammar/gir.h - the grammar library's internal IR (not for
 * callers outside engine/grammar/).
 *
 * Every constraint becomes a context-free grammar over bytes:
 *   - a builder (struct gir) holds rules whose bodies are expression trees
 *     (empty, nothing, byte set, rule reference, sequence, alternation,
 *     counted repetition); ebnf.c parses the documented syntax into it and
 *     schema.c writes that syntax for JSON Schemas and tool calls;
 *   - gir_build() turns each rule into a DFA over bytes whose states may
 *     also call other rules (push a return state), checks the grammar
 *     (defined, productive, not left-recursive, within size limits), trims
 *     states from which the document cannot be finished.
 * The result (struct gpda) is immutable and owned by the struct gram. */
#ifndef RL_GIR_H
#define RL_GIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

enum gx_kind { GX_NOTHING, GX_EMPTY, GX_BYTES, GX_REF, GX_SEQ, GX_ALT, GX_REP };

struct gx {
    int kind;  /* enum gx_kind */
    int a, b;  /* BYTES: set index; REF: rule; REP: min, max (-1 = unbounded) */
    int n;     /* SEQ/ALT: number of kids */
    int kids;  /* SEQ/ALT: offset into gir.kids; REP: the repeated expression */
};

struct gir_rule {
    char *name;  /* owned */
    int expr;    /* body, -1 while only referenced */
    int line, col; /* where first referenced or defined (for errors) */
};

/* The builder. Expression 0 is GX_NOTHING, 1 is GX_EMPTY. Allocation
 * failures set oom; the indices returned then are 0 and gir_build fails. */
struct gir {
    struct gx *ex; int n_ex, cap_ex;
    int *kids; int n_kids, cap_kids;
    uint32_t (*sets)[8]; int n_sets, cap_sets;
    struct gir_rule *rules; int n_rules, cap_rules;
    bool oom;
    const char *what; /* "grammar" or "schema": named in refusals */
};

void gir_init(struct gir *g);
void gir_fini(struct gir *g);
int gir_bytes(struct gir *g, const uint32_t set[8]);
int gir_byte(struct gir *g, uint8_t c);
int gir_seq(struct gir *g, const int *kids, int n);
int gir_alt(struct gir *g, const int *kids, int n);
int gir_rep(struct gir *g, int e, int min, int max);
int gir_ref(struct gir *g, int rule);
/* A literal byte string. */
int gir_lit(struct gir *g, const char *s, size_t len);
/* The UTF-8 encodings of code points lo..hi (surrogates excluded). */
int gir_cprange(struct gir *g, uint32_t lo, uint32_t hi);
/* Code point ranges, as the character classes of ebnf.c and the pattern
 * translator of schema.c use them. norm sorts and merges r in place and
 * returns the new count; neg writes the complement within 0..0x10ffff to
 * out (room for n + 1) and returns its count. */
struct gir_range { uint32_t lo, hi; };
int gir_ranges_norm(struct gir_range *r, int n);
int gir_ranges_neg(struct gir_range *r, int n, struct gir_range *out);

/* The rule named name (created, undefined, when new). -1 on oom. */
int gir_rule(struct gir *g, const char *name, size_t len, int line, int col);

/* ---- the built automaton ---- */
struct gref { int32_t rule, ret; uint8_t tail; /* ret is a bare final state: no frame */ };

struct gstate {
    int32_t next[256]; /* byte -> state, -1 none */
    int32_t rule;      /* the rule this state belongs to */
    int32_t ref_off;   /* refs[ref_off .. ref_off+n_ref) */
    uint16_t n_ref;
    uint8_t final;     /* the rule may end here */
    uint8_t has_byte;  /* some next[] >= 0 */
};

struct gpda {
    struct gstate *st; int n_st;
    struct gref *refs; int n_refs;
    int32_t *rule_start; /* (n_rules) */
    int n_rules;
    int root;            /* root rule */
};

/* Builds the automaton for start rule `root`. Refusals (undefined rule,
 * left recursion, nothing matches, too large) are EV_CODE_BAD_PARAM with
 * the message prefixed by what; out is zeroed on failure. */
int gir_build(const struct gir *g, int root, struct gpda *out, struct rl_err *err);
void gpda_fini(struct gpda *p);

/* ebnf.c: parses src into g; the start rule is "root" (returned in *root). */
int gir_parse_ebnf(struct gir *g, const char *src, size_t len, int *root, struct rl_err *err);

/* schema.c: writes the EBNF text (malloc'd, NUL-terminated, caller frees)
 * for a JSON Schema, any JSON object, or a tool call. */
int gschema_to_ebnf(const char *json, size_t len, char **ebnf, struct rl_err *err);
int gschema_object_ebnf(char **ebnf, struct rl_err *err);
int gschema_tool_ebnf(const char *tools, size_t len, const char *name, char **ebnf,
                      struct rl_err *err);

#define GIR_MAX_STATES 50000  /* DFA states of one grammar */
#define GIR_MAX_NFA 2000000
#define GIR_MAX_RULES 20000
#define GIR_MAX_REPEAT 10000

#endif
