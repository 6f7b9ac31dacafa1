/* gpu_many.h: one refit_load_many of a paired model, through the
 * format's own plugin file with its post-loads watched. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <refit/format.h>
#include <refit/refit.h>

#include "core/cuda/backend_cuda.h"
#include "gpu_many.h"
#include "schemas/plugin_paths.h" /* where find_plugin looks */

/* Every checkpoint tensor of version v in one refit_load_many (rollback
 * on) from w's memory (device memory for the device world, unless
 * on-host), `off` bytes past a 64-byte boundary (0: read in place by the
 * post-loads; 16: staged); tensor bad_at gets defect bad. Returns
 * finalize's status; msg (size MANY_MSG) gets its message, and a
 * txn finalize left open is aborted. */
#define MANY_MSG 1024

static const void *many_src[PAIR_MAX_CK]; /* the last many_update's sources */
static int many_n;

static int many_update(pair_world *w, const pair_format *f, int v, size_t off, int bad_at,
                       int bad, char *msg)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    char label[32];
    snprintf(label, sizeof label, "v%d", v);
    o.version_label = label;
    o.rollback = 1;
    refit_txn *t;
    OK(w, refit_begin(&t, w->m, &o));
    const char *names[PAIR_MAX_CK];
    refit_tensor src[PAIR_MAX_CK];
    void *buf[PAIR_MAX_CK];
    int on_device = w->device && !pair_on_host_only();
    for (int i = 0; i < w->n_ck; i++) {
        const pair_ck *c = &w->ck[i];
        size_t n;
        void *b = f->ckpt_bytes(c, v, i == bad_at ? bad : 0, &n);
        buf[i] = pair_mem_alloc(w->device, n + off + 64);
        char *at = (char *)(((uintptr_t)buf[i] + 63) & ~(uintptr_t)63) + off;
        pair_mem_put(w->device, at, b, n);
        free(b);
        names[i] = c->name;
        src[i] = (refit_tensor){.data = at,
                                .device = {on_device ? REFIT_DEVICE_CUDA : REFIT_DEVICE_CPU, 0},
                                .ndim = c->ndim, .dtype = c->dtype,
                                .shape = (int64_t *)c->shape};
    }
    for (int i = 0; i < w->n_ck; i++)
        many_src[i] = src[i].data;
    many_n = w->n_ck;
    int rc = refit_load_many(t, (size_t)w->n_ck, names, src, NULL);
    if (rc)
        fail_msg("load_many v%d: %s: %s [%s]", v, refit_status_name(rc), refit_errmsg(w->ctx),
                 backend_cuda_last_error());
    rc = refit_finalize(t);
    snprintf(msg, MANY_MSG, "%s", rc ? refit_errmsg(w->ctx) : "");
    if (refit_worker_health(w->ctx) == REFIT_HEALTH_UPDATING)
        refit_abort(t);
    for (int i = 0; i < w->n_ck; i++)
        pair_mem_free(w->device, buf[i]);
    return rc;
}

/* The format's plugin file where the loader looks (REFIT_PLUGIN_PATH,
 * the install folder, the build's plugin folder), with its plan and post-loads watched:
 * a world that registers it (open_watched) counts post_load and
 * post_load_many calls and, for each staged view they read, whether it is
 * one of many_update's sources (read in place) or a staged copy. */
static const refit_format_v2 *plugin_fmt;
static refit_format_v2 watched_fmt;
static struct {
    int many, one, in_place, staged;
} seen;

static int watched_in(const void *p)
{
    for (int i = 0; i < many_n; i++)
        if (many_src[i] == p)
            return 1;
    return 0;
}

static void watch_staged(const refit_fmt_module *m)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, i);
        if (c->route == REFIT_ROUTE_STAGED)
            *(watched_in(c->staged.data) ? &seen.in_place : &seen.staged) += 1;
    }
}

static int watch_post_load(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    seen.one++;
    watch_staged(m);
    return plugin_fmt->post_load(h, m, stream);
}

static int watch_post_load_many(const refit_host_v2 *h, const refit_fmt_module *const *m,
                                uint32_t n, void *stream)
{
    seen.many++;
    for (uint32_t k = 0; k < n; k++)
        watch_staged(m[k]);
    if (!REFIT_STRUCT_HAS(plugin_fmt, refit_format_v2, post_load_many) ||
        !plugin_fmt->post_load_many)
        fail_msg("format %s has no post_load_many: the %u modules of one call would take a "
                 "post_load each", plugin_fmt->name, n);
    return plugin_fmt->post_load_many(h, m, n, stream);
}

static const refit_format_v2 *find_plugin(const char *name)
{
    char file[64], path[4096];
    snprintf(file, sizeof file, "refit-fmt-%s.so", name);
    const char *env = getenv("REFIT_PLUGIN_PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s%s%s:%s", env ? env : "", env ? ":" : "",
             REFIT_PLUGIN_INSTALL_DIR, REFIT_PLUGIN_BUILD_DIR);
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(path, sizeof path, "%s/%s", d, file);
        void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        const refit_format_v2 *f = lib ? dlsym(lib, "refit_format_plugin_v2") : NULL;
        if (f)
            return f; /* kept open for the program */
    }
    fail_msg("%s found nowhere on REFIT_PLUGIN_PATH, in %s or in %s", file,
             REFIT_PLUGIN_INSTALL_DIR, REFIT_PLUGIN_BUILD_DIR);
    return NULL;
}

