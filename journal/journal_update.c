/*
 * Update rows: begin, progress batches, end. Each call is one SQLite
 * transaction through cached statements. Module states live in memory
 * (jr_update) and reach SQLite as module_chunks rows, 256 modules each, so
 * a batch costs one row per touched chunk, not one per module; see the
 * schema comment in journal_schema.c for the numbers behind this.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "journal/journal_int.h"


static void bind_opt_text(sqlite3_stmt *s, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, i);
}

/* Counts and byte totals of a model stay far below 2^63: the cast into
 * SQLite's signed integers keeps them exact. */
static void bind_u64(sqlite3_stmt *s, int i, uint64_t v)
{
    sqlite3_bind_int64(s, i, (sqlite3_int64)v);
}

static int update_alloc(jr_update *u, size_t n, const journal_module_info *m)
{
    size_t k = n ? n : 1;
    memset(u, 0, sizeof *u);
    u->n = n;
    u->n_chunks = (n + JOURNAL_CHUNK - 1) / JOURNAL_CHUNK;
    u->states = malloc(k);
    u->fps = calloc(k, JOURNAL_FP_BYTES);
    u->expected = calloc(k, 2 * sizeof *u->expected);
    u->received = calloc(k, 2 * sizeof *u->received);
    u->mod_flags = calloc(k, 1);
    u->chunk_flags = calloc(u->n_chunks ? u->n_chunks : 1, 1);
    if (!u->states || !u->fps || !u->expected || !u->received ||
        !u->mod_flags || !u->chunk_flags) {
        jr_update_free(u);
        return REFIT_ENOMEM;
    }
    memset(u->states, '.', k); /* pending, in the modules view's letters */
    for (size_t i = 0; i < n; i++) {
        u->expected[2 * i] = m[i].expected_tensors;
        u->expected[2 * i + 1] = m[i].expected_bytes;
    }
    return REFIT_OK;
}

/* ---- begin ------------------------------------------------------------- */

static int update_row(journal *j, const journal_update_info *info,
                      int64_t plan_id, size_t n_modules, int64_t *id)
{
    char now[32];
    sqlite3_stmt *s = jr_stmt(j, JS_UPDATE_INSERT);
    if (!s)
        return SQLITE_ERROR;
    jr_now(now, sizeof now);
    sqlite3_bind_text(s, 1, info->worker_id, -1, SQLITE_STATIC);
    bind_opt_text(s, 2, info->version);
    bind_opt_text(s, 3, info->source_uri);
    bind_opt_text(s, 4, info->source_digest);
    sqlite3_bind_text(s, 5, info->replay_of > 0 ? "replay" : "normal", -1,
                      SQLITE_STATIC);
    if (info->replay_of > 0)
        sqlite3_bind_int64(s, 6, info->replay_of);
    else
        sqlite3_bind_null(s, 6);
    sqlite3_bind_int(s, 7, info->rollback ? 1 : 0);
    sqlite3_bind_text(s, 8, now, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 9, plan_id);
    bind_u64(s, 10, n_modules);
    sqlite3_bind_int64(s, 11, j->pid);
    if (j->pid_start > 0)
        sqlite3_bind_int64(s, 12, j->pid_start);
    else
        sqlite3_bind_null(s, 12);
    sqlite3_bind_text(s, 13, j->host, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 14, info->partial ? 1 : 0);
    bind_opt_text(s, 15, info->base_version);
    int rc = jr_step_done(j, s);
    *id = sqlite3_last_insert_rowid(j->db);
    return rc;
}

/* The previous update of this handle never got its end recorded. */
static int abandon_open(journal *j)
{
    char now[32];
    sqlite3_stmt *s = jr_stmt(j, JS_UPDATE_ABANDON);
    if (!s)
        return SQLITE_ERROR;
    jr_now(now, sizeof now);
    sqlite3_bind_int64(s, 1, j->cur.id);
    sqlite3_bind_text(s, 2, now, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, "its end was never recorded (a journal write "
                      "failed); a later update began", -1, SQLITE_STATIC);
    return jr_step_done(j, s);
}

/* The plan named by the caller (no hashing), else found or written. */
static int begin_plan(journal *j, const journal_update_info *info, size_t n,
                      const journal_module_info *m, int64_t *plan)
{
    if (info->plan_id <= 0)
        return jr_plan_get(j, n, m, plan);
    *plan = info->plan_id;
    return jr_plan_check(j, info->plan_id, n);
}

