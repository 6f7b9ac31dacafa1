/* The context's metrics: counters, histograms and gauges of one worker
 * (docs/operators.md "Metrics"), and refit_metrics_text. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <refit/refit.h>

#include "core/ctx.h"
#include "core/metrics.h"
#include "core/metrics_text.h"

double metrics_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void metrics_begin(refit_ctx *ctx, metrics_clock *c, int rc)
{
    if (rc < 0) {
        metrics_refusal(&ctx->metrics, rc);
        return;
    }
    c->loading = metrics_now();
    c->begin_s = c->loading - c->begun;
    ctx->metrics.started++;
    ctx->metrics.replays_started += c->replay;
    ctx->metrics.restores_started += c->restore;
}

void metrics_refused(refit_ctx *ctx, int status)
{
    metrics_refusal(&ctx->metrics, status);
}

void metrics_route_bytes(refit_ctx *ctx, metrics_clock *c, const refit_format_v2 *fmt,
                         uint32_t route, uint64_t bytes)
{
    if (!fmt || route < REFIT_ROUTE_DIRECT || route > REFIT_ROUTE_STAGED)
        return;
    metrics_format_bytes *slot = c->route_slot;
    if (!slot || slot->format != fmt->name) {
        /* another format than the last load's: a few per model, the slot
         * found in a handful of compares */
        slot = ctx->metrics_formats;
        while (slot < ctx->metrics_formats + REFIT_MAX_FORMATS && slot->format &&
               slot->format != fmt->name)
            slot++;
        if (slot == ctx->metrics_formats + REFIT_MAX_FORMATS)
            return;
        slot->format = fmt->name;
        c->route_slot = slot;
    }
    slot->route[route - REFIT_ROUTE_DIRECT] += bytes;
}

void metrics_update_end(refit_ctx *ctx, metrics_clock *c, const metrics_end *e)
{
    metrics_worker *w = &ctx->metrics;
    double now = metrics_now();
    if (!c->ending)
        c->ending = now;
    if (e->committed) {
        w->committed++;
        w->replays_committed += c->replay;
        w->restores_committed += c->restore;
        w->commit_time = (double)time(NULL);
    } else {
        metrics_reason r = metrics_reason_of(e->error, false);
        w->aborted[r]++;
        w->poisoned[r] += e->poisoned;
        w->rollbacks += e->restored;
    }
    w->source_bytes[metrics_source_of(e->source_uri)] += e->bytes;
    metrics_observe(&w->duration[e->committed ? METRICS_COMMITTED : METRICS_ABORTED], true,
                    now - c->begun);
    metrics_observe(&w->phase[METRICS_PHASE_BEGIN], true, c->begin_s);
    metrics_observe(&w->phase[METRICS_PHASE_LOAD], true, c->ending - c->loading);
    metrics_observe(&w->phase[METRICS_PHASE_POST_LOAD], true, c->post_load_s);
    metrics_observe(&w->phase[METRICS_PHASE_FINALIZE], true, now - c->ending);
    metrics_observe(&w->phase[METRICS_PHASE_JOURNAL], true, ctx->journal_seconds - c->journal0);
    metrics_observe(&w->bytes, false, (double)e->bytes);
    w->has_undo = true;
    w->undo[METRICS_DEVICE] = e->undo_device;
    w->undo[METRICS_HOST] = e->undo_host;
    if (e->staging_peak > w->staging_peak)
        w->staging_peak = e->staging_peak;
}

int refit_metrics_text(refit_ctx *ctx, char **out, size_t *len)
{
    if (!out)
        return REFIT_EINVAL;
    *out = NULL;
    if (!ctx)
        return REFIT_EINVAL;
    ctx_clear_error(ctx);
    metrics_worker w = ctx->metrics;
    w.worker = ctx->worker_id;
    w.rank = ctx->rank;
    w.live = true;
    w.formats = ctx->metrics_formats;
    w.n_formats = REFIT_MAX_FORMATS;
    static const char *const health[] = {"empty", "ready", "updating", "poisoned"};
    refit_health h = refit_worker_health(ctx);
    w.health = (unsigned)h < 4 ? health[h] : NULL;
    w.version = refit_worker_version(ctx);
    if (!w.version)
        w.commit_time = 0;
    size_t n = 0;
    char *text = metrics_text(&w, 1, &n);
    if (!text)
        return ctx_error(ctx, REFIT_ENOMEM, "metrics: out of memory");
    *out = text;
    if (len)
        *len = n;
    return REFIT_OK;
}

void refit_metrics_free(char *text)
{
    free(text);
}
