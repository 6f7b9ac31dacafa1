/* refitctl convert as a command: which tensors are quantized and which are
 * copied (byte for byte, every dtype and rank), the metadata kept and
 * added, the skip list, a sharded input directory, every refusal (one
 * line naming file, tensor and reason, exit 1, no OUT written), usage
 * errors (exit 2), and the refitctl binary itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cast.h"
#include "tests/convert/cvutil.h"

#define QW "model.layers.0.self_attn.q_proj.weight"
#define NT 11

/* A checkpoint of every kind of tensor the converter meets; one of them
 * (q_proj) is quantized by default. The tensors live as long as the world. */
typedef struct ckpt {
    tt_tensor *t[NT];
    const char *name[NT];
    st_dtype dt[NT];
} ckpt;

static void add(ckpt *c, int i, const char *name, st_dtype dt, int ndim, const int64_t *shape,
                tt_tensor *t)
{
    c->name[i] = name;
    c->dt[i] = dt;
    c->t[i] = t ? t : tt_new(st_dtype_to_refit(dt), ndim, shape);
    if (dt == ST_BF16 || dt == ST_F16 || dt == ST_F32)
        tt_fill(c->t[i], tt_hash_str(name));
    else /* integers and bools (0 or 1: a reader may check) */
        for (size_t b = 0; b < c->t[i]->bytes; b++)
            ((unsigned char *)c->t[i]->buf)[b] = (unsigned char)((b * 7 + (size_t)i) &
                                                                 (dt == ST_BOOL ? 1 : 0xff));
}

static void make(tw *w, ckpt *c)
{
    static const int64_t s12x8[] = {12, 8}, s16x64[] = {16, 64}, s16[] = {16}, s64[] = {64},
                         s2x4x64[] = {2, 4, 64}, s4x64[] = {4, 64}, s4[] = {4}, s1x5[] = {1, 5},
                         s3[] = {3};
    add(c, 0, "model.embed_tokens.weight", ST_BF16, 2, s12x8, NULL);
    add(c, 1, QW, ST_BF16, 2, s16x64, NULL);
    add(c, 2, "model.layers.0.self_attn.q_proj.bias", ST_BF16, 1, s16, NULL);
    add(c, 3, "model.layers.0.input_layernorm.weight", ST_F32, 1, s64, NULL);
    add(c, 4, "model.layers.0.mlp.experts.weight", ST_BF16, 3, s2x4x64, NULL);
    add(c, 5, "model.layers.0.mlp.gate.weight", ST_BF16, 2, s4x64, NULL);
    add(c, 6, "lm_head.weight", ST_F16, 2, s12x8, NULL);
    add(c, 7, "model.rotary_emb.inv_freq", ST_F32, 1, s4, NULL);
    add(c, 8, "model.position_ids", ST_I64, 2, s1x5, NULL);
    add(c, 9, "model.layers.0.attn.softmax_scale", ST_F32, 0, s4, NULL);
    add(c, 10, "model.mask", ST_BOOL, 1, s3, NULL);
    for (int i = 0; i < NT; i++)
        tw_adopt(w, c->t[i]);
}

static void write_ckpt(const ckpt *c, const char *path, int from, int to,
                       const char *const *meta, size_t n_meta)
{
    st_out_tensor t[NT];
    for (int i = from; i < to; i++)
        t[i - from] = (st_out_tensor){c->name[i], c->dt[i], c->t[i]->t.ndim, c->t[i]->t.shape,
                                      c->t[i]->buf};
    cv_write(path, t, (size_t)(to - from), meta, n_meta);
}

/* Every input tensor except the quantized ones is in the output, the same
 * dtype, shape and bytes. */
static void assert_copied(const st_set *in, const st_set *out, const char *const *quantized)
{
    for (size_t i = 0; i < st_count(in); i++) {
        const st_tensor *t = st_tensor_at(in, i);
        int q = 0;
        for (int k = 0; quantized[k]; k++)
            q |= !strcmp(quantized[k], t->name);
        if (!q)
            cv_assert_same(t, cv_get(out, t->name));
    }
}

