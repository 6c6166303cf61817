/* tests/unit/test_sha256.c - SHA-256 against the FIPS 180-4 / NIST vectors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sha256.h"

static const struct {
    const char *msg;
    const char *hex;
} vectors[] = {
    {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
     "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    {"The quick brown fox jumps over the lazy dog",
     "d7a8fbb307d7809469ca9abcb0082e4f8d5651e46d3cdb762d02d0bf37c9e592"},
};

static void test_vectors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
        char hex[SHA256_HEX_LEN + 1];
        sha256_hex(vectors[i].msg, strlen(vectors[i].msg), hex);
        assert_string_equal(hex, vectors[i].hex);
    }
}

/* One million 'a' (FIPS 180-2 appendix B.3), fed in odd-sized pieces so the
 * partial-block path is exercised. */
static void test_million_a_streaming(void **state)
{
    (void)state;
    char chunk[997];
    memset(chunk, 'a', sizeof chunk);
    struct sha256_ctx c;
    sha256_init(&c);
    size_t left = 1000000;
    while (left) {
        size_t n = left < sizeof chunk ? left : sizeof chunk;
        sha256_update(&c, chunk, n);
        left -= n;
    }
    uint8_t d[SHA256_DIGEST_LEN];
    char hex[SHA256_HEX_LEN + 1];
    sha256_final(&c, d);
    sha256_to_hex(d, hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* Every length around the padding boundaries: streaming byte by byte must
 * equal one-shot. */
static void test_split_equals_oneshot(void **state)
{
    (void)state;
    uint8_t msg[200];
    for (int i = 0; i < 200; i++)
        msg[i] = (uint8_t)(i * 7 + 3);
    for (size_t n = 0; n <= 200; n++) {
        char a[SHA256_HEX_LEN + 1], b[SHA256_HEX_LEN + 1];
        uint8_t d[SHA256_DIGEST_LEN];
        struct sha256_ctx c;
        sha256_hex(msg, n, a);
        sha256_init(&c);
        for (size_t i = 0; i < n; i++)
            sha256_update(&c, msg + i, 1);
        sha256_final(&c, d);
        sha256_to_hex(d, b);
        assert_string_equal(a, b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_million_a_streaming),
        cmocka_unit_test(test_split_equals_oneshot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
