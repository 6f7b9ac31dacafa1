#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <refit/sys/stats.h>

#include "core/ctx.h"
#include "core/util.h"
#include "core/txn_journal.h"

static const char *health_word(refit_health h)
{
    switch (h) {
    case REFIT_HEALTH_EMPTY: return "empty";
    case REFIT_HEALTH_READY: return "ready";
    case REFIT_HEALTH_UPDATING: return "updating";
    case REFIT_HEALTH_POISONED: return "poisoned";
    }
    return "unknown";
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int refit_journal_behind(const refit_ctx *ctx)
{
    return ctx && journal_held_end(ctx->journal) ? 1 : 0;
}

double refit_sys_journal_seconds(const refit_ctx *ctx)
{
    return ctx ? ctx->journal_seconds : 0;
}

/* A write failed: keep it as a gap the journal records with its next write. */
static void txj_gap(refit_ctx *ctx, const char *what)
{
    if (ctx->journal)
        journal_note_gap(ctx->journal, what);
    else
        ctx->journal_gaps++;
}

void txj_open(refit_ctx *ctx)
{
    if (!ctx->journal_path || ctx->journal)
        return;
    /* $REFIT_JOURNAL_PROGRESS_S: the progress interval (0: every 256 modules) */
    const char *ps = getenv("REFIT_JOURNAL_PROGRESS_S");
    ctx->journal_progress_s = ps ? strtod(ps, NULL) : TXJ_BATCH_SECONDS;
    journal_opts o = JOURNAL_OPTS_INIT;
    o.mode = ctx->journal_best_effort ? JOURNAL_BEST_EFFORT : JOURNAL_REQUIRED;
    struct journal *j;
    if (journal_open(&j, ctx->journal_path, &o, ctx->journal_err, sizeof ctx->journal_err))
        return;
    if (journal_worker_register(j, ctx->worker_id, ctx->rank)) {
        snprintf(ctx->journal_err, sizeof ctx->journal_err, "%s", journal_errmsg(j));
        journal_close(j);
        return;
    }
    ctx->journal = j;
    ctx->journal_err[0] = '\0';
    for (; ctx->journal_gaps > 0; ctx->journal_gaps--)
        journal_note_gap(j, "a write while the journal could not be opened");
}

void txj_close(refit_ctx *ctx)
{
    int64_t held = journal_held_end(ctx->journal);
    if (held && journal_write_held(ctx->journal) && ctx->host.log)
        ctx->host.log(ctx, 0, "%s; closing: the journal will show update %lld "
                      "interrupted although it ended", journal_errmsg(ctx->journal),
                      (long long)held);
    journal_close(ctx->journal);
    ctx->journal = NULL;
}

static journal_module_info *module_infos(const refit_model *m)
{
    journal_module_info *mi = calloc(m->n_modules ? m->n_modules : 1, sizeof *mi);
    if (!mi)
        return NULL;
    for (uint32_t i = 0; i < m->n_modules; i++) {
        const module *mod = &m->modules[i];
        mi[i].name = mod->name;
        mi[i].expected_tensors = mod->n_primary;
        mi[i].expected_bytes = mod->expected_bytes;
    }
    return mi;
}

void txj_seal(refit_model *m)
{
    refit_ctx *ctx = m->ctx;
    txj_open(ctx);
    if (!ctx->journal)
        return;
    /* kept for every begin: the journal checks its length against the plan */
    journal_module_info *mi = module_infos(m);
    if (!mi || journal_plan_prepare(ctx->journal, m->n_modules, mi, &m->journal_plan))
        txj_gap(ctx, "module list at seal");
    m->journal_modules = mi;
    txj_health(m, REFIT_HEALTH_EMPTY, REFIT_HEALTH_EMPTY, "model sealed");
}

void txj_health(refit_model *m, refit_health from, refit_health to, const char *reason)
{
    refit_ctx *ctx = m->ctx;
    if (!ctx->journal)
        return;
    const char *version = to == REFIT_HEALTH_READY ? model_version_text(m) : NULL;
    double t0 = mono_now();
    if (journal_health(ctx->journal, ctx->worker_id, health_word(from), health_word(to), reason,
                       version))
        txj_gap(ctx, "health transition");
    ctx->journal_seconds += mono_now() - t0;
}

/* The strings an update records, bounded before anything else: the journal
 * keeps them and refitctl shows them (docs/journal.md). */
static int check_strings(refit_ctx *ctx, const refit_update_opts *o)
{
    static const struct {
        const char *what;
        size_t off, max;
    } f[] = {
        {"version_label", offsetof(refit_update_opts, version_label), REFIT_VERSION_LABEL_MAX},
        {"source_uri", offsetof(refit_update_opts, source_uri), REFIT_SOURCE_URI_MAX},
        {"source_digest", offsetof(refit_update_opts, source_digest), REFIT_SOURCE_URI_MAX},
    };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        const char *v = *(const char *const *)((const char *)o + f[i].off);
        size_t len = v ? strnlen(v, f[i].max + 1) : 0;
        if (len > f[i].max)
            return ctx_error(ctx, REFIT_EINVAL, "begin: %s is %zu bytes; at most %zu are "
                             "accepted (refit_update_opts.%s); nothing written", f[i].what,
                             strlen(v), f[i].max, f[i].what);
    }
    return REFIT_OK;
}

