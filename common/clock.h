/* common/clock.h - the clocks the engine, worker, dispatcher and tools
 * read, in the units they want. Header-only: each is one clock_gettime,
 * inlined where it is read (hot paths time every phase of a step).
 *
 * Monotonic for durations and deadlines inside a process; wall (Unix ms)
 * for what crosses processes: event and job timestamps, heartbeats. */
#ifndef RL_CLOCK_H
#define RL_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

static inline double rl_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int64_t rl_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline uint64_t rl_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Unix time in milliseconds. */
static inline int64_t rl_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* *ts = ms from now on the monotonic clock: the deadline of a timed wait
 * on a condition variable made by rl_cond_init_mono. */
static inline void rl_mono_deadline(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* A condition variable whose timed waits run on the monotonic clock (a
 * wall-clock step must not stretch or cut a wait). 0 or -1. */
static inline int rl_cond_init_mono(pthread_cond_t *c)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a))
        return -1;
    int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC) || pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
    return rc ? -1 : 0;
}

#endif
