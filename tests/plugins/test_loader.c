/* The plugin loader: every refusal (named file, reason, logged), the
 * search path, shadowing, a good plugin end to end through transactions,
 * dlclose at refit_close, in-process formats, the host services. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/ctx.h"
#include "core/host_services.h"
#include "core/plugin_loader.h"
#include "putil.h"

/* ---- a log sink that keeps every line ---- */

static char logbuf[16384];

static void keep_log(void *user, int level, const char *fmt, ...)
{
    (void)user;
    (void)level;
    size_t used = strlen(logbuf);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(logbuf + used, sizeof logbuf - used, fmt, ap);
    va_end(ap);
    used = strlen(logbuf);
    if (used + 1 < sizeof logbuf)
        strcat(logbuf, "\n");
}

static plugin_set *open_only(const char *dirs)
{
    plugin_set *ps = NULL;
    logbuf[0] = '\0';
    assert_int_equal(plugins_open(&ps, dirs, PLUGINS_ONLY_NAMED, keep_log, NULL), REFIT_OK);
    return ps;
}

/* One plugin file in dir, refused: the entry and the log both name the
 * file, and the reason says why. */
static void expect_refused(const char *dir, const char *file, const char *why_in)
{
    char why[2048]; /* why_in may live in pt_fmt's buffer, which is reused below */
    snprintf(why, sizeof why, "%s", why_in);
    plugin_set *ps = open_only(dir);
    assert_int_equal(ps->n, 1);
    const plugin_entry *e = &ps->e[0];
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    assert_string_equal(e->path, path);
    if (e->state != PLUGIN_REFUSED)
        fail_msg("%s was not refused (state %d)", path, e->state);
    PT_HAS(e->reason, why);
    PT_HAS(logbuf, pt_fmt("plugin %s refused: ", path));
    PT_HAS(logbuf, why);
    assert_null(e->dl);
    assert_int_equal(plugins_count(ps, PLUGIN_LOADED), 0);
    plugins_close_set(ps);
}

static void refused_fake(const char *name, const char *yaml, const char *why)
{
    char *dir = pt_tmpdir(), file[256];
    snprintf(file, sizeof file, "refit-fmt-%s.so", name);
    pt_stage_fake(dir, name, yaml);
    expect_refused(dir, file, why);
    pt_rmtree(dir);
}

/* ---- the ABI ---- */

static void test_refuses_version_0(void **state)
{
    (void)state;
    refused_fake("badv0", PT_DECL_DIRECT, "invalid version 0 in refit_format_plugin_v2 (this refit knows format ABI 2): set abi_version = REFIT_FORMAT_ABI_VERSION and rebuild");
}

static void test_refuses_newer_version(void **state)
{
    (void)state;
    refused_fake("badv99", PT_DECL_DIRECT, "invalid version 99 in refit_format_plugin_v2 (this refit knows format ABI 2)");
}

static void test_refuses_tiny_struct_size(void **state)
{
    (void)state;
    refused_fake("tiny", PT_DECL_DIRECT,
                 pt_fmt("struct_size 8 is smaller than ABI 2's %zu bytes",
                        (size_t)REFIT_FORMAT_V2_MIN_SIZE));
}

static void test_refuses_struct_shorter_than_it_claims(void **state)
{
    (void)state;
    /* the symbol is 8 bytes (more under ASan, which pads globals with a
     * redzone, but still fewer than it claims) */
    refused_fake("short", PT_DECL_DIRECT,
                 pt_fmt("struct_size says %zu bytes but refit_format_plugin_v2 is ",
                        sizeof(refit_format_v2)));
}

/* A plugin built against ABI 1 exports only refit_format_plugin_v1: it is
 * refused, and the message says what to rebuild it against. */
static void test_refuses_abi1_plugin(void **state)
{
    (void)state;
    refused_fake("abi1", PT_DECL_DIRECT,
                 "built against format ABI 1 (it exports refit_format_plugin_v1): rebuild it "
                 "against refit's <refit/format.h>, format ABI 2 (refit_format_v2, exported as "
                 "refit_format_plugin_v2; pkg-config refit-format)");
}

