/*
 * Journal reads, for refitctl and replay. Reads are not on any hot path:
 * each call prepares its statement and finalizes it. Rows handed to the
 * callbacks point into SQLite's memory and are valid during the callback.
 *
 * An update recorded loading/finalizing whose writer no longer runs is
 * reported "interrupted" even by a read-only handle, which cannot record
 * it: the next read-write open will (journal_open).
 */
#include <stdio.h>
#include <string.h>

#include "journal/journal_int.h"

static const char *col_text(sqlite3_stmt *s, int i)
{
    return (const char *)sqlite3_column_text(s, i);
}

static int is_open_state(const char *state)
{
    return state && (!strcmp(state, "loading") ||
                     !strcmp(state, "finalizing"));
}

/* Prepare or fail with a message; reads set no gaps. */
static int prepare(journal *j, const char *sql, sqlite3_stmt **s,
                   const char *what)
{
    if (!j)
        return REFIT_EINVAL;
    if (sqlite3_prepare_v2(j->db, sql, -1, s, NULL) != SQLITE_OK)
        return jr_fail_sqlite(j, what);
    return REFIT_OK;
}

/* Step through rows calling row(); finalize. */
static int each_row(journal *j, sqlite3_stmt *s, const char *what,
                    int (*row)(journal *, sqlite3_stmt *, void *), void *ctx)
{
    int rc, stop = 0;
    while ((rc = jr_step(j, s)) == SQLITE_ROW)
        if ((stop = row(j, s, ctx)) != 0)
            break;
    if (!stop && rc != SQLITE_DONE) {
        int status = jr_fail_sqlite(j, what);
        sqlite3_finalize(s);
        return status;
    }
    sqlite3_finalize(s);
    return stop;
}

/* The caller's callback and its user pointer, through each_row. */
struct cb {
    union {
        journal_worker_fn w;
        journal_update_fn u;
        journal_module_fn m;
        journal_event_fn e;
    } fn;
    void *user;
};

/* ---- workers ------------------------------------------------------------ */

static int worker_row(journal *j, sqlite3_stmt *s, void *ctx)
{
    struct cb *c = ctx;
    journal_worker_row r = {
        .id = col_text(s, 0), .rank = sqlite3_column_int64(s, 1),
        .pid = sqlite3_column_int64(s, 2), .host = col_text(s, 3),
        .health = col_text(s, 4), .version = col_text(s, 5),
        .heartbeat = col_text(s, 6), .last_update = sqlite3_column_int64(s, 8),
        .last_update_state = col_text(s, 9)};
    r.health_recorded = r.health;
    r.alive = jr_worker_live(j, r.id, r.host, r.pid, sqlite3_column_int64(s, 7));
    /* The worker died inside its update: what it holds is unknown. */
    if (is_open_state(r.last_update_state) &&
        !jr_update_live(j, r.last_update, col_text(s, 12),
                        sqlite3_column_int64(s, 10), sqlite3_column_int64(s, 11))) {
        r.last_update_state = "interrupted";
        if (sqlite3_column_int64(s, 10) == r.pid)
            r.health = "unknown";
    }
    return c->fn.w ? c->fn.w(c->user, &r) : 0;
}

int journal_workers_list(journal *j, journal_worker_fn fn, void *user)
{
    sqlite3_stmt *s = NULL;
    struct cb c = {.fn.w = fn, .user = user};
    int rc = prepare(j, "SELECT w.id, w.rank, w.pid, w.host, w.health,"
        " w.version, w.heartbeat, w.pid_start, u.id, u.state, u.pid,"
        " u.pid_start, u.host FROM workers w LEFT JOIN updates u ON u.id ="
        " (SELECT max(id) FROM updates WHERE worker = w.id)"
        " ORDER BY w.rank, w.id", &s, "listing workers");
    return rc ? rc : each_row(j, s, "listing workers", worker_row, &c);
}

/* ---- updates ------------------------------------------------------------ */

#define UPDATE_COLUMNS                                                         \
    "SELECT id, worker, version, source_uri, source_digest,"                  \
    " CASE WHEN mode = 'normal' AND (source_uri LIKE 'snapshot://%'"          \
    "  OR source_uri LIKE 'keeper://%') THEN 'restore' ELSE mode END,"        \
    " replay_of, rollback_on, state, started_at, ended_at, bytes, tensors,"   \
    " error, n_modules, pid, pid_start, host, partial, undo_device_bytes,"            \
    " undo_host_bytes, undo_source FROM updates"

static int update_row(journal *j, sqlite3_stmt *s, void *ctx)
{
    struct cb *c = ctx;
    journal_update_row r = {
        .id = sqlite3_column_int64(s, 0), .worker = col_text(s, 1),
        .version = col_text(s, 2), .source_uri = col_text(s, 3),
        .source_digest = col_text(s, 4), .mode = col_text(s, 5),
        .replay_of = sqlite3_column_int64(s, 6),
        .rollback = sqlite3_column_int(s, 7), .state = col_text(s, 8),
        .state_recorded = col_text(s, 8), .started_at = col_text(s, 9),
        .ended_at = col_text(s, 10),
        .bytes = (uint64_t)sqlite3_column_int64(s, 11),
        .tensors = (uint64_t)sqlite3_column_int64(s, 12),
        .error = col_text(s, 13), .n_modules = sqlite3_column_int64(s, 14),
        .pid = sqlite3_column_int64(s, 15), .host = col_text(s, 17),
        .partial = sqlite3_column_int(s, 18),
        .undo_recorded = sqlite3_column_type(s, 19) != SQLITE_NULL,
        .undo_device_bytes = (uint64_t)sqlite3_column_int64(s, 19),
        .undo_host_bytes = (uint64_t)sqlite3_column_int64(s, 20),
        .undo_source = col_text(s, 21)};
    if (is_open_state(r.state) &&
        !jr_update_live(j, r.id, r.host, r.pid, sqlite3_column_int64(s, 16)))
        r.state = "interrupted";
    return c->fn.u ? c->fn.u(c->user, &r) : 0;
}

