/* Format mxfp8: serialized E4M3 + E8M0-per-32 checkpoints (DIRECT) and
 * online BF16 -> MXFP8 (STAGED + post-load), against quant_ref.py; reload
 * equals cold start; reloading the same weights leaves the same bytes; TP
 * shards along N and K (a K shard must cut at a multiple of 32); fused
 * weights; the refusals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cast.h"
#include "plugins/mxfp8/quant_mx.h"
#include "tests/formats/common/qutil.h"
#include "tests/formats/mxfp8/mx_batch.h"
#include "tests/common/pyref.h"

extern const refit_format_v2 refit_format_plugin_v2;

#define MOD "layers.0.mlp.down_proj"

#define PLUGIN (&refit_format_plugin_v2)

/* Serialized: W.weight (E4M3) and W.weight_scale_inv (E8M0 or u8). The
 * runtime is [rn, rk] (0: the checkpoint's). Returns the seal status. */
static int build_serialized(tw *w, const st_set *s, int64_t n, int64_t k, int e8m0,
                            const char *params, q_ent *e, const q_tp *tp, int shard_dim,
                            int64_t rn, int64_t rk)
{
    rn = rn ? rn : n;
    rk = rk ? rk : k;
    e[0] = (q_ent){"W.weight", "t.mxfp8.q", "weight", 1, 0, shard_dim, 0, 0, 0, -1};
    e[1] = (q_ent){"W.weight_scale_inv", "t.mxfp8.s", "weight_scale", e8m0 ? 2 : 0, 0,
                   shard_dim, 0, 0, 0, -1};
    tw_module(w, MOD, "mxfp8", params);
    tw_runtime(w, MOD, "weight", Q_E4M3, 2, TT_SHAPE(rn, rk));
    tw_runtime(w, MOD, "weight_scale", e8m0 ? Q_E8M0 : REFIT_U8, 2,
               TT_SHAPE(rn, kern_mx_blocks(rk)));
    return q_expect_seal(w, MOD, s, e, 2, tp);
}

/* An unsharded serialized [n, k] module with E8M0 scales, as a q_module's
 * build (its arg: {n, k}). */
static int build_serialized_module(tw *w, const st_set *s, const q_module *m)
{
    const int64_t *nk = m->arg;
    return build_serialized(w, s, nk[0], nk[1], 1, NULL, m->e, NULL, -1, 0, 0);
}

static void serialized_loads(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 100 --k 200 --specials --seed 31");
    for (int e8m0 = 0; e8m0 < 2; e8m0++) {
        tw w;
        q_ent e[2];
        q_world(&w, PLUGIN);
        assert_int_equal(build_serialized(&w, s, 100, 200, e8m0, "in_features: 200", e, NULL,
                                          -1, 0, 0),
                         REFIT_OK);
        refit_model_stats st;
        assert_int_equal(refit_model_stats_get(w.m, &st), REFIT_OK);
        assert_int_equal(st.routes_direct, 2);
        q_update(&w, s, e, 2, "v1");
        q_assert_rt(&w, MOD, "weight", q_get(s, "t.mxfp8.q")->data, 100 * 200);
        q_assert_rt(&w, MOD, "weight_scale", q_get(s, "t.mxfp8.s")->data, 100 * 7);
        tw_close(&w);
    }
    st_close(s);
}

/* K = 200 is not a whole number of 32-blocks: whole or a cut shard? */
static void serialized_ragged_needs_extent(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 8 --k 200 --seed 32");
    tw w;
    q_ent e[2];
    q_world(&w, PLUGIN);
    assert_int_equal(build_serialized(&w, s, 8, 200, 0, NULL, e, NULL, -1, 0, 0),
                     REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "W.weight_scale_inv", "in_features");
    tw_close(&w);
    st_close(s);
}

static void serialized_reload_equals_cold(void **state)
{
    (void)state;
    q_ent e[2];
    static const int64_t nk[2] = {64, 256};
    q_module m = q_entries_module(PLUGIN, build_serialized_module, e, 2, nk);
    uint64_t fp[2];
    q_assert_reload_equals_cold(&m, "--n 64 --k 256 --seed 33", "--n 64 --k 256 --seed 34", fp);
    assert_true(fp[0] != fp[1]);
}

/* N shards carry their scale rows; K shards their scale columns, at
 * multiples of 32; a K boundary inside a block is refused. */
