/* The context: one per engine worker. Holds the error message, the format
 * registry and the model. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/util.h"
#include "core/formats_builtin.h"
#include "core/model.h"
#include "core/txn_journal.h"
#include "core/host_services.h"

/* ---- public ---- */

int refit_open(refit_ctx **out, const refit_options *opt)
{
    refit_options defaults = REFIT_OPTIONS_INIT;
    if (!out)
        return REFIT_EINVAL;
    *out = NULL;
    if (!opt)
        opt = &defaults;
    if (opt->version < 1 || opt->version > REFIT_OPTIONS_VERSION)
        return REFIT_EINVAL;
    /* A version 1 caller's struct ends at journal_best_effort: read no
     * further, the rest keeps its defaults. */
    refit_options o = defaults;
    if (opt->version == 1)
        memcpy(&o, opt, offsetof(refit_options, undo_device_budget));
    else if (opt->version == 2)
        memcpy(&o, opt, offsetof(refit_options, delta_master_budget));
    else
        o = *opt;
    o.version = REFIT_OPTIONS_VERSION;
    opt = &o;
    refit_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return REFIT_ENOMEM;
    ctx->worker_id = xstrdup(opt->worker_id ? opt->worker_id : "worker");
    ctx->rank = opt->rank;
    const char *jp = opt->journal_path ? opt->journal_path : getenv("REFIT_JOURNAL");
    if (jp && !*jp) /* "" turns the journal off, whatever the environment says */
        jp = NULL;
    ctx->journal_path = xstrdup(jp);
    ctx->plugin_dirs = xstrdup(opt->plugin_dirs);
    ctx->staging_budget = opt->staging_budget ? opt->staging_budget : (1ull << 30);
    ctx->journal_best_effort = opt->journal_best_effort != 0;
    ctx->undo_device_budget = opt->undo_device_budget;
    ctx->delta_master_budget = opt->delta_master_budget;
    ctx->log_fn = opt->log_fn;
    ctx->log_user = opt->log_user;
    host_services_init(ctx); /* the one place the host table is filled */
    int rc = REFIT_ENOMEM;
    if (!ctx->worker_id || (jp && !ctx->journal_path) ||
        (opt->plugin_dirs && !ctx->plugin_dirs) ||
        (rc = formats_register_builtin(ctx)) != REFIT_OK) {
        refit_close(ctx);
        return rc;
    }
    txj_open(ctx); /* a failure is kept for begin to report */
    *out = ctx;
    return REFIT_OK;
}

void refit_close(refit_ctx *ctx)
{
    if (!ctx)
        return;
    refit_model_destroy(ctx->model);
    formats_unload(ctx); /* after the model: its modules may call release */
    host_services_free(ctx);
    txj_close(ctx);
    free(ctx->worker_id);
    free(ctx->journal_path);
    free(ctx->plugin_dirs);
    free(ctx);
}

const char *refit_errmsg(const refit_ctx *ctx)
{
    return ctx ? ctx->errmsg : "no context";
}

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

refit_health refit_worker_health(const refit_ctx *ctx)
{
    if (!ctx || !ctx->model || !ctx->model->sealed)
        return REFIT_HEALTH_EMPTY;
    return model_health(ctx->model);
}

const char *refit_worker_version(const refit_ctx *ctx)
{
    if (refit_worker_health(ctx) != REFIT_HEALTH_READY)
        return NULL;
    return model_version_text(ctx->model);
}

int refit_check_serving(refit_ctx *ctx)
{
    if (!ctx)
        return REFIT_EINVAL;
    ctx_clear_error(ctx);
    refit_model *m = ctx->model;
    switch (refit_worker_health(ctx)) {
    case REFIT_HEALTH_READY:
        return REFIT_OK;
    case REFIT_HEALTH_POISONED:
        return ctx_error(ctx, REFIT_EPOISONED,
                         "worker %s is POISONED: %u module(s) hold bytes of an aborted update; "
                         "serving refused until a replay or full reload succeeds",
                         ctx->worker_id, m->n_dirty);
    case REFIT_HEALTH_UPDATING:
        return ctx_error(ctx, REFIT_ESTATE, "worker %s is UPDATING: an update is open",
                         ctx->worker_id);
    case REFIT_HEALTH_EMPTY:
    default:
        return ctx_error(ctx, REFIT_ESTATE, "worker %s is EMPTY: %s", ctx->worker_id,
                         !m || !m->sealed ? "no sealed model"
                                          : "some modules were never loaded");
    }
}
