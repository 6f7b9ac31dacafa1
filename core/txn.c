/*
 * The transaction state machine: one update of one worker.
 *
 *              refit_begin
 *                   │
 *                   ▼        first accepted delivery
 *                 OPEN ──────────────────────────────▶ LOADING ◀──┐ refit_load
 *                   │                                   │  │  └────┘ refit_load_part
 *                   │                     write failed  │  │
 *                   │                  ┌────────────────┘  │ refit_finalize
 *                   │                  ▼                   ▼
 *                   │               FAILED            FINALIZING ───────▶ COMMITTED
 *                   │                  │                   │   txn_commit
 *                   │  refit_abort     │ refit_abort       │ check failed
 *                   └──────────────────┴─────────┬─────────┘ (finalize aborts)
 *                                                ▼
 *                                             ABORTED
 *
 * Transitions and the function that performs each:
 *   (none)     -> OPEN        refit_begin        signatures verified, nothing written
 *   OPEN       -> LOADING     txn_deliver        first delivery accepted
 *   LOADING    -> FAILED      txn_fail           a write or post-load failed (sticky)
 *   OPEN|LOADING -> FINALIZING refit_finalize, refit_finalize_prepare (every check)
 *   FINALIZING -> COMMITTED   txn_commit         modules CLEAN, version set
 *                             (refit_finalize at once, refit_commit after a
 *                             prepare: a group of ranks commits only when
 *                             every rank prepared)
 *   OPEN|LOADING|FAILED|FINALIZING -> ABORTED    txn_end_aborted (refit_abort,
 *                                                or refit_finalize on a failed check)
 *   LOADING|FAILED|FINALIZING -> RESTORING -> ABORTED  txn_end_aborted, when an
 *                             undo source serves the update (core/undo_source.h):
 *                             the written modules are delivered again from it
 *
 * Invariants (txn_invariants, asserted at every transition):
 *   OPEN        nothing delivered, nothing written, the undo log is empty,
 *               no module touched, no staging held.
 *   LOADING     at least one delivery accepted; with rollback, every runtime
 *               tensor marked saved has exactly one undo entry; without,
 *               the undo log is empty.
 *   FAILED      fail_status is an error; nothing more is written.
 *   FINALIZING  not failed; undo log as in LOADING (an update may finalize
 *               with nothing delivered). Once prepared, nothing
 *               but the commit decision is left: refit_commit or refit_abort.
 *   RESTORING   an undo source writes the committed bytes back through the
 *               loading paths; the undo log is empty (an update served by
 *               an undo source never saves).
 *   COMMITTED,
 *   ABORTED     terminal: the model no longer points at the txn, the undo
 *               log and staging are released.
 *   In every non-terminal state model->txn == txn, and the worker is UPDATING.
 *
 * Worker health is derived from module states (model_health): a commit
 * makes every touched module CLEAN; an abort without rollback makes every
 * module that received bytes DIRTY (POISONED); with rollback nothing
 * changes. The error state is sticky: FAILED leaves only through abort.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/sys/stats.h>

#include "core/txn.h"
#include "core/host_services.h"
#include "core/util.h"
#include "core/ctx.h"
#include "core/delta_master.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/load.h"
#include "core/metrics.h"
#include "core/mod_version.h"
#include "core/txn_journal.h"
#include "core/source.h"
#include "core/undo.h"
#include "core/undo_source.h"
#include "kernels/copy.h"

typedef enum txn_state {
    TXN_OPEN,
    TXN_LOADING,
    TXN_FAILED,
    TXN_FINALIZING,
    TXN_COMMITTED,
    TXN_ABORTED,
    TXN_RESTORING,
} txn_state;

/* Delivered rows of a route, for deliveries in parts. */
typedef struct part {
    int64_t a, b;               /* checkpoint rows [a, b) of the split dim */
    struct part *next;
} part;

enum { ROUTE_NONE = 0, ROUTE_PARTIAL = 1, ROUTE_COMPLETE = 2 };

/* Per-route, per-module and per-unit (model.h, stage_unit) arrays,
 * allocated once per sealed model. */
struct txn_scratch {
    uint8_t *route_state;       /* ROUTE_* */
    int64_t *route_rows;        /* rows of [lo, hi) covered by parts */
    part **parts;
    uint32_t *mod_complete;     /* primary routes complete */
    uint32_t *unit_complete;    /* primary routes complete, per unit */
    uint8_t *mod_touched;
    uint8_t *mod_wrote;         /* runtime bytes written */
    uint32_t *touched;          /* touched module indexes, in order */
    uint32_t n_touched;
    void **staging;             /* per unit block */
    void **retired;             /* staging blocks of post-loaded units, */
    uint32_t *retired_unit;     /*   kept until the streams are waited for */
    uint32_t n_retired;
    uint8_t *rt_saved;          /* runtime tensor has an undo entry */
    uint32_t *tie_owner;        /* tied primary: route index + 1 of the name
                                   that delivers it (0: none yet) */
    uint8_t *name_used;         /* a tied name accepted and skipped */
    void **in_place;            /* per route: the caller's bytes its staged
                                   view reads (REFIT_MODULE_STAGED_IN_PLACE) */
    uint32_t *pending;          /* complete units whose post-load waits for */
    uint32_t n_pending;         /*   the end of the loading call, in order */
    uint32_t *by_format;        /* pending regrouped by format (pending_by_format) */
    void *pending_stream;
    const refit_fmt_module **batch; /* a post_load_many's modules (or slices) */
    uint8_t *call_completes;    /* per unit: the running call of many rows */
    uint32_t *flagged;          /*   completes it (its forecast says so), and */
    uint32_t n_flagged;         /*   which units it flagged */
};

#define TXN_MAX_STREAMS 8

/* A (backend, stream) pair the txn queued work on. */
typedef struct txn_stream {
    const backend *be;
    void *stream;
} txn_stream;

struct refit_txn {
    refit_model *m;
    txn_state state;
    int fail_status;
    bool rollback;
    bool wrote;
    char *version_label;
    char *source_uri;
    undo_log undo;
    uint32_t n_saved;           /* runtime tensors with an undo entry */
    size_t staging_in_use;
    size_t staging_peak;        /* the most staging_in_use has been */
    refit_txn_stats stats;
    metrics_clock clock;        /* phases, for the context's metrics */
    struct txn_scratch *s;
    txn_stream streams[TXN_MAX_STREAMS];
    uint32_t n_streams;
    int64_t journal_id;         /* 0: not journaled */
    txj_batch jb;                /* module progress not yet written */
    bool fingerprint;           /* journal module fingerprints at commit */
    bool partial;               /* a delta: untouched modules keep their version */
    bool keep_going;            /* a refused load leaves the txn open */
    bool defer_post_load;       /* a loading call of many rows is running:
                                   complete modules' post-loads wait for its end */
    mod_version *label;         /* version_label, for the modules it commits */
    bool delta;                 /* base_version set: every module takes the label */
    char *base_version;
    uint8_t *declared;          /* per module: in changed_modules (NULL: others_unchanged) */
    uint32_t n_piece_saves;     /* undo entries of patch pieces (txn_delta_write) */
    uint64_t delta_elements;    /* elements patched (checkpoint elements given) */
    uint32_t delta_tensors;     /* tensors patched */
    const char **delta_names;   /* each patched tensor (route names), for the */
    uint64_t *delta_counts;     /*   journal, with its elements */
    uint32_t cap_delta_names, cap_delta_counts;
    char *version_text;         /* room for "label (partial: K of N modules)" */
    undo_source *usrc;          /* restores an abort instead of the undo log */
    char *undo_text;            /* what served rollback, for the journal */
    refit_source *noted;        /* the source refit_load_source loaded from */
    uint64_t noted_tensors;     /*   and how many tensors */
    bool noted_mixed;           /* tensors came from more than one source */
    bool undo_mode_files;       /* undo_source auto or files: a commit arms them */
    int abort_status;           /* an abort running: the failure it is for (0: the */
    const char *abort_why;      /*   caller's), and why (txn_abort_cause) */
};

/* ---- invariants ---- */

static bool txn_invariants(const refit_txn *t)
{
    const struct txn_scratch *s = t->s;
    switch (t->state) {
    case TXN_OPEN:
        return t->m->txn == t && t->undo.n == 0 && !t->wrote && s->n_touched == 0 &&
               t->staging_in_use == 0 && t->stats.tensors_loaded == 0;
    case TXN_LOADING:
    case TXN_FINALIZING:
        return t->m->txn == t && t->fail_status == 0 &&
               (t->state == TXN_FINALIZING || s->n_touched > 0) &&
               (t->rollback ? t->undo.n == t->n_saved + t->n_piece_saves : t->undo.n == 0);
    case TXN_FAILED:
        return t->m->txn == t && t->fail_status < 0;
    case TXN_COMMITTED:
    case TXN_ABORTED:
        return t->m->txn != t && t->undo.n == 0 && t->staging_in_use == 0;
    case TXN_RESTORING:
        return t->m->txn == t && t->usrc && t->undo.n == 0;
    }
    return false;
}

static void txn_set_state(refit_txn *t, txn_state next)
{
    t->state = next;
#ifndef NDEBUG
    if (!txn_invariants(t)) /* what broke, before the assertion stops the process */
        fprintf(stderr, "refit: txn '%s' entering state %d breaks its invariants: undo "
                "entries %u (runtime saves %u, piece saves %u), touched %u, staging %zu, "
                "fail %d, wrote %d, rollback %d, undo source %s\n",
                t->version_label ? t->version_label : "", (int)next, t->undo.n, t->n_saved,
                t->n_piece_saves, t->s ? t->s->n_touched : 0, t->staging_in_use,
                t->fail_status, (int)t->wrote, (int)t->rollback, t->usrc ? "yes" : "no");
#endif
    assert(txn_invariants(t));
}

/* ---- scratch ---- */

static void txn_scratch_free(struct txn_scratch *s)
{
    if (!s)
        return;
    free(s->route_state);
    free(s->route_rows);
    free(s->parts);
    free(s->mod_complete);
    free(s->unit_complete);
    free(s->mod_touched);
    free(s->mod_wrote);
    free(s->touched);
    free(s->staging);
    free(s->retired);
    free(s->retired_unit);
    free(s->rt_saved);
    free(s->tie_owner);
    free(s->name_used);
    free(s->in_place);
    free(s->pending);
    free(s->by_format);
    free(s->batch);
    free(s->call_completes);
    free(s->flagged);
    free(s);
}

void txn_model_release(refit_model *m)
{
    txn_scratch_free(m->scratch);
    m->scratch = NULL;
}

