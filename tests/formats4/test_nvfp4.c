/* Format nvfp4: both conventions against numpy/ml_dtypes (ref4.py nvfp4):
 * packed bytes DIRECT, block scales swizzled (vLLM's swizzle_blockscale
 * reproduced in numpy), alpha fused from checkpoint values only; reload =
 * cold start, TP shards, ragged K, refusals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant_nvfp4.h"
#include "tests/formats4/f4util.h"

extern const refit_format_v1 refit_format_plugin_v1;

#define MOD "layers.0.mlp.down_proj"

typedef struct cfg {
    int tp, rank, k_shard;
    const char *scalar_target; /* NULL: alpha */
} cfg;

static void spec_fn(const char *name, refit_ckpt_spec *s, void *user)
{
    const cfg *c = user;
    const char *suf = f4_suffix(name);
    int packed = !strcmp(suf, "weight") || !strcmp(suf, "weight_packed");
    const char *scalar = c && c->scalar_target ? c->scalar_target : "alpha";
    s->target = packed ? "weight" : !strcmp(suf, "weight_scale") ? "weight_scale" : scalar;
    if (c && c->tp > 1 && (packed || !strcmp(suf, "weight_scale"))) {
        s->shard_dim = c->k_shard ? 1 : 0;
        s->shard_rank = c->rank;
        s->shard_count = c->tp;
    }
}

static void open_world(tw *w)
{
    assert_int_equal(tw_open(w, NULL), REFIT_OK);
    assert_int_equal(refit_format_register(w->ctx, &refit_format_plugin_v1), REFIT_OK);
}

/* Runtime tensors for this rank's [n, k] slice; then expect and seal. */
static int build(tw *w, const st_set *s, int64_t n, int64_t k, int inv, const char *params,
                 cfg *c)
{
    int64_t blocks = (k + 15) / 16;
    tw_module(w, MOD, "nvfp4", params);
    tw_runtime(w, MOD, "weight", REFIT_U8, 2, TT_SHAPE(n, (k + 1) / 2));
    tw_runtime(w, MOD, "weight_scale", REFIT_U8, 2,
               TT_SHAPE(kern_swizzle_rows(n), kern_swizzle_cols(blocks)));
    tw_runtime(w, MOD, "alpha", REFIT_F32, 1, TT_SHAPE(1));
    if (inv)
        tw_runtime(w, MOD, "input_scale_inv", REFIT_F32, 1, TT_SHAPE(1));
    int rc = f4_expect_all(w, MOD, s, spec_fn, c);
    return rc ? rc : refit_model_seal(w->m);
}

/* Dequantize the runtime (unswizzling its scales) and compare with rows
 * [r0, r0+n) and columns [c0, c0+k) of numpy's matrix of width full_k. */
static void check_dequant(tw *w, const st_set *s, int64_t n, int64_t k, int64_t r0,
                          int64_t c0, int64_t full_k)
{
    int64_t blocks = (k + 15) / 16;
    tt_tensor *sc = tw_tmp(w, REFIT_U8, 2, TT_SHAPE(n, blocks));
    kern_unswizzle(&(refit_view){.data = sc->buf, .dtype = REFIT_U8, .ndim = 2,
                                 .shape = {n, blocks}, .strides = {blocks, 1}},
                   tw_rt(w, MOD, "weight_scale")->buf);
    kern_fp4_src src = {.packed = tt_view(tw_rt(w, MOD, "weight")), .scale = tt_view(sc),
                        .n = n, .k = k, .block = 16, .scale_kind = KERN_FP4_SCALE_E4M3,
                        .mul = 1.0f, .div = 1.0f};
    const st_tensor *g2 = st_find(s, "W.weight_scale_2");
    if (g2)
        memcpy(&src.mul, g2->data, 4);
    else
        memcpy(&src.div, f4_get(s, "W.weight_global_scale")->data, 4);
    float *got = malloc(sizeof(float) * (size_t)(n * k));
    assert_non_null(got);
    assert_int_equal(kern_fp4_dequant(&src, got), REFIT_OK);
    f4_assert_block_eq(f4_get(s, "expect.dequant")->data, full_k, r0, r0 + n, c0, c0 + k, got);
    free(got);
}

static void assert_f32_bits(const void *got, const st_tensor *want)
{
    assert_memory_equal(got, want->data, 4);
}

