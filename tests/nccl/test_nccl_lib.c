/* The NCCL transport without a GPU: how a missing NCCL is reported, and
 * the option checks (tests/nccl/test_nccl_gpu.c runs it on two GPUs). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <refit/transport.h>

static refit_ctx *ctx_new(void)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    refit_ctx *ctx = NULL;
    assert_int_equal(refit_open(&ctx, &o), REFIT_OK);
    return ctx;
}

static void test_missing_library_is_named(void **state)
{
    (void)state;
    refit_ctx *ctx = ctx_new();
    setenv("REFIT_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
    assert_int_equal(refit_nccl_probe(ctx), REFIT_EUNSUPPORTED);
    assert_non_null(strstr(refit_errmsg(ctx), "/nonexistent/libnccl.so.2: not found"));
    refit_nccl_id id;
    assert_int_equal(refit_nccl_unique_id(ctx, &id), REFIT_EUNSUPPORTED);
    unsetenv("REFIT_NCCL_LIBRARY");
    refit_close(ctx);
}

static void test_bad_options_refused(void **state)
{
    (void)state;
    refit_ctx *ctx = ctx_new();
    refit_transport *x = (refit_transport *)1;
    refit_nccl_opts o = REFIT_NCCL_OPTS_INIT;
    assert_int_equal(refit_transport_nccl(&x, ctx, &o), REFIT_EINVAL); /* no id, no comm */
    assert_null(x);
    assert_non_null(strstr(refit_errmsg(ctx), "no unique id"));
    refit_nccl_id id = {{0}};
    o.id = &id;
    o.nranks = 2;
    o.rank = 2;
    assert_int_equal(refit_transport_nccl(&x, ctx, &o), REFIT_EINVAL);
    o.version = 99;
    assert_int_equal(refit_transport_nccl(&x, ctx, &o), REFIT_EINVAL);
    refit_close(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_library_is_named),
        cmocka_unit_test(test_bad_options_refused),
    };
    return cmocka_run_group_tests_name("nccl-lib", tests, NULL, NULL);
}
