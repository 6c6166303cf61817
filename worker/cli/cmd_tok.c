/* worker/cli/cmd_tok.c - `redlm tokenize`, `redlm detokenize` and
 * `redlm template`: the tokenizer and the chat template from the shell, for
 * checking them against other implementations.
 *
 * Output is JSON on stdout ({"ids": [...]}, {"text": "..."}), except for
 * template, which prints the prompt exactly as rendered, with no newline
 * added, so that `redlm template ... | sha256sum` compares with a Python
 * rendering. Errors go to stderr and the exit status is 1 (2 for usage). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modelref.h"
#include "chat.h"
#include "cmds.h"
#include "err.h"
#include "tokenizer.h"

static int read_all(const char *path, char **out, size_t *len, struct rl_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return rl_errf(err, RL_EIO, "%s: %s", path, strerror(errno));
    size_t cap = 65536, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (!b) {
            fclose(f);
            return rl_errf(err, RL_ENOMEM, "%s: out of memory", path);
        }
        n += fread(b + n, 1, cap - n - 1, f);
        if (n < cap - 1)
            break;
        cap *= 2;
        char *nb = realloc(b, cap);
        if (!nb)
            free(b);
        b = nb;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(b);
        return rl_errf(err, RL_EIO, "%s: read error", path);
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

static int usage(const char *cmd, const char *text)
{
    fprintf(stderr, "usage: redlm %s %s\n", cmd, text);
    return 2;
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

int cmd_tokenize(int argc, char **argv)
{
    const char *dir = NULL, *text = NULL, *file = NULL;
    unsigned flags = 0;
    static const char help[] = "--tokenizer DIR (--text S | --file F) [--no-special]";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc)
            text = argv[++i];
        else if (!strcmp(argv[i], "--file") && i + 1 < argc)
            file = argv[++i];
        else if (!strcmp(argv[i], "--no-special"))
            flags |= TOK_ENCODE_NO_SPECIAL;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: redlm tokenize %s\n", help);
            return 0;
        } else
            return usage(argv[0], help);
    }
    if (!dir || !!text == !!file)
        return usage(argv[0], help);
    struct modelref ref;
    if (!(dir = tok_dir(dir, &ref)))
        return 1;
    struct rl_err err = {0};
    struct tokenizer *t = NULL;
    char *buf = NULL;
    size_t len = text ? strlen(text) : 0;
    struct tok_ids ids = {0};
    int rc = 1;
    if ((file && read_all(file, &buf, &len, &err)) || tok_load(&t, dir, &err) ||
        tok_encode(t, file ? buf : text, len, flags, &ids, &err)) {
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
    unsigned flags = 0;
    static const char help[] = "--tokenizer DIR --ids 1,2,3 [--skip-special]";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--ids") && i + 1 < argc)
            list = argv[++i];
        else if (!strcmp(argv[i], "--skip-special"))
            flags |= TOK_DECODE_SKIP_SPECIAL;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: redlm detokenize %s\n", help);
            return 0;
        } else
            return usage(argv[0], help);
    }
    if (!dir || !list)
        return usage(argv[0], help);
    struct modelref ref;
    if (!(dir = tok_dir(dir, &ref)))
        return 1;
    struct rl_err err = {0};
    struct tokenizer *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0, len;
    char *text = NULL;
    int rc = 1;
    if (parse_ids(list, &ids, &n, &err) || tok_load(&t, dir, &err) ||
        tok_decode(t, ids, n, flags, &text, &len, &err)) {
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

/* A messages file is an array of messages, or an object with "messages"
 * (and optionally "tools"), like an OpenAI request body. */
int cmd_template(int argc, char **argv)
{
    const char *dir = NULL, *mpath = NULL, *tpath = NULL;
    struct chat_template_opts o = {.add_generation_prompt = true};
    static const char help[] = "--tokenizer DIR --messages F.json [--tools T.json] [--no-think] "
                               "[--no-generation-prompt]";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--messages") && i + 1 < argc)
            mpath = argv[++i];
        else if (!strcmp(argv[i], "--tools") && i + 1 < argc)
            tpath = argv[++i];
        else if (!strcmp(argv[i], "--no-think"))
            o.disable_thinking = true;
        else if (!strcmp(argv[i], "--no-generation-prompt"))
            o.add_generation_prompt = false;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: redlm template %s\n", help);
            return 0;
        } else
            return usage(argv[0], help);
    }
    if (!dir || !mpath)
        return usage(argv[0], help);
    struct modelref ref;
    if (!(dir = tok_dir(dir, &ref)))
        return 1;
    struct rl_err err = {0};
    char *mtext = NULL, *ttext = NULL, *ctext = NULL, *out = NULL;
    size_t mlen, tlen, clen, olen;
    cJSON *mj = NULL, *tj = NULL, *cfg = NULL;
    int rc = 1;

    /* The template is Qwen3's, built in; the checkpoint's own is only
     * checked, so that rendering another model's format is not silent. */
    char cpath[MODELREF_PATH_MAX + 32];
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    if (read_all(cpath, &ctext, &clen, &err)) {
        fprintf(stderr, "template: %s\n", err.msg);
        goto out;
    }
    cfg = cJSON_ParseWithLength(ctext, clen);
    const char *tpl = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"));
    if (!tpl || !strstr(tpl, "last_query_index") || !strstr(tpl, "<tool_response>"))
        fprintf(stderr, "template: warning: %s has no Qwen3 chat_template; rendering Qwen3's\n", cpath);

    if (read_all(mpath, &mtext, &mlen, &err)) {
        fprintf(stderr, "template: %s\n", err.msg);
        goto out;
    }
    if (!(mj = chat_json_parse(mtext, mlen, &err))) {
        fprintf(stderr, "template: %s: %s\n", mpath, err.msg);
        goto out;
    }
    const cJSON *messages = mj, *tools = NULL;
    if (cJSON_IsObject(mj)) {
        messages = cJSON_GetObjectItemCaseSensitive(mj, "messages");
        tools = cJSON_GetObjectItemCaseSensitive(mj, "tools");
    }
    if (tpath) {
        if (read_all(tpath, &ttext, &tlen, &err)) {
            fprintf(stderr, "template: %s\n", err.msg);
            goto out;
        }
        if (!(tj = chat_json_parse(ttext, tlen, &err))) {
            fprintf(stderr, "template: %s: %s\n", tpath, err.msg);
            goto out;
        }
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
    free(mtext);
    free(ttext);
    free(ctext);
    return rc;
}
