/* Format int4 (compressed-tensors pack-quantized): VIEW routes onto the
 * gptq and u8 runtime layouts, checked against numpy's dequantization of
 * the checkpoint (ref4.py int4), reload = cold start, TP shards and the
 * refusals. Many modules (online of both layouts and group sizes, and a
 * checkpoint one) in one refit_load_many: one post_load_many, the
 * caller's aligned bytes read in place, the bytes of one refit_load a
 * tensor and of a cold start, a NaN or a bad weight_shape in one module
 * named at finalize and rolled back. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/int4/quant_int4.h"
#include "tests/formats/common/f4batch.h"
#include "tests/formats/common/f4set.h"
#include "tests/formats/common/f4util.h"
#include "tests/formats/common/qutil.h"
#include "tests/common/pyref.h"

extern const refit_format_v2 refit_format_plugin_v2;

#define MOD "layers.0.q"

/* Where each checkpoint tensor goes, and how it is sharded. */
typedef struct layout_cfg {
    int tp, rank;
    int k_shard;          /* shard along K (row-parallel), else along N */
} layout_cfg;

static void spec_fn(const char *name, refit_ckpt_spec *s, void *user)
{
    const layout_cfg *c = user;
    const char *suf = f4_suffix(name);
    s->target = !strcmp(suf, "weight_scale") ? "weight_scale"
                : !strcmp(suf, "weight_zero_point") ? "weight_zero_point"
                                                    : "weight";
    if (c && c->tp > 1 && strcmp(suf, "weight_shape")) {
        s->shard_dim = c->k_shard ? 1 : 0;
        s->shard_rank = c->rank;
        s->shard_count = c->tp;
    }
}

#define PLUGIN (&refit_format_plugin_v2)

/* A gptq-layout module for an [n, k] weight of this rank. */
static int build_gptq(tw *w, const st_set *s, int64_t n, int64_t k, int64_t g, int asym,
                      const char *params, layout_cfg *c)
{
    int64_t words = (k + 7) / 8, groups = (k + g - 1) / g;
    tw_module(w, MOD, "int4", params);
    tw_runtime(w, MOD, "weight", REFIT_I32, 2, TT_SHAPE(words, n));
    tw_runtime(w, MOD, "weight_scale", REFIT_F32, 2, TT_SHAPE(groups, n));
    if (asym)
        tw_runtime(w, MOD, "weight_zero_point", REFIT_I32, 2, TT_SHAPE(groups, (n + 7) / 8));
    return f4_expect_seal(w, MOD, s, spec_fn, c);
}

/* An unsharded build_gptq as a q_module's build. */
typedef struct gptq_args {
    int64_t n, k, g;
    int asym;
    const char *params;
} gptq_args;

static int build_gptq_module(tw *w, const st_set *s, const q_module *m)
{
    const gptq_args *a = m->arg;
    return build_gptq(w, s, a->n, a->k, a->g, a->asym, a->params, NULL);
}

/* Dequantize this rank's runtime through the checkpoint-layout views. */
static float *dequant_gptq(tw *w, int64_t n, int64_t k, int64_t g, int asym)
{
    tt_tensor *wt = tw_rt(w, MOD, "weight"), *sc = tw_rt(w, MOD, "weight_scale");
    refit_device cpu = {REFIT_DEVICE_CPU, 0};
    kern_int4_src src;
    memset(&src, 0, sizeof src);
    src.packed = kern_q4_transposed_view(wt->buf, cpu, REFIT_I32, n, (k + 7) / 8, n);
    src.scale = kern_q4_transposed_view(sc->buf, cpu, REFIT_F32, n, (k + g - 1) / g, n);
    if (asym) {
        tt_tensor *zp = tw_rt(w, MOD, "weight_zero_point");
        src.zp = kern_q4_transposed_view(zp->buf, cpu, REFIT_I32, (n + 7) / 8,
                                         (k + g - 1) / g, (n + 7) / 8);
    }
    src.n = n;
    src.k = k;
    src.group = g;
    float *out = malloc(sizeof(float) * (size_t)(n * k));
    assert_non_null(out);
    assert_int_equal(kern_int4_dequant(&src, out), REFIT_OK);
    return out;
}

