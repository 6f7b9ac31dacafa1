/* Abort (rule 6): with rollback every written byte comes back and the
 * worker is READY at the old version; without, any write poisons the
 * worker until the dirty modules are reloaded. Also: a failing finalize
 * aborts as abort would, and the next update works. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"


/* The transformer-shaped model on TP rank 1 (it holds the vocab pad), with
 * STAGED modules; loaded at v1, and then the engine scribbles over the pad
 * rows so that a rollback has to put non-zero pad bytes back. */
static void llm_at_v1(tw *w)
{
    tw_register_test_formats(w);
    tt_llm_cfg cfg = {.rank = 1, .tp = 2, .layers = 2, .staged = 1};
    tt_build_llm(w, &cfg);
    tw_update(w, 1, "v1");
    tt_tensor *emb = tw_rt(w, "embed", "weight");
    for (int i = 4 * 8; i < 6 * 8; i++) /* local rows 4, 5 = vocab rows 10, 11: pad */
        ((float *)emb->buf)[i] = 31.0f + (float)i;
}

static void test_rollback_restores_every_byte(void **state)
{
    tw *w = *state;
    llm_at_v1(w);
    uint64_t fp = tw_fp(w);
    size_t n;
    void *snap = tw_snapshot(w, &n);
    refit_txn *t = tw_begin(w, "v2", 1);
    tw_load_all(w, t, 2, NULL); /* every module written, post-load run, pad zeroed */
    assert_true(tw_fp(w) != fp);
    assert_int_equal(refit_abort(t), REFIT_OK);
    int same = tw_snapshot_equal(w, snap, n);
    free(snap);
    assert_true(same);
    assert_true(tw_fp(w) == fp);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    assert_int_equal(refit_check_serving(w->ctx), REFIT_OK);
    /* the pad keeps the engine's bytes: rollback, not re-zeroing */
    assert_true(((float *)tw_rt(w, "embed", "weight")->buf)[5 * 8] == 31.0f + 40.0f);
}

static void test_rollback_after_partial_update(void **state)
{
    tw *w = *state;
    llm_at_v1(w);
    size_t n;
    void *snap = tw_snapshot(w, &n);
    refit_txn *t = tw_begin(w, "v2", 1);
    tw_load_opts o = {.order_seed = 5, .only_module = "layers.0.scale"};
    tw_load_all(w, t, 2, &o);
    o.only_module = "embed";
    tw_load_all(w, t, 2, &o);
    assert_int_equal(tw_load(w, t, "model.layers.1.mlp.up_proj.weight", 2), REFIT_OK);
    assert_false(tw_snapshot_equal(w, snap, n));
    assert_int_equal(refit_abort(t), REFIT_OK);
    int same = tw_snapshot_equal(w, snap, n);
    free(snap);
    assert_true(same);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
}

/* Two runtime tensors over one allocation: a = elements [0, 8), b =
 * [4, 12). Restoring in the wrong order would leave a's new bytes in the
 * shared middle. */
static tt_tensor *shared_storage(tw *w)
{
    tt_tensor *base = tw_tmp(w, REFIT_F32, 1, TT_SHAPE(12));
    tw_module(w, "a", "unquantized", NULL);
    tw_bind(w, "a", "w", tt_alias(base, REFIT_F32, 1, TT_SHAPE(8), NULL, 0));
    tw_module(w, "b", "unquantized", NULL);
    tw_bind(w, "b", "w", tt_alias(base, REFIT_F32, 1, TT_SHAPE(8), NULL, 4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(8));
    assert_int_equal(tw_expect(w, "a", "a.w", &s), REFIT_OK);
    assert_int_equal(tw_expect(w, "b", "b.w", &s), REFIT_OK);
    tw_seal(w);
    for (int i = 0; i < 12; i++)
        ((float *)base->buf)[i] = (float)i;
    return base;
}

static void test_rollback_with_shared_storage(void **state)
{
    tw *w = *state;
    tt_tensor *base = shared_storage(w);
    float keep[12];
    const char *orders[2][2] = {{"a.w", "b.w"}, {"b.w", "a.w"}};
    for (int k = 0; k < 2; k++) {
        memcpy(keep, base->buf, sizeof keep);
        refit_txn *t = tw_begin(w, "v", 1);
        assert_int_equal(tw_load(w, t, orders[k][0], 2), REFIT_OK);
        assert_int_equal(tw_load(w, t, orders[k][1], 2), REFIT_OK);
        assert_int_equal(refit_abort(t), REFIT_OK);
        if (memcmp(keep, base->buf, sizeof keep))
            fail_msg("order %s, %s: shared bytes not restored", orders[k][0], orders[k][1]);
    }
    /* and a commit leaves what the later write put there */
    tw_update(w, 3, "v3");
    tt_tensor *b = tw_ckpt_tensor(w, "b.w", 3);
    assert_memory_equal((float *)base->buf + 4, b->buf, 32);
}

static void test_rollback_from_empty(void **state)
{
    tw *w = *state;
    tt_tensor *base = shared_storage(w);
    float keep[12];
    memcpy(keep, base->buf, sizeof keep);
    refit_txn *t = tw_begin(w, "v1", 1);
    assert_int_equal(tw_load(w, t, "a.w", 1), REFIT_OK);
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_memory_equal(keep, base->buf, sizeof keep);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_EMPTY);
}

