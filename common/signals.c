/* common/signals.c - see signals.h. */
#include "signals.h"

#include <string.h>

static volatile sig_atomic_t stop_flag, reload_flag;

static void on_signal(int sig)
{
    if (sig == SIGHUP)
        reload_flag = 1;
    else
        stop_flag = 1;
}

void rl_signals_install(volatile sig_atomic_t **stop, volatile sig_atomic_t **reload)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    *stop = &stop_flag;
    *reload = &reload_flag;
}
