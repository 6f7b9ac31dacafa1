/* Format nvfp4: both conventions against numpy/ml_dtypes (ref4.py nvfp4):
 * packed bytes DIRECT, block scales swizzled (vLLM's swizzle_blockscale
 * reproduced in numpy), alpha fused from checkpoint values only; reload =
 * cold start, TP shards, ragged K, refusals. Online (ref4.py nvfp4-online):
 * F32/F16/BF16 weights quantized at post-load give numpy's bytes (packed,
 * swizzled scales, alpha) on ragged shapes, dequantize within the format's
 * error, reload equals a cold start, a NaN is refused with the bytes kept,
 * and the online module's refusals. Many modules (online and checkpoint)
 * in one refit_load_many: one post_load_many, the caller's aligned bytes
 * read in place, the bytes of one refit_load a tensor and of a cold start,
 * a NaN in one module named at finalize and rolled back. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/fp8/quant_fp8.h"
#include "plugins/nvfp4/quant_nvfp4.h"
#include "tests/formats/common/f4batch.h"
#include "tests/formats/common/f4set.h"
#include "tests/formats/common/f4util.h"
#include "tests/formats/common/qutil.h"
#include "tests/common/pyref.h"

extern const refit_format_v2 refit_format_plugin_v2;

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

#define PLUGIN (&refit_format_plugin_v2)

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
    return f4_expect_seal(w, MOD, s, spec_fn, c);
}

/* The runtime's [n, k] weight with its scales unswizzled into a row-major
 * [n, ceil(k / 16)] E4M3 block grid (freed with the world), as the
 * reference dequantization reads them; mul and div 1. */
static kern_fp4_src runtime_src(tw *w, int64_t n, int64_t k)
{
    int64_t blocks = (k + 15) / 16;
    tt_tensor *sc = tw_tmp(w, REFIT_U8, 2, TT_SHAPE(n, blocks));
    kern_unswizzle(&(refit_view){.data = sc->buf, .dtype = REFIT_U8, .ndim = 2,
                                 .shape = {n, blocks}, .strides = {blocks, 1}},
                   tw_rt(w, MOD, "weight_scale")->buf);
    return (kern_fp4_src){.packed = tt_view(tw_rt(w, MOD, "weight")), .scale = tt_view(sc),
                          .n = n, .k = k, .block = 16, .scale_kind = KERN_FP4_SCALE_E4M3,
                          .mul = 1.0f, .div = 1.0f};
}

/* Dequantize the runtime (unswizzling its scales) and compare with rows
 * [r0, r0+n) and columns [c0, c0+k) of numpy's matrix of width full_k. */