static struct txn_scratch *scratch_new(const refit_model *m)
{
    size_t nr = m->n_routes + 1, nm = m->n_modules + 1, nt = m->n_runtime + 1;
    size_t nu = m->n_units + 1;
    struct txn_scratch *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->route_state = calloc(nr, 1);
    s->route_rows = calloc(nr, sizeof *s->route_rows);
    s->parts = calloc(nr, sizeof *s->parts);
    s->mod_complete = calloc(nm, sizeof *s->mod_complete);
    s->unit_complete = calloc(nu, sizeof *s->unit_complete);
    s->mod_touched = calloc(nm, 1);
    s->mod_wrote = calloc(nm, 1);
    s->touched = calloc(nm, sizeof *s->touched);
    s->staging = calloc(nu, sizeof *s->staging);
    s->retired = calloc(nu, sizeof *s->retired);
    s->retired_unit = calloc(nu, sizeof *s->retired_unit);
    s->rt_saved = calloc(nt, 1);
    s->tie_owner = calloc(nr, sizeof *s->tie_owner);
    s->name_used = calloc(nr, 1);
    s->in_place = calloc(nr, sizeof *s->in_place);
    s->pending = calloc(nu, sizeof *s->pending);
    s->by_format = calloc(nu, sizeof *s->by_format);
    s->batch = calloc(nu, sizeof *s->batch);
    s->call_completes = calloc(nu, 1);
    s->flagged = calloc(nu, sizeof *s->flagged);
    if (!s->call_completes || !s->flagged || !s->in_place || !s->pending || !s->by_format ||
        !s->batch || !s->route_state || !s->route_rows || !s->parts || !s->mod_complete ||
        !s->mod_touched || !s->mod_wrote || !s->touched || !s->staging || !s->rt_saved ||
        !s->retired || !s->retired_unit || !s->unit_complete ||
        !s->tie_owner || !s->name_used) {
        txn_scratch_free(s);
        return NULL;
    }
    return s;
}

/* The backend a unit's staging comes from: its module's. */
static const backend *unit_backend(const refit_model *m, uint32_t u)
{
    return m->runtime[m->modules[m->units[u].module].runtime[0]].be;
}

/* Free the staging of every unit whose post-load was enqueued: call only
 * once every stream the txn used was waited for. */
static void staging_release_retired(refit_txn *t)
{
    struct txn_scratch *s = t->s;
    for (uint32_t i = 0; i < s->n_retired; i++) {
        uint32_t u = s->retired_unit[i];
        unit_backend(t->m, u)->staging_free(s->retired[i]);
        t->staging_in_use -= t->m->units[u].staged_bytes;
    }
    s->n_retired = 0;
}

/* Back to all-zero after a transaction (after its last wait): only what
 * it touched. */
static void scratch_reset(refit_txn *t)
{
    struct txn_scratch *s = t->s;
    refit_model *m = t->m;
    staging_release_retired(t);
    master_units_clear(m);
    for (uint32_t i = 0; i < s->n_touched; i++) {
        uint32_t mi = s->touched[i];
        module *mod = &m->modules[mi];
        for (uint32_t k = 0; k < mod->n_routes; k++) {
            uint32_t ri = mod->routes[k];
            s->route_state[ri] = ROUTE_NONE;
            s->route_rows[ri] = 0;
            s->tie_owner[ri] = 0;
            s->name_used[ri] = 0;
            s->in_place[ri] = NULL;
            for (part *p = s->parts[ri]; p;) {
                part *next = p->next;
                free(p);
                p = next;
            }
            s->parts[ri] = NULL;
        }
        for (uint32_t k = 0; k < mod->n_runtime; k++)
            s->rt_saved[mod->runtime[k]] = 0;
        for (uint32_t u = mod->unit0; u < mod->unit0 + mod->n_units; u++) {
            if (s->staging[u]) {
                unit_backend(m, u)->staging_free(s->staging[u]);
                s->staging[u] = NULL;
            }
            s->unit_complete[u] = 0;
        }
        s->mod_complete[mi] = 0;
        s->mod_touched[mi] = 0;
        s->mod_wrote[mi] = 0;
    }
    s->n_touched = 0;
    s->n_pending = 0;
    t->staging_in_use = 0;
}

/* ---- begin ---- */

static int txn_error(refit_txn *t, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int txn_error(refit_txn *t, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctx_verror(t->m->ctx, status, fmt, ap);
    va_end(ap);
    return status;
}

/* Wait for every stream the txn used; the first failure wins. Nothing
 * queued reads a retired staging block any more: they are freed. */
static int txn_sync_streams(refit_txn *t)
{
    int first = REFIT_OK;
    for (uint32_t i = 0; i < t->n_streams; i++) {
        int rc = t->streams[i].be->sync(t->streams[i].stream);
        if (rc && !first)
            first = rc;
    }
    t->n_streams = 0;
    staging_release_retired(t);
    return first;
}

/* Start the work queued on every stream the txn used, without waiting. */
static int txn_flush_streams(refit_txn *t)
{
    for (uint32_t i = 0; i < t->n_streams; i++) {
        const txn_stream *ts = &t->streams[i];
        int rc = ts->be->flush ? ts->be->flush(ts->stream) : REFIT_OK;
        if (rc)
            return txn_error(t, rc, "finalize: queued copies failed to start: %s%s%s",
                             refit_strerror(rc), ts->be->last_error()[0] ? ": " : "",
                             ts->be->last_error());
    }
    return REFIT_OK;
}

/* Remember that work was queued on (be, stream), to wait for it later. */
static int txn_use_stream(refit_txn *t, const backend *be, void *stream)
{
    for (uint32_t i = 0; i < t->n_streams; i++)
        if (t->streams[i].be == be && t->streams[i].stream == stream)
            return REFIT_OK;
    if (t->n_streams == TXN_MAX_STREAMS) {
        int rc = txn_sync_streams(t);
        if (rc)
            return txn_error(t, rc, "waiting for queued copies failed: %s", refit_strerror(rc));
    }
    t->streams[t->n_streams++] = (txn_stream){be, stream};
    return REFIT_OK;
}

/* A delta update's base and scope (docs/core.md "Delta updates"), checked
 * before anything is written: every module holds the base (all of them
 * take the new label at commit), and the update says which modules it
 * changes. *declared: per module, 1 when listed (NULL: others_unchanged
 * without a list). */
static int delta_scope(refit_model *m, const refit_update_opts *o, uint8_t **declared)
{
    refit_ctx *ctx = m->ctx;
    const char *base = o->base_version;
    *declared = NULL;
    if (strlen(base) > REFIT_VERSION_LABEL_MAX)
        return ctx_error(ctx, REFIT_EINVAL, "begin: base_version is %zu bytes long (at most "
                         "%d)", strlen(base), REFIT_VERSION_LABEL_MAX);
    for (uint32_t i = 0; i < m->n_modules; i++) {
        const module *mod = &m->modules[i];
        if (mod->state == MODULE_CLEAN && mod->version && !strcmp(mod->version->label, base))
            continue;
        return ctx_error(ctx, REFIT_EMISMATCH, "begin: delta update '%s' is against base "
                         "'%s', but module %s %s%s%s; nothing written",
                         o->version_label ? o->version_label : "unnamed", base, mod->name,
                         mod->state == MODULE_EMPTY   ? "was never loaded"
                         : mod->state == MODULE_DIRTY ? "holds bytes of an aborted update"
                                                      : "holds version '",
                         mod->state == MODULE_CLEAN ? mod->version->label : "",
                         mod->state == MODULE_CLEAN ? "'" : "");
    }
    if (o->n_changed_modules == 0 && !o->others_unchanged)
        return ctx_error(ctx, REFIT_EINVAL, "begin: delta update '%s' must declare its scope: "
                         "changed_modules (the modules it changes) or others_unchanged = 1 "
                         "(every module not delivered is unchanged)",
                         o->version_label ? o->version_label : "unnamed");
    if (o->n_changed_modules == 0)
        return REFIT_OK;
    if (!o->changed_modules)
        return ctx_error(ctx, REFIT_EINVAL, "begin: changed_modules is NULL but "
                         "n_changed_modules is %u", o->n_changed_modules);
    uint8_t *d = calloc(m->n_modules + 1, 1);
    if (!d)
        return ctx_error(ctx, REFIT_ENOMEM, "begin: out of memory");
    for (uint32_t i = 0; i < o->n_changed_modules; i++) {
        const char *name = o->changed_modules[i];
        uint32_t mi = name ? model_find_module(m, name) : UINT32_MAX;
        if (mi == UINT32_MAX) {
            free(d);
            return ctx_error(ctx, REFIT_ENOTFOUND, "begin: changed_modules[%u] (%s) is not a "
                             "module of worker %s", i, name ? name : "NULL", ctx->worker_id);
        }
        d[mi] = 1;
    }
    *declared = d;
    return REFIT_OK;
}

/* What serves the update's rollback, as the journal records it
 * (updates.undo_source): "files file:///...", "snapshot snapshot://...",
 * "undo-log", "undo-log; passed over: <source>: <why>", or "none". */
static char *undo_text_new(int rollback, const undo_source *usrc, const char *passed_over)
{
    char text[1024];
    if (!rollback)
        snprintf(text, sizeof text, "none");
    else if (usrc)
        snprintf(text, sizeof text, "%s %s", usrc->ops->kind, usrc->uri);
    else if (passed_over[0])
        snprintf(text, sizeof text, "undo-log; passed over %s", passed_over);
    else
        snprintf(text, sizeof text, "undo-log");
    return xstrdup(text);
}

static int txn_open(refit_txn **out, refit_model *m, const refit_update_opts *opts,
                    int64_t replay_of)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    if (!out || !m)
        return REFIT_EINVAL;
    *out = NULL;
    refit_ctx *ctx = m->ctx;
    ctx_clear_error(ctx);
    if (opts && (opts->version < 1 || opts->version > REFIT_UPDATE_OPTS_VERSION))
        return ctx_error(ctx, REFIT_EINVAL, "begin: update options of unknown version %u",
                         opts->version);
    /* a version 1 caller's struct ends at fingerprint, a version 2
     * caller's at keep_going: read no further */
    if (opts && opts->version == 1)
        memcpy(&o, opts, offsetof(refit_update_opts, partial));
    else if (opts && opts->version == 2)
        memcpy(&o, opts, offsetof(refit_update_opts, base_version));
    else if (opts && opts->version == 3)
        memcpy(&o, opts, offsetof(refit_update_opts, undo_source));
    else if (opts)
        o = *opts;
    o.version = REFIT_UPDATE_OPTS_VERSION;
    opts = &o;
    if (!m->sealed)
        return ctx_error(ctx, REFIT_ESTATE, "begin: the model is not sealed");
    if (m->txn)
        return ctx_error(ctx, REFIT_ESTATE, "begin: an update is already open on worker %s",
                         ctx->worker_id);
    if (o.undo_source < REFIT_UNDO_AUTO || o.undo_source > REFIT_UNDO_KEEPER)
        return ctx_error(ctx, REFIT_EINVAL, "begin: undo_source %d is none of REFIT_UNDO_AUTO, "
                         "_LOG, _FILES, _SNAPSHOT, _OFF, _KEEPER", o.undo_source);
    if (o.undo_source == REFIT_UNDO_OFF)
        o.rollback = 0;
    int rc = model_check_signatures(m, "begin");
    if (rc)
        return rc;
    /* before anything is journaled: a source asked for by name that
     * cannot serve refuses the update */
    undo_source *usrc = NULL;
    char passed_over[600];
    if (o.rollback && (rc = undo_source_pick(m, o.undo_source, &usrc, passed_over,
                                             sizeof passed_over)))
        return rc;
    uint8_t *declared = NULL;
    if (opts->base_version && (rc = delta_scope(m, opts, &declared)))
        return rc;
    refit_txn *t = NULL;
    if ((!m->scratch && !(m->scratch = scratch_new(m))) || !(t = calloc(1, sizeof *t)) ||
        (opts->base_version && !(t->base_version = xstrdup(opts->base_version)))) {
        free(declared);
        free(t);
        return ctx_error(ctx, REFIT_ENOMEM, "begin: out of memory");
    }
    t->delta = opts->base_version != NULL;
    t->declared = declared;
    /* last: a journal refusal must leave nothing behind */
    refit_health before = model_health(m);
    if ((rc = txj_begin(m, opts, replay_of, before, &t->journal_id))) {
        free(t->base_version);
        free(t->declared);
        free(t);
        return rc;
    }
    t->fingerprint = opts->fingerprint != 0;
    t->usrc = usrc;
    t->undo_mode_files = o.undo_source == REFIT_UNDO_AUTO || o.undo_source == REFIT_UNDO_FILES;
    t->undo_text = undo_text_new(opts->rollback, usrc, passed_over);
    undo_init(&t->undo, &m->undo_pool, m->ctx->undo_device_budget);
    t->m = m;
    t->s = m->scratch;
    t->rollback = opts->rollback != 0;
    if (!t->rollback || t->usrc) /* saves nothing: seal's reservation waits (txn_destroy) */
        undo_pool_hold(m->undo_pool, 1);
    t->partial = opts->partial != 0;
    t->keep_going = opts->keep_going != 0;
    t->version_label = xstrdup(opts->version_label ? opts->version_label : "unnamed");
    t->source_uri = xstrdup(opts->source_uri);
    /* what a commit needs is taken now: a prepared txn's commit cannot fail */
    t->label = t->version_label ? mod_version_new(t->version_label) : NULL;
    t->version_text = t->partial && t->version_label
                          ? malloc(strlen(t->version_label) + 64) : NULL;
    if (!t->version_label || (opts->source_uri && !t->source_uri) || !t->label ||
        (t->partial && !t->version_text) || !t->undo_text) {
        free(t->undo_text);
        free(t->version_label);
        free(t->source_uri);
        mod_version_drop(t->label);
        free(t->version_text);
        free(t->base_version);
        free(t->declared);
        free(t);
        undo_pool_hold(m->undo_pool, 0);
        return ctx_error(ctx, REFIT_ENOMEM, "begin: out of memory");
    }
    m->txn = t;
    txn_set_state(t, TXN_OPEN);
    *out = t;
    return REFIT_OK;
}

