/* refitctl journal, run as a separate process on journals written here:
 * JSON shapes, exit codes, reading while a writer holds the database, and
 * an interrupted update seen by a read-only reader. */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <sqlite3.h>

#include "jtest.h"

typedef struct ctl_run {
    int status;      /* exit status, -1 if it did not exit */
    char *out, *err; /* malloc'ed */
} ctl_run;

static void ctl_path(char *buf, size_t len)
{
    const char *root = getenv("REFIT_BUILD_ROOT");
    snprintf(buf, len, "%s/tools/refitctl", root ? root : "build");
}

/* Read both pipes to their end without either filling up. */
static void drain(int fo, int fe, char **out, char **err)
{
    size_t n[2] = {0, 0}, cap[2] = {4096, 4096};
    char *b[2] = {malloc(cap[0]), malloc(cap[1])};
    struct pollfd p[2] = {{fo, POLLIN, 0}, {fe, POLLIN, 0}};
    int open_fds = 2;
    assert_non_null(b[0]);
    assert_non_null(b[1]);
    while (open_fds > 0 && poll(p, 2, 10000) > 0) {
        for (int i = 0; i < 2; i++) {
            if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP)))
                continue;
            if (n[i] + 4096 > cap[i]) {
                cap[i] *= 2;
                b[i] = realloc(b[i], cap[i]);
                assert_non_null(b[i]);
            }
            ssize_t r = read(p[i].fd, b[i] + n[i], 4096);
            if (r <= 0) {
                close(p[i].fd);
                p[i].fd = -1;
                open_fds--;
            } else {
                n[i] += (size_t)r;
            }
        }
    }
    b[0][n[0]] = '\0';
    b[1][n[1]] = '\0';
    *out = b[0];
    *err = b[1];
}