static void check_dequant(tw *w, const st_set *s, int64_t n, int64_t k, int64_t r0,
                          int64_t c0, int64_t full_k)
{
    kern_fp4_src src = runtime_src(w, n, k);
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
    q_world(&w, PLUGIN);
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

/* build (a checkpoint module, inv: with input_scale_inv) or
 * build_online_inv of an unsharded [n, k] as a q_module's build. */
typedef struct module_args {
    int online;
    int64_t n, k;
    int inv;
    const char *params;
} module_args;

static int build_online_inv(tw *w, const st_set *s, int64_t n, int64_t k, const char *params,
                            int inv);

static int build_module(tw *w, const st_set *s, const q_module *m)
{
    const module_args *a = m->arg;
    if (a->online)
        return build_online_inv(w, s, a->n, a->k, a->params, a->inv);
    return build(w, s, a->n, a->k, a->inv, a->params, NULL);
}

/* B over A equals a cold start on B; B twice leaves the same bytes (alpha
 * is rebuilt from the checkpoint, never multiplied into itself). */
static void reload_equals_cold(void **state)
{
    (void)state;
    module_args ma = {0, 40, 64, 1, NULL};
    q_module m = f4_module(PLUGIN, build_module, &ma, "nvfp4");
    q_assert_reload_equals_cold(&m, "--n 40 --k 64 --convention modelopt --seed 6",
                                "--n 40 --k 64 --convention modelopt --seed 7", NULL);
}

static void tp_shards(void **state)
{
    (void)state;
    st_set *s = f4_ref("nvfp4", "--n 256 --k 128 --convention ct --seed 8");
    for (int k_shard = 0; k_shard < 2; k_shard++)
        for (int rank = 0; rank < 2; rank++) {
            cfg c = {2, rank, k_shard, NULL};
            int64_t lo, hi;
            q_shard(k_shard ? 64 : 256, 2, rank, &lo, &hi);
            int64_t n = k_shard ? 256 : hi - lo, k = k_shard ? (hi - lo) * 2 : 128;
            tw w;
            q_world(&w, PLUGIN);
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
    q_world(&w, PLUGIN);
    assert_int_equal(build(&w, s, 8, 40, 1, NULL, NULL), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "declare param in_features");
    tw_close(&w);
    q_world(&w, PLUGIN);
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
    q_world(&w, PLUGIN);
    assert_int_equal(build(&w, s, 8, 24, 1, "in_features: 96", &c), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "12 bytes of K against 2 blocks", "cuts a block");
    tw_close(&w);
    st_close(s);
}

/* A fresh world with an 8-row module whose runtime the refusal cases set
 * by hand: weight U8 [8, wcols], weight_scale U8 [srows, scols], alpha
 * unless no_alpha; every checkpoint tensor of s expected (c: spec_fn's). */
static void refusal_module(tw *w, const st_set *s, int64_t wcols, int64_t srows, int64_t scols,
                           int no_alpha, cfg *c)
{
    q_world(w, PLUGIN);
    tw_module(w, MOD, "nvfp4", NULL);
    tw_runtime(w, MOD, "weight", REFIT_U8, 2, TT_SHAPE(8, wcols));
    tw_runtime(w, MOD, "weight_scale", REFIT_U8, 2, TT_SHAPE(srows, scols));
    if (!no_alpha)
        tw_runtime(w, MOD, "alpha", REFIT_F32, 1, TT_SHAPE(1));
    assert_int_equal(f4_expect_all(w, MOD, s, spec_fn, c), REFIT_OK);
}

static void plan_refusals(void **state)
{
    (void)state;
    st_set *s = f4_ref("nvfp4", "--n 8 --k 32 --convention ct");
    tw w;
    refusal_module(&w, s, 16, 8, 2, 0, NULL);
    assert_int_equal(refit_model_seal(w.m), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "swizzled", "[128, 4]");
    tw_close(&w);

    cfg no_alpha = {1, 0, 0, "weight_scale"};
    refusal_module(&w, s, 16, 128, 4, 1, &no_alpha);
    assert_int_equal(refit_model_seal(w.m), REFIT_EFORMAT);
    tw_assert_msg(&w, MOD, "runtime tensor named alpha");
    tw_close(&w);

    refusal_module(&w, s, 16, 128, 4, 0, NULL);
    refit_ckpt_spec sp = tt_spec(REFIT_F32, 0, NULL);
    sp.target = "alpha";
    assert_int_equal(tw_expect(&w, MOD, "W.weight_scale_2", &sp), REFIT_OK);
    assert_int_equal(refit_model_seal(w.m), REFIT_EFORMAT);
    tw_assert_msg(&w, MOD, "mixes ModelOpt and compressed-tensors");
    tw_close(&w);
    st_close(s);
}

/* ---- online ---- */

/* Runtime tensors of an online [n, k] module (inv: an input_scale_inv
 * too, which it refuses); then expect and seal. */
static int build_online_inv(tw *w, const st_set *s, int64_t n, int64_t k, const char *params,
                            int inv)
{
    int64_t blocks = (k + 15) / 16;
    tw_module(w, MOD, "nvfp4", params);
    tw_runtime(w, MOD, "weight", REFIT_U8, 2, TT_SHAPE(n, (k + 1) / 2));
    tw_runtime(w, MOD, "weight_scale", ((refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1}), 1,
               TT_SHAPE(kern_swizzle_rows(n) * kern_swizzle_cols(blocks)));
    tw_runtime(w, MOD, "alpha", REFIT_F32, 1, TT_SHAPE(1));
    if (inv)
        tw_runtime(w, MOD, "input_scale_inv", REFIT_F32, 1, TT_SHAPE(1));
    return f4_expect_seal(w, MOD, s, spec_fn, NULL);
}

static int build_online(tw *w, const st_set *s, int64_t n, int64_t k, const char *params)
{
    return build_online_inv(w, s, n, k, params, 0);
}

/* The runtime's scales unswizzle to numpy's, and the runtime read back
 * through the reference dequantization (times alpha) is within one block
 * divisor of the weight wherever the block's E4M3 scale is normal: half
 * the widest E2M1 gap (4 to 6) is one divisor, and saturation past 6 costs
 * less (a normal scale rounds by 2^-4 at most). */
static void check_online_dequant(tw *w, const st_set *s, int64_t n, int64_t k)
{
    int64_t blocks = (k + 15) / 16;
    kern_fp4_src src = runtime_src(w, n, k);
    const uint8_t *codes = src.scale.data;
    assert_memory_equal(codes, f4_get(s, "expect.scale")->data, (size_t)(n * blocks));
    memcpy(&src.mul, tw_rt(w, MOD, "alpha")->buf, 4);
    float *got = malloc(sizeof(float) * (size_t)(n * k + 1));
    assert_non_null(got);
    assert_int_equal(kern_fp4_dequant(&src, got), REFIT_OK);
    const float *div = f4_get(s, "expect.div")->data;
    refit_view xv = q_view(f4_get(s, "W.weight"));
    int64_t checked = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++) {
            uint8_t code = codes[i * blocks + j / 16];
            float d = div[i * blocks + j / 16];
            float e = fabsf(got[i * k + j] - kern_view_f32(&xv, i, j));
            if (code < 8)
                continue; /* a subnormal scale: coarser by design */
            checked++;
            if (e > d * 1.001f)
                fail_msg("element (%lld, %lld): error %g past the block's divisor %g",
                         (long long)i, (long long)j, e, d);
        }
    assert_true(checked > n * k / 2);
    free(got);
}

static void online_case(const char *args, int64_t n, int64_t k, const char *params)
{
    st_set *s = f4_ref("nvfp4-online", args);
    tw w;
    q_world(&w, PLUGIN);
    if (build_online(&w, s, n, k, params))
        fail_msg("seal: %s", refit_errmsg(w.ctx));
    f4_update(&w, s, "v1");
    const st_tensor *q = f4_get(s, "expect.packed"), *sw = f4_get(s, "expect.swizzled");
    assert_memory_equal(tw_rt(&w, MOD, "weight")->buf, q->data, q->nbytes);
    assert_memory_equal(tw_rt(&w, MOD, "weight_scale")->buf, sw->data, sw->nbytes);
    assert_f32_bits(tw_rt(&w, MOD, "alpha")->buf, f4_get(s, "expect.alpha"));
    check_online_dequant(&w, s, n, k);
    tw_close(&w);
    st_close(s);
}

static void online_bf16_ragged(void **state)
{
    (void)state;
    online_case("--n 130 --k 40 --dtype bf16 --seed 21", 130, 40, "online: true");
}

static void online_f16_odd_k(void **state)
{
    (void)state;
    online_case("--n 7 --k 33 --dtype f16 --seed 22", 7, 33, NULL);
}

static void online_f32_tiles(void **state)
{
    (void)state;
    online_case("--n 256 --k 96 --dtype f32 --seed 23", 256, 96, NULL);
    online_case("--n 5 --k 16 --dtype f32 --seed 24", 5, 16, NULL);
}

/* B over A equals a cold start on B, and B twice leaves the same bytes. */
static void online_reload_equals_cold(void **state)
{
    (void)state;
    module_args ma = {1, 40, 72, 0, NULL};
    q_module m = f4_module(PLUGIN, build_module, &ma, "nvfp4-online");
    q_assert_reload_equals_cold(&m, "--n 40 --k 72 --seed 25", "--n 40 --k 72 --seed 26", NULL);
}

/* A NaN or an infinity: finalize fails naming module and tensor (the
 * post-load's finding is held until then); rollback keeps every byte. */
static void online_nonfinite_refused(void **state)
{
    (void)state;
    st_set *s = f4_ref("nvfp4-online", "--n 4 --k 64 --dtype f32 --seed 27");
    for (int inf = 0; inf < 2; inf++) {
        tw w;
        q_world(&w, PLUGIN);
        assert_int_equal(build_online(&w, s, 4, 64, NULL), REFIT_OK);
        f4_update(&w, s, "v1");
        q_kept kept = q_keep(&w);
        tt_tensor *bad = tw_tmp(&w, REFIT_F32, 2, TT_SHAPE(4, 64));
        memcpy(bad->buf, f4_get(s, "W.weight")->data, 4 * 64 * sizeof(float));
        ((float *)bad->buf)[70] = inf ? -INFINITY : NAN;
        refit_txn *t = tw_begin(&w, "bad", 1);
        assert_int_equal(refit_load(t, "W.weight", &bad->t, NULL), REFIT_OK);
        assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
        tw_assert_msg(&w, MOD, "W.weight", "NaN or infinity");
        q_assert_kept(&w, &kept);
        tw_close(&w);
    }
    st_close(s);
}

/* One checkpoint tensor of s replaced: the bytes of name with byte (or
 * f32) `at` set to a bad value. Every load is taken; finalize fails
 * naming the tensor with what, and the rollback keeps every byte. */
static void refuse_bad_factor(const char *args, int inv, const char *name, int64_t at,
                              int is_f32, float f, uint8_t byte, const char *what)
{
    st_set *s = f4_ref("nvfp4", args);
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build(&w, s, 32, 64, inv, NULL, NULL), REFIT_OK);
    f4_update(&w, s, "v1");
    q_kept kept = q_keep(&w);
    refit_txn *t = tw_begin(&w, "bad", 1);
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *x = st_tensor_at(s, i);
        if (!strncmp(x->name, "expect.", 7))
            continue;
        refit_tensor d = q_desc(x);
        if (!strcmp(x->name, name)) {
            tt_tensor *bad = tw_tmp(&w, d.dtype, d.ndim, d.shape);
            memcpy(bad->buf, x->data, x->nbytes);
            if (is_f32)
                memcpy((char *)bad->buf + 4 * at, &f, 4);
            else
                ((uint8_t *)bad->buf)[at] = byte;
            d = bad->t;
        }
        assert_int_equal(refit_load(t, x->name, &d, NULL), REFIT_OK);
    }
    /* post-load found it; the update fails at finalize, rolled back */
    assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
    tw_assert_msg(&w, MOD, name, what);
    q_assert_kept(&w, &kept);
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_READY);
    tw_close(&w);
    st_close(s);
}