/* pair_open's device world with the watched plugin registered. */
static void open_watched(pair_world *w, const pair_format *f)
{
    if (!plugin_fmt)
        plugin_fmt = find_plugin(f->worker);
    watched_fmt = *plugin_fmt;
    watched_fmt.post_load = watch_post_load;
    watched_fmt.post_load_many = watch_post_load_many;
    memset(w, 0, sizeof *w);
    w->device = 1;
    char id[48];
    snprintf(id, sizeof id, "gpu-%s-watched", f->worker);
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = id;
    assert_int_equal(refit_open(&w->ctx, &o), REFIT_OK);
    OK(w, refit_format_register(w->ctx, &watched_fmt));
    OK(w, refit_model_create(&w->m, w->ctx));
    f->build(w);
    OK(w, refit_model_seal(w->m));
}

/* Every module in one refit_load_many (one post_load_many, one launcher
 * call on the device) gives the bytes one refit_load a tensor gives, on
 * the device and on the host (the CPU reference), read in place from
 * aligned device sources or from staged copies of unaligned ones; through
 * the watched plugin file, one post_load_many for the call, and aligned
 * sources are read where they lie. */
void pair_check_load_many_watched(void **state, const pair_format *f)
{
    WORLDS(state, d, h);
    char msg[MANY_MSG];
    pair_update(h, 41, SRC_PAGEABLE, NULL);
    assert_int_equal(many_update(d, f, 41, 0, -1, 0, msg), REFIT_OK);
    pair_assert_same(d, h, "load_many in place against the host's refit_load a tensor");
    size_t n1, n2;
    char *many = pair_snapshot(d, &n1);
    pair_update(d, 42, SRC_DEVICE, NULL);
    pair_update(d, 41, SRC_DEVICE, NULL);
    char *each = pair_snapshot(d, &n2);
    assert_int_equal(n1, n2);
    pair_assert_snap(d, many, each, n1, "refit_load a tensor against load_many, on the device");
    assert_int_equal(many_update(d, f, 43, 16, -1, 0, msg), REFIT_OK);
    pair_update(h, 43, SRC_PAGEABLE, NULL);
    pair_assert_same(d, h, "load_many staged against the host's refit_load a tensor");
    /* the plugin's post_load_many, once for the call; in place, then staged */
    pair_world wd;
    open_watched(&wd, f);
    memset(&seen, 0, sizeof seen);
    assert_int_equal(many_update(&wd, f, 44, 0, -1, 0, msg), REFIT_OK);
    assert_int_equal(seen.many, 1);
    assert_int_equal(seen.one, 0);
    assert_int_equal(seen.staged, 0);
    assert_true(seen.in_place > 0);
    pair_update(h, 44, SRC_PAGEABLE, NULL);
    pair_assert_same(&wd, h, "the watched plugin's load_many in place against the host");
    memset(&seen, 0, sizeof seen);
    assert_int_equal(many_update(&wd, f, 45, 16, -1, 0, msg), REFIT_OK);
    assert_int_equal(seen.many, 1);
    assert_int_equal(seen.in_place, 0);
    assert_true(seen.staged > 0);
    pair_close(&wd);
    free(many);
    free(each);
}

/* A defect (pair_deliver's: 1 a NaN, 2 a wrong weight_shape) in one
 * tensor of the call, each of bads[] in turn: every row is taken,
 * finalize fails naming that module, tensor and reason, the rollback
 * keeps every byte and the version. */
void pair_check_load_many_refused(void **state, const pair_format *f, const int *bads,
                                  int n_bads, int defect, const char *reason)
{
    WORLDS(state, d, h);
    (void)h;
    char msg[MANY_MSG];
    assert_int_equal(many_update(d, f, 51, 0, -1, 0, msg), REFIT_OK);
    size_t n0, n1;
    char *before = pair_snapshot(d, &n0);
    for (int k = 0; k < n_bads; k++) {
        const pair_ck *c = &d->ck[bads[k]];
        assert_int_equal(many_update(d, f, 52, 0, bads[k], defect, msg), REFIT_ECORRUPT);
        if (!strstr(msg, c->module) || !strstr(msg, c->name) || !strstr(msg, reason))
            fail_msg("message \"%s\" lacks module %s, tensor %s or \"%s\"", msg, c->module,
                     c->name, reason);
        assert_int_equal(refit_worker_health(d->ctx), REFIT_HEALTH_READY);
        assert_string_equal(refit_worker_version(d->ctx), "v51");
        char *after = pair_snapshot(d, &n1);
        assert_int_equal(n0, n1);
        pair_assert_snap(d, before, after, n0, c->name);
        free(after);
    }
    free(before);
}

void pair_check_load_many_nan(void **state, const pair_format *f, const int *bads, int n_bads)
{
    pair_check_load_many_refused(state, f, bads, n_bads, 1, "NaN or infinity");
}