/* txn_open, timed and counted for the context's metrics: a refusal by
 * its status, an update begun with its clock started. */
int txn_begin(refit_txn **out, refit_model *m, const refit_update_opts *opts, int64_t replay_of)
{
    metrics_clock c = {.begun = metrics_now(), .journal0 = m ? m->ctx->journal_seconds : 0,
                       .replay = replay_of != 0,
                       .restore = opts && metrics_source_is_restore(
                                              metrics_source_of(opts->source_uri))};
    int rc = txn_open(out, m, opts, replay_of);
    if (m)
        metrics_begin(m->ctx, &c, rc);
    if (!rc)
        (*out)->clock = c;
    return rc;
}

int refit_begin(refit_txn **out, refit_model *m, const refit_update_opts *opts)
{
    return txn_begin(out, m, opts, 0);
}

int64_t refit_txn_journal_id(const refit_txn *t)
{
    return t ? t->journal_id : 0;
}

/* ---- deliveries ---- */

/* Duplicates and overlaps, checked before anything is written. */
static int check_fresh(refit_txn *t, const delivery *d, bool whole)
{
    const struct txn_scratch *s = t->s;
    uint8_t st = s->route_state[d->ri];
    const char *mod = t->m->modules[d->r->module].name;
    /* parts holding only other ranks' rows may come after this rank's are
     * all here; only a whole delivery makes every later one a duplicate */
    if ((whole && st != ROUTE_NONE) || (st == ROUTE_COMPLETE && !s->parts[d->ri]))
        return txn_error(t, REFIT_EDUPLICATE, "load %s (module %s): delivered twice in update "
                         "'%s'", d->name, mod, t->version_label);
    for (const part *p = s->parts[d->ri]; p; p = p->next)
        if (d->off < p->b && p->a < d->off + d->len)
            return txn_error(t, REFIT_EOVERLAP, "load %s (module %s): rows [%lld, %lld) overlap "
                             "rows [%lld, %lld) delivered earlier", d->name, mod,
                             (long long)d->off, (long long)(d->off + d->len), (long long)p->a,
                             (long long)p->b);
    return REFIT_OK;
}

static int txn_fail(refit_txn *t, int status)
{
    t->fail_status = status;
    txn_set_state(t, TXN_FAILED);
    return status;
}

/* A load was refused (nothing written): unless the caller opted to go on
 * (keep_going), the update fails closed, so a finalize cannot commit an
 * update that lost a tensor. The message says so. */
static int txn_refused(refit_txn *t, int status)
{
    metrics_refused(t->m->ctx, status);
    if (t->keep_going)
        return status;
    size_t n = strlen(t->m->ctx->errmsg);
    snprintf(t->m->ctx->errmsg + n, sizeof t->m->ctx->errmsg - n, "; update '%s' failed "
             "(refit_update_opts.keep_going to go on after a refusal): abort it",
             t->version_label);
    return txn_fail(t, status);
}

/* Save a runtime tensor's bytes before its first write in this txn. */
static int save_runtime(refit_txn *t, uint32_t ti, void *stream)
{
    struct txn_scratch *s = t->s;
    if (!t->rollback || t->usrc || s->rt_saved[ti])
        return REFIT_OK; /* an undo source restores an abort: nothing to save */
    tensor_reg *reg = &t->m->runtime[ti];
    int rc = undo_save(&t->undo, reg->be, reg->sig.device.device_id, reg->span, reg->span_bytes,
                       stream);
    if (rc)
        return txn_error(t, rc, "undo log: cannot save runtime %s (module %s, %zu bytes): %s",
                         reg->name, t->m->modules[reg->module].name, reg->span_bytes,
                         refit_strerror(rc));
    s->rt_saved[ti] = 1;
    t->n_saved++;
    return REFIT_OK;
}

static void narrow(refit_view *v, int dim, int64_t from, int64_t rows)
{
    v->data = (char *)v->data + from * v->strides[dim] * (int64_t)kern_dtype_size(v->dtype);
    v->shape[dim] = rows;
}

/* Staging held by enqueued post-loads is given back (one wait for the
 * streams) when a new block would not fit the budget or the memory. */
static int post_load_run(refit_txn *t);

static int staging_reclaim(refit_txn *t, const module *mod)
{
    int rc = post_load_run(t); /* their staging retires */
    if (rc)
        return rc;
    rc = t->s->n_retired ? txn_sync_streams(t) : REFIT_OK;
    return rc ? txn_error(t, rc, "module %s: waiting for earlier post-loads failed: %s; "
                          "nothing written", mod->name, refit_strerror(rc))
              : REFIT_OK;
}

/* The staging block of unit u (its module's, or one expert's slice). */
static int staging_get(refit_txn *t, uint32_t u, void **out)
{
    struct txn_scratch *s = t->s;
    const stage_unit *su = &t->m->units[u];
    const module *mod = &t->m->modules[su->module];
    size_t need = su->staged_bytes;
    if (!s->staging[u]) {
        int rc = t->staging_in_use + need > t->m->ctx->staging_budget
                     ? staging_reclaim(t, mod)
                     : REFIT_OK;
        if (rc)
            return rc;
        if (t->staging_in_use + need > t->m->ctx->staging_budget)
            return txn_error(t, REFIT_EBUDGET, "module %s: staging budget of %llu bytes "
                             "exhausted (%zu in use, %zu needed); nothing written",
                             mod->name, (unsigned long long)t->m->ctx->staging_budget,
                             t->staging_in_use, need);
        const backend *be = unit_backend(t->m, u);
        s->staging[u] = be->staging_alloc(need);
        if (!s->staging[u] && s->n_retired && !(rc = staging_reclaim(t, mod)))
            s->staging[u] = be->staging_alloc(need);
        if (rc)
            return rc;
        if (!s->staging[u])
            return txn_error(t, REFIT_ENOMEM, "module %s: no staging memory for %zu bytes; "
                             "nothing written", mod->name, need);
        t->staging_in_use += need;
        if (t->staging_in_use > t->staging_peak)
            t->staging_peak = t->staging_in_use;
    }
    *out = s->staging[u];
    return REFIT_OK;
}

static bool view_contiguous(const refit_view *v);

/* Whether delivery d of a STAGED route needs no staged copy: its module's
 * post-load may read the caller's bytes in place (the format says so), d
 * is whole and completes its unit (completes: every other primary tensor
 * of it is here), so the post-load runs before the loading call returns,
 * and this rank's rows are one contiguous, aligned run of the staged
 * dtype on the staging's device. *at: where they start. */
static bool stage_in_place(const refit_txn *t, const delivery *d, bool whole, bool completes,
                           void **at)
{
    const route *r = d->r;
    const module *mod = &t->m->modules[r->module];
    const refit_view *st = &r->staged_shape;
    if (r->kind != REFIT_ROUTE_STAGED || !whole || !completes ||
        !(mod->fm.flags & REFIT_MODULE_STAGED_IN_PLACE) ||
        (r->flags & (ROUTE_ALIAS | ROUTE_TIED | ROUTE_CAST)) ||
        d->src.device.device_type != st->device.device_type ||
        d->src.device.device_id != st->device.device_id ||
        !kern_dtype_eq(d->src.dtype, st->dtype) || d->src.ndim != st->ndim)
        return false;
    refit_view v = d->src;
    if (r->split_dim >= 0) {
        if (d->b <= d->a)
            return false;
        narrow(&v, r->split_dim, d->a - d->off, d->b - d->a);
    }
    for (int i = 0; i < v.ndim; i++)
        if (v.shape[i] != st->shape[i])
            return false;
    if (!view_contiguous(&v) || (uintptr_t)v.data % 64 != 0)
        return false; /* staging slots are 64-byte aligned: so is what replaces one */
    *at = v.data;
    return true;
}

/* The unit of d gets its post-load before the loading call returns: d
 * is its last primary tensor, or the running call of many rows completes
 * it. */
static bool completes_unit(const refit_txn *t, const delivery *d)
{
    uint32_t u = d->r->unit;
    return t->s->unit_complete[u] + 1 == t->m->units[u].n_primary ||
           (t->defer_post_load && t->s->call_completes[u]);
}

void txn_call_completes(refit_txn *t, uint32_t u)
{
    struct txn_scratch *s = t->s;
    if (!s->call_completes[u]) {
        s->call_completes[u] = 1;
        s->flagged[s->n_flagged++] = u;
    }
}

