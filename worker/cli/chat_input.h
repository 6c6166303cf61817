/* worker/cli/chat_input.h - the messages of `redlm chat`, read with line
 * editing and history (Debian's libedit) on a terminal, with getline
 * otherwise; multi-line messages either way. */
#ifndef REDLM_CHAT_INPUT_H
#define REDLM_CHAT_INPUT_H

#include <signal.h>
#include <stdbool.h>

#include "err.h"
#include "text.h"

struct chat_input;

/* Opens the reader on stdin/stdout. edit: use libedit (stdin is a
 * terminal); color: a bold prompt; history_path: the file history is
 * loaded from and saved to (NULL or "" = this session only); interrupted:
 * the flag the SIGINT handler sets, which ends a read with -2. The caller
 * owns *out (chat_input_free). Returns 0 or -RL_ENOMEM / -RL_EIO. */
int chat_input_create(struct chat_input **out, bool edit, bool color, const char *history_path,
                      volatile sig_atomic_t *interrupted, struct rl_err *err);
/* Saves the history (when it has a file) and frees everything. */
void chat_input_free(struct chat_input *in);

/* Reads one message into msg (cleared first, NUL-terminated, without the
 * final newline). A line ending in a backslash continues on the next line;
 * a line starting with three double quotes opens a block that ends at a
 * line ending with them (the quotes are dropped); continuation lines get
 * the "... " prompt. Each line typed goes to the history. Returns 0, -1 at
 * end of input (Ctrl-D on an empty line), -2 when Ctrl-C interrupted the
 * read (the partial message is dropped), -RL_ENOMEM. */
int chat_input_read(struct chat_input *in, struct text *msg);

#endif
