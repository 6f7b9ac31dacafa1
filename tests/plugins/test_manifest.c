/* refit_model_load_manifest: a manifest using every mapping (padding, tie,
 * shard with the context's rank, fuse, cast, experts from a repeat group)
 * loads real bytes; every refusal says file:line:column and leaves the
 * model as it was; bound descriptors are checked against declarations;
 * seal refuses a declared tensor never bound. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/model.h"
#include "putil.h"

static const char *const GOOD =
    "kind: model\n"
    "modules:\n"
    "  - name: emb\n"
    "    format: unquantized\n"
    "    runtime:\n"
    "      - {name: table, dtype: f32, shape: [8, 4]}\n"
    "    checkpoint:\n"
    "      - name: emb.weight\n"
    "        dtype: f32\n"
    "        shape: [6, 4]\n"
    "        padding: {pad_to: 8}\n"
    "      - {name: head.weight, tie: emb.weight}\n"
    "  - name: mlp\n"
    "    format: unquantized\n"
    "    params: {cast: true}\n"
    "    runtime:\n"
    "      - {name: gate_up, dtype: f32, shape: [4, 4]}\n"
    "      - {name: experts, dtype: bf16, shape: [2, 3, 2]}\n"
    "    checkpoint:\n"
    "      - {name: gate.weight, dtype: bf16, shape: [4, 4], target: gate_up,\n"
    "         shard: {dim: 0, count: 2}}\n"
    "      - {name: up.weight, dtype: bf16, shape: [4, 4], target: gate_up,\n"
    "         shard: {dim: 0, count: 2}, fuse: {dst_offset: [2]}}\n"
    "      - repeat: {var: e, count: 2}\n"
    "        checkpoint:\n"
    "          - {name: \"experts.${e}.weight\", dtype: bf16, shape: [3, 2], target: experts,\n"
    "             expert: \"${e}\"}\n";

typedef struct world {
    char *dir;
    char path[4096];
    refit_ctx *ctx;
    refit_model *m;
    float table[32], gate_up[16];
    uint16_t experts[12];
    int64_t s_table[2], s_gate_up[2], s_experts[3];
    refit_tensor t_table, t_gate_up, t_experts;
} world;

static void world_open(world *w, int32_t rank, const char *manifest)
{
    memset(w, 0, sizeof *w);
    w->dir = pt_tmpdir();
    snprintf(w->path, sizeof w->path, "%s/model.yaml", w->dir);
    if (manifest)
        pt_write(w->path, manifest, 0644);
    refit_options o = REFIT_OPTIONS_INIT;
    o.rank = rank;
    PT_RC(NULL, refit_open(&w->ctx, &o), REFIT_OK);
    PT_RC(w->ctx, refit_model_create(&w->m, w->ctx), REFIT_OK);
    w->s_table[0] = 8, w->s_table[1] = 4;
    w->s_gate_up[0] = 4, w->s_gate_up[1] = 4;
    w->s_experts[0] = 2, w->s_experts[1] = 3, w->s_experts[2] = 2;
    refit_device cpu = {REFIT_DEVICE_CPU, 0};
    w->t_table = (refit_tensor){w->table, cpu, 2, REFIT_F32, w->s_table, NULL, 0};
    w->t_gate_up = (refit_tensor){w->gate_up, cpu, 2, REFIT_F32, w->s_gate_up, NULL, 0};
    w->t_experts = (refit_tensor){w->experts, cpu, 3, REFIT_BF16, w->s_experts, NULL, 0};
}

static void world_bind(world *w)
{
    PT_RC(w->ctx, refit_module_bind_runtime(w->m, "emb", "table", &w->t_table), REFIT_OK);
    PT_RC(w->ctx, refit_module_bind_runtime(w->m, "mlp", "gate_up", &w->t_gate_up), REFIT_OK);
    PT_RC(w->ctx, refit_module_bind_runtime(w->m, "mlp", "experts", &w->t_experts), REFIT_OK);
}

static void world_close(world *w)
{
    refit_close(w->ctx);
    pt_rmtree(w->dir);
}

static uint16_t bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16); /* small integers: exact */
}