static void check_dequant(tw *w, const st_set *s, int64_t n, int64_t k, int64_t g, int asym,
                          int64_t r0, int64_t c0, int64_t full_k)
{
    float *got = dequant_gptq(w, n, k, g, asym);
    const float *want = f4_get(s, "expect.dequant")->data;
    f4_assert_block_eq(want, full_k, r0, r0 + n, c0, c0 + k, got);
    free(got);
}

static void gptq_sym_dequant(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4", "--n 24 --k 96 --group 32 --seed 3");
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build_gptq(&w, s, 24, 96, 32, 0, "group_size: 32", NULL), REFIT_OK);
    refit_model_stats st;
    assert_int_equal(refit_model_stats_get(w.m, &st), REFIT_OK);
    assert_int_equal(st.routes_view, 2);
    assert_int_equal(st.routes_staged, 1);
    f4_update(&w, s, "v1");
    /* the runtime holds the checkpoint words, transposed, unchanged */
    const int32_t *ck = f4_get(s, "W.weight_packed")->data;
    const int32_t *rt = tw_rt(&w, MOD, "weight")->buf;
    for (int i = 0; i < 24; i++)
        for (int j = 0; j < 12; j++)
            assert_int_equal(rt[j * 24 + i], ck[i * 12 + j]);
    check_dequant(&w, s, 24, 96, 32, 0, 0, 0, 96);
    tw_close(&w);
    st_close(s);
}

static void gptq_asym_channel(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4", "--n 16 --k 64 --group -1 --asym --scale-dtype f32");
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build_gptq(&w, s, 16, 64, 64, 1, "group_size: -1", NULL), REFIT_OK);
    f4_update(&w, s, "v1");
    check_dequant(&w, s, 16, 64, 64, 1, 0, 0, 64);
    tw_close(&w);
    st_close(s);
}

/* u8 layout: words land as bytes in rows with a pitch; the pad is zeroed. */
static void u8_asym_ragged(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4", "--n 20 --k 100 --group 32 --asym --seed 5");
    tw w;
    q_world(&w, PLUGIN);
    tw_module(&w, MOD, "int4", "group_size: 32\nlayout: u8\nin_features: 100\nout_features: 20");
    tt_tensor *wt = tw_runtime(&w, MOD, "weight", REFIT_U8, 2, TT_SHAPE(20, 64));
    tt_tensor *sc = tw_runtime(&w, MOD, "weight_scale", REFIT_BF16, 2, TT_SHAPE(20, 4));
    tt_tensor *zp = tw_runtime(&w, MOD, "weight_zero_point", REFIT_I32, 2, TT_SHAPE(3, 4));
    assert_int_equal(f4_expect_all(&w, MOD, s, spec_fn, NULL), REFIT_OK);
    tw_seal(&w);
    f4_update(&w, s, "v1");
    const uint8_t *b = wt->buf;
    for (int i = 0; i < 20; i++)
        for (int j = 52; j < 64; j++)
            assert_int_equal(b[i * 64 + j], 0);
    kern_int4_src src;
    memset(&src, 0, sizeof src);
    src.packed = tt_view(wt);
    src.packed.dtype = REFIT_I32;
    src.packed.shape[1] = 13;
    src.packed.strides[0] = 16;
    src.scale = tt_view(sc);
    src.zp = tt_view(zp);
    src.n = 20;
    src.k = 100;
    src.group = 32;
    float got[20 * 100];
    assert_int_equal(kern_int4_dequant(&src, got), REFIT_OK);
    f4_assert_block_eq(f4_get(s, "expect.dequant")->data, 100, 0, 20, 0, 100, got);
    tw_close(&w);
    st_close(s);
}

/* A ragged K without in_features is refused: it could be a cut shard. */
static void u8_ragged_needs_in_features(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4", "--n 8 --k 100 --group 32");
    tw w;
    q_world(&w, PLUGIN);
    tw_module(&w, MOD, "int4", "group_size: 32\nlayout: u8");
    tw_runtime(&w, MOD, "weight", REFIT_U8, 2, TT_SHAPE(8, 52));
    tw_runtime(&w, MOD, "weight_scale", REFIT_BF16, 2, TT_SHAPE(8, 4));
    assert_int_equal(f4_expect_all(&w, MOD, s, spec_fn, NULL), REFIT_OK);
    assert_int_equal(refit_model_seal(w.m), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "in_features", "ragged");
    tw_close(&w);
    st_close(s);
}

