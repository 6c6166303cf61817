/* common/err.h - the one error record every module fills.
 *
 * Functions return 0 on success or a negative RL_E* code, and fill a
 * caller-owned struct rl_err with the same code and a message that names the
 * file, field or tensor at fault. A NULL err is allowed: the code still comes
 * back, the message is dropped. */
#ifndef RL_ERR_H
#define RL_ERR_H

#include <stddef.h>

enum rl_code {
    RL_OK = 0,
    RL_EINVAL = 1,       /* bad argument or bad input value */
    RL_EIO = 2,          /* open/read/write/mmap failed */
    RL_ENOMEM = 3,       /* allocation failed */
    RL_EFORMAT = 4,      /* malformed file or message */
    RL_EUNSUPPORTED = 5, /* well-formed but not something we run */
    RL_ENOTFOUND = 6,    /* a named thing is missing */
    RL_EFULL = 7,        /* no capacity left (slots, blocks) */
    RL_EBACKEND = 8,     /* the compute backend failed */
    RL_EINTERNAL = 9,    /* a broken invariant, reported instead of abort() */
    RL_EBUSY = 10,       /* a named thing is in use: try again later */
};

#define RL_ERR_MSG_MAX 512

struct rl_err {
    int code;                 /* an enum rl_code, 0 when no error; the
                                 request validators that say so
                                 (engine_check, engine_submit) fill an
                                 enum ev_code instead, the protocol's own
                                 code (common/event.h, errors.json) */
    char msg[RL_ERR_MSG_MAX]; /* NUL-terminated, never empty on error */
};

/* Fills *err (if non-NULL) and returns -code, so callers can write
 * `return rl_errf(err, RL_EFORMAT, "%s: ...", path);`. */
int rl_errf(struct rl_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes an existing message with more context ("loading DIR: ...").
 * Returns -err->code (or -RL_EINTERNAL when err carries none). */
int rl_err_wrap(struct rl_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A short stable name for a code ("EFORMAT"), for logs and tests. */
const char *rl_code_name(int code);

#endif