int journal_updates_list(journal *j, journal_update_fn fn, void *user)
{
    sqlite3_stmt *s = NULL;
    struct cb c = {.fn.u = fn, .user = user};
    int rc = prepare(j, UPDATE_COLUMNS " ORDER BY id", &s, "listing updates");
    return rc ? rc : each_row(j, s, "listing updates", update_row, &c);
}

static int count_row(journal *j, sqlite3_stmt *s, void *ctx)
{
    (void)j;
    (void)s;
    (*(int *)ctx)++;
    return 0;
}

/* REFIT_OK when the update exists, REFIT_ENOTFOUND with a message if not. */
static int update_exists(journal *j, int64_t id)
{
    sqlite3_stmt *s = NULL;
    int n = 0;
    int rc = prepare(j, "SELECT 1 FROM updates WHERE id = ?1", &s,
                     "reading an update");
    if (rc)
        return rc;
    sqlite3_bind_int64(s, 1, id);
    rc = each_row(j, s, "reading an update", count_row, &n);
    if (rc == REFIT_OK && n == 0)
        return jr_fail(j, REFIT_ENOTFOUND, "journal %s: no update %lld",
                       j->path, (long long)id);
    return rc;
}

int journal_update_get(journal *j, int64_t update_id, journal_update_fn fn,
                       void *user)
{
    sqlite3_stmt *s = NULL;
    struct cb c = {.fn.u = fn, .user = user};
    int rc = update_exists(j, update_id);
    if (rc == REFIT_OK)
        rc = prepare(j, UPDATE_COLUMNS " WHERE id = ?1", &s,
                     "reading an update");
    if (rc)
        return rc;
    sqlite3_bind_int64(s, 1, update_id);
    return each_row(j, s, "reading an update", update_row, &c);
}

/* ---- modules, events ----------------------------------------------------- */

static int module_row(journal *j, sqlite3_stmt *s, void *ctx)
{
    struct cb *c = ctx;
    (void)j;
    journal_module_row r = {
        .update_id = sqlite3_column_int64(s, 0),
        .index = sqlite3_column_int64(s, 1), .name = col_text(s, 2),
        .state = col_text(s, 3),
        .expected_tensors = (uint64_t)sqlite3_column_int64(s, 4),
        .received_tensors = (uint64_t)sqlite3_column_int64(s, 5),
        .expected_bytes = (uint64_t)sqlite3_column_int64(s, 6),
        .received_bytes = (uint64_t)sqlite3_column_int64(s, 7),
        .fingerprint = col_text(s, 8)};
    return c->fn.m ? c->fn.m(c->user, &r) : 0;
}

int journal_modules_list(journal *j, int64_t update_id, int incomplete_only,
                         journal_module_fn fn, void *user)
{
    sqlite3_stmt *s = NULL;
    struct cb c = {.fn.m = fn, .user = user};
    int rc = update_exists(j, update_id);
    if (rc == REFIT_OK)
        rc = prepare(j, incomplete_only
            ? "SELECT update_id, idx, name, state, expected_tensors,"
              " received_tensors, expected_bytes, received_bytes, fingerprint"
              " FROM modules WHERE update_id = ?1 AND state NOT IN"
              " ('complete', 'committed') ORDER BY idx"
            : "SELECT update_id, idx, name, state, expected_tensors,"
              " received_tensors, expected_bytes, received_bytes, fingerprint"
              " FROM modules WHERE update_id = ?1 ORDER BY idx",
            &s, "listing modules");
    if (rc)
        return rc;
    sqlite3_bind_int64(s, 1, update_id);
    return each_row(j, s, "listing modules", module_row, &c);
}

static int event_row(journal *j, sqlite3_stmt *s, void *ctx)
{
    struct cb *c = ctx;
    (void)j;
    journal_event_row r = {
        .id = sqlite3_column_int64(s, 0), .at = col_text(s, 1),
        .update_id = sqlite3_column_int64(s, 2), .worker = col_text(s, 3),
        .kind = col_text(s, 4), .message = col_text(s, 5)};
    return c->fn.e ? c->fn.e(c->user, &r) : 0;
}

int journal_events_list(journal *j, int64_t update_id, int64_t limit,
                        journal_event_fn fn, void *user)
{
    sqlite3_stmt *s = NULL;
    struct cb c = {.fn.e = fn, .user = user};
    /* The newest `limit` events, shown oldest first. */
    int rc = prepare(j, "SELECT * FROM (SELECT id, at, update_id, worker,"
        " kind, message FROM events WHERE ?1 = 0 OR update_id = ?1"
        " ORDER BY id DESC LIMIT ?2) ORDER BY id", &s, "listing events");
    if (rc)
        return rc;
    sqlite3_bind_int64(s, 1, update_id);
    sqlite3_bind_int64(s, 2, limit > 0 ? limit : -1);
    return each_row(j, s, "listing events", event_row, &c);
}