/* Loading B over A gives the bytes a cold start on B gives; twice too. */
static void reload_equals_cold(void **state)
{
    (void)state;
    gptq_args ga = {16, 128, 64, 1, "group_size: 64"};
    q_module m = f4_module(PLUGIN, build_gptq_module, &ga, "int4");
    uint64_t fp[2];
    q_assert_reload_equals_cold(&m, "--n 16 --k 128 --group 64 --asym --seed 7",
                                "--n 16 --k 128 --group 64 --asym --seed 8", fp);
    assert_true(fp[0] != fp[1]);
}

/* Column-parallel (N) and row-parallel (K) shards, each rank checked
 * against its block of numpy's dequantized matrix. */
static void tp_shards(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4", "--n 48 --k 256 --group 32 --asym --seed 9");
    for (int k_shard = 0; k_shard < 2; k_shard++) {
        for (int rank = 0; rank < 2; rank++) {
            layout_cfg c = {2, rank, k_shard};
            int64_t lo, hi, n = 48, k = 256;
            tw w;
            q_world(&w, PLUGIN);
            if (k_shard) {
                q_shard(32, 2, rank, &lo, &hi);
                k = (hi - lo) * 8;
            } else {
                q_shard(48, 2, rank, &lo, &hi);
                n = hi - lo;
            }
            assert_int_equal(build_gptq(&w, s, n, k, 32, 1, "group_size: 32", &c), REFIT_OK);
            f4_update(&w, s, "v1");
            check_dequant(&w, s, n, k, 32, 1, k_shard ? 0 : lo, k_shard ? lo * 8 : 0, 256);
            tw_close(&w);
        }
    }
    st_close(s);
}

/* A K shard boundary inside a group, an N boundary inside a zero-point
 * word: refused at seal, naming the module. */
static void tp_cut_refused(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4", "--n 16 --k 192 --group 64");
    layout_cfg c = {2, 0, 1};
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build_gptq(&w, s, 16, 96, 64, 0, "group_size: 64\nin_features: 192", &c),
                     REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "cuts a group");
    tw_close(&w);
    /* without in_features the slice could also be a whole ragged K */
    q_world(&w, PLUGIN);
    assert_int_equal(build_gptq(&w, s, 16, 96, 64, 0, "group_size: 64", &c), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "declare param in_features");
    tw_close(&w);
    st_close(s);

    s = f4_ref("int4", "--n 20 --k 64 --group 32 --asym");
    layout_cfg cn = {2, 0, 0};
    q_world(&w, PLUGIN);
    assert_int_equal(build_gptq(&w, s, 10, 64, 32, 1, "group_size: 32\nout_features: 20", &cn),
                     REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "zero-point words", "cuts a group");
    tw_close(&w);
    st_close(s);
}

static void expect_refusal(const st_set *s, const char *params, int64_t rows, const char *msg)
{
    tw w;
    q_world(&w, PLUGIN);
    int rc = build_gptq(&w, s, rows, 64, 32, 0, params, NULL);
    assert_true(rc != REFIT_OK);
    tw_assert_msg(&w, MOD, msg);
    tw_close(&w);
}

static void plan_refusals(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4", "--n 16 --k 64 --group 32");
    expect_refusal(s, NULL, 16, "group_size");
    expect_refusal(s, "group_size: 32\nlayout: tiled", 16, "layout 'tiled'");
    expect_refusal(s, "group_size: x", 16, "not an integer");
    expect_refusal(s, "group_size: 32", 15, "runtime weight must be I32 [8, 16]");
    expect_refusal(s, "group_size: 16", 16, "cuts a group");
    tw w;
    q_world(&w, PLUGIN);
    tw_module(&w, MOD, "int4", "group_size: 32");
    tw_runtime(&w, MOD, "weight", REFIT_I32, 2, TT_SHAPE(8, 16));
    tw_runtime(&w, MOD, "weight_scale", REFIT_F32, 2, TT_SHAPE(2, 16));
    refit_ckpt_spec sp = tt_spec(REFIT_I32, 1, TT_SHAPE(16));
    sp.target = "weight";
    assert_int_equal(f4_expect_all(&w, MOD, s, spec_fn, NULL), REFIT_OK);
    assert_int_equal(tw_expect(&w, MOD, "W.weight_g_idx", &sp), REFIT_OK);
    assert_int_equal(refit_model_seal(w.m), REFIT_EFORMAT);
    tw_assert_msg(&w, MOD, "W.weight_g_idx", "act-order");
    tw_close(&w);
    st_close(s);
}