static void test_refuses_missing_symbol(void **state)
{
    (void)state;
    refused_fake("nosym", PT_DECL_DIRECT, "does not export refit_format_plugin_v2");
    refused_fake("nosym", PT_DECL_DIRECT, "(export it: REFIT_PLUGIN_EXPORT const refit_format_v2 "
                 "refit_format_plugin_v2 = {...}; refit/format.h)");
}

static void test_refuses_name_other_than_file(void **state)
{
    (void)state;
    refused_fake("misnamed", PT_DECL_DIRECT,
                 "exports format 'other' but the file is named for 'misnamed': name the file "
                 "refit-fmt-other.so");
}

static void test_refuses_plugin_linking_core_symbol(void **state)
{
    (void)state;
    /* RTLD_NOW: the unresolved core symbol fails the load, not the update */
    refused_fake("coresym", PT_DECL_DIRECT, "undefined symbol: refit_dtype_name");
}

/* ---- files ---- */

static void test_refuses_world_writable_file(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_stage_fake(dir, "fakedirect", PT_DECL_DIRECT);
    assert_int_equal(chmod(pt_path(dir, "refit-fmt-fakedirect.so"), 0757), 0);
    expect_refused(dir, "refit-fmt-fakedirect.so",
                   pt_fmt("the file is writable by others (mode 0757): chmod go-w %s",
                          pt_path(dir, "refit-fmt-fakedirect.so")));
    pt_rmtree(dir);
}

static void test_refuses_group_writable_file(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_stage_fake(dir, "fakedirect", PT_DECL_DIRECT);
    assert_int_equal(chmod(pt_path(dir, "refit-fmt-fakedirect.so"), 0775), 0);
    expect_refused(dir, "refit-fmt-fakedirect.so",
                   pt_fmt("the file is writable by its group (mode 0775): chmod go-w %s",
                          pt_path(dir, "refit-fmt-fakedirect.so")));
    pt_rmtree(dir);
}

static void test_refuses_directory_writable_by_others(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_stage_fake(dir, "fakedirect", PT_DECL_DIRECT);
    assert_int_equal(chmod(dir, 0777), 0);
    expect_refused(dir, "refit-fmt-fakedirect.so",
                   pt_fmt("its directory %s is writable by others (mode 0777): chmod o-w %s", dir, dir));
    pt_rmtree(dir);
}

static void test_refuses_declaration_writable_by_others(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_stage_fake(dir, "fakedirect", PT_DECL_DIRECT);
    assert_int_equal(chmod(pt_path(dir, "fakedirect.yaml"), 0646), 0);
    expect_refused(dir, "refit-fmt-fakedirect.so",
                   pt_fmt("its declaration fakedirect.yaml is writable by others (mode 0646): "
                          "chmod go-w %s", pt_path(dir, "fakedirect.yaml")));
    pt_rmtree(dir);
}

/* Only root can give a file away; as root, a file of another user is
 * exactly what the rule is about. */
static void test_refuses_file_of_another_user(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip(); /* an unprivileged user cannot chown a file to someone else */
    char *dir = pt_tmpdir();
    pt_stage_fake(dir, "fakedirect", PT_DECL_DIRECT);
    assert_int_equal(chown(pt_path(dir, "refit-fmt-fakedirect.so"), 65534, 65534), 0);
    expect_refused(dir, "refit-fmt-fakedirect.so",
                   pt_fmt("the file is owned by uid 65534, not by this user (uid 0) or root: chown 0 %s",
                          pt_path(dir, "refit-fmt-fakedirect.so")));
    pt_rmtree(dir);
}

