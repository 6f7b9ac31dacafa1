/* tools/demo/demo.yaml describes exactly the model tools/refit-demo.c
 * builds in C. Both are built here (the C one as the demo builds it: same
 * modules, runtime tensors, expectations, in the same order), then
 * compared: every route and module of the two plans is the same, and after
 * loading the same weights, twice, the bytes are the same
 * (refit_model_fingerprint, and every runtime tensor byte for byte). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/model.h"
#include "putil.h"

#define VOCAB 1000
#define VOCAB_PAD 1024
#define HIDDEN 256
#define KV 128
#define INTER 512
#define LAYERS 4
#define TP 2
#define RANK 0
#define MAX_RT 48
#define MAX_CK 64

typedef struct rt_t {
    char module[64], name[32];
    int64_t shape[2];
    refit_tensor t;
} rt_t;

typedef struct ck_t {
    char name[96], module[64];
    refit_ckpt_spec spec;
} ck_t;

typedef struct worker {
    refit_ctx *ctx;
    refit_model *m;
    rt_t rt[MAX_RT];
    int n_rt;
    ck_t ck[MAX_CK];
    int n_ck;
} worker;

/* ---- the demo's model, in C, as tools/refit-demo.c builds it ---- */

static void add_rt(worker *w, const char *mod, const char *name, int ndim, int64_t d0,
                   int64_t d1, refit_dtype dt)
{
    rt_t *r = &w->rt[w->n_rt++];
    snprintf(r->module, sizeof r->module, "%s", mod);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->shape[0] = d0;
    r->shape[1] = d1;
    size_t n = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    void *data = calloc(n, dt.bits / 8);
    assert_non_null(data);
    r->t = (refit_tensor){data, {REFIT_DEVICE_CPU, 0}, ndim, dt, r->shape, NULL, 0};
}

static ck_t *expect(worker *w, const char *mod, const char *name, int ndim, int64_t d0,
                    int64_t d1)
{
    ck_t *c = &w->ck[w->n_ck++];
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->module, sizeof c->module, "%s", mod);
    refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
    s.dtype = REFIT_BF16;
    s.ndim = ndim;
    s.shape[0] = d0;
    s.shape[1] = d1;
    c->spec = s;
    return c;
}

static void shard(ck_t *c, int dim, const char *target, int64_t offset)
{
    c->spec.shard_dim = dim;
    c->spec.shard_rank = RANK;
    c->spec.shard_count = TP;
    c->spec.target = target;
    c->spec.dst_offset[0] = offset;
}

static void layer(worker *w, int l)
{
    char mod[64], n[96];
    snprintf(mod, sizeof mod, "layers.%d.attn", l);
    add_rt(w, mod, "qkv", 2, (HIDDEN + 2 * KV) / TP, HIDDEN, REFIT_BF16);
    add_rt(w, mod, "o", 2, HIDDEN, HIDDEN / TP, REFIT_BF16);
    const char *qkv[3] = {"q_proj", "k_proj", "v_proj"};
    int64_t rows[3] = {HIDDEN, KV, KV}, off = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.weight", l, qkv[i]);
        shard(expect(w, mod, n, 2, rows[i], HIDDEN), 0, "qkv", off);
        off += rows[i] / TP;
    }
    snprintf(n, sizeof n, "model.layers.%d.self_attn.o_proj.weight", l);
    shard(expect(w, mod, n, 2, HIDDEN, HIDDEN), 1, "o", 0);
    snprintf(mod, sizeof mod, "layers.%d.mlp", l);
    add_rt(w, mod, "gate_up", 2, 2 * INTER / TP, HIDDEN, REFIT_BF16);
    add_rt(w, mod, "down", 2, HIDDEN, INTER / TP, REFIT_BF16);
    snprintf(n, sizeof n, "model.layers.%d.mlp.gate_proj.weight", l);
    shard(expect(w, mod, n, 2, INTER, HIDDEN), 0, "gate_up", 0);
    snprintf(n, sizeof n, "model.layers.%d.mlp.up_proj.weight", l);
    shard(expect(w, mod, n, 2, INTER, HIDDEN), 0, "gate_up", INTER / TP);
    snprintf(n, sizeof n, "model.layers.%d.mlp.down_proj.weight", l);
    shard(expect(w, mod, n, 2, HIDDEN, INTER), 1, "down", 0);
    snprintf(mod, sizeof mod, "layers.%d.norms", l);
    add_rt(w, mod, "input", 1, HIDDEN, 0, REFIT_F32);
    add_rt(w, mod, "post_attention", 1, HIDDEN, 0, REFIT_F32);
    snprintf(n, sizeof n, "model.layers.%d.input_layernorm.weight", l);
    expect(w, mod, n, 1, HIDDEN, 0)->spec.target = "input";
    snprintf(n, sizeof n, "model.layers.%d.post_attention_layernorm.weight", l);
    expect(w, mod, n, 1, HIDDEN, 0)->spec.target = "post_attention";
}

