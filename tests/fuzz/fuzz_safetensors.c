/* tests/fuzz/fuzz_safetensors.c - libFuzzer target for the safetensors
 * header parser. The input is a whole file image; every tensor the parser
 * accepts is read end to end, so a range that escapes the buffer shows up
 * under ASan, and the published invariants (data inside the image, byte
 * count = shape x dtype size, lookups find each name) are checked. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct st_file *f = NULL;
    struct rl_err err;
    if (st_parse_buffer(&f, data, size, "fuzz", &err)) {
        if (f || !err.code || !err.msg[0])
            abort();
        return 0;
    }
    volatile uint8_t sink = 0;
    for (int i = 0; i < st_n_tensors(f); i++) {
        const struct st_tensor *t = st_get(f, i);
        const uint8_t *p = t->data;
        if (p < data || p + t->n_bytes > data + size)
            abort();
        uint64_t n = st_dtype_size(t->dtype);
        for (int d = 0; d < t->n_dims; d++)
            n *= (uint64_t)t->shape[d];
        if (n != t->n_bytes || st_find(f, t->name) != t)
            abort();
        for (size_t j = 0; j < t->n_bytes; j++)
            sink ^= p[j];
        st_mark_used(f, t);
    }
    if (st_first_unused(f))
        abort();
    (void)sink;
    st_close(f);
    return 0;
}
