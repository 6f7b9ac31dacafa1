/* journal_open / journal_close; the order of the steps is explained at the
 * top of journal.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "journal/journal_int.h"

static journal *handle_new(const char *path, const journal_opts *o)
{
    journal *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->path = strdup(path);
    if (!j->path) {
        free(j);
        return NULL;
    }
    j->mode = o->mode;
    j->readonly = o->readonly;
    j->lock_fd = -1;
    j->pid = (int64_t)getpid();
    j->pid_start = jr_proc_start(j->pid);
    if (gethostname(j->host, sizeof j->host - 1) != 0)
        snprintf(j->host, sizeof j->host, "unknown");
    return j;
}

void journal_close(journal *j)
{
    if (!j)
        return;
    for (int i = 0; i < JS_COUNT; i++)
        sqlite3_finalize(j->stmt[i]);
    /* close_v2: a statement a caller leaked cannot keep the file open. */
    sqlite3_close_v2(j->db);
    jr_lock_close(j);
    jr_update_free(&j->cur);
    jr_held_free(&j->held);
    free(j->path);
    free(j);
}

/* A read-only open of a missing file would otherwise say "unable to open
 * database file"; a missing file is the common operator mistake. */
static int check_exists(journal *j)
{
    struct stat st;
    if (stat(j->path, &st) != 0)
        return jr_fail(j, REFIT_EJOURNAL, "journal %s: cannot open: %s",
                       j->path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return jr_fail(j, REFIT_EJOURNAL, "journal %s: is a directory",
                       j->path);
    return REFIT_OK;
}

/* "file:PATH?immutable=1" with the characters URIs reserve escaped. */
static char *immutable_uri(const char *path)
{
    size_t n = strlen(path);
    char *u = malloc(3 * n + 32), *p = u;
    if (!u)
        return NULL;
    p += sprintf(p, "file:");
    for (const char *c = path; *c; c++)
        p += strchr("?#%", *c) ? sprintf(p, "%%%02X", (unsigned char)*c)
                               : sprintf(p, "%c", *c);
    sprintf(p, "?immutable=1");
    return u;
}

/* SQLite takes a zero-byte file for an empty database and would make a
 * journal of whatever file the path names (a typo, a log truncated by
 * accident). refit creates a journal itself, where no file is: an existing
 * empty file is refused, unless its write-ahead log holds the first
 * transaction of a journal being created. */
static int refuse_empty_file(journal *j)
{
    struct stat st, wal;
    if (stat(j->path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > 0)
        return REFIT_OK;
    size_t n = strlen(j->path) + 5;
    char *w = malloc(n);
    if (!w)
        return jr_fail(j, REFIT_ENOMEM, "journal %s: out of memory", j->path);
    snprintf(w, n, "%s-wal", j->path);
    int has_wal = stat(w, &wal) == 0 && wal.st_size > 0;
    free(w);
    if (has_wal)
        return REFIT_OK;
    return jr_fail(j, REFIT_EJOURNAL, "journal %s: an empty file that is not a refit journal; "
                   "refusing to make it one (remove it, and refit creates the journal)",
                   j->path);
}

/* Why a writer cannot create or write the file, from the kernel: SQLite
 * retries a failed read-write open read-only and reports that attempt's
 * errno (ENOENT for a file that was never there) or opens the file
 * read-only without a word. */
static const char *write_denied(const char *path, char *buf, size_t len)
{
    struct stat st;
    snprintf(buf, len, "%s", path);
    if (stat(path, &st) != 0) { /* to be created: the directory must take it */
        char *slash = strrchr(buf, '/');
        if (!slash)
            snprintf(buf, len, ".");
        else
            slash[slash == buf] = '\0';
    }
    if (access(buf, W_OK) == 0)
        return NULL;
    return errno == EROFS ? "is on a read-only file system (EROFS)"
           : errno == EACCES ? "is not writable (EACCES)"
           : NULL; /* SQLite's own words then (a missing directory ...) */
}

static int open_db(journal *j, int busy_ms, int immutable)
{
    int flags = j->readonly ? SQLITE_OPEN_READONLY
                            : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    char *uri = immutable ? immutable_uri(j->path) : NULL;
    if (immutable && !uri)
        return jr_fail(j, REFIT_ENOMEM, "journal %s: out of memory",
                       j->path);
    if ((j->readonly && check_exists(j) != REFIT_OK) ||
        (!j->readonly && refuse_empty_file(j) != REFIT_OK)) {
        free(uri);
        return REFIT_EJOURNAL;
    }
    /* NOMUTEX: a handle is used by one thread at a time (journal.h). */
    flags |= SQLITE_OPEN_NOMUTEX | (uri ? SQLITE_OPEN_URI : 0);
    int rc = sqlite3_open_v2(uri ? uri : j->path, &j->db, flags, NULL);
    free(uri);
    char where[4096];
    const char *denied = j->readonly ? NULL : write_denied(j->path, where, sizeof where);
    if (rc != SQLITE_OK && denied)
        return jr_fail(j, REFIT_EJOURNAL, "journal %s: cannot open: %s%s %s", j->path,
                       strcmp(where, j->path) ? "cannot create the file: its directory "
                                              : "the file ",
                       strcmp(where, j->path) ? where : "", denied);
    if (rc != SQLITE_OK)
        return jr_fail_sqlite(j, "cannot open");
    sqlite3_extended_result_codes(j->db, 1);
    sqlite3_busy_timeout(j->db, busy_ms);
    /* SQLite opens a file it may not write read-only without saying so;
     * the writer would only learn at its first update. */
    if (!j->readonly && sqlite3_db_readonly(j->db, "main") == 1)
        return jr_fail(j, REFIT_EJOURNAL, "journal %s: cannot open for "
                       "writing: the file or its directory is read-only%s%s%s%s%s",
                       j->path, denied ? " (" : "", denied ? where : "",
                       denied ? " " : "", denied ? denied : "", denied ? ")" : "");
    return REFIT_OK;
}

static int exec(journal *j, const char *sql, const char *what)
{
    if (sqlite3_exec(j->db, sql, NULL, NULL, NULL) != SQLITE_OK)
        return jr_fail_sqlite(j, what);
    return REFIT_OK;
}

/* WAL so readers never block the writer; NORMAL: a commit is durable once
 * the WAL is checkpointed, and a power loss can lose the last commits but
 * never corrupts the file; the journal is not worth an fsync per update. */
static int configure_writer(journal *j)
{
    sqlite3_stmt *s = NULL;
    int wal = 0;
    if (sqlite3_prepare_v2(j->db, "PRAGMA journal_mode = WAL", -1, &s,
                           NULL) == SQLITE_OK &&
        jr_step(j, s) == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(s, 0);
        wal = m && !strcmp(m, "wal");
    }
    sqlite3_finalize(s);
    if (!wal)
        return jr_fail_sqlite(j, "switching to WAL mode");
    return exec(j, "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON",
                "setting pragmas");
}

/* A reader that may not create the -shm file (a directory it cannot
 * write) cannot open a WAL database, unless the -wal file is absent: then
 * no writer is connected, the main file holds every commit, and it can be
 * read as immutable. A writer that starts during such a read can only make
 * the read fail, never the file: immutable never writes. */
static int reader_retry_immutable(journal *j)
{
    char wal[4096];
    int code = j->db ? sqlite3_extended_errcode(j->db) & 0xff : 0;
    if (!j->readonly || (code != SQLITE_READONLY && code != SQLITE_CANTOPEN))
        return 0;
    snprintf(wal, sizeof wal, "%s-wal", j->path);
    return access(wal, F_OK) != 0 && errno == ENOENT;
}

static int open_and_check(journal *j, int busy_ms, int *need_migrate)
{
    int rc = open_db(j, busy_ms, 0);
    if (rc == REFIT_OK)
        rc = jr_schema_check(j, need_migrate);
    if (rc != REFIT_OK && reader_retry_immutable(j)) {
        sqlite3_close_v2(j->db);
        j->db = NULL;
        rc = open_db(j, busy_ms, 1);
        if (rc == REFIT_OK)
            rc = jr_schema_check(j, need_migrate);
    }
    return rc;
}

static int open_steps(journal *j, int busy_ms)
{
    int need_migrate = 0, rc = open_and_check(j, busy_ms, &need_migrate);
    if (rc != REFIT_OK)
        return rc;
    if (j->readonly) {
        if (need_migrate)
            return jr_fail(j, REFIT_EJOURNAL, "journal %s: schema is older "
                           "than version %d (or empty); open it once for "
                           "writing to migrate it", j->path,
                           JOURNAL_SCHEMA_VERSION);
        jr_lock_open(j); /* without it, liveness is the pid test */
        return exec(j, "PRAGMA query_only = ON", "setting pragmas");
    }
    rc = configure_writer(j);
    if (rc == REFIT_OK && need_migrate)
        rc = jr_schema_migrate(j);
    if (rc == REFIT_OK)
        rc = jr_lock_open(j);
    if (rc == REFIT_OK)
        rc = jr_mark_interrupted(j);
    /* Compile the write statements now, at open, not inside the first
     * update (about 0.7 ms on the development VM). */
    for (int i = 0; rc == REFIT_OK && i < JS_COUNT; i++)
        if (!jr_stmt(j, (enum journal_stmt_id)i))
            rc = jr_fail_sqlite(j, "preparing the write statements");
    return rc;
}

int journal_open(journal **out, const char *path, const journal_opts *opts,
                 char *err, size_t errlen)
{
    const journal_opts defaults = JOURNAL_OPTS_INIT;
    const journal_opts *o = opts ? opts : &defaults;
    if (out)
        *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (!out || !path || !*path) {
        if (err && errlen)
            snprintf(err, errlen, "journal: no path given");
        return REFIT_EINVAL;
    }
    journal *j = handle_new(path, o);
    if (!j) {
        if (err && errlen)
            snprintf(err, errlen, "journal %s: out of memory", path);
        return REFIT_ENOMEM;
    }
    int rc = open_steps(j, o->busy_timeout_ms > 0 ? o->busy_timeout_ms
                                                  : JOURNAL_BUSY_TIMEOUT_MS);
    if (rc != REFIT_OK) {
        if (err && errlen)
            snprintf(err, errlen, "%s", j->err);
        journal_close(j);
        return rc;
    }
    struct stat st;
    if (stat(j->path, &st) == 0) {
        j->dev = (uint64_t)st.st_dev;
        j->ino = (uint64_t)st.st_ino;
    }
    *out = j;
    return REFIT_OK;
}

int journal_same_file(const journal *j)
{
    struct stat st;
    return stat(j->path, &st) == 0 && (uint64_t)st.st_dev == j->dev &&
           (uint64_t)st.st_ino == j->ino;
}
