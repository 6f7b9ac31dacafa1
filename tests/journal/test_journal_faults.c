/* Journal under injected SQLite failures, and the batching contract, both
 * through -Wl,--wrap=sqlite3_step: the wrapper counts every step the
 * journal makes and can fail chosen ones with SQLITE_FULL. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "jtest.h"

int __real_sqlite3_step(sqlite3_stmt *s);
int __wrap_sqlite3_step(sqlite3_stmt *s);

static struct {
    size_t steps, begins, commits;
    const char *fail_prefix; /* fail steps whose SQL starts with this */
    int fail_count;          /* ... this many times */
    int fail_rc;
    size_t fail_at;          /* or fail the step with this number (1-based) */
} w;

int __wrap_sqlite3_step(sqlite3_stmt *s)
{
    const char *sql = sqlite3_sql(s);
    w.steps++;
    if (sql && !strncmp(sql, "BEGIN", 5))
        w.begins++;
    if (sql && !strncmp(sql, "COMMIT", 6))
        w.commits++;
    if (w.fail_at && w.steps == w.fail_at)
        return w.fail_rc;
    if (w.fail_count > 0 && sql && w.fail_prefix &&
        !strncmp(sql, w.fail_prefix, strlen(w.fail_prefix))) {
        w.fail_count--;
        return w.fail_rc;
    }
    return __real_sqlite3_step(s);
}

static void counters_reset(void)
{
    memset(&w, 0, sizeof w);
}

static void fail_next(const char *prefix, int count, int rc)
{
    w.fail_prefix = prefix;
    w.fail_count = count;
    w.fail_rc = rc;
}

static journal_module_progress *all_progress(size_t n,
                                             journal_module_state s)
{
    journal_module_progress *p = calloc(n, sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (journal_module_progress){.index = (uint32_t)i, .state = s,
            .received_tensors = 2, .received_bytes = 8192,
            .has_fingerprint = s == JOURNAL_MODULE_COMMITTED,
            .fingerprint = i * 0x9e3779b97f4a7c15ull};
    return p;
}

/* 10,000 modules: progress and end are one transaction each, and their
 * SQLite steps are bounded by the 256-module chunks, not the modules. */
static void test_batching(void **state)
{
    jt_fixture *f = *state;
    const size_t n = 10000, chunks = (n + 255) / 256;
    jt_modules m;
    jt_modules_make(&m, n);
    journal *j = jt_open(f->path);
    assert_int_equal(journal_plan_prepare(j, m.n, m.info, NULL), 0);

    counters_reset();
    int64_t id = jt_begin(j, &m, "v");
    printf("# begin: %zu steps, %zu transactions\n", w.steps, w.commits);
    assert_int_equal(w.commits, 1);
    assert_true(w.steps <= chunks + 5);

    journal_module_progress *p = all_progress(n, JOURNAL_MODULE_COMPLETE);
    counters_reset();
    assert_int_equal(journal_modules_progress(j, id, n, p), 0);
    printf("# progress of %zu modules: %zu steps, %zu transactions\n", n,
           w.steps, w.commits);
    assert_int_equal(w.begins, 1);
    assert_int_equal(w.commits, 1);
    assert_true(w.steps <= chunks + 2);

    /* Batches of 1000: one transaction each. */
    counters_reset();
    for (size_t i = 0; i < n; i += 1000)
        assert_int_equal(journal_modules_progress(j, id, 1000, p + i), 0);
    assert_int_equal(w.commits, 10);
    assert_true(w.steps <= 10 * (2 + 1000 / 256 + 2));

    free(p);
    p = all_progress(n, JOURNAL_MODULE_COMMITTED);
    counters_reset();
    assert_int_equal(journal_update_end(j, id, JOURNAL_UPDATE_COMMITTED,
                     n * 8192, 2 * n, NULL, n, p), 0);
    printf("# end: %zu steps, %zu transactions\n", w.steps, w.commits);
    assert_int_equal(w.commits, 1);
    assert_true(w.steps <= chunks + 3);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM modules WHERE "
                     "update_id = 1 AND state = 'committed' AND fingerprint "
                     "IS NOT NULL"), (int64_t)n);
    free(p);
    journal_close(j);
    jt_modules_free(&m);
}

/* SQLITE_FULL inside begin: nothing of the update stays, the message says
 * what, and the handle works afterwards. */
