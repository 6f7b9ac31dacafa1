/* The module parameter parser (core/params.h) and the name table
 * (core/names.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/names.h"
#include "core/params.h"
#include "testutil.h"

/* ---- params ---- */

static void test_params_flat_mapping(void **state)
{
    (void)state;
    params p;
    char err[256] = "";
    assert_int_equal(params_parse(&p, "cast: true\nscale: 2.5\n# a comment\nname: 'fp8 e4m3'\n",
                                  err, sizeof err),
                     REFIT_OK);
    assert_int_equal(p.n, 3);
    assert_string_equal(params_get(&p, "cast"), "true");
    assert_string_equal(params_get(&p, "scale"), "2.5");
    assert_string_equal(params_get(&p, "name"), "fp8 e4m3");
    assert_null(params_get(&p, "missing"));
    assert_null(params_get(&p, "Cast")); /* keys are case-sensitive */
    assert_int_equal(params_bool(&p, "cast"), 1);
    assert_int_equal(params_bool(&p, "scale"), -1);
    assert_int_equal(params_bool(&p, "missing"), -1);
    params_free(&p);
    assert_int_equal(p.n, 0);
    params_free(&p); /* twice is harmless */
}

static void test_params_flow_mapping_and_empty_value(void **state)
{
    (void)state;
    params p;
    char err[256];
    assert_int_equal(params_parse(&p, "{a: 1, b: \"x: y\"}", err, sizeof err), REFIT_OK);
    assert_int_equal(p.n, 2);
    assert_string_equal(params_get(&p, "a"), "1");
    assert_string_equal(params_get(&p, "b"), "x: y");
    params_free(&p);
    assert_int_equal(params_parse(&p, "a:\nb: 2", err, sizeof err), REFIT_OK);
    assert_string_equal(params_get(&p, "a"), "");
    assert_string_equal(params_get(&p, "b"), "2");
    params_free(&p);
}

static void test_params_empty_input(void **state)
{
    (void)state;
    params p;
    char err[64];
    assert_int_equal(params_parse(&p, NULL, err, sizeof err), REFIT_OK);
    assert_int_equal(p.n, 0);
    assert_null(params_get(&p, "cast"));
    assert_int_equal(params_bool(&p, "cast"), -1);
    params_free(&p);
    assert_int_equal(params_parse(&p, "", err, sizeof err), REFIT_OK);
    assert_int_equal(p.n, 0);
    params_free(&p);
}

static void test_params_bool_spellings(void **state)
{
    (void)state;
    const char *yes[] = {"true", "TRUE", "Yes", "on", "1"};
    const char *no[] = {"false", "False", "no", "OFF", "0"};
    const char *neither[] = {"2", "maybe", "tru", "yess", "''"};
    char text[64], err[128];
    params p;
    for (int i = 0; i < 5; i++) {
        snprintf(text, sizeof text, "k: %s", yes[i]);
        assert_int_equal(params_parse(&p, text, err, sizeof err), REFIT_OK);
        assert_int_equal(params_bool(&p, "k"), 1);
        params_free(&p);
        snprintf(text, sizeof text, "k: %s", no[i]);
        assert_int_equal(params_parse(&p, text, err, sizeof err), REFIT_OK);
        assert_int_equal(params_bool(&p, "k"), 0);
        params_free(&p);
        snprintf(text, sizeof text, "k: %s", neither[i]);
        assert_int_equal(params_parse(&p, text, err, sizeof err), REFIT_OK);
        assert_int_equal(params_bool(&p, "k"), -1);
        params_free(&p);
    }
}

static void expect_params_error(const char *text, const char *want1, const char *want2)
{
    params p;
    char err[256] = "";
    int rc = params_parse(&p, text, err, sizeof err);
    if (rc != REFIT_EINVAL)
        fail_msg("\"%s\": %s, want REFIT_EINVAL", text, refit_status_name(rc));
    if (!strstr(err, want1) || !strstr(err, want2) || !strstr(err, "column "))
        fail_msg("\"%s\": error \"%s\" lacks \"%s\"/\"%s\"/column", text, err, want1, want2);
    assert_int_equal(p.n, 0); /* nothing kept */
    params_free(&p);
}