static void copies_and_metadata(void **state)
{
    static const char *const fmts[4] = {"fp8", "int8", "mxfp8", "mxfp4"};
    static const char *const scale[4] = {"model.layers.0.self_attn.q_proj.weight_scale",
                                         "model.layers.0.self_attn.q_proj.weight_scale",
                                         "model.layers.0.self_attn.q_proj.weight_scale_inv",
                                         "model.layers.0.self_attn.q_proj.weight_scale"};
    static const char *const meta[] = {"format", "pt", "quantized_by", "someone else"};
    static const char *const only_q[] = {QW, NULL};
    tw w;
    ckpt c;
    char in[4200], out[4200];
    assert_int_equal(tw_open(&w, NULL), REFIT_OK);
    make(&w, &c);
    write_ckpt(&c, cv_join(in, sizeof in, *state, "in.safetensors"), 0, NT, meta, 2);
    st_set *orig = cv_open(in);
    for (int f = 0; f < 4; f++) {
        cv_convert_ok(fmts[f], NULL, in, cv_join(out, sizeof out, *state, "out.safetensors"));
        st_set *conv = cv_open(out);
        assert_int_equal(st_count(conv), NT + 1);
        assert_copied(orig, conv, only_q);
        assert_non_null(cv_get(conv, scale[f]));
        assert_string_equal(st_metadata_get(conv, 0, "format"), "pt");
        assert_string_equal(st_metadata_get(conv, 0, "quantized_by"), "refit");
        assert_string_equal(st_metadata_get(conv, 0, "quantization_format"), fmts[f]);
        assert_non_null(strstr(st_metadata_get(conv, 0, "quantization_params"),
                               "skip=embed,lm_head,norm,.gate.weight"));
        st_close(conv);
    }
    st_close(orig);
    tw_close(&w);
}

/* skip= (empty) quantizes every 2-D float *.weight, embeddings and the
 * router too; a skip list keeps what it names. */
static void skip_list(void **state)
{
    static const char *const all[] = {"model.embed_tokens.weight", QW,
                                      "model.layers.0.mlp.gate.weight", "lm_head.weight", NULL};
    static const char *const none[] = {NULL};
    tw w;
    ckpt c;
    char in[4200], out[4200];
    assert_int_equal(tw_open(&w, NULL), REFIT_OK);
    make(&w, &c);
    write_ckpt(&c, cv_join(in, sizeof in, *state, "in.safetensors"), 0, NT, NULL, 0);
    cv_join(out, sizeof out, *state, "out.safetensors");
    st_set *orig = cv_open(in);
    cv_convert_ok("fp8", "skip=", in, out);
    st_set *conv = cv_open(out);
    assert_int_equal(st_count(conv), NT + 4);
    assert_copied(orig, conv, all);
    for (int i = 0; all[i]; i++)
        assert_int_equal(cv_get(conv, all[i])->dtype, ST_F8_E4M3);
    assert_string_equal(st_metadata_get(conv, 0, "quantization_params"),
                        "scheme=per_tensor;skip=");
    st_close(conv);
    cv_convert_ok("mxfp8", "skip=embed,q_proj,lm_head,.gate.", in, out);
    conv = cv_open(out);
    assert_int_equal(st_count(conv), NT);
    assert_copied(orig, conv, none);
    st_close(conv);
    st_close(orig);
    tw_close(&w);
}

/* A sharded directory (index + two shards) becomes one file holding every
 * tensor; the shards' metadata merge (the first shard wins a conflict). */
static void sharded_input(void **state)
{
    static const char *const m1[] = {"format", "pt", "who", "shard 1"};
    static const char *const m2[] = {"format", "pt", "who", "shard 2", "extra", "x"};
    static const char *const q[] = {QW, "model.layers.0.mlp.gate.weight", NULL};
    tw w;
    ckpt c;
    char p1[4200], p2[4200], ix[4200], out[4200], json[4096];
    assert_int_equal(tw_open(&w, NULL), REFIT_OK);
    make(&w, &c);
    write_ckpt(&c, cv_join(p1, sizeof p1, *state, "model-00001-of-00002.safetensors"), 0, 5, m1,
               2);
    write_ckpt(&c, cv_join(p2, sizeof p2, *state, "model-00002-of-00002.safetensors"), 5, NT,
               m2, 3);
    size_t k = (size_t)snprintf(json, sizeof json, "{\"metadata\": {}, \"weight_map\": {");
    for (int i = 0; i < NT; i++)
        k += (size_t)snprintf(json + k, sizeof json - k, "%s\"%s\": \"model-0000%d-of-00002."
                              "safetensors\"", i ? ", " : "", c.name[i], i < 5 ? 1 : 2);
    snprintf(json + k, sizeof json - k, "}}");
    FILE *f = fopen(cv_join(ix, sizeof ix, *state, ST_INDEX_NAME), "w");
    assert_non_null(f);
    assert_true(fputs(json, f) >= 0);
    assert_int_equal(fclose(f), 0);
    cv_convert_ok("int8", "skip=embed,lm_head", *state,
                  cv_join(out, sizeof out, *state, "converted.safetensors"));
    st_set *orig = cv_open(*state), *conv = cv_open(out);
    assert_int_equal(st_file_count(orig), 2);
    assert_int_equal(st_file_count(conv), 1);
    assert_int_equal(st_count(conv), NT + 2);
    assert_copied(orig, conv, q);
    assert_int_equal(cv_get(conv, "model.layers.0.mlp.gate.weight")->dtype, ST_I8);
    assert_string_equal(st_metadata_get(conv, 0, "who"), "shard 1");
    assert_string_equal(st_metadata_get(conv, 0, "extra"), "x");
    st_close(conv);
    st_close(orig);
    tw_close(&w);
}

