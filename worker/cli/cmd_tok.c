/* worker/cli/cmd_tok.c - `redlm tokenize`, `redlm detokenize` and
 * `redlm template`: the tokenizer and the chat template from the shell, for
 * checking them against other implementations.
 *
 * Output is JSON on stdout ({"ids": [...]}, {"text": "..."}), except for
 * template, which prints the prompt exactly as rendered, with no newline
 * added, so that `redlm template ... | sha256sum` compares with a Python
 * rendering. Errors go to stderr and the exit status is 1 (2 for usage). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modelref.h"
#include "chat.h"
#include "cmds.h"
#include "err.h"
#include "file.h"
#include "tokenizer.h"

static int usage(const char *cmd, const char *text)
{
    fprintf(stderr, "usage: redlm %s %s\n", cmd, text);
    return 2;
}

/* One flag of a command: "--name VALUE" sets *value; a bare "--name" sets
 * *on to on_value. A table ends with a NULL name. */
struct tok_flag {
    const char *name;
    const char **value;
    bool *on;
    bool on_value;
};
#define TF_VALUE(name, p) {(name), (p), NULL, false}
#define TF_SET(name, p, v) {(name), NULL, (p), (v)}
#define TF_END {NULL, NULL, NULL, false}

/* Parses argv[1..argc) against flags. Returns -1 to go on, else the exit
 * status the command returns now: 0 after --help, 2 (usage) for anything
 * unknown or a value flag without its value. */
static int parse_flags(int argc, char **argv, const struct tok_flag *flags, const char *help)
{
    for (int i = 1; i < argc; i++) {
        const struct tok_flag *f = flags;
        while (f->name && strcmp(argv[i], f->name))
            f++;
        if (f->name && f->value && i + 1 < argc)
            *f->value = argv[++i];
        else if (f->name && f->on)
            *f->on = f->on_value;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: redlm %s %s\n", argv[0], help);
            return 0;
        } else
            return usage(argv[0], help);
    }
    return -1;
}

/* Parses "1,2,3" (spaces allowed) into a malloc'd array. */
static int parse_ids(const char *s, int32_t **out, size_t *n, struct rl_err *err)
{
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < INT32_MIN || x > INT32_MAX || (*end && *end != ',' && *end != ' ')) {
            free(v);
            return rl_errf(err, RL_EINVAL, "--ids: '%.40s' is not a list of integers", p);
        }
        if (k == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                free(v);
                return rl_errf(err, RL_ENOMEM, "out of memory");
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    *out = v;
    *n = k;
    return 0;
}

/* Prints len bytes of UTF-8 as a JSON string with the escapes of Python's
 * json.dumps(ensure_ascii=False) (chat_json_dumps's rules), NUL included:
 * decoded text may hold one, which a cJSON string could not. */
static void print_json_string(const char *s, size_t len)
{
    putchar('"');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", stdout); break;
        case '\\': fputs("\\\\", stdout); break;
        case '\n': fputs("\\n", stdout); break;
        case '\r': fputs("\\r", stdout); break;
        case '\t': fputs("\\t", stdout); break;
        case '\b': fputs("\\b", stdout); break;
        case '\f': fputs("\\f", stdout); break;
        default:
            if (c < 0x20)
                printf("\\u%04x", c);
            else
                putchar(c);
        }
    }
    putchar('"');
}

/* --tokenizer: a directory, or a repo id in the Hugging Face cache (whose
 * snapshot holds tokenizer.json); NULL after saying why on stderr. */
static const char *tok_dir(const char *spec, struct modelref *ref)
{
    struct rl_err err = {0};
    if (modelref_resolve(spec, ref, &err)) {
        fprintf(stderr, "redlm: --tokenizer %s\n", err.msg);
        return NULL;
    }
    return ref->dir;
}

/* The tokenizer of --tokenizer spec, loaded (the caller tok_free()s it);
 * NULL after saying why on stderr, as "cmd: ...". */
static struct tokenizer *load_tok(const char *cmd, const char *spec)
{
    struct modelref ref;
    const char *dir = tok_dir(spec, &ref);
    if (!dir)
        return NULL;
    struct rl_err err = {0};
    struct tokenizer *t = NULL;
    if (tok_load(&t, dir, &err)) {
        fprintf(stderr, "%s: %s\n", cmd, err.msg);
        return NULL;
    }
    return t;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *dir = NULL, *text = NULL, *file = NULL;
    bool no_special = false;
    static const char help[] = "--tokenizer DIR (--text S | --file F) [--no-special]";
    const struct tok_flag fl[] = {TF_VALUE("--tokenizer", &dir), TF_VALUE("--text", &text),
                                  TF_VALUE("--file", &file),
                                  TF_SET("--no-special", &no_special, true), TF_END};
    int st = parse_flags(argc, argv, fl, help);
    if (st >= 0)
        return st;
    unsigned flags = no_special ? TOK_ENCODE_NO_SPECIAL : 0;
    if (!dir || !!text == !!file)
        return usage(argv[0], help);
    struct rl_err err = {0};
    char *buf = NULL; /* the file's text, read before the tokenizer loads */
    size_t len = text ? strlen(text) : 0;
    if (file && file_read(file, 0, &buf, &len, &err)) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        return 1;
    }
    struct tokenizer *t = load_tok("tokenize", dir);
    struct tok_ids ids = {0};
    int rc = 1;
    if (!t)
        goto out;
    if (tok_encode(t, file ? buf : text, len, flags, &ids, &err)) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        goto out;
    }
    printf("{\"ids\": [");
    for (size_t i = 0; i < ids.n; i++)
        printf(i ? ", %d" : "%d", ids.ids[i]);
    printf("]}\n");
    rc = 0;