static void test_missing_file_reported_apart(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    assert_int_equal(symlink("gone.so", pt_path(dir, "refit-fmt-ghost.so")), 0);
    expect_refused(dir, "refit-fmt-ghost.so", "missing file");
    /* and a file that is there but no shared object: dlerror's own text */
    unlink(pt_path(dir, "refit-fmt-ghost.so"));
    pt_write(pt_path(dir, "refit-fmt-junk.so"), "not an ELF file\n", 0755);
    pt_write(pt_path(dir, "junk.yaml"), "name: junk\nabi: 2\ncheckpoint:\n"
             "  - {role: w, dtypes: [f32], route: DIRECT}\nruntime:\n  - {role: o, dtypes: [f32]}\n",
             0644);
    plugin_set *ps = open_only(dir);
    assert_int_equal(ps->n, 1);
    PT_HAS(ps->e[0].reason, "dlopen failed: ");
    assert_null(strstr(ps->e[0].reason, "missing"));
    plugins_close_set(ps);
    pt_rmtree(dir);
}

static void test_refuses_bad_file_name(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_copy(pt_fmt("%s/refit-fmt-fakedirect.so", pt_env("REFIT_TEST_FAKE_DIR")),
            pt_path(dir, "refit-fmt-Fake.so"), 0755);
    expect_refused(dir, "refit-fmt-Fake.so", "is not a lowercase identifier ([a-z][a-z0-9_]*): "
                   "rename the file refit-fmt-<name>.so after the format's name");
    pt_rmtree(dir);
}

/* ---- declarations ---- */

static void test_refuses_missing_declaration(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_stage_fake(dir, "fakedirect", NULL);
    expect_refused(dir, "refit-fmt-fakedirect.so",
                   pt_fmt("its declaration %s/fakedirect.yaml is missing: install the plugin's "
                          "fakedirect.yaml beside it", dir));
    pt_rmtree(dir);
}

static void test_refuses_invalid_declaration(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_stage_fake(dir, "fakedirect", "name: @NAME@\nabi: 3\ncheckpoint: []\nruntime: []\n");
    expect_refused(dir, "refit-fmt-fakedirect.so",
                   pt_fmt("invalid declaration: %s/fakedirect.yaml:2:6: 3 is above the maximum 2",
                          dir));
    pt_rmtree(dir);
}

static void test_refuses_declaration_of_another_format(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_stage_fake(dir, "fakedirect", "name: other\nabi: 2\ncheckpoint:\n"
                                     "  - {role: w, dtypes: [f32], route: DIRECT}\n"
                                     "runtime:\n  - {role: o, dtypes: [f32]}\n");
    expect_refused(dir, "refit-fmt-fakedirect.so",
                   "its declaration names format 'other', the plugin 'fakedirect'");
    pt_rmtree(dir);
}

static void test_refuses_post_load_the_declaration_lacks(void **state)
{
    (void)state;
    refused_fake("fakestaged", PT_DECL_DIRECT,
                 "the plugin has a post_load function but its declaration lists no post-load "
                 "kernel");
}

static void test_refuses_declared_kernel_without_post_load(void **state)
{
    (void)state;
    refused_fake("nopost", PT_DECL_STAGED, "its declaration lists post-load kernels (identity, "
                                           "line 8) but the plugin has no post_load function");
}

/* ---- the search path ---- */

static void test_shadowed_by_the_first_found(void **state)
{
    (void)state;
    char *a = pt_tmpdir(), *b = pt_tmpdir();
    pt_stage_fake(a, "fakedirect", PT_DECL_DIRECT);
    pt_stage_fake(b, "fakedirect", PT_DECL_DIRECT);
    plugin_set *ps = open_only(pt_fmt("%s:%s", a, b));
    assert_int_equal(ps->n, 2);
    assert_int_equal(ps->e[0].state, PLUGIN_LOADED);
    assert_string_equal(ps->e[0].path, pt_path(a, "refit-fmt-fakedirect.so"));
    assert_int_equal(ps->e[1].state, PLUGIN_SHADOWED);
    assert_string_equal(ps->e[1].reason, pt_path(a, "refit-fmt-fakedirect.so"));
    PT_HAS(logbuf, "is shadowed by");
    plugins_close_set(ps);
    pt_rmtree(a);
    pt_rmtree(b);
}