static void test_full_in_begin(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    int64_t id = 7;
    jt_modules_make(&m, 300);
    journal *j = jt_open(f->path);
    journal_update_info info = {
        .worker_id = "w0", .version = "v", .rollback = 1};
    fail_next("INSERT INTO updates", 1, SQLITE_FULL);
    assert_int_equal(journal_update_begin(j, &id, &info, m.n, m.info),
                     REFIT_EJOURNAL);
    assert_int_equal(id, 0);
    printf("# %s\n", journal_errmsg(j));
    assert_true(jt_has(journal_errmsg(j), f->path));
    assert_true(jt_has(journal_errmsg(j), "beginning an update"));
    assert_true(jt_has(journal_errmsg(j), "database or disk is full"));
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM updates"), 0);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM plans"), 0);
    id = jt_begin(j, &m, "v");
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM modules WHERE "
                     "state = 'pending'"), 300);
    journal_close(j);
    jt_modules_free(&m);
}

/* A progress batch lost to SQLITE_FULL is written by the next one. */
static void test_full_in_progress(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    jt_modules_make(&m, 600);
    journal *j = jt_open(f->path);
    int64_t id = jt_begin(j, &m, "v");
    journal_module_progress *p = all_progress(m.n, JOURNAL_MODULE_COMPLETE);
    p[0].state = JOURNAL_MODULE_PARTIAL;
    p[0].received_tensors = 1;
    fail_next("INSERT INTO module_chunks", 1, SQLITE_FULL);
    assert_int_equal(journal_modules_progress(j, id, 300, p), REFIT_EJOURNAL);
    assert_true(jt_has(journal_errmsg(j), "recording module progress"));
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM modules WHERE "
                     "state != 'pending'"), 0);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM "
                     "module_received"), 0);
    /* The next batch carries the lost one. */
    assert_int_equal(journal_modules_progress(j, id, 300, p + 300), 0);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM modules WHERE "
                     "state = 'complete'"), 599);
    assert_int_equal(jt_sql_int(f->path, "SELECT received_tensors FROM "
                     "modules WHERE idx = 0"), 1);
    /* A failed COMMIT is the same. */
    fail_next("COMMIT", 1, SQLITE_FULL);
    p[0] = (journal_module_progress){0, JOURNAL_MODULE_COMPLETE, 2, 8192, 0, 0};
    assert_int_equal(journal_modules_progress(j, id, 1, p), REFIT_EJOURNAL);
    free(p);
    p = all_progress(m.n, JOURNAL_MODULE_COMMITTED);
    fail_next("UPDATE updates", 1, SQLITE_IOERR);
    assert_int_equal(journal_update_end(j, id, JOURNAL_UPDATE_COMMITTED, 1, 1,
                     NULL, m.n, p), REFIT_EJOURNAL);
    assert_true(jt_has(journal_errmsg(j), "ending an update"));
    assert_int_equal(journal_update_end(j, id, JOURNAL_UPDATE_COMMITTED, 1, 1,
                     NULL, 0, NULL), 0);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM modules WHERE "
                     "state = 'committed' AND fingerprint IS NOT NULL"),
                     (int64_t)m.n);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM "
                     "module_received"), 0);
    size_t problems = 1;
    assert_int_equal(journal_verify(j, NULL, NULL, &problems), REFIT_EINVAL);
    free(p);
    journal_close(j);
    jt_modules_free(&m);
}

/* Every single step of an update's life failing once, in turn: each call
 * fails cleanly or succeeds, and the file stays consistent. */
static int count_problem(void *user, const char *p)
{
    printf("# problem: %s\n", p);
    (*(size_t *)user)++;
    return 0;
}

static void one_life(journal *j, const jt_modules *m)
{
    journal_update_info info = {
        .worker_id = "w0", .version = "v", .rollback = 1};
    journal_module_progress p[2] = {
        {0, JOURNAL_MODULE_PARTIAL, 1, 1, 0, 0},
        {1, JOURNAL_MODULE_COMMITTED, 2, 8192, 1, 42}};
    int64_t id = 0;
    if (journal_update_begin(j, &id, &info, m->n, m->info) != REFIT_OK)
        return;
    journal_modules_progress(j, id, 1, p);
    journal_update_state_set(j, id, JOURNAL_UPDATE_FINALIZING);
    journal_event(j, id, "w0", "note", "n=%d", 1);
    if (journal_update_end(j, id, JOURNAL_UPDATE_FAILED, 1, 1, "x", 2, p))
        journal_update_end(j, id, JOURNAL_UPDATE_FAILED, 1, 1, "x", 0, NULL);
}

