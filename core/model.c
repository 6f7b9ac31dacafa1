/* Model registration: modules, runtime and side tensors, expectations. */
#include <stdlib.h>
#include <string.h>

#include "core/model.h"
#include "core/desc_check.h"
#include "core/util.h"
#include "core/ctx.h"
#include "core/formats_builtin.h"
#include "core/decls.h"
#include "core/mod_version.h"
#include "kernels/fingerprint.h"

#define MODEL_CHECK(m)                                                        \
    do {                                                                      \
        if (!(m))                                                             \
            return REFIT_EINVAL;                                              \
        ctx_clear_error((m)->ctx);                                            \
    } while (0)

static int model_refuse_sealed(refit_model *m, const char *what)
{
    return ctx_error(m->ctx, REFIT_ESTATE, "%s: the model is sealed; nothing can be added",
                     what);
}

int refit_model_create(refit_model **out, refit_ctx *ctx)
{
    if (!out || !ctx)
        return REFIT_EINVAL;
    *out = NULL;
    ctx_clear_error(ctx);
    if (ctx->model)
        return ctx_error(ctx, REFIT_EEXIST, "worker %s already has a model (one per context)",
                         ctx->worker_id);
    refit_model *m = calloc(1, sizeof *m);
    if (!m)
        return ctx_error(ctx, REFIT_ENOMEM, "out of memory creating the model");
    m->ctx = ctx;
    ctx->model = m;
    *out = m;
    return REFIT_OK;
}

void model_free(refit_model *m)
{
    for (uint32_t i = 0; i < m->n_modules; i++) {
        module *mod = &m->modules[i];
        free(mod->name);
        params_free(&mod->params);
        free(mod->runtime);
        free(mod->routes);
        mod_version_drop(mod->version);
    }
    for (uint32_t i = 0; i < m->n_runtime; i++)
        free(m->runtime[i].name);
    for (uint32_t i = 0; i < m->n_side; i++)
        free(m->side[i].name);
    for (uint32_t i = 0; i < m->n_routes; i++) {
        free(m->routes[i].name);
        free(m->routes[i].target_name);
        free(m->routes[i].tie_name);
    }
    free(m->modules);
    free(m->runtime);
    free(m->side);
    free(m->routes);
    names_free(&m->module_names);
    names_free(&m->side_names);
    names_free(&m->route_names);
    mod_version_drop(m->version);
    free(m->version_text);
    m->ctx->model = NULL;
    free(m);
}

uint32_t model_find_module(const refit_model *m, const char *name)
{
    return names_find(&m->module_names, name);
}

uint32_t model_find_runtime(const refit_model *m, const module *mod, const char *name)
{
    for (uint32_t i = 0; i < mod->n_runtime; i++)
        if (!strcmp(m->runtime[mod->runtime[i]].name, name))
            return mod->runtime[i];
    return NAMES_NONE;
}

int refit_model_add_module(refit_model *m, const char *name, const char *format,
                           const char *params_text)
{
    MODEL_CHECK(m);
    refit_ctx *ctx = m->ctx;
    if (m->sealed)
        return model_refuse_sealed(m, "refit_model_add_module");
    if (!name || !*name || !format)
        return ctx_error(ctx, REFIT_EINVAL, "refit_model_add_module: name and format are required");
    const refit_format_v2 *fmt = ctx_find_format(ctx, format);
    if (!fmt) {
        char path[768];
        formats_describe_path(ctx, path, sizeof path);
        return ctx_error(ctx, REFIT_ENOTFOUND, "module %s: no format named '%s' is registered "
                         "(plugins searched in: %s)", name, format, path);
    }
    if (model_find_module(m, name) != NAMES_NONE)
        return ctx_error(ctx, REFIT_EEXIST, "module %s is already registered", name);
    if (grow_array((void **)&m->modules, &m->cap_modules, m->n_modules, sizeof *m->modules))
        return ctx_error(ctx, REFIT_ENOMEM, "module %s: out of memory", name);
    module *mod = &m->modules[m->n_modules];
    memset(mod, 0, sizeof *mod);
    char perr[256];
    int rc = params_parse(&mod->params, params_text, perr, sizeof perr);
    if (rc)
        return ctx_error(ctx, rc, "module %s: format parameters: %s", name,
                         rc == REFIT_ENOMEM ? "out of memory" : perr);
    if ((rc = decls_check_module_params(ctx, name, fmt, &mod->params))) {
        params_free(&mod->params);
        return rc;
    }
    mod->name = xstrdup(name);
    mod->fmt = fmt;
    if (!mod->name || names_insert(&m->module_names, mod->name, m->n_modules)) {
        free(mod->name);
        params_free(&mod->params);
        return ctx_error(ctx, REFIT_ENOMEM, "module %s: out of memory", name);
    }
    m->n_modules++;
    return REFIT_OK;
}