/* A file:// source the caller vouched nothing for: record the files'
 * identity (name, size, device, inode, mtime, ctime; no byte read), so a
 * replay can tell the files it reopens are the ones this update read. A
 * path that cannot be identified (not a checkpoint, gone) records none,
 * and replay refuses the update; the log says so now. */
static void own_identity(refit_ctx *ctx, const refit_update_opts *o,
                         char id[REFIT_SOURCE_ID_SIZE])
{
    refit_source *src = NULL;
    id[0] = '\0';
    if (o->source_digest || !o->source_uri || strncmp(o->source_uri, "file://", 7))
        return;
    if (refit_source_open(&src, ctx, o->source_uri + 7) || refit_source_identity(src, id)) {
        id[0] = '\0';
        if (ctx->host.log)
            ctx->host.log(ctx, 1, "begin: the identity of %s cannot be recorded (%s); the "
                          "update will not be replayable", o->source_uri, ctx->errmsg);
    }
    refit_source_close(src);
    ctx_clear_error(ctx);
}

int txj_begin(refit_model *m, const refit_update_opts *o, int64_t replay_of,
              refit_health before, int64_t *id)
{
    refit_ctx *ctx = m->ctx;
    *id = 0;
    int rc = check_strings(ctx, o);
    if (rc || !ctx->journal_path)
        return rc;
    if (ctx->journal && !journal_same_file(ctx->journal)) {
        /* deleted or replaced under us: what we write would be lost. required:
         * refuse every begin until the context is reopened (an operator's
         * move, noticed); best-effort: start a journal at the path again */
        if (!ctx->journal_best_effort)
            return ctx_error(ctx, REFIT_EJOURNAL, "begin: journal %s was deleted or replaced "
                             "since it was opened; refusing, nothing written (journal=required; "
                             "reopen the context to start a new journal)", ctx->journal_path);
        txj_close(ctx);
        m->journal_plan = 0; /* that plan row was in the old file */
        ctx->journal_gaps++; /* noted in the new file, once open */
    }
    txj_open(ctx); /* again: a journal fixed since is picked up */
    const char *why = ctx->journal_err;
    char own_id[REFIT_SOURCE_ID_SIZE];
    if (ctx->journal) {
        own_identity(ctx, o, own_id);
        journal_update_info info = {
            .worker_id = ctx->worker_id,
            .version = o->version_label,
            .source_uri = o->source_uri,
            .source_digest = o->source_digest ? o->source_digest
                                              : own_id[0] ? own_id : NULL,
            .replay_of = replay_of,
            .rollback = o->rollback != 0,
            .partial = o->partial != 0,
            .plan_id = m->journal_plan, /* recorded at seal: no re-hashing */
            .health_from = health_word(before),
            .health_reason = "update began",
            .base_version = o->base_version,
        };
        double t0 = mono_now();
        if (!m->journal_modules)
            m->journal_modules = module_infos(m);
        const journal_module_info *mi = m->journal_modules;
        rc = mi ? journal_update_begin(ctx->journal, id, &info, m->n_modules, mi)
                : REFIT_ENOMEM;
        ctx->journal_seconds += mono_now() - t0;
        if (!rc)
            return REFIT_OK;
        why = rc == REFIT_ENOMEM ? "out of memory" : journal_errmsg(ctx->journal);
    }
    if (ctx->journal_best_effort) {
        txj_gap(ctx, "update begin");
        return REFIT_OK;
    }
    return ctx_error(ctx, REFIT_EJOURNAL, "begin: the update cannot be recorded in journal %s "
                     "(%s); refusing, nothing written (journal=required)",
                     ctx->journal_path, why[0] ? why : "unknown error");
}


