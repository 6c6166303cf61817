/* engine/tokenizer_gguf.c - a GGUF file's tokenizer (tok_load_gguf).
 *
 * llama.cpp's converter writes a Hugging Face byte-level BPE tokenizer into
 * GGUF metadata as parallel arrays: tokenizer.ggml.tokens (the vocab
 * strings, byte-level encoded exactly as tokenizer.json's vocab keys, and
 * added tokens as their text), tokenizer.ggml.token_type (1 NORMAL, 2
 * UNKNOWN, 3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE) and
 * tokenizer.ggml.merges ("left right", in rank order); the pre-tokenizer is
 * only named (tokenizer.ggml.pre). Rather than a second BPE, this file
 * turns those arrays back into the tokenizer.json they came from and hands
 * it to tok_load_json, so a GGUF model and its safetensors original share
 * one encoder and encode byte for byte alike (tests/unit/test_tokenizer.c
 * checks it on the project's cases).
 *
 * What cannot come back: which added tokens were "special" in
 * tokenizer.json. llama.cpp marks CONTROL every added token that is special
 * or looks like one (<|...|>), so Qwen's <|fim_prefix|> family, special=false
 * in tokenizer.json, is special here: ids agree whenever added tokens are
 * matched in the text (the default, and the chat template), and differ only
 * for those tokens under TOK_ENCODE_NO_SPECIAL, where llama.cpp's own
 * parse_special=false behaves as we do. Called at load, single-threaded. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"

/* tokenizer.ggml.pre -> the Split regex Hugging Face's file has for it */
static const struct {
    const char *pre;
    const char *regex;
} pretoks[] = {
    {"qwen2", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

static cJSON *byte_level(void)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "ByteLevel");
    cJSON_AddFalseToObject(b, "add_prefix_space");
    cJSON_AddFalseToObject(b, "trim_offsets");
    cJSON_AddFalseToObject(b, "use_regex");
    return b;
}

/* A NUL-terminated copy of a metadata string; NULL when it holds a NUL. */
static char *cstr(const char *s, size_t n)
{
    if (memchr(s, 0, n))
        return NULL;
    char *c = malloc(n + 1);
    if (c) {
        memcpy(c, s, n);
        c[n] = 0;
    }
    return c;
}

static int build_json(const struct gguf_file *g, cJSON **tok_out, cJSON **cfg_out,
                      struct rl_err *err)
{
    const char *path = gguf_path(g), *s;
    size_t n;
    int rc = gguf_get_str(g, "tokenizer.ggml.model", &s, &n, err);
    if (rc)
        return rc;
    if (n != 4 || memcmp(s, "gpt2", 4))
        return rl_errf(err, RL_EUNSUPPORTED, "%s: tokenizer.ggml.model \"%.*s\" is not supported (redlm reads \"gpt2\", byte-level BPE)",
                       path, (int)(n < 40 ? n : 40), s);
    const char *regex = NULL;
    if ((rc = gguf_get_str(g, "tokenizer.ggml.pre", &s, &n, err)))
        return rc;
    for (size_t i = 0; i < sizeof pretoks / sizeof pretoks[0]; i++)
        if (strlen(pretoks[i].pre) == n && !memcmp(pretoks[i].pre, s, n))
            regex = pretoks[i].regex;
    if (!regex)
        return rl_errf(err, RL_EUNSUPPORTED, "%s: tokenizer.ggml.pre \"%.*s\" is not supported (redlm reads \"qwen2\")",
                       path, (int)(n < 40 ? n : 40), s);
    enum gguf_vtype vt;
    uint64_t n_tok, n_type = 0, n_merge;
    if ((rc = gguf_get_arr(g, "tokenizer.ggml.tokens", &vt, &n_tok, err)))
        return rc;
    if (vt != GGUF_VT_STRING || n_tok == 0 || n_tok > (1u << 22))
        return rl_errf(err, RL_EFORMAT, "%s: tokenizer.ggml.tokens must be 1 to 4194304 strings", path);
    int has_types = gguf_has_key(g, "tokenizer.ggml.token_type");
    if (has_types && ((rc = gguf_get_arr(g, "tokenizer.ggml.token_type", &vt, &n_type, err)) ||
                      n_type != n_tok))
        return rc ? rc : rl_errf(err, RL_EFORMAT, "%s: tokenizer.ggml.token_type has %llu entries for %llu tokens",
                                 path, (unsigned long long)n_type, (unsigned long long)n_tok);
    if ((rc = gguf_get_arr(g, "tokenizer.ggml.merges", &vt, &n_merge, err)))
        return rc;
    if (vt != GGUF_VT_STRING)
        return rl_errf(err, RL_EFORMAT, "%s: tokenizer.ggml.merges must be strings", path);

