/* engine/xoshiro.h - the one pseudo-random generator of the engine:
 * splitmix64 to expand a seed, xoshiro256** (Blackman and Vigna) to draw.
 *
 * Header-only and static inline, because its callers draw in their hottest
 * loops (mkmodel fills gigabytes of weights, the sampler draws once per
 * output token) and the state is a plain uint64_t[4] the caller owns. The
 * sequence is part of what tests pin: a seeded request's tokens and a
 * generated model's bytes depend on every bit of it, so never change it. */
#ifndef RL_XOSHIRO_H
#define RL_XOSHIRO_H

#include <stdint.h>

/* The next value of splitmix64 over *x (advancing it): for seeding. */
static inline uint64_t xo_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t xo_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* The next draw of xoshiro256** from state s (4 words, not all zero). */
static inline uint64_t xo_next(uint64_t s[4])
{
    uint64_t r = xo_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = xo_rotl(s[3], 45);
    return r;
}

/* Roughly standard normal: the sum of four 16-bit uniforms (Irwin-Hall),
 * centred and scaled to unit variance. Bounded at +-3.46, which keeps random
 * models free of outliers; one draw per value keeps the model maker
 * disk-bound. */
static inline float xo_normal(uint64_t s[4])
{
    uint64_t v = xo_next(s);
    int32_t t = (int32_t)(v & 0xffff) + (int32_t)((v >> 16) & 0xffff) +
                (int32_t)((v >> 32) & 0xffff) + (int32_t)(v >> 48);
    return (float)(t - 131070) * (1.0f / 37837.23f);
}

#endif