static int batch_push(txj_batch *b, journal_module_progress p)
{
    if (grow_array((void **)&b->p, &b->cap, b->n, sizeof *b->p))
        return REFIT_ENOMEM;
    b->p[b->n++] = p;
    return REFIT_OK;
}

void txj_module_done(refit_model *m, int64_t id, txj_batch *b, uint32_t mi)
{
    refit_ctx *ctx = m->ctx;
    if (!id || !ctx->journal)
        return;
    if (grow_array((void **)&b->done, &b->cap_done, b->n_done, sizeof *b->done)) {
        txj_gap(ctx, "module progress");
        return;
    }
    b->done[b->n_done++] = mi;
    if (b->n_done % TXJ_CLOCK_EVERY != 1)
        return;
    double now = mono_now();
    if (b->last_write == 0)
        b->last_write = now; /* the clock starts with the first module */
    if (now - b->last_write < ctx->journal_progress_s)
        return;
    b->n = 0;
    for (uint32_t i = 0; i < b->n_done; i++) {
        const module *mod = &m->modules[b->done[i]];
        journal_module_progress p = {b->done[i], JOURNAL_MODULE_COMPLETE, mod->n_primary,
                                     mod->expected_bytes, 0, 0};
        if (batch_push(b, p)) {
            txj_gap(ctx, "module progress");
            return;
        }
    }
    if (journal_modules_progress(ctx->journal, id, b->n, b->p))
        txj_gap(ctx, "module progress");
    b->n = b->n_done = 0;
    b->last_write = mono_now();
    ctx->journal_seconds += b->last_write - now;
}

void txj_finalizing(refit_model *m, int64_t id)
{
    refit_ctx *ctx = m->ctx;
    double t0 = mono_now();
    if (id && ctx->journal &&
        journal_update_state_set(ctx->journal, id, JOURNAL_UPDATE_FINALIZING))
        txj_gap(ctx, "update finalizing");
    ctx->journal_seconds += mono_now() - t0;
}

void txj_end(refit_model *m, int64_t id, txj_batch *b, journal_update_state st, uint64_t bytes,
             uint64_t tensors, const char *error, refit_health after, const char *reason)
{
    refit_ctx *ctx = m->ctx;
    if (!id || !ctx->journal)
        return;
    double t0 = mono_now();
    journal_health_change h = {ctx->worker_id, "updating", health_word(after), reason,
                               after == REFIT_HEALTH_READY ? model_version_text(m) : NULL};
    if (journal_update_end_health(ctx->journal, id, st, bytes, tensors, error, b->n, b->p, &h)) {
        if (journal_held_end(ctx->journal) == id) { /* written by the next write */
            if (ctx->host.log)
                ctx->host.log(ctx, 1, "%s (refit_journal_behind says so until then)",
                              journal_errmsg(ctx->journal));
        } else
            txj_gap(ctx, "update end");
    }
    b->n = 0;
    ctx->journal_seconds += mono_now() - t0;
}

void txj_undo(refit_model *m, int64_t id, uint64_t device_bytes, uint64_t host_bytes)
{
    if (id && m->ctx->journal)
        journal_update_undo(m->ctx->journal, id, device_bytes, host_bytes);
}

void txj_undo_source(refit_model *m, int64_t id, const char *text)
{
    if (id && m->ctx->journal)
        journal_update_undo_source(m->ctx->journal, id, text);
}

void txj_delta(refit_model *m, int64_t id, size_t n, const char *const *names,
               const uint64_t *elements)
{
    refit_ctx *ctx = m->ctx;
    if (!id || !ctx->journal)
        return;
    double t0 = mono_now();
    if (journal_update_delta(ctx->journal, id, n, names, elements))
        txj_gap(ctx, "delta");
    ctx->journal_seconds += mono_now() - t0;
}

void txj_batch_free(txj_batch *b)
{
    free(b->p);
    free(b->done);
    memset(b, 0, sizeof *b);
}

void txj_event(refit_model *m, int64_t update_id, const char *kind, const char *fmt, ...)
{
    refit_ctx *ctx = m->ctx;
    txj_open(ctx);
    if (!ctx->journal)
        return;
    char text[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (journal_event(ctx->journal, update_id, ctx->worker_id, kind, "%s", text))
        txj_gap(ctx, kind);
}