/* A NaN or zero global factor, or an E4M3 NaN block scale, is refused,
 * not fused into alpha (the conformance kit's nan check found it taken). */
static void bad_factors_refused(void **state)
{
    (void)state;
    refuse_bad_factor("--n 32 --k 64 --convention modelopt --seed 40", 1, "W.weight_scale_2", 0,
                      1, NAN, 0, "refusing a NaN, infinity or zero factor");
    refuse_bad_factor("--n 32 --k 64 --convention modelopt --seed 41", 1, "W.input_scale", 0, 1,
                      INFINITY, 0, "refusing a NaN, infinity or zero factor");
    refuse_bad_factor("--n 32 --k 64 --convention ct --seed 42", 1, "W.weight_global_scale", 0,
                      1, 0.0f, 0, "refusing a NaN, infinity or zero factor");
    refuse_bad_factor("--n 32 --k 64 --convention modelopt --seed 43", 1, "W.weight_scale", 77,
                      0, 0, 0xff, "block scale 77 is an E4M3 NaN");
}

static void online_refusals(void **state)
{
    (void)state;
    st_set *s = f4_ref("nvfp4-online", "--n 8 --k 32 --dtype f32 --seed 28");
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build_online(&w, s, 8, 32, "online: false"), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "param online is false", "f32");
    tw_close(&w);

    q_world(&w, PLUGIN);
    assert_int_equal(build_online(&w, s, 8, 32, "online: maybe"), REFIT_EINVAL);
    tw_assert_msg(&w, MOD, "must be true or false");
    tw_close(&w);

    /* an input_scale_inv has no source */
    q_world(&w, PLUGIN);
    assert_int_equal(build_online_inv(&w, s, 8, 32, NULL, 1), REFIT_EFORMAT);
    tw_assert_msg(&w, MOD, "input_scale_inv has no source");
    tw_close(&w);

    /* scales from the checkpoint next to a float weight */
    refusal_module(&w, s, 16, 128, 4, 0, NULL);
    refit_ckpt_spec sp = tt_spec(REFIT_F32, 1, TT_SHAPE(1));
    sp.target = "alpha";
    assert_int_equal(tw_expect(&w, MOD, "W.weight_global_scale", &sp), REFIT_OK);
    assert_int_equal(refit_model_seal(w.m), REFIT_EFORMAT);
    tw_assert_msg(&w, MOD, "computes its scales");
    tw_close(&w);

    /* a runtime weight of the wrong width */
    refusal_module(&w, s, 32, 128, 4, 0, NULL);
    assert_int_equal(refit_model_seal(w.m), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "runtime weight must be U8 [8, 16]");
    tw_close(&w);
    st_close(s);
}

