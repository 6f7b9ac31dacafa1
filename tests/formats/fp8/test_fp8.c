/* Format fp8: serialized E4M3 checkpoints (DIRECT) and online BF16 -> E4M3
 * (STAGED + post-load), against quant_ref.py's numpy/ml_dtypes statement of
 * the same arithmetic; reload equals cold start; reloading the same weights
 * leaves the same bytes; ragged shapes; TP shards with their scales; fused
 * q/k/v; stacked experts; the refusals. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cast.h"
#include "plugins/fp8/quant_fp8.h"
#include "tests/formats/common/qutil.h"
#include "tests/common/pyref.h"

extern const refit_format_v2 refit_format_plugin_v2;

#define MOD "layers.0.qkv"

static const char *const schemes[3] = {"per_tensor", "per_channel", "block128"};

#define PLUGIN (&refit_format_plugin_v2)

static const void *ref_data(const st_set *s, const char *fmt, const char *scheme)
{
    char name[96];
    snprintf(name, sizeof name, fmt, scheme);
    return q_get(s, name)->data;
}

/* ---- serialized ---- */

/* A serialized module over set s for a scheme: W.weight (E4M3) and its
 * scale, plus an input_scale. Returns the seal status. */
static int build_serialized(tw *w, const st_set *s, int sch, int64_t n, int64_t k,
                            const char *params, q_ent *e, const q_tp *tp, int64_t rn,
                            int64_t rk)
{
    static char src_q[64], src_s[64];
    snprintf(src_q, sizeof src_q, "t.fp8.%s.q", schemes[sch]);
    snprintf(src_s, sizeof src_s, "t.fp8.%s.s", schemes[sch]);
    e[0] = (q_ent){"W.weight", src_q, "weight", 1, 0, 0, 0, 0, 0, -1};
    e[1] = (q_ent){sch == 2 ? "W.weight_scale_inv" : "W.weight_scale", src_s, "weight_scale",
                 0, sch == 0, sch == 0 ? -1 : 0, 0, 0, 0, -1};
    e[2] = (q_ent){"W.input_scale", "t.fp8.per_tensor.s", "input_scale", 0, 1, -1, 0, 0, 0, -1};
    int64_t ss[2];
    kern_fp8_scale_shape((kern_fp8_scheme)sch, rn ? rn : n, rk ? rk : k, ss);
    tw_module(w, MOD, "fp8", params);
    tw_runtime(w, MOD, "weight", Q_E4M3, 2, TT_SHAPE(rn ? rn : n, rk ? rk : k));
    if (sch == 0)
        tw_runtime(w, MOD, "weight_scale", REFIT_F32, 1, TT_SHAPE(1));
    else
        tw_runtime(w, MOD, "weight_scale", REFIT_F32, 2, TT_SHAPE(ss[0], ss[1]));
    tw_runtime(w, MOD, "input_scale", REFIT_F32, 1, TT_SHAPE(1));
    return q_expect_seal(w, MOD, s, e, 3, tp);
}

/* build_serialized as a q_module's build, for the whole-world steps. */
typedef struct serialized_args {
    int sch;
    int64_t n, k;
    const char *params;
} serialized_args;

static int build_serialized_module(tw *w, const st_set *s, const q_module *m)
{
    const serialized_args *a = m->arg;
    return build_serialized(w, s, a->sch, a->n, a->k, a->params, m->e, NULL, 0, 0);
}

static void serialized_schemes(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 300 --k 330 --specials --seed 4");
    for (int sch = 0; sch < 3; sch++) {
        tw w;
        q_ent e[3];
        q_world(&w, PLUGIN);
        const char *p = sch == 2 ? "in_features: 330\nout_features: 300" : NULL;
        assert_int_equal(build_serialized(&w, s, sch, 300, 330, p, e, NULL, 0, 0), REFIT_OK);
        refit_model_stats st;
        assert_int_equal(refit_model_stats_get(w.m, &st), REFIT_OK);
        assert_int_equal(st.routes_direct, 3);
        assert_int_equal(st.routes_staged, 0);
        q_update(&w, s, e, 3, "v1");
        q_assert_rt(&w, MOD, "weight", ref_data(s, "t.fp8.%s.q", schemes[sch]), 300 * 330);
        int64_t ss[2];
        kern_fp8_scale_shape((kern_fp8_scheme)sch, 300, 330, ss);
        q_assert_rt(&w, MOD, "weight_scale", ref_data(s, "t.fp8.%s.s", schemes[sch]),
                  sizeof(float) * (size_t)(ss[0] * ss[1]));
        q_assert_rt(&w, MOD, "input_scale", ref_data(s, "t.fp8.%s.s", "per_tensor"), 4);
        tw_close(&w);
    }
    st_close(s);
}