/* A weight_shape that disagrees with the plan fails finalize; rollback
 * leaves the previous version's bytes. */
static void shape_checked_at_finalize(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4", "--n 24 --k 96 --group 32");
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build_gptq(&w, s, 24, 96, 32, 0, "group_size: 32", NULL), REFIT_OK);
    f4_update(&w, s, "v1");
    q_kept kept = q_keep(&w);
    refit_txn *t = tw_begin(&w, "bad", 1);
    int64_t bad[2] = {24, 50}, dims[1] = {2};
    refit_tensor shape = {bad, {REFIT_DEVICE_CPU, 0}, 1, {REFIT_DTYPE_INT, 64, 1}, dims, NULL, 0};
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *x = st_tensor_at(s, i);
        if (!strncmp(x->name, "expect.", 7))
            continue;
        refit_tensor d = q_desc(x);
        int shp = !strcmp(f4_suffix(x->name), "weight_shape");
        /* the post-load of the completed module finds it: held until finalize */
        assert_int_equal(refit_load(t, x->name, shp ? &shape : &d, NULL), REFIT_OK);
    }
    assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
    tw_assert_msg(&w, MOD, "does not fit this rank");
    q_assert_kept(&w, &kept);
    tw_close(&w);
    st_close(s);
}

/* The built refit-fmt-int4.so, found by the loader in the build's plugin
 * dir and checked against int4.yaml at seal, gives the bytes the linked-in
 * format gives, for both layouts' routes. */
static void via_plugin_file(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4", "--n 16 --k 64 --group 32 --asym --seed 12");
    gptq_args ga = {16, 64, 32, 1, "group_size: 32"};
    q_module m = f4_module(PLUGIN, build_gptq_module, &ga, NULL);
    tw file, linked;
    q_assert_file_equals_linked(&file, &linked, &m, &m, s, "seal");
    tw_close(&file);
    tw_close(&linked);
    st_close(s);
}

/* ---- online: float weights quantized at post-load ---- */

/* An online module: W.weight [n, k] into layout gptq (scale dtype sdt) or
 * u8 (row pitch P). */
static int build_online(tw *w, const st_set *s, int64_t n, int64_t k, int64_t g, int u8,
                        int64_t pitch, refit_dtype sdt, const char *params, layout_cfg *c)
{
    int64_t words = (k + 7) / 8, groups = g > 0 ? (k + g - 1) / g : 1;
    tw_module(w, MOD, "int4", params);
    if (u8) {
        tw_runtime(w, MOD, "weight", REFIT_U8, 2, TT_SHAPE(n, pitch));
        tw_runtime(w, MOD, "weight_scale", sdt, 2, TT_SHAPE(n, groups));
    } else {
        tw_runtime(w, MOD, "weight", REFIT_I32, 2, TT_SHAPE(words, n));
        tw_runtime(w, MOD, "weight_scale", sdt, 2, TT_SHAPE(groups, n));
    }
    return f4_expect_seal(w, MOD, s, spec_fn, c);
}

/* An unsharded build_online as a q_module's build. */
typedef struct online_args {
    int64_t n, k, g;
    int u8;
    int64_t pitch;
    refit_dtype sdt;
    const char *params;
} online_args;

static int build_online_module(tw *w, const st_set *s, const q_module *m)
{
    const online_args *a = m->arg;
    return build_online(w, s, a->n, a->k, a->g, a->u8, a->pitch, a->sdt, a->params, NULL);
}

/* The runtime words and scales of this rank equal numpy's, columns
 * [w0, w0 + words) of expect.packed and [g0, g0 + groups) of expect.scale,
 * bit for bit. */