static void convention(const char *args, int inv)
{
    st_set *s = f4_ref("nvfp4", args);
    tw w;
    open_world(&w);
    assert_int_equal(build(&w, s, 130, 48, inv, NULL, NULL), REFIT_OK);
    f4_update(&w, s, "v1");
    const st_tensor *ck = st_find(s, "W.weight") ? f4_get(s, "W.weight")
                                                 : f4_get(s, "W.weight_packed");
    assert_memory_equal(tw_rt(&w, MOD, "weight")->buf, ck->data, 130 * 24);
    const st_tensor *sw = f4_get(s, "expect.swizzled");
    assert_int_equal(sw->nbytes, 256 * 4);
    assert_memory_equal(tw_rt(&w, MOD, "weight_scale")->buf, sw->data, sw->nbytes);
    assert_f32_bits(tw_rt(&w, MOD, "alpha")->buf, f4_get(s, "expect.alpha"));
    if (inv)
        assert_f32_bits(tw_rt(&w, MOD, "input_scale_inv")->buf,
                        f4_get(s, "expect.input_scale_inv"));
    check_dequant(&w, s, 130, 48, 0, 0, 48);
    tw_close(&w);
    st_close(s);
}

static void modelopt(void **state)
{
    (void)state;
    convention("--n 130 --k 48 --convention modelopt --seed 2", 1);
}

static void modelopt_weight_only(void **state)
{
    (void)state;
    convention("--n 130 --k 48 --convention modelopt --no-input --seed 3", 0);
}

static void compressed_tensors(void **state)
{
    (void)state;
    convention("--n 130 --k 48 --convention ct --seed 4", 1);
}

static void compressed_tensors_weight_only(void **state)
{
    (void)state;
    convention("--n 130 --k 48 --convention ct --no-input --seed 5", 0);
}

/* B over A equals a cold start on B; B twice leaves the same bytes (alpha
 * is rebuilt from the checkpoint, never multiplied into itself). */
