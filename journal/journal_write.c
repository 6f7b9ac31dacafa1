/*
 * Journal writes. Each public call is one SQLite transaction, whatever the
 * number of rows: begin writes the update and all its module rows, a
 * progress batch writes all its rows, end writes the final state and all
 * module rows. The core batches; the journal never sees single tensors.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "journal/journal_int.h"

int journal_worker_register(journal *j, const char *worker_id, int rank)
{
    char now[32];
    if (!j || !worker_id)
        return REFIT_EINVAL;
    int rc = jr_check_writable(j, "registering a worker");
    /* one live process per worker id: its lock, before any change */
    if (rc != REFIT_OK || (rc = jr_lock_worker(j, worker_id)) ||
        (rc = jr_tx_begin(j, "registering a worker")))
        return rc;
    sqlite3_stmt *s = jr_stmt(j, JS_WORKER_UPSERT);
    if (!s)
        return jr_fail_sqlite(j, "registering a worker");
    jr_now(now, sizeof now);
    sqlite3_bind_text(s, 1, worker_id, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, rank);
    sqlite3_bind_int64(s, 3, j->pid);
    if (j->pid_start > 0)
        sqlite3_bind_int64(s, 4, j->pid_start);
    else
        sqlite3_bind_null(s, 4);
    sqlite3_bind_text(s, 5, j->host, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 6, now, -1, SQLITE_STATIC);
    if (jr_step_done(j, s) != SQLITE_DONE)
        return jr_fail_sqlite(j, "registering a worker");
    return jr_tx_commit(j, "registering a worker");
}

int journal_heartbeat(journal *j, const char *worker_id)
{
    char now[32];
    if (!j || !worker_id)
        return REFIT_EINVAL;
    int rc = jr_check_writable(j, "heartbeat");
    if (rc != REFIT_OK || (rc = jr_tx_begin(j, "heartbeat")))
        return rc;
    sqlite3_stmt *s = jr_stmt(j, JS_HEARTBEAT);
    if (!s)
        return jr_fail_sqlite(j, "heartbeat");
    jr_now(now, sizeof now);
    sqlite3_bind_text(s, 1, worker_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, now, -1, SQLITE_STATIC);
    if (jr_step_done(j, s) != SQLITE_DONE)
        return jr_fail_sqlite(j, "heartbeat");
    return jr_tx_commit(j, "heartbeat");
}

int journal_health(journal *j, const char *worker_id, const char *from,
                   const char *to, const char *reason, const char *version)
{
    char fbuf[32], tbuf[32];
    const char *what = "recording a health transition";
    if (!j || !worker_id || !to)
        return REFIT_EINVAL;
    int rc = jr_check_writable(j, what);
    if (rc != REFIT_OK || (rc = jr_tx_begin(j, what)))
        return rc;
    rc = jr_health_rows(j, worker_id, jr_health_lower(from, fbuf, sizeof fbuf),
                     jr_health_lower(to, tbuf, sizeof tbuf), reason, version);
    if (rc != SQLITE_DONE)
        return jr_fail_sqlite(j, what);
    return jr_tx_commit(j, what);
}

static int event_write(journal *j, int64_t update_id, const char *worker_id,
                       const char *kind, const char *msg)
{
    const char *what = "recording an event";
    int rc = jr_check_writable(j, what);
    if (rc != REFIT_OK || (rc = jr_tx_begin(j, what)))
        return rc;
    if (jr_event_row(j, update_id, worker_id, kind, msg) != SQLITE_DONE)
        return jr_fail_sqlite(j, what);
    return jr_tx_commit(j, what);
}

