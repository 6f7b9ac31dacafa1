/* Journal trouble: read-only file and directory, locked database, corrupt
 * and foreign files, newer schema, best-effort gaps. Each must give a clear
 * error naming the path, never a crash. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "jtest.h"

static journal *open_err(const char *path, const journal_opts *o, int want,
                         char *err, size_t len)
{
    journal *j = NULL;
    int rc = journal_open(&j, path, o, err, len);
    if (rc != want)
        fail_msg("journal_open %s: %d, wanted %d: %s", path, rc, want, err);
    return j;
}

static void make_journal(const char *path)
{
    jt_modules m;
    jt_modules_make(&m, 600);
    journal *j = jt_open(path);
    int64_t id = jt_begin(j, &m, "v1");
    assert_int_equal(journal_update_end(j, id, JOURNAL_UPDATE_ABORTED, 0, 0,
                     NULL, 0, NULL), 0);
    journal_close(j);
    jt_modules_free(&m);
}

/* ---- read-only ---------------------------------------------------------- */

/* In a child as nobody: 0 when open refuses with a message naming the path
 * and the reason, and a read-only open still reads. */
static int ro_file_child(void *arg)
{
    const char *path = arg;
    journal *j = NULL;
    char err[512];
    journal_opts ro = JOURNAL_OPTS_INIT;
    if (journal_open(&j, path, NULL, err, sizeof err) != REFIT_EJOURNAL)
        return 1;
    if (!jt_has(err, path) || !jt_has(err, "read-only"))
        return 2;
    ro.readonly = 1;
    if (journal_open(&j, path, &ro, err, sizeof err) != REFIT_OK)
        return 3;
    int rc = journal_update_get(j, 1, NULL, NULL);
    journal_close(j);
    return rc == REFIT_ENOTFOUND || rc == REFIT_OK ? 0 : 4;
}

static void test_readonly_file(void **state)
{
    jt_fixture *f = *state;
    make_journal(f->path);
    assert_int_equal(chmod(f->dir, 0777), 0);
    assert_int_equal(chmod(f->path, 0444), 0);
    assert_int_equal(jt_as_nobody(ro_file_child, f->path), 0);
}

static int ro_dir_child(void *arg)
{
    const char *path = arg;
    journal *j = NULL;
    char err[512];
    if (journal_open(&j, path, NULL, err, sizeof err) != REFIT_EJOURNAL)
        return 1;
    /* the directory, and why: SQLite alone said "No such file or directory" */
    return jt_has(err, path) && jt_has(err, "cannot open") &&
           jt_has(err, "is not writable (EACCES)") ? 0 : 2;
}

static void test_readonly_dir(void **state)
{
    jt_fixture *f = *state;
    assert_int_equal(chmod(f->dir, 0555), 0);
    assert_int_equal(jt_as_nobody(ro_dir_child, f->path), 0);
}

/* A reader that cannot write the directory: with no writer (no -wal file)
 * and with a writer holding the journal open. */
static int ro_reader_child(void *arg)
{
    journal *j = NULL;
    char err[512];
    journal_opts ro = JOURNAL_OPTS_INIT;
    ro.readonly = 1;
    if (journal_open(&j, arg, &ro, err, sizeof err) != REFIT_OK) {
        printf("# child: %s\n", err);
        return 1;
    }
    int rc = journal_update_get(j, 1, NULL, NULL);
    journal_close(j);
    return rc == REFIT_OK ? 0 : 2;
}

static void test_reader_readonly_dir(void **state)
{
    jt_fixture *f = *state;
    make_journal(f->path);
    assert_int_equal(chmod(f->dir, 0755), 0);
    assert_int_equal(chmod(f->path, 0644), 0);
    assert_int_equal(jt_as_nobody(ro_reader_child, f->path), 0);
    journal *j = jt_open(f->path); /* a live writer: -wal and -shm exist */
    assert_int_equal(journal_event(j, 0, NULL, "k", "m"), 0);
    assert_int_equal(jt_as_nobody(ro_reader_child, f->path), 0);
    journal_close(j);
}

/* ---- locked ------------------------------------------------------------- */

