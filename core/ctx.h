/* The context: one per engine worker. Its message, the format registry,
 * the journal handle, the host services and the model. ctx_new and
 * ctx_free are ctx.c's, the other helpers ctx_base.c's: both leaves.
 * core/ctx_open.c wires a context at refit_open and unwires it at
 * refit_close. */
#ifndef REFIT_CORE_CTX_H
#define REFIT_CORE_CTX_H

#include <stdarg.h>
#include <stdint.h>

#include <refit/format.h>
#include <refit/refit.h>

#include "core/metrics_text.h"

#define REFIT_MAX_FORMATS 64
#define REFIT_ERRMSG_SIZE 1024

struct refit_ctx {
    char *worker_id;
    int32_t rank;
    char *journal_path;
    struct journal *journal;            /* NULL: none, or not open (see below) */
    int journal_best_effort;
    char journal_err[512];              /* why the journal could not be opened */
    uint64_t journal_gaps;              /* writes lost while it had no handle */
    double journal_seconds;             /* time spent in journal writes (bench) */
    double journal_progress_s;          /* progress write interval */
    char *plugin_dirs;
    struct plugin_set *plugins;         /* format plugins found at open (formats_builtin.c) */
    uint64_t staging_budget;
    uint64_t undo_device_budget;        /* refit_options v2; 0: host only */
    uint64_t delta_master_budget;       /* refit_options v3; 0: no masters */
    refit_log_fn log_fn;                /* NULL: stderr */
    void *log_user;
    refit_model *model;                 /* at most one */
    const refit_format_v2 *formats[REFIT_MAX_FORMATS];
    uint32_t n_formats;
    refit_host_v2 host;                 /* services handed to formats */
    struct host_svc *svc;               /* their state (core/host_services.c) */
    char errmsg[REFIT_ERRMSG_SIZE];
    metrics_worker metrics;             /* counted as updates happen (core/metrics.c) */
    metrics_format_bytes metrics_formats[REFIT_MAX_FORMATS]; /* route bytes per format */
};

/* Set the context's message and return status. */
int ctx_error(refit_ctx *ctx, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int ctx_verror(refit_ctx *ctx, int status, const char *fmt, va_list ap);
static inline void ctx_clear_error(refit_ctx *ctx) { ctx->errmsg[0] = '\0'; }
const refit_format_v2 *ctx_find_format(const refit_ctx *ctx, const char *name);

/* A context read from opt (NULL: the defaults; a version 1 or 2 struct is
 * read up to its end), wired to nothing yet: REFIT_EINVAL for a version
 * this refit does not know, REFIT_ENOMEM; *out is NULL on failure. */
int ctx_new(const refit_options *opt, refit_ctx **out);
/* Free what ctx_new allocated and ctx; whatever was wired to it is
 * unwired first (refit_close). */
void ctx_free(refit_ctx *ctx);

#endif
