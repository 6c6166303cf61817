/* engine/grammar/grammar.h - grammar-constrained decoding: compile a JSON
 * Schema, "any JSON object", a tool-call format or a raw EBNF grammar once,
 * then per decode step get the mask of tokens that keep the output inside
 * the grammar.
 *
 * The pieces and who owns them:
 *   struct gram_vocab  the tokenizer's tokens as bytes, sorted into a trie
 *                      order; built once per tokenizer, immutable, shared by
 *                      threads. The caller frees it after every gram made
 *                      from it is gone.
 *   struct gram        a compiled grammar (byte-level pushdown automaton plus
 *                      per-state token classes); immutable after compile
 *                      (per-state masks beyond the eager budget are filled
 *                      once, lock-free, on first use), refcounted,
 *                      thread-safe to share. Callers cache it by
 *                      gram_hash() of its source. It keeps a pointer to its
 *                      vocab, which must outlive it.
 *   struct gram_match  one sequence's matcher state; one owner, not
 *                      thread-safe. It holds a reference on its gram.
 *
 * Errors: every function returns 0 or a negative RL_E* code and fills err.
 * The compilers' refusals (the request's fault) set err->code to
 * EV_CODE_BAD_PARAM (common/event.h, the protocol code) and err->msg names
 * the keyword and its JSON pointer ("/properties/age/exclusiveMinimum:
 * unsupported keyword") or, for EBNF, line:column. Other failures (memory)
 * carry an RL_E* code. The syntax and the supported JSON Schema subset are
 * in schemas/grammar.md. */
#ifndef RL_GRAMMAR_H
#define RL_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct gram_vocab;
struct gram;
struct gram_match;

/* Limits of what the compilers accept (each refusal is BAD_PARAM). */
#define GRAM_MAX_SOURCE (256 * 1024) /* bytes of schema / grammar / tools text */
#define GRAM_MAX_DEPTH 64            /* nesting of the schema's JSON text */

/* token_bytes(user, id, &len, &is_special) returns the bytes of token id (as
 * tokenizer.h tok_token_bytes()) or NULL for a hole in the id space, and sets
 * *is_special (tok_is_special()). Special tokens are never allowed inside a
 * document; eos_ids (n_eos of them, copied) are allowed exactly where the
 * document is complete. The bytes are copied: the tokenizer may go after. */
int gram_vocab_create(struct gram_vocab **out, int n_vocab,
                      const char *(*token_bytes)(void *user, int32_t id, size_t *len,
                                                 int *is_special),
                      void *user, const int32_t *eos_ids, int n_eos, struct rl_err *err);
void gram_vocab_free(struct gram_vocab *v);
/* n_vocab as given: masks have gram_mask_words_n(n) uint32 words. */
int gram_vocab_n(const struct gram_vocab *v);
static inline int gram_mask_words_n(int n_vocab) { return (n_vocab + 31) / 32; }

/* Compilers: *out gets a new gram with one reference. */
int gram_compile_json_schema(struct gram **out, const struct gram_vocab *v,
                             const char *schema_json, size_t len, struct rl_err *err);
/* response_format {"type": "json_object"}: any JSON object. */
int gram_compile_json_object(struct gram **out, const struct gram_vocab *v, struct rl_err *err);
/* A raw grammar in the syntax of schemas/grammar.md; the start rule is `root`. */
int gram_compile_ebnf(struct gram **out, const struct gram_vocab *v, const char *src,
                      size_t len, struct rl_err *err);
/* tools: the OpenAI tools array (JSON text); name NULL = any of them. The
 * document is "<tool_call>\n{\"name\": \"NAME\", \"arguments\": ARGS}\n</tool_call>"
 * (Qwen3's format, what engine/chat_parse.c parses), ARGS matching that
 * tool's `parameters` schema (absent parameters: any JSON object). */
int gram_compile_tool_call(struct gram **out, const struct gram_vocab *v,
                           const char *tools_json, size_t len, const char *name,
                           struct rl_err *err);
struct gram *gram_ref(struct gram *g);
void gram_unref(struct gram *g); /* frees on the last reference; NULL is a no-op */
/* The memory g holds now, in bytes: its automaton (about 1 KB a state)
 * and the per-state classifications published so far, which grow as
 * matchers meet new states, up to a bound per grammar (64 MiB; states
 * met beyond it are classified for the step and dropped). Any thread. */
size_t gram_bytes(const struct gram *g);
/* Sets g's bound on published classifications (64 MiB when compiled);
 * what is already published stays. Masks are the same under any bound,
 * only slower beyond it (tests; a caller short of memory). */
void gram_set_mask_budget(struct gram *g, size_t bytes);

/* Cache key helper: a 64-bit hash of kind ("json_schema", "ebnf", ...) and
 * the source text. */
uint64_t gram_hash(const char *kind, const char *src, size_t len);

/* A matcher at the start of the document. */
int gram_match_create(struct gram_match **out, struct gram *g, struct rl_err *err);
void gram_match_free(struct gram_match *m);
/* Writes the allowed next tokens as a bitmask of (n_vocab + 31) / 32 uint32
 * words (bit id%32 of word id/32 set = id allowed); eos ids are set exactly
 * when gram_match_complete(). The per-step hot path. Returns 0. */
int gram_match_mask(struct gram_match *m, uint32_t *mask);
/* Advances by one token. An eos id is accepted when complete (the matcher
 * then stays done). A token the mask did not allow is an RL_EINVAL error
 * and leaves the state unchanged (the caller never samples one, so this is
 * a bug check). */
int gram_match_accept(struct gram_match *m, int32_t id, struct rl_err *err);
/* Undoes the last n_tokens accepted tokens (speculative decoding); the
 * state, and so the mask, is exactly what it was before them. Returns
 * -RL_EINVAL when fewer were accepted. */
int gram_match_rollback(struct gram_match *m, int n_tokens);
bool gram_match_complete(const struct gram_match *m); /* EOS allowed here */
bool gram_match_done(const struct gram_match *m);     /* nothing but EOS may follow */

#endif
