/* The context's options and handles: refit_options read into a new
 * context, its strings freed at the end, and its message. A leaf with
 * ctx_base.c (its error helpers): it calls nothing else of the core's.
 * What a context is wired to at open and unwired from at close (formats,
 * host services, journal, model) is core/ctx_open.c's. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

int ctx_new(const refit_options *opt, refit_ctx **out)
{
    refit_options defaults = REFIT_OPTIONS_INIT;
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
    ctx->worker_id = dup_or_null(opt->worker_id ? opt->worker_id : "worker");
    ctx->rank = opt->rank;
    const char *jp = opt->journal_path ? opt->journal_path : getenv("REFIT_JOURNAL");
    if (jp && !*jp) /* "" turns the journal off, whatever the environment says */
        jp = NULL;
    ctx->journal_path = dup_or_null(jp);
    ctx->plugin_dirs = dup_or_null(opt->plugin_dirs);
    ctx->staging_budget = opt->staging_budget ? opt->staging_budget : (1ull << 30);
    ctx->journal_best_effort = opt->journal_best_effort != 0;
    ctx->undo_device_budget = opt->undo_device_budget;
    ctx->delta_master_budget = opt->delta_master_budget;
    ctx->log_fn = opt->log_fn;
    ctx->log_user = opt->log_user;
    if (!ctx->worker_id || (jp && !ctx->journal_path) || (opt->plugin_dirs && !ctx->plugin_dirs)) {
        ctx_free(ctx);
        return REFIT_ENOMEM;
    }
    *out = ctx;
    return REFIT_OK;
}

void ctx_free(refit_ctx *ctx)
{
    free(ctx->worker_id);
    free(ctx->journal_path);
    free(ctx->plugin_dirs);
    free(ctx);
}

/* ---- public ---- */

const char *refit_errmsg(const refit_ctx *ctx)
{
    return ctx ? ctx->errmsg : "no context";
}
