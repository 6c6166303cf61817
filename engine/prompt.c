/* engine/prompt.c - job -> prompt token ids (see prompt.h). Lifted from the
 * worker's admission path so that the dispatcher's cache fast path renders
 * byte for byte the same ids. Reentrant: the tokenizer may be shared by
 * threads (tokenizer.h), everything else is local. */
#include "prompt.h"

#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "text.h"
#include "tokenizer.h"

/* Qwen3-Reranker's prompt (its model card's format): the judge's system
 * message, then the instruction, query and document as plain text (their
 * bytes never become control tokens: a document that holds "<|im_end|>"
 * cannot end the turn), then an assistant turn with an empty think block,
 * whose next token the model answers "yes" or "no". */
static const char RR_HEAD[] =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: ";
static const char RR_TAIL[] = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

static int render_rerank(const struct job *j, const struct tokenizer *tok, struct tok_ids *v,
                         struct rl_err *err)
{
    const char *ins = j->instruction ? j->instruction : PROMPT_RERANK_INSTRUCTION;
    const char *part[3] = {ins, j->query, j->document};
    static const char *const after[3] = {"\n<Query>: ", "\n<Document>: ", RR_TAIL};
    struct text t = {0};
    struct tok_span plain[3];
    text_add(&t, RR_HEAD, sizeof RR_HEAD - 1);
    for (int i = 0; i < 3; i++) {
        plain[i] = (struct tok_span){t.n, strlen(part[i])};
        text_add(&t, part[i], plain[i].len);
        text_add(&t, after[i], strlen(after[i]));
    }
    int rc = t.oom ? rl_errf(err, RL_ENOMEM, "out of memory")
                   : tok_encode_spans(tok, t.p, t.n, 0, plain, 3, v, err);
    text_free(&t);
    return rc;
}

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
    if (j->input == JOB_INPUT_RERANK) {
        rc = render_rerank(j, tok, &v, err);
        *code = rc == -RL_EINVAL ? EV_CODE_BAD_UTF8 : EV_CODE_INTERNAL;
    } else if (j->input == JOB_INPUT_MESSAGES) {
        struct chat_template_opts co = {
            .add_generation_prompt = true,
            .disable_thinking = mode == JOB_MODE_NO_THINK,
            .continue_final = j->continue_final,
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