/* The built refit-fmt-nvfp4.so (declaration checked at seal) gives the
 * bytes the linked-in format gives. */
static void via_plugin_file(void **state)
{
    (void)state;
    st_set *s = f4_ref("nvfp4", "--n 40 --k 64 --convention ct --seed 12");
    module_args ma = {0, 40, 64, 1, NULL};
    q_module m = f4_module(PLUGIN, build_module, &ma, NULL);
    tw file, linked;
    q_assert_file_equals_linked(&file, &linked, &m, &m, s, "seal");
    tw_close(&file);
    tw_close(&linked);
    st_close(s);
    /* online through the file: its declaration takes f32/f16/bf16 weights */
    s = f4_ref("nvfp4-online", "--n 40 --k 48 --dtype bf16 --seed 29");
    /* the file's module says online, the linked one finds it out */
    module_args said = {1, 40, 48, 0, "online: true"}, found = {1, 40, 48, 0, NULL};
    q_module file_m = f4_module(PLUGIN, build_module, &said, NULL);
    q_module linked_m = f4_module(PLUGIN, build_module, &found, NULL);
    q_assert_file_equals_linked(&file, &linked, &file_m, &linked_m, s, "online seal");
    tw_close(&file);
    tw_close(&linked);
    st_close(s);
}

