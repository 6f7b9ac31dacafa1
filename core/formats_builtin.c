/* The formats of a context: none is compiled in any more; every format is a
 * plugin found on the search path (core/plugin_loader.c) and registered
 * here at refit_open, or a format the embedder registers in-process with
 * refit_format_register (below: the registry's checks). Also the
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
static int formats_yield_plugin(refit_ctx *ctx, const refit_format_v2 *fmt)
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

/* ---- public ---- */

int refit_format_register(refit_ctx *ctx, const refit_format_v2 *fmt)
{
    if (!ctx)
        return REFIT_EINVAL;
    ctx_clear_error(ctx);
    if (!fmt)
        return ctx_error(ctx, REFIT_EINVAL, "refit_format_register: format is NULL");
    if (fmt->abi_version != REFIT_FORMAT_ABI_VERSION)
        return ctx_error(ctx, REFIT_EFORMAT, "invalid version %u on format '%s' (this refit knows "
                         "format ABI %d: rebuild against <refit/format.h>)", fmt->abi_version,
                         fmt->name ? fmt->name : "?", REFIT_FORMAT_ABI_VERSION);
    if (fmt->struct_size < REFIT_FORMAT_V2_MIN_SIZE)
        return ctx_error(ctx, REFIT_EFORMAT, "format '%s': struct_size %u is smaller than ABI %u's %zu",
                         fmt->name ? fmt->name : "?", fmt->struct_size, fmt->abi_version,
                         (size_t)REFIT_FORMAT_V2_MIN_SIZE);
    if (!fmt->name || !*fmt->name || !fmt->plan)
        return ctx_error(ctx, REFIT_EFORMAT, "format without %s", fmt->plan ? "a name" : "a plan function");
    if (REFIT_STRUCT_HAS(fmt, refit_format_v2, post_load_many) && fmt->post_load_many &&
        !fmt->post_load)
        return ctx_error(ctx, REFIT_EFORMAT, "format '%s' has post_load_many but no post_load "
                         "(a module completed alone needs it)", fmt->name);
    int yrc = formats_yield_plugin(ctx, fmt); /* in-process beats a plugin found on a path */
    if (yrc)
        return yrc;
    if (ctx_find_format(ctx, fmt->name))
        return ctx_error(ctx, REFIT_EEXIST, "format '%s' is already registered", fmt->name);
    if (ctx->model && ctx->model->sealed)
        return ctx_error(ctx, REFIT_ESTATE, "format '%s': the model is already sealed", fmt->name);
    if (ctx->n_formats == REFIT_MAX_FORMATS)
        return ctx_error(ctx, REFIT_ENOMEM, "format '%s': more than %d formats", fmt->name,
                         REFIT_MAX_FORMATS);
    ctx->formats[ctx->n_formats++] = fmt;
    return REFIT_OK;
}