static void test_no_rollback_poisons_after_a_write(void **state)
{
    tw *w = *state;
    llm_at_v1(w);
    refit_txn *t = tw_begin(w, "v2", 0);
    assert_int_equal(tw_load(w, t, "model.norm.weight", 2), REFIT_OK);
    assert_int_equal(refit_abort(t), REFIT_EPOISONED);
    tw_assert_msg(w, "POISONED");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_POISONED);
    assert_int_equal(refit_check_serving(w->ctx), REFIT_EPOISONED);
    tw_assert_msg(w, "POISONED", "1 module");
    assert_null(refit_worker_version(w->ctx));
}

static void test_abort_with_nothing_written(void **state)
{
    tw *w = *state;
    llm_at_v1(w);
    size_t n;
    void *snap = tw_snapshot(w, &n);
    for (int rollback = 0; rollback < 2; rollback++) {
        refit_txn *t = tw_begin(w, "v2", rollback);
        assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_UPDATING);
        assert_null(refit_worker_version(w->ctx));
        assert_int_equal(refit_check_serving(w->ctx), REFIT_ESTATE);
        tw_assert_msg(w, "UPDATING");
        /* a refused load writes nothing either */
        tt_tensor *x = tw_tmp(w, REFIT_F32, 1, TT_SHAPE(3));
        assert_int_equal(refit_load(t, "model.norm.weight", &x->t, NULL), REFIT_EMISMATCH);
        assert_int_equal(refit_abort(t), REFIT_OK);
        assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
        assert_string_equal(refit_worker_version(w->ctx), "v1");
    }
    int same = tw_snapshot_equal(w, snap, n);
    free(snap);
    assert_true(same);
}

static void test_failing_finalize_aborts_like_abort(void **state)
{
    tw *w = *state;
    llm_at_v1(w);
    size_t n;
    void *snap = tw_snapshot(w, &n);
    /* with rollback: incomplete module -> restored, READY at v1 */
    refit_txn *t = tw_begin(w, "v2", 1);
    assert_int_equal(tw_load(w, t, "model.layers.0.mlp.gate_proj.weight", 2), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    tw_assert_msg(w, "layers.0.mlp", "rolled back");
    int same = tw_snapshot_equal(w, snap, n);
    free(snap);
    assert_true(same);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    /* without: POISONED */
    t = tw_begin(w, "v3", 0);
    assert_int_equal(tw_load(w, t, "model.layers.0.mlp.gate_proj.weight", 3), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    tw_assert_msg(w, "layers.0.mlp", "POISONED");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_POISONED);
}

static void test_new_update_after_abort(void **state)
{
    tw *w = *state;
    llm_at_v1(w);
    refit_txn *t = tw_begin(w, "v2", 1);
    tw_load_all(w, t, 2, NULL);
    assert_int_equal(refit_abort(t), REFIT_OK);
    tw_update(w, 2, "v2");
    assert_string_equal(refit_worker_version(w->ctx), "v2");
    /* bytes equal to a world that never aborted */
    tw fresh;
    assert_int_equal(tw_open(&fresh, NULL), REFIT_OK);
    tw_register_test_formats(&fresh);
    tt_llm_cfg cfg = {.rank = 1, .tp = 2, .layers = 2, .staged = 1};
    tt_build_llm(&fresh, &cfg);
    tw_update(&fresh, 2, "v2");
    uint64_t a = tw_fp(w), b = tw_fp(&fresh);
    tw_close(&fresh);
    assert_true(a == b);
}

static void test_recovery_from_poisoned_needs_dirty_modules(void **state)
{
    tw *w = *state;
    llm_at_v1(w);
    /* poison two modules */
    refit_txn *t = tw_begin(w, "v2", 0);
    assert_int_equal(tw_load(w, t, "model.layers.0.self_attn.q_proj.weight", 2), REFIT_OK);
    assert_int_equal(refit_abort(t), REFIT_EPOISONED);
    t = tw_begin(w, "v2", 0);
    tw_load_opts o = {.only_module = "layers.1.scale"};
    tw_load_all(w, t, 2, &o); /* post-load wrote runtime bytes */
    assert_int_equal(refit_abort(t), REFIT_EPOISONED);
    assert_int_equal(refit_check_serving(w->ctx), REFIT_EPOISONED);
    tw_assert_msg(w, "2 module");
    /* an update of another module cannot end it */
    w->partial = 1;
    t = tw_begin(w, "v3", 1);
    o.only_module = "norm";
    tw_load_all(w, t, 3, &o);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    tw_assert_msg(w, "aborted update");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_POISONED);
    /* one of the two is not enough */
    t = tw_begin(w, "v3", 1);
    o.only_module = "layers.0.attn";
    tw_load_all(w, t, 3, &o);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    tw_assert_msg(w, "layers.1.scale");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_POISONED);
    /* both dirty modules: READY, at the new version */
    t = tw_begin(w, "v3", 1);
    o.only_module = "layers.0.attn";
    tw_load_all(w, t, 3, &o);
    o.only_module = "layers.1.scale";
    tw_load_all(w, t, 3, &o);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    /* a partial update: the other ten modules hold v1 */
    assert_string_equal(refit_worker_version(w->ctx), "v3 (partial: 2 of 12 modules)");
    assert_string_equal(refit_module_version(w->m, "norm"), "v1");
    assert_int_equal(refit_check_serving(w->ctx), REFIT_OK);
}

