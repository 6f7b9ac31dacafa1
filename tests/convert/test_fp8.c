/* refitctl convert --format fp8, every scheme, from BF16, F16 and F32
 * weights (ragged 128-blocks included): the converted file equals
 * quant_ref.py's numpy/ml_dtypes quantization bit for bit; the fp8 plugin
 * loads it (serialized, DIRECT) into exactly the bytes its online path
 * (STAGED, post-load) makes from the original checkpoint: the same
 * kernels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/convert/cvutil.h"
#include "tests/formats/common/qutil.h"
#include "tests/common/pyref.h"

extern const refit_format_v2 refit_format_plugin_v2;

static const char *const schemes[3] = {"per_tensor", "per_channel", "block128"};

#define QP "model.layers.0.self_attn.q_proj"
#define DP "model.layers.0.mlp.down_proj"
#define OP "model.layers.0.self_attn.o_proj"

/* Reference sets: a (BF16 300x330, specials), b (F16 130x200), c (F32
 * 64x96, specials). */
typedef struct refs {
    st_set *a, *b, *c;
} refs;

static void refs_open(refs *r)
{
    r->a = q_ref("quant_ref.py", "--n 300 --k 330 --specials --seed 4 --prefix a");
    r->b = q_ref("quant_ref.py", "--n 130 --k 200 --dtype f16 --seed 5 --prefix b");
    r->c = q_ref("quant_ref.py", "--n 64 --k 96 --dtype f32 --specials --seed 6 --prefix c");
}

static void refs_close(refs *r)
{
    st_close(r->a);
    st_close(r->b);
    st_close(r->c);
}

/* The checkpoint: three linear weights and an embedding (kept). */
static void write_input(const char *path, const refs *r)
{
    st_out_tensor t[4] = {
        cv_from("model.embed_tokens.weight", q_get(r->c, "c.x")),
        cv_from(QP ".weight", q_get(r->a, "a.x")),
        cv_from(DP ".weight", q_get(r->b, "b.x")),
        cv_from(OP ".weight", q_get(r->c, "c.x")),
    };
    static const char *const meta[] = {"format", "pt"};
    cv_write(path, t, 4, meta, 1);
}

/* Same bytes (the reference stores E4M3 codes as U8, a per-tensor scale
 * as [1, 1]). */
static void assert_bytes(const st_tensor *want, const st_tensor *got)
{
    assert_int_equal(want->nbytes, got->nbytes);
    q_assert_bytes(want->data, got->data, (size_t)want->nbytes, got->name);
}

static void check_refs(const st_set *conv, const refs *r, int sch)
{
    const st_set *sets[3] = {r->a, r->b, r->c};
    const char *pfx[3] = {QP, DP, OP}, *ref[3] = {"a", "b", "c"};
    char name[160];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s.fp8.%s.q", ref[i], schemes[sch]);
        const st_tensor *q = q_get(sets[i], name);
        snprintf(name, sizeof name, "%s.fp8.%s.s", ref[i], schemes[sch]);
        const st_tensor *s = q_get(sets[i], name);
        snprintf(name, sizeof name, "%s.weight", pfx[i]);
        const st_tensor *cq = cv_get(conv, name);
        assert_int_equal(cq->dtype, ST_F8_E4M3);
        assert_bytes(q, cq);
        snprintf(name, sizeof name, "%s.%s", pfx[i],
                 sch == 2 ? "weight_scale_inv" : "weight_scale");
        const st_tensor *cs = cv_get(conv, name);
        assert_int_equal(cs->dtype, ST_F32);
        assert_int_equal(cs->ndim, sch == 0 ? 1 : 2);
        assert_bytes(s, cs);
    }
}

static void fp8_scheme(const char *dir, const refs *r, int sch)
{
    char in[4200], out[4200], param[64];
    cv_join(in, sizeof in, dir, "in.safetensors");
    cv_join(out, sizeof out, dir, "out.safetensors");
    snprintf(param, sizeof param, "scheme=%s", schemes[sch]);
    cv_convert_ok("fp8", param, in, out);
    st_set *orig = cv_open(in), *conv = cv_open(out);
    assert_int_equal(st_count(conv), 7);
    cv_assert_same(cv_get(orig, "model.embed_tokens.weight"),
                   cv_get(conv, "model.embed_tokens.weight"));
    check_refs(conv, r, sch);
    /* serialized block-128 modules declare their extents: every one of
     * these is ragged (formats-fp8.md, "Ragged blocks") */
    static const char *const blk[3] = {"in_features: 330\nout_features: 300",
                                       "in_features: 200\nout_features: 130",
                                       "in_features: 96\nout_features: 64"};
    const char *pfx[3] = {QP, DP, OP}, *sfx = sch == 2 ? "weight_scale_inv" : "weight_scale";
    char w[3][160], s[3][160], onl[32];
    cv_pair p[3];
    snprintf(onl, sizeof onl, "scheme: %s", schemes[sch]);
    for (int i = 0; i < 3; i++) {
        snprintf(w[i], sizeof w[i], "%s.weight", pfx[i]);
        snprintf(s[i], sizeof s[i], "%s.%s", pfx[i], sfx);
        p[i] = (cv_pair){w[i], w[i], s[i], sch == 2 ? blk[i] : NULL, onl};
    }
    cv_same_kernels(&refit_format_plugin_v2, conv, orig, p, 3);
    st_close(conv);
    st_close(orig);
}

