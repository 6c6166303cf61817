/* worker/cli/chat_input.c - how `redlm chat` reads a message.
 *
 * On a terminal it uses libedit's native interface (histedit.h) rather
 * than its readline emulation: el_gets gives us the line without
 * installing signal handlers of its own (EL_SIGNAL stays off), so chat's
 * SIGINT flag keeps working the same way at the prompt and while an answer
 * streams. Ctrl-C at the prompt makes read(2) fail with EINTR (the handler
 * is installed without SA_RESTART); el_gets returns NULL with the terminal
 * back in cooked mode and this file returns -2. Emacs key bindings (the
 * default a readline user expects: arrows, Home/End, Ctrl-A/E/K/U/W,
 * Ctrl-R incremental search; `bind -v` in ~/.editrc for vi) and
 * ~/.editrc are honoured.
 *
 * History holds physical lines (a multi-line message is several entries),
 * since a recalled line with an embedded newline cannot be edited in one
 * line buffer. It is loaded from and saved to history_path when one is
 * given; a file that cannot be read is simply a fresh history.
 *
 * Piped input (tests, scripts) goes through getline with the same
 * multi-line rules and no prompt echo of its own beyond the "> " the
 * caller used to print, so output stays byte for byte what it was.
 *
 * Single-threaded: chat's main thread only. */
#include "chat_input.h"

#include <errno.h>
#include <histedit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct chat_input {
    EditLine *el;                     /* NULL when not editing */
    History *hist;
    bool color;
    bool cont;                        /* the next prompt is a continuation */
    char *path;                       /* history file, or NULL */
    volatile sig_atomic_t *interrupted;
    char *line;                       /* getline's buffer */
    size_t cap;
};

/* libedit asks the prompt through a callback; the \1 bytes bracket the
 * colour escapes so that it does not count them as columns. */
static char *prompt_fn(EditLine *el)
{
    struct chat_input *in = NULL;
    el_get(el, EL_CLIENTDATA, &in);
    if (in->color)
        return in->cont ? "\1\033[1m\1... \1\033[0m\1" : "\1\033[1m\1> \1\033[0m\1";
    return in->cont ? "... " : "> ";
}