static void load(refit_txn *t, const char *name, void *data, refit_dtype dt, int ndim,
                 int64_t d0, int64_t d1)
{
    int64_t shape[2] = {d0, d1};
    refit_tensor src = {data, {REFIT_DEVICE_CPU, 0}, ndim, dt, shape, NULL, 0};
    if (refit_load(t, name, &src, NULL))
        fail_msg("load %s failed", name);
}

/* Every checkpoint tensor holds 100*k + i for its k and element i. */
static void deliver(world *w)
{
    float emb[24];
    uint16_t gate[16], up[16], ex[2][6];
    for (int i = 0; i < 24; i++)
        emb[i] = (float)(100 + i);
    for (int i = 0; i < 16; i++) {
        gate[i] = bf16((float)(100 + i)); /* below 256: exact in bf16 */
        up[i] = bf16((float)(200 + i));
    }
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 6; i++)
            ex[e][i] = bf16((float)(400 + 100 * e + i));
    for (int i = 0; i < 32; i++)
        w->table[i] = -1.0f; /* the pad rows must come back zero */
    refit_txn *t;
    PT_RC(w->ctx, refit_begin(&t, w->m, NULL), REFIT_OK);
    load(t, "emb.weight", emb, REFIT_F32, 2, 6, 4);
    load(t, "gate.weight", gate, REFIT_BF16, 2, 4, 4);
    load(t, "up.weight", up, REFIT_BF16, 2, 4, 4);
    load(t, "experts.0.weight", ex[0], REFIT_BF16, 2, 3, 2);
    load(t, "experts.1.weight", ex[1], REFIT_BF16, 2, 3, 2);
    PT_RC(w->ctx, refit_finalize(t), REFIT_OK);
}

static void check_bytes(const world *w, int rank)
{
    for (int i = 0; i < 32; i++)
        assert_true(w->table[i] == (i < 24 ? (float)(100 + i) : 0.0f));
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 4; c++) {
            int src = (2 * rank + r) * 4 + c;
            assert_true(w->gate_up[r * 4 + c] == (float)(100 + src));
            assert_true(w->gate_up[(2 + r) * 4 + c] == (float)(200 + src));
        }
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 6; i++)
            assert_int_equal(w->experts[e * 6 + i], bf16((float)(400 + 100 * e + i)));
}

static void test_good_manifest_loads_bytes(void **state)
{
    (void)state;
    for (int rank = 0; rank < 2; rank++) { /* shards take the context's rank */
        world w;
        world_open(&w, rank, GOOD);
        PT_RC(w.ctx, refit_model_load_manifest(w.m, w.path), REFIT_OK);
        world_bind(&w);
        PT_RC(w.ctx, refit_model_seal(w.m), REFIT_OK);
        refit_model_stats st;
        refit_model_stats_get(w.m, &st);
        assert_int_equal(st.modules, 2);
        assert_int_equal(st.ckpt_tensors, 6);
        assert_int_equal(st.routes_direct, 5);
        deliver(&w);
        check_bytes(&w, rank);
        assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_READY);
        world_close(&w);
    }
}

/* A refused manifest leaves no module, route or name behind: the same
 * model then takes a good manifest. */
static void refused(const char *manifest, int32_t rank, int want, const char *where,
                    const char *what)
{
    world w;
    world_open(&w, rank, manifest);
    if (manifest && strstr(manifest, "PRE"))
        PT_RC(w.ctx, refit_model_add_module(w.m, "emb", "unquantized", NULL), REFIT_OK);
    uint32_t mods = w.m->n_modules, routes = w.m->n_routes;
    PT_RC(w.ctx, refit_model_load_manifest(w.m, w.path), want);
    char head[4200];
    snprintf(head, sizeof head, "%s:%s: ", w.path, where);
    if (strncmp(refit_errmsg(w.ctx), head, strlen(head)))
        fail_msg("message \"%s\" does not start with \"%s\"", refit_errmsg(w.ctx), head);
    PT_HAS(refit_errmsg(w.ctx), what);
    assert_int_equal(w.m->n_modules, mods);
    assert_int_equal(w.m->n_routes, routes);
    if (mods == 0 && rank < 2) {
        pt_write(w.path, GOOD, 0644);
        PT_RC(w.ctx, refit_model_load_manifest(w.m, w.path), REFIT_OK);
        world_bind(&w);
        PT_RC(w.ctx, refit_model_seal(w.m), REFIT_OK);
    }
    world_close(&w);
}