/* A ragged block-128 extent is either whole or a cut shard: without the
 * unsharded extents the plan cannot tell, and refuses. */
static void serialized_ragged_needs_extent(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 300 --k 256 --seed 4");
    tw w;
    q_ent e[3];
    q_world(&w, PLUGIN);
    assert_int_equal(build_serialized(&w, s, 2, 300, 256, NULL, e, NULL, 0, 0), REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "W.weight_scale_inv", "not a whole number of 128-blocks",
                  "out_features");
    tw_close(&w);
    st_close(s);
    s = q_ref("quant_ref.py", "--n 256 --k 256 --seed 4");
    q_world(&w, PLUGIN);
    assert_int_equal(build_serialized(&w, s, 2, 256, 256, "scheme: per_channel", e, NULL, 0, 0),
                     REFIT_EMISMATCH);
    tw_assert_msg(&w, MOD, "param scheme is per_channel", "block128");
    tw_close(&w);
    st_close(s);
}

/* Reload B over A equals a cold start on B; reloading B again changes no
 * byte. For every scheme. */
static void serialized_reload_equals_cold(void **state)
{
    (void)state;
    for (int sch = 0; sch < 3; sch++) {
        q_ent e[3];
        serialized_args sa = {sch, 256, 200, sch == 2 ? "in_features: 200" : NULL};
        q_module m = q_entries_module(PLUGIN, build_serialized_module, e, 3, &sa);
        uint64_t fp[2];
        q_assert_reload_equals_cold(&m, "--n 256 --k 200 --seed 1", "--n 256 --k 200 --seed 2", fp);
        assert_true(fp[0] != fp[1]);
    }
}

/* Column-parallel shards: weight rows and their per-channel / block scale
 * rows shard together; row-parallel block shards cut K at block edges. */
static void serialized_tp_shards(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 512 --k 512 --seed 6");
    const uint8_t *q[3];
    const float *sc[3];
    for (int sch = 0; sch < 3; sch++) {
        q[sch] = ref_data(s, "t.fp8.%s.q", schemes[sch]);
        sc[sch] = ref_data(s, "t.fp8.%s.s", schemes[sch]);
    }
    for (int sch = 1; sch < 3; sch++)
        for (int rank = 0; rank < 2; rank++) {
            tw w;
            q_ent e[3];
            q_tp tp = {2, rank};
            q_world(&w, PLUGIN);
            assert_int_equal(build_serialized(&w, s, sch, 512, 512, NULL, e, &tp, 256, 0),
                             REFIT_OK);
            q_update(&w, s, e, 3, "v1");
            q_assert_rt(&w, MOD, "weight", q[sch] + rank * 256 * 512, 256 * 512);
            size_t sb = sch == 1 ? 256 * 4 : 2 * 4 * 4;
            q_assert_rt(&w, MOD, "weight_scale", sch == 1 ? sc[1] + rank * 256 : sc[2] + rank * 8,
                      sb);
            tw_close(&w);
        }
    /* row-parallel: K split, the block scale split along its columns */
    for (int rank = 0; rank < 2; rank++) {
        tw w;
        q_ent e[3];
        q_tp tp = {2, rank};
        q_world(&w, PLUGIN);
        tw_module(&w, MOD, "fp8", "in_features: 512\nout_features: 512");
        tt_tensor *wt = tw_runtime(&w, MOD, "weight", Q_E4M3, 2, TT_SHAPE(512, 256));
        tt_tensor *st = tw_runtime(&w, MOD, "weight_scale", REFIT_F32, 2, TT_SHAPE(4, 2));
        e[0] = (q_ent){"W.weight", "t.fp8.block128.q", "weight", 1, 0, 1, 0, 0, 0, -1};
        e[1] = (q_ent){"W.weight_scale_inv", "t.fp8.block128.s", "weight_scale", 0, 0, 1, 0, 0,
                     0, -1};
        assert_int_equal(q_expect(&w, MOD, s, e, 2, &tp), REFIT_OK);
        tw_seal(&w);
        q_update(&w, s, e, 2, "v1");
        const uint8_t *got = wt->buf;
        const float *gs = st->buf;
        for (int i = 0; i < 512; i++)
            assert_memory_equal(got + i * 256, q[2] + i * 512 + rank * 256, 256);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 2; j++)
                assert_true(gs[i * 2 + j] == sc[2][i * 4 + rank * 2 + j]);
        tw_close(&w);
    }
    st_close(s);
}

