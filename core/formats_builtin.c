/* The formats of a context: none is compiled in any more; every format is a
 * plugin found on the search path (core/plugin_loader.c) and registered
 * here at refit_open, or a format the embedder registers in-process with
 * refit_format_register. Also the
 * seal-time cross-check of plans against declarations, and dlclose at
 * refit_close. */
#include <stdio.h>
#include <string.h>

#include "core/formats_builtin.h"
#include "core/ctx.h"
#include "core/model.h"
#include "core/plugin_loader.h"

/* ---- the context's formats ---- */

static void ctx_log(void *user, int level, const char *fmt, ...)
{
    refit_ctx *ctx = user;
    char line[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    ctx->host.log(ctx, level, "%s", line);
}

int formats_register_builtin(refit_ctx *ctx)
{
    int rc = plugins_open(&ctx->plugins, ctx->plugin_dirs, 0, ctx_log, ctx);
    if (rc)
        return rc;
    plugin_set *ps = ctx->plugins;
    for (size_t i = 0; i < ps->n; i++) {
        plugin_entry *e = &ps->e[i];
        if (e->state != PLUGIN_LOADED)
            continue;
        rc = refit_format_register(ctx, e->fmt);
        if (rc) { /* more formats than the registry holds: allocates nothing */
            char why[REFIT_ERRMSG_SIZE + 32];
            snprintf(why, sizeof why, "not registered: %s", ctx->errmsg);
            ctx_log(ctx, 1, "plugin %s refused: %s", e->path, why);
            plugins_refuse(ps, e, why);
        }
    }
    ctx_clear_error(ctx);
    return REFIT_OK;
}

void formats_unload(refit_ctx *ctx)
{
    plugins_close_set(ctx->plugins);
    ctx->plugins = NULL;
}

void formats_describe_path(const refit_ctx *ctx, char *buf, size_t n)
{
    plugins_describe_path(ctx->plugins, buf, n);
}

int formats_check_plan(refit_model *m)
{
    char why[REFIT_ERRMSG_SIZE];
    for (uint32_t i = 0; i < m->n_modules; i++) {
        const module *mod = &m->modules[i];
        const plugin_entry *pe = plugins_entry_of(m->ctx->plugins, mod->fmt);
        if (pe && plugins_check_module(pe, &mod->fm, why, sizeof why))
            return ctx_error(m->ctx, REFIT_EFORMAT, "seal: %s", why);
    }
    return REFIT_OK;
}

/* The embedder named fmt explicitly; a plugin of the same name was only
 * found on a path, so it steps aside while no module uses it yet. */
int formats_yield_plugin(refit_ctx *ctx, const refit_format_v2 *fmt)
{
    const refit_format_v2 *old = ctx_find_format(ctx, fmt->name);
    plugin_entry *pe = (plugin_entry *)plugins_entry_of(ctx->plugins, old);
    if (!pe || old == fmt)
        return REFIT_OK; /* not a plugin's: the usual EEXIST check answers */
    for (uint32_t i = 0; ctx->model && i < ctx->model->n_modules; i++)
        if (ctx->model->modules[i].fmt == old)
            return ctx_error(ctx, REFIT_EEXIST, "format '%s' is already registered from plugin "
                             "%s and used by module %s", fmt->name, pe->path,
                             ctx->model->modules[i].name);
    uint32_t k = 0;
    for (uint32_t i = 0; i < ctx->n_formats; i++)
        if (ctx->formats[i] != old)
            ctx->formats[k++] = ctx->formats[i];
    ctx->n_formats = k;
    ctx_log(ctx, 2, "format %s: an in-process registration replaces plugin %s", fmt->name,
            pe->path);
    plugins_set_aside(ctx->plugins, pe, "replaced by an in-process refit_format_register");
    return REFIT_OK;
}