int journal_event(journal *j, int64_t update_id, const char *worker_id,
                  const char *kind, const char *fmt, ...)
{
    va_list ap;
    if (!j || !kind || !fmt)
        return REFIT_EINVAL;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return jr_fail(j, REFIT_EINVAL, "journal %s: bad event format",
                       j->path);
    char *msg = malloc((size_t)n + 1);
    if (!msg)
        return jr_fail(j, REFIT_ENOMEM, "journal %s: out of memory",
                       j->path);
    va_start(ap, fmt);
    vsnprintf(msg, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = event_write(j, update_id, worker_id, kind, msg);
    free(msg);
    return rc;
}

/* ---- interrupted updates ------------------------------------------------ */

typedef struct dead_update {
    int64_t id, pid;
    char worker[256], host[JOURNAL_HOST_MAX], state[16];
} dead_update;

/* Updates left loading/finalizing by writers that no longer run. *out is
 * malloc'ed (the caller frees); a stale update is rare, so no cap. */
static int find_dead(journal *j, dead_update **out, size_t *n_out)
{
    sqlite3_stmt *s = NULL;
    dead_update *v = NULL;
    size_t n = 0, cap = 0;
    int rc = sqlite3_prepare_v2(j->db, "SELECT id, worker, pid, pid_start,"
        " host, state FROM updates WHERE state IN ('loading', 'finalizing')",
        -1, &s, NULL);
    while (rc == SQLITE_OK && (rc = jr_step(j, s)) == SQLITE_ROW) {
        const char *host = (const char *)sqlite3_column_text(s, 4);
        rc = SQLITE_OK;
        if (jr_update_live(j, sqlite3_column_int64(s, 0), host,
                           sqlite3_column_int64(s, 2),
                           sqlite3_column_int64(s, 3)))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 4;
            dead_update *nv = realloc(v, nc * sizeof *nv);
            if (!nv) {
                rc = SQLITE_NOMEM;
                break;
            }
            v = nv;
            cap = nc;
        }
        dead_update *d = &v[n++];
        d->id = sqlite3_column_int64(s, 0);
        d->pid = sqlite3_column_int64(s, 2);
        snprintf(d->worker, sizeof d->worker, "%s",
                 (const char *)sqlite3_column_text(s, 1));
        snprintf(d->host, sizeof d->host, "%s", host ? host : "");
        snprintf(d->state, sizeof d->state, "%s",
                 (const char *)sqlite3_column_text(s, 5));
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) {
        free(v);
        return rc == SQLITE_NOMEM ? REFIT_ENOMEM
                                  : jr_fail_sqlite(j, "finding open updates");
    }
    *out = v;
    *n_out = n;
    return REFIT_OK;
}

/* Within a transaction. Health goes to unknown only while the worker row
 * still belongs to the dead writer (a restarted worker owns it again). */
static int worker_unknown(journal *j, const dead_update *d, const char *msg)
{
    sqlite3_stmt *s = NULL;
    char from[32] = "";
    int rc = sqlite3_prepare_v2(j->db, "SELECT health FROM workers WHERE"
        " id = ?1 AND pid = ?2 AND host = ?3", -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(s, 1, d->worker, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 2, d->pid);
        sqlite3_bind_text(s, 3, d->host, -1, SQLITE_STATIC);
        rc = jr_step(j, s);
        if (rc == SQLITE_ROW)
            snprintf(from, sizeof from, "%s",
                     (const char *)sqlite3_column_text(s, 0));
    }
    sqlite3_finalize(s);
    /* a live process holds the worker id now: the row is its, whatever
     * the pids say (another PID namespace may reuse the dead one's) */
    if (rc == SQLITE_DONE || (rc == SQLITE_ROW && !strcmp(from, "unknown")) ||
        (rc == SQLITE_ROW && jr_worker_live(j, d->worker, NULL, 0, 0)))
        return SQLITE_DONE;
    if (rc != SQLITE_ROW)
        return rc;
    return jr_health_rows(j, d->worker, from, "unknown", msg, NULL);
}

static int mark_one(journal *j, const dead_update *d)
{
    char now[32], msg[512];
    sqlite3_stmt *s = NULL;
    const char *what = "marking an update interrupted";
    int rc = jr_tx_begin(j, what);
    if (rc != REFIT_OK)
        return rc;
    jr_now(now, sizeof now);
    snprintf(msg, sizeof msg, "update %lld interrupted while %s: writer pid "
             "%lld on host %s no longer runs (it holds no lock on the journal)",
             (long long)d->id, d->state, (long long)d->pid, d->host);
    rc = sqlite3_prepare_v2(j->db, "UPDATE updates SET state = 'interrupted',"
        " ended_at = ?2, error = coalesce(error, ?3) WHERE id = ?1"
        " AND state IN ('loading', 'finalizing')", -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(s, 1, d->id);
        sqlite3_bind_text(s, 2, now, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, msg, -1, SQLITE_STATIC);
        rc = jr_step(j, s);
    }
    sqlite3_finalize(s);
    /* 0 rows: another process marked it between our read and our lock. */
    int changed = rc == SQLITE_DONE && sqlite3_changes(j->db) == 1;
    if (changed)
        rc = worker_unknown(j, d, msg);
    if (changed && rc == SQLITE_DONE)
        rc = jr_event_row(j, d->id, d->worker, "interrupted", msg);
    if (rc != SQLITE_DONE)
        return jr_fail_sqlite(j, what);
    rc = jr_tx_commit(j, what);
    if (rc == REFIT_OK && changed)
        j->interrupted++;
    return rc;
}

int jr_mark_interrupted(journal *j)
{
    dead_update *v = NULL;
    size_t n = 0;
    int rc = find_dead(j, &v, &n);
    for (size_t i = 0; rc == REFIT_OK && i < n; i++)
        rc = mark_one(j, &v[i]);
    free(v);
    return rc;
}
