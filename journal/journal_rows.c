/*
 * The rows of an open update written inside the caller's transaction, and
 * its memory: the end row, module progress (partial counts, chunks), health
 * and event rows. They begin and commit nothing, so the held end
 * (journal_held.c), which the transaction writes first (journal_tx.c), and
 * the public writes above both use them: this file calls only the handle
 * (journal.c), never up. Each returns SQLITE_DONE or the failing SQLite code.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "journal/journal_int.h"

/* The letter of a pending module (journal_progress.c's state_letter). */
static const char pending_letter = '.';

static void bind_text_or_null(sqlite3_stmt *s, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, i);
}

/* Lowercase copy of a health name, so "READY" and "ready" are one state. */
const char *jr_health_lower(const char *in, char *buf, size_t len)
{
    size_t i = 0;
    if (!in)
        return NULL;
    for (; in[i] && i + 1 < len; i++)
        buf[i] = (char)tolower((unsigned char)in[i]);
    buf[i] = '\0';
    return buf;
}

int jr_health_rows(journal *j, const char *worker_id, const char *from,
                       const char *to, const char *reason,
                       const char *version)
{
    char now[32];
    jr_now(now, sizeof now);
    return jr_health_rows_at(j, worker_id, from, to, reason, version, now);
}

int jr_health_rows_at(journal *j, const char *worker_id, const char *from,
                      const char *to, const char *reason, const char *version,
                      const char *now)
{
    sqlite3_stmt *w = jr_stmt(j, JS_WORKER_HEALTH);
    sqlite3_stmt *h = jr_stmt(j, JS_HEALTH_INSERT);
    if (!w || !h)
        return SQLITE_ERROR;
    sqlite3_bind_text(w, 1, worker_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(w, 2, to, -1, SQLITE_STATIC);
    bind_text_or_null(w, 3, version);
    sqlite3_bind_text(w, 4, now, -1, SQLITE_STATIC);
    int rc = jr_step_done(j, w);
    if (rc != SQLITE_DONE)
        return rc;
    sqlite3_bind_text(h, 1, worker_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(h, 2, now, -1, SQLITE_STATIC);
    bind_text_or_null(h, 3, from);
    sqlite3_bind_text(h, 4, to, -1, SQLITE_STATIC);
    bind_text_or_null(h, 5, reason);
    bind_text_or_null(h, 6, version);
    return jr_step_done(j, h);
}

int jr_event_row(journal *j, int64_t update_id, const char *worker_id,
                     const char *kind, const char *msg)
{
    char now[32];
    sqlite3_stmt *s = jr_stmt(j, JS_EVENT_INSERT);
    if (!s)
        return SQLITE_ERROR;
    jr_now(now, sizeof now);
    sqlite3_bind_text(s, 1, now, -1, SQLITE_STATIC);
    if (update_id > 0)
        sqlite3_bind_int64(s, 2, update_id);
    else
        sqlite3_bind_null(s, 2);
    bind_text_or_null(s, 3, worker_id);
    sqlite3_bind_text(s, 4, kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 5, msg, -1, SQLITE_STATIC);
    return jr_step_done(j, s);
}

void jr_update_free(jr_update *u)
{
    free(u->states);
    free(u->fps);
    free(u->expected);
    free(u->received);
    free(u->mod_flags);
    free(u->chunk_flags);
    free(u->undo_source);
    memset(u, 0, sizeof *u);
}

/* The counts the modules view shows without a module_received row. */
static int received_obvious(const jr_update *u, size_t i)
{
    if (u->states[i] == pending_letter)
        return !u->received[2 * i] && !u->received[2 * i + 1];
    return u->received[2 * i] == u->expected[2 * i] &&
           u->received[2 * i + 1] == u->expected[2 * i + 1];
}

/* Upsert the row of a module with partial counts, drop a stale one. */
static int received_row(journal *j, jr_update *u, size_t i)
{
    sqlite3_stmt *s;
    int rc;
    if (received_obvious(u, i)) {
        if (!(u->mod_flags[i] & JR_MOD_ROW))
            return SQLITE_DONE;
        if (!(s = jr_stmt(j, JS_RECEIVED_DELETE)))
            return SQLITE_ERROR;
        sqlite3_bind_int64(s, 1, u->id);
        sqlite3_bind_int64(s, 2, (sqlite3_int64)i);
        if ((rc = jr_step_done(j, s)) == SQLITE_DONE)
            u->mod_flags[i] &= (uint8_t)~JR_MOD_ROW;
        return rc;
    }
    if (!(s = jr_stmt(j, JS_RECEIVED_UPSERT)))
        return SQLITE_ERROR;
    sqlite3_bind_int64(s, 1, u->id);
    sqlite3_bind_int64(s, 2, (sqlite3_int64)i);
    sqlite3_bind_int64(s, 3, (sqlite3_int64)u->received[2 * i]);
    sqlite3_bind_int64(s, 4, (sqlite3_int64)u->received[2 * i + 1]);
    if ((rc = jr_step_done(j, s)) == SQLITE_DONE)
        u->mod_flags[i] |= JR_MOD_ROW;
    return rc;
}

/* After a failed transaction: no row is trusted, every chunk is dirty. */
static int resync(journal *j, jr_update *u)
{
    sqlite3_stmt *s = jr_stmt(j, JS_RECEIVED_CLEAR);
    if (!s)
        return SQLITE_ERROR;
    sqlite3_bind_int64(s, 1, u->id);
    int rc = jr_step_done(j, s);
    for (size_t i = 0; i < u->n; i++)
        u->mod_flags[i] &= (uint8_t)~JR_MOD_ROW;
    for (size_t i = 0; i < u->n && rc == SQLITE_DONE; i++)
        rc = received_row(j, u, i);
    for (size_t c = 0; c < u->n_chunks; c++)
        u->chunk_flags[c] |= JR_CHUNK_DIRTY;
    return rc;
}

static int chunk_writes(journal *j, jr_update *u)
{
    sqlite3_stmt *s = jr_stmt(j, JS_CHUNK_WRITE);
    int rc = s ? SQLITE_DONE : SQLITE_ERROR;
    if (s)
        sqlite3_bind_int64(s, 1, u->id);
    for (size_t c = 0; c < u->n_chunks && rc == SQLITE_DONE; c++) {
        size_t len = u->n - c * JOURNAL_CHUNK;
        if (!(u->chunk_flags[c] & JR_CHUNK_DIRTY))
            continue;
        len = len < JOURNAL_CHUNK ? len : JOURNAL_CHUNK;
        sqlite3_bind_int64(s, 2, (sqlite3_int64)c);
        sqlite3_bind_text(s, 3, u->states + c * JOURNAL_CHUNK, (int)len,
                          SQLITE_STATIC);
        if (u->chunk_flags[c] & JR_CHUNK_FP)
            sqlite3_bind_blob(s, 4, u->fps + c * JOURNAL_CHUNK *
                              JOURNAL_FP_BYTES, (int)(len * JOURNAL_FP_BYTES),
                              SQLITE_STATIC);
        else
            sqlite3_bind_null(s, 4);
        if ((rc = jr_step_done(j, s)) == SQLITE_DONE)
            u->chunk_flags[c] &= (uint8_t)~JR_CHUNK_DIRTY;
    }
    return rc;
}

int jr_write_batch(journal *j, jr_update *u, size_t n,
                       const journal_module_progress *p)
{
    int rc = SQLITE_DONE;
    if (u->resync)
        rc = resync(j, u);
    else
        for (size_t k = 0; k < n && rc == SQLITE_DONE; k++)
            rc = received_row(j, u, p[k].index);
    return rc == SQLITE_DONE ? chunk_writes(j, u) : rc;
}

int jr_end_row(journal *j, int64_t update_id, const char *state,
               uint64_t bytes, uint64_t tensors, const char *error,
               const char *at)
{
    const jr_update *u = &j->cur;
    char now[32];
    sqlite3_stmt *s = jr_stmt(j, JS_UPDATE_END);
    if (!s)
        return SQLITE_ERROR;
    if (at)
        snprintf(now, sizeof now, "%s", at);
    else
        jr_now(now, sizeof now);
    sqlite3_bind_int64(s, 1, update_id);
    sqlite3_bind_text(s, 2, state, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, (sqlite3_int64)bytes);
    sqlite3_bind_int64(s, 4, (sqlite3_int64)tensors);
    if (error)
        sqlite3_bind_text(s, 5, error, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 5);
    sqlite3_bind_text(s, 6, now, -1, SQLITE_STATIC);
    for (int i = 0; i < 2; i++) {
        if (u->id == update_id && u->has_undo)
            sqlite3_bind_int64(s, 7 + i, (sqlite3_int64)u->undo[i]);
        else
            sqlite3_bind_null(s, 7 + i);
    }
    if (u->id == update_id && u->undo_source)
        sqlite3_bind_text(s, 9, u->undo_source, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 9);
    int rc = jr_step_done(j, s);
    if (rc != SQLITE_DONE || sqlite3_changes(j->db) == 1)
        return rc;
    /* 0 rows: it is gone, or it ended already: another process marked it
     * interrupted (its writer looked dead). Never back to an open state. */
    sqlite3_stmt *q = NULL;
    rc = sqlite3_prepare_v2(j->db, "SELECT 1 FROM updates WHERE id = ?1", -1,
                            &q, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(q, 1, update_id);
        rc = jr_step(j, q);
    }
    sqlite3_finalize(q);
    return rc == SQLITE_ROW ? JR_ROW_CLOSED : rc == SQLITE_DONE ? SQLITE_NOTFOUND : rc;
}

int jr_end_closed_event(journal *j, int64_t update_id, const char *worker,
                        const char *state, const char *at)
{
    char msg[256], was[32] = "?";
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(j->db, "SELECT state FROM updates WHERE id = ?1", -1, &q,
                           NULL) == SQLITE_OK) {
        sqlite3_bind_int64(q, 1, update_id);
        if (jr_step(j, q) == SQLITE_ROW)
            snprintf(was, sizeof was, "%s", (const char *)sqlite3_column_text(q, 0));
    }
    sqlite3_finalize(q);
    snprintf(msg, sizeof msg, "update %lld ended %s at %s, after another process "
             "had recorded it %s; the recorded state stays %s", (long long)update_id,
             state, at, was, was);
    return jr_event_row(j, update_id, worker, "ended_late", msg);
}
