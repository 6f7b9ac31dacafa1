/* Expert slices with a real format: online fp8 (linked from
 * plugins/fp8/, its CPU reference on host memory) over a stacked module
 * w13 [E, 2I, H] whose checkpoint names each expert's gate_proj and
 * up_proj (bf16 [I, H], placed with expert and dst_offset). Staged an
 * expert at a time, it loads under a budget of two experts, and every
 * expert's bytes (weight and scales) equal those of the same expert
 * registered as a module of its own (the whole-module post-load). One
 * per-tensor scale over the stack crosses experts: staged whole, so
 * refused at seal under that budget. A ragged block-128 stack takes
 * out_features / in_features as one expert's N and K, and equals separate
 * modules, serialized and online. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/sys/stats.h>

#include "testutil.h"

extern const refit_format_v2 refit_format_plugin_v2; /* plugins/fp8/fp8.c */

#define E 4
#define I 128
#define H 256
#define E4M3 ((refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1})
#define SLICE_BYTES (2 * I * H * 2)      /* one expert's bf16 gate + up */
#define BUDGET (2 * SLICE_BYTES + 4096)  /* two experts, not the stack */

static const char *const scheme_params[3] = {
    "scheme: per_tensor\nonline: true", "scheme: per_channel\nonline: true",
    "scheme: block128\nonline: true"};

/* Scale shape of one expert's [2I, H] weight under scheme sch. */
static int scale_dims(int sch, int64_t *shape)
{
    if (sch == 0) {
        shape[0] = 1;
        return 1;
    }
    if (sch == 1) {
        shape[0] = 2 * I;
        return 1;
    }
    shape[0] = 2 * I / 128;
    shape[1] = H / 128;
    return 2;
}

static void open_world(tw *w, uint64_t budget)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.staging_budget = budget;
    assert_int_equal(tw_open(w, &o), REFIT_OK);
    assert_int_equal(refit_format_register(w->ctx, &refit_format_plugin_v2), REFIT_OK);
}

static void name_of(char *out, size_t n, const char *prefix, int e, int up)
{
    snprintf(out, n, "%s.%d.%s_proj.weight", prefix, e, up ? "up" : "gate");
}

/* The stacked module: weight [E, 2I, H], weight_scale [E, <scale>] (or
 * [1]: one scale over the stack, with cross). Returns seal's status. */
static int build_stacked(tw *w, uint64_t budget, int sch, int cross)
{
    open_world(w, budget);
    tw_module(w, "moe", "fp8", scheme_params[sch]);
    tw_runtime(w, "moe", "weight", E4M3, 3, TT_SHAPE(E, 2 * I, H));
    int64_t ss[REFIT_MAX_DIMS + 1] = {E};
    int nd = scale_dims(sch, ss + 1);
    if (cross)
        tw_runtime(w, "moe", "weight_scale", REFIT_F32, 1, TT_SHAPE(1));
    else
        tw_runtime(w, "moe", "weight_scale", REFIT_F32, nd + 1, ss);
    for (int e = 0; e < E; e++)
        for (int up = 0; up < 2; up++) {
            char name[96];
            name_of(name, sizeof name, "experts", e, up);
            refit_ckpt_spec s = tt_spec(REFIT_BF16, 2, TT_SHAPE(I, H));
            s.target = "weight";
            s.expert = e;
            s.dst_offset[0] = up ? I : 0;
            assert_int_equal(tw_expect(w, "moe", name, &s), REFIT_OK);
        }
    return refit_model_seal(w->m);
}

/* Checkpoint tensor name (version 1) loaded into t, and its bytes as rname
 * into tr. */
static void load_both(tw *w, refit_txn *t, const char *name, refit_txn *tr, const char *rname)
{
    tt_tensor *x = tw_ckpt_tensor(w, name, 1);
    assert_int_equal(refit_load(t, name, &x->t, NULL), REFIT_OK);
    assert_int_equal(refit_load(tr, rname, &x->t, NULL), REFIT_OK);
}

/* t and tr finalized; then each of the n experts of stacked module mod
 * (w) holds the weight and weight_scale bytes of module "ref<e>" (r). */
