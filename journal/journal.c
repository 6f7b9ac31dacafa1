/*
 * Journal handle: errors, the statement cache, names, the clock. It calls
 * no other journal file (the transactions are journal_tx.c's).
 *
 * Opening a read-write journal, in order:
 *   1. sqlite3_open_v2 (READWRITE|CREATE); a file we may only read is
 *      refused here, not at the first write.
 *   2. busy_timeout, then the first read of the file: a non-SQLite file,
 *      a foreign SQLite file or a newer schema is refused BEFORE any pragma
 *      that would change it (journal_mode=WAL rewrites the header).
 *   3. journal_mode=WAL (persistent), synchronous=NORMAL, foreign_keys=ON.
 *   4. create or migrate (journal_schema.c), one transaction.
 *   5. mark updates of dead writers interrupted (journal_write.c).
 * A read-only open does 1 and 2 with SQLITE_OPEN_READONLY and refuses a
 * file that would need migrating.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "journal/journal_int.h"

static const char *const update_state_names[] = {
    "loading", "finalizing", "committed", "aborted", "rolled_back", "failed",
    "interrupted"};
static const char *const module_state_names[] = {
    "pending", "partial", "complete", "committed", "rolled_back", "poisoned"};
_Static_assert(sizeof update_state_names / sizeof *update_state_names ==
               JOURNAL_UPDATE_STATE_COUNT, "one name per update state");
_Static_assert(sizeof module_state_names / sizeof *module_state_names ==
               JOURNAL_MODULE_STATE_COUNT, "one name per module state");

static const char *const stmt_sql[] = {
#define JOURNAL_X_(name, sql) sql,
    JOURNAL_STMT_TABLE(JOURNAL_X_)
#undef JOURNAL_X_
};

const char *journal_update_state_name(journal_update_state s)
{
    return (unsigned)s < JOURNAL_UPDATE_STATE_COUNT ? update_state_names[s]
                                                    : NULL;
}

const char *journal_module_state_name(journal_module_state s)
{
    return (unsigned)s < JOURNAL_MODULE_STATE_COUNT ? module_state_names[s]
                                                    : NULL;
}

const char *journal_errmsg(const journal *j) { return j ? j->err : ""; }
const char *journal_path(const journal *j) { return j ? j->path : ""; }
journal_mode journal_opened_mode(const journal *j)
{
    return j ? j->mode : JOURNAL_REQUIRED;
}

size_t journal_interrupted_on_open(const journal *j)
{
    return j ? j->interrupted : 0;
}

int jr_fail(journal *j, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->err, sizeof j->err, fmt, ap);
    va_end(ap);
    return status;
}

sqlite3_stmt *jr_stmt(journal *j, enum journal_stmt_id id)
{
    if (!j->stmt[id] &&
        sqlite3_prepare_v3(j->db, stmt_sql[id], -1, SQLITE_PREPARE_PERSISTENT,
                           &j->stmt[id], NULL) != SQLITE_OK)
        return NULL; /* the caller reports: the handle holds the error */
    return j->stmt[id];
}

int jr_step(journal *j, sqlite3_stmt *s)
{
    int rc = sqlite3_step(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        j->last_rc = rc;
    return rc;
}

int jr_step_done(journal *j, sqlite3_stmt *s)
{
    int rc = jr_step(j, s);
    sqlite3_reset(s);
    return rc == SQLITE_ROW ? SQLITE_DONE : rc;
}

int jr_check_writable(journal *j, const char *what)
{
    if (j->readonly)
        return jr_fail(j, REFIT_EINVAL, "journal %s: %s: opened read-only",
                       j->path, what);
    return REFIT_OK;
}

void journal_note_gap(journal *j, const char *what)
{
    if (!j)
        return;
    size_t used = strlen(j->gap_text);
    j->gaps++;
    /* Keep the first descriptions; the count says how many followed. */
    if (used + 4 < sizeof j->gap_text)
        snprintf(j->gap_text + used, sizeof j->gap_text - used, "%s%s",
                 used ? "; " : "", what ? what : "?");
}

size_t journal_pending_gaps(const journal *j) { return j ? j->gaps : 0; }

void jr_now(char *buf, size_t len)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    if (n && n < len)
        snprintf(buf + n, len - n, ".%03uZ", (unsigned)(ts.tv_nsec / 1000000) % 1000u);
}