/* refitctl journal ARGS...; NULL-terminated. */
static ctl_run run_ctl(const char *first, ...)
{
    char exe[512];
    const char *argv[16] = {"refitctl", "journal"};
    int argc = 2, po[2], pe[2], st = 0;
    va_list ap;
    ctl_path(exe, sizeof exe);
    va_start(ap, first);
    for (const char *a = first; a && argc < 15; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    assert_int_equal(pipe(po), 0);
    assert_int_equal(pipe(pe), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]);
        close(pe[0]);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    ctl_run r = {-1, NULL, NULL};
    drain(po[0], pe[0], &r.out, &r.err);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

static void run_free(ctl_run *r)
{
    free(r->out);
    free(r->err);
}

static json_t *parse(const ctl_run *r)
{
    json_error_t e;
    json_t *root = json_loads(r->out, 0, &e);
    if (!root)
        fail_msg("not JSON (%s): %s", e.text, r->out);
    assert_true(json_is_object(root));
    return root;
}

/* Three updates: committed, rolled back, failed with a partial module. */
static void write_history(const char *path)
{
    jt_modules m;
    jt_modules_make(&m, 3);
    journal *j = jt_open(path);
    journal_module_progress p[3];
    for (uint32_t i = 0; i < 3; i++)
        p[i] = (journal_module_progress){i, JOURNAL_MODULE_COMMITTED, 2, 8192,
                                         1, 0x1234u + i};
    assert_int_equal(journal_health(j, "w0", "empty", "ready", "load", "v1"),
                     0);
    int64_t a = jt_begin(j, &m, "v1");
    assert_int_equal(journal_update_end(j, a, JOURNAL_UPDATE_COMMITTED,
                     3 * 8192, 6, NULL, 3, p), 0);
    int64_t b = jt_begin(j, &m, "v2");
    p[0].state = JOURNAL_MODULE_ROLLED_BACK;
    assert_int_equal(journal_update_end(j, b, JOURNAL_UPDATE_ROLLED_BACK,
                     8192, 2, "aborted", 1, p), 0);
    int64_t c = jt_begin(j, &m, "v3");
    p[0] = (journal_module_progress){1, JOURNAL_MODULE_POISONED, 1, 4096, 0,
                                     0};
    assert_int_equal(journal_update_end(j, c, JOURNAL_UPDATE_FAILED, 4096, 1,
                     "module model.layers.0.mlp.experts.1 incomplete", 1, p),
                     0);
    assert_int_equal(journal_event(j, c, "w0", "poisoned", "worker poisoned "
                     "by update %lld", (long long)c), 0);
    journal_close(j);
    jt_modules_free(&m);
}

static void test_updates_json(void **state)
{
    jt_fixture *f = *state;
    write_history(f->path);
    ctl_run r = run_ctl("updates", "--db", f->path, "--json", NULL);
    assert_int_equal(r.status, 0);
    json_t *root = parse(&r), *u = json_object_get(root, "updates");
    assert_int_equal(json_array_size(u), 3);
    static const char *const states[] = {"committed", "rolled_back",
                                         "failed"};
    for (size_t i = 0; i < 3; i++) {
        json_t *o = json_array_get(u, i);
        assert_int_equal(json_integer_value(json_object_get(o, "id")),
                         (json_int_t)i + 1);
        assert_string_equal(json_string_value(json_object_get(o, "state")),
                            states[i]);
    }
    assert_string_equal(json_string_value(json_object_get(
        json_array_get(u, 2), "error")),
        "module model.layers.0.mlp.experts.1 incomplete");
    json_decref(root);
    run_free(&r);
}

static void test_other_commands(void **state)
{
    jt_fixture *f = *state;
    write_history(f->path);
    setenv("REFIT_JOURNAL", f->path, 1);
    ctl_run r = run_ctl("modules", "3", "--incomplete", "--json", NULL);
    assert_int_equal(r.status, 0);
    json_t *root = parse(&r), *m = json_object_get(root, "modules");
    assert_int_equal(json_array_size(m), 3); /* 1 poisoned, 2 pending */
    assert_string_equal(json_string_value(json_object_get(
        json_array_get(m, 1), "state")), "poisoned");
    json_decref(root);
    run_free(&r);

    r = run_ctl("show", "1", "--json", NULL);
    assert_int_equal(r.status, 0);
    root = parse(&r);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(root,
                     "modules"), "committed")), 3);
    json_decref(root);
    run_free(&r);

    r = run_ctl("status", "--json", NULL);
    assert_int_equal(r.status, 0);
    root = parse(&r);
    json_t *w = json_array_get(json_object_get(root, "workers"), 0);
    assert_string_equal(json_string_value(json_object_get(w, "id")), "w0");
    assert_string_equal(json_string_value(json_object_get(w, "health")),
                        "ready");
    assert_int_equal(json_integer_value(json_object_get(w, "last_update")),
                     3);
    json_decref(root);
    run_free(&r);

    r = run_ctl("events", "--update", "3", "--json", NULL);
    assert_int_equal(r.status, 0);
    root = parse(&r);
    assert_string_equal(json_string_value(json_object_get(json_array_get(
        json_object_get(root, "events"), 0), "kind")), "poisoned");
    json_decref(root);
    run_free(&r);

    r = run_ctl("verify", "--json", NULL);
    assert_int_equal(r.status, 0);
    root = parse(&r);
    assert_true(json_is_true(json_object_get(root, "ok")));
    json_decref(root);
    run_free(&r);
    unsetenv("REFIT_JOURNAL");
}

/* Human tables fit 100 columns. */
static void test_tables(void **state)
{
    jt_fixture *f = *state;
    static const char *const cmds[][2] = {
        {"status", NULL}, {"updates", NULL}, {"show", "3"},
        {"modules", "3"}, {"events", NULL}, {"verify", NULL}};
    write_history(f->path);
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        ctl_run r = cmds[i][1]
            ? run_ctl(cmds[i][0], cmds[i][1], "--db", f->path, NULL)
            : run_ctl(cmds[i][0], "--db", f->path, NULL);
        assert_int_equal(r.status, 0);
        for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n"))
            if (strlen(line) > 100)
                fail_msg("%s: line of %zu columns: %s", cmds[i][0],
                         strlen(line), line);
        run_free(&r);
    }
}