static void assert_stack_equals_refs(tw *w, refit_txn *t, const char *mod, tw *r, refit_txn *tr,
                                     int n)
{
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_int_equal(refit_finalize(tr), REFIT_OK);
    tt_tensor *sw = tw_rt(w, mod, "weight"), *ss = tw_rt(w, mod, "weight_scale");
    for (int e = 0; e < n; e++) {
        char ref[32];
        snprintf(ref, sizeof ref, "ref%d", e);
        tt_tensor *rw = tw_rt(r, ref, "weight"), *rs = tw_rt(r, ref, "weight_scale");
        assert_memory_equal((char *)sw->buf + (size_t)e * rw->bytes, rw->buf, rw->bytes);
        assert_memory_equal((char *)ss->buf + (size_t)e * rs->bytes, rs->buf, rs->bytes);
    }
}

/* Each expert as a module of its own ("ref.e"): weight [2I, H]. */
static void build_reference(tw *w, int sch)
{
    open_world(w, 0);
    for (int e = 0; e < E; e++) {
        char mod[32];
        snprintf(mod, sizeof mod, "ref%d", e);
        tw_module(w, mod, "fp8", scheme_params[sch]);
        tw_runtime(w, mod, "weight", E4M3, 2, TT_SHAPE(2 * I, H));
        int64_t ss[REFIT_MAX_DIMS];
        int nd = scale_dims(sch, ss);
        tw_runtime(w, mod, "weight_scale", REFIT_F32, nd, ss);
        for (int up = 0; up < 2; up++) {
            char name[96];
            name_of(name, sizeof name, mod, e, up);
            refit_ckpt_spec s = tt_spec(REFIT_BF16, 2, TT_SHAPE(I, H));
            s.target = "weight";
            s.dst_offset[0] = up ? I : 0;
            assert_int_equal(tw_expect(w, mod, name, &s), REFIT_OK);
        }
    }
    tw_seal(w);
}

static void test_fp8_slices_equal_per_expert_modules(void **state)
{
    (void)state;
    for (int sch = 0; sch < 3; sch++) {
        tw w, r;
        assert_int_equal(build_stacked(&w, BUDGET, sch, 0), REFIT_OK);
        build_reference(&r, sch);
        refit_txn *t = tw_begin(&w, "v1", 1), *tr = tw_begin(&r, "v1", 0);
        for (int e = 0; e < E; e++)
            for (int up = 0; up < 2; up++) {
                char name[96], rname[96], mod[32];
                name_of(name, sizeof name, "experts", e, up);
                snprintf(mod, sizeof mod, "ref%d", e);
                name_of(rname, sizeof rname, mod, e, up);
                load_both(&w, t, name, tr, rname);
            }
        size_t peak = refit_sys_txn_staging_peak(t);
        assert_true(peak > 0 && peak <= BUDGET);
        assert_stack_equals_refs(&w, t, "moe", &r, tr, E);
        tw_close(&r);
        tw_close(&w);
    }
}

/* One per-tensor scale over every expert: the post-load crosses experts,
 * the module is staged whole, and seal says how much that needs. */
static void test_fp8_crossing_scale_refused_at_seal(void **state)
{
    (void)state;
    tw w;
    int rc = build_stacked(&w, BUDGET, 0, 1);
    char need[32];
    snprintf(need, sizeof need, "%d bytes", E * SLICE_BYTES);
    tw_close_refused(&w, rc, REFIT_EBUDGET, "module moe", need, "whole module");
    /* under a budget that holds the stack, it loads */
    assert_int_equal(build_stacked(&w, 0, 0, 1), REFIT_OK);
    tw_update(&w, 1, "v1");
    tw_close(&w);
}

/* A ragged block-128 stack: E3 experts of down_proj [RN, RK] (neither a
 * multiple of 128), the params one expert's N and K as an engine states
 * them. Serialized (e4m3 with its scale_inv, DIRECT) and online (bf16,
 * staged an expert at a time): the bytes of E3 modules of their own. */
#define E3 3
#define RN 200
#define RK 160
#define RB 2 /* ceil(200 / 128) = ceil(160 / 128) */
#define RAGGED_PARAMS "scheme: block128\nout_features: 200\nin_features: 160"

