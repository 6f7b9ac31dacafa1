/* Many tensors per call: refit_load_many, and the loop a source set runs.
 *
 * Two passes over the table. The first checks every row as refit_load
 * would (load_check, txn_load_admit) and forecasts what the rows do to
 * each other: a name twice, a tied name whose other name an earlier row
 * writes (accepted and skipped, as in a sequence of loads), the staging
 * budget as modules fill and their post-load frees their staging. Any
 * refusal refuses the call with nothing written. The second pass then
 * delivers the rows in order exactly as a sequence of refit_load calls
 * would (the same admit, staging and apply), so the bytes, the journal
 * and the bookkeeping are theirs. The marks are stamped per call, so
 * nothing is cleared between calls. A source set without STAGED routes
 * (names unique, rows checked when built) loaded into a txn that holds
 * nothing yet skips the first pass: no row of it can be refused there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/load.h"

/* Per-route and per-unit marks, valid where the stamp is the call's. */
struct load_marks {
    uint32_t stamp;
    uint32_t *name_stamp;       /* per route: a row of this call names it */
    uint32_t *name_row;         /* that row */
    uint32_t *write_stamp;      /* per primary route: a row of this call writes it */
    uint32_t *unit_stamp;       /* per staging unit: unit_rows, unit_counted valid */
    uint32_t *unit_rows;        /* rows of this call completing its tensors */
    uint8_t *unit_counted;      /* the forecast holds its staging */
};

static void marks_free(struct load_marks *k)
{
    if (!k)
        return;
    free(k->name_stamp);
    free(k->name_row);
    free(k->write_stamp);
    free(k->unit_stamp);
    free(k->unit_rows);
    free(k->unit_counted);
    free(k);
}

/* The model's marks at a fresh stamp, or NULL (out of memory). */
static struct load_marks *marks_next(refit_model *m)
{
    struct load_marks *k = m->load_marks;
    size_t nr = (size_t)m->n_routes + 1, nm = (size_t)m->n_units + 1;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k)
            return NULL;
        k->name_stamp = calloc(nr, sizeof *k->name_stamp);
        k->name_row = calloc(nr, sizeof *k->name_row);
        k->write_stamp = calloc(nr, sizeof *k->write_stamp);
        k->unit_stamp = calloc(nm, sizeof *k->unit_stamp);
        k->unit_rows = calloc(nm, sizeof *k->unit_rows);
        k->unit_counted = calloc(nm, 1);
        if (!k->name_stamp || !k->name_row || !k->write_stamp || !k->unit_stamp ||
            !k->unit_rows || !k->unit_counted) {
            marks_free(k);
            return NULL;
        }
        m->load_marks = k;
    }
    if (++k->stamp == 0) { /* wrapped: every old mark could match again */
        memset(k->name_stamp, 0, nr * sizeof *k->name_stamp);
        memset(k->write_stamp, 0, nr * sizeof *k->write_stamp);
        memset(k->unit_stamp, 0, nm * sizeof *k->unit_stamp);
        k->stamp = 1;
    }
    return k;
}

/* Prefix the context's message with the row that caused it. */
static int row_error(refit_model *m, int status, const char *call, size_t i, const char *name,
                     const char *after)
{
    char why[REFIT_ERRMSG_SIZE];
    snprintf(why, sizeof why, "%s", m->ctx->errmsg[0] ? m->ctx->errmsg : refit_strerror(status));
    return ctx_error(m->ctx, status, "%s: row %zu (%s): %s; %s", call, i, name ? name : "?",
                     why, after);
}

/* Row i as a delivery: a prepared one as built, a fresh one checked.
 * *hint: the route after the previous row's (load_resolve_next). */
static int row_delivery(refit_txn *t, const load_table *tab, size_t i, delivery *d,
                        uint32_t *hint)
{
    if (tab->prepared) {
        *d = tab->prepared[i];
        return REFIT_OK;
    }
    const char *name = tab->names[i];
    refit_model *m = txn_model(t);
    if (!name)
        return ctx_error(m->ctx, REFIT_EINVAL, "checkpoint name is NULL");
    int rc = load_resolve_next(m, name, hint, d);
    if (rc)
        return rc;
    d->off = 0;
    return load_check(m, d, &tab->srcs[i], true, false);
}

/* What row i (admitted, *skip from the txn) does alongside the rows before
 * it; refuses what the sequence of loads would refuse. */
