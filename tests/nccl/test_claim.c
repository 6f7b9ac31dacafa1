/* txn_claim_direct, the core's entry point for the NCCL receiver's DIRECT
 * buckets, on its own (no transport): a contiguous DIRECT route gives the
 * runtime address and counts as delivered; every refusal a load would
 * make comes back unchanged and leaves nothing behind; a route that is not
 * a plain contiguous copy (STAGED, a cast, another rank's rows, a dim-1
 * shard) says "not direct" and changes nothing, so the load that follows
 * is accepted; parts claim their rows; the undo log restores bytes the
 * caller wrote in place. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../core/testutil.h"
#include "core/model.h"
#include "core/txn.h"

#define F32 REFIT_F32

/* What the transport would describe: the delivered piece, no data. */
typedef struct desc {
    refit_tensor t;
    int64_t shape[REFIT_MAX_DIMS];
} desc;

static refit_tensor *describe(desc *d, refit_dtype dt, int ndim, const int64_t *shape)
{
    memcpy(d->shape, shape, (size_t)ndim * sizeof *shape);
    d->t = (refit_tensor){.device = {REFIT_DEVICE_CPU, 0}, .ndim = ndim, .dtype = dt,
                          .shape = d->shape};
    return &d->t;
}

/* "plain.w": F32 [8, 4] into a DIRECT route of module "plain". */
static void plain_model(tw *w, refit_dtype ckpt_dt)
{
    tw_module(w, "plain", "unquantized", "cast: true");
    tw_runtime(w, "plain", "w", F32, 2, TT_SHAPE(8, 4));
    refit_ckpt_spec s = tt_spec(ckpt_dt, 2, TT_SHAPE(8, 4)); /* bf16: the format casts */
    assert_int_equal(tw_expect(w, "plain", "plain.w", &s), REFIT_OK);
    tw_seal(w);
}

static void test_direct_route_gives_the_runtime_bytes(void **state)
{
    tw *w = *state;
    plain_model(w, F32);
    tt_tensor *rt = tw_rt(w, "plain", "w");
    tt_tensor *src = tw_ckpt_tensor(w, "plain.w", 2);
    w->keep_going = 1; /* refusals, then the update goes on */
    refit_txn *t = tw_begin(w, "v2", 1);
    desc d_d;
    refit_tensor *d = describe(&d_d, F32, 2, TT_SHAPE(8, 4));
    void *dst = NULL;
    assert_int_equal(txn_claim_direct(t, "plain.w", false, 0, d, NULL, &dst), REFIT_OK);
    assert_ptr_equal(dst, rt->buf);
    memcpy(dst, src->buf, 128); /* the broadcast */
    /* delivered: a second claim or load is a duplicate */
    assert_int_equal(txn_claim_direct(t, "plain.w", false, 0, d, NULL, &dst),
                     REFIT_EDUPLICATE);
    assert_int_equal(tw_load(w, t, "plain.w", 2), REFIT_EDUPLICATE);
    /* complete: finalize commits */
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_memory_equal(rt->buf, src->buf, 128);
    assert_string_equal(refit_worker_version(w->ctx), "v2");
}

/* Each refusal of a load, unchanged, and nothing left behind: the real
 * delivery afterwards is accepted and the update commits. */