/* Shape/dtype/extent sanity of an engine descriptor (desc_check); a
 * runtime tensor (written) may not alias itself. */
static int check_descriptor(refit_model *m, const char *what, const char *name,
                            const refit_tensor *t)
{
    char why[512];
    int rc = !strcmp(what, "runtime tensor") ? desc_check_written(t, why, sizeof why)
                                             : desc_check(t, NULL, NULL, why, sizeof why);
    return rc ? ctx_error(m->ctx, rc, "%s %s: %s", what, name, why) : REFIT_OK;
}

int refit_module_bind_runtime(refit_model *m, const char *module_name, const char *name,
                              const refit_tensor *t)
{
    MODEL_CHECK(m);
    refit_ctx *ctx = m->ctx;
    if (m->sealed)
        return model_refuse_sealed(m, "refit_module_bind_runtime");
    if (!module_name || !name)
        return ctx_error(ctx, REFIT_EINVAL, "refit_module_bind_runtime: module and name are required");
    uint32_t mi = model_find_module(m, module_name);
    if (mi == NAMES_NONE)
        return ctx_error(ctx, REFIT_ENOTFOUND, "runtime %s: no module named %s", name, module_name);
    module *mod = &m->modules[mi];
    if (model_find_runtime(m, mod, name) != NAMES_NONE)
        return ctx_error(ctx, REFIT_EEXIST, "module %s: runtime tensor %s is already bound",
                         module_name, name);
    int rc = check_descriptor(m, "runtime tensor", name, t);
    if (!rc)
        rc = decls_check_bind(m, mi, name, t);
    if (rc)
        return rc;
    if (grow_array((void **)&m->runtime, &m->cap_runtime, m->n_runtime, sizeof *m->runtime) ||
        grow_array((void **)&mod->runtime, &mod->cap_runtime, mod->n_runtime, sizeof *mod->runtime))
        return ctx_error(ctx, REFIT_ENOMEM, "runtime %s: out of memory", name);
    tensor_reg *r = &m->runtime[m->n_runtime];
    memset(r, 0, sizeof *r);
    r->name = xstrdup(name);
    if (!r->name)
        return ctx_error(ctx, REFIT_ENOMEM, "runtime %s: out of memory", name);
    r->module = mi;
    r->desc = t;
    mod->runtime[mod->n_runtime++] = m->n_runtime++;
    return REFIT_OK;
}

int refit_model_add_side(refit_model *m, const char *name, const refit_tensor *t)
{
    MODEL_CHECK(m);
    refit_ctx *ctx = m->ctx;
    if (m->sealed)
        return model_refuse_sealed(m, "refit_model_add_side");
    if (!name)
        return ctx_error(ctx, REFIT_EINVAL, "refit_model_add_side: name is required");
    if (names_find(&m->side_names, name) != NAMES_NONE)
        return ctx_error(ctx, REFIT_EEXIST, "side tensor %s is already registered", name);
    int rc = check_descriptor(m, "side tensor", name, t);
    if (rc)
        return rc;
    if (grow_array((void **)&m->side, &m->cap_side, m->n_side, sizeof *m->side))
        return ctx_error(ctx, REFIT_ENOMEM, "side %s: out of memory", name);
    tensor_reg *r = &m->side[m->n_side];
    memset(r, 0, sizeof *r);
    r->name = xstrdup(name);
    if (!r->name || names_insert(&m->side_names, r->name, m->n_side)) {
        free(r->name);
        return ctx_error(ctx, REFIT_ENOMEM, "side %s: out of memory", name);
    }
    r->module = UINT32_MAX;
    r->desc = t;
    m->n_side++;
    return REFIT_OK;
}

static int check_spec(refit_model *m, const char *mod, const char *name,
                      const refit_ckpt_spec *s)
{
    char why[256];
    int rc = desc_check_spec(s, why, sizeof why);
    return rc ? ctx_error(m->ctx, rc, "module %s, tensor %s: %s", mod, name, why) : REFIT_OK;
}