static void test_params_errors_have_line_and_column(void **state)
{
    (void)state;
    expect_params_error("a: 1\nb:\n  c: 2\n", "line 3", "nested");
    expect_params_error("a: [1, 2]", "line 1", "sequence");
    expect_params_error("- 1\n- 2", "line 1", "sequence");
    expect_params_error("plain scalar", "line 1", "mapping");
    expect_params_error("cast: true\ncast: false\n", "line 2, column 1", "duplicate key");
    expect_params_error("a: 1\nb: 'unterminated\n", "line ", "");
    expect_params_error("a: b: c", "line 1", "");
    expect_params_error("a: 1\n\tb: 2", "line 2", "");
}

/* ---- names ---- */

#define N_KEYS 100000

static void test_names_100k_insert_find_duplicates(void **state)
{
    (void)state;
    char **keys = malloc(N_KEYS * sizeof *keys);
    assert_non_null(keys);
    for (uint32_t i = 0; i < N_KEYS; i++) {
        char buf[96];
        snprintf(buf, sizeof buf, "model.layers.%u.mlp.experts.%u.w%u.weight", i / 1000,
                 i % 1000 / 3, i % 3 + 1);
        keys[i] = strdup(buf);
        assert_non_null(keys[i]);
    }
    names t = {0};
    assert_int_equal(names_find(&t, keys[0]), NAMES_NONE); /* empty table */
    for (uint32_t i = 0; i < N_KEYS; i++)
        assert_int_equal(names_insert(&t, keys[i], i), REFIT_OK);
    assert_int_equal(t.count, N_KEYS);
    assert_true(t.cap >= 2 * t.count);         /* load factor at most 1/2 */
    assert_int_equal(t.cap & (t.cap - 1), 0);  /* power of two */
    int all_found = 1, dups_refused = 1, misses = 1;
    for (uint32_t i = 0; i < N_KEYS; i++) {
        if (names_find(&t, keys[i]) != i)
            all_found = 0;
        /* a duplicate (another pointer, same text) is refused, value kept */
        char *copy = strdup(keys[i]);
        if (names_insert(&t, copy, i + 7) != REFIT_EEXIST || names_find(&t, copy) != i)
            dups_refused = 0;
        free(copy);
        char miss[112];
        snprintf(miss, sizeof miss, "%s.bias", keys[i]);
        if (names_find(&t, miss) != NAMES_NONE)
            misses = 0;
    }
    assert_int_equal(t.count, N_KEYS);
    names_free(&t);
    assert_int_equal(t.cap, 0);
    assert_int_equal(names_find(&t, keys[1]), NAMES_NONE);
    for (uint32_t i = 0; i < N_KEYS; i++)
        free(keys[i]);
    free(keys);
    assert_true(all_found);
    assert_true(dups_refused);
    assert_true(misses);
}

static void test_names_prefixes_and_empty_key(void **state)
{
    (void)state;
    names t = {0};
    const char *k[] = {"", "a", "ab", "abc", "abd", "b", "ba"};
    for (uint32_t i = 0; i < 7; i++)
        assert_int_equal(names_insert(&t, k[i], 100 + i), REFIT_OK);
    for (uint32_t i = 0; i < 7; i++)
        assert_int_equal(names_find(&t, k[i]), 100 + i);
    assert_int_equal(names_find(&t, "abcd"), NAMES_NONE);
    assert_int_equal(names_find(&t, "A"), NAMES_NONE);
    assert_int_equal(names_insert(&t, "ab", 1), REFIT_EEXIST);
    assert_int_equal(names_find(&t, "ab"), 102);
    names_free(&t);
    /* reusable after free */
    assert_int_equal(names_insert(&t, "x", 5), REFIT_OK);
    assert_int_equal(names_find(&t, "x"), 5);
    names_free(&t);
}

static void test_names_hash(void **state)
{
    (void)state;
    assert_true(names_hash("model.w") == names_hash("model.w"));
    assert_true(names_hash("model.w") != names_hash("model.v"));
    assert_true(names_hash("") != names_hash("a"));
    assert_true(names_hash("ab") != names_hash("ba"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_flat_mapping),
        cmocka_unit_test(test_params_flow_mapping_and_empty_value),
        cmocka_unit_test(test_params_empty_input),
        cmocka_unit_test(test_params_bool_spellings),
        cmocka_unit_test(test_params_errors_have_line_and_column),
        cmocka_unit_test(test_names_100k_insert_find_duplicates),
        cmocka_unit_test(test_names_prefixes_and_empty_key),
        cmocka_unit_test(test_names_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
