/* Format mxfp4 against numpy/ml_dtypes (ref4.py mxfp4, mxfp4-online):
 * serialized 2-D and gpt-oss stacked *_blocks and *_scales, per-expert tensors
 * into stacked runtimes, online quantization from BF16/F32 (the OCP MX
 * scale rule), reload = cold start, TP shards, refusals. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/nvfp4/quant_nvfp4.h"
#include "tests/formats/common/f4set.h"
#include "tests/formats/common/f4util.h"
#include "tests/formats/common/qutil.h"
#include "tests/formats/mxfp8/mx_batch.h"
#include "tests/common/pyref.h"

extern const refit_format_v2 refit_format_plugin_v2;

#define MOD "layers.0.mlp.experts"

typedef struct cfg {
    int tp, rank, dim; /* shard dim of values and scales alike */
} cfg;

static void spec_fn(const char *name, refit_ckpt_spec *s, void *user)
{
    const cfg *c = user;
    int scales = strstr(name, "scale") != NULL;
    s->target = scales ? "weight_scale" : "weight";
    if (c && c->tp > 1) { /* values and scales split along the same dim index */
        s->shard_dim = c->dim;
        s->shard_rank = c->rank;
        s->shard_count = c->tp;
    }
}

#define PLUGIN (&refit_format_plugin_v2)

/* Runtime weight [(E,) n, ceil(k/2)] and weight_scale [(E,) n, ceil(k/32)]. */
static int build(tw *w, const st_set *s, int64_t e, int64_t n, int64_t k, refit_dtype sdt,
                 const char *params, cfg *c)
{
    tw_module(w, MOD, "mxfp4", params);
    if (e) {
        tw_runtime(w, MOD, "weight", REFIT_U8, 3, TT_SHAPE(e, n, (k + 1) / 2));
        tw_runtime(w, MOD, "weight_scale", sdt, 3, TT_SHAPE(e, n, (k + 31) / 32));
    } else {
        tw_runtime(w, MOD, "weight", REFIT_U8, 2, TT_SHAPE(n, (k + 1) / 2));
        tw_runtime(w, MOD, "weight_scale", sdt, 2, TT_SHAPE(n, (k + 31) / 32));
    }
    return s ? f4_expect_seal(w, MOD, s, spec_fn, c) : REFIT_OK;
}

/* An unsharded build as a q_module's build. */
typedef struct module_args {
    int64_t e, n, k;
    refit_dtype sdt;
} module_args;

static int build_module(tw *w, const st_set *s, const q_module *m)
{
    const module_args *a = m->arg;
    return build(w, s, a->e, a->n, a->k, a->sdt, NULL, NULL);
}

/* Expert ex of the runtime, dequantized, against numpy's block. */
static void check_expert(tw *w, const float *want, int64_t e, int64_t ex, int64_t n, int64_t k,
                         int64_t r0, int64_t c0, int64_t full_n, int64_t full_k)
{
    refit_view q = tt_view(tw_rt(w, MOD, "weight")), sc = tt_view(tw_rt(w, MOD, "weight_scale"));
    if (e) {
        q.data = (uint8_t *)q.data + ex * q.strides[0];
        sc.data = (uint8_t *)sc.data + ex * sc.strides[0];
        for (int i = 0; i < 2; i++) {
            q.shape[i] = q.shape[i + 1], q.strides[i] = q.strides[i + 1];
            sc.shape[i] = sc.shape[i + 1], sc.strides[i] = sc.strides[i + 1];
        }
        q.ndim = sc.ndim = 2;
    }
    kern_fp4_src src = {.packed = q, .scale = sc, .n = n, .k = k, .block = 32,
                        .scale_kind = KERN_FP4_SCALE_E8M0, .mul = 1.0f, .div = 1.0f};
    float *got = malloc(sizeof(float) * (size_t)(n * k));
    assert_non_null(got);
    assert_int_equal(kern_fp4_dequant(&src, got), REFIT_OK);
    f4_assert_block_eq(want + ex * full_n * full_k, full_k, r0, r0 + n, c0, c0 + k, got);
    free(got);
}

static void serialized_2d(void **state)
{
    (void)state;
    st_set *s = f4_ref("mxfp4", "--n 16 --k 64 --seed 2");
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build(&w, s, 0, 16, 64, REFIT_U8, NULL, NULL), REFIT_OK);
    f4_update(&w, s, "v1");
    check_expert(&w, f4_get(s, "expect.dequant")->data, 0, 0, 16, 64, 0, 0, 16, 64);
    tw_close(&w);
    st_close(s);
}

/* gpt-oss: stacked [E, N, K/32, 16] blocks through a VIEW of [E, N, K/2];
 * U8 scales through a VIEW of an E8M0 runtime. */
