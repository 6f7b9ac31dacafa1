/* The journal file deleted or replaced while a worker runs: updates would
 * be "recorded" into an unlinked file. journal=required refuses the next
 * begin, touching nothing; best-effort starts a journal at the path again
 * and records the gap there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static void run(int best_effort)
{
    char dir[] = "/tmp/refit-jloss-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64], cmd[256];
    snprintf(path, sizeof path, "%s/j.db", dir);
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = path;
    o.journal_best_effort = best_effort;
    tw w;
    assert_int_equal(tw_open(&w, &o), REFIT_OK);
    tw_one_module(&w);
    tw_update(&w, 1, "v1");
    snprintf(cmd, sizeof cmd, "rm -f %s %s-wal %s-shm", path, path, path);
    assert_int_equal(system(cmd), 0);
    refit_txn *t = NULL;
    if (!best_effort) {
        assert_int_equal(refit_begin(&t, w.m, NULL), REFIT_EJOURNAL);
        tw_assert_msg(&w, "deleted or replaced", "journal=required");
        assert_null(t);
        assert_string_equal(refit_worker_version(w.ctx), "v1");
    } else {
        tw_update(&w, 2, "v2");
        assert_int_equal(access(path, F_OK), 0); /* a journal at the path again */
    }
    tw_close(&w);
    if (best_effort) {
        assert_int_equal(tw_sql_count(path, "SELECT count(*) FROM updates WHERE version = 'v2' AND "
                                     "state = 'committed'"), 1);
        assert_int_equal(tw_sql_count(path, "SELECT count(*) FROM events WHERE kind = 'gap'"), 1);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_deleted_journal_required_refuses(void **state)
{
    (void)state;
    run(0);
}

static void test_deleted_journal_best_effort_reopens(void **state)
{
    (void)state;
    run(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deleted_journal_required_refuses),
        cmocka_unit_test(test_deleted_journal_best_effort_reopens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