out:
    tok_ids_free(&ids);
    tok_free(t);
    free(buf);
    return rc;
}

int cmd_detokenize(int argc, char **argv)
{
    const char *dir = NULL, *list = NULL;
    bool skip_special = false;
    static const char help[] = "--tokenizer DIR --ids 1,2,3 [--skip-special]";
    const struct tok_flag fl[] = {TF_VALUE("--tokenizer", &dir), TF_VALUE("--ids", &list),
                                  TF_SET("--skip-special", &skip_special, true), TF_END};
    int st = parse_flags(argc, argv, fl, help);
    if (st >= 0)
        return st;
    unsigned flags = skip_special ? TOK_DECODE_SKIP_SPECIAL : 0;
    if (!dir || !list)
        return usage(argv[0], help);
    struct tokenizer *t = load_tok("detokenize", dir);
    if (!t)
        return 1;
    struct rl_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0, len;
    char *text = NULL;
    int rc = 1;
    if (parse_ids(list, &ids, &n, &err) || tok_decode(t, ids, n, flags, &text, &len, &err)) {
        fprintf(stderr, "detokenize: %s\n", err.msg);
        goto out;
    }
    printf("{\"text\": ");
    print_json_string(text, len);
    printf("}\n");
    rc = 0;
out:
    free(text);
    free(ids);
    tok_free(t);
    return rc;
}

/* The JSON of file path (chat_json_parse: numbers keep their spelling),
 * owned by the caller; NULL after saying why on stderr. */
static cJSON *load_json(const char *path)
{
    struct rl_err err = {0};
    char *text = NULL;
    size_t len;
    if (file_read(path, 0, &text, &len, &err)) {
        fprintf(stderr, "template: %s\n", err.msg);
        return NULL;
    }
    cJSON *j = chat_json_parse(text, len, &err);
    free(text);
    if (!j)
        fprintf(stderr, "template: %s: %s\n", path, err.msg);
    return j;
}

/* A messages file is an array of messages, or an object with "messages"
 * (and optionally "tools"), like an OpenAI request body. */
int cmd_template(int argc, char **argv)
{
    const char *dir = NULL, *mpath = NULL, *tpath = NULL;
    struct chat_template_opts o = {.add_generation_prompt = true};
    static const char help[] = "--tokenizer DIR --messages F.json [--tools T.json] [--no-think] "
                               "[--no-generation-prompt]";
    const struct tok_flag fl[] = {TF_VALUE("--tokenizer", &dir),
                                  TF_VALUE("--messages", &mpath), TF_VALUE("--tools", &tpath),
                                  TF_SET("--no-think", &o.disable_thinking, true),
                                  TF_SET("--no-generation-prompt", &o.add_generation_prompt, false),
                                  TF_END};
    int st = parse_flags(argc, argv, fl, help);
    if (st >= 0)
        return st;
    if (!dir || !mpath)
        return usage(argv[0], help);
    struct modelref ref;
    if (!(dir = tok_dir(dir, &ref)))
        return 1;
    struct rl_err err = {0};
    char *ctext = NULL, *out = NULL;
    size_t clen, olen;
    cJSON *mj = NULL, *tj = NULL, *cfg = NULL;
    int rc = 1;

    /* The template is Qwen3's, built in; the checkpoint's own is only
     * checked, so that rendering another model's format is not silent. */
    char cpath[MODELREF_PATH_MAX + 32];
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    if (file_read(cpath, 0, &ctext, &clen, &err)) {
        fprintf(stderr, "template: %s\n", err.msg);
        goto out;
    }
    cfg = cJSON_ParseWithLength(ctext, clen);
    const char *tpl = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"));
    if (!tpl || !strstr(tpl, "last_query_index") || !strstr(tpl, "<tool_response>"))
        fprintf(stderr, "template: warning: %s has no Qwen3 chat_template; rendering Qwen3's\n", cpath);

    if (!(mj = load_json(mpath)))
        goto out;
    const cJSON *messages = mj, *tools = NULL;
    if (cJSON_IsObject(mj)) {
        messages = cJSON_GetObjectItemCaseSensitive(mj, "messages");
        tools = cJSON_GetObjectItemCaseSensitive(mj, "tools");
    }
    if (tpath) {
        if (!(tj = load_json(tpath)))
            goto out;
        tools = tj;
    }
    if (chat_render(messages, tools, &o, &out, &olen, &err)) {
        fprintf(stderr, "template: %s\n", err.msg);
        goto out;
    }
    if (fwrite(out, 1, olen, stdout) != olen || fflush(stdout)) {
        fprintf(stderr, "template: write error\n");
        goto out;
    }
    rc = 0;
out:
    free(out);
    cJSON_Delete(mj);
    cJSON_Delete(tj);
    cJSON_Delete(cfg);
    free(ctext);
    return rc;
}
