/* The disk fills at finalize's end write (SQLITE_FULL injected through
 * -Wl,--wrap=sqlite3_step): the update did commit, so its end record is
 * held and written first by the next journal write. The journal then shows
 * it committed (not interrupted), the next update recorded after it, and
 * refit_journal_behind says 1 only while the record waits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "testutil.h"

int __real_sqlite3_step(sqlite3_stmt *s);
int __wrap_sqlite3_step(sqlite3_stmt *s);

/* full: every write statement fails with SQLITE_FULL; end_once: the next
 * end-of-update statement does (the disk fills just then). */
static struct {
    int full;
    int end_once;
} disk;

static int is_write(const char *sql)
{
    static const char *const verbs[] = {"INSERT", "UPDATE", "DELETE", "COMMIT"};
    for (size_t i = 0; i < sizeof verbs / sizeof *verbs; i++)
        if (!strncmp(sql, verbs[i], strlen(verbs[i])))
            return 1;
    return 0;
}

int __wrap_sqlite3_step(sqlite3_stmt *s)
{
    const char *sql = sqlite3_sql(s);
    if (sql && disk.full && is_write(sql))
        return SQLITE_FULL;
    if (sql && disk.end_once && !strncmp(sql, "UPDATE updates SET state = ?2, bytes", 36)) {
        disk.end_once = 0;
        return SQLITE_FULL;
    }
    return __real_sqlite3_step(s);
}


/* An integer from the journal, read on a connection of its own. */
static int q(const char *path, const char *sql)
{
    sqlite3 *db;
    sqlite3_stmt *s;
    int n = -1;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK &&
        __real_sqlite3_step(s) == SQLITE_ROW)
        n = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return n;
}

typedef struct fx {
    char dir[32], path[64];
    tw w;
} fx;

static void fx_open(fx *f, int best_effort)
{
    memset(&disk, 0, sizeof disk);
    snprintf(f->dir, sizeof f->dir, "/tmp/refit-jfull-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof f->path, "%s/j.db", f->dir);
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = f->path;
    o.journal_best_effort = best_effort;
    assert_int_equal(tw_open(&f->w, &o), REFIT_OK);
    tw_one_module(&f->w);
    tw_update(&f->w, 1, "v1");
    /* update 2 commits; its end write meets a full disk */
    disk.end_once = 1;
    tw_update(&f->w, 2, "v2");
    assert_int_equal(disk.end_once, 0);
    assert_string_equal(refit_worker_version(f->w.ctx), "v2");
    assert_int_equal(refit_journal_behind(f->w.ctx), 1);
    /* until then the journal shows it unended */
    assert_int_equal(q(f->path, "SELECT count(*) FROM updates WHERE id = 2 AND "
                                "state IN ('loading', 'finalizing') AND ended_at IS NULL"), 1);
}

static void fx_rm(fx *f)
{
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    assert_int_equal(system(cmd), 0);
}

/* What the journal must say once it caught up: update 2 committed at the
 * time it ended (before update 3 began), its module committed, the worker's
 * transitions in order, a "late" event, nothing interrupted. */
static void assert_caught_up(const fx *f, int n_updates, const char *last)
{
    const char *p = f->path;
    assert_int_equal(q(p, "SELECT count(*) FROM updates WHERE state = 'committed'"), n_updates);
    assert_int_equal(q(p, "SELECT count(*) FROM updates WHERE state = 'interrupted'"), 0);
    assert_int_equal(q(p, "SELECT count(*) FROM modules WHERE update_id = 2 AND "
                          "state = 'committed'"), 1);
    assert_int_equal(q(p, "SELECT count(*) FROM events WHERE kind = 'late' AND update_id = 2 "
                          "AND message LIKE '%committed%full%'"), 1);
    assert_int_equal(q(p, "SELECT count(*) FROM health_transitions WHERE to_health = 'ready' "
                          "AND version = 'v2'"), 1);
    if (n_updates == 3) {
        assert_int_equal(q(p, "SELECT (SELECT ended_at FROM updates WHERE id = 2) <= "
                              "(SELECT started_at FROM updates WHERE id = 3)"), 1);
        /* ready v2, then updating for v3: the order the worker went through */
        assert_int_equal(q(p, "SELECT (SELECT max(id) FROM health_transitions WHERE "
                              "version = 'v2') < (SELECT max(id) FROM health_transitions "
                              "WHERE to_health = 'updating')"), 1);
        char sql[128];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM workers WHERE health = 'ready' AND "
                 "version = '%s'", last);
        assert_int_equal(q(p, sql), 1);
    }
}

