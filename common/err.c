/* common/err.c - see err.h. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int rl_errf(struct rl_err *err, int code, const char *fmt, ...)
{
    if (code < 0)
        code = -code;
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        if (!err->msg[0])
            snprintf(err->msg, sizeof err->msg, "%s", rl_code_name(code));
    }
    return -code;
}

int rl_err_wrap(struct rl_err *err, const char *fmt, ...)
{
    if (!err)
        return -RL_EINTERNAL;
    if (!err->code)
        err->code = RL_EINTERNAL;
    char prefix[RL_ERR_MSG_MAX], old[RL_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* precision bounds keep the result inside msg; long tails are cut */
    snprintf(err->msg, sizeof err->msg, "%.200s: %.300s", prefix, old);
    return -err->code;
}

const char *rl_code_name(int code)
{
    static const char *const names[] = {
        "OK", "EINVAL", "EIO", "ENOMEM", "EFORMAT", "EUNSUPPORTED",
        "ENOTFOUND", "EFULL", "EBACKEND", "EINTERNAL", "EBUSY",
    };
    if (code < 0)
        code = -code;
    if ((size_t)code < sizeof names / sizeof names[0])
        return names[code];
    return "EUNKNOWN";
}