static void gptoss_stacked_blocks(void **state)
{
    (void)state;
    st_set *s = f4_ref("mxfp4", "--n 16 --k 64 --experts 3 --blocks --seed 3");
    tw w;
    q_world(&w, PLUGIN);
    refit_dtype e8m0 = {REFIT_DTYPE_FLOAT8_E8M0FNU, 8, 1};
    assert_int_equal(build(&w, s, 3, 16, 64, e8m0, NULL, NULL), REFIT_OK);
    refit_model_stats st;
    assert_int_equal(refit_model_stats_get(w.m, &st), REFIT_OK);
    assert_int_equal(st.routes_view, 2);
    f4_update(&w, s, "v1");
    for (int e = 0; e < 3; e++)
        check_expert(&w, f4_get(s, "expect.dequant")->data, 3, e, 16, 64, 0, 0, 16, 64);
    tw_close(&w);
    st_close(s);
}

/* Per-expert checkpoint tensors land at their expert (DIRECT placement). */
static void per_expert_tensors(void **state)
{
    (void)state;
    st_set *s[3];
    tw w;
    q_world(&w, PLUGIN);
    build(&w, NULL, 3, 8, 64, REFIT_U8, NULL, NULL);
    char name[64];
    for (int e = 0; e < 3; e++) {
        char args[64];
        snprintf(args, sizeof args, "--n 8 --k 64 --seed %d", 20 + e);
        s[e] = f4_ref("mxfp4", args);
        const char *parts[2] = {"W.weight_packed", "W.weight_scale"};
        for (int p = 0; p < 2; p++) {
            const st_tensor *t = f4_get(s[e], parts[p]);
            refit_ckpt_spec sp = tt_spec(st_dtype_to_refit(t->dtype), t->ndim, t->shape);
            sp.expert = e;
            sp.target = p ? "weight_scale" : "weight";
            snprintf(name, sizeof name, "experts.%d.%s", e, p ? "weight_scale" : "weight_packed");
            assert_int_equal(tw_expect(&w, MOD, name, &sp), REFIT_OK);
        }
    }
    tw_seal(&w);
    refit_txn *t = tw_begin(&w, "v1", 1);
    for (int e = 0; e < 3; e++)
        for (int p = 0; p < 2; p++) {
            refit_tensor d = q_desc(f4_get(s[e], p ? "W.weight_scale" : "W.weight_packed"));
            snprintf(name, sizeof name, "experts.%d.%s", e, p ? "weight_scale" : "weight_packed");
            assert_int_equal(refit_load(t, name, &d, NULL), REFIT_OK);
        }
    assert_int_equal(refit_finalize(t), REFIT_OK);
    for (int e = 0; e < 3; e++) {
        float *want = malloc(sizeof(float) * 3 * 8 * 64);
        assert_non_null(want);
        memcpy(want + e * 8 * 64, f4_get(s[e], "expect.dequant")->data, sizeof(float) * 8 * 64);
        check_expert(&w, want, 3, e, 8, 64, 0, 0, 8, 64);
        free(want);
        st_close(s[e]);
    }
    tw_close(&w);
}

static void online_case(const char *args, int64_t e, int64_t n, int64_t k)
{
    st_set *s = f4_ref("mxfp4-online", args);
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build(&w, s, e, n, k, REFIT_U8, NULL, NULL), REFIT_OK);
    f4_update(&w, s, "v1");
    const st_tensor *q = f4_get(s, "expect.packed"), *sc = f4_get(s, "expect.scale");
    assert_memory_equal(tw_rt(&w, MOD, "weight")->buf, q->data, q->nbytes);
    assert_memory_equal(tw_rt(&w, MOD, "weight_scale")->buf, sc->data, sc->nbytes);
    tw_close(&w);
    st_close(s);
}

static void online_bf16_ragged(void **state)
{
    (void)state;
    online_case("--n 6 --k 70 --dtype bf16 --seed 4", 0, 6, 70);
}

static void online_f32_stacked(void **state)
{
    (void)state;
    online_case("--n 4 --k 64 --experts 2 --dtype f32 --seed 5", 2, 4, 64);
}

/* Online is the case where a second post-load could go wrong: B over A
 * equals a cold start on B, and B twice leaves the same bytes. */
static void reload_equals_cold(void **state)
{
    (void)state;
    module_args ma = {0, 8, 96, REFIT_U8};
    q_module m = f4_module(PLUGIN, build_module, &ma, "mxfp4-online");
    q_assert_reload_equals_cold(&m, "--n 8 --k 96 --seed 6", "--n 8 --k 96 --seed 7", NULL);
}

/* Stacked gpt-oss blocks sharded along N (dim 1) and along K (the blocks
 * dim, 2; scales dim 2 too). */