static void test_fail_each_step(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    size_t problems = 0, seen = 0;
    jt_modules_make(&m, 3);
    journal *j = jt_open(f->path);
    counters_reset();
    one_life(j, &m);
    size_t total = w.steps;
    assert_true(total > 10);
    for (size_t k = 1; k <= total; k++) {
        counters_reset();
        w.fail_at = k;
        w.fail_rc = k % 2 ? SQLITE_FULL : SQLITE_IOERR;
        one_life(j, &m);
    }
    counters_reset();
    assert_int_equal(journal_verify(j, count_problem, &seen, &problems), 0);
    assert_int_equal(problems, 0);
    /* Updates whose end was lost were closed by the next begin. */
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM updates WHERE "
                     "state IN ('loading', 'finalizing')"), 0);
    journal_close(j);
    jt_modules_free(&m);
}

/* The disk fills at the end write: the end is held on the handle (the
 * update reads unended), a begin that cannot write it fails whole and
 * keeps it, and the first transaction that gets in writes it first: the
 * update committed with every module row and fingerprint, a "late" event,
 * then the new update. */
static void test_full_at_end_held(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    jt_modules_make(&m, 600);
    journal *j = jt_open(f->path);
    assert_int_equal(journal_held_end(j), 0);
    assert_int_equal(journal_write_held(j), REFIT_OK); /* none held */
    int64_t id = jt_begin(j, &m, "v1");
    journal_module_progress *p = all_progress(m.n, JOURNAL_MODULE_COMPLETE);
    assert_int_equal(journal_modules_progress(j, id, 300, p), 0);
    free(p);
    p = all_progress(m.n, JOURNAL_MODULE_COMMITTED);
    fail_next("COMMIT", 1, SQLITE_FULL);
    assert_int_equal(journal_update_end(j, id, JOURNAL_UPDATE_COMMITTED, 7, 9,
                     NULL, m.n, p), REFIT_EJOURNAL);
    free(p);
    assert_true(jt_has(journal_errmsg(j), "is held"));
    assert_int_equal(journal_held_end(j), id);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM updates WHERE "
                     "state = 'loading' AND ended_at IS NULL"), 1);

    /* still full: the begin fails whole, the end stays held */
    int64_t id2 = 0;
    journal_update_info info = {.worker_id = "w0", .version = "v2"};
    fail_next("UPDATE updates SET state = ?2, bytes", 1, SQLITE_FULL);
    assert_int_equal(journal_update_begin(j, &id2, &info, m.n, m.info),
                     REFIT_EJOURNAL);
    assert_true(jt_has(journal_errmsg(j), "held end of update"));
    assert_int_equal(journal_held_end(j), id);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM updates"), 1);
    /* a failure later in the same transaction: the held rows roll back too */
    fail_next("INSERT INTO updates", 1, SQLITE_FULL);
    assert_int_equal(journal_update_begin(j, &id2, &info, m.n, m.info),
                     REFIT_EJOURNAL);
    assert_int_equal(journal_held_end(j), id);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM updates WHERE "
                     "state = 'committed'"), 0);

    /* room again */
    assert_int_equal(journal_update_begin(j, &id2, &info, m.n, m.info), 0);
    assert_int_equal(journal_held_end(j), 0);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM updates WHERE "
                     "state = 'committed' AND bytes = 7 AND tensors = 9 AND "
                     "ended_at IS NOT NULL"), 1);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM modules WHERE "
                     "update_id = 1 AND state = 'committed' AND fingerprint IS "
                     "NOT NULL"), (int64_t)m.n);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM events WHERE "
                     "kind = 'late' AND update_id = 1"), 1);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM updates WHERE "
                     "id = 2 AND state = 'loading'"), 1);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM updates WHERE "
                     "state = 'interrupted'"), 0);
    size_t seen = 0, problems = 1;
    assert_int_equal(journal_verify(j, count_problem, &seen, &problems), 0);
    assert_int_equal(problems, 0);
    assert_int_equal(seen, 0);
    journal_close(j);
    jt_modules_free(&m);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, jt_setup, jt_teardown)
    const struct CMUnitTest tests[] = {
        T(test_batching), T(test_full_in_begin), T(test_full_in_progress),
        T(test_fail_each_step), T(test_full_at_end_held),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