static void serialized_tp(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 30 --k 512 --seed 35");
    const uint8_t *q = q_get(s, "t.mxfp8.q")->data, *sc = q_get(s, "t.mxfp8.s")->data;
    for (int dim = 0; dim < 2; dim++)
        for (int rank = 0; rank < 2; rank++) {
            tw w;
            q_ent e[2];
            q_tp tp = {2, rank};
            q_world(&w, PLUGIN);
            assert_int_equal(build_serialized(&w, s, 30, 512, 0, NULL, e, &tp, dim,
                                              dim ? 0 : 15, dim ? 256 : 0),
                             REFIT_OK);
            q_update(&w, s, e, 2, "v1");
            const uint8_t *gq = tw_rt(&w, MOD, "weight")->buf;
            const uint8_t *gs = tw_rt(&w, MOD, "weight_scale")->buf;
            int64_t rows = dim ? 30 : 15, cols = dim ? 256 : 512, r0 = dim ? 0 : 15 * rank;
            int64_t c0 = dim ? 256 * rank : 0;
            for (int64_t i = 0; i < rows; i++) {
                assert_memory_equal(gq + i * cols, q + (r0 + i) * 512 + c0, (size_t)cols);
                assert_memory_equal(gs + i * cols / 32, sc + (r0 + i) * 16 + c0 / 32,
                                    (size_t)(cols / 32));
            }
            tw_close(&w);
        }
    st_close(s);
    s = q_ref("quant_ref.py", "--n 4 --k 96 --seed 36");
    for (int rank = 0; rank < 2; rank++) {
        tw w;
        q_ent e[2];
        q_tp tp = {2, rank};
        q_world(&w, PLUGIN);
        assert_int_equal(build_serialized(&w, s, 4, 96, 0, "in_features: 96", e, &tp, 1, 0, 48),
                         REFIT_EMISMATCH);
        tw_assert_msg(&w, MOD, "a shard boundary cuts a 32-block");
        tw_close(&w);
    }
    st_close(s);
}

/* ---- online ---- */

static void online_runtime(tw *w, int64_t n, int64_t k)
{
    tw_runtime(w, MOD, "weight", Q_E4M3, 2, TT_SHAPE(n, k));
    tw_runtime(w, MOD, "weight_scale", Q_E8M0, 2, TT_SHAPE(n, kern_mx_blocks(k)));
}

/* A sealed online [n, k] module expecting entries e[0, count) of s. */
static void seal_online(tw *w, const char *params, int64_t n, int64_t k, const st_set *s,
                        const q_ent *e, int count, const q_tp *tp)
{
    tw_module(w, MOD, "mxfp8", params);
    online_runtime(w, n, k);
    assert_int_equal(q_expect(w, MOD, s, e, count, tp), REFIT_OK);
    tw_seal(w);
}

/* seal_online as a q_module's build (its arg: {n, k}). */
static int build_online_module(tw *w, const st_set *s, const q_module *m)
{
    const int64_t *nk = m->arg;
    seal_online(w, NULL, nk[0], nk[1], s, m->e, m->n, NULL);
    return REFIT_OK;
}

/* BF16, F16 and F32 weights with ragged K, zero blocks and subnormals. */
static void online_matches_numpy(void **state)
{
    (void)state;
    static const char *const args[] = {"--n 70 --k 200 --specials --seed 37",
                                       "--n 9 --k 33 --dtype f16 --specials --seed 38",
                                       "--n 40 --k 64 --dtype f32 --specials --seed 39"};
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        st_set *s = q_ref("quant_ref.py", args[i]);
        const st_tensor *x = q_get(s, "t.x");
        int64_t n = x->shape[0], k = x->shape[1];
        q_ent e = {"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1};
        tw w;
        q_world(&w, PLUGIN);
        seal_online(&w, "online: true", n, k, s, &e, 1, NULL);
        q_update(&w, s, &e, 1, "v1");
        q_assert_rt(&w, MOD, "weight", q_get(s, "t.mxfp8.q")->data, (size_t)(n * k));
        q_assert_rt(&w, MOD, "weight_scale", q_get(s, "t.mxfp8.s")->data,
                    (size_t)(n * kern_mx_blocks(k)));
        tw_close(&w);
        st_close(s);
    }
}

/* gate (40 rows) and up (24 rows) fused; and a TP rank's slice of N. */
static void online_fused_and_tp(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 64 --k 96 --specials --seed 40");
    const uint8_t *q = q_get(s, "t.mxfp8.q")->data, *sc = q_get(s, "t.mxfp8.s")->data;
    q_ent e[2] = {{"gate_proj.weight", "t.x", "weight", 0, 0, -1, 0, 40, 0, -1},
                  {"up_proj.weight", "t.x", "weight", 0, 0, -1, 40, 24, 40, -1}};
    tw w;
    q_world(&w, PLUGIN);
    seal_online(&w, NULL, 64, 96, s, e, 2, NULL);
    q_update(&w, s, e, 2, "v1");
    q_assert_rt(&w, MOD, "weight", q, 64 * 96);
    q_assert_rt(&w, MOD, "weight_scale", sc, 64 * 3);
    tw_close(&w);
    for (int rank = 0; rank < 2; rank++) {
        q_ent t = {"W.weight", "t.x", "weight", 0, 0, 0, 0, 0, 0, -1};
        q_tp tp = {2, rank};
        q_world(&w, PLUGIN);
        seal_online(&w, NULL, 32, 96, s, &t, 1, &tp);
        q_update(&w, s, &t, 1, "v1");
        q_assert_rt(&w, MOD, "weight", q + rank * 32 * 96, 32 * 96);
        q_assert_rt(&w, MOD, "weight_scale", sc + rank * 32 * 3, 32 * 3);
        tw_close(&w);
    }
    st_close(s);
}

