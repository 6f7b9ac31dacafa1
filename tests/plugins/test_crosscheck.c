/* Seal refuses a model whose plugin's plan() disagrees with the plugin's
 * declaration, naming plugin, module and tensor; a plan that agrees seals.
 * "Disagrees" (docs/plugins.md): a tensor that matches no checkpoint role,
 * a route the role does not list, a STAGED route without a post-load
 * step, a post-load step the declaration does not list, a non-idempotent
 * kernel on a module not delivered whole, a runtime dtype no runtime role
 * takes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/plugin_loader.h"
#include "putil.h"

typedef struct world {
    char *dir;
    refit_ctx *ctx;
    refit_model *m;
    float rt[4];
    int64_t shape[1];
    refit_tensor t;
} world;

/* A context that finds plugin `name` (declared by yaml) and a model with
 * one module "m" of that format, one runtime tensor "out" [4] of dtype dt. */
static void world_open(world *w, const char *name, const char *yaml, refit_dtype dt)
{
    memset(w, 0, sizeof *w);
    w->dir = pt_tmpdir();
    pt_stage_fake(w->dir, name, yaml);
    refit_options o = REFIT_OPTIONS_INIT;
    o.plugin_dirs = w->dir;
    PT_RC(NULL, refit_open(&w->ctx, &o), REFIT_OK);
    const plugin_entry *e = plugins_entry_of(w->ctx->plugins, ctx_find_format(w->ctx, name));
    if (!e)
        fail_msg("plugin %s did not load: %s", name,
                 w->ctx->plugins->n ? w->ctx->plugins->e[0].reason : "not found");
    PT_RC(w->ctx, refit_model_create(&w->m, w->ctx), REFIT_OK);
    PT_RC(w->ctx, refit_model_add_module(w->m, "m", name, NULL), REFIT_OK);
    w->shape[0] = 4;
    w->t = (refit_tensor){w->rt, {REFIT_DEVICE_CPU, 0}, 1, dt, w->shape, NULL, 0};
    PT_RC(w->ctx, refit_module_bind_runtime(w->m, "m", "out", &w->t), REFIT_OK);
}

static void expect(world *w, const char *ckpt, refit_dtype dt)
{
    refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
    s.dtype = dt;
    s.ndim = 1;
    s.shape[0] = 4;
    PT_RC(w->ctx, refit_model_expect(w->m, "m", ckpt, &s), REFIT_OK);
}

static void world_close(world *w)
{
    refit_close(w->ctx);
    pt_rmtree(w->dir);
}

/* Seal fails with EFORMAT naming the plugin, module m and what: and
 * leaves the model unsealed. */
static void seal_refused(world *w, const char *name, const char *what, const char *what2)
{
    PT_RC(w->ctx, refit_model_seal(w->m), REFIT_EFORMAT);
    const char *msg = refit_errmsg(w->ctx);
    PT_HAS(msg, pt_fmt("seal: plugin %s (", name));
    PT_HAS(msg, pt_fmt("/refit-fmt-%s.so): module m", name));
    PT_HAS(msg, what);
    if (what2)
        PT_HAS(msg, what2);
    refit_txn *t;
    assert_int_equal(refit_begin(&t, w->m, NULL), REFIT_ESTATE);
}

static const char *const DECL_DIRECT_WITH_KERNEL =
    "name: @NAME@\nabi: 2\n"
    "checkpoint:\n  - {role: weight, dtypes: [f32], route: DIRECT}\n"
    "runtime:\n  - {role: out, dtypes: [f32]}\n"
    "post_load:\n  - {kernel: identity, idempotent: true}\n";

static void test_route_not_declared(void **state)
{
    (void)state;
    world w;
    world_open(&w, "liar", DECL_DIRECT_WITH_KERNEL, REFIT_F32);
    expect(&w, "m.weight", REFIT_F32);
    seal_refused(&w, "liar", "tensor m.weight: plan() chose route STAGED, but its declaration ",
                 "liar.yaml:4 lists DIRECT for checkpoint role 'weight'");
    world_close(&w);
}

static void test_tensor_matching_no_role(void **state)
{
    (void)state;
    world w;
    world_open(&w, "fakedirect", PT_DECL_DIRECT, REFIT_F32);
    expect(&w, "m.bias", REFIT_F32); /* the roles take *.weight only */
    seal_refused(&w, "fakedirect", "tensor m.bias (f32) matches no checkpoint role of its "
                                   "declaration", NULL);
    world_close(&w);
}

static void test_runtime_dtype_not_declared(void **state)
{
    (void)state;
    world w;
    world_open(&w, "fakedirect", PT_DECL_DIRECT, REFIT_F16); /* runtime roles: f32, bf16 */
    expect(&w, "m.weight", REFIT_F16);
    seal_refused(&w, "fakedirect", "runtime tensor out (f16) matches no runtime role", NULL);
    world_close(&w);
}