/* Tensor data need not be aligned (safetensors packs tensors back to
 * back): an F32 weight 3 bytes into the data converts to the same bytes
 * as an aligned one (and UBSan sees no misaligned load). */
static void misaligned_input(void **state)
{
    static const char *const fmts[4] = {"fp8", "int8", "mxfp8", "mxfp4"};
    static const char *const vals[4] = {"l.weight", "l.weight", "l.weight", "l.weight_packed"};
    static const char *const scs[4] = {"l.weight_scale", "l.weight_scale", "l.weight_scale_inv",
                                       "l.weight_scale"};
    tw w;
    char a[4200], m[4200], oa[4200], om[4200];
    assert_int_equal(tw_open(&w, NULL), REFIT_OK);
    tt_tensor *x = tw_tmp(&w, REFIT_F32, 2, TT_SHAPE(5, 70));
    tt_tensor *mask = tw_tmp(&w, (refit_dtype){REFIT_DTYPE_BOOL, 8, 1}, 1, TT_SHAPE(3));
    tt_fill(x, 11);
    memset(mask->buf, 1, mask->bytes);
    st_out_tensor t[2] = {{"a.mask", ST_BOOL, 1, mask->t.shape, mask->buf},
                          {"l.weight", ST_F32, 2, x->t.shape, x->buf}};
    cv_write(cv_join(a, sizeof a, *state, "aligned.safetensors"), t + 1, 1, NULL, 0);
    cv_write(cv_join(m, sizeof m, *state, "misaligned.safetensors"), t, 2, NULL, 0);
    cv_join(oa, sizeof oa, *state, "oa.safetensors");
    cv_join(om, sizeof om, *state, "om.safetensors");
    for (int f = 0; f < 4; f++) {
        cv_convert_ok(fmts[f], NULL, a, oa);
        cv_convert_ok(fmts[f], NULL, m, om);
        st_set *sa = cv_open(oa), *sm = cv_open(om);
        cv_assert_same(cv_get(sa, vals[f]), cv_get(sm, vals[f]));
        cv_assert_same(cv_get(sa, scs[f]), cv_get(sm, scs[f]));
        st_close(sa);
        st_close(sm);
    }
    st_set *in = cv_open(m);
    assert_int_equal(cv_get(in, "l.weight")->offset % 4, 3);
    st_close(in);
    tw_close(&w);
}

/* ---- refusals ---- */

/* One converter run that must be refused: exit 1, one line holding every
 * given substring, and no OUT left behind. */
