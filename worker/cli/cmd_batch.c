/* worker/cli/cmd_batch.c - `redlm run -m DIR --batch FILE.jsonl`: every line
 * of the file is a job (prompt_ids plus the sampling fields of the worker
 * protocol); all of them go through the batching engine at once and one
 * JSON line per job comes out, in input order, when everything is done:
 *   {"tokens": [...], "finish_reason": "stop", "logprobs": [...], "usage": {...}}
 * A line that is not a valid job prints {"error": {"code", "message"}} in
 * its place. Single-threaded: the engine's owner is this function. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "modelref.h"
#include "cli_util.h"
#include "cmds.h"
#include "engine.h"

struct batch_job {
    int32_t *ids;
    int n_ids;
    char **stop;
    int n_stop;
    struct engine_request req;
    const char *code;     /* a refused line: its code (static storage) */
    char *error;          /* ... and the sentence to print with it */
    int32_t *out;         /* generated tokens */
    float *lp;            /* their logprobs when asked for */
    int n_out, cap_out;
    const char *finish;
    struct engine_usage usage;
};

static void batch_usage(void)
{
    fprintf(stderr,
            "usage: redlm run -m DIR --batch FILE.jsonl [options]\n"
            "  --max-batch N       running sequences at most (16)\n"
            "  --prefill-chunk N   prompt tokens of one sequence per step (token budget)\n"
            "  --token-budget N    tokens per step (512)\n"
            "  --threads N         CPU threads (all cores)\n"
            "  --isa X             CPU kernel path (auto)\n"
            "  --kv-blocks N       KV pool size in blocks (from a 1 GiB budget)\n"
            "  --speculative off|ngram   speculative decoding by prompt lookup (off);\n"
            "                      the tokens are the same, \"spec\" counts the drafts\n"
            "  --spec-tokens K     draft tokens per step at most (4)\n"
            "  --spec-max-rows N   drafts only in steps of fewer tokens (cpu 8, cuda 64)\n"
            "each line: {\"prompt_ids\": [...], \"max_tokens\": N, \"temperature\": T,\n"
            "  \"top_p\", \"top_k\", \"min_p\", \"presence_penalty\", \"frequency_penalty\",\n"
            "  \"repetition_penalty\", \"seed\", \"stop\", \"ignore_eos\", \"logprobs\", \"priority\",\n"
            "  \"speculative\" (false: plain decoding for this line)}\n");
}

static int num_field(const cJSON *o, const char *name, double *v)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!f || cJSON_IsNull(f))
        return 0;
    if (!cJSON_IsNumber(f))
        return -1;
    *v = f->valuedouble;
    return 1;
}

/* Fills j from one line; on a bad line sets j->code and j->error and
 * returns 0 too. */