    cJSON *root = cJSON_CreateObject(), *cfg = cJSON_CreateObject();
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *norm = cJSON_AddObjectToObject(root, "normalizer");
    cJSON_AddStringToObject(norm, "type", "NFC");
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *pres = cJSON_AddArrayToObject(pre, "pretokenizers");
    cJSON *split = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", regex);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddFalseToObject(split, "invert");
    cJSON_AddItemToArray(pres, split);
    cJSON_AddItemToArray(pres, byte_level());
    cJSON_AddItemToObject(root, "decoder", byte_level());
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddFalseToObject(model, "byte_fallback");
    cJSON_AddFalseToObject(model, "ignore_merges");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    if (!root || !cfg || !added || !vocab || !merges) {
        rc = rl_errf(err, RL_ENOMEM, "%s: out of memory for the tokenizer", path);
        goto fail;
    }
    for (uint64_t i = 0; i < n_tok; i++) {
        int64_t type = TT_NORMAL;
        if (has_types && (rc = gguf_arr_int(g, "tokenizer.ggml.token_type", i, &type, err)))
            goto fail;
        if ((rc = gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s, &n, err)))
            goto fail;
        if (type == TT_UNUSED)
            continue;
        char *t = cstr(s, n);
        if (!t) {
            rc = rl_errf(err, RL_EFORMAT, "%s: token %llu holds a NUL byte", path, (unsigned long long)i);
            goto fail;
        }
        cJSON *v = NULL;
        if (type == TT_CONTROL || type == TT_USER_DEFINED) {
            v = cJSON_CreateObject();
            if (v) {
                cJSON_AddNumberToObject(v, "id", (double)i);
                cJSON_AddStringToObject(v, "content", t);
                cJSON_AddFalseToObject(v, "single_word");
                cJSON_AddFalseToObject(v, "lstrip");
                cJSON_AddFalseToObject(v, "rstrip");
                cJSON_AddFalseToObject(v, "normalized");
                cJSON_AddBoolToObject(v, "special", type == TT_CONTROL);
                cJSON_AddItemToArray(added, v);
            }
        } else if (type == TT_NORMAL || type == TT_UNKNOWN || type == TT_BYTE) {
            v = cJSON_CreateNumber((double)i);
            if (v)
                cJSON_AddItemToObject(vocab, t, v);
        } else {
            free(t);
            rc = rl_errf(err, RL_EFORMAT, "%s: token %llu has token type %lld (1 to 6)", path,
                         (unsigned long long)i, (long long)type);
            goto fail;
        }
        free(t);
        if (!v) {
            rc = rl_errf(err, RL_ENOMEM, "%s: out of memory for the tokenizer", path);
            goto fail;
        }
    }
    for (uint64_t i = 0; i < n_merge; i++) {
        if ((rc = gguf_arr_str(g, "tokenizer.ggml.merges", i, &s, &n, err)))
            goto fail;
        char *m = cstr(s, n);
        cJSON *v = m ? cJSON_CreateString(m) : NULL;
        free(m);
        if (!v) {
            rc = rl_errf(err, RL_EFORMAT, "%s: merge %llu holds a NUL byte", path, (unsigned long long)i);
            goto fail;
        }
        cJSON_AddItemToArray(merges, v);
    }
    /* tokenizer_config.json's eos / pad names, from the special ids */
    static const char *const keys[2][2] = {{"tokenizer.ggml.eos_token_id", "eos_token"},
                                           {"tokenizer.ggml.padding_token_id", "pad_token"}};
    for (int k = 0; k < 2; k++) {
        int64_t id;
        if (!gguf_has_key(g, keys[k][0]))
            continue;
        if ((rc = gguf_get_int(g, keys[k][0], &id, err)))
            goto fail;
        if (id < 0 || (uint64_t)id >= n_tok)
            continue; /* an id past the tokens names nothing: no such token */
        if ((rc = gguf_arr_str(g, "tokenizer.ggml.tokens", (uint64_t)id, &s, &n, err)))
            goto fail;
        char *t = cstr(s, n);
        if (t)
            cJSON_AddStringToObject(cfg, keys[k][1], t);
        free(t);
    }
    if (gguf_has_key(g, "tokenizer.chat_template") &&
        !gguf_get_str(g, "tokenizer.chat_template", &s, &n, NULL)) {
        char *t = cstr(s, n);
        if (t)
            cJSON_AddStringToObject(cfg, "chat_template", t);
        free(t);
    }
    *tok_out = root;
    *cfg_out = cfg;
    return 0;
fail:
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return rc;
}

int tok_load_gguf(struct tokenizer **out, const char *path, struct rl_err *err)
{
    *out = NULL;
    struct gguf_file *g = NULL;
    cJSON *tj = NULL, *cj = NULL;
    char *ts = NULL, *cs = NULL;
    int rc = gguf_open(&g, path, err);
    if (rc || (rc = build_json(g, &tj, &cj, err)))
        goto out;
    ts = cJSON_PrintUnformatted(tj);
    cs = cJSON_PrintUnformatted(cj);
    if (!ts || !cs) {
        rc = rl_errf(err, RL_ENOMEM, "%s: out of memory for the tokenizer", path);
        goto out;
    }
    rc = tok_load_json(out, ts, strlen(ts), cs, strlen(cs), path, err);
out:
    free(ts);
    free(cs);
    cJSON_Delete(tj);
    cJSON_Delete(cj);
    gguf_close(g);
    return rc;
}

int tok_available(const char *path)
{
    char p[4096];
    int r = gguf_locate(path, p, sizeof p, NULL);
    if (r < 0)
        return 1; /* ambiguous: let tok_load say so */
    if (r == 0) {
        snprintf(p, sizeof p, "%s/tokenizer.json", path);
        FILE *f = fopen(p, "rb");
        if (f)
            fclose(f);
        return f != NULL;
    }
    struct gguf_file *g;
    if (gguf_open(&g, p, NULL))
        return 1; /* unreadable: tok_load reports it */
    int has = gguf_has_key(g, "tokenizer.ggml.tokens");
    gguf_close(g);
    return has;
}