static void test_staged_without_post_load_step(void **state)
{
    (void)state;
    world w;
    world_open(&w, "noflag", PT_DECL_STAGED, REFIT_F32);
    expect(&w, "m.weight", REFIT_F32);       /* DIRECT: covers the target */
    expect(&w, "m.extra.weight", REFIT_F32); /* STAGED, and nothing would use it */
    seal_refused(&w, "noflag", "tensor m.extra.weight: plan() staged it but asked for no "
                               "post-load step", NULL);
    world_close(&w);
}

static const char *const DECL_NOT_IDEMPOTENT =
    "name: @NAME@\nabi: 2\n"
    "checkpoint:\n  - {role: weight, dtypes: [f32], route: STAGED}\n"
    "runtime:\n  - {role: out, dtypes: [f32]}\n"
    "post_load:\n  - {kernel: fuse_scale, idempotent: false}\n";

static void test_non_idempotent_kernel_needs_whole_module(void **state)
{
    (void)state;
    world w;
    world_open(&w, "nowhole", DECL_NOT_IDEMPOTENT, REFIT_F32);
    expect(&w, "m.weight", REFIT_F32);
    seal_refused(&w, "nowhole", "has a non-idempotent post-load kernel, but plan() did not "
                                "require the module to be delivered whole", NULL);
    world_close(&w);
}

/* The control: plans that agree with their declarations seal. */
static void test_agreeing_plans_seal(void **state)
{
    (void)state;
    world w;
    world_open(&w, "fakestaged", DECL_NOT_IDEMPOTENT, REFIT_F32); /* WHOLE is set */
    expect(&w, "m.weight", REFIT_F32);
    PT_RC(w.ctx, refit_model_seal(w.m), REFIT_OK);
    world_close(&w);
    world_open(&w, "fakedirect", PT_DECL_DIRECT, REFIT_BF16);
    expect(&w, "m.weight", REFIT_BF16);
    PT_RC(w.ctx, refit_model_seal(w.m), REFIT_OK);
    world_close(&w);
}

/* A post-load step the declaration lacks cannot reach seal through the
 * loader (it refuses a post_load function without a declared kernel), so
 * the check is driven directly. */
static void test_post_load_step_must_be_declared(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    const char *path = pt_path(dir, "x.yaml");
    pt_write(path, "name: x\nabi: 2\ncheckpoint:\n  - {role: w, dtypes: [f32], route: DIRECT}\n"
                   "runtime:\n  - {role: o, dtypes: [f32]}\n", 0644);
    sdiags d = {0};
    plugin_entry pe = {.name = "x", .real = "/p/refit-fmt-x.so"};
    assert_int_equal(fdecl_load_file(&pe.decl, path, &d), REFIT_OK);
    pe.decl_path = (char *)path;
    refit_fmt_ckpt c = {.name = "a", .dtype = REFIT_F32, .route = REFIT_ROUTE_DIRECT};
    refit_fmt_runtime r = {.name = "o", .view = {.dtype = REFIT_F32}};
    refit_fmt_module fm = {.name = "m", .n_ckpt = 1, .ckpt_stride = sizeof c, .ckpt = &c, .n_runtime = 1,
                          .runtime_stride = sizeof r, .runtime = &r,
                           .flags = REFIT_MODULE_POST_LOAD | REFIT_MODULE_WHOLE};
    char why[1024];
    assert_int_equal(plugins_check_module(&pe, &fm, why, sizeof why), REFIT_EFORMAT);
    PT_HAS(why, "plugin x (/p/refit-fmt-x.so): module m: plan() asks for a post-load step, but "
                "its declaration");
    fm.flags = 0;
    assert_int_equal(plugins_check_module(&pe, &fm, why, sizeof why), REFIT_OK);
    c.route = REFIT_ROUTE_NONE; /* a route no core carries out is not declared either */
    assert_int_equal(plugins_check_module(&pe, &fm, why, sizeof why), REFIT_EFORMAT);
    PT_HAS(why, "plan() chose route NONE");
    fdecl_free(pe.decl);
    sdiags_free(&d);
    pt_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_not_declared),
        cmocka_unit_test(test_tensor_matching_no_role),
        cmocka_unit_test(test_runtime_dtype_not_declared),
        cmocka_unit_test(test_staged_without_post_load_step),
        cmocka_unit_test(test_non_idempotent_kernel_needs_whole_module),
        cmocka_unit_test(test_agreeing_plans_seal),
        cmocka_unit_test(test_post_load_step_must_be_declared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