static void test_search_path_order(void **state)
{
    (void)state;
    char *a = pt_tmpdir(), *b = pt_tmpdir();
    setenv("REFIT_PLUGIN_PATH", pt_fmt("%s::%s", b, a), 1);
    plugin_set *ps = NULL;
    assert_int_equal(plugins_open(&ps, pt_fmt("%s:%s", a, a), 0, NULL, NULL), REFIT_OK);
    unsetenv("REFIT_PLUGIN_PATH");
    /* named, then the environment (a again is searched once), install, build */
    assert_true(ps->n_dirs >= 3);
    assert_string_equal(ps->dirs[0].path, a);
    assert_string_equal(ps->dirs[0].origin, "plugin_dirs");
    assert_string_equal(ps->dirs[1].path, b);
    assert_string_equal(ps->dirs[1].origin, "REFIT_PLUGIN_PATH");
    assert_string_equal(ps->dirs[2].origin, "install");
    /* these tests run from the build tree, so its plugins are searched last */
    char *build = realpath(pt_env("REFIT_TEST_PLUGIN_BUILD_DIR"), NULL);
    assert_int_equal(ps->n_dirs, 4);
    assert_string_equal(ps->dirs[3].origin, "build");
    assert_string_equal(ps->dirs[3].path, build);
    free(build);
    char desc[2048];
    plugins_describe_path(ps, desc, sizeof desc);
    PT_HAS(desc, pt_fmt("%s (plugin_dirs), ", a));
    plugins_close_set(ps);
    pt_rmtree(a);
    pt_rmtree(b);
}

static void test_no_plugin_is_no_error(void **state)
{
    (void)state;
    char *a = pt_tmpdir();
    plugin_set *ps = open_only(pt_fmt("%s:%s/nonexistent", a, a));
    assert_int_equal(ps->n, 0);
    assert_int_equal(ps->n_dirs, 2);
    assert_int_equal(ps->dirs[1].missing, 1);
    PT_HAS(logbuf, "is missing");
    plugins_close_set(ps);
    pt_rmtree(a);
}

/* ---- end to end ---- */

static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

typedef struct e2e {
    refit_ctx *ctx;
    refit_model *m;
    int64_t lin_shape[2], st_shape[2];
    uint16_t lin_rt[32], lin_src[32];
    float st_rt[15], st_src[15];
    refit_tensor lin_t, st_t;
} e2e;

static void e2e_build(e2e *w, const char *dir)
{
    memset(w, 0, sizeof *w);
    refit_options o = REFIT_OPTIONS_INIT;
    o.plugin_dirs = dir;
    PT_RC(NULL, refit_open(&w->ctx, &o), REFIT_OK);
    PT_RC(w->ctx, refit_model_create(&w->m, w->ctx), REFIT_OK);
    w->lin_shape[0] = 4, w->lin_shape[1] = 8;
    w->st_shape[0] = 3, w->st_shape[1] = 5;
    w->lin_t = (refit_tensor){w->lin_rt, {REFIT_DEVICE_CPU, 0}, 2, REFIT_BF16, w->lin_shape,
                              NULL, 0};
    w->st_t = (refit_tensor){w->st_rt, {REFIT_DEVICE_CPU, 0}, 2, REFIT_F32, w->st_shape, NULL, 0};
    PT_RC(w->ctx, refit_model_add_module(w->m, "lin", "unquantized", NULL), REFIT_OK);
    PT_RC(w->ctx, refit_module_bind_runtime(w->m, "lin", "w", &w->lin_t), REFIT_OK);
    PT_RC(w->ctx, refit_model_add_module(w->m, "st", "fakestaged", NULL), REFIT_OK);
    PT_RC(w->ctx, refit_module_bind_runtime(w->m, "st", "out", &w->st_t), REFIT_OK);
    refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
    s.dtype = REFIT_BF16, s.ndim = 2, s.shape[0] = 4, s.shape[1] = 8;
    PT_RC(w->ctx, refit_model_expect(w->m, "lin", "lin.weight", &s), REFIT_OK);
    s.dtype = REFIT_F32, s.shape[0] = 3, s.shape[1] = 5;
    PT_RC(w->ctx, refit_model_expect(w->m, "st", "st.weight", &s), REFIT_OK);
    PT_RC(w->ctx, refit_model_seal(w->m), REFIT_OK);
}

