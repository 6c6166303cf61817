/* common/signals.h - the daemons' (worker, dispatcher) signal handling:
 * SIGTERM and SIGINT ask the process to stop (drain and exit), SIGHUP to
 * reload its live options, and SIGPIPE is ignored, so a dropped Redis
 * socket is an error return, not a death.
 *
 * The flags live here, one pair per process: a signal handler can reach
 * nothing but static storage. Callers poll them through the pointers. */
#ifndef RL_SIGNALS_H
#define RL_SIGNALS_H

#include <signal.h>

/* Installs the handlers; *stop and *reload get the flags they set (each
 * set to 1 on its signal; the caller may clear *reload once served). */
void rl_signals_install(volatile sig_atomic_t **stop, volatile sig_atomic_t **reload);

#endif
