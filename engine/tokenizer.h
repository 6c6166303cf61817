/* engine/tokenizer.h - Qwen3 (HF tokenizers "BPE", byte-level) tokenizer.
 *
 * Loads tokenizer.json (and, when present, tokenizer_config.json) of a
 * checkpoint; encodes text to ids the way HF tokenizers does (added tokens
 * first, NFC, the Split regex from the file run with PCRE2, byte-level BPE);
 * decodes ids to text, whole or streaming.
 *
 * Threads: a loaded struct tokenizer is immutable except for its piece cache,
 * which is internally locked, so tok_encode/tok_decode may run concurrently
 * on one tokenizer from any number of threads. A struct tok_stream belongs to
 * one thread at a time.
 *
 * Invalid UTF-8: tok_encode replaces every maximal invalid subsequence of the
 * input with U+FFFD (the Unicode "maximal subpart" practice that Python's
 * errors="replace" follows) before anything else; it never fails on text.
 * tok_decode does the same on the decoded bytes, so its result is always
 * valid UTF-8, as HF's decode with errors="replace" is. */
#ifndef RL_TOKENIZER_H
#define RL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct tokenizer;

/* A growable id vector the caller owns; tok_encode appends to it, so one
 * vector can be reused across calls (set n = 0) without allocating. Zero it
 * before first use; release with tok_ids_free. */
struct tok_ids {
    int32_t *ids; /* (cap) token ids, the first n valid */
    size_t n;     /* ids in use */
    size_t cap;   /* allocated slots */
};

void tok_ids_free(struct tok_ids *v);

/* Flags of tok_encode. */
enum {
    /* Added tokens marked "special" (<|im_start|>, <|endoftext|>, ...) are
     * not matched in the text, which is then encoded as plain bytes. Added
     * tokens with special=false (<think>, <tool_call>, ...) are still matched,
     * as HF's split_special_tokens and llama.cpp's parse_special=false do. */
    TOK_ENCODE_NO_SPECIAL = 1u << 0,
};

/* A byte range of the text given to tok_encode_spans. */
struct tok_span {
    size_t off, len;
};

/* Flags of tok_decode and tok_stream_create. */
enum {
    TOK_DECODE_SKIP_SPECIAL = 1u << 0, /* drop ids of special=true added tokens */
};

/* Loads DIR/tokenizer.json and, if it exists, DIR/tokenizer_config.json (for
 * the eos and pad token names). On success *out owns everything it needs
 * (the files are not kept). Errors: RL_EIO (file), RL_EFORMAT (malformed,
 * naming the field), RL_EUNSUPPORTED (a model, normalizer or pre-tokenizer
 * this code does not implement), RL_ENOMEM. */
int tok_load(struct tokenizer **out, const char *dir, struct rl_err *err);

/* tok_load also takes a GGUF model (a GGUF file, or a directory holding one
 * and no config.json): then the tokenizer is the file's metadata, as
 * tok_load_gguf reads it. */

/* Loads the tokenizer of GGUF file path from its metadata, the way llama.cpp
 * writes a Qwen tokenizer (tokenizer.ggml.model "gpt2", pre "qwen2"):
 * tokens (byte-level strings), token_type (NORMAL tokens are the BPE vocab,
 * CONTROL tokens become special added tokens, USER_DEFINED non-special
 * ones, UNUSED ones holes), merges ("left right"), the eos and padding ids;
 * the NFC normalizer and Qwen2's split regex, as Qwen's tokenizer.json has
 * them. Encodings are then those of the tokenizer.json the file was made
 * from. Errors: RL_EUNSUPPORTED (another tokenizer model or
 * pre-tokenizer), RL_EFORMAT (arrays missing, of the wrong type or length,
 * a token with a NUL byte), the reader's. */
int tok_load_gguf(struct tokenizer **out, const char *path, struct rl_err *err);

/* 1 when tok_load(path) has a tokenizer to read: path/tokenizer.json, or a
 * GGUF model whose metadata has tokenizer.ggml.tokens. */
int tok_available(const char *path);