/* The demo's tensors, in its order (modules in the order it adds them). */
static void demo_tensors(worker *w)
{
    add_rt(w, "embed", "table", 2, VOCAB_PAD, HIDDEN, REFIT_BF16);
    expect(w, "embed", "model.embed_tokens.weight", 2, VOCAB, HIDDEN)->spec.pad_to = VOCAB_PAD;
    expect(w, "embed", "lm_head.weight", 2, VOCAB, HIDDEN)->spec.tie_of =
        "model.embed_tokens.weight";
    for (int l = 0; l < LAYERS; l++)
        layer(w, l);
    add_rt(w, "norm", "weight", 1, HIDDEN, 0, REFIT_F32);
    expect(w, "norm", "model.norm.weight", 1, HIDDEN, 0);
}

static void worker_open(worker *w)
{
    memset(w, 0, sizeof *w);
    refit_options o = REFIT_OPTIONS_INIT;
    o.rank = RANK;
    PT_RC(NULL, refit_open(&w->ctx, &o), REFIT_OK);
    PT_RC(w->ctx, refit_model_create(&w->m, w->ctx), REFIT_OK);
    demo_tensors(w);
}

static void build_in_c(worker *w)
{
    worker_open(w);
    const char *last = "";
    for (int i = 0; i < w->n_rt; i++) {
        rt_t *r = &w->rt[i];
        if (strcmp(r->module, last)) { /* the demo adds a module before its tensors */
            int cast = r->t.dtype.code == REFIT_DTYPE_FLOAT;
            PT_RC(w->ctx, refit_model_add_module(w->m, r->module, "unquantized",
                                                 cast ? "cast: true" : NULL), REFIT_OK);
            last = r->module;
        }
        PT_RC(w->ctx, refit_module_bind_runtime(w->m, r->module, r->name, &r->t), REFIT_OK);
    }
    for (int i = 0; i < w->n_ck; i++)
        PT_RC(w->ctx, refit_model_expect(w->m, w->ck[i].module, w->ck[i].name, &w->ck[i].spec),
              REFIT_OK);
    PT_RC(w->ctx, refit_model_seal(w->m), REFIT_OK);
}

static void build_from_manifest(worker *w)
{
    worker_open(w);
    const char *path = pt_fmt("%s/tools/demo/demo.yaml", pt_env("REFIT_SOURCE_ROOT"));
    PT_RC(w->ctx, refit_model_load_manifest(w->m, path), REFIT_OK);
    for (int i = 0; i < w->n_rt; i++) /* the engine binds what the manifest declares */
        PT_RC(w->ctx, refit_module_bind_runtime(w->m, w->rt[i].module, w->rt[i].name,
                                                &w->rt[i].t), REFIT_OK);
    PT_RC(w->ctx, refit_model_seal(w->m), REFIT_OK);
}