/* Write this rank's rows of the delivery to their route's destination. */
static int write_rows(refit_txn *t, delivery *d, void *staging)
{
    route *r = d->r;
    if (d->b <= d->a && r->split_dim >= 0)
        return REFIT_OK; /* none of this rank's rows */
    refit_view src = d->src, dst;
    const backend *be = t->m->runtime[r->target].be;
    if (t->s->in_place[d->ri]) /* txn_load_staging's choice: the post-load reads */
        return txn_use_stream(t, be, d->stream); /* the caller's bytes, on d's stream */
    if (r->kind == REFIT_ROUTE_STAGED) {
        dst = r->staged_shape;
        dst.data = (char *)staging + r->staged_offset;
    } else {
        dst = r->dst;
        int rc = save_runtime(t, r->target, d->stream);
        if (rc)
            return rc;
        t->s->mod_wrote[r->module] = 1;
        t->wrote = true;
    }
    if (r->split_dim >= 0) {
        narrow(&src, r->split_dim, d->a - d->off, d->b - d->a);
        narrow(&dst, r->split_dim, d->a - r->lo, d->b - d->a);
    }
    int rc = txn_use_stream(t, be, d->stream);
    if (rc)
        return rc;
    rc = be->copy(&dst, &src, d->stream);
    if (rc)
        return txn_error(t, rc, "load %s (module %s): copy failed: %s%s%s", r->name,
                         t->m->modules[r->module].name, refit_strerror(rc),
                         be->last_error()[0] ? ": " : "", be->last_error());
    return REFIT_OK;
}

/* The post_load_many of a format, or NULL (a struct that predates it). */
typedef int post_load_many_fn(const refit_host_v2 *, const refit_fmt_module *const *, uint32_t,
                              void *);

static post_load_many_fn *post_load_many_of(const refit_format_v2 *f)
{
    return REFIT_STRUCT_HAS(f, refit_format_v2, post_load_many) ? f->post_load_many : NULL;
}

/* Every checkpoint tensor of a STAGED unit (a module, or an expert's
 * slice of one) is here: save what its post-load overwrites (the module's
 * runtime tensors, once) and queue it, run at once unless a loading call
 * of many rows defers it to its end (one post_load_many a format). */
static int post_load_queue(refit_txn *t, uint32_t u, void *stream)
{
    struct txn_scratch *s = t->s;
    uint32_t mi = t->m->units[u].module;
    const module *mod = &t->m->modules[mi];
    for (uint32_t i = 0; i < mod->n_runtime; i++) {
        int rc = save_runtime(t, mod->runtime[i], stream);
        if (rc)
            return rc;
    }
    s->mod_wrote[mi] = 1;
    t->wrote = true;
    int rc = s->n_pending && s->pending_stream != stream ? post_load_run(t) : REFIT_OK;
    if (rc)
        return rc;
    s->pending_stream = stream;
    s->pending[s->n_pending++] = u;
    return t->defer_post_load ? REFIT_OK : post_load_run(t);
}

/* Point unit u's staged views at its staged bytes (or set them NULL). */
static void staged_views(refit_txn *t, uint32_t u, bool set)
{
    const stage_unit *su = &t->m->units[u];
    module *mod = &t->m->modules[su->module];
    refit_fmt_module *fm = &mod->fm;
    for (uint32_t i = su->first; i < su->first + su->n_primary; i++) {
        uint32_t ri = mod->primary[i];
        const route *r = &t->m->routes[ri];
        if (r->kind != REFIT_ROUTE_STAGED)
            continue;
        refit_fmt_ckpt *c = refit_ckpt(fm, i);
        if (!set) {
            c->staged.data = NULL;
            t->s->in_place[ri] = NULL;
            continue;
        }
        c->staged = r->staged_shape;
        c->staged.data = t->s->in_place[ri] ? t->s->in_place[ri]
                                            : (char *)t->s->staging[u] + r->staged_offset;
    }
}

/* A post-load's failure: bad data (a NaN, a value out of range) is held
 * like a lowered status word, so the update fails at finalize on every
 * backend; anything else (or no room to hold it) fails the load now. */
static int post_load_failed(refit_txn *t, uint32_t u, int rc)
{
    const module *mod = &t->m->modules[t->m->units[u].module];
    char why[REFIT_ERRMSG_SIZE]; /* the format's reason, before it is overwritten */
    snprintf(why, sizeof why, "%s", t->m->ctx->errmsg[0] ? t->m->ctx->errmsg
                                                         : refit_strerror(rc));
    if (rc != REFIT_ECORRUPT || host_services_post_load_failed(t->m->ctx, t->m->units[u].fm, rc,
                                                               why))
        return txn_error(t, rc, "module %s: post-load of format %s failed: %s", mod->name,
                         mod->fmt->name, why);
    ctx_clear_error(t->m->ctx);
    return REFIT_OK;
}

/* The format of unit u's module. */
static const refit_format_v2 *unit_format(const refit_txn *t, uint32_t u)
{
    return t->m->modules[t->m->units[u].module].fmt;
}

/* Units pending[a, b) (one format): one post_load_many, or a post_load
 * each. */
static int post_load_group(refit_txn *t, const uint32_t *pending, uint32_t n, void *stream)
{
    refit_ctx *ctx = t->m->ctx;
    const refit_format_v2 *f = unit_format(t, pending[0]);
    post_load_many_fn *many = post_load_many_of(f);
    if (n > 1 && many) {
        for (uint32_t k = 0; k < n; k++)
            t->s->batch[k] = t->m->units[pending[k]].fm;
        host_services_enter_many(ctx, t->s->batch, n);
        int rc = many(&ctx->host, t->s->batch, n, stream);
        host_services_leave(ctx);
        return rc ? post_load_failed(t, pending[0], rc) : REFIT_OK;
    }
    for (uint32_t k = 0; k < n; k++) {
        const refit_fmt_module *fm = t->m->units[pending[k]].fm;
        host_services_enter(ctx, fm);
        int rc = f->post_load(&ctx->host, fm, stream);
        host_services_leave(ctx);
        if (rc && (rc = post_load_failed(t, pending[k], rc)))
            return rc;
    }
    return REFIT_OK;
}

#define GROUP_FORMATS 16

/* The n pending modules regrouped by format, the formats in the order they
 * first appear and each one's modules in call order, so a call that
 * interleaves formats (A, B, A ...) makes one post_load_many a
 * format. Modules are independent of each other, so their order is free.
 * More formats than GROUP_FORMATS in one call: left as they are (runs of
 * one format, still correct). */
static void pending_by_format(refit_txn *t, uint32_t n)
{
    struct txn_scratch *s = t->s;
    const refit_format_v2 *f[GROUP_FORMATS];
    uint32_t nf = 0, o = 0;
    for (uint32_t k = 0; k < n; k++) {
        const refit_format_v2 *x = unit_format(t, s->pending[k]);
        uint32_t i = 0;
        while (i < nf && f[i] != x)
            i++;
        if (i == nf) {
            if (nf == GROUP_FORMATS)
                return;
            f[nf++] = x;
        }
    }
    if (nf < 2)
        return;
    for (uint32_t i = 0; i < nf; i++)
        for (uint32_t k = 0; k < n; k++)
            if (unit_format(t, s->pending[k]) == f[i])
                s->by_format[o++] = s->pending[k];
    memcpy(s->pending, s->by_format, n * sizeof *s->pending);
}

/* Build the runtime of every pending module: their staged copies land
 * first, then each format's post-loads are enqueued, without a wait; the
 * staging they read is freed at the txn's next wait for its streams. */
static int post_load_run(refit_txn *t)
{
    struct txn_scratch *s = t->s;
    uint32_t n = s->n_pending;
    if (!n)
        return REFIT_OK;
    s->n_pending = 0;
    void *stream = s->pending_stream;
    const module *m0 = &t->m->modules[t->m->units[s->pending[0]].module];
    /* staged copies must land before the post-load kernel reads them */
    const backend *be = unit_backend(t->m, s->pending[0]);
    int rc = t->n_streams == 1 && t->streams[0].be == be && t->streams[0].stream == stream
                 ? be->flush(stream)
                 : txn_sync_streams(t);
    if (!rc)
        rc = txn_use_stream(t, be, stream);
    if (rc)
        return txn_error(t, rc, "module %s: staged copies failed: %s", m0->name,
                         refit_strerror(rc));
    for (uint32_t k = 0; k < n; k++)
        staged_views(t, s->pending[k], true);
    double t0 = metrics_now();
    pending_by_format(t, n);
    for (uint32_t a = 0, b; a < n && !rc; a = b) {
        const refit_format_v2 *f = unit_format(t, s->pending[a]);
        for (b = a + 1; b < n && unit_format(t, s->pending[b]) == f;)
            b++;
        rc = post_load_group(t, s->pending + a, b - a, stream);
    }
    t->clock.post_load_s += metrics_now() - t0;
    /* the checkpoint just built is what later patches apply to */
    for (uint32_t k = 0; k < n && !rc; k++)
        rc = master_keep(t, s->pending[k], stream);
    for (uint32_t k = 0; k < n; k++) {
        uint32_t u = s->pending[k];
        staged_views(t, u, false);
        if (!s->staging[u])
            continue; /* every staged view read the caller's bytes */
        s->retired[s->n_retired] = s->staging[u];
        s->retired_unit[s->n_retired++] = u;
        s->staging[u] = NULL;
    }
    return rc;
}

int txn_post_load_defer(refit_txn *t, bool defer)
{
    struct txn_scratch *s = t->s;
    t->defer_post_load = defer;
    if (defer)
        return REFIT_OK;
    for (uint32_t i = 0; i < s->n_flagged; i++)
        s->call_completes[s->flagged[i]] = 0;
    s->n_flagged = 0;
    if (t->state == TXN_FAILED) {
        t->s->n_pending = 0; /* nothing more is written */
        return t->fail_status;
    }
    int rc = post_load_run(t);
    return rc ? txn_fail(t, rc) : REFIT_OK;
}

/* A route got all its rows: zero its pad, and finish the module if done. */
static int route_complete(refit_txn *t, delivery *d)
{
    struct txn_scratch *s = t->s;
    route *r = d->r;
    s->route_state[d->ri] = ROUTE_COMPLETE;
    if (r->flags & ROUTE_HAS_PAD) {
        const backend *be = t->m->runtime[r->target].be;
        int rc = save_runtime(t, r->target, d->stream);
        if (!rc)
            rc = txn_use_stream(t, be, d->stream);
        if (!rc)
            rc = be->zero(&r->pad, d->stream);
        if (rc)
            return txn_error(t, rc, "load %s: zeroing pad rows failed", r->name);
        s->mod_wrote[r->module] = 1;
        t->wrote = true;
    }
    const module *mod = &t->m->modules[r->module];
    s->mod_complete[r->module]++;
    if (++s->unit_complete[r->unit] < t->m->units[r->unit].n_primary)
        return REFIT_OK;
    if (mod->fm.flags & REFIT_MODULE_POST_LOAD)
        return post_load_queue(t, r->unit, d->stream);
    return REFIT_OK;
}

