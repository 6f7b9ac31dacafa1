/* SHA-256 (core/sha256.h over libcrypto) against the FIPS 180-4 / NIST
 * example vectors, and streaming in every split against one-shot hashing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "core/sha256.h"

static void hex_of(const void *msg, size_t len, char hex[ST_SHA256_HEX])
{
    uint8_t d[ST_SHA256_DIGEST];
    assert_int_equal(st_sha256_buf(msg, len, d), 0);
    st_sha256_hex(d, hex);
}

static void test_nist_vectors(void **state)
{
    (void)state;
    static const struct {
        const char *msg, *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklm"
         "nopqrlmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    char hex[ST_SHA256_HEX];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        hex_of(v[i].msg, strlen(v[i].msg), hex);
        assert_string_equal(hex, v[i].hex);
    }
}

static void test_million_a(void **state)
{
    (void)state;
    size_t n = 1000000;
    char *a = malloc(n);
    assert_non_null(a);
    memset(a, 'a', n);
    char hex[ST_SHA256_HEX];
    hex_of(a, n, hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}

/* Padding has edge cases at 55, 56 and 64 bytes mod 64; every length up to
 * 200 hashed in two pieces, at every split, must equal the one-shot hash. */
static void test_streaming_splits(void **state)
{
    (void)state;
    uint8_t msg[200];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = (uint8_t)(i * 131 + 17);
    for (size_t len = 0; len <= sizeof msg; len++) {
        uint8_t want[ST_SHA256_DIGEST];
        assert_int_equal(st_sha256_buf(msg, len, want), 0);
        for (size_t cut = 0; cut <= len; cut += (len < 70 ? 1 : 13)) {
            st_sha256_ctx c;
            uint8_t got[ST_SHA256_DIGEST];
            assert_int_equal(st_sha256_init(&c), 0);
            assert_int_equal(st_sha256_update(&c, msg, cut), 0);
            assert_int_equal(st_sha256_update(&c, msg + cut, len - cut), 0);
            assert_int_equal(st_sha256_final(&c, got), 0);
            assert_null(c.md);
            assert_memory_equal(got, want, sizeof want);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nist_vectors),
        cmocka_unit_test(test_million_a),
        cmocka_unit_test(test_streaming_splits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