static void worker_close(worker *w)
{
    refit_close(w->ctx);
    for (int i = 0; i < w->n_rt; i++)
        free(w->rt[i].t.data);
}

/* ---- the plans ---- */

/* A view as offset from its target's first byte, shape and strides. */
static void same_view(const refit_view *a, const char *abase, const refit_view *b,
                      const char *bbase, const char *what, const char *name)
{
    if (a->ndim < 0 && b->ndim < 0)
        return;
    if ((const char *)a->data - abase != (const char *)b->data - bbase || a->ndim != b->ndim ||
        a->dtype.code != b->dtype.code || a->dtype.bits != b->dtype.bits ||
        memcmp(a->shape, b->shape, sizeof a->shape) ||
        memcmp(a->strides, b->strides, sizeof a->strides))
        fail_msg("%s of %s differs between the C model and the manifest's", what, name);
}

static void same_route(const refit_model *A, const route *a, const refit_model *B, const route *b)
{
    const tensor_reg *ta = &A->runtime[a->target], *tb = &B->runtime[b->target];
    assert_string_equal(A->modules[a->module].name, B->modules[b->module].name);
    assert_string_equal(ta->name, tb->name);
    assert_int_equal(a->kind, b->kind);
    assert_int_equal(a->flags, b->flags);
    assert_int_equal(a->split_dim, b->split_dim);
    assert_int_equal(a->lo, b->lo);
    assert_int_equal(a->hi, b->hi);
    assert_int_equal(a->len, b->len);
    assert_int_equal(a->bytes, b->bytes);
    assert_int_equal(a->staged_bytes, b->staged_bytes);
    assert_int_equal(!a->tie_name, !b->tie_name);
    if (a->tie_name)
        assert_string_equal(a->tie_name, b->tie_name);
    const refit_ckpt_spec *x = &a->spec, *y = &b->spec;
    assert_int_equal(x->ndim, y->ndim);
    assert_memory_equal(x->shape, y->shape, sizeof x->shape);
    assert_int_equal(x->dtype.code, y->dtype.code);
    assert_int_equal(x->shard_count > 1 ? x->shard_dim : -1, y->shard_count > 1 ? y->shard_dim : -1);
    assert_int_equal(x->shard_count > 1 ? x->shard_rank : 0, y->shard_count > 1 ? y->shard_rank : 0);
    assert_int_equal(x->shard_count > 1 ? x->shard_count : 1, y->shard_count > 1 ? y->shard_count : 1);
    assert_int_equal(x->pad_to, y->pad_to);
    assert_int_equal(x->expert, y->expert);
    assert_memory_equal(x->dst_offset, y->dst_offset, sizeof x->dst_offset);
    if (a->flags & ROUTE_ALIAS) { /* a tied name has no placement of its own */
        assert_string_equal(A->routes[a->tie].name, B->routes[b->tie].name);
        return;
    }
    same_view(&a->dst, ta->view.data, &b->dst, tb->view.data, "the destination", a->name);
    if (a->flags & ROUTE_HAS_PAD)
        same_view(&a->pad, ta->view.data, &b->pad, tb->view.data, "the pad", a->name);
}

