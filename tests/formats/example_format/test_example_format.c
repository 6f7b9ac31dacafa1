/* examples/example_format (scale2), built from an install prefix by
 * example_format.sh, loaded as any third-party plugin and run on the CPU
 * reference: runtime = 2 * checkpoint, a reload of the same weights gives
 * the same bytes, a NaN is refused and rolled back (bytes and health as
 * they were), and the plugin is reported as ABI 2 with its kernel. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/core/testutil.h"

static int setup(void **state)
{
    const char *dir = getenv("REFIT_TEST_EXAMPLE_DIR");
    if (!dir) {
        fprintf(stderr, "REFIT_TEST_EXAMPLE_DIR is not set (run through example_format.sh)\n");
        return -1;
    }
    tw *w = calloc(1, sizeof *w);
    refit_options o = REFIT_OPTIONS_INIT;
    o.plugin_dirs = dir;
    o.journal_path = "";
    if (!w || tw_open(w, &o) != REFIT_OK) {
        free(w);
        return -1;
    }
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    tw_close(*state);
    free(*state);
    return 0;
}

static void scale2_model(tw *w)
{
    tw_module(w, "m", "scale2", NULL);
    tt_tensor *a = tw_runtime(w, "m", "w", REFIT_F32, 2, TT_SHAPE(3, 5));
    tt_tensor *b = tw_runtime(w, "m", "b", REFIT_F32, 1, TT_SHAPE(5));
    memset(a->buf, 0, a->bytes);
    memset(b->buf, 0, b->bytes);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(3, 5));
    s.target = "w";
    assert_int_equal(tw_expect(w, "m", "m.w", &s), REFIT_OK);
    s = tt_spec(REFIT_F32, 1, TT_SHAPE(5));
    s.target = "b";
    assert_int_equal(tw_expect(w, "m", "m.b", &s), REFIT_OK);
    tw_seal(w);
}

static void check_doubled(tw *w, uint64_t version)
{
    const char *rt[2] = {"w", "b"}, *ck[2] = {"m.w", "m.b"};
    for (int t = 0; t < 2; t++) {
        tt_tensor *r = tw_rt(w, "m", rt[t]), *c = tw_ckpt_tensor(w, ck[t], version);
        for (int64_t i = 0; i < tt_numel(r); i++)
            if (tt_get_flat(r, i) != 2.0 * tt_get_flat(c, i))
                fail_msg("%s[%lld] = %g, want %g", rt[t], (long long)i, tt_get_flat(r, i),
                         2.0 * tt_get_flat(c, i));
    }
}

static void test_doubles_and_reload_is_cold_start(void **state)
{
    tw *w = *state;
    scale2_model(w);
    tw_update(w, 1, "v1");
    check_doubled(w, 1);
    size_t n1, n2;
    void *s1 = tw_snapshot(w, &n1);
    tw_update(w, 2, "v2");
    check_doubled(w, 2);
    tw_update(w, 1, "v1-again");
    void *s2 = tw_snapshot(w, &n2);
    int same = n1 == n2 && !memcmp(s1, s2, n1);
    free(s1);
    free(s2);
    assert_true(same);
}

static void test_nan_is_refused_and_rolled_back(void **state)
{
    tw *w = *state;
    scale2_model(w);
    tw_update(w, 1, "v1");
    size_t n;
    void *before = tw_snapshot(w, &n);
    tt_tensor *bad = tw_ckpt_tensor(w, "m.w", 2);
    tt_set_flat(bad, 7, NAN);
    refit_txn *t = tw_begin(w, "v2", 1);
    assert_int_equal(tw_load(w, t, "m.b", 2), REFIT_OK);
    assert_int_equal(refit_load(t, "m.w", &bad->t, NULL), REFIT_OK); /* held until finalize */
    assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
    tw_assert_msg(w, "module m", "tensor m.w", "element 7: NaN or infinity");
    void *after = tw_snapshot(w, &n);
    int same = !memcmp(before, after, n);
    free(before);
    free(after);
    assert_true(same);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_doubles_and_reload_is_cold_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nan_is_refused_and_rolled_back, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