static sqlite3 *hold_lock(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    char *e = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    if (sqlite3_exec(db, sql, NULL, NULL, &e) != SQLITE_OK)
        fail_msg("%s: %s", sql, e);
    return db;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Another connection in an EXCLUSIVE transaction: writes wait the busy
 * timeout, then fail clearly; once it is gone, writes work again. */
static void test_locked_transaction(void **state)
{
    jt_fixture *f = *state;
    journal_opts o = JOURNAL_OPTS_INIT;
    char err[512];
    make_journal(f->path);
    o.busy_timeout_ms = 200;
    sqlite3 *db = hold_lock(f->path, "BEGIN EXCLUSIVE; INSERT INTO events("
                            "at, kind, message) VALUES ('t', 'k', 'm')");
    journal *j = open_err(f->path, &o, REFIT_OK, err, sizeof err);
    double t0 = now_s();
    assert_int_equal(journal_event(j, 0, NULL, "test", "blocked"),
                     REFIT_EJOURNAL);
    double waited = now_s() - t0;
    assert_true(waited >= 0.15 && waited < 1.5);
    assert_true(jt_has(journal_errmsg(j), f->path));
    assert_true(jt_has(journal_errmsg(j), "database is locked"));
    assert_true(jt_has(journal_errmsg(j), "busy timeout"));
    /* Readers are not blocked by the writer (WAL). */
    journal_opts ro = JOURNAL_OPTS_INIT;
    ro.readonly = 1;
    journal *r = open_err(f->path, &ro, REFIT_OK, err, sizeof err);
    jt_update u;
    jt_update_get(r, 1, &u);
    assert_string_equal(u.state, "aborted");
    journal_close(r);
    sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    sqlite3_close(db);
    assert_int_equal(journal_event(j, 0, NULL, "test", "free"), REFIT_OK);
    journal_close(j);
}

/* locking_mode=EXCLUSIVE keeps even readers out: open itself fails. */
static void test_locked_exclusive_mode(void **state)
{
    jt_fixture *f = *state;
    journal_opts o = JOURNAL_OPTS_INIT;
    char err[512];
    make_journal(f->path);
    o.busy_timeout_ms = 100;
    sqlite3 *db = hold_lock(f->path, "PRAGMA locking_mode = EXCLUSIVE; "
                            "BEGIN EXCLUSIVE; DELETE FROM events; COMMIT");
    open_err(f->path, &o, REFIT_EJOURNAL, err, sizeof err);
    assert_true(jt_has(err, f->path));
    assert_true(jt_has(err, "locked"));
    sqlite3_close(db);
    journal_close(open_err(f->path, &o, REFIT_OK, err, sizeof err));
}

/* Best effort: a failed write is counted, and recorded by the next write
 * that gets through. */
static void test_best_effort_gap(void **state)
{
    jt_fixture *f = *state;
    journal_opts o = JOURNAL_OPTS_INIT;
    char err[512];
    make_journal(f->path);
    o.mode = JOURNAL_BEST_EFFORT;
    o.busy_timeout_ms = 50;
    journal *j = open_err(f->path, &o, REFIT_OK, err, sizeof err);
    sqlite3 *db = hold_lock(f->path, "BEGIN IMMEDIATE");
    assert_int_equal(journal_health(j, "w0", "ready", "updating", "begin",
                     NULL), REFIT_EJOURNAL);
    /* The caller notes what it went on without; the journal does not. */
    assert_int_equal(journal_pending_gaps(j), 0);
    assert_int_equal(journal_opened_mode(j), JOURNAL_BEST_EFFORT);
    journal_note_gap(j, "health transition");
    assert_int_equal(journal_event(j, 0, NULL, "x", "y"), REFIT_EJOURNAL);
    assert_int_equal(journal_pending_gaps(j), 1);
    journal_note_gap(j, "update begin (by the core)");
    assert_int_equal(journal_pending_gaps(j), 2);
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(db);
    assert_int_equal(journal_heartbeat(j, "w0"), REFIT_OK);
    assert_int_equal(journal_pending_gaps(j), 0);
    char *msg = jt_sql_text(f->path, "SELECT message FROM events WHERE "
                            "kind = 'gap'");
    assert_non_null(msg);
    assert_true(jt_has(msg, "2 journal writes could not be recorded"));
    assert_true(jt_has(msg, "health transition"));
    assert_true(jt_has(msg, "update begin (by the core)"));
    free(msg);
    journal_close(j);
}

/* ---- corrupt, foreign, newer -------------------------------------------- */

static void write_bytes(const char *path, off_t at, size_t n, int seed)
{
    unsigned char buf[4096];
    int fd = open(path, O_WRONLY | O_CREAT, 0644);
    assert_true(fd >= 0);
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i * 131u + (unsigned)seed * 7u + 3u);
    for (size_t done = 0; done < n; done += sizeof buf)
        assert_true(pwrite(fd, buf, sizeof buf, at + (off_t)done) > 0);
    close(fd);
}

static void test_garbage_file(void **state)
{
    jt_fixture *f = *state;
    journal_opts ro = JOURNAL_OPTS_INIT;
    char err[512];
    write_bytes(f->path, 0, 8192, 1);
    open_err(f->path, NULL, REFIT_EJOURNAL, err, sizeof err);
    assert_true(jt_has(err, f->path));
    assert_true(jt_has(err, "not a database"));
    ro.readonly = 1;
    open_err(f->path, &ro, REFIT_EJOURNAL, err, sizeof err);
    assert_true(jt_has(err, "not a database"));
}

