/* tests/fuzz/fuzz_job.c - libFuzzer target for a job as a client XADDs it
 * (common/job.c), the text the dispatcher and every worker parse, and the
 * chat template it is rendered with (engine/chat.c).
 *
 * The input is the job field's bytes. Checks, besides the sanitizers' own:
 *   - job_guess_id answers "" or an id of 1-128 [A-Za-z0-9_.:-];
 *   - a refusal is -RL_EINVAL with a protocol code and a sentence (or
 *     -RL_ENOMEM);
 *   - an accepted job written back (job_to_json) parses again, and writes
 *     back to the same text: a job re-dispatched or resumed is the job;
 *   - its messages render (chat_render, both modes) or are refused with
 *     a sentence; its cache key is computed.
 *
 *   make fuzz && build-fuzz/fuzz/fuzz_job -max_total_time=60 -timeout=10 DIR
 * (seeds: each job of schemas/examples/jobs-valid.json and jobs-invalid.json
 * as a file of its own) */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "event.h"
#include "job.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_id(const char *id)
{
    size_t n = strlen(id);
    if (n > JOB_ID_MAX)
        abort();
    for (size_t i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-", id[i]))
            abort();
}

static void render(const struct job *j)
{
    if (j->input != JOB_INPUT_MESSAGES)
        return;
    for (int think = 0; think < 2; think++) {
        struct chat_template_opts o = {.add_generation_prompt = true, .disable_thinking = !think};
        char *out = NULL;
        size_t len = 0;
        struct rl_err err = {0};
        int rc = chat_render(j->messages, j->tools, &o, &out, &len, &err);
        if (rc ? (rc != -RL_EINVAL && rc != -RL_ENOMEM) || !err.msg[0] || out : !out || strlen(out) != len)
            abort();
        free(out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    char guess[JOB_ID_MAX + 1];
    job_guess_id(text, size, NULL, guess);
    check_id(guess);
    char sha[JOB_SHA_LEN + 1];
    job_sha256(text, size, sha);

    struct job_opts opts;
    job_opts_default(&opts);
    opts.fallback_id = "r1700000000000-0";
    struct job *j = NULL;
    struct job_fault fault;
    struct rl_err err = {0};
    int rc = job_parse(text, size, &opts, &j, &fault, &err);
    if (rc) {
        if (j || !err.msg[0])
            abort();
        if (rc == -RL_EINVAL ? fault.code <= 0 || fault.code >= EV_CODE_COUNT : rc != -RL_ENOMEM)
            abort();
        return 0;
    }
    check_id(j->id);
    char *back = NULL;
    if (job_to_json(j, &back, &err))
        abort();
    struct job *j2 = NULL;
    if (job_parse(back, strlen(back), &opts, &j2, &fault, &err)) {
        fprintf(stderr, "written back, refused: %s\n%s\n", err.msg, back);
        abort();
    }
    char *again = NULL;
    if (job_to_json(j2, &again, &err) || strcmp(back, again)) {
        fprintf(stderr, "not a fixed point:\n%s\n%s\n", back, again ? again : "(null)");
        abort();
    }
    if (job_is_deterministic(j) != job_is_deterministic(j2))
        abort();
    render(j);
    int32_t ids[3] = {1, 2, 3};
    char key[JOB_CACHE_KEY_LEN + 1];
    if (job_cache_key(j, job_mode_on(j, "think"), "model", ids, 3, key, &err))
        abort();
    free(back);
    free(again);
    job_free(j);
    job_free(j2);
    return 0;
}