static void test_exit_codes(void **state)
{
    jt_fixture *f = *state;
    char missing[320];
    unsetenv("REFIT_JOURNAL");
    ctl_run r = run_ctl("updates", NULL);
    assert_int_equal(r.status, 2);
    assert_true(jt_has(r.err, "REFIT_JOURNAL"));
    run_free(&r);
    r = run_ctl("frobnicate", "--db", f->path, NULL);
    assert_int_equal(r.status, 2);
    run_free(&r);
    r = run_ctl("show", "--db", f->path, NULL);
    assert_int_equal(r.status, 2);
    run_free(&r);
    jt_join(missing, sizeof missing, f->dir, "missing.db");
    r = run_ctl("updates", "--db", missing, NULL);
    assert_int_equal(r.status, 1);
    assert_true(jt_has(r.err, missing));
    run_free(&r);
    write_history(f->path);
    r = run_ctl("show", "42", "--db", f->path, NULL);
    assert_int_equal(r.status, 1);
    assert_true(jt_has(r.err, "no update 42"));
    run_free(&r);
    /* verify finds a tampered chunk and exits 1. */
    jt_sql_exec(f->path, "UPDATE module_chunks SET states = 'C?C' WHERE "
                "update_id = 1");
    r = run_ctl("verify", "--db", f->path, "--json", NULL);
    assert_int_equal(r.status, 1);
    json_t *root = parse(&r);
    assert_true(json_is_false(json_object_get(root, "ok")));
    assert_true(json_array_size(json_object_get(root, "problems")) > 0);
    json_decref(root);
    run_free(&r);
}

/* A writer holds the write lock with uncommitted rows: refitctl reads the
 * last committed state, at once. */
static void test_read_while_writer_holds(void **state)
{
    jt_fixture *f = *state;
    sqlite3 *db = NULL;
    write_history(f->path);
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE; UPDATE updates SET "
                     "state = 'aborted'; DELETE FROM events", NULL, NULL,
                     NULL), SQLITE_OK);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ctl_run r = run_ctl("updates", "--db", f->path, "--json", NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(r.status, 0);
    double s = (double)(t1.tv_sec - t0.tv_sec) +
               (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    assert_true(s < 1.0); /* far below the 2 s busy timeout */
    json_t *root = parse(&r);
    assert_string_equal(json_string_value(json_object_get(json_array_get(
        json_object_get(root, "updates"), 0), "state")), "committed");
    json_decref(root);
    run_free(&r);
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(db);
}

/* The child of test_concurrent_reader: an update whose modules complete
 * one batch at a time. Plain calls and exit codes, no cmocka asserts. */
_Noreturn static void stream_writer(const char *path, const jt_modules *m)
{
    journal *w = NULL;
    char err[256];
    int64_t id = 0;
    journal_update_info info = {
        .worker_id = "w0", .version = "v", .rollback = 1};
    if (journal_open(&w, path, NULL, err, sizeof err) ||
        journal_update_begin(w, &id, &info, m->n, m->info))
        _exit(1);
    for (uint32_t i = 0; i < m->n; i++) {
        journal_module_progress p = {i, JOURNAL_MODULE_COMPLETE, 2, 8192,
                                     0, 0};
        if (journal_modules_progress(w, id, 1, &p))
            _exit(2);
        usleep(200); /* let the readers interleave */
    }
    journal_close(w);
    _exit(0);
}

/* Readers during a stream of writes from another process: every read
 * succeeds and sees a consistent snapshot (counts only grow). */
static void test_concurrent_reader(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    jt_modules_make(&m, 2048);
    journal *j = jt_open(f->path);
    int64_t id = jt_begin(j, &m, "v");
    journal_close(j);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        stream_writer(f->path, &m);
    int64_t last = 0, reads = 0;
    int st = 0;
    /* A long-lived reader too, as a monitoring tool would keep. */
    journal *r_j = NULL;
    journal_opts ro = JOURNAL_OPTS_INIT;
    char err[256];
    ro.readonly = 1;
    assert_int_equal(journal_open(&r_j, f->path, &ro, err, sizeof err), 0);
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM modules WHERE update_id "
             "= %lld AND state = 'complete'", (long long)id + 1);
    while (waitpid(pid, &st, WNOHANG) == 0) {
        ctl_run r = run_ctl("modules", "2", "--db", f->path, "--json", NULL);
        if (r.status == 0) {
            json_t *root = parse(&r);
            size_t n = json_array_size(json_object_get(root, "modules"));
            assert_true(n == 0 || n == m.n);
            json_decref(root);
        } else {
            /* not begun yet; with --json the error is a JSON document on
             * stdout (tools/cli.c), without it a line on stderr */
            if (!jt_has(r.out, "no update 2") && !jt_has(r.err, "no update 2"))
                fail_msg("refitctl journal modules failed (%d): %s%s", r.status, r.out, r.err);
        }
        run_free(&r);
        int64_t c = jt_sql_int(f->path, sql);
        assert_true(c >= last);
        last = c;
        int rc = journal_modules_list(r_j, id + 1, 0, NULL, NULL);
        assert_true(rc == REFIT_OK || rc == REFIT_ENOTFOUND);
        reads++;
    }
    journal_close(r_j);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(jt_sql_int(f->path, sql), (int64_t)m.n);
    printf("# %lld reads during the writes\n", (long long)reads);
    jt_modules_free(&m);
}