static void e2e_update(e2e *w, float base)
{
    for (int i = 0; i < 32; i++)
        w->lin_src[i] = bf16_of(base + (float)i);
    for (int i = 0; i < 15; i++)
        w->st_src[i] = base * 2 + (float)i;
    refit_tensor a = {w->lin_src, {REFIT_DEVICE_CPU, 0}, 2, REFIT_BF16, w->lin_shape, NULL, 0};
    refit_tensor b = {w->st_src, {REFIT_DEVICE_CPU, 0}, 2, REFIT_F32, w->st_shape, NULL, 0};
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = "v";
    refit_txn *t;
    PT_RC(w->ctx, refit_begin(&t, w->m, &uo), REFIT_OK);
    PT_RC(w->ctx, refit_load(t, "lin.weight", &a, NULL), REFIT_OK);
    PT_RC(w->ctx, refit_load(t, "st.weight", &b, NULL), REFIT_OK);
    PT_RC(w->ctx, refit_finalize(t), REFIT_OK);
    assert_memory_equal(w->lin_rt, w->lin_src, sizeof w->lin_rt);
    assert_memory_equal(w->st_rt, w->st_src, sizeof w->st_rt);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
}

/* Still mapped? RTLD_NOLOAD finds a loaded object without loading it. */
static int is_loaded(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (h)
        dlclose(h);
    return h != NULL;
}

static void test_good_plugins_end_to_end_and_dlclose(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_stage_built(dir, "unquantized");
    pt_stage_fake(dir, "fakestaged", PT_DECL_STAGED);
    e2e w;
    e2e_build(&w, dir);
    const plugin_entry *u = plugins_entry_of(w.ctx->plugins, ctx_find_format(w.ctx, "unquantized"));
    const plugin_entry *f = plugins_entry_of(w.ctx->plugins, ctx_find_format(w.ctx, "fakestaged"));
    assert_non_null(u);
    assert_non_null(f);
    char *ureal = realpath(pt_path(dir, "refit-fmt-unquantized.so"), NULL);
    char *freal = realpath(pt_path(dir, "refit-fmt-fakestaged.so"), NULL);
    assert_string_equal(u->real, ureal); /* the named dir comes before the build's */
    assert_string_equal(f->real, freal);
    e2e_update(&w, 1.0f);
    e2e_update(&w, 7.0f); /* a reload over the first: same path, new bytes */
    assert_true(is_loaded(ureal));
    assert_true(is_loaded(freal));
    refit_close(w.ctx);
    assert_false(is_loaded(freal));
    assert_false(is_loaded(ureal));
    free(ureal);
    free(freal);
    pt_rmtree(dir);
}

static void test_unknown_format_names_the_directories(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    refit_options o = REFIT_OPTIONS_INIT;
    o.plugin_dirs = dir;
    refit_ctx *ctx;
    refit_model *m;
    PT_RC(NULL, refit_open(&ctx, &o), REFIT_OK);
    PT_RC(ctx, refit_model_create(&m, ctx), REFIT_OK);
    PT_RC(ctx, refit_model_add_module(m, "x", "fp64-magic", NULL), REFIT_ENOTFOUND);
    PT_HAS(refit_errmsg(ctx), "module x: no format named 'fp64-magic' is registered (plugins "
                              "searched in: ");
    PT_HAS(refit_errmsg(ctx), pt_fmt("%s (plugin_dirs)", dir));
    PT_HAS(refit_errmsg(ctx), "(install");
    refit_close(ctx);
    pt_rmtree(dir);
}

