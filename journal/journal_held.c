/*
 * The held end of an update. When the write that ends an update fails
 * (disk full, I/O error, lock timeout) the update did end: the core
 * committed or rolled back. The end record is kept here, with the time it
 * happened and the worker's health after it, and written first by the next
 * write transaction on the handle (jr_tx_begin), so the journal reads right
 * as soon as it can be written again: the update with its real final state,
 * not `interrupted`, and the next update begun after it. An event of kind
 * "late" says the record came late. journal_write_held (journal_tx.c)
 * writes it alone (refit_close does, before closing).
 *
 * States of the held record:
 *   none      -> held        [journal_update_end_health fails]
 *   held      -> in_tx       [jr_tx_begin wrote it in a new transaction]
 *   in_tx     -> none        [jr_tx_commit: the end is in the file]
 *   in_tx     -> held        [jr_tx_rollback: every row is rewritten next]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "journal/journal_int.h"

static char *dup_or_null(const char *s, int *bad)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *bad = 1;
    return d;
}

void jr_held_free(jr_held *h)
{
    free(h->state);
    free(h->error);
    free(h->why);
    free(h->worker);
    free(h->from);
    free(h->to);
    free(h->reason);
    free(h->version);
    memset(h, 0, sizeof *h);
}

int jr_held_keep(journal *j, int64_t update_id, const char *state,
                 uint64_t bytes, uint64_t tensors, const char *error,
                 const char *at, const journal_health_change *hc)
{
    jr_held h = {.id = update_id, .bytes = bytes, .tensors = tensors};
    int bad = 0;
    h.state = dup_or_null(state, &bad);
    h.error = dup_or_null(error, &bad);
    h.why = dup_or_null(j->err, &bad);
    snprintf(h.at, sizeof h.at, "%s", at);
    if (hc) {
        h.has_health = 1;
        h.worker = dup_or_null(hc->worker_id, &bad);
        h.from = dup_or_null(hc->from, &bad);
        h.to = dup_or_null(hc->to, &bad);
        h.reason = dup_or_null(hc->reason, &bad);
        h.version = dup_or_null(hc->version, &bad);
    }
    if (bad) {
        jr_held_free(&h);
        return REFIT_ENOMEM;
    }
    jr_held_free(&j->held);
    j->held = h;
    return REFIT_OK;
}

int jr_held_write(journal *j)
{
    jr_held *h = &j->held;
    int rc = jr_end_row(j, h->id, h->state, h->bytes, h->tensors, h->error,
                        h->at);
    if (rc == SQLITE_NOTFOUND) /* the row is gone: nothing to record into */
        rc = SQLITE_DONE;
    else if (rc == JR_ROW_CLOSED)
        rc = jr_end_closed_event(j, h->id, h->has_health ? h->worker : NULL,
                                 h->state, h->at);
    else if (rc == SQLITE_DONE && j->cur.id == h->id)
        rc = jr_write_batch(j, &j->cur, 0, NULL); /* resync: every row */
    if (rc == SQLITE_DONE && h->has_health) {
        char fbuf[32], tbuf[32];
        rc = jr_health_rows_at(j, h->worker,
                               jr_health_lower(h->from, fbuf, sizeof fbuf),
                               jr_health_lower(h->to, tbuf, sizeof tbuf),
                               h->reason, h->version, h->at);
    }
    if (rc == SQLITE_DONE) {
        char msg[JOURNAL_ERR_MAX + 160];
        snprintf(msg, sizeof msg, "update %lld ended %s at %s; its end is "
                 "recorded late, the write then failed: %s",
                 (long long)h->id, h->state, h->at, h->why ? h->why : "?");
        rc = jr_event_row(j, h->id, h->worker, "late", msg);
    }
    if (rc == SQLITE_DONE)
        h->in_tx = 1;
    return rc;
}

void jr_held_committed(journal *j)
{
    if (!j->held.in_tx)
        return;
    if (j->cur.id == j->held.id)
        jr_update_free(&j->cur);
    if (j->locked_update == j->held.id) {
        jr_unlock_update(j, j->locked_update);
        j->locked_update = 0;
    }
    jr_held_free(&j->held);
}

void jr_held_rolled_back(journal *j)
{
    if (!j->held.in_tx)
        return;
    j->held.in_tx = 0;
    if (j->cur.id == j->held.id)
        j->cur.resync = 1; /* chunk flags may say clean for undone rows */
}

int64_t journal_held_end(const journal *j)
{
    return j ? j->held.id : 0;
}
