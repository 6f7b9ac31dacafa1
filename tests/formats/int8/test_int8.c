/* Format int8 (W8A8, compressed-tensors naming): serialized I8 weights and
 * scales through DIRECT routes, against quant_ref.py's quantization;
 * reload equals cold start; reloading the same weights leaves the same
 * bytes; TP shards (per-channel scales shard with the rows, a K shard keeps
 * the whole scale); fused weights; the refusals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/formats/common/qutil.h"
#include "tests/common/pyref.h"

extern const refit_format_v2 refit_format_plugin_v2;

#define MOD "layers.0.self_attn.qkv"

#define PLUGIN (&refit_format_plugin_v2)

/* W.weight, W.weight_scale (per-channel [n, 1] or per-tensor [1]) and
 * W.input_scale; runtime [rn, rk] (0: the checkpoint's). Seal status. */
static int build(tw *w, const st_set *s, int pc, int64_t n, int64_t k, const char *params,
                 q_ent *e, const q_tp *tp, int wdim, int sdim, int64_t rn, int64_t rk)
{
    e[0] = (q_ent){"W.weight", pc ? "t.int8.per_channel.q" : "t.int8.per_tensor.q", "weight",
                   0, 0, wdim, 0, 0, 0, -1};
    e[1] = (q_ent){"W.weight_scale", pc ? "t.int8.per_channel.s" : "t.int8.per_tensor.s",
                   "weight_scale", 0, !pc, sdim, 0, 0, 0, -1};
    e[2] = (q_ent){"W.input_scale", "t.int8.per_tensor.s", "input_scale", 0, 1, -1, 0, 0, 0, -1};
    rn = rn ? rn : n;
    tw_module(w, MOD, "int8", params);
    tw_runtime(w, MOD, "weight", REFIT_I8, 2, TT_SHAPE(rn, rk ? rk : k));
    if (pc)
        tw_runtime(w, MOD, "weight_scale", REFIT_F32, 2, TT_SHAPE(rn, 1));
    else
        tw_runtime(w, MOD, "weight_scale", REFIT_F32, 1, TT_SHAPE(1));
    tw_runtime(w, MOD, "input_scale", REFIT_F32, 1, TT_SHAPE(1));
    return q_expect_seal(w, MOD, s, e, 3, tp);
}

/* An unsharded per-channel module of [n, k], as a q_module's build (its
 * arg is the q_ent[3] that build fills). */
static int build_per_channel(tw *w, const st_set *s, const q_module *m)
{
    const int64_t *nk = m->arg;
    return build(w, s, 1, nk[0], nk[1], NULL, m->e, NULL, -1, -1, 0, 0);
}

static void loads_both_schemes(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 300 --k 330 --specials --seed 51");
    for (int pc = 0; pc < 2; pc++) {
        tw w;
        q_ent e[3];
        q_world(&w, PLUGIN);
        assert_int_equal(build(&w, s, pc, 300, 330, pc ? "scheme: per_channel" : NULL, e, NULL,
                               -1, -1, 0, 0),
                         REFIT_OK);
        q_update(&w, s, e, 3, "v1");
        q_assert_rt(&w, MOD, "weight", q_get(s, pc ? "t.int8.per_channel.q"
                                                   : "t.int8.per_tensor.q")->data, 300 * 330);
        q_assert_rt(&w, MOD, "weight_scale", q_get(s, pc ? "t.int8.per_channel.s"
                                                         : "t.int8.per_tensor.s")->data,
                    pc ? 300 * 4 : 4);
        q_assert_rt(&w, MOD, "input_scale", q_get(s, "t.int8.per_tensor.s")->data, 4);
        tw_close(&w);
    }
    st_close(s);
}

static void reload_equals_cold(void **state)
{
    (void)state;
    q_ent e[3];
    static const int64_t nk[2] = {40, 72};
    q_module m = q_entries_module(PLUGIN, build_per_channel, e, 3, nk);
    uint64_t fp[2];
    q_assert_reload_equals_cold(&m, "--n 40 --k 72 --seed 52", "--n 40 --k 72 --seed 53", fp);
    assert_true(fp[0] != fp[1]);
}

/* Column-parallel: weight rows and their scale rows shard together (an
 * uneven split); row-parallel: K shards, every rank keeps the scale. */
static void tp_shards(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 31 --k 64 --seed 54");
    const int8_t *q = q_get(s, "t.int8.per_channel.q")->data;
    const float *sc = q_get(s, "t.int8.per_channel.s")->data;
    for (int rank = 0; rank < 2; rank++) {
        int64_t lo, hi;
        q_shard(31, 2, rank, &lo, &hi);
        tw w;
        q_ent e[3];
        q_tp tp = {2, rank};
        q_world(&w, PLUGIN);
        assert_int_equal(build(&w, s, 1, 31, 64, NULL, e, &tp, 0, 0, hi - lo, 0), REFIT_OK);
        q_update(&w, s, e, 3, "v1");
        q_assert_rt(&w, MOD, "weight", q + lo * 64, (size_t)((hi - lo) * 64));
        q_assert_rt(&w, MOD, "weight_scale", sc + lo, sizeof(float) * (size_t)(hi - lo));
        tw_close(&w);
        q_world(&w, PLUGIN);
        assert_int_equal(build(&w, s, 1, 31, 64, NULL, e, &tp, 1, -1, 0, 32), REFIT_OK);
        q_update(&w, s, e, 3, "v1");
        const int8_t *got = tw_rt(&w, MOD, "weight")->buf;
        for (int i = 0; i < 31; i++)
            assert_memory_equal(got + i * 32, q + i * 64 + rank * 32, 32);
        q_assert_rt(&w, MOD, "weight_scale", sc, sizeof(float) * 31);
        tw_close(&w);
    }
    st_close(s);
}

