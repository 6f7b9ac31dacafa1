/* The worker's health as the API reads it, derived from the model's
 * module states (docs/core.md "Worker health"): refit_worker_health,
 * refit_worker_version and refit_check_serving. It calls model.c only;
 * metrics.c and the transports call it. */
#include <stddef.h>

#include "core/ctx.h"
#include "core/model.h"

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