/* ---- many modules in one loading call ---- */

#define NB 5

/* The batch's modules: online (a float dtype) or a checkpoint convention. */
static const struct {
    const char *dtype, *conv;
    int64_t n, k;
} bmod[NB] = {
    {"bf16", NULL, 40, 48}, {NULL, "modelopt", 40, 64}, {"f16", NULL, 24, 33},
    {NULL, "ct", 40, 64},   {"f32", NULL, 16, 48},
};

static void bmod_name(char *out, size_t size, int k)
{
    snprintf(out, size, "layers.%d.mlp.down_proj", k);
}

/* Version `seed` of every module's set. */
static void batch_sets(st_set **s, int seed)
{
    for (int k = 0; k < NB; k++) {
        char args[128];
        if (bmod[k].dtype)
            snprintf(args, sizeof args, "--n %lld --k %lld --dtype %s --seed %d",
                     (long long)bmod[k].n, (long long)bmod[k].k, bmod[k].dtype, seed + k);
        else
            snprintf(args, sizeof args, "--n %lld --k %lld --convention %s --seed %d",
                     (long long)bmod[k].n, (long long)bmod[k].k, bmod[k].conv, seed + k);
        s[k] = f4_ref(bmod[k].dtype ? "nvfp4-online" : "nvfp4", args);
    }
}

static void batch_close(st_set **s)
{
    for (int k = 0; k < NB; k++)
        st_close(s[k]);
}

/* Every module of the batch (checkpoint ones with input_scale_inv), then
 * seal; asserts success. */
static void batch_build(tw *w, st_set *const *s)
{
    for (int k = 0; k < NB; k++) {
        char mod[64];
        bmod_name(mod, sizeof mod, k);
        int64_t n = bmod[k].n, kk = bmod[k].k, blocks = (kk + 15) / 16;
        tw_module(w, mod, "nvfp4", NULL);
        tw_runtime(w, mod, "weight", REFIT_U8, 2, TT_SHAPE(n, (kk + 1) / 2));
        tw_runtime(w, mod, "weight_scale", REFIT_U8, 2,
                   TT_SHAPE(kern_swizzle_rows(n), kern_swizzle_cols(blocks)));
        tw_runtime(w, mod, "alpha", REFIT_F32, 1, TT_SHAPE(1));
        if (!bmod[k].dtype)
            tw_runtime(w, mod, "input_scale_inv", REFIT_F32, 1, TT_SHAPE(1));
        assert_int_equal(f4b_expect(w, mod, k, s[k], spec_fn, NULL), REFIT_OK);
    }
    tw_seal(w);
}