static int forecast_row(refit_txn *t, struct load_marks *k, const delivery *d, size_t i,
                        bool *skip, size_t *in_use)
{
    refit_model *m = txn_model(t);
    uint32_t s = k->stamp;
    if (k->name_stamp[d->name_ri] == s)
        return ctx_error(m->ctx, REFIT_EDUPLICATE, "load %s (module %s): delivered twice in "
                         "this call (rows %u and %zu)", d->name,
                         m->modules[d->r->module].name, k->name_row[d->name_ri], i);
    k->name_stamp[d->name_ri] = s;
    k->name_row[d->name_ri] = (uint32_t)i;
    if (!*skip && k->write_stamp[d->ri] == s)
        *skip = true; /* a tied name an earlier row writes: one storage, one write */
    if (*skip)
        return REFIT_OK;
    k->write_stamp[d->ri] = s;
    uint32_t u = d->r->unit;
    const stage_unit *su = &m->units[u];
    const module *mod = &m->modules[su->module];
    if (k->unit_stamp[u] != s) {
        k->unit_stamp[u] = s;
        k->unit_rows[u] = 0;
        k->unit_counted[u] = txn_unit_has_staging(t, u);
    }
    bool completes = txn_unit_complete(t, u) + k->unit_rows[u] + 1 == su->n_primary;
    if (d->r->kind == REFIT_ROUTE_STAGED && !k->unit_counted[u] &&
        !txn_load_in_place(t, d, completes)) {
        if (*in_use + su->staged_bytes > m->ctx->staging_budget)
            return ctx_error(m->ctx, REFIT_EBUDGET, "module %s: staging budget of %llu bytes "
                             "exhausted (%zu in use by then, %zu needed)", mod->name,
                             (unsigned long long)m->ctx->staging_budget, *in_use,
                             su->staged_bytes);
        *in_use += su->staged_bytes;
        k->unit_counted[u] = 1;
    }
    /* the unit's last tensor runs its post-load, which retires its
     * staging (given back before a new block would pass the budget) */
    bool done = txn_unit_complete(t, u) + ++k->unit_rows[u] == su->n_primary;
    if (done && (mod->fm.flags & REFIT_MODULE_POST_LOAD))
        txn_call_completes(t, u);
    if (done && (mod->fm.flags & REFIT_MODULE_POST_LOAD) && k->unit_counted[u]) {
        *in_use -= su->staged_bytes;
        k->unit_counted[u] = 0;
    }
    return REFIT_OK;
}

static int check_all(refit_txn *t, const load_table *tab, const char *call)
{
    refit_model *m = txn_model(t);
    struct load_marks *k = marks_next(m);
    if (!k)
        return ctx_error(m->ctx, REFIT_ENOMEM, "%s: out of memory; nothing written", call);
    size_t in_use = txn_staging_in_use(t);
    uint32_t hint = 0;
    for (size_t i = 0; i < tab->n; i++) {
        delivery d;
        bool skip = false;
        int rc = row_delivery(t, tab, i, &d, &hint);
        if (!rc)
            rc = txn_load_admit(t, &d, true, &skip);
        if (!rc)
            rc = forecast_row(t, k, &d, i, &skip, &in_use);
        if (rc)
            return row_error(m, rc, call, i, tab->prepared ? d.name : tab->names[i],
                             "nothing written by this call");
    }
    return REFIT_OK;
}

static int load_rows(refit_txn *t, const load_table *tab, void *stream, const char *call);

int load_table_run(refit_txn *t, const load_table *tab, void *stream, const char *call)
{
    refit_model *m = txn_model(t);
    int rc = txn_load_open(t, call);
    if (rc)
        return rc;
    /* a refusal writes nothing; the update goes on only when the caller
     * opted to (refit_update_opts.keep_going), as for refit_load */
    if (tab->n && !tab->prepared && (!tab->names || !tab->srcs))
        return txn_load_refused(t, ctx_error(m->ctx, REFIT_EINVAL, "%s: %zu rows but no %s",
                                             call, tab->n, tab->names ? "sources" : "names"));
    if (tab->n > UINT32_MAX)
        return txn_load_refused(t, ctx_error(m->ctx, REFIT_EINVAL, "%s: %zu rows; at most %u "
                                             "per call", call, tab->n, UINT32_MAX));
    /* every row admissible: deliver them in order, as refit_load would,
     * the post-loads of the modules they complete run at the end */
    txn_post_load_defer(t, true);
    if (!(tab->plain && txn_untouched(t)) && (rc = check_all(t, tab, call))) {
        txn_post_load_defer(t, false); /* nothing waits: forget the forecast's marks */
        return txn_load_refused(t, rc);
    }
    rc = load_rows(t, tab, stream, call);
    int end = txn_post_load_defer(t, false);
    return rc ? rc : end;
}

static int load_rows(refit_txn *t, const load_table *tab, void *stream, const char *call)
{
    refit_model *m = txn_model(t);
    int rc = REFIT_OK;
    uint32_t hint = 0;
    for (size_t i = 0; i < tab->n; i++) {
        delivery d;
        bool skip = false;
        void *staging = NULL;
        rc = row_delivery(t, tab, i, &d, &hint);
        if (!rc)
            rc = txn_load_admit(t, &d, true, &skip);
        d.stream = stream;
        if (!rc && !skip)
            rc = txn_load_staging(t, &d, true, &staging);
        if (rc) {
            const char *name = tab->prepared ? tab->prepared[i].name : tab->names[i];
            /* out of staging memory, or a forecast that missed: the rows
             * before were written; fail as a failed write would */
            if (i == 0)
                return txn_load_refused(t, row_error(m, rc, call, i, name,
                                                     "nothing written by this call"));
            row_error(m, rc, call, i, name, "the rows before it were delivered: update failed");
            return txn_load_fail(t, rc);
        }
        if ((rc = txn_load_apply(t, &d, true, skip, staging, false)))
            return rc;
    }
    return REFIT_OK;
}

int refit_load_many(refit_txn *t, size_t n, const char *const *names, const refit_tensor *srcs,
                    void *stream)
{
    if (!t)
        return REFIT_EINVAL;
    ctx_clear_error(txn_model(t)->ctx);
    load_table tab = {n, names, srcs, NULL, false};
    return load_table_run(t, &tab, stream, "refit_load_many");
}

void load_marks_free(refit_model *m)
{
    marks_free(m->load_marks);
    m->load_marks = NULL;
}
