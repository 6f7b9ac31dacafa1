/* refit_model_load_manifest: a model manifest (schemas/model.schema.yaml)
 * turned into the same calls an embedder makes by hand, with every refusal
 * made before the first one (the file is validated and checked against the
 * context's formats, the model's names and this worker's rank), and the
 * model put back as it was if a call still fails (out of memory). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "core/ctx.h"
#include "core/formats_builtin.h"
#include "core/model.h"
#include "core/decls.h"
#include "core/manifest.h"
#include "core/plugin_loader.h"
#include "schemas/model_doc.h"

/* ---- errors with positions ---- */

static int at_error(refit_ctx *ctx, int rc, const char *file, ypos at, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int at_error(refit_ctx *ctx, int rc, const char *file, ypos at, const char *fmt, ...)
{
    char why[REFIT_ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return ctx_error(ctx, rc, "%s:%u:%u: %s", file, at.line, at.col, why);
}

/* A call of the API failed: put the manifest position in front. */
static int at_prefix(refit_ctx *ctx, int rc, const char *file, ypos at)
{
    char why[REFIT_ERRMSG_SIZE];
    memcpy(why, ctx->errmsg, sizeof why);
    return at_error(ctx, rc, file, at, "%s", why);
}

/* ---- checks before anything is added ---- */

static int pre_params(refit_ctx *ctx, const mdoc *doc, const mdoc_mod *mod,
                      const plugin_entry *pe)
{
    const char **kv = malloc((2 * mod->n_params + 1) * sizeof *kv);
    if (!kv)
        return ctx_error(ctx, REFIT_ENOMEM, "module %s: out of memory", mod->name);
    for (size_t i = 0; i < mod->n_params; i++) {
        kv[i] = mod->params[i].key;
        kv[mod->n_params + i] = mod->params[i].value;
    }
    char why[REFIT_ERRMSG_SIZE - 64];
    size_t bad;
    int rc = decls_check_params(pe->decl, mod->name, kv, kv + mod->n_params, mod->n_params, &bad,
                               why, sizeof why);
    free(kv);
    if (rc)
        return at_error(ctx, rc, doc->file, bad < mod->n_params ? mod->params[bad].at : mod->at,
                        "%s", why);
    return REFIT_OK;
}

static int pre_module(refit_model *m, const mdoc *doc, const mdoc_mod *mod)
{
    refit_ctx *ctx = m->ctx;
    const refit_format_v2 *fmt = ctx_find_format(ctx, mod->format);
    if (!fmt) {
        char path[768];
        formats_describe_path(ctx, path, sizeof path);
        return at_error(ctx, REFIT_ENOTFOUND, doc->file, mod->format_at, "module %s: no format "
                        "named '%s' is registered (plugins searched in: %s)", mod->name,
                        mod->format, path);
    }
    if (model_find_module(m, mod->name) != NAMES_NONE)
        return at_error(ctx, REFIT_EEXIST, doc->file, mod->at, "module %s is already "
                        "registered", mod->name);
    const plugin_entry *pe = plugins_entry_of(ctx->plugins, fmt);
    int rc = pe ? pre_params(ctx, doc, mod, pe) : REFIT_OK;
    for (size_t i = 0; i < mod->n_ck && !rc; i++) {
        const mdoc_ck *c = &mod->ck[i];
        uint32_t r = names_find(&m->route_names, c->name);
        int32_t rank = c->shard_rank >= 0 ? c->shard_rank : ctx->rank;
        if (r != NAMES_NONE)
            rc = at_error(ctx, REFIT_EEXIST, doc->file, c->at, "tensor %s: already expected "
                          "by module %s", c->name, m->modules[m->routes[r].module].name);
        else if (!c->tie && c->shard_count > 1 && (rank < 0 || rank >= c->shard_count))
            rc = at_error(ctx, REFIT_EINVAL, doc->file, c->shard_at, "tensor %s: %d shards, "
                          "but this worker's rank is %d (set shard.rank to override)", c->name,
                          c->shard_count, rank);
    }
    return rc;
}

/* ---- the calls ---- */

/* A flat YAML flow mapping of the module's parameters, every value a
 * double-quoted string (escaped), for refit_model_add_module. */
static char *params_text(const mdoc_mod *mod)
{
    size_t cap = 3;
    for (size_t i = 0; i < mod->n_params; i++)
        cap += 4 * (strlen(mod->params[i].key) + strlen(mod->params[i].value)) + 8;
    char *s = malloc(cap), *o = s;
    if (!s)
        return NULL;
    *o++ = '{';
    for (size_t i = 0; i < mod->n_params; i++) {
        const char *parts[2] = {mod->params[i].key, mod->params[i].value};
        if (i) {
            *o++ = ',';
            *o++ = ' ';
        }
        for (int k = 0; k < 2; k++) {
            *o++ = '"';
            for (const unsigned char *p = (const unsigned char *)parts[k]; *p; p++) {
                if (*p == '"' || *p == '\\')
                    *o++ = '\\';
                if (*p < 0x20)
                    o += sprintf(o, "\\x%02x", *p);
                else
                    *o++ = (char)*p;
            }
            *o++ = '"';
            if (!k) {
                *o++ = ':';
                *o++ = ' ';
            }
        }
    }
    *o++ = '}';
    *o = '\0';
    return s;
}

static void fill_spec(refit_ckpt_spec *s, const mdoc_ck *c, int32_t rank)
{
    refit_ckpt_spec init = REFIT_CKPT_SPEC_INIT;
    *s = init;
    if (c->tie) {
        s->tie_of = c->tie;
        return;
    }
    s->dtype = c->dtype;
    s->ndim = c->ndim;
    memcpy(s->shape, c->shape, sizeof s->shape);
    s->target = c->target;
    s->shard_dim = c->shard_dim;
    s->shard_count = c->shard_count;
    s->shard_rank = c->shard_count > 1 ? (c->shard_rank >= 0 ? c->shard_rank : rank) : 0;
    s->pad_to = c->pad_to;
    s->expert = c->expert;
    memcpy(s->dst_offset, c->dst_offset, sizeof s->dst_offset);
}

static int decls_reserve(refit_model *m, uint32_t n_mods)
{
    if (!m->decls && !(m->decls = calloc(1, sizeof *m->decls)))
        return REFIT_ENOMEM;
    struct manifest_decls *d = m->decls;
    if (n_mods <= d->n_mods)
        return REFIT_OK;
    decl_mod *p = realloc(d->mods, (size_t)n_mods * sizeof *p);
    if (!p)
        return REFIT_ENOMEM;
    memset(p + d->n_mods, 0, (size_t)(n_mods - d->n_mods) * sizeof *p);
    d->mods = p;
    d->n_mods = n_mods;
    return REFIT_OK;
}

static int decls_add(refit_model *m, uint32_t mi, const mdoc_mod *mod, const char *file)
{
    if (decls_reserve(m, mi + 1))
        return REFIT_ENOMEM;
    decl_mod *dm = &m->decls->mods[mi];
    dm->rt = calloc(mod->n_rt ? mod->n_rt : 1, sizeof *dm->rt);
    if (!dm->rt)
        return REFIT_ENOMEM;
    for (size_t i = 0; i < mod->n_rt; i++) {
        decl_rt *r = &dm->rt[dm->n_rt];
        r->name = xstrdup(mod->rt[i].name);
        if (!r->name)
            return REFIT_ENOMEM;
        r->dtype = mod->rt[i].dtype;
        r->ndim = mod->rt[i].ndim;
        memcpy(r->shape, mod->rt[i].shape, sizeof r->shape);
        r->at = mod->rt[i].at;
        dm->n_rt++;
    }
    dm->file = file;
    return REFIT_OK;
}

static int apply_module(refit_model *m, const mdoc *doc, const mdoc_mod *mod, const char *file)
{
    refit_ctx *ctx = m->ctx;
    char *params = params_text(mod);
    if (!params)
        return ctx_error(ctx, REFIT_ENOMEM, "manifest %s: out of memory", doc->file);
    int rc = refit_model_add_module(m, mod->name, mod->format, params);
    free(params);
    if (rc)
        return at_prefix(ctx, rc, doc->file, mod->at);
    if (decls_add(m, m->n_modules - 1, mod, file))
        return ctx_error(ctx, REFIT_ENOMEM, "manifest %s: out of memory", doc->file);
    for (size_t i = 0; i < mod->n_ck; i++) {
        refit_ckpt_spec spec;
        fill_spec(&spec, &mod->ck[i], ctx->rank);
        rc = refit_model_expect(m, mod->name, mod->ck[i].name, &spec);
        if (rc)
            return at_prefix(ctx, rc, doc->file, mod->ck[i].at);
    }
    return REFIT_OK;
}

/* ---- putting the model back ---- */

/* Name tables have no delete: build the kept part anew, then swap. Fails
 * (leaving everything) only when that allocation fails. */
static int rebuild_names(refit_model *m, uint32_t n_mod, uint32_t n_route)
{
    names mods = {0}, routes = {0};
    int rc = REFIT_OK;
    for (uint32_t i = 0; i < n_mod && !rc; i++)
        rc = names_insert(&mods, m->modules[i].name, i);
    for (uint32_t i = 0; i < n_route && !rc; i++)
        rc = names_insert(&routes, m->routes[i].name, i);
    if (rc) {
        names_free(&mods);
        names_free(&routes);
        return rc;
    }
    names_free(&m->module_names);
    names_free(&m->route_names);
    m->module_names = mods;
    m->route_names = routes;
    return REFIT_OK;
}

static int rollback(refit_model *m, uint32_t n_mod, uint32_t n_route)
{
    if (rebuild_names(m, n_mod, n_route))
        return REFIT_ENOMEM;
    for (uint32_t i = n_route; i < m->n_routes; i++) {
        free(m->routes[i].name);
        free(m->routes[i].target_name);
        free(m->routes[i].tie_name);
    }
    for (uint32_t i = n_mod; i < m->n_modules; i++) {
        module *mod = &m->modules[i];
        free(mod->name);
        params_free(&mod->params);
        free(mod->runtime);
        free(mod->routes);
        memset(mod, 0, sizeof *mod);
        if (m->decls && i < m->decls->n_mods)
            decl_mod_free(&m->decls->mods[i]);
    }
    m->n_routes = n_route;
    m->n_modules = n_mod;
    return REFIT_OK;
}

static int keep_file(refit_model *m, const char *path, const char **out)
{
    if (decls_reserve(m, 0))
        return REFIT_ENOMEM;
    struct manifest_decls *d = m->decls;
    char **p = realloc(d->files, ((size_t)d->n_files + 1) * sizeof *p);
    if (!p)
        return REFIT_ENOMEM;
    d->files = p;
    if (!(d->files[d->n_files] = xstrdup(path)))
        return REFIT_ENOMEM;
    *out = d->files[d->n_files++];
    return REFIT_OK;
}

static int load_doc(refit_model *m, const mdoc *doc, const char *path)
{
    refit_ctx *ctx = m->ctx;
    int rc = REFIT_OK;
    for (size_t i = 0; i < doc->n_mods && !rc; i++)
        rc = pre_module(m, doc, &doc->mods[i]);
    const char *file = NULL;
    if (!rc && keep_file(m, path, &file))
        rc = ctx_error(ctx, REFIT_ENOMEM, "manifest %s: out of memory", path);
    uint32_t n_mod = m->n_modules, n_route = m->n_routes;
    for (size_t i = 0; i < doc->n_mods && !rc; i++)
        rc = apply_module(m, doc, &doc->mods[i], file);
    if (rc && (m->n_modules != n_mod || m->n_routes != n_route) &&
        rollback(m, n_mod, n_route)) {
        char why[REFIT_ERRMSG_SIZE];
        memcpy(why, ctx->errmsg, sizeof why);
        ctx_error(ctx, rc, "%s (and out of memory putting the model back: the modules "
                  "added before the failure stay)", why);
    }
    return rc;
}

int refit_model_load_manifest(refit_model *m, const char *path)
{
    if (!m)
        return REFIT_EINVAL;
    refit_ctx *ctx = m->ctx;
    ctx_clear_error(ctx);
    if (!path)
        return ctx_error(ctx, REFIT_EINVAL, "refit_model_load_manifest: path is NULL");
    if (m->sealed)
        return ctx_error(ctx, REFIT_ESTATE, "refit_model_load_manifest: the model is sealed; "
                         "nothing can be added");
    sdiags d = {.max = 16};
    mdoc *doc = NULL;
    int rc = mdoc_load_file(&doc, path, &d);
    if (rc == REFIT_ENOMEM || (!rc && d.oom))
        rc = ctx_error(ctx, REFIT_ENOMEM, "manifest %s: out of memory", path);
    else if (rc)
        ctx_error(ctx, rc, "%s%s", sdiags_first(&d), sdiags_count(&d) > 1
                  ? " (and more: `refitctl validate FILE` lists every mistake)" : "");
    else
        rc = load_doc(m, doc, path);
    sdiags_free(&d);
    mdoc_free(doc);
    return rc;
}

/* ---- declared runtime tensors ---- */

int manifest_check_bound(refit_model *m)
{
    for (uint32_t mi = 0; mi < m->n_modules; mi++) {
        const decl_mod *dm = decls_of(m, mi);
        for (uint32_t i = 0; dm && i < dm->n_rt; i++)
            if (model_find_runtime(m, &m->modules[mi], dm->rt[i].name) == NAMES_NONE)
                return ctx_error(m->ctx, REFIT_EINVAL, "seal: module %s: runtime tensor %s, "
                                 "declared at %s:%u:%u, was never bound "
                                 "(refit_module_bind_runtime)", m->modules[mi].name,
                                 dm->rt[i].name, dm->file, dm->rt[i].at.line, dm->rt[i].at.col);
    }
    return REFIT_OK;
}
