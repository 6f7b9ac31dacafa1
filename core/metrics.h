/* The context's metrics (metrics.c): counted where the events happen (the
 * txn calls these once per call or per update, never per byte), printed
 * by refit_metrics_text through the shared writer (metrics_text.h). */
#ifndef REFIT_CORE_METRICS_H
#define REFIT_CORE_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include <refit/format.h>
#include <refit/refit.h>

#include "core/metrics_text.h"

/* An update's clock: when each phase started and what it took so far, and
 * the context's route-bytes slot of its last load's format. */
typedef struct metrics_clock {
    double begun;               /* refit_begin was called */
    double loading;             /* refit_begin returned */
    double ending;              /* finalize or abort started (0: not yet) */
    double begin_s, post_load_s;
    double journal0;            /* ctx->journal_seconds at refit_begin */
    bool replay;                /* a replay (refit_replay) */
    bool restore;               /* a restore (refit_restore, refit_ipc_restore) */
    metrics_format_bytes *route_slot; /* NULL: none yet (metrics_route_bytes) */
} metrics_clock;

/* How an update ended, for metrics_update_end. */
typedef struct metrics_end {
    bool committed;
    bool poisoned;              /* aborted, and the worker POISONED by it */
    bool restored;              /* aborted, written bytes put back */
    const char *error;          /* the journal's message for an abort */
    const char *source_uri;
    uint64_t bytes;
    uint64_t undo_device, undo_host;
    uint64_t staging_peak;
} metrics_end;

/* Monotonic seconds. */
double metrics_now(void);
/* refit_begin: a refusal (rc < 0) or an update begun. */
void metrics_begin(refit_ctx *ctx, metrics_clock *c, int rc);
/* A load refused with nothing changed. */
void metrics_refused(refit_ctx *ctx, int status);
/* Bytes accepted into a route (REFIT_ROUTE_*) of a module of format fmt,
 * counted in the context's slot of that format at once; a load of the
 * same format as the update's last load finds it in one compare. */
void metrics_route_bytes(refit_ctx *ctx, metrics_clock *c, const refit_format_v2 *fmt,
                         uint32_t route, uint64_t bytes);
/* Finalize or abort starts (the first call counts). */
static inline void metrics_ending(metrics_clock *c)
{
    if (!c->ending)
        c->ending = metrics_now();
}
/* The update ended (commit or abort). */
void metrics_update_end(refit_ctx *ctx, metrics_clock *c, const metrics_end *e);

#endif