static void fp8_all_schemes(void **state)
{
    refs r;
    char in[4200];
    refs_open(&r);
    write_input(cv_join(in, sizeof in, *state, "in.safetensors"), &r);
    for (int sch = 0; sch < 3; sch++)
        fp8_scheme(*state, &r, sch);
    refs_close(&r);
}

/* Without --param scheme the converter takes the plugin's online default,
 * per_tensor, and says so in the metadata. */
static void fp8_default_scheme(void **state)
{
    refs r;
    char in[4200], out[4200];
    refs_open(&r);
    write_input(cv_join(in, sizeof in, *state, "in.safetensors"), &r);
    cv_convert_ok("fp8", NULL, in, cv_join(out, sizeof out, *state, "out.safetensors"));
    st_set *conv = cv_open(out);
    check_refs(conv, &r, 0);
    assert_string_equal(st_metadata_get(conv, 0, "quantization_params"),
                        "scheme=per_tensor;skip=embed,lm_head,norm,.gate.weight");
    st_close(conv);
    refs_close(&r);
}

/* ---- fused q/k/v from a converted sharded checkpoint ---- */

#define L0 "model.layers.0.self_attn."

static void qkv_expect(tw *w, const st_set *s, const char *name, const char *target,
                       int64_t at)
{
    const st_tensor *t = cv_get(s, name);
    refit_ckpt_spec sp = tt_spec(st_dtype_to_refit(t->dtype), t->ndim, t->shape);
    sp.target = target;
    sp.dst_offset[0] = at;
    int rc = tw_expect(w, "qkv", name, &sp);
    if (rc)
        fail_msg("expect %s: %s: %s", name, refit_status_name(rc), refit_errmsg(w->ctx));
}

/* Module qkv: runtime weight [128, 64] E4M3 and its scale, fed q (64 rows),
 * k and v (32 each) stacked along N; with scales (serialized) each
 * per-tensor scale at its slot of a [3] runtime scale, per-channel scales
 * at their weight's rows. */
static void qkv_world(tw *w, const st_set *s, int sch, int serialized)
{
    static const char *const part[3] = {"q_proj", "k_proj", "v_proj"};
    static const int64_t row[3] = {0, 64, 96};
    char name[96];
    assert_int_equal(tw_open(w, NULL), REFIT_OK);
    assert_int_equal(refit_format_register(w->ctx, &refit_format_plugin_v2), REFIT_OK);
    tw_module(w, "qkv", "fp8", sch ? "scheme: per_channel" : "scheme: per_tensor");
    tw_runtime(w, "qkv", "weight", Q_E4M3, 2, TT_SHAPE(128, 64));
    if (sch)
        tw_runtime(w, "qkv", "weight_scale", REFIT_F32, 2, TT_SHAPE(128, 1));
    else
        tw_runtime(w, "qkv", "weight_scale", REFIT_F32, 1, TT_SHAPE(3));
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, L0 "%s.weight", part[i]);
        qkv_expect(w, s, name, "weight", row[i]);
        snprintf(name, sizeof name, L0 "%s.weight_scale", part[i]);
        if (serialized)
            qkv_expect(w, s, name, "weight_scale", sch ? row[i] : i);
    }
    tw_seal(w);
}

/* The sharded tiny-llama fixture, converted; its layer-0 q/k/v loaded
 * fused, serialized, equal the same fused online: per-tensor (one scale
 * per shard, the serialized convention, against online slots per weight)
 * and per-channel. */
static void fused_qkv_from_fixture(void **state)
{
    static const char *const w3[3] = {L0 "q_proj.weight", L0 "k_proj.weight",
                                      L0 "v_proj.weight"};
    static const char *const ws[6] = {L0 "q_proj.weight", L0 "k_proj.weight",
                                      L0 "v_proj.weight", L0 "q_proj.weight_scale",
                                      L0 "k_proj.weight_scale", L0 "v_proj.weight_scale"};
    const char *root = getenv("REFIT_SOURCE_ROOT");
    char in[4200], out[4200];
    if (!root)
        fail_msg("REFIT_SOURCE_ROOT is not set: run the tests through meson");
    snprintf(in, sizeof in, "%s/tests/data/hf-tiny-llama-sharded", root);
    cv_join(out, sizeof out, *state, "tiny.safetensors");
    for (int sch = 0; sch < 2; sch++) {
        tw ser, onl;
        cv_convert_ok("fp8", sch ? "scheme=per_channel" : "scheme=per_tensor", in, out);
        st_set *orig = cv_open(in), *conv = cv_open(out);
        qkv_world(&ser, conv, sch, 1);
        qkv_world(&onl, orig, sch, 0);
        cv_update(&ser, conv, ws, 6);
        cv_update(&onl, orig, w3, 3);
        const tt_tensor *a = tw_rt(&ser, "qkv", "weight"), *b = tw_rt(&onl, "qkv", "weight");
        q_assert_bytes(b->buf, a->buf, a->bytes, "fused weight");
        a = tw_rt(&ser, "qkv", "weight_scale");
        b = tw_rt(&onl, "qkv", "weight_scale");
        q_assert_bytes(b->buf, a->buf, a->bytes, "fused weight_scale");
        tw_close(&ser);
        tw_close(&onl);
        st_close(conv);
        st_close(orig);
    }
}

int main(void)
{
    pyref_skip_without_venv();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(fp8_all_schemes, cv_setup, cv_teardown),
        cmocka_unit_test_setup_teardown(fp8_default_scheme, cv_setup, cv_teardown),
        cmocka_unit_test_setup_teardown(fused_qkv_from_fixture, cv_setup, cv_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