static int parse_job(struct batch_job *j, const char *line)
{
    engine_request_init(&j->req);
    cJSON *o = cJSON_Parse(line);
    char msg[256] = "";
    if (!o || !cJSON_IsObject(o)) {
        j->code = "BAD_JSON";
        snprintf(msg, sizeof msg, "the line is not a JSON object");
        goto bad;
    }
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "prompt_ids");
    if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) < 1) {
        j->code = "BAD_FIELD";
        snprintf(msg, sizeof msg, "prompt_ids must be a non-empty array");
        goto bad;
    }
    j->n_ids = cJSON_GetArraySize(ids);
    j->ids = malloc((size_t)j->n_ids * sizeof *j->ids);
    if (!j->ids)
        goto oom;
    int k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ids) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 2147483647.0) {
            j->code = "BAD_FIELD";
            snprintf(msg, sizeof msg, "prompt_ids[%d] is not a token id", k);
            goto bad;
        }
        j->ids[k++] = (int32_t)it->valuedouble;
    }
    struct engine_request *r = &j->req;
    r->prompt_ids = j->ids;
    r->n_prompt = j->n_ids;
    struct { const char *name; double *dst; double v; } nums[] = {
        {"max_tokens", NULL, 0}, {"temperature", NULL, 0}, {"top_p", NULL, 0},
        {"top_k", NULL, 0}, {"min_p", NULL, 0}, {"presence_penalty", NULL, 0},
        {"frequency_penalty", NULL, 0}, {"repetition_penalty", NULL, 0},
        {"seed", NULL, 0}, {"priority", NULL, 0}, {"max_thinking_tokens", NULL, 0},
    };
    int got[sizeof nums / sizeof nums[0]];
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        got[i] = num_field(o, nums[i].name, &nums[i].v);
        if (got[i] < 0) {
            j->code = "BAD_FIELD";
            snprintf(msg, sizeof msg, "%s must be a number", nums[i].name);
            goto bad;
        }
    }
    if (got[0]) r->max_tokens = (int)nums[0].v;
    if (got[1]) r->temperature = (float)nums[1].v;
    if (got[2]) r->top_p = (float)nums[2].v;
    if (got[3]) r->top_k = (int)nums[3].v;
    if (got[4]) r->min_p = (float)nums[4].v;
    if (got[5]) r->presence_penalty = (float)nums[5].v;
    if (got[6]) r->frequency_penalty = (float)nums[6].v;
    if (got[7]) r->repetition_penalty = (float)nums[7].v;
    if (got[8]) r->has_seed = true, r->seed = (uint64_t)nums[8].v;
    if (got[9]) r->priority = (int)nums[9].v;
    if (got[10]) r->max_thinking_tokens = (int)nums[10].v;
    const cJSON *ie = cJSON_GetObjectItemCaseSensitive(o, "ignore_eos");
    r->ignore_eos = cJSON_IsTrue(ie);
    r->no_speculative = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "speculative"));
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
    if (cJSON_IsNumber(lp))
        r->n_logprobs = (int)lp->valuedouble; /* -1 off, else top alternatives */
    else if (cJSON_IsTrue(lp))
        r->n_logprobs = 0;
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(o, "mode");
    if (cJSON_IsString(mode) && !strcmp(mode->valuestring, "no_think"))
        r->mode = ENGINE_MODE_NO_THINK;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (cJSON_IsString(st) || cJSON_IsArray(st)) {
        int n = cJSON_IsString(st) ? 1 : cJSON_GetArraySize(st);
        j->stop = calloc((size_t)n + 1, sizeof *j->stop);
        if (!j->stop)
            goto oom;
        for (int i = 0; i < n; i++) {
            const cJSON *s = cJSON_IsString(st) ? st : cJSON_GetArrayItem(st, i);
            if (!cJSON_IsString(s)) {
                j->code = "BAD_FIELD";
                snprintf(msg, sizeof msg, "stop[%d] must be a string", i);
                goto bad;
            }
            if (!(j->stop[j->n_stop++] = strdup(s->valuestring)))
                goto oom;
        }
        r->stop = (const char *const *)j->stop;
        r->n_stop = j->n_stop;
    }
    cJSON_Delete(o);
    return 0;
oom:
    j->code = ev_code_name(EV_CODE_INTERNAL);
    snprintf(msg, sizeof msg, "out of memory");
bad:
    cJSON_Delete(o);
    j->error = strdup(msg);
    return j->error ? 0 : -1;
}

static int add_out(struct batch_job *j, int32_t tok, float lp)
{
    if (j->n_out == j->cap_out) {
        int cap = j->cap_out ? j->cap_out * 2 : 64;
        int32_t *t = realloc(j->out, (size_t)cap * sizeof *t);
        if (t)
            j->out = t;
        float *l = realloc(j->lp, (size_t)cap * sizeof *l);
        if (l)
            j->lp = l;
        if (!t || !l)
            return -1;
        j->cap_out = cap;
    }
    j->out[j->n_out] = tok;
    j->lp[j->n_out++] = lp;
    return 0;
}

/* {"error": {"code": code, "message": msg}}: the code travels beside the
 * sentence, never inside it. */
static void print_error_line(const char *code, const char *msg)
{
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", msg);
    char *t = cJSON_PrintUnformatted(o);
    printf("%s\n", t ? t : "{\"error\": {\"code\": \"INTERNAL\"}}");
    free(t);
    cJSON_Delete(o);
}