static void check_online_in(tw *w, const char *mod, const st_set *s, int64_t n, int64_t words,
                            int64_t groups, int u8, int64_t pitch, int64_t w0, int64_t g0)
{
    const st_tensor *ep = f4_get(s, "expect.packed"), *es = f4_get(s, "expect.scale");
    int64_t all_w = ep->shape[1], all_g = es->shape[1];
    size_t sz = es->dtype == ST_F32 ? 4 : 2;
    const int32_t *want = ep->data;
    const char *want_s = es->data;
    tt_tensor *rt = tw_rt(w, mod, "weight"), *rs = tw_rt(w, mod, "weight_scale");
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < words; j++) {
            int32_t got;
            if (u8)
                memcpy(&got, (char *)rt->buf + i * pitch + 4 * j, 4);
            else
                got = ((const int32_t *)rt->buf)[j * n + i];
            if (got != want[i * all_w + w0 + j])
                fail_msg("row %lld word %lld: %08x, numpy %08x", (long long)i, (long long)j,
                         (unsigned)got, (unsigned)want[i * all_w + w0 + j]);
        }
        for (int64_t g = 0; g < groups; g++) {
            int64_t at = u8 ? i * groups + g : g * n + i;
            if (memcmp((char *)rs->buf + at * (int64_t)sz,
                       want_s + (i * all_g + g0 + g) * (int64_t)sz, sz))
                fail_msg("row %lld group %lld: the scale differs from numpy's", (long long)i,
                         (long long)g);
        }
        if (u8)
            for (int64_t b = 4 * words; b < pitch; b++)
                assert_int_equal(((uint8_t *)rt->buf)[i * pitch + b], 0);
    }
}

static void check_online(tw *w, const st_set *s, int64_t n, int64_t words, int64_t groups,
                         int u8, int64_t pitch, int64_t w0, int64_t g0)
{
    check_online_in(w, MOD, s, n, words, groups, u8, pitch, w0, g0);
}

/* Ragged K (not a multiple of 8 or of the group), BF16 weight and scales,
 * zero and tie rows: the gptq words and scales are numpy's. */
static void online_gptq_ragged(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4-online", "--n 24 --k 100 --group 32 --dtype bf16 --scale-dtype bf16 "
                                      "--seed 21");
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build_online(&w, s, 24, 100, 32, 0, 0, REFIT_BF16,
                                  "group_size: 32\nonline: true", NULL), REFIT_OK);
    refit_model_stats st;
    assert_int_equal(refit_model_stats_get(w.m, &st), REFIT_OK);
    assert_int_equal(st.routes_staged, 1);
    f4_update(&w, s, "v1");
    check_online(&w, s, 24, 13, 4, 0, 0, 0, 0);
    /* and what an engine dequantizes is numpy's q * scale */
    tt_tensor *wt = tw_rt(&w, MOD, "weight"), *sc = tw_rt(&w, MOD, "weight_scale");
    refit_device cpu = {REFIT_DEVICE_CPU, 0};
    kern_int4_src src;
    memset(&src, 0, sizeof src);
    src.packed = kern_q4_transposed_view(wt->buf, cpu, REFIT_I32, 24, 13, 24);
    src.scale = kern_q4_transposed_view(sc->buf, cpu, REFIT_BF16, 24, 4, 24);
    src.n = 24;
    src.k = 100;
    src.group = 32;
    float got[24 * 100];
    assert_int_equal(kern_int4_dequant(&src, got), REFIT_OK);
    f4_assert_block_eq(f4_get(s, "expect.dequant")->data, 100, 0, 24, 0, 100, got);
    tw_close(&w);
    st_close(s);
}

/* u8 layout, one scale per row (F16 scales from F32 weights), a row pitch
 * whose pad (junk before the load) comes back zero. */
static void online_u8_per_channel(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4-online", "--n 20 --k 77 --group -1 --dtype f32 --scale-dtype f16 "
                                      "--seed 22");
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build_online(&w, s, 20, 77, -1, 1, 48, REFIT_F16,
                                  "group_size: -1\nlayout: u8", NULL), REFIT_OK);
    memset(tw_rt(&w, MOD, "weight")->buf, 0xab, 20 * 48);
    f4_update(&w, s, "v1");
    check_online(&w, s, 20, 10, 1, 1, 48, 0, 0);
    tw_close(&w);
    st_close(s);
}