/* A shard boundary inside a 128-row block is refused at seal. */
static void serialized_tp_cut_refused(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 384 --k 128 --seed 6");
    for (int rank = 0; rank < 2; rank++) {
        tw w;
        q_ent e[3];
        q_tp tp = {2, rank};
        q_world(&w, PLUGIN);
        assert_int_equal(build_serialized(&w, s, 2, 384, 128, "out_features: 384", e, &tp, 192,
                                          0),
                         REFIT_EMISMATCH);
        tw_assert_msg(&w, MOD, "W.weight_scale_inv", "a shard boundary cuts a 128-block");
        tw_close(&w);
    }
    st_close(s);
}

/* q, k, v with their own per-tensor scales fused into one runtime weight
 * and a runtime scale of one entry per shard. */
static void serialized_fused_per_tensor(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 320 --k 64 --seed 8");
    /* each shard's codes and scale from its own per-tensor reference */
    static const char *const names[3] = {"q", "k", "v"};
    int64_t rows[3] = {128, 128, 64}, off[3] = {0, 128, 256};
    st_set *part[3];
    q_ent e[6];
    char wn[3][32], sn[3][32], args[96];
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "--n %lld --k 64 --seed %d", (long long)rows[i], 20 + i);
        part[i] = q_ref("quant_ref.py", args);
        snprintf(wn[i], sizeof wn[i], "%s_proj.weight", names[i]);
        snprintf(sn[i], sizeof sn[i], "%s_proj.weight_scale", names[i]);
    }
    tw w;
    q_world(&w, PLUGIN);
    tw_module(&w, MOD, "fp8", "scheme: per_tensor");
    tt_tensor *wt = tw_runtime(&w, MOD, "weight", Q_E4M3, 2, TT_SHAPE(320, 64));
    tt_tensor *st = tw_runtime(&w, MOD, "weight_scale", REFIT_F32, 1, TT_SHAPE(3));
    for (int i = 0; i < 3; i++) {
        q_ent we = {wn[i], "t.fp8.per_tensor.q", "weight", 1, 0, -1, 0, 0, off[i], -1};
        q_ent se = {sn[i], "t.fp8.per_tensor.s", "weight_scale", 0, 1, -1, 0, 0, i, -1};
        assert_int_equal(q_expect(&w, MOD, part[i], &we, 1, NULL), REFIT_OK);
        assert_int_equal(q_expect(&w, MOD, part[i], &se, 1, NULL), REFIT_OK);
        e[2 * i] = we;
        e[2 * i + 1] = se;
    }
    tw_seal(&w);
    refit_txn *t = tw_begin(&w, "v1", 1);
    for (int i = 0; i < 6; i++) {
        int64_t shape[REFIT_MAX_DIMS];
        refit_tensor d = q_ent_desc(part[i / 2], &e[i], shape);
        assert_int_equal(refit_load(t, e[i].name, &d, NULL), REFIT_OK);
    }
    assert_int_equal(refit_finalize(t), REFIT_OK);
    for (int i = 0; i < 3; i++) {
        q_assert_bytes(ref_data(part[i], "t.fp8.%s.q", "per_tensor"),
                       (uint8_t *)wt->buf + off[i] * 64, (size_t)(rows[i] * 64), "fused q");
        q_assert_bytes(ref_data(part[i], "t.fp8.%s.s", "per_tensor"), (float *)st->buf + i, 4,
                       "fused scale");
        st_close(part[i]);
    }
    tw_close(&w);
    st_close(s);
}

/* compressed-tensors writes scales in the model's dtype: a BF16 per-channel
 * scale is cast (exactly) into the F32 runtime scale. */
