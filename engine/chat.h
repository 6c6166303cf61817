/* engine/chat.h - Qwen3's chat template, rendered in C, and the streaming
 * parser that splits generated text back into reasoning, content and tool
 * calls.
 *
 * Messages and tools are cJSON values in the OpenAI chat format:
 *   {"role": "system"|"user"|"assistant"|"tool", "content": "...",
 *    "reasoning_content": "...",                        (assistant, optional)
 *    "tool_calls": [{"type": "function", "function": {"name": "...",
 *                    "arguments": {...} or "json text"}}]} (assistant, optional)
 *   tools: [{"type": "function", "function": {"name", "description",
 *            "parameters"}}]
 * chat_render's output is byte-identical to what Qwen3's official Jinja
 * template (tokenizer_config.json, rendered by HF transformers) gives for
 * the same input, including its JSON (Python json.dumps with
 * ensure_ascii=False). Where Jinja would raise, we are lenient in two
 * places, both documented at chat_render: a null or missing content is "",
 * and a content array of {"type": "text", "text": ...} parts is joined.
 *
 * Everything here is reentrant; a struct chat_parser belongs to one thread
 * at a time. */
#ifndef RL_CHAT_H
#define RL_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "err.h"
#include "tokenizer.h"

struct chat_template_opts {
    bool add_generation_prompt; /* end with "<|im_start|>assistant\n" */
    bool disable_thinking;      /* enable_thinking=false: the generation prompt
                                   gets an empty "<think>\n\n</think>\n\n" */
    bool continue_final;        /* the last message, an assistant's, stays
                                   open (no <|im_end|>, no generation prompt)
                                   so the model continues it: a prefill
                                   (vLLM's continue_final_message, what
                                   transformers renders for it); another
                                   last role is -RL_EINVAL */
};

/* Renders messages (a non-empty array) and tools (NULL, null, or an array;
 * an empty array counts as none, as in Jinja) into a malloc'd NUL-terminated
 * prompt (*out, caller frees; *len excludes the NUL). Returns -RL_EINVAL
 * naming the message and field when the input is not something the
 * template can render (a missing role, a non-string content that is not a
 * list of text parts, a tool call without arguments, ...). */
int chat_render(const cJSON *messages, const cJSON *tools, const struct chat_template_opts *o,
                char **out, size_t *len, struct rl_err *err);

/* Renders like chat_render and tokenizes the prompt into ids (appended; the
 * caller owns them, tok_ids_free). The template's own tags (<|im_start|>,
 * <think> of the generation prompt, ...) become their tokens; the content
 * of user, system and tool messages and the tool definitions are ordinary
 * text even where they spell a control token, so an end user cannot close
 * their turn or open a system one by typing "<|im_end|>" (tok_encode_spans).
 * Assistant messages are the model's own earlier output and keep their
 * tags. This is what every component that turns messages into ids (engine,
 * worker, dispatcher cache keys) must call, so their ids agree. Returns
 * chat_render's errors (-RL_EINVAL) or the tokenizer's. */
int chat_tokenize(const struct tokenizer *tok, const cJSON *messages, const cJSON *tools,
                  const struct chat_template_opts *o, struct tok_ids *ids, struct rl_err *err);

/* Parses JSON text like cJSON_ParseWithLength, but also keeps each number's
 * spelling (in the number item's valuestring, freed by cJSON_Delete) so
 * that chat_json_dumps can tell 1 from 1.0 and keep big integers exact, as
 * Python does. Returns NULL with err filled (RL_EINVAL, with the offset)
 * on malformed input. */
cJSON *chat_json_parse(const char *text, size_t len, struct rl_err *err);

/* Serializes v as Python's json.dumps(v, ensure_ascii=False) does: ", " and
 * ": " separators, key order kept, non-ASCII kept, control characters as
 * \u00XX, ints as ints, floats as Python's repr (shortest round trip,
 * 1e-05, 1e+16, 1.0). A number without a kept spelling (built with
 * cJSON_CreateNumber) prints as an int when it is integral and below 1e16
 * in magnitude. Returns a malloc'd string (*len without the NUL), or NULL
 * with err filled (RL_ENOMEM, or RL_EINVAL for nesting deeper than 512). */
char *chat_json_dumps(const cJSON *v, size_t *len, struct rl_err *err);

/* ---- output parser ------------------------------------------------------
 *
 * Feed the model's text as it is generated (any split, even inside a tag
 * or a UTF-8 character); get back events. Text that might be the start of
 * a tag (a "</thi" at the end of a delta) is held until the next delta
 * decides it. Newlines right after <think>, right before and after
 * </think>, before <tool_call> and after </tool_call> are dropped, the way
 * the template puts them there.
 *
 * Tool calls stream: once a block's "name" is read and its "arguments"
 * object begins, each feed gives a TOOL_DELTA with the arguments' new
 * text (the first one naming the call). The fragments of a call
 * concatenate exactly to the arguments of its TOOL_CALL, which still
 * closes it. A block that turns out malformed after fragments went out
 * ends as a TOOL_ERROR with streamed set, as one that never streamed;
 * which fragments a consumer already passed on cannot be taken back. */

enum chat_event_type {
    CHAT_EVENT_CONTENT,    /* text: a piece of the answer */
    CHAT_EVENT_REASONING,  /* text: a piece of the reasoning (inside <think>) */
    CHAT_EVENT_TOOL_CALL,  /* name, arguments: one complete <tool_call> */
    CHAT_EVENT_TOOL_ERROR, /* text: the raw block, error: why it is not a call */
    CHAT_EVENT_TOOL_DELTA, /* arguments (and text, len): the next fragment of
                              the open call's arguments; name: on its first
                              fragment only (NULL after) */
};

struct chat_event {
    enum chat_event_type type;
    const char *text;      /* CONTENT/REASONING: the new text; TOOL_*: the raw
                              "<tool_call>...</tool_call>" block */
    size_t len;            /* bytes in text */
    const char *name;      /* TOOL_CALL: the function name */
    const char *arguments; /* TOOL_CALL: arguments as JSON text ("{}" if none) */
    const char *error;     /* TOOL_ERROR: a sentence: malformed JSON, no name,
                              unterminated block */
    bool streamed;         /* TOOL_CALL/TOOL_ERROR: TOOL_DELTAs of this block
                              went out before it */
};

struct chat_parser_opts {
    /* The prompt already opened the reasoning (it ends in "<think>\n", as
     * some Qwen3 templates do): output starts inside it and runs to
     * </think>. Otherwise a <think> at the very start opens it. */
    bool think_open;
    bool no_tools; /* leave <tool_call> blocks in the content */
};

struct chat_parser;

int chat_parser_create(struct chat_parser **out, const struct chat_parser_opts *o,
                       struct rl_err *err);
/* Consumes len bytes of generated text. *events and *n_events receive the new
 * events in order (adjacent text of one type merged), owned by the parser
 * and valid until the next call on it. Returns 0 or -RL_ENOMEM. */
int chat_parser_feed(struct chat_parser *p, const char *text, size_t len,
                     const struct chat_event **events, size_t *n_events, struct rl_err *err);
/* Ends the output: held text is flushed, an unterminated tool call becomes a
 * TOOL_ERROR. The parser may then be fed a new output from the start. */
int chat_parser_finish(struct chat_parser *p, const struct chat_event **events,
                       size_t *n_events, struct rl_err *err);
void chat_parser_free(struct chat_parser *p);

#endif
