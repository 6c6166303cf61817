/* common/log.h - leveled logging to stderr (journald keeps stderr).
 *
 * RL_LOG checks the level before evaluating its arguments, so a disabled
 * debug line costs one compare. The level lives in a struct the caller owns;
 * processes keep one for their lifetime and pass it down. */
#ifndef RL_LOG_H
#define RL_LOG_H

enum rl_log_level { RL_LOG_ERROR = 0, RL_LOG_WARN, RL_LOG_INFO, RL_LOG_DEBUG };

struct rl_log {
    int level;          /* enum rl_log_level: lines above it are dropped */
    const char *ident;  /* program name printed on each line, e.g. "worker" */
};

void rl_log_write(const struct rl_log *log, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parses "error|warn|info|debug"; returns -1 when unknown. */
int rl_log_parse_level(const char *s);

#define RL_LOG(log, lvl, ...)                                                  \
    do {                                                                       \
        if ((log) && (lvl) <= (log)->level)                                    \
            rl_log_write((log), (lvl), __VA_ARGS__);                           \
    } while (0)

#endif
