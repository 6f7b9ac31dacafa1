/*
 * Write transactions. BEGIN IMMEDIATE takes the write lock up front, so a
 * busy writer is waited for (busy_timeout) instead of failing a
 * read-to-write upgrade. Begin writes first an update's end an earlier
 * write could not record (journal_held.c); commit records the pending
 * best-effort gaps and tells the held end it is in the file; rollback tells
 * it to be written again; a SQLite failure (jr_fail_sqlite) rolls the open
 * transaction back. Every public write of the journal is one of these;
 * this file calls down only (held, the handle).
 */
#include <stdio.h>
#include <string.h>

#include "journal/journal_int.h"

int jr_fail_sqlite(journal *j, const char *what)
{
    int code = j->db ? sqlite3_extended_errcode(j->db) : SQLITE_ERROR;
    int sys = j->db ? sqlite3_system_errno(j->db) : 0;
    const char *text = j->db ? sqlite3_errmsg(j->db) : "no database";
    /* The code a step returned wins over the handle's, which a later call
     * (a reset, another statement) may have replaced. */
    if (j->last_rc && (code & 0xff) != (j->last_rc & 0xff)) {
        code = j->last_rc;
        text = sqlite3_errstr(code);
        sys = 0;
    }
    j->last_rc = 0;
    char oserr[96] = "";
    if (sys)
        snprintf(oserr, sizeof oserr, ", os: %s", strerror(sys));
    const char *hint = "";
    if ((code & 0xff) == SQLITE_BUSY)
        hint = "; another connection holds the write lock beyond the busy "
               "timeout";
    else if ((code & 0xff) == SQLITE_NOTADB)
        hint = "; the file is not a SQLite database";
    else if ((code & 0xff) == SQLITE_CORRUPT)
        hint = "; the file is damaged (refitctl journal verify)";
    snprintf(j->err, sizeof j->err, "journal %s: %s: %s (sqlite %d%s)%s",
             j->path, what, text, code, oserr, hint);
    if (j->in_tx)
        jr_tx_rollback(j);
    return REFIT_EJOURNAL;
}

int jr_tx_begin(journal *j, const char *what)
{
    sqlite3_stmt *s = jr_stmt(j, JS_BEGIN);
    if (!s)
        return jr_fail_sqlite(j, what);
    if (jr_step_done(j, s) != SQLITE_DONE)
        return jr_fail_sqlite(j, what);
    j->in_tx = 1;
    /* An update's end that an earlier write could not record goes first:
     * the journal reads right from the first transaction that gets in. */
    if (j->held.id && !j->held.in_tx && jr_held_write(j) != SQLITE_DONE) {
        char first[256];
        snprintf(first, sizeof first, "%s (writing first the held end of "
                 "update %lld)", what, (long long)j->held.id);
        return jr_fail_sqlite(j, first);
    }
    return REFIT_OK;
}

void jr_tx_rollback(journal *j)
{
    j->in_tx = 0;
    jr_held_rolled_back(j);
    /* SQLite may already have rolled back (SQLITE_FULL, IOERR). */
    if (!sqlite3_get_autocommit(j->db))
        sqlite3_exec(j->db, "ROLLBACK", NULL, NULL, NULL);
}

/* The gaps ride in the transaction that proves the journal works again. */
static int record_gaps(journal *j)
{
    sqlite3_stmt *s = jr_stmt(j, JS_EVENT_INSERT);
    char at[32], msg[JOURNAL_GAP_TEXT_MAX + 96];
    if (!s)
        return SQLITE_ERROR;
    jr_now(at, sizeof at);
    snprintf(msg, sizeof msg, "%zu journal write%s could not be recorded "
             "(best effort): %s", j->gaps, j->gaps == 1 ? "" : "s",
             j->gap_text);
    sqlite3_bind_text(s, 1, at, -1, SQLITE_TRANSIENT);
    sqlite3_bind_null(s, 2);
    sqlite3_bind_null(s, 3);
    sqlite3_bind_text(s, 4, "gap", -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 5, msg, -1, SQLITE_TRANSIENT);
    return jr_step_done(j, s);
}

int jr_tx_commit(journal *j, const char *what)
{
    size_t gaps = j->gaps;
    if (gaps && record_gaps(j) != SQLITE_DONE)
        return jr_fail_sqlite(j, what);
    sqlite3_stmt *s = jr_stmt(j, JS_COMMIT);
    if (!s || jr_step_done(j, s) != SQLITE_DONE)
        return jr_fail_sqlite(j, what);
    j->in_tx = 0;
    jr_held_committed(j);
    if (gaps) {
        j->gaps = 0;
        j->gap_text[0] = '\0';
    }
    return REFIT_OK;
}

int journal_write_held(journal *j)
{
    const char *what = "writing the held end of an update";
    if (!j)
        return REFIT_EINVAL;
    if (!j->held.id)
        return REFIT_OK;
    int rc = jr_check_writable(j, what);
    if (rc == REFIT_OK && (rc = jr_tx_begin(j, what)) == REFIT_OK)
        rc = jr_tx_commit(j, what);
    return rc;
}