/* GOOD with one line replaced. */
static char *good_with(const char *from, const char *to)
{
    const char *at = strstr(GOOD, from);
    if (!at)
        fail_msg("'%s' is not in the manifest", from);
    char *s = malloc(strlen(GOOD) + strlen(to) + 1);
    if (!s)
        fail_msg("out of memory");
    memcpy(s, GOOD, (size_t)(at - GOOD));
    strcpy(s + (at - GOOD), to);
    strcat(s, at + strlen(from));
    return s;
}

static void test_invalid_manifest(void **state)
{
    (void)state;
    char *m = good_with("padding: {pad_to: 8}", "paddng: {pad_to: 8}");
    refused(m, 0, REFIT_ECORRUPT, "11:9", "unknown key 'paddng' in checkpoint tensor; did you "
                                          "mean 'padding'?");
    free(m);
    m = good_with("shape: [6, 4]", "shape: [6, x]");
    refused(m, 0, REFIT_ECORRUPT, "10:20", "'x' is not a repeat variable (\"${name}\")");
    free(m);
    m = good_with("shape: [6, 4]", "shape: [6, x, y]");
    refused(m, 0, REFIT_ECORRUPT, "10:20", "(and more: `refitctl validate FILE` lists every "
                                           "mistake)");
    free(m);
}

static void test_unknown_format(void **state)
{
    (void)state;
    char *m = good_with("  - name: mlp\n    format: unquantized", "  - name: mlp\n    format: fp3");
    refused(m, 0, REFIT_ENOTFOUND, "14:13", "module mlp: no format named 'fp3' is registered "
                                            "(plugins searched in: ");
    free(m);
}

static void test_names_taken(void **state)
{
    (void)state;
    char *m = good_with("kind: model\n", "kind: model\n# PRE: emb exists\n");
    refused(m, 0, REFIT_EEXIST, "4:5", "module emb is already registered");
    free(m);
}

static void test_rank_beyond_shards(void **state)
{
    (void)state;
    refused(GOOD, 3, REFIT_EINVAL, "21:17", "tensor gate.weight: 2 shards, but this worker's "
                                            "rank is 3 (set shard.rank to override)");
    char *m = good_with("shard: {dim: 0, count: 2}}\n      - {name: up",
                        "shard: {dim: 0, count: 2, rank: 1}}\n      - {name: up");
    refused(m, 3, REFIT_EINVAL, "23:17", "tensor up.weight: 2 shards, but this worker's rank "
                                         "is 3");
    free(m);
}

static void test_params_checked_against_the_declaration(void **state)
{
    (void)state;
    char *m = good_with("{cast: true}", "{cats: true}");
    refused(m, 0, REFIT_EINVAL, "15:14", "module mlp: format unquantized has no parameter "
                                         "'cats' (its declaration: ");
    free(m);
    m = good_with("{cast: true}", "{cast: maybe}");
    refused(m, 0, REFIT_EINVAL, "15:14", "module mlp: parameter cast of format unquantized: "
                                         "'maybe': expected true or false");
    free(m);
}

/* The same checks, with the same words, for parameters given through the
 * API: a value the declaration refuses ("maybe" for a boolean used to read
 * as false) and an unknown key (used to be ignored). */
static void test_api_params_checked_against_the_declaration(void **state)
{
    (void)state;
    world w;
    world_open(&w, 0, NULL);
    PT_RC(w.ctx, refit_model_add_module(w.m, "mlp", "unquantized", "{cast: maybe}"),
          REFIT_EINVAL);
    PT_HAS(refit_errmsg(w.ctx), "module mlp: parameter cast of format unquantized: 'maybe': "
                                "expected true or false");
    PT_RC(w.ctx, refit_model_add_module(w.m, "mlp", "unquantized", "{cats: true}"),
          REFIT_EINVAL);
    PT_HAS(refit_errmsg(w.ctx), "module mlp: format unquantized has no parameter 'cats' (its "
                                "declaration: ");
    assert_int_equal(w.m->n_modules, 0);
    PT_RC(w.ctx, refit_model_add_module(w.m, "mlp", "unquantized", "{cast: true}"), REFIT_OK);
    world_close(&w);
}