static void touch_module(refit_txn *t, uint32_t mi)
{
    struct txn_scratch *s = t->s;
    if (s->mod_touched[mi])
        return;
    s->mod_touched[mi] = 1;
    s->touched[s->n_touched++] = mi;
    t->stats.modules_touched++;
}

/* Tied names share their primary's route. The first name used owns the
 * delivery (its parts, duplicates and overlaps); each other name is then
 * accepted once, after the tensor is complete, and skipped: one storage,
 * one write. */
static int tie_resolve(refit_txn *t, const delivery *d, bool *skip)
{
    const struct txn_scratch *s = t->s;
    uint32_t ri = d->name_ri, gi = d->ri;
    const route *r = &t->m->routes[ri];
    uint32_t owner = s->tie_owner[gi];
    *skip = false;
    if (owner == 0 || owner == ri + 1)
        return REFIT_OK;
    if (s->name_used[ri])
        return txn_error(t, REFIT_EDUPLICATE, "load %s (module %s): delivered twice in update "
                         "'%s'", r->name, t->m->modules[r->module].name, t->version_label);
    if (s->route_state[gi] != ROUTE_COMPLETE)
        return txn_error(t, REFIT_EDUPLICATE, "load %s: its tied name %s is being delivered; "
                         "deliver one name only", r->name, t->m->routes[owner - 1].name);
    *skip = true;
    return REFIT_OK;
}

static bool view_contiguous(const refit_view *v)
{
    int64_t want = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->strides[i] != want)
            return false;
        want *= v->shape[i];
    }
    return true;
}

/* Whether delivery d may be written by the caller straight into its
 * runtime tensor: a plain byte copy (DIRECT or VIEW route, no cast) of
 * every delivered row onto contiguous bytes of a tensor on dev, with
 * nothing else reading them before the update ends (no post-load, not
 * tied). *dst: where. */
static bool claim_fits(const refit_txn *t, const delivery *d, refit_device dev, void **dst)
{
    const route *r = d->r;
    const refit_model *m = t->m;
    const signature *sig = &m->runtime[r->target].sig;
    if ((r->kind != REFIT_ROUTE_DIRECT && r->kind != REFIT_ROUTE_VIEW) ||
        (r->flags & (ROUTE_CAST | ROUTE_ALIAS | ROUTE_TIED)) ||
        (m->modules[r->module].fm.flags & REFIT_MODULE_POST_LOAD) ||
        sig->device.device_type != dev.device_type || sig->device.device_id != dev.device_id ||
        !kern_dtype_eq(r->dst.dtype, d->src.dtype))
        return false;
    refit_view v = r->dst;
    if (r->split_dim >= 0) {
        if (d->a != d->off || d->b != d->off + d->len || d->len == 0)
            return false; /* some delivered rows are another rank's */
        narrow(&v, r->split_dim, d->a - r->lo, d->b - d->a);
    }
    if (kern_view_numel(&v) != kern_view_numel(&d->src) || !view_contiguous(&v) ||
        !view_contiguous(&d->src))
        return false;
    *dst = v.data;
    return true;
}

/* The bytes of an accepted claim arrive from the caller: the undo save and
 * the bookkeeping write_rows would do, without the copy. */
static int claim_rows(refit_txn *t, const delivery *d)
{
    const route *r = d->r;
    int rc = save_runtime(t, r->target, d->stream);
    if (rc)
        return rc;
    t->s->mod_wrote[r->module] = 1;
    t->wrote = true;
    return txn_use_stream(t, t->m->runtime[r->target].be, d->stream);
}

int txn_load_refused(refit_txn *t, int status)
{
    return txn_refused(t, status);
}

int txn_load_open(refit_txn *t, const char *name)
{
    if (t->state == TXN_RESTORING)
        return REFIT_OK;
    if (t->state == TXN_FAILED)
        return txn_error(t, REFIT_ESTATE, "load %s: the update failed earlier (%s); abort it",
                         name ? name : "?", refit_status_name(t->fail_status));
    if (t->state != TXN_OPEN && t->state != TXN_LOADING)
        return txn_error(t, REFIT_ESTATE, "load %s: the update is prepared; nothing more can "
                         "be loaded (commit or abort it)", name ? name : "?");
    return REFIT_OK;
}

int txn_load_admit(refit_txn *t, const delivery *d, bool whole, bool *skip)
{
    *skip = false;
    if (t->declared && !t->declared[d->r->module])
        return txn_error(t, REFIT_EUNEXPECTED, "load %s (module %s): delta update '%s' does "
                         "not list module %s among the modules it changes "
                         "(refit_update_opts.changed_modules); nothing written", d->name,
                         t->m->modules[d->r->module].name, t->version_label,
                         t->m->modules[d->r->module].name);
    int rc = (d->r->flags & (ROUTE_ALIAS | ROUTE_TIED)) ? tie_resolve(t, d, skip) : REFIT_OK;
    if (!rc && !*skip)
        rc = check_fresh(t, d, whole);
    return rc;
}

int txn_load_check(refit_txn *t, const char *name, int64_t off, const refit_tensor *src,
                   bool whole, bool described, delivery *d, bool *skip)
{
    int rc = txn_load_open(t, name);
    if (rc)
        return rc;
    if (!name)
        return txn_error(t, REFIT_EINVAL, "load: checkpoint name is NULL");
    if ((rc = load_resolve(t->m, name, d)))
        return rc;
    d->off = off;
    d->stream = NULL;
    if ((rc = load_check(t->m, d, src, whole, described)))
        return rc;
    return txn_load_admit(t, d, whole, skip);
}

bool txn_load_in_place(const refit_txn *t, const delivery *d, bool completes)
{
    void *at;
    return stage_in_place(t, d, true, completes, &at);
}

int txn_load_staging(refit_txn *t, const delivery *d, bool whole, void **staging)
{
    *staging = NULL;
    if (d->r->kind != REFIT_ROUTE_STAGED)
        return REFIT_OK;
    if (master_unit_patched(t->m, d->r->unit)) /* its post-load would read a stale slot */
        return txn_error(t, REFIT_ESTATE, "load %s (module %s): a tensor of its post-load unit "
                         "was patched earlier in update '%s'; deliver the unit's tensors all "
                         "whole or all as patches; nothing written", d->name,
                         t->m->modules[d->r->module].name, t->version_label);
    void *at;
    if (stage_in_place(t, d, whole, completes_unit(t, d), &at)) {
        t->s->in_place[d->ri] = at; /* write_rows then copies nothing */
        return REFIT_OK;
    }
    return staging_get(t, d->r->unit, staging);
}

/* What accepting a delivery records, a whole tensor or a patch: its module
 * touched, which name of a tied tensor delivered it, the counts. */
static void accept_delivery(refit_txn *t, const delivery *d, bool skip, uint64_t bytes)
{
    bool tied = (d->r->flags & (ROUTE_ALIAS | ROUTE_TIED)) != 0;
    touch_module(t, d->r->module);
    if (tied && skip)
        t->s->name_used[d->name_ri] = 1;
    else if (tied && !t->s->tie_owner[d->ri])
        t->s->tie_owner[d->ri] = d->name_ri + 1;
    t->stats.tensors_loaded++;
    t->stats.bytes_loaded += bytes;
}

int txn_load_apply(refit_txn *t, delivery *d, bool whole, bool skip, void *staging, bool claim)
{
    refit_model *m = t->m;
    module *mod = &m->modules[d->r->module];
    /* accepted: from here a failure is sticky */
    uint64_t bytes = tensor_dtype_bytes(d->src.dtype, kern_view_numel(&d->src));
    accept_delivery(t, d, skip, bytes);
    if (t->state == TXN_OPEN)
        txn_set_state(t, TXN_LOADING);
    if (skip)
        return REFIT_OK;
    int rc = claim ? claim_rows(t, d) : write_rows(t, d, staging);
    if (rc)
        return txn_fail(t, rc);
    metrics_route_bytes(m->ctx, &t->clock, mod->fmt, d->r->kind, bytes);
    int64_t rows = d->b > d->a ? d->b - d->a : 0;
    if (!whole) {
        part *p = malloc(sizeof *p);
        if (!p)
            return txn_fail(t, txn_error(t, REFIT_ENOMEM, "load %s: out of memory", d->name));
        *p = (part){d->off, d->off + d->len, t->s->parts[d->ri]};
        t->s->parts[d->ri] = p;
        if (t->s->route_state[d->ri] == ROUTE_COMPLETE)
            return REFIT_OK; /* other ranks' rows, after ours were all here */
        t->s->route_rows[d->ri] += rows;
        t->s->route_state[d->ri] = ROUTE_PARTIAL;
        if (t->s->route_rows[d->ri] < d->r->hi - d->r->lo)
            return REFIT_OK;
    }
    rc = route_complete(t, d);
    if (rc)
        return txn_fail(t, rc);
    if (t->s->mod_complete[d->r->module] == mod->n_primary) {
        t->stats.modules_complete++;
        txj_module_done(m, t->journal_id, &t->jb, d->r->module);
    }
    return REFIT_OK;
}

/* ---- patches (delta.c) ---- */

const char *txn_base_version(const refit_txn *t)
{
    return t->delta ? t->base_version : NULL;
}

const char *txn_version_label(const refit_txn *t)
{
    return t->version_label;
}

int txn_delta_accept(refit_txn *t, delivery *d, bool skip, uint64_t elements)
{
    accept_delivery(t, d, skip, tensor_dtype_bytes(d->r->spec.dtype, elements));
    if (!skip) {
        uint32_t k = t->delta_tensors;
        if (grow_array((void **)&t->delta_names, &t->cap_delta_names, k,
                       sizeof *t->delta_names) ||
            grow_array((void **)&t->delta_counts, &t->cap_delta_counts, k,
                       sizeof *t->delta_counts))
            return txn_fail(t, txn_error(t, REFIT_ENOMEM, "load_delta %s: out of memory",
                                         d->name));
        t->delta_names[k] = d->r->name;
        t->delta_counts[k] = elements;
        t->delta_elements += elements;
        t->delta_tensors++;
    }
    if (t->state == TXN_OPEN)
        txn_set_state(t, TXN_LOADING);
    return REFIT_OK;
}