static void online_reload_equals_cold(void **state)
{
    (void)state;
    q_ent e = {"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1};
    static const int64_t nk[2] = {48, 100};
    q_module m = q_entries_module(PLUGIN, build_online_module, &e, 1, nk);
    uint64_t fp[2];
    q_assert_reload_equals_cold(&m, "--n 48 --k 100 --seed 41 --specials",
                                "--n 48 --k 100 --seed 42", fp);
    assert_true(fp[0] != fp[1]);
}

/* An infinity fails the update by name; the worker keeps its bytes. */
static void online_inf_refused(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 4 --k 64 --seed 43");
    q_ent e = {"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1};
    tw w;
    q_world(&w, PLUGIN);
    seal_online(&w, NULL, 4, 64, s, &e, 1, NULL);
    q_update(&w, s, &e, 1, "v1");
    uint16_t bad[4 * 64];
    memcpy(bad, q_get(s, "t.x")->data, sizeof bad);
    bad[200] = 0xff80; /* bf16 -inf */
    refit_tensor d = q_desc(q_get(s, "t.x"));
    d.data = bad;
    q_assert_nonfinite_refused(&w, MOD, "W.weight", &d);
    tw_close(&w);
    st_close(s);
}

/* Five online modules (one fused) in one refit_load_many: one
 * post_load_many, sources read in place where aligned, the bytes of the
 * reference, the per-call path and a cold start; a NaN in module k of the
 * batch named at finalize and rolled back (mx_batch.h). */
static void online_load_many_batch(void **state)
{
    (void)state;
    mxb_case c = {PLUGIN, 8, 40, 136};
    mxb_run(&c);
}

/* Refusals at seal, each naming the module. */
/* An [8, 64] module expecting e[0, n) of s is refused at seal (EFORMAT)
 * with a message naming the module and holding msg. */
static void assert_refused_8x64(const st_set *s, const q_ent *e, int n, const char *msg)
{
    tw w;
    q_world(&w, PLUGIN);
    tw_module(&w, MOD, "mxfp8", NULL);
    online_runtime(&w, 8, 64);
    assert_int_equal(q_expect(&w, MOD, s, e, n, NULL), REFIT_OK);
    assert_int_equal(refit_model_seal(w.m), REFIT_EFORMAT);
    tw_assert_msg(&w, MOD, msg);
    tw_close(&w);
}

static void seal_refusals(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 8 --k 64 --seed 44");
    tw w;
    /* online with a checkpoint scale */
    q_ent e[2] = {{"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1},
                  {"W.weight_scale_inv", "t.mxfp8.s", "weight_scale", 0, 0, -1, 0, 0, 0, -1}};
    assert_refused_8x64(s, e, 2, "computes its scales");
    /* a serialized weight without its scale */
    q_ent lone = {"W.weight", "t.mxfp8.q", "weight", 1, 0, -1, 0, 0, 0, -1};
    assert_refused_8x64(s, &lone, 1, "W.weight_scale_inv");
    /* an online runtime scale of the wrong size */
    q_world(&w, PLUGIN);
    tw_module(&w, MOD, "mxfp8", NULL);
    tw_runtime(&w, MOD, "weight", Q_E4M3, 2, TT_SHAPE(8, 64));
    tw_runtime(&w, MOD, "weight_scale", REFIT_U8, 2, TT_SHAPE(8, 3));
    assert_int_equal(q_expect(&w, MOD, s, e, 1, NULL), REFIT_OK);
    assert_int_equal(refit_model_seal(w.m), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "16 codes");
    tw_close(&w);
    st_close(s);
}

/* The built plugin and its declaration agree with its plans. */
static void plugin_declaration_agrees(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 16 --k 64 --seed 45");
    for (int online = 0; online < 2; online++) {
        tw w;
        q_ent e[2];
        q_world(&w, NULL);
        if (online) {
            e[0] = (q_ent){"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1};
            seal_online(&w, NULL, 16, 64, s, e, 1, NULL);
        } else {
            assert_int_equal(build_serialized(&w, s, 16, 64, 1, NULL, e, NULL, -1, 0, 0),
                             REFIT_OK);
        }
        q_update(&w, s, e, online ? 1 : 2, "v1");
        q_assert_rt(&w, MOD, "weight", q_get(s, "t.mxfp8.q")->data, 16 * 64);
        q_assert_rt(&w, MOD, "weight_scale", q_get(s, "t.mxfp8.s")->data, 16 * 2);
        tw_close(&w);
    }
    st_close(s);
}

int main(void)
{
    pyref_skip_without_venv();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(serialized_loads),
        cmocka_unit_test(serialized_ragged_needs_extent),
        cmocka_unit_test(serialized_reload_equals_cold),
        cmocka_unit_test(serialized_tp),
        cmocka_unit_test(online_matches_numpy),
        cmocka_unit_test(online_fused_and_tp),
        cmocka_unit_test(online_reload_equals_cold),
        cmocka_unit_test(online_inf_refused),
        cmocka_unit_test(online_load_many_batch),
        cmocka_unit_test(seal_refusals),
        cmocka_unit_test(plugin_declaration_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
