/* common/clock.h - the clocks the engine, worker, dispatcher and tools
 * read, in the units they want. Header-only: each is one clock_gettime,
 * inlined where it is read (hot paths time every phase of a step).
 *
 * Monotonic for durations and deadlines inside a process; wall (Unix ms)
 * for what crosses processes: event and job timestamps, heartbeats. */
#ifndef RL_CLOCK_H
#define RL_CLOCK_H

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

#endif
