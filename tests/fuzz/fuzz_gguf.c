/* tests/fuzz/fuzz_gguf.c - libFuzzer target for the GGUF reader. The input
 * is a whole file image; every metadata value and every tensor the parser
 * accepts is read end to end (strings and array elements through the
 * getters, sized tensors byte by byte), so anything that escapes the
 * buffer shows up under ASan. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gguf_file *f = NULL;
    struct rl_err err;
    if (gguf_parse_buffer(&f, data, size, "fuzz", &err)) {
        if (f || !err.code || !err.msg[0])
            abort();
        return 0;
    }
    volatile uint8_t sink = 0;
    for (int i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_get_tensor(f, i);
        const uint8_t *p = t->data;
        if (p < data || p + t->n_bytes > data + size || gguf_find_tensor(f, t->name) != t)
            abort();
        for (size_t j = 0; j < t->n_bytes; j++)
            sink ^= p[j];
    }
    /* the tokenizer's arrays, as tok_load_gguf reads them */
    static const char *const keys[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                       "tokenizer.ggml.token_type", "general.architecture"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        enum gguf_vtype vt;
        uint64_t n;
        const char *s;
        size_t len;
        int64_t v;
        if (gguf_get_arr(f, keys[k], &vt, &n, NULL)) {
            if (!gguf_get_str(f, keys[k], &s, &len, NULL))
                for (size_t j = 0; j < len; j++)
                    sink ^= (uint8_t)s[j];
            continue;
        }
        for (uint64_t i = 0; i < n; i++) {
            if (!gguf_arr_str(f, keys[k], i, &s, &len, NULL)) {
                if ((const uint8_t *)s < data || (const uint8_t *)s + len > data + size)
                    abort();
                for (size_t j = 0; j < len; j++)
                    sink ^= (uint8_t)s[j];
            } else if (!gguf_arr_int(f, keys[k], i, &v, NULL)) {
                sink ^= (uint8_t)v;
            }
        }
    }
    (void)sink;
    gguf_close(f);
    return 0;
}