static void refused(const char *dir, const char *const *args, const char *const *want)
{
    char out[4200], *err = NULL, *a[12] = {NULL};
    int n = 0;
    cv_join(out, sizeof out, dir, "refused.safetensors");
    for (; args[n]; n++)
        a[n] = !strcmp(args[n], "OUT") ? out : (char *)args[n];
    int rc = cv_convert(&err, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
                        a[10], a[11]);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", err);
    free(err);
    if (rc != 1)
        fail_msg("exit %d, want 1 (%s)", rc, msg);
    const char *nl = strchr(msg, '\n');
    if (!nl || nl[1])
        fail_msg("want one line on stderr, got: %s", msg);
    for (int i = 0; want[i]; i++)
        if (!strstr(msg, want[i]))
            fail_msg("stderr lacks '%s': %s", want[i], msg);
    struct stat st;
    assert_int_equal(stat(out, &st), -1);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A checkpoint holding one [4, 40] weight of dtype dt named `name`, maybe
 * with a NaN or an infinity in it, plus extra (a name) as F32 [1]. */
static void small(tw *w, const char *path, const char *name, st_dtype dt, float poison,
                  const char *extra)
{
    tt_tensor *t = tw_tmp(w, st_dtype_to_refit(dt), 2, TT_SHAPE(4, 40));
    tt_tensor *x = tw_tmp(w, REFIT_F32, 1, TT_SHAPE(1));
    if (dt == ST_BF16 || dt == ST_F16 || dt == ST_F32)
        tt_fill(t, 3);
    else
        memset(t->buf, 1, t->bytes);
    if (poison != 0.0f)
        tt_set_flat(t, 77, poison);
    tt_fill(x, 4);
    st_out_tensor o[2] = {{name, dt, 2, t->t.shape, t->buf}, {extra, ST_F32, 1, x->t.shape,
                                                             x->buf}};
    cv_write(path, o, extra ? 2 : 1, NULL, 0);
}

static void refusals_input(void **state)
{
    const char *dir = *state;
    char in[4200], i8[4200], nan[4200], inf[4200], dup[4200], mx[4200], dirout[4200];
    tw w;
    assert_int_equal(tw_open(&w, NULL), REFIT_OK);
    small(&w, cv_join(in, sizeof in, dir, "in.safetensors"), "l.weight", ST_BF16, 0.0f, NULL);
    small(&w, cv_join(i8, sizeof i8, dir, "i8.safetensors"), "l.weight", ST_I8, 0.0f, NULL);
    small(&w, cv_join(nan, sizeof nan, dir, "nan.safetensors"), "l.weight", ST_BF16,
          kern_bf16_to_f32(0x7fc0), NULL);
    small(&w, cv_join(inf, sizeof inf, dir, "inf.safetensors"), "l.weight", ST_F16,
          kern_f16_to_f32(0xfc00), NULL);
    small(&w, cv_join(dup, sizeof dup, dir, "dup.safetensors"), "l.weight", ST_F32, 0.0f,
          "l.weight_scale");
    small(&w, cv_join(mx, sizeof mx, dir, "mx.safetensors"), "l.weight", ST_F32, 0.0f,
          "l.weight_packed");
    refused(dir, ARGS("--format", "fp8", i8, "OUT"), ARGS(i8, "tensor 'l.weight'", "dtype I8",
                                                          "BF16, F16 or F32", "skip"));
    refused(dir, ARGS("--format", "mxfp4", nan, "OUT"),
            ARGS(nan, "tensor 'l.weight'", "NaN or infinity"));
    refused(dir, ARGS("--format", "int8", inf, "OUT"),
            ARGS(inf, "tensor 'l.weight'", "NaN or infinity"));
    refused(dir, ARGS("--format", "fp8", dup, "OUT"),
            ARGS(dup, "tensor 'l.weight'", "scales", "already"));
    refused(dir, ARGS("--format", "mxfp4", mx, "OUT"),
            ARGS(mx, "tensor 'l.weight'", "values", "already"));
    /* fp8 block-128 names its scale weight_scale_inv: no clash there */
    char *err = NULL;
    assert_int_equal(cv_convert(&err, "--format", "fp8", "--param", "scheme=block128", dup,
                                cv_join(dirout, sizeof dirout, dir, "ok.safetensors"),
                                (char *)NULL), 0);
    free(err);
    refused(dir, ARGS("--format", "fp8", "no/such/file.safetensors", "OUT"),
            ARGS("no/such/file.safetensors"));
    refused(dir, ARGS("--format", "fp8", in, in), ARGS(in, "is a file of the input"));
    refused(dir, ARGS("--format", "fp8", in, dir), ARGS(dir, "is a directory"));
    tw_close(&w);
}

static void refusals_format(void **state)
{
    const char *dir = *state;
    char in[4200];
    tw w;
    assert_int_equal(tw_open(&w, NULL), REFIT_OK);
    small(&w, cv_join(in, sizeof in, dir, "in.safetensors"), "l.weight", ST_BF16, 0.0f, NULL);
    refused(dir, ARGS("--format", "fp9", in, "OUT"), ARGS("unknown format 'fp9'", "fp8"));
    refused(dir, ARGS("--format", "nvfp4", in, "OUT"),
            ARGS("format nvfp4", "plugins/nvfp4/quant_nvfp4.h", "kern_quant_nvfp4"));
    refused(dir, ARGS("--format", "int4", in, "OUT"),
            ARGS("format int4", "plugins/int4/quant_int4.h", "kern_quant_int4"));
    refused(dir, ARGS("--format", "fp8", "--param", "scheme=per_row", in, "OUT"),
            ARGS("scheme is 'per_row'", "per_tensor|per_channel|block128"));
    refused(dir, ARGS("--format", "int8", "--param", "scheme=block128", in, "OUT"),
            ARGS("format int8", "'block128'", "per_tensor|per_channel"));
    refused(dir, ARGS("--format", "mxfp8", "--param", "scheme=per_tensor", in, "OUT"),
            ARGS("format mxfp8 takes no param 'scheme'", "skip"));
    refused(dir, ARGS("--format", "fp8", "--param", "group=128", in, "OUT"),
            ARGS("takes no param 'group'"));
    refused(dir, ARGS("--format", "fp8", "--param", "skip=a", "--param", "skip=b", in, "OUT"),
            ARGS("param skip given twice"));
    refused(dir, ARGS("--format", "fp8", "--param", "scheme=block128", "--param",
                      "scheme=block128", in, "OUT"), ARGS("param scheme given twice"));
    tw_close(&w);
}

/* Usage errors: exit 2 with the usage text; -h: exit 0. */
static void usage(void **state)
{
    (void)state;
    static const char *const bad[][6] = {
        {NULL},
        {"in", "out", NULL},
        {"--format", NULL},
        {"--format", "fp8", "in", NULL},
        {"--format", "fp8", "in", "out", "more", NULL},
        {"--format", "fp8", "--format", "int8", "in", "out"},
        {"--format", "fp8", "--param", "scheme", "in", "out"},
        {"--format", "fp8", "--param", "=x", "in", "out"},
        {"--format", "fp8", "--frobnicate", "in", "out", NULL},
        {"--format", "fp8", "in", "out", "--param", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *err = NULL, *a[6];
        for (int k = 0; k < 6; k++)
            a[k] = (char *)bad[i][k];
        int rc = cv_convert(&err, a[0], a[1], a[2], a[3], a[4], a[5], (char *)NULL);
        if (rc != 2 || !strstr(err, "usage: refitctl convert"))
            fail_msg("case %zu: exit %d: %s", i, rc, err);
        free(err);
    }
    char *err = NULL;
    assert_int_equal(cv_convert(&err, "--help", (char *)NULL), 0);
    assert_string_equal(err, "");
    free(err);
}

/* The area is registered in refitctl and behaves the same there. */
static void refitctl_binary(void **state)
{
    const char *root = getenv("REFIT_BUILD_ROOT");
    char ctl[4200], in[4200], out[4200], cmd[16384], line[512];
    tw w;
    if (!root)
        fail_msg("REFIT_BUILD_ROOT is not set: run the tests through meson");
    snprintf(ctl, sizeof ctl, "%s/tools/refitctl", root);
    assert_int_equal(tw_open(&w, NULL), REFIT_OK);
    small(&w, cv_join(in, sizeof in, *state, "in.safetensors"), "l.weight", ST_BF16, 0.0f,
          NULL);
    cv_join(out, sizeof out, *state, "out.safetensors");
    snprintf(cmd, sizeof cmd, "'%s' convert --format fp8 --param scheme=per_channel '%s' '%s'",
             ctl, in, out);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_non_null(fgets(line, sizeof line, p));
    assert_int_equal(pclose(p), 0);
    assert_non_null(strstr(line, "1 weight quantized to fp8 (scheme=per_channel;"));
    st_set *conv = cv_open(out);
    assert_int_equal(cv_get(conv, "l.weight_scale")->shape[0], 4);
    st_close(conv);
    snprintf(cmd, sizeof cmd, "'%s' convert --format nvfp4 '%s' '%s' 2>/dev/null", ctl, in, out);
    assert_int_equal(WEXITSTATUS(system(cmd)), 1);
    snprintf(cmd, sizeof cmd, "'%s' convert 2>/dev/null", ctl);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof cmd, "'%s' --help | grep -q '^  convert '", ctl);
    assert_int_equal(system(cmd), 0);
    tw_close(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(copies_and_metadata, cv_setup, cv_teardown),
        cmocka_unit_test_setup_teardown(skip_list, cv_setup, cv_teardown),
        cmocka_unit_test_setup_teardown(sharded_input, cv_setup, cv_teardown),
        cmocka_unit_test_setup_teardown(misaligned_input, cv_setup, cv_teardown),
        cmocka_unit_test_setup_teardown(refusals_input, cv_setup, cv_teardown),
        cmocka_unit_test_setup_teardown(refusals_format, cv_setup, cv_teardown),
        cmocka_unit_test_setup_teardown(usage, cv_setup, cv_teardown),
        cmocka_unit_test_setup_teardown(refitctl_binary, cv_setup, cv_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