static int print_problem(void *user, const char *p)
{
    (*(size_t *)user)++;
    printf("# problem: %s\n", p);
    return 0;
}

/* Damaged pages behind a good header: open or verify says so. */
static void test_corrupt_pages(void **state)
{
    jt_fixture *f = *state;
    char err[512];
    size_t seen = 0, n = 0;
    make_journal(f->path);
    write_bytes(f->path, 4096, 3 * 4096, 2);
    journal *j = NULL;
    int rc = journal_open(&j, f->path, NULL, err, sizeof err);
    if (rc != REFIT_OK) {
        printf("# open: %s\n", err);
        assert_true(jt_has(err, f->path));
        assert_true(jt_has(err, "malformed") || jt_has(err, "corrupt") ||
                    jt_has(err, "damaged"));
        return;
    }
    assert_int_equal(journal_verify(j, print_problem, &seen, &n), REFIT_OK);
    assert_true(n > 0);
    assert_int_equal(seen, n);
    journal_close(j);
}

static void test_newer_schema(void **state)
{
    jt_fixture *f = *state;
    journal_opts ro = JOURNAL_OPTS_INIT;
    char err[512];
    make_journal(f->path);
    jt_sql_exec(f->path, "PRAGMA user_version = 99");
    open_err(f->path, NULL, REFIT_EJOURNAL, err, sizeof err);
    assert_true(jt_has(err, f->path));
    assert_true(jt_has(err, "schema version 99 is newer"));
    ro.readonly = 1;
    open_err(f->path, &ro, REFIT_EJOURNAL, err, sizeof err);
    assert_true(jt_has(err, "newer"));
}

static void test_foreign(void **state)
{
    jt_fixture *f = *state;
    char err[512], other[320];
    jt_sql_exec(f->path, "CREATE TABLE accounts(id INTEGER, owner TEXT)");
    open_err(f->path, NULL, REFIT_EJOURNAL, err, sizeof err);
    assert_true(jt_has(err, f->path));
    assert_true(jt_has(err, "not a refit journal"));
    /* Refused before any change: still not WAL, no table of ours. */
    char *mode = jt_sql_text(f->path, "PRAGMA journal_mode");
    assert_string_equal(mode, "delete");
    free(mode);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM sqlite_schema"),
                     1);
    /* Another application's id on an otherwise empty file. */
    jt_join(other, sizeof other, f->dir, "other.db");
    jt_sql_exec(other, "PRAGMA application_id = 1234");
    open_err(other, NULL, REFIT_EJOURNAL, err, sizeof err);
    assert_true(jt_has(err, "application_id 0x000004d2"));
}

static void test_missing_and_empty(void **state)
{
    jt_fixture *f = *state;
    journal_opts ro = JOURNAL_OPTS_INIT;
    char err[512];
    ro.readonly = 1;
    open_err(f->path, &ro, REFIT_EJOURNAL, err, sizeof err);
    assert_true(jt_has(err, "No such file"));
    open_err(f->dir, &ro, REFIT_EJOURNAL, err, sizeof err);
    assert_true(jt_has(err, "is a directory"));
    /* A zero-byte file is not made into a journal: it is someone's file. */
    int fd = open(f->path, O_WRONLY | O_CREAT, 0644);
    assert_true(fd >= 0);
    close(fd);
    open_err(f->path, NULL, REFIT_EJOURNAL, err, sizeof err);
    assert_true(jt_has(err, "an empty file that is not a refit journal"));
    struct stat st;
    assert_int_equal(stat(f->path, &st), 0);
    assert_int_equal(st.st_size, 0); /* untouched */
    /* where no file is, refit creates the journal */
    assert_int_equal(unlink(f->path), 0);
    journal_close(open_err(f->path, NULL, REFIT_OK, err, sizeof err));
    journal_close(open_err(f->path, NULL, REFIT_OK, err, sizeof err)); /* and reopens it */
    journal_close(open_err(f->path, &ro, REFIT_OK, err, sizeof err));
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, jt_setup, jt_teardown)
    const struct CMUnitTest tests[] = {
        T(test_readonly_file),     T(test_readonly_dir),
        T(test_reader_readonly_dir),
        T(test_locked_transaction), T(test_locked_exclusive_mode),
        T(test_best_effort_gap),   T(test_garbage_file),
        T(test_corrupt_pages),     T(test_newer_schema),
        T(test_foreign),           T(test_missing_and_empty),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