int txn_delta_write(refit_txn *t, const delivery *d, const refit_view *dst,
                    const refit_view *src)
{
    const route *r = d->r;
    const tensor_reg *reg = &t->m->runtime[r->target];
    const module *mod = &t->m->modules[r->module];
    int rc;
    /* only the elements written are saved, unless the whole span already is */
    if (t->rollback && !t->usrc && !t->s->rt_saved[r->target]) {
        size_t e = kern_dtype_size(dst->dtype);
        int64_t lo = 0, hi = 0;
        for (int i = 0; i < dst->ndim; i++) {
            int64_t reach = (dst->shape[i] - 1) * dst->strides[i];
            if (reach < 0)
                lo += reach;
            else
                hi += reach;
        }
        char *first = (char *)dst->data + lo * (int64_t)e;
        size_t n = (size_t)(hi - lo + 1) * e;
        rc = undo_save(&t->undo, reg->be, reg->sig.device.device_id, first, n, d->stream);
        if (rc)
            return txn_fail(t, txn_error(t, rc, "load_delta %s (module %s): undo log: cannot "
                                         "save %zu bytes of runtime %s: %s", d->name,
                                         mod->name, n, reg->name, refit_strerror(rc)));
        t->n_piece_saves++;
    }
    t->s->mod_wrote[r->module] = 1;
    t->wrote = true;
    if ((rc = txn_use_stream(t, reg->be, d->stream)))
        return txn_fail(t, rc);
    if ((rc = reg->be->copy(dst, src, d->stream)))
        return txn_fail(t, txn_error(t, rc, "load_delta %s (module %s): copy failed: %s%s%s",
                                     d->name, mod->name, refit_strerror(rc),
                                     reg->be->last_error()[0] ? ": " : "",
                                     reg->be->last_error()));
    return REFIT_OK;
}

int txn_delta_scatter(refit_txn *t, const delivery *d, const backend_scatter *sc)
{
    const route *r = d->r;
    const tensor_reg *reg = &t->m->runtime[r->target];
    const module *mod = &t->m->modules[r->module];
    int rc;
    t->s->mod_wrote[r->module] = 1;
    t->wrote = true;
    if ((rc = txn_use_stream(t, reg->be, d->stream)))
        return txn_fail(t, rc);
    /* only the elements written are saved, unless the whole span already is */
    bool save = t->rollback && !t->usrc && !t->s->rt_saved[r->target];
    rc = save ? undo_scatter(&t->undo, reg->be, reg->sig.device.device_id, sc, d->stream)
              : reg->be->scatter(sc, d->stream);
    if (rc) {
        const char *why = reg->be->last_error();
        return txn_fail(t, txn_error(t, rc, "load_delta %s (module %s): %s runtime %s "
                                     "failed: %s%s%s", d->name, mod->name,
                                     save ? "the undo save and scatter into" : "the scatter into",
                                     reg->name, refit_strerror(rc), why[0] ? ": " : "", why));
    }
    t->n_piece_saves += save;
    return REFIT_OK;
}

int txn_delta_done(refit_txn *t, delivery *d)
{
    struct txn_scratch *s = t->s;
    const route *r = d->r;
    s->route_state[d->ri] = ROUTE_COMPLETE; /* pad rows were not touched: still zero */
    s->unit_complete[r->unit]++;
    if (++s->mod_complete[r->module] == t->m->modules[r->module].n_primary) {
        t->stats.modules_complete++;
        txj_module_done(t->m, t->journal_id, &t->jb, r->module);
    }
    return REFIT_OK;
}

/* ---- patches into online modules (delta_master.c) ---- */

bool txn_saves_bytes(const refit_txn *t)
{
    return t->rollback && !t->usrc;
}

int txn_save_span(refit_txn *t, const delivery *d, uint32_t ti, const refit_view *v)
{
    const tensor_reg *reg = &t->m->runtime[ti];
    if (txn_saves_bytes(t) && !t->s->rt_saved[ti] && v->ndim > 0) {
        size_t e = kern_dtype_size(v->dtype);
        int64_t lo = 0, hi = 0;
        for (int i = 0; i < v->ndim; i++) {
            int64_t reach = (v->shape[i] - 1) * v->strides[i];
            if (reach < 0)
                lo += reach;
            else
                hi += reach;
        }
        char *first = (char *)v->data + lo * (int64_t)e;
        size_t n = (size_t)(hi - lo + 1) * e;
        int rc = undo_save(&t->undo, reg->be, reg->sig.device.device_id, first, n, d->stream);
        if (rc)
            return txn_fail(t, txn_error(t, rc, "load_delta %s (module %s): undo log: cannot "
                                         "save %zu bytes of runtime %s: %s", d->name,
                                         t->m->modules[reg->module].name, n, reg->name,
                                         refit_strerror(rc)));
        t->n_piece_saves++;
    }
    t->s->mod_wrote[reg->module] = 1;
    t->wrote = true;
    return REFIT_OK;
}

int txn_save_whole(refit_txn *t, const delivery *d, uint32_t ti)
{
    int rc = save_runtime(t, ti, d->stream);
    if (rc)
        return txn_fail(t, rc);
    t->s->mod_wrote[t->m->runtime[ti].module] = 1;
    t->wrote = true;
    return REFIT_OK;
}

int txn_save_bytes(refit_txn *t, const delivery *d, const backend *be, int device, void *at,
                   size_t n, const char *what)
{
    if (!txn_saves_bytes(t))
        return REFIT_OK;
    int rc = undo_save(&t->undo, be, device, at, n, d->stream);
    if (rc)
        return txn_fail(t, txn_error(t, rc, "load_delta %s (module %s): undo log: cannot save "
                                     "%zu bytes of %s: %s", d->name,
                                     t->m->modules[d->r->module].name, n, what,
                                     refit_strerror(rc)));
    t->n_piece_saves++;
    return REFIT_OK;
}

int txn_scatter_bytes(refit_txn *t, const delivery *d, const backend *be, int device,
                      const backend_scatter *sc, const char *what)
{
    int rc = txn_use_stream(t, be, d->stream);
    if (rc)
        return txn_fail(t, rc);
    bool save = txn_saves_bytes(t);
    rc = save ? undo_scatter(&t->undo, be, device, sc, d->stream) : be->scatter(sc, d->stream);
    if (rc) {
        const char *why = be->last_error();
        return txn_fail(t, txn_error(t, rc, "load_delta %s (module %s): %s %s failed: %s%s%s",
                                     d->name, t->m->modules[d->r->module].name,
                                     save ? "the undo save and scatter into" : "the scatter into",
                                     what, refit_strerror(rc), why[0] ? ": " : "", why));
    }
    t->n_piece_saves += save;
    return REFIT_OK;
}

int txn_stream_used(refit_txn *t, const backend *be, void *stream)
{
    int rc = txn_use_stream(t, be, stream);
    return rc ? txn_fail(t, rc) : REFIT_OK;
}

void refit_sys_txn_delta(const refit_txn *t, uint64_t *elements, uint32_t *tensors)
{
    if (elements)
        *elements = t ? t->delta_elements : 0;
    if (tensors)
        *tensors = t ? t->delta_tensors : 0;
}

/* direct: a claim (txn_claim_direct): *direct gets where the caller writes
 * the bytes, or NULL (nothing done: deliver them with a load). */
static int txn_deliver(refit_txn *t, const char *name, int64_t off, const refit_tensor *src,
                       bool whole, void *stream, void **direct)
{
    if (!t)
        return REFIT_EINVAL;
    ctx_clear_error(t->m->ctx);
    int rc = txn_load_open(t, name); /* FAILED or prepared: not a refusal */
    if (rc)
        return rc;
    delivery d; /* d.src is filled by load_check, dims [0, ndim) only */
    bool skip;
    rc = txn_load_check(t, name, off, src, whole, direct != NULL, &d, &skip);
    if (rc) /* refused: nothing written; the txn goes on only when asked to */
        return txn_refused(t, rc);
    d.stream = stream;
    void *claimed = NULL;
    if (direct && (skip || !claim_fits(t, &d, src->device, &claimed)))
        return REFIT_OK; /* not for a claim (*direct NULL): nothing done, load it */
    void *staging = NULL;
    if (!skip && (rc = txn_load_staging(t, &d, whole, &staging)))
        return txn_refused(t, rc);
    rc = txn_load_apply(t, &d, whole, skip, staging, direct != NULL);
    if (!rc && direct)
        *direct = claimed;
    return rc;
}

int txn_restore_module(refit_txn *t, uint32_t mi, const refit_view *src, void *stream)
{
    struct txn_scratch *s = t->s;
    refit_model *m = t->m;
    module *mod = &m->modules[mi];
    int rc = txn_load_open(t, mod->name);
    if (rc)
        return rc;
    if (s->mod_touched[mi])
        return txn_error(t, REFIT_EDUPLICATE, "restore: module %s delivered twice", mod->name);
    touch_module(t, mi);
    master_forget(m, mi); /* built from no checkpoint: no patch applies to it */
    if (t->state == TXN_OPEN)
        txn_set_state(t, TXN_LOADING);
    for (uint32_t k = 0; k < mod->n_runtime; k++) {
        uint32_t ti = mod->runtime[k];
        tensor_reg *reg = &m->runtime[ti];
        if ((rc = save_runtime(t, ti, stream)))
            return txn_fail(t, rc);
        s->mod_wrote[mi] = 1;
        t->wrote = true;
        if ((rc = txn_use_stream(t, reg->be, stream)))
            return txn_fail(t, rc);
        if ((rc = reg->be->copy(&reg->view, &src[k], stream)))
            return txn_fail(t, txn_error(t, rc, "restore: runtime %s (module %s): copy failed: "
                                         "%s%s%s", reg->name, mod->name, refit_strerror(rc),
                                         reg->be->last_error()[0] ? ": " : "",
                                         reg->be->last_error()));
        t->stats.tensors_loaded++;
        t->stats.bytes_loaded += tensor_dtype_bytes(src[k].dtype, kern_view_numel(&src[k]));
    }
    /* complete as a delivery of every checkpoint tensor would leave it,
     * without a post-load: the bytes are the post-loaded ones */
    for (uint32_t k = 0; k < mod->n_primary; k++)
        s->route_state[mod->primary[k]] = ROUTE_COMPLETE;
    for (uint32_t u = mod->unit0; u < mod->unit0 + mod->n_units; u++)
        s->unit_complete[u] = m->units[u].n_primary;
    s->mod_complete[mi] = mod->n_primary;
    t->stats.modules_complete++;
    txj_module_done(m, t->journal_id, &t->jb, mi);
    return REFIT_OK;
}

size_t txn_staging_in_use(const refit_txn *t)
{
    return t->staging_in_use;
}

bool txn_unit_has_staging(const refit_txn *t, uint32_t u)
{
    return t->s->staging[u] != NULL;
}

uint32_t txn_unit_complete(const refit_txn *t, uint32_t u)
{
    return t->s->unit_complete[u];
}

size_t refit_sys_txn_staging_peak(const refit_txn *t)
{
    return t ? t->staging_peak : 0;
}

bool txn_wrote(const refit_txn *t)
{
    return t->wrote;
}

bool txn_untouched(const refit_txn *t)
{
    return t->state == TXN_OPEN;
}

refit_model *txn_model(const refit_txn *t)
{
    return t->m;
}

int txn_load_fail(refit_txn *t, int status)
{
    return txn_fail(t, status);
}

int refit_load(refit_txn *t, const char *ckpt_name, const refit_tensor *src, void *stream)
{
    return txn_deliver(t, ckpt_name, 0, src, true, stream, NULL);
}

int refit_load_part(refit_txn *t, const char *ckpt_name, int64_t offset, const refit_tensor *src,
                    void *stream)
{
    return txn_deliver(t, ckpt_name, offset, src, false, stream, NULL);
}

