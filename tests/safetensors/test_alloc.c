/* Allocation failure at every allocation the reader makes in st_open,
 * st_open_memory, st_index_parse and st_file_sha256: each run must fail
 * with REFIT_ENOMEM (never crash, never another status), leave *out NULL,
 * and free all it took (LeakSanitizer checks that in the sanitized build).
 * Failures are injected through -Wl,--wrap into our own code only: jansson
 * 2.14 itself does not survive allocation failure (an assert in its lexer,
 * heap corruption), which is outside what refit can fix. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "util.h"

static long fail_at = -1; /* the allocation to fail, counted from 1; -1: none */
static long calls;

static int fail_now(void)
{
    return fail_at > 0 && ++calls == fail_at;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t k);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t k);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t k) { return fail_now() ? NULL : __real_calloc(n, k); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return fail_now() ? NULL : __real_strdup(s); }


typedef int (*attempt_fn)(void *arg); /* returns a refit status */

/* Fails allocation 1, 2, ... until a run completes without reaching the
 * failure; returns how many allocations that run made. */
static long sweep(attempt_fn fn, void *arg)
{
    for (long n = 1;; n++) {
        fail_at = n;
        calls = 0;
        int rc = fn(arg);
        long made = calls;
        fail_at = -1;
        if (made < n) { /* the failure was never reached: a clean run */
            assert_int_equal(rc, REFIT_OK);
            return made;
        }
        if (rc != REFIT_ENOMEM)
            print_error("allocation %ld failed, got status %d\n", n, rc);
        assert_int_equal(rc, REFIT_ENOMEM);
    }
}

static int try_open(void *path)
{
    st_set *s = (st_set *)1;
    st_error e;
    int rc = st_open(&s, path, &e);
    if (rc) {
        assert_null(s);
        assert_int_equal(e.status, rc);
    }
    st_close(s);
    return rc;
}

static int try_memory(void *arg)
{
    size_t n;
    uint8_t *buf;
    fail_at = -fail_at; /* build the input without failing */
    buf = tu_build_st(arg, 11, &n);
    fail_at = -fail_at;
    st_set *s = (st_set *)1;
    st_error e;
    int rc = st_open_memory(&s, buf, n, "mem", &e);
    if (rc)
        assert_null(s);
    st_close(s);
    fail_at = -fail_at;
    free(buf);
    fail_at = -fail_at;
    return rc;
}

static int try_index(void *text)
{
    st_index *ix = (st_index *)1;
    st_error e;
    int rc = st_index_parse(&ix, text, strlen(text), "ix", &e);
    if (rc)
        assert_null(ix);
    st_index_free(ix);
    return rc;
}

struct sha_arg {
    st_set *s;
};

static int try_sha(void *arg)
{
    struct sha_arg *a = arg;
    char hex[65];
    st_error e;
    int rc = REFIT_OK;
    for (size_t i = 0; !rc && i < st_file_count(a->s); i++)
        rc = st_file_sha256(a->s, i, hex, &e);
    return rc;
}

static void test_open_fixture(void **state)
{
    (void)state;
    char *dir = tu_path(tu_source_root(), "tests/data/hf-tiny-llama-sharded");
    long made = sweep(try_open, dir);
    print_message("# st_open(fixture): %ld allocations, each failed once\n", made);
    assert_true(made > 20);
    char *shard = tu_path(dir, "model-00003-of-00007.safetensors");
    sweep(try_open, shard);
    free(shard);
    free(dir);
}

static void test_open_memory(void **state)
{
    (void)state;
    static char header[] =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[7,11]},"
        "\"a\":{\"dtype\":\"U8\",\"shape\":[7],\"data_offsets\":[0,7]}}";
    assert_true(sweep(try_memory, header) > 5);
}

static void test_index(void **state)
{
    (void)state;
    static char text[] = "{\"metadata\":{\"total_size\":10},\"weight_map\":"
                         "{\"a\":\"s2.safetensors\",\"b\":\"s1.safetensors\"}}";
    assert_true(sweep(try_index, text) >= 2); /* the index and its shard list */
}

static void test_sha(void **state)
{
    (void)state;
    char *dir = tu_path(tu_source_root(), "tests/data/hf-tiny-llama-sharded");
    struct sha_arg a;
    st_error e;
    assert_int_equal(st_open(&a.s, dir, &e), REFIT_OK);
    sweep(try_sha, &a); /* a failed file stays uncached and is retried */
    st_close(a.s);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_fixture),
        cmocka_unit_test(test_open_memory),
        cmocka_unit_test(test_index),
        cmocka_unit_test(test_sha),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