/* F16 weights, F32 scales, K a multiple of 8 but not of the group. */
static void online_f16_group64(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4-online", "--n 9 --k 136 --group 64 --dtype f16 --scale-dtype f32 "
                                      "--seed 23");
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build_online(&w, s, 9, 136, 64, 0, 0, REFIT_F32, "group_size: 64", NULL),
                     REFIT_OK);
    f4_update(&w, s, "v1");
    check_online(&w, s, 9, 17, 3, 0, 0, 0, 0);
    /* the same weights again leave the same bytes (post-load reads staged
     * bytes only) */
    q_kept kept = q_keep(&w);
    f4_update(&w, s, "v1 again");
    q_assert_kept(&w, &kept);
    tw_close(&w);
    st_close(s);
}

/* Row-parallel shards of whole groups quantize to numpy's columns of the
 * whole matrix; a shard boundary inside a group is refused at seal. */
static void online_tp_k_shards(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4-online", "--n 16 --k 256 --group 32 --dtype bf16 --seed 24");
    for (int rank = 0; rank < 2; rank++) {
        layout_cfg c = {2, rank, 1};
        tw w;
        q_world(&w, PLUGIN);
        assert_int_equal(build_online(&w, s, 16, 128, 32, 0, 0, REFIT_BF16, "group_size: 32", &c),
                         REFIT_OK);
        f4_update(&w, s, "v1");
        check_online(&w, s, 16, 16, 4, 0, 0, rank * 16, rank * 4);
        tw_close(&w);
    }
    layout_cfg c = {2, 1, 1};
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build_online(&w, s, 16, 128, 96, 0, 0, REFIT_BF16, "group_size: 96", &c),
                     REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "W.weight", "cuts a group");
    tw_close(&w);
    q_world(&w, PLUGIN);
    assert_int_equal(build_online(&w, s, 16, 128, -1, 0, 0, REFIT_BF16, "group_size: -1", &c),
                     REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "one scale per row needs the whole row");
    tw_close(&w);
    st_close(s);
}

/* A NaN in the weight fails the update naming the tensor; rollback keeps
 * the previous version's bytes. */
static void online_nan_rolls_back(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4-online", "--n 8 --k 64 --group 32 --dtype f32 --seed 25");
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build_online(&w, s, 8, 64, 32, 0, 0, REFIT_F32, "group_size: 32", NULL),
                     REFIT_OK);
    f4_update(&w, s, "v1");
    q_kept kept = q_keep(&w);
    const st_tensor *x = f4_get(s, "W.weight");
    float *bad = malloc(8 * 64 * sizeof(float));
    assert_non_null(bad);
    memcpy(bad, x->data, 8 * 64 * sizeof(float));
    bad[5 * 64 + 40] = NAN;
    refit_tensor d = q_desc(x);
    d.data = bad;
    refit_txn *t = tw_begin(&w, "bad", 1);
    assert_int_equal(refit_load(t, "W.weight", &d, NULL), REFIT_OK); /* held until finalize */
    assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
    tw_assert_msg(&w, MOD, "W.weight", "NaN");
    q_assert_kept(&w, &kept);
    free(bad);
    tw_close(&w);
    st_close(s);
}

static void online_refusals(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4-online", "--n 16 --k 64 --group 32 --seed 26");
    tw w;
    q_world(&w, PLUGIN);
    assert_int_equal(build_online(&w, s, 16, 64, 32, 0, 0, REFIT_BF16,
                                  "group_size: 32\nonline: false", NULL), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "param online is false");
    tw_close(&w);
    q_world(&w, PLUGIN);
    tw_module(&w, MOD, "int4", "group_size: 32");
    tw_runtime(&w, MOD, "weight", REFIT_I32, 2, TT_SHAPE(8, 16));
    tw_runtime(&w, MOD, "weight_scale", REFIT_BF16, 2, TT_SHAPE(2, 16));
    tw_runtime(&w, MOD, "weight_zero_point", REFIT_I32, 2, TT_SHAPE(2, 2));
    assert_int_equal(f4_expect_all(&w, MOD, s, spec_fn, NULL), REFIT_OK);
    assert_int_equal(refit_model_seal(w.m), REFIT_EFORMAT);
    tw_assert_msg(&w, MOD, "symmetric");
    tw_close(&w);
    q_world(&w, PLUGIN);
    assert_int_equal(build_online(&w, s, 16, 64, 16, 0, 0, REFIT_BF16, "group_size: 32", NULL),
                     REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "runtime weight_scale must be F32/F16/BF16 [2, 16]");
    tw_close(&w);
    st_close(s);
}