/* A foreign-key failure here means the worker row is missing. */
static int begin_fail(journal *j, const journal_update_info *info, int rc)
{
    if (rc == SQLITE_MISMATCH) {
        jr_tx_rollback(j);
        return jr_fail(j, REFIT_EINVAL, "journal %s: beginning an update: "
                       "plan %lld is not in this journal with %s modules",
                       j->path, (long long)info->plan_id, "the update's");
    }
    if (sqlite3_extended_errcode(j->db) == SQLITE_CONSTRAINT_FOREIGNKEY) {
        jr_fail_sqlite(j, "beginning an update");
        return jr_fail(j, REFIT_EJOURNAL, "journal %s: beginning an update: "
                       "worker '%s' is not registered, or replay_of %lld "
                       "names no update", j->path, info->worker_id,
                       (long long)info->replay_of);
    }
    return jr_fail_sqlite(j, "beginning an update");
}

static int begin_args(journal *j, int64_t *update_id,
                      const journal_update_info *info, size_t n,
                      const journal_module_info *m)
{
    if (!j)
        return REFIT_EINVAL;
    if (!update_id || !info || !info->worker_id || (n && !m) ||
        n > UINT32_MAX)
        return jr_fail(j, REFIT_EINVAL, "journal: update_begin: bad "
                       "arguments");
    for (size_t i = 0; i < n; i++)
        if (!m[i].name)
            return jr_fail(j, REFIT_EINVAL, "journal: update_begin: module "
                           "%zu has no name", i);
    return jr_check_writable(j, "beginning an update");
}

int journal_update_begin(journal *j, int64_t *update_id,
                         const journal_update_info *info, size_t n_modules,
                         const journal_module_info *modules)
{
    const char *what = "beginning an update";
    jr_update u;
    int64_t id = 0, plan = 0;
    if (update_id)
        *update_id = 0;
    int rc = begin_args(j, update_id, info, n_modules, modules);
    if (rc != REFIT_OK)
        return rc;
    if (update_alloc(&u, n_modules, modules) != REFIT_OK)
        return jr_fail(j, REFIT_ENOMEM, "journal %s: %s: out of memory",
                       j->path, what);
    if ((rc = jr_tx_begin(j, what)) != REFIT_OK) {
        jr_update_free(&u);
        return rc;
    }
    int src = j->cur.id ? abandon_open(j) : SQLITE_DONE;
    if (src == SQLITE_DONE)
        src = begin_plan(j, info, n_modules, modules, &plan);
    if (src == SQLITE_DONE)
        src = update_row(j, info, plan, n_modules, &id);
    /* locked before anyone can read the row: held means its writer lives */
    if (src == SQLITE_DONE && (rc = jr_lock_update(j, id)) != REFIT_OK) {
        jr_tx_rollback(j);
        jr_update_free(&u);
        return rc;
    }
    if (src == SQLITE_DONE && info->health_from) {
        char fbuf[32];
        src = jr_health_rows(j, info->worker_id,
                             jr_health_lower(info->health_from, fbuf, sizeof fbuf),
                             "updating", info->health_reason, NULL);
    }
    if (src != SQLITE_DONE) {
        jr_update_free(&u);
        return begin_fail(j, info, src);
    }
    if ((rc = jr_tx_commit(j, what)) != REFIT_OK) {
        jr_unlock_update(j, id);
        jr_update_free(&u);
        return rc;
    }
    /* the earlier update is closed now (ended, or abandoned above) */
    if (j->locked_update != id)
        jr_unlock_update(j, j->locked_update);
    j->locked_update = id;
    jr_update_free(&j->cur);
    j->cur = u;
    j->cur.id = id;
    *update_id = id;
    return REFIT_OK;
}

int journal_update_state_set(journal *j, int64_t update_id,
                             journal_update_state state)
{
    const char *what = "changing an update's state";
    if (!j)
        return REFIT_EINVAL;
    if (state != JOURNAL_UPDATE_LOADING && state != JOURNAL_UPDATE_FINALIZING)
        return jr_fail(j, REFIT_EINVAL, "journal %s: %s: %d is not an open "
                       "state (use journal_update_end)", j->path, what,
                       (int)state);
    int rc = jr_check_writable(j, what);
    if (rc != REFIT_OK || (rc = jr_tx_begin(j, what)))
        return rc;
    sqlite3_stmt *s = jr_stmt(j, JS_UPDATE_STATE);
    if (!s)
        return jr_fail_sqlite(j, what);
    sqlite3_bind_int64(s, 1, update_id);
    sqlite3_bind_text(s, 2, journal_update_state_name(state), -1,
                      SQLITE_STATIC);
    if (jr_step_done(j, s) != SQLITE_DONE)
        return jr_fail_sqlite(j, what);
    if (sqlite3_changes(j->db) != 1) {
        jr_tx_rollback(j);
        return jr_fail(j, REFIT_ENOTFOUND, "journal %s: %s: no open update "
                       "%lld (none, ended, or marked interrupted by another "
                       "process)", j->path, what, (long long)update_id);
    }
    return jr_tx_commit(j, what);
}