int txn_claim_direct(refit_txn *t, const char *name, bool part, int64_t row0,
                     const refit_tensor *src, void *stream, void **dst)
{
    if (!dst || !src)
        return REFIT_EINVAL;
    *dst = NULL;
    return txn_deliver(t, name, part ? row0 : 0, src, !part, stream, dst);
}

/* ---- finalize and abort ---- */

static void txn_destroy(refit_txn *t)
{
    undo_pool_hold(t->m->undo_pool, 0);
    host_services_update_end(t->m->ctx); /* the scratch and status words it was lent */
    txj_batch_free(&t->jb);
    mod_version_drop(t->label);
    free(t->version_text);
    free(t->version_label);
    free(t->source_uri);
    free(t->undo_text);
    refit_source_close(t->noted); /* the hold txn_note_source took */
    free(t->base_version);
    free(t->declared);
    free(t->delta_names);
    free(t->delta_counts);
    free(t);
}

/* Received bytes of a module: its complete tensors. */
static uint64_t module_bytes_in(const refit_txn *t, const module *mod)
{
    uint64_t n = 0;
    for (uint32_t k = 0; k < mod->n_primary; k++)
        if (t->s->route_state[mod->primary[k]] == ROUTE_COMPLETE)
            n += t->m->routes[mod->primary[k]].bytes;
    return n;
}

/* Health once the txn is gone (model_health says UPDATING while it is open). */
static refit_health health_after(const refit_model *m)
{
    return m->n_dirty ? REFIT_HEALTH_POISONED
         : m->n_empty ? REFIT_HEALTH_EMPTY
                      : REFIT_HEALTH_READY;
}

/* The journal's last word on a txn: every touched module's final row, and
 * the worker's health after it, in one write. */
static void txn_journal_end(refit_txn *t, journal_update_state st, const char *error,
                            const char *reason)
{
    if (!t->journal_id)
        return;
    refit_model *m = t->m;
    const struct txn_scratch *s = t->s;
    t->jb.n = 0; /* superseded by the final rows */
    for (uint32_t i = 0; i < s->n_touched; i++) {
        uint32_t mi = s->touched[i];
        const module *mod = &m->modules[mi];
        bool complete = s->mod_complete[mi] == mod->n_primary;
        journal_module_progress p = {mi, complete ? JOURNAL_MODULE_COMPLETE
                                                  : JOURNAL_MODULE_PARTIAL,
                                     s->mod_complete[mi],
                                     complete ? mod->expected_bytes : module_bytes_in(t, mod),
                                     0, 0};
        if (st == JOURNAL_UPDATE_COMMITTED) {
            p.state = JOURNAL_MODULE_COMMITTED;
            p.has_fingerprint = t->fingerprint && !module_fingerprint(m, mod, &p.fingerprint);
        } else if (st == JOURNAL_UPDATE_ROLLED_BACK) {
            p.state = JOURNAL_MODULE_ROLLED_BACK;
        } else if (s->mod_wrote[mi]) {
            p.state = JOURNAL_MODULE_POISONED;
        }
        if (grow_array((void **)&t->jb.p, &t->jb.cap, t->jb.n, sizeof *t->jb.p) == REFIT_OK)
            t->jb.p[t->jb.n++] = p;
    }
    txj_undo(m, t->journal_id, t->undo.placed[UNDO_DEVICE], t->undo.placed[UNDO_HOST]);
    txj_undo_source(m, t->journal_id, t->undo_text);
    if (t->delta)
        txj_delta(m, t->journal_id, t->delta_tensors, t->delta_names, t->delta_counts);
    txj_end(m, t->journal_id, &t->jb, st, t->stats.bytes_loaded, t->stats.tensors_loaded, error,
            health_after(m), reason);
}

/* The update's end, for the context's metrics: before the undo log goes.
 * error: the journal's message (an abort's). */
static void txn_metrics_end(refit_txn *t, bool committed, const char *error, bool poisoned)
{
    metrics_end e = {.committed = committed, .poisoned = poisoned,
                     .restored = !committed && !poisoned && t->wrote, .error = error,
                     .source_uri = t->source_uri, .bytes = t->stats.bytes_loaded,
                     .undo_device = t->undo.placed[UNDO_DEVICE],
                     .undo_host = t->undo.placed[UNDO_HOST], .staging_peak = t->staging_peak};
    metrics_update_end(t->m->ctx, &t->clock, &e);
}

/* The modules the update wrote, written back from its undo source
 * (RESTORING), waited for, their post-loads' status read and their
 * fingerprints checked against the committed ones. The scratch then
 * shows every module the update touched, those written as written. On
 * failure the ctx's message says what (the file, the module). */
static int txn_restore_from_source(refit_txn *t)
{
    refit_model *m = t->m;
    struct txn_scratch *s = t->s;
    uint32_t n_touched = s->n_touched, n = 0;
    uint32_t *touched = malloc((n_touched + 1) * sizeof *touched);
    uint32_t *wrote = malloc((n_touched + 1) * sizeof *wrote);
    if (!touched || !wrote) {
        free(touched);
        free(wrote);
        return txn_error(t, REFIT_ENOMEM, "undo source: out of memory");
    }
    for (uint32_t i = 0; i < n_touched; i++) {
        touched[i] = s->touched[i];
        if (s->mod_wrote[touched[i]])
            wrote[n++] = touched[i];
    }
    refit_txn_stats stats = t->stats;
    scratch_reset(t);
    host_services_update_end(m->ctx); /* the aborted update's post-load status */
    free(t->declared);
    t->declared = NULL; /* a delta's scope does not bind the restore */
    t->keep_going = false;
    t->defer_post_load = false;
    t->fail_status = 0;
    txn_set_state(t, TXN_RESTORING);
    ctx_clear_error(m->ctx);
    int rc = t->usrc->ops->restore(t->usrc, t, wrote, n);
    if (!rc && t->state == TXN_FAILED)
        rc = t->fail_status;
    if (!rc && (rc = txn_sync_streams(t)))
        txn_error(t, rc, "undo source %s: copies failed: %s", t->usrc->uri, refit_strerror(rc));
    if (!rc && (rc = host_services_check_status(m->ctx))) {
        char why[REFIT_ERRMSG_SIZE];
        memcpy(why, m->ctx->errmsg, sizeof why);
        txn_error(t, rc, "undo source %s: post-load failed: %s", t->usrc->uri, why);
    }
    if (!rc)
        rc = undo_source_verify(m, t->usrc, wrote, n);
    if (rc && !m->ctx->errmsg[0])
        txn_error(t, rc, "undo source %s: restore failed: %s", t->usrc->uri,
                  refit_strerror(rc));
    txn_sync_streams(t); /* after a failure too: nothing queued is left */
    for (uint32_t i = 0; i < n_touched; i++)
        touch_module(t, touched[i]);
    for (uint32_t i = 0; i < n; i++)
        s->mod_wrote[wrote[i]] = 1;
    t->stats = stats;
    free(touched);
    free(wrote);
    return rc;
}

/* Leave the worker as abort defines it and end the txn. why: the reason
 * for the journal (NULL: the caller aborted). */
static int txn_end_aborted(refit_txn *t, const char *why)
{
    refit_model *m = t->m;
    struct txn_scratch *s = t->s;
    t->abort_why = why;
    metrics_ending(&t->clock);
    /* queued copies finish (or fail) before bytes are put back */
    int rc = txn_sync_streams(t);
    char restore_err[REFIT_ERRMSG_SIZE] = "";
    if (t->rollback && t->usrc && t->wrote) {
        if (rc || (rc = txn_restore_from_source(t))) {
            snprintf(restore_err, sizeof restore_err, "%s", m->ctx->errmsg[0]
                         ? m->ctx->errmsg : refit_strerror(rc));
            t->rollback = false; /* not restored: poison what was written */
        }
    } else if (t->rollback) {
        rc = undo_restore_all(&t->undo, NULL);
        if (rc) /* bytes could not be put back: poison what was written */
            t->rollback = false;
    }
    bool poisoned = false;
    if (!t->rollback) {
        for (uint32_t i = 0; i < s->n_touched; i++) {
            module *mod = &m->modules[s->touched[i]];
            if (!s->mod_wrote[s->touched[i]])
                continue;
            poisoned = true;
            if (mod->state == MODULE_EMPTY)
                m->n_empty--;
            if (mod->state != MODULE_DIRTY)
                m->n_dirty++;
            mod->state = MODULE_DIRTY;
        }
    }
    journal_update_state st = poisoned      ? JOURNAL_UPDATE_FAILED
                              : t->wrote      ? JOURNAL_UPDATE_ROLLED_BACK
                                              : JOURNAL_UPDATE_ABORTED;
    char error[2 * REFIT_ERRMSG_SIZE];
    snprintf(error, sizeof error, "%s%s%s", why ? why : "aborted by the caller",
             restore_err[0] ? "; then " : "", restore_err);
    txn_journal_end(t, st, error, !poisoned         ? "update aborted"
                                  : restore_err[0] ? "update aborted; its undo source failed"
                                                   : "update aborted without rollback");
    txn_metrics_end(t, false, error, poisoned);
    if (poisoned)
        undo_sources_drop(m, NULL); /* the committed version is no longer what they restore */
    master_txn_end(m, false, t->rollback);
    undo_free(&t->undo);
    scratch_reset(t);
    m->txn = NULL;
    txn_set_state(t, TXN_ABORTED);
    txn_destroy(t);
    if (restore_err[0]) /* for refit_abort and finalize to say */
        snprintf(m->ctx->errmsg, sizeof m->ctx->errmsg, "%s", restore_err);
    return poisoned || m->n_dirty ? REFIT_EPOISONED : REFIT_OK;
}

int txn_abort_cause(const refit_txn *t, const char **why)
{
    *why = t->abort_why;
    return t->abort_status;
}

int refit_abort(refit_txn *t)
{
    return refit_abort_reason(t, NULL);
}

int refit_abort_reason(refit_txn *t, const char *why)
{
    if (!t)
        return REFIT_EINVAL;
    ctx_clear_error(t->m->ctx);
    refit_model *m = t->m;
    int rc = txn_end_aborted(t, why);
    if (rc == REFIT_EPOISONED && m->ctx->errmsg[0]) {
        char restore_err[REFIT_ERRMSG_SIZE];
        memcpy(restore_err, m->ctx->errmsg, sizeof restore_err);
        ctx_error(m->ctx, rc, "abort: worker %s is POISONED (%u module(s) hold bytes of an "
                  "aborted update; restoring them failed: %s)", m->ctx->worker_id,
                  m->n_dirty, restore_err);
    } else if (rc == REFIT_EPOISONED) {
        ctx_error(m->ctx, rc, "abort: worker %s is POISONED (%u module(s) hold bytes of an "
                  "aborted update; rollback was off)", m->ctx->worker_id, m->n_dirty);
    }
    return rc;
}