static void test_first_update_poisoned_then_recovered(void **state)
{
    tw *w = *state;
    tw_module(w, "m", "unquantized", NULL);
    tw_runtime(w, "m", "w", REFIT_F32, 1, TT_SHAPE(4));
    tw_module(w, "n", "unquantized", NULL);
    tw_runtime(w, "n", "w", REFIT_F32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(w, "m", "m.w", &s), REFIT_OK);
    assert_int_equal(tw_expect(w, "n", "n.w", &s), REFIT_OK);
    tw_seal(w);
    /* the first update, without rollback, dies after writing m */
    refit_txn *t = tw_begin(w, "v1", 0);
    assert_int_equal(tw_load(w, t, "m.w", 1), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_POISONED);
    /* m alone is not enough, even as a partial update: n was never loaded */
    w->partial = 1;
    t = tw_begin(w, "v1", 1);
    assert_int_equal(tw_load(w, t, "m.w", 1), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    tw_assert_msg(w, "module n", "never loaded");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_POISONED);
    /* n alone is not enough: m holds bytes of the aborted update */
    t = tw_begin(w, "v1", 1);
    assert_int_equal(tw_load(w, t, "n.w", 1), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    tw_assert_msg(w, "module m", "aborted update");
    tw_update(w, 1, "v1");
    assert_int_equal(refit_check_serving(w->ctx), REFIT_OK);
}

static void test_worker_version_through_the_states(void **state)
{
    tw *w = *state;
    tw_module(w, "m", "unquantized", NULL);
    tw_runtime(w, "m", "w", REFIT_F32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(w, "m", "m.w", &s), REFIT_OK);
    assert_null(refit_worker_version(w->ctx)); /* not sealed */
    tw_seal(w);
    assert_null(refit_worker_version(w->ctx)); /* EMPTY */
    tw_update(w, 1, "step-100");
    assert_string_equal(refit_worker_version(w->ctx), "step-100");
    refit_txn *t = tw_begin(w, "step-200", 1);
    assert_null(refit_worker_version(w->ctx)); /* UPDATING */
    assert_int_equal(tw_load(w, t, "m.w", 2), REFIT_OK);
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_string_equal(refit_worker_version(w->ctx), "step-100");
    t = tw_begin(w, NULL, 1);
    assert_int_equal(tw_load(w, t, "m.w", 2), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_non_null(refit_worker_version(w->ctx)); /* an unnamed update still has a label */
    tw_update(w, 3, "step-300");
    assert_string_equal(refit_worker_version(w->ctx), "step-300");
}

#define T(f) cmocka_unit_test_setup_teardown(f, tw_setup, tw_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_rollback_restores_every_byte),
        T(test_rollback_after_partial_update),
        T(test_rollback_with_shared_storage),
        T(test_rollback_from_empty),
        T(test_no_rollback_poisons_after_a_write),
        T(test_abort_with_nothing_written),
        T(test_failing_finalize_aborts_like_abort),
        T(test_new_update_after_abort),
        T(test_recovery_from_poisoned_needs_dirty_modules),
        T(test_first_update_poisoned_then_recovered),
        T(test_worker_version_through_the_states),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
