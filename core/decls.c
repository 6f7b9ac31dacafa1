/* What a manifest declares, checked as an embedder's calls arrive
 * (core/decls.h): the format parameters of refit_model_add_module and the
 * runtime tensors of refit_module_bind_runtime. Calls only the leaves and
 * the plugin vetting, so model.c and manifest.c both call it and the
 * manifest stays above the model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/decls.h"
#include "core/ctx.h"
#include "core/model.h"
#include "core/plugin_loader.h"

/* Parameters (keys[i], values[i]) against the format's declaration, the
 * same for a manifest and for refit_model_add_module: REFIT_OK, or
 * REFIT_EINVAL with why and *bad the index at fault (n: a required one is
 * missing). */
int decls_check_params(const fdecl *d, const char *module, const char *const *keys,
                       const char *const *values, size_t n, size_t *bad, char *why, size_t wn)
{
    for (size_t i = 0; i < n; i++) {
        const fdecl_param *fp = fdecl_param_find(d, keys[i]);
        const char *err = fp ? fdecl_param_check(fp, values[i]) : NULL;
        *bad = i;
        if (!fp) {
            snprintf(why, wn, "module %s: format %s has no parameter '%s' (its declaration: "
                     "%s)", module, d->name, keys[i], d->file);
            return REFIT_EINVAL;
        }
        if (err) {
            snprintf(why, wn, "module %s: parameter %s of format %s: '%s': %s", module, keys[i],
                     d->name, values[i], err);
            return REFIT_EINVAL;
        }
    }
    *bad = n;
    for (size_t i = 0; i < d->n_params; i++) {
        int have = 0;
        for (size_t j = 0; j < n && !have; j++)
            have = !strcmp(keys[j], d->params[i].name);
        if (d->params[i].required && !have) {
            snprintf(why, wn, "module %s: format %s requires parameter '%s'", module, d->name,
                     d->params[i].name);
            return REFIT_EINVAL;
        }
    }
    return REFIT_OK;
}

int decls_check_module_params(refit_ctx *ctx, const char *module, const refit_format_v2 *fmt,
                          const params *p)
{
    const plugin_entry *pe = plugins_entry_of(ctx->plugins, fmt);
    if (!pe || !pe->decl)
        return REFIT_OK; /* a format registered in code declares nothing */
    char why[REFIT_ERRMSG_SIZE];
    size_t bad;
    int rc = decls_check_params(pe->decl, module, (const char *const *)p->keys,
                               (const char *const *)p->values, p->n, &bad, why, sizeof why);
    return rc ? ctx_error(ctx, rc, "%s", why) : REFIT_OK;
}

/* ---- declared runtime tensors ---- */

const decl_mod *decls_of(const refit_model *m, uint32_t mi)
{
    if (!m->decls || mi >= m->decls->n_mods || !m->decls->mods[mi].file)
        return NULL;
    return &m->decls->mods[mi];
}

static void shape_text(char *buf, size_t n, refit_dtype dt, int32_t ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, n, "%s [", refit_dtype_name(dt));
    for (int32_t i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "",
                                 (long long)shape[i]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

static int same_decl(const decl_rt *r, const refit_tensor *t)
{
    if (r->dtype.code != t->dtype.code || r->dtype.bits != t->dtype.bits ||
        r->dtype.lanes != t->dtype.lanes || r->ndim != t->ndim)
        return 0;
    for (int32_t i = 0; i < r->ndim; i++)
        if (r->shape[i] != t->shape[i])
            return 0;
    return 1;
}

int decls_check_bind(refit_model *m, uint32_t mi, const char *name, const refit_tensor *t)
{
    const decl_mod *dm = decls_of(m, mi);
    if (!dm)
        return REFIT_OK;
    const char *mod = m->modules[mi].name;
    for (uint32_t i = 0; i < dm->n_rt; i++) {
        const decl_rt *r = &dm->rt[i];
        if (strcmp(r->name, name))
            continue;
        if (same_decl(r, t))
            return REFIT_OK;
        char got[160], want[160];
        shape_text(got, sizeof got, t->dtype, t->ndim, t->shape);
        shape_text(want, sizeof want, r->dtype, r->ndim, r->shape);
        return ctx_error(m->ctx, REFIT_EMISMATCH, "module %s, runtime tensor %s: bound as %s, "
                         "but %s:%u:%u declares %s", mod, name, got, dm->file, r->at.line,
                         r->at.col, want);
    }
    return ctx_error(m->ctx, REFIT_ENOTFOUND, "module %s: runtime tensor %s is not among the "
                     "%u its manifest %s declares%s%s", mod, name, dm->n_rt, dm->file,
                     dm->n_rt ? " (the first: " : "", dm->n_rt ? dm->rt[0].name : "");
}

void decl_mod_free(decl_mod *dm)
{
    for (uint32_t i = 0; i < dm->n_rt; i++)
        free(dm->rt[i].name);
    free(dm->rt);
    memset(dm, 0, sizeof *dm);
}

void decls_free(refit_model *m)
{
    struct manifest_decls *d = m->decls;
    if (!d)
        return;
    for (uint32_t i = 0; i < d->n_mods; i++)
        decl_mod_free(&d->mods[i]);
    for (uint32_t i = 0; i < d->n_files; i++)
        free(d->files[i]);
    free(d->mods);
    free(d->files);
    free(d);
    m->decls = NULL;
}