/* Module mod: weight [E3,] RN, RK (stacked when expert >= 0, one expert's
 * tensors at a time), its scale grid, and expert e's checkpoint tensors. */
static void ragged_tensors(tw *w, const char *mod, int online, int e, int stacked)
{
    char name[96];
    snprintf(name, sizeof name, "%s.%d.down_proj.weight", mod, e);
    refit_ckpt_spec s = tt_spec(online ? REFIT_BF16 : E4M3, 2, TT_SHAPE(RN, RK));
    s.target = "weight";
    s.expert = stacked ? e : -1;
    assert_int_equal(tw_expect(w, mod, name, &s), REFIT_OK);
    if (online)
        return;
    snprintf(name, sizeof name, "%s.%d.down_proj.weight_scale_inv", mod, e);
    s = tt_spec(REFIT_F32, 2, TT_SHAPE(RB, RB));
    s.target = "weight_scale";
    s.expert = stacked ? e : -1;
    assert_int_equal(tw_expect(w, mod, name, &s), REFIT_OK);
}

static int build_ragged(tw *w, int online, int stacked, const char *params)
{
    open_world(w, 0);
    for (int e = 0; e < (stacked ? 1 : E3); e++) {
        char mod[32];
        snprintf(mod, sizeof mod, stacked ? "experts" : "ref%d", e);
        tw_module(w, mod, "fp8", params);
        if (stacked) {
            tw_runtime(w, mod, "weight", E4M3, 3, TT_SHAPE(E3, RN, RK));
            tw_runtime(w, mod, "weight_scale", REFIT_F32, 3, TT_SHAPE(E3, RB, RB));
            for (int x = 0; x < E3; x++)
                ragged_tensors(w, mod, online, x, 1);
        } else {
            tw_runtime(w, mod, "weight", E4M3, 2, TT_SHAPE(RN, RK));
            tw_runtime(w, mod, "weight_scale", REFIT_F32, 2, TT_SHAPE(RB, RB));
            ragged_tensors(w, mod, online, e, 0);
        }
    }
    return refit_model_seal(w->m);
}

static void test_fp8_ragged_block_stack_equals_per_expert_modules(void **state)
{
    (void)state;
    for (int online = 0; online < 2; online++) {
        tw w, r;
        int rc = build_ragged(&w, online, 1, RAGGED_PARAMS);
        if (rc)
            fail_msg("%s stack refused at seal: %s", online ? "online" : "serialized",
                     refit_errmsg(w.ctx));
        assert_int_equal(build_ragged(&r, online, 0, RAGGED_PARAMS), REFIT_OK);
        refit_txn *t = tw_begin(&w, "v1", 1), *tr = tw_begin(&r, "v1", 0);
        for (int e = 0; e < E3; e++)
            for (int sc = 0; sc < (online ? 1 : 2); sc++) {
                char name[96], rname[96];
                const char *role = sc ? "weight_scale_inv" : "weight";
                snprintf(name, sizeof name, "experts.%d.down_proj.%s", e, role);
                snprintf(rname, sizeof rname, "ref%d.%d.down_proj.%s", e, e, role);
                load_both(&w, t, name, tr, rname);
            }
        assert_stack_equals_refs(&w, t, "experts", &r, tr, E3);
        tw_close(&r);
        tw_close(&w);
        /* an expert with more rows than out_features: refused, naming it */
        rc = build_ragged(&w, online, 1, "scheme: block128\nout_features: 150");
        tw_close_refused(&w, rc, REFIT_EMISMATCH,
                         "expert 0 have 200 rows, more than param out_features 150");
    }
    /* serialized without out_features: a ragged extent is not a shard */
    tw w;
    int rc = build_ragged(&w, 0, 1, "scheme: block128\nin_features: 160");
    tw_close_refused(&w, rc, REFIT_EMISMATCH, "declare param out_features");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_slices_equal_per_expert_modules),
        cmocka_unit_test(test_fp8_crossing_scale_refused_at_seal),
        cmocka_unit_test(test_fp8_ragged_block_stack_equals_per_expert_modules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