static void test_unreadable_and_sealed(void **state)
{
    (void)state;
    world w;
    world_open(&w, 0, NULL);
    PT_RC(w.ctx, refit_model_load_manifest(w.m, w.path), REFIT_EIO);
    PT_HAS(refit_errmsg(w.ctx), pt_fmt("%s: cannot read: No such file", w.path));
    pt_write(w.path, GOOD, 0644);
    PT_RC(w.ctx, refit_model_load_manifest(w.m, w.path), REFIT_OK);
    PT_RC(w.ctx, refit_model_load_manifest(w.m, w.path), REFIT_EEXIST); /* twice */
    world_bind(&w);
    PT_RC(w.ctx, refit_model_seal(w.m), REFIT_OK);
    PT_RC(w.ctx, refit_model_load_manifest(w.m, w.path), REFIT_ESTATE);
    PT_RC(w.ctx, refit_model_load_manifest(NULL, w.path), REFIT_EINVAL);
    world_close(&w);
}

static void test_bind_checked_against_declaration(void **state)
{
    (void)state;
    world w;
    world_open(&w, 0, GOOD);
    PT_RC(w.ctx, refit_model_load_manifest(w.m, w.path), REFIT_OK);
    int64_t wrong[2] = {4, 8};
    refit_tensor t = w.t_table;
    t.shape = wrong;
    PT_RC(w.ctx, refit_module_bind_runtime(w.m, "emb", "table", &t), REFIT_EMISMATCH);
    PT_HAS(refit_errmsg(w.ctx), pt_fmt("module emb, runtime tensor table: bound as f32 [4, 8], "
                                       "but %s:6:9 declares f32 [8, 4]", w.path));
    t = w.t_table;
    t.dtype = REFIT_BF16;
    PT_RC(w.ctx, refit_module_bind_runtime(w.m, "emb", "table", &t), REFIT_EMISMATCH);
    PT_HAS(refit_errmsg(w.ctx), "bound as bf16 [8, 4]");
    PT_RC(w.ctx, refit_module_bind_runtime(w.m, "emb", "bias", &w.t_table), REFIT_ENOTFOUND);
    PT_HAS(refit_errmsg(w.ctx), "module emb: runtime tensor bias is not among the 1 its "
                                "manifest");
    /* a module added by hand is not checked against anything */
    PT_RC(w.ctx, refit_model_add_module(w.m, "free", "unquantized", NULL), REFIT_OK);
    PT_RC(w.ctx, refit_module_bind_runtime(w.m, "free", "anything", &t), REFIT_OK);
    world_close(&w);
}

static void test_seal_refuses_unbound_declaration(void **state)
{
    (void)state;
    world w;
    world_open(&w, 0, GOOD);
    PT_RC(w.ctx, refit_model_load_manifest(w.m, w.path), REFIT_OK);
    PT_RC(w.ctx, refit_module_bind_runtime(w.m, "emb", "table", &w.t_table), REFIT_OK);
    PT_RC(w.ctx, refit_module_bind_runtime(w.m, "mlp", "gate_up", &w.t_gate_up), REFIT_OK);
    PT_RC(w.ctx, refit_model_seal(w.m), REFIT_EINVAL);
    PT_HAS(refit_errmsg(w.ctx), pt_fmt("seal: module mlp: runtime tensor experts, declared at "
                                       "%s:18:9, was never bound (refit_module_bind_runtime)",
                                       w.path));
    PT_RC(w.ctx, refit_module_bind_runtime(w.m, "mlp", "experts", &w.t_experts), REFIT_OK);
    PT_RC(w.ctx, refit_model_seal(w.m), REFIT_OK);
    world_close(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_manifest_loads_bytes),
        cmocka_unit_test(test_invalid_manifest),
        cmocka_unit_test(test_unknown_format),
        cmocka_unit_test(test_names_taken),
        cmocka_unit_test(test_rank_beyond_shards),
        cmocka_unit_test(test_params_checked_against_the_declaration),
        cmocka_unit_test(test_api_params_checked_against_the_declaration),
        cmocka_unit_test(test_unreadable_and_sealed),
        cmocka_unit_test(test_bind_checked_against_declaration),
        cmocka_unit_test(test_seal_refuses_unbound_declaration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