static void serialized_bf16_scale(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 64 --k 96 --seed 22");
    const float *sc = q_get(s, "t.fp8.per_channel.s")->data;
    uint16_t b[64];
    float want[64];
    for (int i = 0; i < 64; i++) {
        b[i] = kern_f32_to_bf16(sc[i]);
        want[i] = kern_bf16_to_f32(b[i]);
    }
    q_ent we = {"W.weight", "t.fp8.per_channel.q", "weight", 1, 0, -1, 0, 0, 0, -1};
    tw w;
    q_world(&w, PLUGIN);
    tw_module(&w, MOD, "fp8", "scheme: per_channel");
    tw_runtime(&w, MOD, "weight", Q_E4M3, 2, TT_SHAPE(64, 96));
    tw_runtime(&w, MOD, "weight_scale", REFIT_F32, 2, TT_SHAPE(64, 1));
    assert_int_equal(q_expect(&w, MOD, s, &we, 1, NULL), REFIT_OK);
    refit_ckpt_spec sp = tt_spec(REFIT_BF16, 2, TT_SHAPE(64, 1));
    sp.target = "weight_scale";
    assert_int_equal(tw_expect(&w, MOD, "W.weight_scale", &sp), REFIT_OK);
    tw_seal(&w);
    refit_txn *t = tw_begin(&w, "v1", 1);
    int64_t shape[REFIT_MAX_DIMS], sshape[2] = {64, 1};
    refit_tensor d = q_ent_desc(s, &we, shape);
    assert_int_equal(refit_load(t, "W.weight", &d, NULL), REFIT_OK);
    refit_tensor ds = {.data = b, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 2,
                       .dtype = REFIT_BF16, .shape = sshape};
    assert_int_equal(refit_load(t, "W.weight_scale", &ds, NULL), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    q_assert_rt(&w, MOD, "weight_scale", want, sizeof want);
    tw_close(&w);
    st_close(s);
}

/* ---- online ---- */

/* Runtime tensors of an online module: weight [n, k] (or [e, n, k]) and a
 * scale of `slots` entries (per-tensor) or the scheme's grid. */
static void online_runtime(tw *w, int sch, int64_t e, int64_t n, int64_t k, int64_t slots)
{
    int64_t ss[2];
    kern_fp8_scale_shape((kern_fp8_scheme)sch, n, k, ss);
    if (e > 1)
        tw_runtime(w, MOD, "weight", Q_E4M3, 3, TT_SHAPE(e, n, k));
    else
        tw_runtime(w, MOD, "weight", Q_E4M3, 2, TT_SHAPE(n, k));
    if (sch == 0)
        tw_runtime(w, MOD, "weight_scale", REFIT_F32, 1, TT_SHAPE(slots));
    else if (e > 1)
        tw_runtime(w, MOD, "weight_scale", REFIT_F32, 3, TT_SHAPE(e, ss[0], ss[1]));
    else
        tw_runtime(w, MOD, "weight_scale", REFIT_F32, 2, TT_SHAPE(ss[0], ss[1]));
}

static const char *scheme_param(int sch)
{
    static const char *const p[3] = {"scheme: per_tensor\nonline: true",
                                     "scheme: per_channel", "scheme: block128"};
    return p[sch];
}

/* A sealed online module of scheme sch (runtime as online_runtime makes
 * it) expecting entries e[0, n) of s. */
static void seal_online(tw *w, int sch, int64_t experts, int64_t rn, int64_t k, int64_t slots,
                        const st_set *s, const q_ent *e, int n, const q_tp *tp)
{
    tw_module(w, MOD, "fp8", scheme_param(sch));
    online_runtime(w, sch, experts, rn, k, slots);
    assert_int_equal(q_expect(w, MOD, s, e, n, tp), REFIT_OK);
    tw_seal(w);
}

/* seal_online of a single [n, k] weight as a q_module's build. */
typedef struct online_args {
    int sch;
    int64_t n, k;
} online_args;

static int build_online_module(tw *w, const st_set *s, const q_module *m)
{
    const online_args *a = m->arg;
    seal_online(w, a->sch, 1, a->n, a->k, 1, s, m->e, m->n, NULL);
    return REFIT_OK;
}

/* One BF16 weight [n, k] quantized at post-load, every scheme. */
static void online_schemes(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 300 --k 330 --specials --seed 12");
    q_ent e = {"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1};
    for (int sch = 0; sch < 3; sch++) {
        tw w;
        q_world(&w, PLUGIN);
        seal_online(&w, sch, 1, 300, 330, 1, s, &e, 1, NULL);
        refit_model_stats st;
        assert_int_equal(refit_model_stats_get(w.m, &st), REFIT_OK);
        assert_int_equal(st.routes_staged, 1);
        q_update(&w, s, &e, 1, "v1");
        q_assert_rt(&w, MOD, "weight", ref_data(s, "t.fp8.%s.q", schemes[sch]), 300 * 330);
        int64_t ss[2];
        kern_fp8_scale_shape((kern_fp8_scheme)sch, 300, 330, ss);
        q_assert_rt(&w, MOD, "weight_scale", ref_data(s, "t.fp8.%s.s", schemes[sch]),
                  sizeof(float) * (size_t)(ss[0] * ss[1]));
        tw_close(&w);
    }
    st_close(s);
}

/* Online reload: B over A equals a cold start on B, and B again changes
 * no byte (post-load reads staged checkpoint bytes only). */
static void online_reload_equals_cold(void **state)
{
    (void)state;
    q_ent e = {"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1};
    for (int sch = 0; sch < 3; sch++) {
        online_args oa = {sch, 200, 260};
        q_module m = q_entries_module(PLUGIN, build_online_module, &e, 1, &oa);
        uint64_t fp[2];
        q_assert_reload_equals_cold(&m, "--n 200 --k 260 --seed 13 --specials",
                                    "--n 200 --k 260 --seed 14", fp);
        assert_true(fp[0] != fp[1]);
    }
}

/* Bytes where two n-byte arrays differ. */
static size_t bytes_differ(const uint8_t *a, const uint8_t *b, size_t n)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += a[i] != b[i];
    return d;
}

/* An online [n, k] module of scheme sch and param arithmetic (NULL: not
 * given) loaded from s: its runtime weight and scale equal P.fp8.<sch>.<qname>
 * and P.fp8.<sch>.s of the reference. */
static void online_arith_case(const refit_format_v2 *plugin, const st_set *s, int sch,
                              int64_t n, int64_t k, const char *arith, const char *qname)
{
    q_ent e = {"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1};
    char params[96], qn[32];
    snprintf(params, sizeof params, "scheme: %s%s%s", schemes[sch],
             arith ? "\narithmetic: " : "", arith ? arith : "");
    snprintf(qn, sizeof qn, "t.fp8.%%s.%s", qname);
    tw w;
    q_world(&w, plugin);
    tw_module(&w, MOD, "fp8", params);
    online_runtime(&w, sch, 1, n, k, 1);
    assert_int_equal(q_expect(&w, MOD, s, &e, 1, NULL), REFIT_OK);
    tw_seal(&w);
    q_update(&w, s, &e, 1, "v1");
    q_assert_rt(&w, MOD, "weight", ref_data(s, qn, schemes[sch]), (size_t)(n * k));
    int64_t ss[2];
    kern_fp8_scale_shape((kern_fp8_scheme)sch, n, k, ss);
    q_assert_rt(&w, MOD, "weight_scale", ref_data(s, "t.fp8.%s.s", schemes[sch]),
                sizeof(float) * (size_t)(ss[0] * ss[1]));
    tw_close(&w);
}

/* Param arithmetic: reciprocal is vLLM's x * (1 / scale) (quant_ref.py's
 * .rq, its own numpy statement of it). On a [2048, 1024] per-channel BF16
 * weight it gives other bytes than divide (the default, also when named),
 * and exactly the reference's; every scheme, and the edge cases of
 * --specials (zero rows and tiles, subnormal groups whose reciprocal
 * overflows, values at the E4M3 limit). */
static void online_arithmetic(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 2048 --k 1024 --seed 28");
    size_t nk = (size_t)2048 * 1024;
    size_t d = bytes_differ(ref_data(s, "t.fp8.%s.q", "per_channel"),
                            ref_data(s, "t.fp8.%s.rq", "per_channel"), nk);
    print_message("# per-channel [2048, 1024] bf16: %zu bytes differ between divide and "
                  "reciprocal\n", d);
    assert_true(d > 0);
    online_arith_case(PLUGIN, s, 1, 2048, 1024, "reciprocal", "rq");
    online_arith_case(PLUGIN, s, 1, 2048, 1024, "divide", "q");
    online_arith_case(PLUGIN, s, 1, 2048, 1024, NULL, "q");
    st_close(s);
    s = q_ref("quant_ref.py", "--n 300 --k 330 --specials --seed 29");
    for (int sch = 0; sch < 3; sch++) {
        online_arith_case(PLUGIN, s, sch, 300, 330, "reciprocal", "rq");
        online_arith_case(PLUGIN, s, sch, 300, 330, "divide", "q");
    }
    st_close(s);
}

/* Quantize rows [r0, r0 + n) of the set's x with the kernel (itself
 * checked against numpy in test-quant-kernels). */
static void kernel_quant(const st_set *s, int64_t r0, int64_t n, int sch, uint8_t *q,
                         float *sc)
{
    refit_view x = q_view(q_get(s, "t.x"));
    int64_t k = x.shape[1], ss[2];
    x.data = (char *)x.data + (size_t)(r0 * k) * 2;
    x.shape[0] = n;
    kern_fp8_scale_shape((kern_fp8_scheme)sch, n, k, ss);
    refit_view qv = q_buf_view(q, Q_E4M3, n, k), sv = q_buf_view(sc, REFIT_F32, ss[0], ss[1]);
    assert_int_equal(kern_quant_fp8(&qv, &sv, &x, (kern_fp8_scheme)sch), REFIT_OK);
}

/* q (128 rows), k (128) and v (64) of one BF16 matrix fused into one
 * runtime weight: per-channel and block-128 equal the whole matrix's
 * quantization; per-tensor keeps one scale per shard, or one for all
 * (amax over every shard) when the runtime scale has one entry. */
static void online_fused(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 320 --k 200 --seed 15 --specials");
    q_ent e[3] = {{"q_proj.weight", "t.x", "weight", 0, 0, -1, 0, 128, 0, -1},
                {"k_proj.weight", "t.x", "weight", 0, 0, -1, 128, 128, 128, -1},
                {"v_proj.weight", "t.x", "weight", 0, 0, -1, 256, 64, 256, -1}};
    for (int v = 0; v < 4; v++) { /* per-tensor x3, per-tensor x1, per-channel, block */
        int sch = v < 2 ? 0 : v - 1;
        tw w;
        q_world(&w, PLUGIN);
        seal_online(&w, sch, 1, 320, 200, v == 0 ? 3 : 1, s, e, 3, NULL);
        q_update(&w, s, e, 3, "v1");
        if (v == 0) {
            uint8_t *q = malloc(128 * 200);
            float sc;
            assert_non_null(q);
            for (int i = 0; i < 3; i++) {
                kernel_quant(s, e[i].row0, e[i].rows, 0, q, &sc);
                q_assert_bytes(q, (uint8_t *)tw_rt(&w, MOD, "weight")->buf + e[i].row0 * 200,
                               (size_t)(e[i].rows * 200), "shard codes");
                q_assert_bytes(&sc, (float *)tw_rt(&w, MOD, "weight_scale")->buf + i, 4,
                               "shard scale");
            }
            free(q);
        } else {
            int64_t ss[2];
            kern_fp8_scale_shape((kern_fp8_scheme)sch, 320, 200, ss);
            q_assert_rt(&w, MOD, "weight", ref_data(s, "t.fp8.%s.q", schemes[sch]), 320 * 200);
            q_assert_rt(&w, MOD, "weight_scale", ref_data(s, "t.fp8.%s.s", schemes[sch]),
                      sizeof(float) * (size_t)(ss[0] * ss[1]));
        }
        tw_close(&w);
    }
    st_close(s);
}

/* TP: each rank quantizes its own slice (per-tensor amax of the slice,
 * its own block grid), as a cold start on that rank does. */
static void online_tp(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 301 --k 140 --seed 16");
    q_ent e = {"W.weight", "t.x", "weight", 0, 0, 0, 0, 0, 0, -1};
    uint8_t *q = malloc(151 * 140);
    float sc[151 * 2];
    assert_non_null(q);
    for (int sch = 0; sch < 3; sch++)
        for (int rank = 0; rank < 2; rank++) {
            int64_t lo, hi, ss[2];
            q_shard(301, 2, rank, &lo, &hi);
            kern_fp8_scale_shape((kern_fp8_scheme)sch, hi - lo, 140, ss);
            tw w;
            q_tp tp = {2, rank};
            q_world(&w, PLUGIN);
            seal_online(&w, sch, 1, hi - lo, 140, 1, s, &e, 1, &tp);
            q_update(&w, s, &e, 1, "v1");
            kernel_quant(s, lo, hi - lo, sch, q, sc);
            q_assert_rt(&w, MOD, "weight", q, (size_t)((hi - lo) * 140));
            q_assert_rt(&w, MOD, "weight_scale", sc, sizeof(float) * (size_t)(ss[0] * ss[1]));
            tw_close(&w);
        }
    free(q);
    st_close(s);
}

/* Stacked experts [E, N, K]: one per-tensor scale per expert, or the
 * per-channel / block grid of each expert. */
static void online_experts(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 256 --k 96 --seed 17");
    q_ent e[2] = {{"experts.0.w1.weight", "t.x", "weight", 0, 0, -1, 0, 128, 0, 0},
                {"experts.1.w1.weight", "t.x", "weight", 0, 0, -1, 128, 128, 0, 1}};
    uint8_t *q = malloc(128 * 96);
    float sc[128];
    assert_non_null(q);
    for (int sch = 0; sch < 3; sch++) {
        tw w;
        q_world(&w, PLUGIN);
        seal_online(&w, sch, 2, 128, 96, 2, s, e, 2, NULL);
        q_update(&w, s, e, 2, "v1");
        int64_t ss[2];
        kern_fp8_scale_shape((kern_fp8_scheme)sch, 128, 96, ss);
        for (int x = 0; x < 2; x++) {
            kernel_quant(s, x * 128, 128, sch, q, sc);
            q_assert_bytes(q, (uint8_t *)tw_rt(&w, MOD, "weight")->buf + x * 128 * 96,
                           128 * 96, "expert codes");
            q_assert_bytes(sc, (float *)tw_rt(&w, MOD, "weight_scale")->buf + x * ss[0] * ss[1],
                           sizeof(float) * (size_t)(ss[0] * ss[1]), "expert scales");
        }
        tw_close(&w);
    }
    free(q);
    st_close(s);
}

/* A NaN in an online weight fails the update, naming module and tensor;
 * with rollback the worker keeps its previous bytes. */
static void online_nan_refused(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 8 --k 16 --seed 18");
    q_ent e = {"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1};
    tw w;
    q_world(&w, PLUGIN);
    seal_online(&w, 1, 1, 8, 16, 1, s, &e, 1, NULL);
    q_update(&w, s, &e, 1, "v1");
    uint16_t bad[8 * 16];
    memcpy(bad, q_get(s, "t.x")->data, sizeof bad);
    bad[37] = kern_f32_to_bf16(NAN);
    refit_tensor d = q_desc(q_get(s, "t.x"));
    d.data = bad;
    q_assert_nonfinite_refused(&w, MOD, "W.weight", &d);
    tw_close(&w);
    st_close(s);
}

/* ---- refusals at seal ---- */

typedef struct bad_case {
    const char *what;
    const char *params;
    q_ent e[3];
    int n;
    int rt;             /* 0 online runtime per-tensor [1]; 1 bf16 weight; 2 [5] scale */
    const char *msg;
} bad_case;

static void seal_refusals(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 16 --k 32 --seed 19");
    static const bad_case cases[] = {
        {"orphan scale", NULL, {{"W.weight", "t.fp8.per_tensor.q", "weight", 1, 0, -1, 0, 0, 0, -1},
          {"W.weight_scale", "t.fp8.per_tensor.s", "weight_scale", 0, 1, -1, 0, 0, 0, -1},
          {"X.weight_scale", "t.fp8.per_tensor.s", "weight_scale", 0, 1, -1, 0, 0, 0, -1}},
         3, 0, "no X.weight in the module"},
        {"missing scale", NULL, {{"W.weight", "t.fp8.per_tensor.q", "weight", 1, 0, -1, 0, 0, 0,
                                  -1}}, 1, 0, "needs its W.weight_scale"},
        {"online with a checkpoint scale", NULL, {{"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0,
                                                   -1},
          {"W.weight_scale", "t.fp8.per_tensor.s", "weight_scale", 0, 1, -1, 0, 0, 0, -1}},
         2, 0, "computes its scales"},
        {"online param disagrees", "online: false", {{"W.weight", "t.x", "weight", 0, 0, -1, 0, 0,
                                                      0, -1}}, 1, 0, "param online is false"},
        {"unknown scheme", "scheme: per_group", {{"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0,
                                                  -1}}, 1, 0, "per_group"},
        {"unknown arithmetic", "arithmetic: multiply", {{"W.weight", "t.x", "weight", 0, 0, -1,
                                                         0, 0, 0, -1}}, 1, 0,
         "param arithmetic is 'multiply'; format fp8 takes divide or reciprocal"},
        {"unknown tensor", NULL, {{"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1},
          {"W.bias", "t.fp8.per_tensor.s", "weight_scale", 0, 1, -1, 0, 0, 0, -1}},
         2, 0, "W.bias"},
        {"runtime weight not e4m3", NULL, {{"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1}}, 1,
         1, "f8_e4m3"},
        {"per-tensor slots", NULL, {{"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1}}, 1, 2,
         "holds 5 scales"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        tw w;
        q_world(&w, PLUGIN);
        tw_module(&w, MOD, "fp8", c->params);
        tw_runtime(&w, MOD, "weight", c->rt == 1 ? REFIT_BF16 : Q_E4M3, 2, TT_SHAPE(16, 32));
        tw_runtime(&w, MOD, "weight_scale", REFIT_F32, 1, TT_SHAPE(c->rt == 2 ? 5 : 1));
        q_assert_seal_refused(&w, MOD, s, c->e, c->n, c->what, c->msg);
        tw_close(&w);
    }
    st_close(s);
}

/* The built plugin (refit-fmt-fp8.so found on the build's plugin path)
 * and its declaration fp8.yaml agree with the plans it makes: serialized
 * and online modules seal and load through it. */
static void plugin_declaration_agrees(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 256 --k 128 --seed 21");
    for (int online = 0; online < 2; online++) {
        tw w;
        q_ent e[3];
        q_world(&w, NULL);
        if (online) {
            e[0] = (q_ent){"W.weight", "t.x", "weight", 0, 0, -1, 0, 0, 0, -1};
            seal_online(&w, 2, 1, 256, 128, 1, s, e, 1, NULL);
        } else {
            assert_int_equal(build_serialized(&w, s, 2, 256, 128, NULL, e, NULL, 0, 0),
                             REFIT_OK);
        }
        q_update(&w, s, e, online ? 1 : 3, "v1");
        q_assert_rt(&w, MOD, "weight", ref_data(s, "t.fp8.%s.q", "block128"), 256 * 128);
        tw_close(&w);
    }
    /* the declaration takes param arithmetic, and refuses other values naming it */
    online_arith_case(NULL, s, 2, 256, 128, "reciprocal", "rq");
    tw w;
    q_world(&w, NULL);
    assert_int_equal(refit_model_add_module(w.m, MOD, "fp8", "arithmetic: multiply"),
                     REFIT_EINVAL);
    print_message("# %s\n", refit_errmsg(w.ctx));
    assert_non_null(strstr(refit_errmsg(w.ctx), "parameter arithmetic of format fp8: "
                                                "'multiply'"));
    tw_close(&w);
    st_close(s);
}

int main(void)
{
    pyref_skip_without_venv();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(serialized_schemes),
        cmocka_unit_test(serialized_ragged_needs_extent),
        cmocka_unit_test(serialized_reload_equals_cold),
        cmocka_unit_test(serialized_tp_shards),
        cmocka_unit_test(serialized_tp_cut_refused),
        cmocka_unit_test(serialized_fused_per_tensor),
        cmocka_unit_test(serialized_bf16_scale),
        cmocka_unit_test(online_schemes),
        cmocka_unit_test(online_reload_equals_cold),
        cmocka_unit_test(online_arithmetic),
        cmocka_unit_test(online_fused),
        cmocka_unit_test(online_tp),
        cmocka_unit_test(online_experts),
        cmocka_unit_test(online_nan_refused),
        cmocka_unit_test(seal_refusals),
        cmocka_unit_test(plugin_declaration_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