static void test_refusals_are_the_loads_and_change_nothing(void **state)
{
    tw *w = *state;
    plain_model(w, F32);
    w->keep_going = 1; /* refusals, then the update goes on */
    refit_txn *t = tw_begin(w, "v2", 1);
    void *dst = (void *)1;
    desc bad_dtype_d;
    refit_tensor *bad_dtype = describe(&bad_dtype_d, REFIT_BF16, 2, TT_SHAPE(8, 4));
    assert_int_equal(txn_claim_direct(t, "plain.w", false, 0, bad_dtype, NULL, &dst),
                     REFIT_EMISMATCH);
    assert_null(dst);
    tw_assert_msg(w, "plain.w", "dtype");
    desc bad_shape_d;
    refit_tensor *bad_shape = describe(&bad_shape_d, F32, 2, TT_SHAPE(8, 5));
    assert_int_equal(txn_claim_direct(t, "plain.w", false, 0, bad_shape, NULL, &dst),
                     REFIT_EMISMATCH);
    desc ok_d;
    refit_tensor *ok = describe(&ok_d, F32, 2, TT_SHAPE(8, 4));
    assert_int_equal(txn_claim_direct(t, "other.w", false, 0, ok, NULL, &dst),
                     REFIT_EUNEXPECTED);
    desc rows_d;
    refit_tensor *rows = describe(&rows_d, F32, 2, TT_SHAPE(4, 4));
    assert_int_equal(txn_claim_direct(t, "plain.w", true, 6, rows, NULL, &dst),
                     REFIT_EMISMATCH); /* rows [6, 10) of 8 */
    assert_null(dst);
    assert_int_equal(tw_load(w, t, "plain.w", 2), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
}

/* A STAGED module (the test-scale format: post-load builds the runtime):
 * not direct, nothing done; the loads then go as usual. */
static void test_staged_route_is_not_direct(void **state)
{
    tw *w = *state;
    tw_register_test_formats(w);
    tw_module(w, "scale", "test-scale", NULL);
    tw_runtime(w, "scale", "w", F32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(F32, 1, TT_SHAPE(4));
    s.target = "w";
    assert_int_equal(tw_expect(w, "scale", "scale.w", &s), REFIT_OK);
    tw_seal(w);
    refit_txn *t = tw_begin(w, "v2", 1);
    desc d_d;
    refit_tensor *d = describe(&d_d, F32, 1, TT_SHAPE(4));
    void *dst = (void *)1;
    assert_int_equal(txn_claim_direct(t, "scale.w", false, 0, d, NULL, &dst), REFIT_OK);
    assert_null(dst);
    assert_int_equal(tw_load(w, t, "scale.w", 2), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    /* post-load ran on the loaded bytes: runtime = 2 * checkpoint */
    const float *got = tw_rt(w, "scale", "w")->buf;
    const float *in = tw_ckpt_tensor(w, "scale.w", 2)->buf;
    for (int i = 0; i < 4; i++)
        assert_true(got[i] == 2 * in[i]);
}

/* A DIRECT route that casts (bf16 checkpoint, f32 runtime): the bytes as
 * they come are not the runtime's, so not direct. */
static void test_cast_route_is_not_direct(void **state)
{
    tw *w = *state;
    plain_model(w, REFIT_BF16);
    refit_txn *t = tw_begin(w, "v2", 1);
    desc d_d;
    refit_tensor *d = describe(&d_d, REFIT_BF16, 2, TT_SHAPE(8, 4));
    void *dst = (void *)1;
    assert_int_equal(txn_claim_direct(t, "plain.w", false, 0, d, NULL, &dst), REFIT_OK);
    assert_null(dst);
    assert_int_equal(tw_load(w, t, "plain.w", 2), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
}

/* TP rank 0 of 2: a whole tensor is half another rank's rows, a dim-1
 * shard is strided: not direct. A part inside rank 0's rows is; a part of
 * only rank 1's rows is not (nothing of it lands here). */
static void test_shards(void **state)
{
    tw *w = *state;
    tw_module(w, "m", "unquantized", NULL);
    tw_runtime(w, "m", "rows", F32, 2, TT_SHAPE(4, 4));
    tw_runtime(w, "m", "cols", F32, 2, TT_SHAPE(8, 2));
    refit_ckpt_spec s = tt_spec(F32, 2, TT_SHAPE(8, 4));
    s.target = "rows";
    s.shard_dim = 0;
    s.shard_rank = 0;
    s.shard_count = 2;
    assert_int_equal(tw_expect(w, "m", "m.rows", &s), REFIT_OK);
    s.target = "cols";
    s.shard_dim = 1;
    assert_int_equal(tw_expect(w, "m", "m.cols", &s), REFIT_OK);
    tw_seal(w);
    refit_txn *t = tw_begin(w, "v2", 1);
    desc whole_d;
    refit_tensor *whole = describe(&whole_d, F32, 2, TT_SHAPE(8, 4));
    void *dst = (void *)1;
    assert_int_equal(txn_claim_direct(t, "m.rows", false, 0, whole, NULL, &dst), REFIT_OK);
    assert_null(dst);
    assert_int_equal(txn_claim_direct(t, "m.cols", false, 0, whole, NULL, &dst), REFIT_OK);
    assert_null(dst);
    desc two_d;
    refit_tensor *two = describe(&two_d, F32, 2, TT_SHAPE(2, 4));
    assert_int_equal(txn_claim_direct(t, "m.rows", true, 6, two, NULL, &dst), REFIT_OK);
    assert_null(dst); /* rank 1's rows */
    assert_int_equal(txn_claim_direct(t, "m.rows", true, 2, two, NULL, &dst), REFIT_OK);
    assert_ptr_equal(dst, (char *)tw_rt(w, "m", "rows")->buf + 2 * 16);
    /* nothing else was counted: the rest loads, the update commits */
    tt_tensor *src = tw_ckpt_tensor(w, "m.rows", 2);
    memcpy(dst, (char *)src->buf + 2 * 16, 2 * 16);
    refit_tensor head = src->t, tail = src->t;
    int64_t sh[2] = {2, 4};
    head.shape = tail.shape = sh;
    assert_int_equal(refit_load_part(t, "m.rows", 0, &head, NULL), REFIT_OK);
    tail.data = (char *)src->buf + 4 * 16;
    int64_t sh4[2] = {4, 4};
    tail.shape = sh4;
    assert_int_equal(refit_load_part(t, "m.rows", 4, &tail, NULL), REFIT_OK);
    assert_int_equal(tw_load(w, t, "m.cols", 2), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_memory_equal(tw_rt(w, "m", "rows")->buf, src->buf, 4 * 16);
}

/* Parts claim their rows (an overlap refused as a load's); the undo log,
 * saved at the first claim, restores what the caller wrote in place. */
static void test_parts_and_rollback(void **state)
{
    tw *w = *state;
    plain_model(w, F32);
    tw_update(w, 1, "v1");
    size_t n;
    void *before = tw_snapshot(w, &n);
    w->keep_going = 1; /* refusals, then the update goes on */
    refit_txn *t = tw_begin(w, "v2", 1);
    desc four_d;
    refit_tensor *four = describe(&four_d, F32, 2, TT_SHAPE(4, 4));
    void *a = NULL, *b = NULL, *c = (void *)1;
    char *rt = tw_rt(w, "plain", "w")->buf;
    assert_int_equal(txn_claim_direct(t, "plain.w", true, 4, four, NULL, &b), REFIT_OK);
    assert_ptr_equal(b, rt + 64);
    assert_int_equal(txn_claim_direct(t, "plain.w", true, 2, four, NULL, &c), REFIT_EOVERLAP);
    assert_null(c);
    assert_int_equal(txn_claim_direct(t, "plain.w", true, 0, four, NULL, &a), REFIT_OK);
    assert_ptr_equal(a, rt);
    memset(a, 0x5a, 64);
    memset(b, 0xa5, 64);
    assert_int_equal(refit_abort(t), REFIT_OK);
    void *after = tw_snapshot(w, &n);
    assert_memory_equal(before, after, n);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    free(before);
    free(after);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, tw_setup, tw_teardown)
    const struct CMUnitTest tests[] = {
        T(test_direct_route_gives_the_runtime_bytes),
        T(test_refusals_are_the_loads_and_change_nothing),
        T(test_staged_route_is_not_direct),
        T(test_cast_route_is_not_direct),
        T(test_shards),
        T(test_parts_and_rollback),
    };
    return cmocka_run_group_tests_name("nccl-claim", tests, NULL, NULL);
}