/* The same from the text of a tokenizer.json in memory (config_json may be
 * NULL). `name` is used in error messages. For tests and the fuzzer. */
int tok_load_json(struct tokenizer **out, const char *json, size_t len,
                  const char *config_json, size_t config_len, const char *name,
                  struct rl_err *err);

void tok_free(struct tokenizer *t);

/* Encodes len bytes of text (any bytes; see the top of this file for invalid
 * UTF-8; NUL is an ordinary character) and appends the ids to *out. No BOS or
 * EOS is added (Qwen3 adds none). Returns 0, or -RL_ENOMEM / -RL_EINTERNAL
 * (a regex engine failure) with *out left at its old length. */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, unsigned flags,
               struct tok_ids *out, struct rl_err *err);

/* tok_encode, except that no added token is matched where it would overlap
 * one of the plain spans (sorted, not overlapping, within len): their bytes
 * are always ordinary text. The chat template marks the messages' content
 * this way, so a user who types "<|im_end|>" or "<think>" gets those
 * characters, not the control tokens (llama.cpp's parse_special=false,
 * for the user's part of the prompt only). The text must be valid UTF-8
 * (sanitizing would move the spans): -RL_EINVAL otherwise. */
int tok_encode_spans(const struct tokenizer *t, const char *text, size_t len, unsigned flags,
                     const struct tok_span *plain, int n_plain, struct tok_ids *out,
                     struct rl_err *err);

/* Decodes n ids into a malloc'd NUL-terminated UTF-8 string (*text, caller
 * frees; *len excludes the NUL). Returns -RL_EINVAL naming the first id that
 * is not a token (negative, past the table, or a hole in it). */
int tok_decode(const struct tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
               char **text, size_t *len, struct rl_err *err);

/* The bytes of one token as the model sees them (byte-level decoded; for
 * added tokens their text), or NULL for a non-token. Owned by t. */
const char *tok_token_bytes(const struct tokenizer *t, int32_t id, size_t *len);

/* Size of the id space: one past the largest id (vocab and added tokens). */
int32_t tok_n_ids(const struct tokenizer *t);
/* The id of an exact token text (added token content first, then the vocab
 * entry whose bytes equal it), or -1. */
int32_t tok_find(const struct tokenizer *t, const char *text, size_t len);
/* 1 when id is an added token marked special, else 0. */
int tok_is_special(const struct tokenizer *t, int32_t id);
/* eos / pad ids from tokenizer_config.json (eos_token, pad_token), or -1. */
int32_t tok_eos_id(const struct tokenizer *t);
int32_t tok_pad_id(const struct tokenizer *t);

/* Streaming decoder: push ids one at a time as they are generated, get text
 * back. It emits only complete UTF-8: bytes of a character split across
 * tokens are held until the token that completes it arrives; bytes that can
 * no longer form a character become U+FFFD at once. The concatenation of all
 * pushes plus finish equals tok_decode of the same ids with the same flags. */
struct tok_stream;

int tok_stream_create(struct tok_stream **out, const struct tokenizer *t, unsigned flags,
                      struct rl_err *err);
/* Decodes one id. *text and *len receive the newly complete text (possibly
 * empty), owned by the stream and valid until the next call on it. A bad id
 * returns -RL_EINVAL and leaves the stream as it was. */
int tok_stream_push(struct tok_stream *s, int32_t id, const char **text, size_t *len,
                    struct rl_err *err);
/* Flushes held-back bytes (an unfinished character becomes U+FFFD) and
 * resets the stream for reuse. Same ownership as tok_stream_push. */
int tok_stream_finish(struct tok_stream *s, const char **text, size_t *len,
                      struct rl_err *err);
void tok_stream_free(struct tok_stream *s);

/* Replaces invalid UTF-8 in src (maximal subparts, one U+FFFD each) and
 * returns a malloc'd NUL-terminated copy, or NULL on allocation failure.
 * Shared by the encoder, the decoder and the chat code. */
char *tok_utf8_sanitize(const char *src, size_t len, size_t *out_len);

#endif