/* Name the first missing piece of an incomplete module. */
static int report_incomplete(refit_txn *t, const module *mod)
{
    const struct txn_scratch *s = t->s;
    for (uint32_t i = 0; i < mod->n_primary; i++) {
        uint32_t ri = mod->primary[i];
        const route *r = &t->m->routes[ri];
        if (s->route_state[ri] == ROUTE_COMPLETE)
            continue;
        if (s->route_state[ri] == ROUTE_PARTIAL)
            return txn_error(t, REFIT_EINCOMPLETE, "finalize: module %s is partly delivered: "
                             "%s has %lld of its %lld rows on this rank", mod->name, r->name,
                             (long long)s->route_rows[ri], (long long)(r->hi - r->lo));
        return txn_error(t, REFIT_EINCOMPLETE, "finalize: module %s is partly delivered: %s "
                         "is missing (%u of %u tensors arrived)", mod->name, r->name,
                         s->mod_complete[mod - t->m->modules], mod->n_primary);
    }
    return txn_error(t, REFIT_EINTERNAL, "finalize: module %s incomplete", mod->name);
}

/* The default scope: every module delivered. Names the first missing. */
static int check_full_scope(refit_txn *t)
{
    refit_model *m = t->m;
    const struct txn_scratch *s = t->s;
    if (s->n_touched == m->n_modules)
        return REFIT_OK;
    uint32_t first = 0;
    while (first < m->n_modules && s->mod_touched[first])
        first++;
    return txn_error(t, REFIT_EINCOMPLETE, "finalize: update '%s' delivered %u of %u modules; "
                     "module %s%s is missing (none of its %u tensors arrived); an update "
                     "delivers every module unless refit_update_opts.partial is set",
                     t->version_label, s->n_touched, m->n_modules, m->modules[first].name,
                     m->n_modules - s->n_touched > 1 ? " (and others)" : "",
                     m->modules[first].n_primary);
}

/* A delta update's scope: a touched module without a post-load may leave
 * tensors out (they are unchanged); every listed module was delivered. */
static int check_delta_complete(refit_txn *t)
{
    refit_model *m = t->m;
    const struct txn_scratch *s = t->s;
    for (uint32_t i = 0; i < s->n_touched; i++) {
        const module *mod = &m->modules[s->touched[i]];
        if (s->mod_complete[s->touched[i]] == mod->n_primary)
            continue;
        bool whole_needed = (mod->fm.flags & REFIT_MODULE_POST_LOAD) != 0 &&
                            !master_module_settled(t, s->touched[i]);
        for (uint32_t k = 0; k < mod->n_primary && !whole_needed; k++)
            whole_needed = s->route_state[mod->primary[k]] == ROUTE_PARTIAL;
        if (whole_needed)
            return report_incomplete(t, mod);
    }
    for (uint32_t i = 0; t->declared && i < m->n_modules; i++)
        if (t->declared[i] && !s->mod_touched[i])
            return txn_error(t, REFIT_EINCOMPLETE, "finalize: delta update '%s' lists module "
                             "%s among the modules it changes, but nothing of it arrived",
                             t->version_label, m->modules[i].name);
    return REFIT_OK;
}

static int check_complete(refit_txn *t)
{
    if (t->delta)
        return check_delta_complete(t);
    refit_model *m = t->m;
    const struct txn_scratch *s = t->s;
    uint32_t needed_done = 0;
    for (uint32_t i = 0; i < s->n_touched; i++) {
        const module *mod = &m->modules[s->touched[i]];
        if (s->mod_complete[s->touched[i]] != mod->n_primary)
            return report_incomplete(t, mod);
        if (mod->state != MODULE_CLEAN)
            needed_done++;
    }
    if (!t->partial)
        return check_full_scope(t);
    if (needed_done == m->n_empty + m->n_dirty)
        return REFIT_OK;
    for (uint32_t i = 0; i < m->n_modules; i++) {
        const module *mod = &m->modules[i];
        if (mod->state == MODULE_CLEAN || s->mod_touched[i])
            continue;
        return txn_error(t, REFIT_EINCOMPLETE, "finalize: module %s %s; this update must "
                         "deliver it whole (none of its %u tensors arrived)", mod->name,
                         mod->state == MODULE_EMPTY ? "was never loaded"
                                                    : "holds bytes of an aborted update",
                         mod->n_primary);
    }
    return txn_error(t, REFIT_EINTERNAL, "finalize: module accounting is off");
}

/* The worker's version after a commit: the update's label when it
 * delivered something; with how many modules hold it when not all do. */
static void txn_commit_version(refit_txn *t)
{
    refit_model *m = t->m;
    if (t->s->n_touched == 0 && !t->delta)
        return; /* a partial update that delivered nothing: no new label */
    mod_version_hold(t->label);
    mod_version_drop(m->version);
    m->version = t->label;
    m->version_update = t->journal_id;
    m->n_behind = 0;
    if (t->s->n_touched < m->n_modules)
        for (uint32_t i = 0; i < m->n_modules; i++)
            m->n_behind += m->modules[i].version != t->label;
    if (m->n_behind) {
        snprintf(t->version_text, strlen(t->version_label) + 64, "%s (partial: %u of %u modules)",
                 t->version_label, m->n_modules - m->n_behind, m->n_modules);
        free(m->version_text);
        m->version_text = t->version_text;
        t->version_text = NULL;
    }
}

/* Whether the committed update makes its source the next update's undo
 * source (docs/core.md "Undo sources"): rollback at auto or files, every
 * module delivered whole (not partial, not a delta), every tensor from
 * one durable source. */
static bool txn_arms_files(const refit_txn *t)
{
    return t->rollback && !t->partial && !t->delta && t->noted && !t->noted_mixed &&
           t->noted_tensors == t->stats.tensors_loaded && t->s->n_touched == t->m->n_modules &&
           refit_source_is_durable(t->noted) && t->undo_mode_files;
}

void txn_note_source(refit_txn *t, refit_source *src, uint64_t tensors)
{
    if (!t || !src || t->state == TXN_RESTORING)
        return;
    if (t->noted && t->noted != src)
        t->noted_mixed = true;
    else if (!t->noted)
        t->noted = source_hold(src);
    t->noted_tensors += tensors;
}

static void txn_commit(refit_txn *t)
{
    refit_model *m = t->m;
    struct txn_scratch *s = t->s;
    /* a delta: the modules not delivered were declared unchanged and held
     * the base (begin checked): they hold the new version too */
    uint32_t n = t->delta ? m->n_modules : s->n_touched;
    for (uint32_t i = 0; i < n; i++) {
        module *mod = &m->modules[t->delta ? i : s->touched[i]];
        if (mod->state == MODULE_EMPTY)
            m->n_empty--;
        else if (mod->state == MODULE_DIRTY)
            m->n_dirty--;
        mod->state = MODULE_CLEAN;
        mod_version_hold(t->label);
        mod_version_drop(mod->version);
        mod->version = t->label;
    }
    txn_commit_version(t);
    txn_journal_end(t, JOURNAL_UPDATE_COMMITTED, NULL, "update committed");
    /* the undo sources held the version this commit replaced */
    undo_sources_committed(m, txn_arms_files(t) ? t->noted : NULL);
    txn_metrics_end(t, true, NULL, false);
    undo_free(&t->undo);
    master_txn_end(m, true, false);
    scratch_reset(t);
    m->txn = NULL;
    txn_set_state(t, TXN_COMMITTED);
}

/* Every check of finalize; on failure the update is aborted and freed. */
static int txn_prepare(refit_txn *t)
{
    refit_model *m = t->m;
    int rc;
    metrics_ending(&t->clock);
    if (t->state == TXN_FAILED) {
        rc = txn_error(t, t->fail_status, "finalize: the update failed earlier (%s); aborted",
                       refit_status_name(t->fail_status));
    } else if (t->state == TXN_FINALIZING) {
        return txn_error(t, REFIT_ESTATE, "finalize: the update is already prepared; commit "
                         "or abort it");
    } else {
        txn_set_state(t, TXN_FINALIZING);
        /* start what is queued first, so the device copies while the host
         * journals and checks, then wait: a failed check aborts (abort
         * waits for the streams first) */
        const backend *be = t->n_streams ? t->streams[0].be : &backend_host;
        rc = txn_flush_streams(t);
        /* the journal hears of this phase when it can last: when device
         * work is still running (on the host, finalize is a few checks) */
        for (uint32_t i = 0; i < t->n_streams; i++)
            if (t->streams[i].be != &backend_host) {
                txj_finalizing(m, t->journal_id);
                break;
            }
        if (!rc)
            rc = check_complete(t);
        if (!rc)
            rc = model_check_signatures(m, "finalize");
        if (!rc && (rc = txn_sync_streams(t)))
            txn_error(t, rc, "finalize: queued copies failed: %s%s%s", refit_strerror(rc),
                      be->last_error()[0] ? ": " : "", be->last_error());
        /* the post-loads' status area (device words, held failures), once */
        if (!rc && (rc = host_services_check_status(m->ctx))) {
            char why[REFIT_ERRMSG_SIZE];
            memcpy(why, m->ctx->errmsg, sizeof why);
            txn_error(t, rc, "finalize: post-load failed: %s", why);
        }
    }
    if (rc) {
        char why[REFIT_ERRMSG_SIZE];
        memcpy(why, m->ctx->errmsg, sizeof why);
        bool rollback = t->rollback;
        t->abort_status = rc;
        int arc = txn_end_aborted(t, why);
        char restore_err[REFIT_ERRMSG_SIZE];
        memcpy(restore_err, m->ctx->errmsg, sizeof restore_err);
        ctx_error(m->ctx, rc, "%s; update aborted, %s%s%s", why,
                  arc == REFIT_EPOISONED ? "worker POISONED"
                  : rollback             ? "bytes rolled back"
                                         : "nothing was written",
                  arc == REFIT_EPOISONED && restore_err[0] ? ": " : "",
                  arc == REFIT_EPOISONED ? restore_err : "");
    }
    return rc;
}

int refit_finalize_prepare(refit_txn *t)
{
    if (!t)
        return REFIT_EINVAL;
    ctx_clear_error(t->m->ctx);
    return txn_prepare(t);
}

int refit_commit(refit_txn *t)
{
    if (!t)
        return REFIT_EINVAL;
    ctx_clear_error(t->m->ctx);
    if (t->state != TXN_FINALIZING)
        return txn_error(t, REFIT_ESTATE, "commit: the update is not prepared "
                         "(refit_finalize_prepare first)");
    txn_commit(t);
    txn_destroy(t);
    return REFIT_OK;
}

int refit_finalize(refit_txn *t)
{
    if (!t)
        return REFIT_EINVAL;
    ctx_clear_error(t->m->ctx);
    /* prepared: every check passed, only the commit is left (refit.h) */
    int rc = t->state == TXN_FINALIZING ? REFIT_OK : txn_prepare(t);
    if (rc)
        return rc;
    txn_commit(t);
    txn_destroy(t);
    return REFIT_OK;
}

int refit_txn_stats_get(const refit_txn *t, refit_txn_stats *out)
{
    if (!t || !out)
        return REFIT_EINVAL;
    *out = t->stats;
    out->undo_device_bytes = t->undo.placed[UNDO_DEVICE];
    out->undo_host_bytes = t->undo.placed[UNDO_HOST];
    return REFIT_OK;
}
