/* Delta updates into a real quantized format: fp8 (linked from
 * plugins/fp8/, its CPU reference on host memory). A serialized block-128
 * module (e4m3 weights and their scale_inv grid, DIRECT routes, no
 * post-load) takes patches in checkpoint coordinates, which are the
 * runtime's: the changed 128 x 128 blocks as row runs and their scales as
 * single elements, in a stack of experts. That equals a full reload of
 * the patched checkpoint bit for bit. An online module (bf16 quantized at
 * post-load) refuses a patch, naming module and format, and nothing is
 * written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

extern const refit_format_v2 refit_format_plugin_v2; /* plugins/fp8/fp8.c */

#define E 2
#define N 256
#define K 256
#define E4M3 ((refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1})

static void open_world(tw *w)
{
    assert_int_equal(tw_open(w, NULL), REFIT_OK);
    assert_int_equal(refit_format_register(w->ctx, &refit_format_plugin_v2), REFIT_OK);
}

/* A stacked block-128 module: weight [E, N, K] e4m3, weight_scale [E, 2,
 * 2]; online: the checkpoint weights are bf16 (no scales). */
static void build(tw *w, int online)
{
    open_world(w);
    tw_module(w, "moe", "fp8", online ? "scheme: block128\nonline: true"
                                      : "scheme: block128");
    tw_runtime(w, "moe", "weight", E4M3, 3, TT_SHAPE(E, N, K));
    tw_runtime(w, "moe", "weight_scale", REFIT_F32, 3, TT_SHAPE(E, N / 128, K / 128));
    for (int e = 0; e < E; e++) {
        char name[96];
        snprintf(name, sizeof name, "experts.%d.weight", e);
        refit_ckpt_spec s = tt_spec(online ? REFIT_BF16 : E4M3, 2, TT_SHAPE(N, K));
        s.target = "weight";
        s.expert = e;
        assert_int_equal(tw_expect(w, "moe", name, &s), REFIT_OK);
        if (online)
            continue;
        snprintf(name, sizeof name, "experts.%d.weight_scale_inv", e);
        s = tt_spec(REFIT_F32, 2, TT_SHAPE(N / 128, K / 128));
        s.target = "weight_scale";
        s.expert = e;
        assert_int_equal(tw_expect(w, "moe", name, &s), REFIT_OK);
    }
    tw_seal(w);
}

/* Block (br, bc) of expert 1 and its scale change to version 2's; every
 * other byte keeps version 1's. */
static void test_serialized_block_patch_equals_full_reload(void **state)
{
    (void)state;
    tw w;
    build(&w, 0);
    tw_update(&w, 1, "v1");
    const int br = 1, bc = 0;
    tt_tensor *w1 = tw_ckpt_tensor(&w, "experts.1.weight", 1);
    tt_tensor *w2 = tw_ckpt_tensor(&w, "experts.1.weight", 2);
    tt_tensor *s1 = tw_ckpt_tensor(&w, "experts.1.weight_scale_inv", 1);
    tt_tensor *s2 = tw_ckpt_tensor(&w, "experts.1.weight_scale_inv", 2);
    /* the patch: the block's 128 rows as runs of 128 codes, and one scale */
    int64_t starts[128], counts[128];
    tt_tensor *vals = tw_tmp(&w, E4M3, 1, TT_SHAPE(128 * 128));
    tt_tensor *pw = tw_tmp(&w, E4M3, 2, TT_SHAPE(N, K)); /* the patched checkpoint */
    memcpy(pw->buf, w1->buf, w1->bytes);
    for (int r = 0; r < 128; r++) {
        int64_t at = (int64_t)(br * 128 + r) * K + bc * 128;
        starts[r] = at;
        counts[r] = 128;
        memcpy((char *)vals->buf + r * 128, (char *)w2->buf + at, 128);
        memcpy((char *)pw->buf + at, (char *)w2->buf + at, 128);
    }
    int64_t si = br * (K / 128) + bc;
    tt_tensor *sval = tw_tmp(&w, REFIT_F32, 1, TT_SHAPE(1));
    tt_set_flat(sval, 0, tt_get_flat(s2, si));
    tt_tensor *ps = tw_tmp(&w, REFIT_F32, 2, TT_SHAPE(N / 128, K / 128));
    memcpy(ps->buf, s1->buf, s1->bytes);
    tt_set_flat(ps, si, tt_get_flat(s2, si));

    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.base_version = "v1";
    o.others_unchanged = 1;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w.m, &o), REFIT_OK);
    refit_delta rows[2] = {
        {"experts.1.weight", 128, starts, counts, &vals->t},
        {"experts.1.weight_scale_inv", 1, &si, NULL, &sval->t},
    };
    int rc = refit_load_deltas(t, 2, rows, NULL);
    if (rc)
        fail_msg("load_deltas: %s: %s", refit_status_name(rc), refit_errmsg(w.ctx));
    refit_txn_stats st;
    assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
    assert_int_equal(st.undo_host_bytes, 128 * 128 + 4); /* the block and its scale */
    assert_int_equal(refit_finalize(t), REFIT_OK);
    size_t n;
    void *delta = tw_snapshot(&w, &n);
    /* a full reload of the patched checkpoint */
    t = tw_begin(&w, "v2-full", 1);
    assert_int_equal(refit_load(t, "experts.1.weight", &pw->t, NULL), REFIT_OK);
    assert_int_equal(refit_load(t, "experts.1.weight_scale_inv", &ps->t, NULL), REFIT_OK);
    assert_int_equal(tw_load(&w, t, "experts.0.weight", 1), REFIT_OK);
    assert_int_equal(tw_load(&w, t, "experts.0.weight_scale_inv", 1), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    int same = tw_snapshot_equal(&w, delta, n);
    free(delta);
    tw_close(&w);
    assert_true(same);
}

/* Online fp8: the runtime is quantized from whole bf16 tensors. */
static void test_online_refused(void **state)
{
    (void)state;
    tw w;
    build(&w, 1);
    tw_update(&w, 1, "v1");
    uint64_t fp = tw_fp(&w);
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.base_version = "v1";
    o.others_unchanged = 1;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w.m, &o), REFIT_OK);
    int64_t idx = 5;
    tt_tensor *v = tw_tmp(&w, REFIT_BF16, 1, TT_SHAPE(1));
    tt_set_flat(v, 0, 1.5);
    int rc = refit_load_delta(t, "experts.0.weight", 1, &idx, &v->t, NULL);
    assert_int_equal(rc, REFIT_EUNSUPPORTED);
    tw_assert_msg(&w, "experts.0.weight (module moe)", "format fp8", "post-load step",
                  "nothing written");
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_int_equal(tw_fp(&w), fp);
    assert_string_equal(refit_worker_version(w.ctx), "v1");
    tw_close(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_serialized_block_patch_equals_full_reload),
        cmocka_unit_test(test_online_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
