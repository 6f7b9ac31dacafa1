/* Post-load without a wait per module, on the host backend: bad data a
 * post-load finds (REFIT_ECORRUPT) is held in the update's status area and
 * reported once, at finalize, after every module's post-load ran; the
 * first failure in post-load order wins; the area is empty again for the
 * next update; the staging of post-loaded modules is kept until a wait and
 * given back when the budget needs it. The CUDA twin is
 * tests/gpu/test_gpu_quant.c (status words on the device). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define N_MOD 6

/* "test-finite": every checkpoint tensor STAGED; post_load copies it to
 * its place, or refuses a NaN or infinity naming module and tensor. It
 * counts its calls and notes the order of the modules. */
static int finite_calls;
static char finite_order[N_MOD * 4 + 1];

static int finite_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    (void)h;
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        refit_ckpt(m, i)->route = REFIT_ROUTE_STAGED;
    m->flags = REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD;
    return REFIT_OK;
}

static int finite_post(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    (void)stream;
    finite_calls++;
    strncat(finite_order, m->name + 1, sizeof finite_order - strlen(finite_order) - 1);
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, i);
        const float *s = c->staged.data;
        float *p = c->place.data;
        int64_t n = c->staged.shape[0] * c->staged.shape[1];
        for (int64_t e = 0; e < n; e++)
            if (!isfinite(s[e]))
                return h->error(h->host, REFIT_ECORRUPT, "module %s, tensor %s: NaN or "
                                "infinity at element %lld", m->name, c->name, (long long)e);
        for (int64_t r = 0; r < c->staged.shape[0]; r++)
            memcpy(p + r * c->place.strides[0], s + r * c->staged.strides[0],
                   (size_t)c->staged.shape[1] * sizeof *s);
    }
    return REFIT_OK;
}

static const refit_format_v2 finite_format = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "test-finite",
    .plan = finite_plan,
    .post_load = finite_post,
};

/* N_MOD modules m0..m5, each w f32 [3, 4] from "mK.w"; sealed and at v1. */
static void six_modules(tw *w)
{
    assert_int_equal(refit_format_register(w->ctx, &finite_format), REFIT_OK);
    for (int k = 0; k < N_MOD; k++) {
        char mod[8], ck[8];
        snprintf(mod, sizeof mod, "m%d", k);
        snprintf(ck, sizeof ck, "m%d.w", k);
        tw_module(w, mod, "test-finite", NULL);
        tw_runtime(w, mod, "w", REFIT_F32, 2, TT_SHAPE(3, 4));
        refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(3, 4));
        s.target = "w";
        assert_int_equal(tw_expect(w, mod, ck, &s), REFIT_OK);
    }
    tw_seal(w);
    tw_update(w, 1, "v1");
    finite_calls = 0;
    finite_order[0] = 0;
}

/* Deliver version v of every module (in reverse when backwards), with a
 * NaN in the modules of bad[] (-1 ends it); every load is accepted. */
static void deliver(tw *w, refit_txn *t, uint64_t v, const int *bad, int backwards)
{
    for (int i = 0; i < N_MOD; i++) {
        int k = backwards ? N_MOD - 1 - i : i;
        char ck[8];
        snprintf(ck, sizeof ck, "m%d.w", k);
        tt_tensor *x = tw_ckpt_tensor(w, ck, v);
        for (const int *b = bad; *b >= 0; b++)
            if (*b == k)
                tt_set_flat(x, 7, NAN);
        int rc = refit_load(t, ck, &x->t, NULL);
        if (rc)
            fail_msg("load %s: %s: %s", ck, refit_status_name(rc), refit_errmsg(w->ctx));
    }
}

static void assert_module_holds(tw *w, int k, uint64_t v)
{
    char mod[8], ck[8];
    snprintf(mod, sizeof mod, "m%d", k);
    snprintf(ck, sizeof ck, "m%d.w", k);
    tt_tensor *rt = tw_rt(w, mod, "w"), *want = tw_ckpt_tensor(w, ck, v);
    if (memcmp(rt->buf, want->buf, rt->bytes))
        fail_msg("module %s does not hold version %llu", mod, (unsigned long long)v);
}

/* A NaN in module 3 of 6: every load is accepted and every post-load runs;
 * finalize fails naming module m3 and tensor m3.w; rollback restores v1. */
