/* engine/prompt.c - job -> prompt token ids (see prompt.h). Lifted from the
 * worker's admission path so that the dispatcher's cache fast path renders
 * byte for byte the same ids. Reentrant: the tokenizer may be shared by
 * threads (tokenizer.h), everything else is local. */
#include "prompt.h"

#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "tokenizer.h"

int prompt_render(const struct job *j, enum job_mode mode, const struct tokenizer *tok,
                  int32_t **ids, int *n_ids, enum ev_code *code, struct rl_err *err)
{
    *ids = NULL;
    *n_ids = 0;
    if (j->input == JOB_INPUT_IDS) {
        int32_t *v = malloc(((size_t)j->n_prompt_ids + 1) * sizeof *v);
        if (!v) {
            *code = EV_CODE_INTERNAL;
            return rl_errf(err, RL_ENOMEM, "out of memory");
        }
        memcpy(v, j->prompt_ids, (size_t)j->n_prompt_ids * sizeof *v);
        *ids = v;
        *n_ids = j->n_prompt_ids;
        return 0;
    }
    if (!tok) {
        *code = EV_CODE_BAD_VALUE;
        return rl_errf(err, RL_EINVAL, "%s: this model has no tokenizer.json; send prompt_ids",
                       j->input == JOB_INPUT_MESSAGES ? "messages" : "prompt");
    }
    int rc;
    struct tok_ids v = {0};
    if (j->input == JOB_INPUT_MESSAGES) {
        struct chat_template_opts co = {
            .add_generation_prompt = true,
            .disable_thinking = mode == JOB_MODE_NO_THINK,
        };
        /* message content is text, never control tokens (chat_tokenize) */
        rc = chat_tokenize(tok, j->messages, j->tools, &co, &v, err);
        *code = rc == -RL_EINVAL ? EV_CODE_TEMPLATE_ERROR : EV_CODE_INTERNAL;
    } else {
        /* a raw prompt is the sender's own template: its tags are tokens */
        rc = tok_encode(tok, j->prompt, j->prompt_len, 0, &v, err);
        *code = EV_CODE_INTERNAL;
    }
    if (rc) {
        tok_ids_free(&v);
        return rc;
    }
    if (j->task == JOB_TASK_EMBED) {
        /* Qwen3-Embedding's tokenizer ends every text with <|endoftext|>,
         * and its vector is that token's hidden state (last-token pooling) */
        static const char eot[] = "<|endoftext|>";
        int32_t id = tok_find(tok, eot, sizeof eot - 1);
        int32_t *g = id >= 0 ? realloc(v.ids, (v.n + 2) * sizeof *g) : v.ids;
        if (!g) {
            tok_ids_free(&v);
            *code = EV_CODE_INTERNAL;
            return rl_errf(err, RL_ENOMEM, "out of memory");
        }
        v.ids = g;
        if (id >= 0)
            v.ids[v.n++] = id;
    }
    *ids = v.ids;
    *n_ids = (int)v.n;
    return 0;
}
