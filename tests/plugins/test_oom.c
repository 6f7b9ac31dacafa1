/* Every allocation refit itself makes while loading a manifest or opening a
 * context with plugins is made to fail in turn (-Wl,--wrap=malloc, calloc,
 * realloc): each failure must come back as REFIT_ENOMEM, leave the model
 * exactly as it was (no module, route or name), and free what it took
 * (ASan's leak check in the sanitizer build). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/model.h"
#include "putil.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);

static long fail_at = -1, calls;

static int should_fail(void)
{
    return fail_at >= 0 && ++calls == fail_at;
}

void *__wrap_malloc(size_t n)
{
    return should_fail() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t m)
{
    return should_fail() ? NULL : __real_calloc(n, m);
}

void *__wrap_realloc(void *p, size_t n)
{
    return should_fail() ? NULL : __real_realloc(p, n);
}

static void arm(long n)
{
    calls = 0;
    fail_at = n;
}

/* Returns 1 when the armed failure happened. */
static int disarm(void)
{
    int hit = fail_at >= 0 && calls >= fail_at;
    fail_at = -1;
    return hit;
}

static void test_manifest_under_every_failure(void **state)
{
    (void)state;
    const char *path = pt_fmt("%s/tools/demo/demo.yaml", pt_env("REFIT_SOURCE_ROOT"));
    char manifest[4096];
    snprintf(manifest, sizeof manifest, "%s", path);
    long n = 1;
    for (;; n++) {
        refit_ctx *ctx;
        refit_model *m;
        PT_RC(NULL, refit_open(&ctx, NULL), REFIT_OK);
        PT_RC(ctx, refit_model_create(&m, ctx), REFIT_OK);
        arm(n);
        int rc = refit_model_load_manifest(m, manifest);
        int hit = disarm();
        if (!hit) {
            PT_RC(ctx, rc, REFIT_OK);
            assert_int_equal(m->n_modules, 14);
            refit_close(ctx);
            break;
        }
        if (rc != REFIT_ENOMEM)
            fail_msg("allocation %ld failed: %s (%s), want REFIT_ENOMEM", n,
                     refit_status_name(rc), refit_errmsg(ctx));
        assert_int_equal(m->n_modules, 0);
        assert_int_equal(m->n_routes, 0);
        assert_int_equal(m->module_names.count, 0);
        assert_int_equal(m->route_names.count, 0);
        refit_close(ctx);
    }
    print_message("# manifest: %ld allocations, each failed once\n", n - 1);
    assert_true(n > 50);
}

static void test_open_with_plugins_under_every_failure(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_stage_fake(dir, "fakestaged", PT_DECL_STAGED);
    pt_stage_fake(dir, "badv0", PT_DECL_DIRECT);
    refit_options o = REFIT_OPTIONS_INIT;
    o.plugin_dirs = dir;
    long n = 1;
    for (;; n++) {
        refit_ctx *ctx = NULL;
        arm(n);
        int rc = refit_open(&ctx, &o);
        int hit = disarm();
        if (!hit) {
            PT_RC(ctx, rc, REFIT_OK);
            assert_non_null(ctx_find_format(ctx, "fakestaged"));
            refit_close(ctx);
            break;
        }
        if (rc == REFIT_OK) /* a refusal that failed to allocate is still a refusal */
            refit_close(ctx);
        else
            assert_int_equal(rc, REFIT_ENOMEM);
    }
    print_message("# refit_open: %ld allocations, each failed once\n", n - 1);
    pt_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_manifest_under_every_failure),
        cmocka_unit_test(test_open_with_plugins_under_every_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