int chat_input_create(struct chat_input **out, bool edit, bool color, const char *history_path,
                      volatile sig_atomic_t *interrupted, struct rl_err *err)
{
    *out = NULL;
    struct chat_input *in = calloc(1, sizeof *in);
    if (!in)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    in->color = color;
    in->interrupted = interrupted;
    if (history_path && *history_path && !(in->path = strdup(history_path))) {
        free(in);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    if (edit) {
        HistEvent ev;
        in->hist = history_init();
        in->el = el_init("redlm", stdin, stdout, stderr);
        if (!in->hist || !in->el) {
            chat_input_free(in);
            return rl_errf(err, RL_EIO, "libedit: cannot set up line editing on this terminal");
        }
        history(in->hist, &ev, H_SETSIZE, 1000);
        history(in->hist, &ev, H_SETUNIQUE, 1);
        if (in->path)
            history(in->hist, &ev, H_LOAD, in->path); /* none yet: a fresh history */
        el_set(in->el, EL_CLIENTDATA, in);
        el_set(in->el, EL_EDITOR, "emacs");
        el_set(in->el, EL_HIST, history, in->hist);
        el_set(in->el, EL_PROMPT_ESC, prompt_fn, '\1');
        el_set(in->el, EL_SIGNAL, 0);
        /* Home, End and Delete as xterm, the Linux console, screen and tmux
         * send them, whatever the terminfo entry says (libedit binds only
         * the entry's own, and TERM is often not the terminal in use) */
        static const char *const keys[][2] = {
            {"\033[H", "ed-move-to-beg"},  {"\033OH", "ed-move-to-beg"},
            {"\033[1~", "ed-move-to-beg"}, {"\033[7~", "ed-move-to-beg"},
            {"\033[F", "ed-move-to-end"},  {"\033OF", "ed-move-to-end"},
            {"\033[4~", "ed-move-to-end"}, {"\033[8~", "ed-move-to-end"},
            {"\033[3~", "ed-delete-next-char"},
            {"\033[1;5C", "em-next-word"}, {"\033[1;5D", "ed-prev-word"},
            /* readline's reverse search (libedit's emacs map redraws on ^R) */
            {"^R", "em-inc-search-prev"},
        };
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            el_set(in->el, EL_BIND, keys[i][0], keys[i][1], NULL);
        el_source(in->el, NULL); /* ~/.editrc, when the user has one */
    }
    *out = in;
    return 0;
}

void chat_input_free(struct chat_input *in)
{
    if (!in)
        return;
    HistEvent ev;
    if (in->hist && in->path)
        history(in->hist, &ev, H_SAVE, in->path);
    if (in->el)
        el_end(in->el);
    if (in->hist)
        history_end(in->hist);
    free(in->path);
    free(in->line);
    free(in);
}

/* One physical line into *s and *n (not NUL-terminated, newline dropped):
 * 0, -1 at EOF, -2 on Ctrl-C. */
static int read_one(struct chat_input *in, const char **s, size_t *n)
{
    if (in->el) {
        int count = 0;
        errno = 0;
        const char *l = el_gets(in->el, &count);
        if (!l || count < 0) {
            if (*in->interrupted || errno == EINTR)
                return -2;
            return -1;
        }
        size_t k = (size_t)count;
        while (k > 0 && (l[k - 1] == '\n' || l[k - 1] == '\r'))
            k--;
        if (k) {
            HistEvent ev;
            char *h = strndup(l, k);
            if (h) {
                history(in->hist, &ev, H_ENTER, h);
                free(h);
            }
        }
        *s = l;
        *n = k;
        return 0;
    }
    fputs(in->color ? (in->cont ? "\033[1m... \033[0m" : "\033[1m> \033[0m")
                    : (in->cont ? "... " : "> "), stdout);
    fflush(stdout);
    errno = 0;
    ssize_t k = getline(&in->line, &in->cap, stdin);
    if (k < 0) {
        if (errno == EINTR || *in->interrupted) {
            clearerr(stdin);
            return -2;
        }
        return -1;
    }
    while (k > 0 && (in->line[k - 1] == '\n' || in->line[k - 1] == '\r'))
        k--;
    *s = in->line;
    *n = (size_t)k;
    return 0;
}

int chat_input_read(struct chat_input *in, struct text *msg)
{
    text_clear(msg);
    in->cont = false;
    bool block = false;
    for (;;) {
        const char *s;
        size_t n;
        int rc = read_one(in, &s, &n);
        if (rc) {
            in->cont = false;
            return rc;
        }
        bool more = false;
        if (!in->cont && n >= 3 && !memcmp(s, "\"\"\"", 3)) {
            /* """ opens a block; """text""" on one line is a block too */
            s += 3, n -= 3;
            block = true;
            if (n >= 3 && !memcmp(s + n - 3, "\"\"\"", 3))
                n -= 3, block = false;
            else
                more = true;
        } else if (block) {
            if (n >= 3 && !memcmp(s + n - 3, "\"\"\"", 3))
                n -= 3, block = false;
            else
                more = true;
        } else if (n > 0 && s[n - 1] == '\\') {
            n--;
            more = true;
        }
        /* a block's first line may be empty ("""<Enter>): no leading newline */
        if ((n || msg->n) && text_add(msg, s, n))
            return -RL_ENOMEM;
        if (!more)
            break;
        if (msg->n && text_add(msg, "\n", 1))
            return -RL_ENOMEM;
        in->cont = true;
    }
    in->cont = false;
    if (text_reserve(msg, 0)) /* p is non-NULL and NUL-terminated */
        return -RL_ENOMEM;
    return 0;
}
