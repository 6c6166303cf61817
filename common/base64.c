/* common/base64.c - standard base64 (base64.h). */
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "err.h"

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *b64_encode_to(const uint8_t *b, size_t n, char *out)
{
    char *o = out;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) |
                     (i + 2 < n ? b[i + 2] : 0);
        *o++ = b64[v >> 18 & 63];
        *o++ = b64[v >> 12 & 63];
        *o++ = i + 1 < n ? b64[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? b64[v & 63] : '=';
    }
    *o = 0;
    return out;
}

char *b64_encode(const uint8_t *b, size_t n)
{
    char *s = malloc(b64_len(n) + 1);
    return s ? b64_encode_to(b, n, s) : NULL;
}

static int val(char c)
{
    const char *p = c ? strchr(b64, c) : NULL;
    return p ? (int)(p - b64) : -1;
}

long b64_decode(const char *s, size_t len, uint8_t *out, size_t cap)
{
    if (len % 4)
        return -RL_EFORMAT;
    size_t n = 0;
    for (size_t i = 0; i < len; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == len && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad || (v[k] = val(s[i + k])) < 0) {
                return -RL_EFORMAT;
            }
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        uint8_t t[3] = {(uint8_t)(x >> 16), (uint8_t)(x >> 8), (uint8_t)x};
        if (n + 3 - (size_t)pad > cap)
            return -RL_EFORMAT;
        memcpy(out + n, t, 3 - (size_t)pad);
        n += 3 - (size_t)pad;
    }
    return (long)n;
}