static void reload_equals_cold(void **state)
{
    (void)state;
    st_set *a = f4_ref("nvfp4", "--n 40 --k 64 --convention modelopt --seed 6");
    st_set *b = f4_ref("nvfp4", "--n 40 --k 64 --convention modelopt --seed 7");
    tw cold, hot;
    open_world(&cold);
    open_world(&hot);
    assert_int_equal(build(&cold, b, 40, 64, 1, NULL, NULL), REFIT_OK);
    assert_int_equal(build(&hot, a, 40, 64, 1, NULL, NULL), REFIT_OK);
    f4_update(&cold, b, "B");
    f4_update(&hot, a, "A");
    f4_update(&hot, b, "B");
    assert_int_equal(tw_fp(&hot), tw_fp(&cold));
    size_t n1, n2;
    void *s1 = tw_snapshot(&hot, &n1);
    f4_update(&hot, b, "B again");
    void *s2 = tw_snapshot(&hot, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(s1, s2, n1);
    free(s1);
    free(s2);
    tw_close(&cold);
    tw_close(&hot);
    st_close(a);
    st_close(b);
}

static void tp_shards(void **state)
{
    (void)state;
    st_set *s = f4_ref("nvfp4", "--n 256 --k 128 --convention ct --seed 8");
    for (int k_shard = 0; k_shard < 2; k_shard++)
        for (int rank = 0; rank < 2; rank++) {
            cfg c = {2, rank, k_shard, NULL};
            int64_t lo, hi;
            f4_shard(k_shard ? 64 : 256, 2, rank, &lo, &hi);
            int64_t n = k_shard ? 256 : hi - lo, k = k_shard ? (hi - lo) * 2 : 128;
            tw w;
            open_world(&w);
            assert_int_equal(build(&w, s, n, k, 1, NULL, &c), REFIT_OK);
            f4_update(&w, s, "v1");
            check_dequant(&w, s, n, k, k_shard ? 0 : lo, k_shard ? lo * 2 : 0, 128);
            tw_close(&w);
        }
    st_close(s);
}

/* K = 40: two whole blocks and a ragged one; fine once in_features says
 * the tensor is whole. */
static void ragged_k(void **state)
{
    (void)state;
    st_set *s = f4_ref("nvfp4", "--n 8 --k 40 --convention modelopt --seed 9");
    tw w;
    open_world(&w);
    assert_int_equal(build(&w, s, 8, 40, 1, NULL, NULL), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "declare param in_features");
    tw_close(&w);
    open_world(&w);
    assert_int_equal(build(&w, s, 8, 40, 1, "in_features: 40", NULL), REFIT_OK);
    f4_update(&w, s, "v1");
    check_dequant(&w, s, 8, 40, 0, 0, 40);
    tw_close(&w);
    st_close(s);
}

static void tp_cut_refused(void **state)
{
    (void)state;
    st_set *s = f4_ref("nvfp4", "--n 8 --k 96 --convention modelopt");
    cfg c = {4, 0, 1, NULL};
    tw w;
    open_world(&w);
    assert_int_equal(build(&w, s, 8, 24, 1, "in_features: 96", &c), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "12 bytes of K against 2 blocks", "cuts a block");
    tw_close(&w);
    st_close(s);
}

static void plan_refusals(void **state)
{
    (void)state;
    st_set *s = f4_ref("nvfp4", "--n 8 --k 32 --convention ct");
    tw w;
    open_world(&w);
    tw_module(&w, MOD, "nvfp4", NULL);
    tw_runtime(&w, MOD, "weight", REFIT_U8, 2, TT_SHAPE(8, 16));
    tw_runtime(&w, MOD, "weight_scale", REFIT_U8, 2, TT_SHAPE(8, 2));
    tw_runtime(&w, MOD, "alpha", REFIT_F32, 1, TT_SHAPE(1));
    assert_int_equal(f4_expect_all(&w, MOD, s, spec_fn, NULL), REFIT_OK);
    assert_int_equal(refit_model_seal(w.m), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "swizzled", "[128, 4]");
    tw_close(&w);

    open_world(&w);
    tw_module(&w, MOD, "nvfp4", NULL);
    tw_runtime(&w, MOD, "weight", REFIT_U8, 2, TT_SHAPE(8, 16));
    tw_runtime(&w, MOD, "weight_scale", REFIT_U8, 2, TT_SHAPE(128, 4));
    cfg no_alpha = {1, 0, 0, "weight_scale"};
    assert_int_equal(f4_expect_all(&w, MOD, s, spec_fn, &no_alpha), REFIT_OK);
    assert_int_equal(refit_model_seal(w.m), REFIT_EFORMAT);
    tw_assert_msg(&w, MOD, "runtime tensor named alpha");
    tw_close(&w);

    open_world(&w);
    tw_module(&w, MOD, "nvfp4", NULL);
    tw_runtime(&w, MOD, "weight", REFIT_U8, 2, TT_SHAPE(8, 16));
    tw_runtime(&w, MOD, "weight_scale", REFIT_U8, 2, TT_SHAPE(128, 4));
    tw_runtime(&w, MOD, "alpha", REFIT_F32, 1, TT_SHAPE(1));
    assert_int_equal(f4_expect_all(&w, MOD, s, spec_fn, NULL), REFIT_OK);
    refit_ckpt_spec sp = tt_spec(REFIT_F32, 0, NULL);
    sp.target = "alpha";
    assert_int_equal(tw_expect(&w, MOD, "W.weight_scale_2", &sp), REFIT_OK);
    assert_int_equal(refit_model_seal(w.m), REFIT_EFORMAT);
    tw_assert_msg(&w, MOD, "mixes ModelOpt and compressed-tensors");
    tw_close(&w);
    st_close(s);
}

/* The built refit-fmt-nvfp4.so (declaration checked at seal) gives the
 * bytes the linked-in format gives. */
static void via_plugin_file(void **state)
{
    (void)state;
    st_set *s = f4_ref("nvfp4", "--n 40 --k 64 --convention ct --seed 12");
    tw file, linked;
    assert_int_equal(tw_open(&file, NULL), REFIT_OK);
    open_world(&linked);
    if (build(&file, s, 40, 64, 1, NULL, NULL))
        fail_msg("seal through the plugin file: %s", refit_errmsg(file.ctx));
    assert_int_equal(build(&linked, s, 40, 64, 1, NULL, NULL), REFIT_OK);
    f4_update(&file, s, "v1");
    f4_update(&linked, s, "v1");
    assert_int_equal(tw_fp(&file), tw_fp(&linked));
    tw_close(&file);
    tw_close(&linked);
    st_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(modelopt),
        cmocka_unit_test(modelopt_weight_only),
        cmocka_unit_test(compressed_tensors),
        cmocka_unit_test(compressed_tensors_weight_only),
        cmocka_unit_test(reload_equals_cold),
        cmocka_unit_test(tp_shards),
        cmocka_unit_test(ragged_k),
        cmocka_unit_test(tp_cut_refused),
        cmocka_unit_test(plan_refusals),
        cmocka_unit_test(via_plugin_file),
    };
    return cmocka_run_group_tests_name("formats4-nvfp4", tests, NULL, NULL);
}
