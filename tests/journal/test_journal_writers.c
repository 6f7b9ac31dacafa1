/* Who writes a journal (issue 29): liveness that holds across PID
 * namespaces (J1), one live process per worker id (J2), an update another
 * process marked interrupted never flips back (J1), and a journal that
 * cannot be created on a read-only file system says so (J3). The cases that
 * need root (namespaces, mounts) skip with the reason elsewhere. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jtest.h"

/* cmocka's skip() with the reason in the output. */
#define skip_msg(why)                                                          \
    do {                                                                       \
        print_message("skipped: %s\n", (why));                                \
        skip();                                                                \
    } while (0)

/* ---- J2: two live workers with one id ------------------------------------ */

static void test_second_live_worker_refused(void **state)
{
    jt_fixture *f = *state;
    journal *a = jt_open(f->path), *b = NULL;
    char err[512], me[32];
    assert_int_equal(journal_open(&b, f->path, NULL, err, sizeof err), REFIT_OK);
    int rc = journal_worker_register(b, "w0", 1);
    if (rc != REFIT_EEXIST)
        fail_msg("a second live registration of worker w0 = %s, want EEXIST",
                 refit_status_name(rc));
    snprintf(me, sizeof me, "pid %lld", (long long)getpid());
    const char *msg = journal_errmsg(b);
    if (!jt_has(msg, "worker 'w0'") || !jt_has(msg, me) || !jt_has(msg, "live"))
        fail_msg("message \"%s\" does not name the worker id and its live holder", msg);
    /* nothing changed: the row still belongs to a */
    assert_int_equal(jt_sql_int(f->path, "SELECT rank FROM workers WHERE id = 'w0'"), 0);
    assert_int_equal(journal_worker_register(b, "w1", 1), REFIT_OK);
    /* a registers again (a restart of the same handle): its own lock */
    assert_int_equal(journal_worker_register(a, "w0", 0), REFIT_OK);
    journal_close(a); /* the holder is gone: the id is free */
    assert_int_equal(journal_worker_register(b, "w0", 2), REFIT_OK);
    assert_int_equal(jt_sql_int(f->path, "SELECT rank FROM workers WHERE id = 'w0'"), 2);
    journal_close(b);
}

/* ---- J1: an interrupted row never flips back ------------------------------ */

static int count_kind(void *user, const journal_event_row *r)
{
    char **want = user;
    if (!strcmp(r->kind, want[0]) && jt_has(r->message, want[1]))
        want[2] = (char *)"found";
    return 0;
}

static void test_interrupted_never_flips_back(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    jt_modules_make(&m, 3);
    journal *j = jt_open(f->path);
    int64_t id = jt_begin(j, &m, "v1");
    /* another process (a pid test that failed, an older refit) marks it */
    char sql[256];
    snprintf(sql, sizeof sql, "UPDATE updates SET state = 'interrupted', ended_at = "
             "'2026-01-01T00:00:00.000Z', error = 'writer gone' WHERE id = %lld",
             (long long)id);
    jt_sql_exec(f->path, sql);
    assert_int_equal(journal_update_state_set(j, id, JOURNAL_UPDATE_FINALIZING),
                     REFIT_ENOTFOUND);
    jt_update u;
    jt_update_get(j, id, &u);
    assert_string_equal(u.recorded, "interrupted");
    assert_int_equal(journal_update_end(j, id, JOURNAL_UPDATE_COMMITTED, 10, 6, NULL, 0, NULL),
                     REFIT_OK);
    jt_update_get(j, id, &u);
    if (strcmp(u.recorded, "interrupted"))
        fail_msg("an update recorded interrupted became %s", u.recorded);
    char *want[3] = {(char *)"ended_late", (char *)"ended committed", NULL};
    assert_int_equal(journal_events_list(j, id, 0, count_kind, want), REFIT_OK);
    if (!want[2])
        fail_msg("no ended_late event says how update %lld ended", (long long)id);
    journal_close(j);
    jt_modules_free(&m);
}

/* ---- J1: a live writer in another PID namespace --------------------------- */

/* The writer: pid 1 of a new PID namespace with its own /proc, as a second
 * container sharing the journal is. It begins an update, says so, waits
 * for the word, and commits. */
static int ns_writer(const char *path, int ready, int go)
{
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("proc", "/proc", "proc", 0, NULL) != 0)
        return 10;
    journal *j = NULL;
    char err[512];
    if (journal_open(&j, path, NULL, err, sizeof err) ||
        journal_worker_register(j, "ns-writer", 0))
        return 11;
    journal_update_info info = {.worker_id = "ns-writer", .version = "v1",
                                 .health_from = "ready", .health_reason = "update began"};
    int64_t id = 0;
    if (journal_update_begin(j, &id, &info, 0, NULL))
        return 12;
    char c = (char)getpid(); /* 1: the namespace's first process */
    if (write(ready, &c, 1) != 1 || read(go, &c, 1) != 1)
        return 13;
    int rc = journal_update_end(j, id, JOURNAL_UPDATE_COMMITTED, 0, 0, NULL, 0, NULL);
    journal_close(j);
    return rc ? 14 : 0;
}

