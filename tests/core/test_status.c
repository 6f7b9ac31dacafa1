/* Status table: refit_strerror / refit_status_name for every code, the
 * health and dtype names. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct status_row {
    int value;
    const char *name;
    const char *desc;
} status_row;

static const status_row rows[] = {
#define ROW(name, value, desc) {value, "REFIT_" #name, desc},
    REFIT_STATUS_TABLE(ROW)
#undef ROW
};
#define N_ROWS (sizeof rows / sizeof rows[0])

static void test_every_status_has_name_and_text(void **state)
{
    (void)state;
    assert_true(N_ROWS >= 20);
    for (size_t i = 0; i < N_ROWS; i++) {
        assert_string_equal(refit_status_name(rows[i].value), rows[i].name);
        assert_string_equal(refit_strerror(rows[i].value), rows[i].desc);
        assert_true(strlen(rows[i].desc) > 0);
    }
}

static void test_status_values_distinct_ok_zero_errors_negative(void **state)
{
    (void)state;
    assert_int_equal(REFIT_OK, 0);
    assert_string_equal(refit_status_name(0), "REFIT_OK");
    for (size_t i = 0; i < N_ROWS; i++) {
        if (rows[i].value != 0)
            assert_true(rows[i].value < 0);
        for (size_t j = i + 1; j < N_ROWS; j++) {
            assert_int_not_equal(rows[i].value, rows[j].value);
            assert_string_not_equal(rows[i].name, rows[j].name);
            assert_string_not_equal(refit_strerror(rows[i].value), refit_strerror(rows[j].value));
        }
    }
    assert_string_equal(refit_status_name(REFIT_EDUPLICATE), "REFIT_EDUPLICATE");
    assert_string_equal(refit_strerror(REFIT_EDUPLICATE), "tensor delivered twice");
}

static void test_unknown_status(void **state)
{
    (void)state;
    const int unknown[] = {1, 7, -99, -1000, 12345, -2147483647 - 1};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *n = refit_status_name(unknown[i]);
        const char *d = refit_strerror(unknown[i]);
        assert_non_null(n);
        assert_non_null(d);
        assert_string_equal(n, "REFIT_UNKNOWN");
        assert_string_equal(d, "unknown status");
        for (size_t k = 0; k < N_ROWS; k++)
            assert_string_not_equal(n, rows[k].name);
    }
}

static void test_health_and_dtype_names(void **state)
{
    (void)state;
    assert_string_equal(refit_health_name(REFIT_HEALTH_EMPTY), "EMPTY");
    assert_string_equal(refit_health_name(REFIT_HEALTH_READY), "READY");
    assert_string_equal(refit_health_name(REFIT_HEALTH_UPDATING), "UPDATING");
    assert_string_equal(refit_health_name(REFIT_HEALTH_POISONED), "POISONED");
    assert_string_equal(refit_health_name((refit_health)42), "UNKNOWN");
    assert_string_equal(refit_dtype_name(REFIT_F32), "f32");
    assert_string_equal(refit_dtype_name(REFIT_F16), "f16");
    assert_string_equal(refit_dtype_name(REFIT_BF16), "bf16");
    assert_string_equal(refit_dtype_name(REFIT_I32), "i32");
    assert_string_equal(refit_dtype_name(REFIT_U8), "u8");
    assert_string_equal(refit_dtype_name((refit_dtype){REFIT_DTYPE_FLOAT, 24, 1}), "?");
    assert_string_equal(refit_dtype_name((refit_dtype){REFIT_DTYPE_FLOAT, 32, 4}), "?");
}

static void test_errmsg_null_ctx_and_open_defaults(void **state)
{
    (void)state;
    assert_non_null(refit_errmsg(NULL));
    refit_ctx *ctx = NULL;
    refit_options bad = REFIT_OPTIONS_INIT;
    bad.version = 99;
    assert_int_equal(refit_open(&ctx, &bad), REFIT_EINVAL);
    assert_null(ctx);
    assert_int_equal(refit_open(NULL, NULL), REFIT_EINVAL);
    /* a version 1 caller's struct is shorter: it is read no further (ASan
     * catches a read past this allocation) */
    size_t v1 = offsetof(refit_options, undo_device_budget);
    refit_options *old = malloc(v1);
    assert_non_null(old);
    refit_options full = REFIT_OPTIONS_INIT;
    full.version = 1;
    full.worker_id = "v1-caller";
    memcpy(old, &full, v1);
    assert_int_equal(refit_open(&ctx, old), REFIT_OK);
    free(old);
    refit_close(ctx);
    ctx = NULL;
    assert_int_equal(refit_open(&ctx, NULL), REFIT_OK);
    assert_string_equal(refit_errmsg(ctx), "");
    /* no model: EMPTY, serving refused with a reason */
    assert_int_equal(refit_worker_health(ctx), REFIT_HEALTH_EMPTY);
    assert_null(refit_worker_version(ctx));
    assert_int_equal(refit_check_serving(ctx), REFIT_ESTATE);
    assert_non_null(strstr(refit_errmsg(ctx), "EMPTY"));
    refit_close(ctx);
    refit_close(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_status_has_name_and_text),
        cmocka_unit_test(test_status_values_distinct_ok_zero_errors_negative),
        cmocka_unit_test(test_unknown_status),
        cmocka_unit_test(test_health_and_dtype_names),
        cmocka_unit_test(test_errmsg_null_ctx_and_open_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
