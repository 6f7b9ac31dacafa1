/* Reload equals cold start (rule 7): a worker that held A and was updated
 * to B holds, bit for bit, what a worker cold-started on B holds. The
 * model has every route kind: casts (bf16->f32, f32->f16), TP shards on
 * both dims (even and uneven), fused qkv and gate_up, stacked experts,
 * a padded vocabulary, a tie, and the STAGED test format. The two workers
 * start from different junk so that no byte can match by accident. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static void build(tw *w, int tp, int rank, unsigned char junk)
{
    assert_int_equal(tw_open(w, NULL), REFIT_OK);
    tw_register_test_formats(w);
    tt_llm_cfg cfg = {.rank = rank, .tp = tp, .layers = 2, .staged = 1};
    tt_build_llm(w, &cfg);
    for (int i = 0; i < w->n_rt; i++)
        memset(w->rt[i]->buf, junk, w->rt[i]->bytes);
}

/* Compare every runtime tensor of two worlds; fail naming the first that
 * differs. Both are closed either way. */
static void assert_same_and_close(tw *x, tw *y, const char *what)
{
    char msg[512] = "";
    uint64_t fx = tw_fp(x), fy = tw_fp(y);
    if (fx != fy)
        snprintf(msg, sizeof msg, "%s: model fingerprints differ", what);
    for (int i = 0; i < x->n_rt && !msg[0]; i++)
        if (x->rt[i]->bytes != y->rt[i]->bytes ||
            memcmp(x->rt[i]->buf, y->rt[i]->buf, x->rt[i]->bytes))
            snprintf(msg, sizeof msg, "%s: runtime %s/%s differs", what, x->rt_module[i],
                     x->rt_name[i]);
    tw_close(x);
    tw_close(y);
    if (msg[0])
        fail_msg("%s", msg);
}

static void reload_vs_cold(int tp, int rank)
{
    tw x, y;
    build(&x, tp, rank, 0xC3);
    build(&y, tp, rank, 0x3C);
    tw_update(&x, 1, "A");
    tw_update(&x, 2, "B");
    tw_update(&y, 2, "B");
    char what[64];
    snprintf(what, sizeof what, "tp %d rank %d", tp, rank);
    assert_same_and_close(&x, &y, what);
}

static void test_reload_equals_cold_start_unsharded(void **state)
{
    (void)state;
    reload_vs_cold(1, 0);
}

static void test_reload_equals_cold_start_tp2(void **state)
{
    (void)state;
    for (int r = 0; r < 2; r++)
        reload_vs_cold(2, r);
}

static void test_reload_equals_cold_start_tp3_uneven(void **state)
{
    (void)state;
    for (int r = 0; r < 3; r++)
        reload_vs_cold(3, r);
}

static void test_reload_in_other_order_and_parts_equals_cold_start(void **state)
{
    (void)state;
    tw x, y;
    build(&x, 1, 0, 0xC3);
    build(&y, 1, 0, 0x3C);
    tw_update(&x, 1, "A");
    refit_txn *t = tw_begin(&x, "B", 0);
    tw_load_opts o = {.order_seed = 99, .parts = 4, .part_seed = 3};
    tw_load_all(&x, t, 2, &o);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    t = tw_begin(&y, "B", 1);
    o = (tw_load_opts){.tie_mode = 1}; /* the tied name under its other name */
    tw_load_all(&y, t, 2, &o);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_same_and_close(&x, &y, "order/parts");
}

static void test_round_trip_a_b_a(void **state)
{
    (void)state;
    tw x, y;
    build(&x, 2, 1, 0xC3);
    build(&y, 2, 1, 0x3C);
    tw_update(&x, 1, "A");
    tw_update(&x, 2, "B");
    tw_update(&x, 1, "A");
    tw_update(&y, 1, "A");
    assert_same_and_close(&x, &y, "A -> B -> A");
}

static void test_reload_after_poison_equals_cold_start(void **state)
{
    (void)state;
    tw x, y;
    build(&x, 2, 1, 0xC3);
    build(&y, 2, 1, 0x3C);
    tw_update(&x, 1, "A");
    /* half of an update to C without rollback, then a full update to B */
    refit_txn *t = tw_begin(&x, "C", 0);
    tw_load_opts o = {.only_module = "embed"};
    tw_load_all(&x, t, 3, &o);
    o.only_module = "layers.0.scale";
    tw_load_all(&x, t, 3, &o);
    assert_int_equal(refit_abort(t), REFIT_EPOISONED);
    tw_update(&x, 2, "B");
    tw_update(&y, 2, "B");
    assert_same_and_close(&x, &y, "after POISONED");
}

static void test_reload_after_rollback_equals_cold_start(void **state)
{
    (void)state;
    tw x, y;
    build(&x, 3, 2, 0xC3);
    build(&y, 3, 2, 0x3C);
    tw_update(&x, 1, "A");
    refit_txn *t = tw_begin(&x, "C", 1);
    tw_load_all(&x, t, 3, NULL);
    assert_int_equal(refit_abort(t), REFIT_OK);
    /* still exactly A */
    tw z;
    build(&z, 3, 2, 0x11);
    tw_update(&z, 1, "A");
    uint64_t fx = tw_fp(&x), fz = tw_fp(&z);
    tw_close(&z);
    if (fx != fz) {
        tw_close(&x);
        tw_close(&y);
        fail_msg("rolled-back worker differs from a cold start on A");
    }
    tw_update(&x, 2, "B");
    tw_update(&y, 2, "B");
    assert_same_and_close(&x, &y, "after rollback");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reload_equals_cold_start_unsharded),
        cmocka_unit_test(test_reload_equals_cold_start_tp2),
        cmocka_unit_test(test_reload_equals_cold_start_tp3_uneven),
        cmocka_unit_test(test_reload_in_other_order_and_parts_equals_cold_start),
        cmocka_unit_test(test_round_trip_a_b_a),
        cmocka_unit_test(test_reload_after_poison_equals_cold_start),
        cmocka_unit_test(test_reload_after_rollback_equals_cold_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