/* q (16 rows) and k (8) fused: rows and per-channel scales at offsets. */
static void fused_per_channel(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 24 --k 32 --seed 55");
    q_ent e[4] = {
        {"q_proj.weight", "t.int8.per_channel.q", "weight", 0, 0, -1, 0, 16, 0, -1},
        {"q_proj.weight_scale", "t.int8.per_channel.s", "weight_scale", 0, 0, -1, 0, 16, 0, -1},
        {"k_proj.weight", "t.int8.per_channel.q", "weight", 0, 0, -1, 16, 8, 16, -1},
        {"k_proj.weight_scale", "t.int8.per_channel.s", "weight_scale", 0, 0, -1, 16, 8, 16, -1}};
    tw w;
    q_world(&w, PLUGIN);
    tw_module(&w, MOD, "int8", NULL);
    tw_runtime(&w, MOD, "weight", REFIT_I8, 2, TT_SHAPE(24, 32));
    tw_runtime(&w, MOD, "weight_scale", REFIT_F32, 2, TT_SHAPE(24, 1));
    assert_int_equal(q_expect(&w, MOD, s, e, 4, NULL), REFIT_OK);
    tw_seal(&w);
    q_update(&w, s, e, 4, "v1");
    q_assert_rt(&w, MOD, "weight", q_get(s, "t.int8.per_channel.q")->data, 24 * 32);
    q_assert_rt(&w, MOD, "weight_scale", q_get(s, "t.int8.per_channel.s")->data, 24 * 4);
    tw_close(&w);
    st_close(s);
}

static void seal_refusals(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 8 --k 16 --seed 56");
    static const struct {
        const char *what, *params;
        q_ent e[2];
        int n;
        const char *msg;
    } cases[] = {
        {"no scale", NULL, {{"W.weight", "t.int8.per_channel.q", "weight", 0, 0, -1, 0, 0, 0, -1}},
         1, "needs its W.weight_scale"},
        {"float weight", NULL, {{"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1},
                                {"W.weight_scale", "t.int8.per_channel.s", "weight_scale", 0, 0,
                                 -1, 0, 0, 0, -1}}, 2, "i8 [N, K]"},
        {"scheme disagrees", "scheme: per_tensor",
         {{"W.weight", "t.int8.per_channel.q", "weight", 0, 0, -1, 0, 0, 0, -1},
          {"W.weight_scale", "t.int8.per_channel.s", "weight_scale", 0, 0, -1, 0, 0, 0, -1}}, 2,
         "param scheme is per_tensor"},
        {"orphan", NULL, {{"W.weight", "t.int8.per_channel.q", "weight", 0, 0, -1, 0, 0, 0, -1},
                          {"X.weight_scale", "t.int8.per_channel.s", "weight_scale", 0, 0, -1, 0,
                           0, 0, -1}}, 2, "no X.weight"},
        {"bad scale shape", NULL, {{"W.weight", "t.int8.per_channel.q", "weight", 0, 0, -1, 0, 0,
                                    0, -1},
                                   {"W.weight_scale", "t.int8.per_channel.s", "weight_scale", 0,
                                    0, -1, 0, 4, 0, -1}}, 2, "per-channel"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tw w;
        q_world(&w, PLUGIN);
        tw_module(&w, MOD, "int8", cases[i].params);
        tw_runtime(&w, MOD, "weight", REFIT_I8, 2, TT_SHAPE(8, 16));
        tw_runtime(&w, MOD, "weight_scale", REFIT_F32, 2, TT_SHAPE(8, 1));
        q_assert_seal_refused(&w, MOD, s, cases[i].e, cases[i].n, cases[i].what, cases[i].msg);
        tw_close(&w);
    }
    st_close(s);
}

/* The built plugin and its declaration agree with its plans. */
static void plugin_declaration_agrees(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 16 --k 16 --seed 57");
    tw w;
    q_ent e[3];
    q_world(&w, NULL);
    assert_int_equal(build(&w, s, 1, 16, 16, NULL, e, NULL, -1, -1, 0, 0), REFIT_OK);
    q_update(&w, s, e, 3, "v1");
    q_assert_rt(&w, MOD, "weight", q_get(s, "t.int8.per_channel.q")->data, 16 * 16);
    tw_close(&w);
    st_close(s);
}

int main(void)
{
    pyref_skip_without_venv();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(loads_both_schemes),
        cmocka_unit_test(reload_equals_cold),
        cmocka_unit_test(tp_shards),
        cmocka_unit_test(fused_per_channel),
        cmocka_unit_test(seal_refusals),
        cmocka_unit_test(plugin_declaration_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