static void same_plan(const refit_model *A, const refit_model *B)
{
    assert_memory_equal(&A->stats, &B->stats, sizeof A->stats);
    assert_int_equal(A->n_modules, B->n_modules);
    assert_int_equal(A->n_routes, B->n_routes);
    assert_int_equal(A->n_runtime, B->n_runtime);
    for (uint32_t i = 0; i < A->n_modules; i++) {
        const module *ma = &A->modules[i];
        uint32_t j = names_find(&B->module_names, ma->name);
        assert_int_not_equal(j, NAMES_NONE);
        const module *mb = &B->modules[j];
        assert_ptr_equal(ma->fmt, mb->fmt); /* the same plugin, loaded once */
        assert_int_equal(ma->fm.flags, mb->fm.flags);
        assert_int_equal(ma->n_runtime, mb->n_runtime);
        assert_int_equal(ma->n_primary, mb->n_primary);
        assert_int_equal(ma->staged_bytes, mb->staged_bytes);
        assert_int_equal(params_bool(&ma->params, "cast"), params_bool(&mb->params, "cast"));
        for (uint32_t k = 0; k < ma->n_runtime; k++)
            assert_string_equal(A->runtime[ma->runtime[k]].name, B->runtime[mb->runtime[k]].name);
    }
    for (uint32_t i = 0; i < A->n_routes; i++) {
        uint32_t j = names_find(&B->route_names, A->routes[i].name);
        if (j == NAMES_NONE)
            fail_msg("the manifest's model does not expect %s", A->routes[i].name);
        same_route(A, &A->routes[i], B, &B->routes[j]);
    }
}

/* ---- the weights ---- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill(uint16_t *out, size_t n, const char *version, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = version; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    for (size_t i = 0; i < n; i++)
        out[i] = (uint16_t)(0x3c00u + (mix64(h + i) & 0x7ffu) - 0x400u); /* finite bf16 */
}

static void load_version(worker *w, const char *version)
{
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = version;
    refit_txn *t;
    PT_RC(w->ctx, refit_begin(&t, w->m, &uo), REFIT_OK);
    for (int i = 0; i < w->n_ck; i++) {
        ck_t *c = &w->ck[i];
        size_t n = (size_t)c->spec.shape[0] * (size_t)(c->spec.ndim == 2 ? c->spec.shape[1] : 1);
        uint16_t *data = malloc(n * 2);
        assert_non_null(data);
        fill(data, n, version, c->spec.tie_of ? c->spec.tie_of : c->name);
        refit_tensor src = {data, {REFIT_DEVICE_CPU, 0}, c->spec.ndim, REFIT_BF16,
                            c->spec.shape, NULL, 0};
        int rc = refit_load(t, c->name, &src, NULL);
        free(data);
        if (rc)
            fail_msg("load %s: %s", c->name, refit_errmsg(w->ctx));
    }
    PT_RC(w->ctx, refit_finalize(t), REFIT_OK);
}

static void same_bytes(worker *a, worker *b)
{
    uint64_t fa, fb;
    PT_RC(a->ctx, refit_model_fingerprint(a->m, &fa), REFIT_OK);
    PT_RC(b->ctx, refit_model_fingerprint(b->m, &fb), REFIT_OK);
    assert_int_equal(fa, fb);
    for (int i = 0; i < a->n_rt; i++) {
        const refit_tensor *x = &a->rt[i].t, *y = &b->rt[i].t;
        size_t n = (size_t)x->shape[0] * (size_t)(x->ndim == 2 ? x->shape[1] : 1);
        assert_memory_equal(x->data, y->data, n * x->dtype.bits / 8);
    }
}

static void test_manifest_equals_c_model(void **state)
{
    (void)state;
    worker *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    assert_non_null(a);
    assert_non_null(b);
    build_in_c(a);
    build_from_manifest(b);
    assert_int_equal(a->n_ck, 39);
    assert_int_equal(a->m->n_modules, 14);
    same_plan(a->m, b->m);
    load_version(a, "A");
    load_version(b, "A");
    same_bytes(a, b);
    uint64_t fa;
    PT_RC(a->ctx, refit_model_fingerprint(a->m, &fa), REFIT_OK);
    load_version(a, "B"); /* a reload, on both */
    load_version(b, "B");
    same_bytes(a, b);
    uint64_t fb;
    PT_RC(a->ctx, refit_model_fingerprint(a->m, &fb), REFIT_OK);
    assert_int_not_equal(fa, fb); /* the weights did change */
    worker_close(a);
    worker_close(b);
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_manifest_equals_c_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
