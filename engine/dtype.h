/* engine/dtype.h - scalar conversions between the storage dtypes.
 * Inline because the loaders and reference paths call them per element. */
#ifndef RL_DTYPE_H
#define RL_DTYPE_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as the F16C instruction and numpy do; overflow
 * gives infinity, NaN stays NaN (quiet). For the quantizers' scales. */
static inline uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00;
    if (a >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return sign | 0x7c00;
    if (a < 0x38800000u) { /* below 2^-14: subnormal, steps of 2^-24 */
        float af;
        memcpy(&af, &a, 4);
        float q = af * 16777216.0f; /* exact: a power of two */
        uint32_t n = (uint32_t)q;
        float rem = q - (float)n;
        if (rem > 0.5f || (rem == 0.5f && (n & 1)))
            n++;
        return sign | (uint16_t)n; /* n == 0x400 is the smallest normal */
    }
    /* normal: drop 13 mantissa bits, ties to even; a carry moves into the
     * exponent by itself. Rebias 127 -> 15. */
    uint32_t r = (a + 0xfffu + ((a >> 13) & 1u)) >> 13;
    return sign | (uint16_t)(r - ((127u - 15u) << 10));
}

/* OCP FP8 E4M3 (the "fn" variant: no infinities, S.1111.111 is NaN). */
static inline float f8e4m3_to_f32(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80) << 24;
    uint32_t exp = (v >> 3) & 0xf, man = v & 0x7, u;
    if (exp == 0xf && man == 0x7) {
        u = sign | 0x7fc00000u;
    } else if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {
            float f = (float)man / 8.0f / 64.0f; /* 2^-6 * man/8 */
            memcpy(&u, &f, 4);
            u |= sign;
        }
    } else {
        u = sign | ((exp + 127 - 7) << 23) | (man << 20);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