int refit_model_expect(refit_model *m, const char *module_name, const char *ckpt_name,
                       const refit_ckpt_spec *spec)
{
    MODEL_CHECK(m);
    refit_ctx *ctx = m->ctx;
    if (m->sealed)
        return model_refuse_sealed(m, "refit_model_expect");
    if (!module_name || !ckpt_name || !*ckpt_name)
        return ctx_error(ctx, REFIT_EINVAL, "refit_model_expect: module and name are required");
    uint32_t mi = model_find_module(m, module_name);
    if (mi == NAMES_NONE)
        return ctx_error(ctx, REFIT_ENOTFOUND, "tensor %s: no module named %s", ckpt_name,
                         module_name);
    int rc = check_spec(m, module_name, ckpt_name, spec);
    if (rc)
        return rc;
    module *mod = &m->modules[mi];
    if (grow_array((void **)&m->routes, &m->cap_routes, m->n_routes, sizeof *m->routes) ||
        grow_array((void **)&mod->routes, &mod->cap_routes, mod->n_routes, sizeof *mod->routes))
        return ctx_error(ctx, REFIT_ENOMEM, "tensor %s: out of memory", ckpt_name);
    route *r = &m->routes[m->n_routes];
    memset(r, 0, sizeof *r);
    r->name = xstrdup(ckpt_name);
    r->target_name = xstrdup(spec->target);
    r->tie_name = xstrdup(spec->tie_of);
    if (!r->name || (spec->target && !r->target_name) || (spec->tie_of && !r->tie_name))
        goto nomem;
    rc = names_insert(&m->route_names, r->name, m->n_routes);
    if (rc == REFIT_EEXIST) {
        const route *other = &m->routes[names_find(&m->route_names, ckpt_name)];
        ctx_error(ctx, REFIT_EEXIST, "tensor %s: already expected by module %s", ckpt_name,
                  m->modules[other->module].name);
        free(r->name);
        free(r->target_name);
        free(r->tie_name);
        return REFIT_EEXIST;
    }
    if (rc)
        goto nomem;
    r->spec = *spec;
    r->spec.target = r->target_name;
    r->spec.tie_of = r->tie_name;
    r->module = mi;
    mod->routes[mod->n_routes++] = m->n_routes++;
    return REFIT_OK;
nomem:
    free(r->name);
    free(r->target_name);
    free(r->tie_name);
    return ctx_error(ctx, REFIT_ENOMEM, "tensor %s: out of memory", ckpt_name);
}

int refit_model_stats_get(const refit_model *m, refit_model_stats *out)
{
    if (!m || !out)
        return REFIT_EINVAL;
    *out = m->stats;
    return REFIT_OK;
}

refit_health model_health(const refit_model *m)
{
    if (m->txn)
        return REFIT_HEALTH_UPDATING;
    if (m->n_dirty)
        return REFIT_HEALTH_POISONED;
    if (m->n_empty)
        return REFIT_HEALTH_EMPTY;
    return REFIT_HEALTH_READY;
}

int module_fingerprint(refit_model *m, const module *mod, uint64_t *out)
{
    uint64_t h = 0;
    for (uint32_t i = 0; i < mod->n_runtime; i++) {
        const tensor_reg *r = &m->runtime[mod->runtime[i]];
        uint64_t fp;
        int rc = r->be->fingerprint(&r->view, &fp, NULL);
        if (!rc)
            rc = r->be->sync(NULL);
        if (rc)
            return rc;
        h = kern_fp_combine(h, fp);
    }
    *out = h;
    return REFIT_OK;
}

static int fingerprint_reg(refit_model *m, const tensor_reg *r, uint64_t *out)
{
    int rc = r->be->fingerprint(&r->view, out, NULL);
    if (!rc)
        rc = r->be->sync(NULL);
    if (rc)
        return ctx_error(m->ctx, rc, "fingerprint of %s failed", r->name);
    return REFIT_OK;
}

int refit_runtime_fingerprint(refit_model *m, const char *module_name, const char *name,
                              uint64_t *out)
{
    MODEL_CHECK(m);
    if (!m->sealed || !module_name || !name || !out)
        return ctx_error(m->ctx, m->sealed ? REFIT_EINVAL : REFIT_ESTATE,
                         "refit_runtime_fingerprint: %s",
                         m->sealed ? "module, name and out are required" : "model not sealed");
    uint32_t mi = model_find_module(m, module_name);
    uint32_t ri = mi == NAMES_NONE ? NAMES_NONE : model_find_runtime(m, &m->modules[mi], name);
    if (ri == NAMES_NONE)
        return ctx_error(m->ctx, REFIT_ENOTFOUND, "no runtime tensor %s in module %s", name,
                         module_name);
    return fingerprint_reg(m, &m->runtime[ri], out);
}

int refit_model_fingerprint(refit_model *m, uint64_t *out)
{
    MODEL_CHECK(m);
    if (!m->sealed || !out)
        return ctx_error(m->ctx, REFIT_ESTATE, "refit_model_fingerprint: model not sealed");
    uint64_t h = 0;
    for (uint32_t i = 0; i < m->n_runtime; i++) {
        uint64_t fp;
        int rc = fingerprint_reg(m, &m->runtime[i], &fp);
        if (rc)
            return rc;
        h = kern_fp_combine(h, fp);
    }
    *out = h;
    return REFIT_OK;
}

const char *model_version_text(const refit_model *m)
{
    if (!m->version)
        return NULL;
    return m->n_behind && m->version_text ? m->version_text : m->version->label;
}

const char *refit_module_version(const refit_model *m, const char *name)
{
    if (!m || !name)
        return NULL;
    uint32_t mi = model_find_module(m, name);
    if (mi == NAMES_NONE || m->modules[mi].state != MODULE_CLEAN || !m->modules[mi].version)
        return NULL;
    return m->modules[mi].version->label;
}