/* A refused plugin is logged and skipped: the context still opens. */
static void test_open_survives_refusals(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_stage_fake(dir, "badv0", PT_DECL_DIRECT);
    refit_options o = REFIT_OPTIONS_INIT;
    o.plugin_dirs = dir;
    refit_ctx *ctx;
    PT_RC(NULL, refit_open(&ctx, &o), REFIT_OK);
    assert_null(ctx_find_format(ctx, "badv0"));
    assert_true(plugins_count(ctx->plugins, PLUGIN_REFUSED) >= 1);
    assert_string_equal(refit_errmsg(ctx), "");
    refit_close(ctx);
    pt_rmtree(dir);
}

static int inproc_plan(const refit_host_v2 *host, refit_fmt_module *m)
{
    (void)host;
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        m->ckpt[i].route = REFIT_ROUTE_DIRECT;
    return REFIT_OK;
}

static const refit_format_v2 inproc = {REFIT_FORMAT_ABI_VERSION, sizeof(refit_format_v2),
                                       "fakedirect", inproc_plan, NULL, NULL, 0, NULL, NULL};

/* The embedder's explicit registration beats a plugin found on a path,
 * until a module uses the plugin's format. */
static void test_in_process_format_replaces_plugin(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    pt_stage_fake(dir, "fakedirect", PT_DECL_DIRECT);
    refit_options o = REFIT_OPTIONS_INIT;
    o.plugin_dirs = dir;
    refit_ctx *ctx;
    refit_model *m;
    PT_RC(NULL, refit_open(&ctx, &o), REFIT_OK);
    const refit_format_v2 *plug = ctx_find_format(ctx, "fakedirect");
    assert_non_null(plug);
    assert_ptr_not_equal(plug, &inproc);
    PT_RC(ctx, refit_model_create(&m, ctx), REFIT_OK);
    PT_RC(ctx, refit_model_add_module(m, "a", "fakedirect", NULL), REFIT_OK);
    PT_RC(ctx, refit_format_register(ctx, &inproc), REFIT_EEXIST);
    PT_HAS(refit_errmsg(ctx), "used by module a");
    refit_close(ctx);

    PT_RC(NULL, refit_open(&ctx, &o), REFIT_OK);
    PT_RC(ctx, refit_format_register(ctx, &inproc), REFIT_OK);
    assert_ptr_equal(ctx_find_format(ctx, "fakedirect"), &inproc);
    const plugin_entry *e = &ctx->plugins->e[0];
    assert_int_equal(e->state, PLUGIN_SHADOWED);
    PT_HAS(e->reason, "replaced by an in-process refit_format_register");
    PT_RC(ctx, refit_format_register(ctx, &inproc), REFIT_EEXIST); /* twice is still twice */
    refit_close(ctx);
    pt_rmtree(dir);
}

static void test_host_services_appended(void **state)
{
    (void)state;
    refit_ctx *ctx;
    PT_RC(NULL, refit_open(&ctx, NULL), REFIT_OK);
    const refit_host_v2 *h = &ctx->host;
    assert_int_equal(h->struct_size, sizeof(refit_host_v2));
    assert_true(REFIT_HOST_HAS(h, zero) && REFIT_HOST_HAS(h, device_info) &&
                REFIT_HOST_HAS(h, dtype_name));
    assert_true(REFIT_HOST_V2_MIN_SIZE <= sizeof(refit_host_v2));
    refit_device_info info = {.struct_size = sizeof info};
    assert_int_equal(h->device_info(h->host, (refit_device){REFIT_DEVICE_CPU, 0}, &info), 0);
    assert_int_equal(info.served, 1);
    assert_int_equal(info.host_access, 1);
    assert_string_equal(info.backend, "host");
    refit_device_info small = {.struct_size = 4};
    assert_int_equal(h->device_info(h->host, (refit_device){REFIT_DEVICE_CPU, 0}, &small),
                     REFIT_EINVAL);
    assert_string_equal(h->dtype_name(h->host, REFIT_BF16), "bf16");
    float v[6] = {1, 2, 3, 4, 5, 6};
    refit_view view = {.data = v, .device = {REFIT_DEVICE_CPU, 0}, .dtype = REFIT_F32,
                       .ndim = 1, .shape = {6}, .strides = {1}};
    assert_int_equal(h->zero(h->host, &view, NULL), 0);
    for (int i = 0; i < 6; i++)
        assert_true(v[i] == 0.0f);
    refit_close(ctx);
}

