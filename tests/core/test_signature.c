/* Signatures (rule 5): every runtime and side tensor's descriptor is
 * recorded at seal and compared at begin and after finalize; any change
 * fails closed with REFIT_EMOVED naming the tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Module "m" with runtime w [4, 4] and explicit strides, module "n" with
 * runtime b [4]; side tensor "workspace" [64] u8. Loaded once at v1. */
static tt_tensor *side;

static void model(tw *w)
{
    tw_module(w, "m", "unquantized", NULL);
    tw_runtime(w, "m", "w", REFIT_F32, 2, TT_SHAPE(4, 4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
    assert_int_equal(tw_expect(w, "m", "m.w", &s), REFIT_OK);
    tw_module(w, "n", "unquantized", NULL);
    tw_runtime(w, "n", "b", REFIT_F32, 1, TT_SHAPE(4));
    s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(w, "n", "n.b", &s), REFIT_OK);
    side = tw_tmp(w, REFIT_U8, 1, TT_SHAPE(64));
    assert_int_equal(refit_model_add_side(w->m, "workspace", &side->t), REFIT_OK);
    tw_seal(w);
    tw_update(w, 1, "v1");
}

/* begin must refuse with EMOVED naming `name`, change nothing, and work
 * again once undo() puts the descriptor back. */
static void expect_begin_moved(tw *w, const char *name, const char *kind)
{
    size_t n, m;
    void *before = tw_snapshot(w, &n);
    refit_txn *t = (refit_txn *)&t;
    int rc = refit_begin(&t, w->m, NULL);
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", refit_errmsg(w->ctx));
    void *after = tw_snapshot(w, &m);
    int same = n == m && !memcmp(before, after, n);
    free(before);
    free(after);
    if (rc != REFIT_EMOVED)
        fail_msg("begin: %s (%s), want REFIT_EMOVED", refit_status_name(rc), msg);
    assert_null(t);
    if (!strstr(msg, name) || !strstr(msg, kind) || !strstr(msg, "begin"))
        fail_msg("message \"%s\" does not name %s tensor %s", msg, kind, name);
    assert_true(same);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
}

static void test_runtime_data_pointer_moved(void **state)
{
    tw *w = *state;
    model(w);
    tt_tensor *rt = tw_rt(w, "m", "w");
    void *keep = rt->t.data;
    char other[64];
    rt->t.data = other;
    expect_begin_moved(w, "w", "runtime");
    tw_assert_msg(w, "module m");
    rt->t.data = keep;
    tw_update(w, 2, "v2");
}

static void test_runtime_shape_changed(void **state)
{
    tw *w = *state;
    model(w);
    tt_tensor *rt = tw_rt(w, "m", "w");
    rt->shape[0] = 2; /* the descriptor's shape array, as an engine would resize */
    expect_begin_moved(w, "w", "runtime");
    rt->shape[0] = 4;
    rt->t.ndim = 1;
    expect_begin_moved(w, "w", "runtime");
    rt->t.ndim = 2;
    tw_update(w, 2, "v2");
}

static void test_runtime_strides_changed(void **state)
{
    tw *w = *state;
    model(w);
    tt_tensor *rt = tw_rt(w, "m", "w");
    rt->strides[0] = 1;
    rt->strides[1] = 4; /* transposed: same bytes, another layout */
    expect_begin_moved(w, "w", "runtime");
    rt->strides[0] = 4;
    rt->strides[1] = 1;
    /* NULL strides mean row-major: the same layout, not a move */
    rt->t.strides = NULL;
    tw_update(w, 2, "v2");
    rt->t.strides = rt->strides;
    tw_update(w, 3, "v3");
}

static void test_runtime_dtype_device_offset_changed(void **state)
{
    tw *w = *state;
    model(w);
    tt_tensor *rt = tw_rt(w, "n", "b");
    rt->t.dtype = REFIT_I32;
    expect_begin_moved(w, "b", "runtime");
    tw_assert_msg(w, "module n");
    rt->t.dtype = REFIT_F32;
    rt->t.device.device_id = 1;
    expect_begin_moved(w, "b", "runtime");
    rt->t.device.device_id = 0;
    rt->t.byte_offset = 4;
    expect_begin_moved(w, "b", "runtime");
    rt->t.byte_offset = 0;
    tw_update(w, 2, "v2");
}

static void test_side_tensor_moved_or_changed(void **state)
{
    tw *w = *state;
    model(w);
    void *keep = side->t.data;
    char other[64];
    side->t.data = other;
    expect_begin_moved(w, "workspace", "side");
    side->t.data = keep;
    side->shape[0] = 128;
    expect_begin_moved(w, "workspace", "side");
    side->shape[0] = 64;
    side->t.dtype = REFIT_I8;
    expect_begin_moved(w, "workspace", "side");
    side->t.dtype = REFIT_U8;
    tw_update(w, 2, "v2");
}

static void test_moved_during_txn_rollback(void **state)
{
    tw *w = *state;
    model(w);
    size_t n, m;
    void *before = tw_snapshot(w, &n);
    tt_tensor *rt = tw_rt(w, "m", "w");
    refit_txn *t = tw_begin(w, "v2", 1);
    tw_load_all(w, t, 2, NULL);
    void *keep = rt->t.data;
    char other[64];
    rt->t.data = other; /* the engine reallocated while the update ran */
    assert_int_equal(refit_finalize(t), REFIT_EMOVED);
    tw_assert_msg(w, "finalize", "runtime", "tensor w", "module m", "aborted");
    rt->t.data = keep;
    void *after = tw_snapshot(w, &m);
    int same = n == m && !memcmp(before, after, n);
    free(before);
    free(after);
    assert_true(same); /* rolled back */
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    tw_update(w, 2, "v2"); /* and the next update works */
}

static void test_side_moved_during_txn_without_rollback(void **state)
{
    tw *w = *state;
    model(w);
    refit_txn *t = tw_begin(w, "v2", 0);
    tw_load_all(w, t, 2, NULL);
    side->shape[0] = 32;
    assert_int_equal(refit_finalize(t), REFIT_EMOVED);
    tw_assert_msg(w, "finalize", "side", "workspace", "POISONED");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_POISONED);
    assert_int_equal(refit_check_serving(w->ctx), REFIT_EPOISONED);
    assert_null(refit_worker_version(w->ctx));
    /* the descriptor back, a full reload recovers */
    side->shape[0] = 64;
    tw_update(w, 2, "v2");
    assert_int_equal(refit_check_serving(w->ctx), REFIT_OK);
}

static void test_move_and_move_back_is_fine(void **state)
{
    tw *w = *state;
    model(w);
    tt_tensor *rt = tw_rt(w, "m", "w");
    void *keep = rt->t.data;
    char other[64];
    rt->t.data = other;
    rt->t.data = keep;
    rt->shape[1] = 8;
    rt->shape[1] = 4;
    tw_update(w, 2, "v2");
    assert_memory_equal(rt->buf, tw_ckpt_tensor(w, "m.w", 2)->buf, 64);
}

#define T(f) cmocka_unit_test_setup_teardown(f, tw_setup, tw_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_runtime_data_pointer_moved),
        T(test_runtime_shape_changed),
        T(test_runtime_strides_changed),
        T(test_runtime_dtype_device_offset_changed),
        T(test_side_tensor_moved_or_changed),
        T(test_moved_during_txn_rollback),
        T(test_side_moved_during_txn_without_rollback),
        T(test_move_and_move_back_is_fine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