/* The online module through the built refit-fmt-int4.so (its declaration's
 * STAGED role and post-load kernel checked by the loader): the bytes of the
 * linked-in format. */
static void online_via_plugin_file(void **state)
{
    (void)state;
    st_set *s = f4_ref("int4-online", "--n 16 --k 72 --group 16 --seed 27");
    online_args oa = {16, 72, 16, 1, 40, REFIT_BF16, "group_size: 16\nlayout: u8\nonline: true"};
    q_module m = f4_module(PLUGIN, build_online_module, &oa, NULL);
    tw file, linked;
    q_assert_file_equals_linked(&file, &linked, &m, &m, s, "seal");
    check_online(&file, s, 16, 9, 5, 1, 40, 0, 0);
    tw_close(&file);
    tw_close(&linked);
    st_close(s);
}

/* ---- many modules in one loading call ---- */

#define NB 5

/* The batch's modules: online (weight dtype wdt) into gptq or u8 (row
 * pitch), or a checkpoint module (wdt NULL: asymmetric gptq with its
 * weight_shape). Modules 0 and 4 share a group size (one launch on a
 * device), the others each their own. */
static const struct {
    const char *wdt, *sdt_name;
    refit_dtype sdt;
    int64_t n, k, g;
    int u8;
    int64_t pitch;
    const char *params;
} bmod[NB] = {
    {"bf16", "bf16", REFIT_BF16, 24, 64, 32, 0, 0, "group_size: 32"},
    {NULL, NULL, REFIT_F32, 16, 64, 32, 0, 0, "group_size: 32"},
    {"f32", "f16", REFIT_F16, 20, 77, -1, 1, 48, "group_size: -1\nlayout: u8"},
    {"f16", "f32", REFIT_F32, 9, 136, 64, 0, 0, "group_size: 64"},
    {"bf16", "bf16", REFIT_BF16, 16, 96, 32, 0, 0, "group_size: 32\nonline: true"},
};

static void bmod_name(char *out, size_t size, int k)
{
    snprintf(out, size, "layers.%d.q", k);
}

static void batch_sets(st_set **s, int seed)
{
    for (int k = 0; k < NB; k++) {
        char args[160];
        if (bmod[k].wdt)
            snprintf(args, sizeof args, "--n %lld --k %lld --group %lld --dtype %s "
                     "--scale-dtype %s --seed %d", (long long)bmod[k].n, (long long)bmod[k].k,
                     (long long)bmod[k].g, bmod[k].wdt, bmod[k].sdt_name, seed + k);
        else
            snprintf(args, sizeof args, "--n %lld --k %lld --group %lld --asym --seed %d",
                     (long long)bmod[k].n, (long long)bmod[k].k, (long long)bmod[k].g, seed + k);
        s[k] = f4_ref(bmod[k].wdt ? "int4-online" : "int4", args);
    }
}

static void batch_close(st_set **s)
{
    for (int k = 0; k < NB; k++)
        st_close(s[k]);
}

static void batch_build(tw *w, st_set *const *s)
{
    for (int k = 0; k < NB; k++) {
        char mod[64];
        bmod_name(mod, sizeof mod, k);
        int64_t n = bmod[k].n, kk = bmod[k].k, g = bmod[k].g;
        int64_t words = (kk + 7) / 8, groups = g > 0 ? (kk + g - 1) / g : 1;
        tw_module(w, mod, "int4", bmod[k].params);
        if (bmod[k].u8) {
            tw_runtime(w, mod, "weight", REFIT_U8, 2, TT_SHAPE(n, bmod[k].pitch));
            tw_runtime(w, mod, "weight_scale", bmod[k].sdt, 2, TT_SHAPE(n, groups));
        } else {
            tw_runtime(w, mod, "weight", REFIT_I32, 2, TT_SHAPE(words, n));
            tw_runtime(w, mod, "weight_scale", bmod[k].sdt, 2, TT_SHAPE(groups, n));
        }
        if (!bmod[k].wdt)
            tw_runtime(w, mod, "weight_zero_point", REFIT_I32, 2,
                       TT_SHAPE(groups, (n + 7) / 8));
        assert_int_equal(f4b_expect(w, mod, k, s[k], spec_fn, NULL), REFIT_OK);
    }
    tw_seal(w);
}

/* Every module holds numpy's bytes for its set (the checkpoint module:
 * its words, transposed). */