/* Scratch is pooled: pieces of an update come from one pool, 256-byte
 * aligned and apart; the next update gets the same memory again (no
 * allocation per module or update); an update that outgrew its pool gets
 * one pool of the total at its end, so the next such update allocates
 * nothing either. */
static void test_scratch_pooled(void **state)
{
    (void)state;
    refit_ctx *ctx;
    PT_RC(NULL, refit_open(&ctx, NULL), REFIT_OK);
    const refit_host_v2 *h = &ctx->host;
    refit_device cpu = {REFIT_DEVICE_CPU, 0};
    char *a = h->scratch(h->host, cpu, 100), *b = h->scratch(h->host, cpu, 100);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal((uintptr_t)a % 256, 0);
    assert_ptr_equal(b, a + 256);
    memset(a, 1, 100);
    memset(b, 2, 100);
    host_services_update_end(ctx);
    assert_ptr_equal(h->scratch(h->host, cpu, 100), a); /* the same pool again */
    char *big = h->scratch(h->host, cpu, (size_t)3 << 20); /* past the 1 MiB pool */
    assert_non_null(big);
    assert_true(big < a || big >= a + ((size_t)1 << 20));
    memset(big, 3, (size_t)3 << 20);
    host_services_update_end(ctx); /* merged: one pool of 4 MiB */
    char *c = h->scratch(h->host, cpu, 100);
    char *d = h->scratch(h->host, cpu, (size_t)3 << 20);
    assert_non_null(c);
    assert_ptr_equal(d, c + 256); /* both from the merged pool */
    memset(d, 4, (size_t)3 << 20);
    refit_close(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refuses_version_0),
        cmocka_unit_test(test_refuses_newer_version),
        cmocka_unit_test(test_refuses_tiny_struct_size),
        cmocka_unit_test(test_refuses_struct_shorter_than_it_claims),
        cmocka_unit_test(test_refuses_missing_symbol),
        cmocka_unit_test(test_refuses_abi1_plugin),
        cmocka_unit_test(test_refuses_name_other_than_file),
        cmocka_unit_test(test_refuses_plugin_linking_core_symbol),
        cmocka_unit_test(test_refuses_world_writable_file),
        cmocka_unit_test(test_refuses_group_writable_file),
        cmocka_unit_test(test_refuses_directory_writable_by_others),
        cmocka_unit_test(test_refuses_declaration_writable_by_others),
        cmocka_unit_test(test_refuses_file_of_another_user),
        cmocka_unit_test(test_missing_file_reported_apart),
        cmocka_unit_test(test_refuses_bad_file_name),
        cmocka_unit_test(test_refuses_missing_declaration),
        cmocka_unit_test(test_refuses_invalid_declaration),
        cmocka_unit_test(test_refuses_declaration_of_another_format),
        cmocka_unit_test(test_refuses_post_load_the_declaration_lacks),
        cmocka_unit_test(test_refuses_declared_kernel_without_post_load),
        cmocka_unit_test(test_shadowed_by_the_first_found),
        cmocka_unit_test(test_search_path_order),
        cmocka_unit_test(test_no_plugin_is_no_error),
        cmocka_unit_test(test_good_plugins_end_to_end_and_dlclose),
        cmocka_unit_test(test_unknown_format_names_the_directories),
        cmocka_unit_test(test_open_survives_refusals),
        cmocka_unit_test(test_in_process_format_replaces_plugin),
        cmocka_unit_test(test_host_services_appended),
        cmocka_unit_test(test_scratch_pooled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