static void tp_shards(void **state)
{
    (void)state;
    st_set *s = f4_ref("mxfp4", "--n 16 --k 128 --experts 2 --blocks --seed 8");
    const float *want = f4_get(s, "expect.dequant")->data;
    for (int k_shard = 0; k_shard < 2; k_shard++)
        for (int rank = 0; rank < 2; rank++) {
            cfg c = {2, rank, k_shard ? 2 : 1};
            int64_t lo, hi;
            q_shard(k_shard ? 4 : 16, 2, rank, &lo, &hi);
            int64_t n = k_shard ? 16 : hi - lo, k = k_shard ? (hi - lo) * 32 : 128;
            tw w;
            q_world(&w, PLUGIN);
            assert_int_equal(build(&w, s, 2, n, k, REFIT_U8, NULL, &c), REFIT_OK);
            f4_update(&w, s, "v1");
            for (int e = 0; e < 2; e++)
                check_expert(&w, want, 2, e, n, k, k_shard ? 0 : lo, k_shard ? lo * 32 : 0, 16,
                             128);
            tw_close(&w);
        }
    st_close(s);
}

static void tp_cut_refused(void **state)
{
    (void)state;
    st_set *s = f4_ref("mxfp4", "--n 8 --k 96");
    cfg c = {2, 0, 1};
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build(&w, s, 0, 8, 48, REFIT_U8, "in_features: 96", &c), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "24 bytes of K against 2 blocks", "cuts a block");
    tw_close(&w);
    q_world(&w, PLUGIN);
    assert_int_equal(build(&w, s, 0, 8, 48, REFIT_U8, NULL, &c), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "declare param in_features");
    tw_close(&w);
    st_close(s);
}

/* A NaN cannot be quantized: the post-load of the completed module finds
 * it, finalize fails and rollback keeps the previous bytes. */
static void online_nan_refused(void **state)
{
    (void)state;
    st_set *s = f4_ref("mxfp4-online", "--n 4 --k 64 --dtype f32 --seed 9");
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build(&w, s, 0, 4, 64, REFIT_U8, NULL, NULL), REFIT_OK);
    f4_update(&w, s, "v1");
    q_kept kept = q_keep(&w);
    tt_tensor *bad = tw_tmp(&w, REFIT_F32, 2, TT_SHAPE(4, 64));
    memcpy(bad->buf, f4_get(s, "W.weight")->data, 4 * 64 * sizeof(float));
    ((float *)bad->buf)[70] = NAN;
    refit_txn *t = tw_begin(&w, "bad", 1);
    assert_int_equal(refit_load(t, "W.weight", &bad->t, NULL), REFIT_OK); /* held until finalize */
    assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
    tw_assert_msg(&w, MOD, "MXFP4 cannot hold it");
    q_assert_kept(&w, &kept);
    tw_close(&w);
    st_close(s);
}

/* Five online modules (one of 3 stacked experts) in one refit_load_many:
 * one post_load_many, sources read in place where aligned, the bytes of
 * the reference, the per-call path and a cold start; a NaN in module k of
 * the batch named at finalize and rolled back (mx_batch.h). */
static void online_load_many_batch(void **state)
{
    (void)state;
    mxb_case c = {PLUGIN, 4, 24, 100};
    mxb_run(&c);
}

/* The built refit-fmt-mxfp4.so (declaration checked at seal) gives the
 * bytes the linked-in format gives: VIEW routes (blocks, E8M0 scales) and
 * the online STAGED route. */
static void via_plugin_case(const char *cmd, const char *args, int64_t e, int64_t n, int64_t k,
                            refit_dtype sdt)
{
    st_set *s = f4_ref(cmd, args);
    module_args ma = {e, n, k, sdt};
    q_module m = f4_module(PLUGIN, build_module, &ma, NULL);
    tw file, linked;
    q_assert_file_equals_linked(&file, &linked, &m, &m, s, "seal");
    tw_close(&file);
    tw_close(&linked);
    st_close(s);
}

static void via_plugin_file(void **state)
{
    (void)state;
    refit_dtype e8m0 = {REFIT_DTYPE_FLOAT8_E8M0FNU, 8, 1};
    via_plugin_case("mxfp4", "--n 8 --k 64 --experts 2 --blocks --seed 13", 2, 8, 64, e8m0);
    via_plugin_case("mxfp4-online", "--n 8 --k 64 --seed 14", 0, 8, 64, REFIT_U8);
}

int main(void)
{
    pyref_skip_without_venv();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(serialized_2d),
        cmocka_unit_test(gptoss_stacked_blocks),
        cmocka_unit_test(per_expert_tensors),
        cmocka_unit_test(online_bf16_ragged),
        cmocka_unit_test(online_f32_stacked),
        cmocka_unit_test(reload_equals_cold),
        cmocka_unit_test(tp_shards),
        cmocka_unit_test(tp_cut_refused),
        cmocka_unit_test(online_nan_refused),
        cmocka_unit_test(online_load_many_batch),
        cmocka_unit_test(via_plugin_file),
    };
    return cmocka_run_group_tests_name("formats-mxfp4", tests, NULL, NULL);
}
