/*
 * Module progress and the end of an update. The batch is applied to the
 * open update's memory first (the truth of what the core reported), then
 * the touched chunks and the partial-count rows are written in one
 * transaction. A failed transaction sets resync: the next one rewrites
 * every chunk and every partial-count row of the update.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "journal/journal_int.h"

/* Same letters as journal_update.c and the modules view. */
static const char state_letter[JOURNAL_MODULE_STATE_COUNT] = {
    '.', 'p', 'c', 'C', 'r', 'X'};

static int check_batch(journal *j, int64_t update_id, size_t n,
                       const journal_module_progress *p, const char *what)
{
    if (!j->cur.id || update_id != j->cur.id)
        return jr_fail(j, REFIT_ESTATE, "journal %s: %s: update %lld is not "
                       "open on this handle", j->path, what,
                       (long long)update_id);
    for (size_t i = 0; i < n; i++) {
        if (p[i].index >= j->cur.n)
            return jr_fail(j, REFIT_EINVAL, "journal %s: %s: update %lld "
                           "has no module at index %u (it has %zu)", j->path,
                           what, (long long)update_id, (unsigned)p[i].index,
                           j->cur.n);
        if ((unsigned)p[i].state >= JOURNAL_MODULE_STATE_COUNT)
            return jr_fail(j, REFIT_EINVAL, "journal %s: %s: entry %zu has "
                           "state %d", j->path, what, i, (int)p[i].state);
    }
    return jr_check_writable(j, what);
}

static void apply(jr_update *u, size_t n, const journal_module_progress *p)
{
    for (size_t k = 0; k < n; k++) {
        size_t i = p[k].index, c = i / JOURNAL_CHUNK;
        u->states[i] = state_letter[p[k].state];
        u->received[2 * i] = p[k].received_tensors;
        u->received[2 * i + 1] = p[k].received_bytes;
        u->chunk_flags[c] |= JR_CHUNK_DIRTY;
        if (p[k].has_fingerprint) {
            uint8_t *f = u->fps + i * JOURNAL_FP_BYTES;
            f[0] = 1;
            for (int b = 0; b < 8; b++)
                f[1 + b] = (uint8_t)(p[k].fingerprint >> (56 - 8 * b));
            u->chunk_flags[c] |= JR_CHUNK_FP;
        }
    }
}

int journal_modules_progress(journal *j, int64_t update_id, size_t n,
                             const journal_module_progress *p)
{
    const char *what = "recording module progress";
    if (!j || (n && !p))
        return REFIT_EINVAL;
    int rc = check_batch(j, update_id, n, p, what);
    if (rc != REFIT_OK || n == 0)
        return rc;
    apply(&j->cur, n, p);
    if ((rc = jr_tx_begin(j, what)) == REFIT_OK) {
        if (jr_write_batch(j, &j->cur, n, p) != SQLITE_DONE)
            rc = jr_fail_sqlite(j, what);
        else
            rc = jr_tx_commit(j, what);
    }
    /* Chunk flags may say clean for rows the rollback undid. */
    j->cur.resync = rc != REFIT_OK;
    return rc;
}

int journal_update_undo(journal *j, int64_t update_id, uint64_t device_bytes,
                        uint64_t host_bytes)
{
    if (!j)
        return REFIT_EINVAL;
    if (!update_id || j->cur.id != update_id)
        return jr_fail(j, REFIT_ESTATE, "journal %s: recording the undo "
                       "placement: update %lld is not open on this handle",
                       j->path, (long long)update_id);
    j->cur.has_undo = 1;
    j->cur.undo[0] = device_bytes;
    j->cur.undo[1] = host_bytes;
    return REFIT_OK;
}