int cmd_run_batch(int argc, char **argv)
{
    struct engine_options eo;
    engine_options_default(&eo);
    const char *dir = NULL, *file = NULL;
    struct rl_err err = {0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x = 0;
        int rc = 0;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            batch_usage();
            return 0;
        } else if (!strcmp(f, "-m") || !strcmp(f, "--model")) {
            dir = v;
        } else if (!strcmp(f, "--batch")) {
            file = v;
        } else if (!strcmp(f, "--isa")) {
            eo.isa = v;
        } else if (!strcmp(f, "--backend")) {
            eo.backend = v;
        } else if (!strcmp(f, "--sim-profile")) {
            eo.sim_profile = v;
        } else if (!strcmp(f, "--sim-model")) {
            eo.sim_model = v;
        } else if (!strcmp(f, "--max-batch")) {
            if (!(rc = cli_parse_int(v, 1, 4096, &x, f, &err)))
                eo.max_batch = (int)x;
        } else if (!strcmp(f, "--prefill-chunk")) {
            if (!(rc = cli_parse_int(v, 1, 1 << 20, &x, f, &err)))
                eo.prefill_chunk = (int)x;
        } else if (!strcmp(f, "--token-budget")) {
            if (!(rc = cli_parse_int(v, 1, 1 << 20, &x, f, &err)))
                eo.token_budget = (int)x;
        } else if (!strcmp(f, "--threads")) {
            if (!(rc = cli_parse_int(v, 1, 1024, &x, f, &err)))
                eo.n_threads = (int)x;
        } else if (!strcmp(f, "--speculative")) {
            if (spec_mode_parse(v, &eo.speculative))
                rc = rl_errf(&err, RL_EINVAL, "--speculative: off or ngram, not %s", v ? v : "nothing");
        } else if (!strcmp(f, "--spec-tokens")) {
            if (!(rc = cli_parse_int(v, 1, SPEC_MAX_TOKENS, &x, f, &err)))
                eo.spec_tokens = (int)x;
        } else if (!strcmp(f, "--spec-max-rows")) {
            if (!(rc = cli_parse_int(v, 1, 1 << 20, &x, f, &err)))
                eo.spec_max_rows = (int)x;
        } else if (!strcmp(f, "--kv-blocks")) {
            if (!(rc = cli_parse_int(v, 1, 1 << 30, &x, f, &err)))
                eo.kv_blocks = (int)x;
        } else {
            fprintf(stderr, "redlm run --batch: unknown option %s\n", f);
            batch_usage();
            return 2;
        }
        if (rc) {
            fprintf(stderr, "redlm run --batch: %s\n", err.msg);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "redlm run --batch: %s needs a value\n", f);
            return 2;
        }
        i++;
    }
    if (!dir || !file) {
        batch_usage();
        return 2;
    }
    if (eo.token_budget < eo.max_batch)
        eo.token_budget = eo.max_batch;

    FILE *in = fopen(file, "r");
    if (!in) {
        fprintf(stderr, "redlm run --batch: cannot open %s\n", file);
        return 1;
    }
    struct batch_job *jobs = NULL;
    int n_jobs = 0, cap_jobs = 0, rc = 0;
    char *line = NULL;
    size_t cap_line = 0;
    ssize_t len;
    while ((len = getline(&line, &cap_line, in)) >= 0) {
        size_t b = 0;
        while (b < (size_t)len && (line[b] == ' ' || line[b] == '\t' || line[b] == '\n' ||
                                   line[b] == '\r'))
            b++;
        if (b == (size_t)len)
            continue; /* blank line */
        if (n_jobs == cap_jobs) {
            cap_jobs = cap_jobs ? cap_jobs * 2 : 16;
            struct batch_job *g = realloc(jobs, (size_t)cap_jobs * sizeof *g);
            if (!g) {
                rc = 1;
                break;
            }
            jobs = g;
        }
        memset(&jobs[n_jobs], 0, sizeof jobs[n_jobs]);
        if (parse_job(&jobs[n_jobs], line)) {
            rc = 1;
            break;
        }
        n_jobs++;
    }
    free(line);
    fclose(in);

    struct engine *e = NULL;
    struct modelref ref; /* a directory, or a repo id in the Hugging Face cache */
    if (!rc && modelref_resolve(dir, &ref, &err)) {
        fprintf(stderr, "redlm run --batch: %s\n", err.msg);
        rc = 1;
    }
    if (!rc)
        dir = ref.dir;
    struct cli_progress pg;
    cli_progress_init(&pg, dir);
    eo.progress = cli_progress_show;
    eo.progress_user = &pg;
    if (!rc && engine_create(&e, dir, &eo, &err)) {
        fprintf(stderr, "redlm run --batch: %s\n", err.msg);
        rc = 1;
    }
    for (int i = 0; !rc && i < n_jobs; i++) {
        if (jobs[i].error)
            continue;
        jobs[i].req.user = &jobs[i];
        uint64_t id;
        if (engine_submit(e, &jobs[i].req, &id, &err)) {
            /* the refusal's protocol code (rl_err.code, an enum ev_code) */
            jobs[i].code = ev_code_name((enum ev_code)err.code);
            jobs[i].error = strdup(err.msg);
        }
    }
    while (!rc && engine_n_active(e) > 0) {
        const struct engine_event *ev;
        int n_ev;
        if (engine_step(e, &ev, &n_ev, &err)) {
            fprintf(stderr, "redlm run --batch: %s\n", err.msg);
            rc = 1;
            break;
        }
        for (int i = 0; i < n_ev; i++) {
            struct batch_job *j = ev[i].user;
            for (int t = 0; t < ev[i].n_tokens; t++)
                if (add_out(j, ev[i].tokens[t], ev[i].logprobs ? ev[i].logprobs[t] : 0)) {
                    rc = 1;
                    break;
                }
            if (ev[i].finish != ENGINE_FINISH_NONE) {
                j->finish = engine_finish_name(ev[i].finish);
                j->usage = ev[i].usage;
                if (ev[i].finish == ENGINE_FINISH_ERROR && ev[i].error) {
                    j->code = ev_code_name(EV_CODE_ENGINE_ERROR);
                    j->error = strdup(ev[i].error);
                }
            }
        }
    }
    for (int i = 0; !rc && i < n_jobs; i++) {
        struct batch_job *j = &jobs[i];
        if (j->error) {
            print_error_line(j->code, j->error);
            continue;
        }
        printf("{\"tokens\": [");
        for (int t = 0; t < j->n_out; t++)
            printf(t ? ", %d" : "%d", j->out[t]);
        printf("], \"finish_reason\": \"%s\", \"logprobs\": [", j->finish ? j->finish : "error");
        if (j->req.n_logprobs >= 0)
            for (int t = 0; t < j->n_out; t++) {
                if (t)
                    printf(", ");
                cli_print_float(j->lp[t]);
            }
        printf("], \"usage\": {\"prompt_tokens\": %d, \"completion_tokens\": %d, "
               "\"reasoning_tokens\": %d, \"cached_prompt_tokens\": %d}",
               j->usage.prompt_tokens, j->usage.completion_tokens, j->usage.reasoning_tokens,
               j->usage.cached_prompt_tokens);
        if (eo.speculative != SPEC_OFF && !j->req.no_speculative)
            printf(", \"spec\": {\"drafted\": %d, \"accepted\": %d}",
                   j->usage.spec_drafted, j->usage.spec_accepted);
        printf("}\n");
    }
    engine_free(e);
    for (int i = 0; i < n_jobs; i++) {
        free(jobs[i].ids);
        for (int s = 0; s < jobs[i].n_stop; s++)
            free(jobs[i].stop[s]);
        free(jobs[i].stop);
        free(jobs[i].error);
        free(jobs[i].out);
        free(jobs[i].lp);
    }
    free(jobs);
    return rc;
}