/* The next update's begin writes the held end first. */
static void end_written_by_next_begin(int best_effort)
{
    fx f;
    fx_open(&f, best_effort);
    tw_update(&f.w, 3, "v3");
    assert_int_equal(refit_journal_behind(f.w.ctx), 0);
    assert_caught_up(&f, 3, "v3");
    /* the end was held, not lost: no gap was counted for it */
    assert_int_equal(q(f.path, "SELECT count(*) FROM events WHERE kind = 'gap'"), 0);
    tw_close(&f.w);
    fx_rm(&f);
}

/* The disk is still full at the next begin: required refuses it, touching
 * nothing, and keeps the record; best-effort goes on. Once the disk has
 * room, the journal reads right. */
static void disk_still_full(int best_effort)
{
    fx f;
    fx_open(&f, best_effort);
    disk.full = 1;
    refit_txn *t = NULL;
    if (!best_effort) {
        assert_int_equal(refit_begin(&t, f.w.m, NULL), REFIT_EJOURNAL);
        tw_assert_msg(&f.w, "held end of update 2", "full");
        assert_null(t);
        assert_int_equal(refit_worker_health(f.w.ctx), REFIT_HEALTH_READY);
        assert_string_equal(refit_worker_version(f.w.ctx), "v2");
        assert_int_equal(refit_journal_behind(f.w.ctx), 1);
        disk.full = 0;
        tw_update(&f.w, 3, "v3");
        assert_caught_up(&f, 3, "v3");
    } else {
        tw_update(&f.w, 3, "v3"); /* not recorded: a gap */
        assert_int_equal(refit_journal_behind(f.w.ctx), 1);
        disk.full = 0;
        tw_update(&f.w, 4, "v4");
        assert_int_equal(refit_journal_behind(f.w.ctx), 0);
        assert_caught_up(&f, 3, "v4"); /* 1, 2 and 4; 3 is the gap */
        assert_int_equal(q(f.path, "SELECT count(*) FROM events WHERE kind = 'gap'"), 1);
        assert_int_equal(q(f.path, "SELECT count(*) FROM updates WHERE version = 'v4' AND "
                                   "state = 'committed'"), 1);
    }
    assert_int_equal(refit_journal_behind(f.w.ctx), 0);
    tw_close(&f.w);
    fx_rm(&f);
}

/* No update follows: refit_close writes the held end. */
static void end_written_at_close(int best_effort)
{
    fx f;
    fx_open(&f, best_effort);
    tw_close(&f.w);
    assert_caught_up(&f, 2, "v2");
    assert_int_equal(q(f.path, "SELECT count(*) FROM workers WHERE health = 'ready' AND "
                               "version = 'v2'"), 1);
    fx_rm(&f);
}

static void test_end_written_by_next_begin_required(void **state)
{
    (void)state;
    end_written_by_next_begin(0);
}

static void test_end_written_by_next_begin_best_effort(void **state)
{
    (void)state;
    end_written_by_next_begin(1);
}

static void test_disk_still_full_required(void **state)
{
    (void)state;
    disk_still_full(0);
}

static void test_disk_still_full_best_effort(void **state)
{
    (void)state;
    disk_still_full(1);
}

static void test_end_written_at_close_required(void **state)
{
    (void)state;
    end_written_at_close(0);
}

static void test_end_written_at_close_best_effort(void **state)
{
    (void)state;
    end_written_at_close(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_end_written_by_next_begin_required),
        cmocka_unit_test(test_end_written_by_next_begin_best_effort),
        cmocka_unit_test(test_disk_still_full_required),
        cmocka_unit_test(test_disk_still_full_best_effort),
        cmocka_unit_test(test_end_written_at_close_required),
        cmocka_unit_test(test_end_written_at_close_best_effort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