static void batch_check(tw *w, st_set *const *s)
{
    for (int k = 0; k < NB; k++) {
        char mod[64];
        bmod_name(mod, sizeof mod, k);
        int64_t n = bmod[k].n, kk = bmod[k].k, g = bmod[k].g;
        int64_t words = (kk + 7) / 8, groups = g > 0 ? (kk + g - 1) / g : 1;
        if (bmod[k].wdt) {
            check_online_in(w, mod, s[k], n, words, groups, bmod[k].u8, bmod[k].pitch, 0, 0);
            continue;
        }
        const int32_t *ck = f4_get(s[k], "W.weight_packed")->data;
        const int32_t *rt = tw_rt(w, mod, "weight")->buf;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < words; j++)
                assert_int_equal(rt[j * n + i], ck[i * words + j]);
    }
}

static void batch_spoil(tw *w)
{
    memset(tw_rt(w, "layers.2.q", "weight")->buf, 0xab, 20 * 48); /* the pad, zeroed */
}

/* Five modules in one refit_load_many (f4b_check_load_many); module 2's
 * runtime pad is scribbled on first: the load zeroes it. */
static void batch_load_many(void **state)
{
    (void)state;
    /* staged in place: each online weight and the checkpoint's weight_shape */
    static const f4b_batch bt = {NB, batch_sets, batch_close, batch_build, batch_check,
                                 batch_spoil, NB};
    f4b_check_load_many(PLUGIN, &bt);
}

/* A NaN in one online module of the call, or a weight_shape the
 * checkpoint module's plan does not fit: the call is taken, finalize
 * fails naming that module and tensor, the rollback keeps every byte. */
static void batch_bad_module_named(void **state)
{
    (void)state;
    st_set *a[NB], *b[NB];
    batch_sets(a, 80);
    batch_sets(b, 90);
    f4b_sources sa;
    f4b_sources_make(&sa, a, NB, 0);
    for (int c = 0; c < 2; c++) {
        tw w;
        q_world(&w, f4b_watched(PLUGIN));
        batch_build(&w, a);
        assert_int_equal(f4b_update(&w, &sa, 1, "A"), REFIT_OK);
        q_kept kept = q_keep(&w);
        f4b_sources sb;
        f4b_sources_make(&sb, b, NB, 0);
        if (c == 0) {
            ((uint16_t *)f4b_bytes(&sb, 3, "W.weight"))[40] = 0x7e00; /* an f16 NaN */
        } else {
            void *shape = f4b_bytes(&sb, 1, "W.weight_shape"); /* K 50: not this plan's */
            if (f4_get(b[1], "W.weight_shape")->dtype == ST_I64)
                ((int64_t *)shape)[1] = 50;
            else
                ((int32_t *)shape)[1] = 50;
        }
        f4b_watch_reset();
        assert_int_equal(f4b_update(&w, &sb, 1, "bad"), REFIT_ECORRUPT);
        assert_int_equal(f4b_seen.many_calls, 1);
        if (c == 0)
            tw_assert_msg(&w, "layers.3.q", "l3.W.weight", "NaN or infinity");
        else
            tw_assert_msg(&w, "layers.1.q", "l1.W.weight_shape", "does not fit this rank");
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
        cmocka_unit_test(gptq_sym_dequant),
        cmocka_unit_test(gptq_asym_channel),
        cmocka_unit_test(u8_asym_ragged),
        cmocka_unit_test(u8_ragged_needs_in_features),
        cmocka_unit_test(reload_equals_cold),
        cmocka_unit_test(tp_shards),
        cmocka_unit_test(tp_cut_refused),
        cmocka_unit_test(plan_refusals),
        cmocka_unit_test(shape_checked_at_finalize),
        cmocka_unit_test(via_plugin_file),
        cmocka_unit_test(online_gptq_ragged),
        cmocka_unit_test(online_u8_per_channel),
        cmocka_unit_test(online_f16_group64),
        cmocka_unit_test(online_tp_k_shards),
        cmocka_unit_test(online_nan_rolls_back),
        cmocka_unit_test(online_refusals),
        cmocka_unit_test(online_via_plugin_file),
        cmocka_unit_test(batch_load_many),
        cmocka_unit_test(batch_bad_module_named),
    };
    return cmocka_run_group_tests_name("formats-int4", tests, NULL, NULL);
}