int journal_update_undo_source(journal *j, int64_t update_id, const char *text)
{
    if (!j || !text)
        return REFIT_EINVAL;
    if (!update_id || j->cur.id != update_id)
        return jr_fail(j, REFIT_ESTATE, "journal %s: recording the undo "
                       "source: update %lld is not open on this handle",
                       j->path, (long long)update_id);
    char *copy = strdup(text);
    if (!copy)
        return jr_fail(j, REFIT_ENOMEM, "journal %s: out of memory", j->path);
    free(j->cur.undo_source);
    j->cur.undo_source = copy;
    return REFIT_OK;
}

/* The end write failed: the update ended all the same. Keep its record
 * for the next write transaction (journal_held.c); the status stays the
 * failure's, the message says the end is held. */
static int end_failed(journal *j, int64_t update_id, const char *state,
                      uint64_t bytes, uint64_t tensors, const char *error,
                      const char *at, const journal_health_change *h)
{
    j->cur.resync = 1;
    if (jr_held_keep(j, update_id, state, bytes, tensors, error, at, h))
        return REFIT_EJOURNAL; /* out of memory: the message is the write's */
    size_t len = strlen(j->err);
    snprintf(j->err + len, sizeof j->err - len, "; the end of update %lld "
             "(%s) is held and written first by the next journal write",
             (long long)update_id, state);
    return REFIT_EJOURNAL;
}

int journal_update_end(journal *j, int64_t update_id,
                       journal_update_state state, uint64_t bytes,
                       uint64_t tensors, const char *error, size_t n,
                       const journal_module_progress *p)
{
    return journal_update_end_health(j, update_id, state, bytes, tensors,
                                     error, n, p, NULL);
}

int journal_update_end_health(journal *j, int64_t update_id,
                              journal_update_state state, uint64_t bytes,
                              uint64_t tensors, const char *error, size_t n,
                              const journal_module_progress *p,
                              const journal_health_change *h)
{
    const char *what = "ending an update";
    if (!j || (n && !p) || (h && (!h->worker_id || !h->to)))
        return REFIT_EINVAL;
    if (state < JOURNAL_UPDATE_COMMITTED || state >= JOURNAL_UPDATE_STATE_COUNT)
        return jr_fail(j, REFIT_EINVAL, "journal %s: %s: %d is not a final "
                       "state", j->path, what, (int)state);
    int rc = check_batch(j, update_id, n, p, what);
    if (rc != REFIT_OK)
        return rc;
    apply(&j->cur, n, p);
    char now[32];
    jr_now(now, sizeof now);
    const char *st = journal_update_state_name(state);
    if ((rc = jr_tx_begin(j, what)) != REFIT_OK)
        return end_failed(j, update_id, st, bytes, tensors, error, now, h);
    int src = jr_end_row(j, update_id, st, bytes, tensors, error, now);
    if (src == JR_ROW_CLOSED)
        src = jr_end_closed_event(j, update_id, h ? h->worker_id : NULL, st, now);
    if (src == SQLITE_DONE)
        src = jr_write_batch(j, &j->cur, n, p);
    if (src == SQLITE_DONE && h) {
        char fbuf[32], tbuf[32];
        src = jr_health_rows_at(j, h->worker_id,
                                jr_health_lower(h->from, fbuf, sizeof fbuf),
                                jr_health_lower(h->to, tbuf, sizeof tbuf),
                                h->reason, h->version, now);
    }
    if (src == SQLITE_NOTFOUND) {
        jr_tx_rollback(j);
        j->cur.resync = 1;
        return jr_fail(j, REFIT_ENOTFOUND, "journal %s: %s: update %lld has "
                       "no row", j->path, what, (long long)update_id);
    }
    rc = src == SQLITE_DONE ? jr_tx_commit(j, what) : jr_fail_sqlite(j, what);
    if (rc != REFIT_OK)
        return end_failed(j, update_id, st, bytes, tensors, error, now, h);
    if (j->held.id == update_id)
        jr_held_free(&j->held); /* superseded by the end just written */
    jr_update_free(&j->cur);
    if (j->locked_update == update_id) {
        jr_unlock_update(j, update_id);
        j->locked_update = 0;
    }
    return REFIT_OK;
}