static void test_nan_reported_at_finalize_after_every_post_load(void **state)
{
    tw *w = *state;
    six_modules(w);
    size_t n;
    void *before = tw_snapshot(w, &n);
    refit_txn *t = tw_begin(w, "v2", 1);
    deliver(w, t, 2, (const int[]){3, -1}, 0);
    assert_int_equal(finite_calls, N_MOD);
    assert_string_equal(finite_order, "012345");
    refit_txn_stats ts;
    assert_int_equal(refit_txn_stats_get(t, &ts), REFIT_OK);
    assert_int_equal(ts.modules_complete, N_MOD);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_UPDATING);
    assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
    tw_assert_msg(w, "finalize", "module m3", "tensor m3.w", "NaN or infinity at element 7",
                  "rolled back");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    assert_true(tw_snapshot_equal(w, before, n));
    free(before);
}

/* Without rollback the modules after the bad one hold the new bytes (their
 * post-loads ran) and the worker is POISONED, as a failed load leaves it. */
static void test_nan_without_rollback_poisons_after_all_ran(void **state)
{
    tw *w = *state;
    six_modules(w);
    refit_txn *t = tw_begin(w, "v2", 0);
    deliver(w, t, 2, (const int[]){3, -1}, 0);
    assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
    tw_assert_msg(w, "module m3", "tensor m3.w", "POISONED");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_POISONED);
    assert_module_holds(w, 4, 2);
    assert_module_holds(w, 5, 2);
}

/* Two bad modules: the first post-load to find bad data is reported, in
 * the order the post-loads ran (the delivery order). */
static void test_first_failure_wins(void **state)
{
    tw *w = *state;
    six_modules(w);
    for (int backwards = 0; backwards < 2; backwards++) {
        finite_calls = 0;
        finite_order[0] = 0;
        refit_txn *t = tw_begin(w, "v2", 1);
        deliver(w, t, 2, (const int[]){1, 4, -1}, backwards);
        assert_int_equal(finite_calls, N_MOD);
        assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
        const char *msg = refit_errmsg(w->ctx);
        const char *first = backwards ? "tensor m4.w" : "tensor m1.w";
        const char *other = backwards ? "m1" : "m4";
        if (!strstr(msg, first) || strstr(msg, other))
            fail_msg("order %s: message \"%s\" should name %s only", finite_order, msg, first);
        assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    }
}

/* The status area is empty again for the next update: after a failed one
 * (finalize) and after an aborted one, a clean update commits. */
static void test_status_reset_between_updates(void **state)
{
    tw *w = *state;
    six_modules(w);
    refit_txn *t = tw_begin(w, "bad", 1);
    deliver(w, t, 2, (const int[]){2, -1}, 0);
    assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
    t = tw_begin(w, "v3", 1);
    deliver(w, t, 3, (const int[]){-1}, 0);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_string_equal(refit_worker_version(w->ctx), "v3");
    t = tw_begin(w, "aborted", 1);
    deliver(w, t, 4, (const int[]){0, -1}, 0);
    assert_int_equal(refit_abort(t), REFIT_OK);
    t = tw_begin(w, "v5", 0);
    deliver(w, t, 5, (const int[]){-1}, 0);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_string_equal(refit_worker_version(w->ctx), "v5");
    for (int k = 0; k < N_MOD; k++)
        assert_module_holds(w, k, 5);
}

/* Post-loaded modules keep their staging until a wait; when the budget
 * (two modules' worth here) would be exceeded, the txn waits once and
 * gives it back, so an update of six modules still fits. */
static void test_retired_staging_given_back_within_budget(void **state)
{
    (void)state;
    tw w;
    refit_options opt = REFIT_OPTIONS_INIT;
    opt.staging_budget = 2 * 64; /* one module: 3 * 4 * 4 = 48 bytes, padded to 64 */
    assert_int_equal(tw_open(&w, &opt), REFIT_OK);
    six_modules(&w);
    for (uint64_t v = 2; v < 4; v++) {
        refit_txn *t = tw_begin(&w, "v", 1);
        deliver(&w, t, v, (const int[]){-1}, (int)(v & 1));
        assert_int_equal(refit_finalize(t), REFIT_OK);
        for (int k = 0; k < N_MOD; k++)
            assert_module_holds(&w, k, v);
    }
    tw_close(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_nan_reported_at_finalize_after_every_post_load,
                                        tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_nan_without_rollback_poisons_after_all_ran,
                                        tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_first_failure_wins, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_status_reset_between_updates, tw_setup,
                                        tw_teardown),
        cmocka_unit_test(test_retired_staging_given_back_within_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