/* A writer killed inside its update: refitctl (read-only) shows it
 * interrupted without anyone reopening the journal for writing. */
static void test_interrupted_seen(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    int fds[2];
    int64_t id = 0;
    jt_modules_make(&m, 2);
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* No cmocka asserts in the child: plain calls, exit codes. */
        journal *j = NULL;
        char err[256];
        journal_update_info info = {
            .worker_id = "w0", .version = "v", .rollback = 1};
        if (journal_open(&j, f->path, NULL, err, sizeof err) ||
            journal_worker_register(j, "w0", 0) ||
            journal_update_begin(j, &id, &info, m.n, m.info))
            id = -1;
        if (write(fds[1], &id, sizeof id) != sizeof id)
            _exit(1);
        for (;;)
            pause();
    }
    assert_int_equal(read(fds[0], &id, sizeof id), sizeof id);
    assert_true(id > 0);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ctl_run r = run_ctl("updates", "--db", f->path, "--json", NULL);
    assert_int_equal(r.status, 0);
    json_t *root = parse(&r);
    json_t *u = json_array_get(json_object_get(root, "updates"), 0);
    assert_string_equal(json_string_value(json_object_get(u, "state")),
                        "interrupted");
    assert_string_equal(json_string_value(json_object_get(u,
                        "state_recorded")), "loading");
    json_decref(root);
    run_free(&r);
    close(fds[0]);
    close(fds[1]);
    jt_modules_free(&m);
}

/* Where the undo log kept its bytes: recorded with the end, NULL when the
 * writer never said (older refit, or journal_update_undo not called). */
static void test_undo_placement(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    jt_modules_make(&m, 1);
    journal *j = jt_open(f->path);
    journal_module_progress p = {0, JOURNAL_MODULE_ROLLED_BACK, 2, 8192, 0, 0};
    int64_t a = jt_begin(j, &m, "v1");
    assert_int_equal(journal_update_undo(j, a + 1, 1, 1), REFIT_ESTATE); /* not open */
    assert_int_equal(journal_update_undo(j, a, 3u << 20, 1024), 0);
    assert_int_equal(journal_update_end(j, a, JOURNAL_UPDATE_ROLLED_BACK, 8192, 2, "aborted",
                                        1, &p), 0);
    int64_t b = jt_begin(j, &m, "v2");
    assert_int_equal(journal_update_end(j, b, JOURNAL_UPDATE_ABORTED, 0, 0, NULL, 0, NULL), 0);
    journal_close(j);
    jt_modules_free(&m);

    ctl_run r = run_ctl("updates", "--db", f->path, "--json", NULL);
    assert_int_equal(r.status, 0);
    json_t *root = parse(&r), *u = json_object_get(root, "updates");
    json_t *ua = json_array_get(u, 0), *ub = json_array_get(u, 1);
    assert_int_equal(json_integer_value(json_object_get(ua, "undo_device_bytes")), 3 << 20);
    assert_int_equal(json_integer_value(json_object_get(ua, "undo_host_bytes")), 1024);
    assert_true(json_is_null(json_object_get(ub, "undo_device_bytes")));
    assert_true(json_is_null(json_object_get(ub, "undo_host_bytes")));
    json_decref(root);
    run_free(&r);

    r = run_ctl("updates", "--db", f->path, NULL);
    assert_int_equal(r.status, 0);
    assert_true(jt_has(r.out, "UNDO"));
    assert_true(jt_has(r.out, "dev 3.0M host 1.0K"));
    run_free(&r);
    r = run_ctl("show", "1", "--db", f->path, NULL);
    assert_int_equal(r.status, 0);
    assert_true(jt_has(r.out, "undo log       device 3145728 bytes, host 1024 bytes"));
    run_free(&r);
    r = run_ctl("show", "2", "--db", f->path, NULL);
    assert_int_equal(r.status, 0);
    assert_true(jt_has(r.out, "undo log       not recorded"));
    run_free(&r);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, jt_setup, jt_teardown)
    const struct CMUnitTest tests[] = {
        T(test_updates_json), T(test_other_commands), T(test_tables),
        T(test_exit_codes), T(test_read_while_writer_holds),
        T(test_concurrent_reader), T(test_interrupted_seen),
        T(test_undo_placement),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