/* Every module holds numpy's bytes for its set. */
static void batch_check(tw *w, st_set *const *s)
{
    for (int k = 0; k < NB; k++) {
        char mod[64];
        bmod_name(mod, sizeof mod, k);
        const st_tensor *q = bmod[k].dtype ? f4_get(s[k], "expect.packed")
                             : st_find(s[k], "W.weight") ? f4_get(s[k], "W.weight")
                                                         : f4_get(s[k], "W.weight_packed");
        const st_tensor *sw = f4_get(s[k], "expect.swizzled");
        assert_memory_equal(tw_rt(w, mod, "weight")->buf, q->data, q->nbytes);
        assert_memory_equal(tw_rt(w, mod, "weight_scale")->buf, sw->data, sw->nbytes);
        assert_f32_bits(tw_rt(w, mod, "alpha")->buf, f4_get(s[k], "expect.alpha"));
        if (!bmod[k].dtype)
            assert_f32_bits(tw_rt(w, mod, "input_scale_inv")->buf,
                            f4_get(s[k], "expect.input_scale_inv"));
    }
}

/* Five modules (three online of every float dtype, a ModelOpt and a
 * compressed-tensors one) in one refit_load_many (f4b_check_load_many). */
static void batch_load_many(void **state)
{
    (void)state;
    /* staged in place: each online weight, each checkpoint block scale and factor */
    static const f4b_batch bt = {NB, batch_sets, batch_close, batch_build, batch_check,
                                 NULL, 3 + 2 * 3};
    f4b_check_load_many(PLUGIN, &bt);
}

/* A NaN in one module of the call (an online weight, a checkpoint block
 * scale): the call is taken, finalize fails naming that module and
 * tensor, and the rollback keeps every module's bytes and the health. */
static void batch_nan_names_its_module(void **state)
{
    (void)state;
    st_set *a[NB], *b[NB];
    batch_sets(a, 80);
    batch_sets(b, 90);
    f4b_sources sa;
    f4b_sources_make(&sa, a, NB, 0);
    static const struct {
        int k;
        const char *tensor, *mod, *what;
    } bad[] = {
        {2, "W.weight", "layers.2.mlp.down_proj", "NaN or infinity"},
        {3, "W.weight_scale", "layers.3.mlp.down_proj", "block scale 7 is an E4M3 NaN"},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        tw w;
        q_world(&w, f4b_watched(PLUGIN));
        batch_build(&w, a);
        assert_int_equal(f4b_update(&w, &sa, 1, "A"), REFIT_OK);
        q_kept kept = q_keep(&w);
        f4b_sources sb;
        f4b_sources_make(&sb, b, NB, 0);
        if (bad[c].k == 2)
            ((uint16_t *)f4b_bytes(&sb, 2, "W.weight"))[5] = 0x7e00; /* an f16 NaN */
        else
            ((uint8_t *)f4b_bytes(&sb, 3, "W.weight_scale"))[7] = 0xff; /* an E4M3 NaN */
        f4b_watch_reset();
        assert_int_equal(f4b_update(&w, &sb, 1, "bad"), REFIT_ECORRUPT);
        assert_int_equal(f4b_seen.many_calls, 1);
        char tensor[64];
        f4b_name(tensor, sizeof tensor, bad[c].k, bad[c].tensor);
        tw_assert_msg(&w, bad[c].mod, tensor, bad[c].what);
        q_assert_kept(&w, &kept);
        assert_string_equal(refit_worker_version(w.ctx), "A");
        f4b_sources_free(&sb);
        tw_close(&w);
    }
    f4b_sources_free(&sa);
    batch_close(a);
    batch_close(b);
}

int main(void)
{
    pyref_skip_without_venv();
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
        cmocka_unit_test(online_bf16_ragged),
        cmocka_unit_test(online_f16_odd_k),
        cmocka_unit_test(online_f32_tiles),
        cmocka_unit_test(online_reload_equals_cold),
        cmocka_unit_test(online_nonfinite_refused),
        cmocka_unit_test(online_refusals),
        cmocka_unit_test(bad_factors_refused),
        cmocka_unit_test(via_plugin_file),
        cmocka_unit_test(batch_load_many),
        cmocka_unit_test(batch_nan_names_its_module),
    };
    return cmocka_run_group_tests_name("formats-nvfp4", tests, NULL, NULL);
}