static void test_live_writer_in_another_pid_namespace(void **state)
{
    jt_fixture *f = *state;
    if (geteuid() != 0)
        skip_msg("J1 across PID namespaces needs root (unshare, mount /proc)");
    journal_close(jt_open(f->path)); /* created here */
    int ready[2], go[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0)
            _exit(77);
        pid_t init = fork(); /* pid 1 there */
        if (init == 0)
            _exit(ns_writer(f->path, ready[1], go[0]));
        int st = 0;
        waitpid(init, &st, 0);
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 20);
    }
    close(ready[1]);
    close(go[0]);
    char c = 0;
    if (read(ready[0], &c, 1) != 1) {
        int st = 0;
        waitpid(child, &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
            skip_msg("unshare(CLONE_NEWPID | CLONE_NEWNS) refused here");
        fail_msg("the writer in its namespace failed (status %d)", st);
    }
    journal *j = jt_open(f->path);
    size_t marked = journal_interrupted_on_open(j);
    jt_update u;
    jt_update_get(j, 1, &u);
    char *health = jt_sql_text(f->path, "SELECT health FROM workers WHERE id = 'ns-writer'");
    /* a reader (refitctl) sees it alive too */
    journal *r = NULL;
    journal_opts ro = JOURNAL_OPTS_INIT;
    ro.readonly = 1;
    char err[512];
    jt_update shown;
    memset(&shown, 0, sizeof shown);
    if (journal_open(&r, f->path, &ro, err, sizeof err) == REFIT_OK)
        jt_update_get(r, 1, &shown);
    journal_close(r);
    int dead = marked || strcmp(u.recorded, "loading") || strcmp(u.state, "loading") ||
               strcmp(shown.state, "loading") || !health || strcmp(health, "updating");
    free(health);
    /* the writer goes on either way: a failure here must not leave it waiting */
    assert_int_equal(write(go[1], &c, 1), 1);
    if (dead)
        fail_msg("the live writer's update (pid %d in its namespace) was taken for dead: "
                 "%zu marked, recorded %s, shown %s, to a reader %s (%s)", c, marked,
                 u.recorded, u.state, shown.state, u.error);
    int st = 0;
    assert_int_equal(waitpid(child, &st, 0), child);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    jt_update_get(j, 1, &u);
    assert_string_equal(u.recorded, "committed");
    journal_close(j);
    close(ready[0]);
    close(go[1]);
}

/* ---- J3: a read-only file system ------------------------------------------ */

/* In a private mount namespace: a read-only tmpfs at dir; the message of
 * opening dir/j.db for writing goes to fd out. */
static int ro_open(const char *dir, int out)
{
    if (unshare(CLONE_NEWNS) != 0)
        return 77;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", dir, "tmpfs", MS_RDONLY, NULL) != 0)
        return 78;
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/j.db", dir);
    journal *j = NULL;
    int rc = journal_open(&j, path, NULL, err, sizeof err);
    journal_close(j);
    dprintf(out, "%d %s\n", rc, err);
    /* an existing journal on a file system remounted read-only */
    if (mount(NULL, dir, NULL, MS_REMOUNT, NULL) != 0)
        return 79;
    j = NULL;
    if (journal_open(&j, path, NULL, err, sizeof err) != REFIT_OK)
        return 80;
    journal_close(j);
    if (mount(NULL, dir, NULL, MS_REMOUNT | MS_RDONLY, NULL) != 0)
        return 81;
    rc = journal_open(&j, path, NULL, err, sizeof err);
    journal_close(j);
    dprintf(out, "%d %s\n", rc, err);
    return 0;
}

static void test_new_journal_on_readonly_fs(void **state)
{
    jt_fixture *f = *state;
    if (geteuid() != 0)
        skip_msg("J3 mounts a read-only tmpfs: needs root");
    char dir[300];
    jt_join(dir, sizeof dir, f->dir, "ro");
    assert_int_equal(mkdir(dir, 0755), 0);
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(p[0]);
        _exit(ro_open(dir, p[1]));
    }
    close(p[1]);
    char msg[2048] = "";
    size_t used = 0;
    for (ssize_t n; used + 1 < sizeof msg &&
                    (n = read(p[0], msg + used, sizeof msg - 1 - used)) > 0;)
        used += (size_t)n; /* to the end: the child writes twice */
    msg[used] = '\0';
    close(p[0]);
    int st = 0;
    assert_int_equal(waitpid(child, &st, 0), child);
    if (WIFEXITED(st) && (WEXITSTATUS(st) == 77 || WEXITSTATUS(st) == 78))
        skip_msg("a private mount namespace with a read-only tmpfs is not permitted here");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("the child failed (status %d): %s", st, msg);
    char *second = strchr(msg, '\n');
    assert_non_null(second);
    *second++ = '\0';
    assert_int_equal(atoi(msg), REFIT_EJOURNAL);
    if (!jt_has(msg, "read-only file system") || !jt_has(msg, dir) ||
        jt_has(msg, "No such file"))
        fail_msg("a new journal on a read-only file system says: %s", msg);
    assert_int_equal(atoi(second), REFIT_EJOURNAL);
    if (!jt_has(second, "read-only file system") || !jt_has(second, dir))
        fail_msg("an existing journal on a read-only file system says: %s", second);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_second_live_worker_refused, jt_setup, jt_teardown),
        cmocka_unit_test_setup_teardown(test_interrupted_never_flips_back, jt_setup,
                                        jt_teardown),
        cmocka_unit_test_setup_teardown(test_live_writer_in_another_pid_namespace, jt_setup,
                                        jt_teardown),
        cmocka_unit_test_setup_teardown(test_new_journal_on_readonly_fs, jt_setup, jt_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
