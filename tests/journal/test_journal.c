/* Journal: schema, every update and module state, plans, reads, events,
 * health, and the interrupted detection across a real SIGKILL. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jtest.h"

static void test_create(void **state)
{
    jt_fixture *f = *state;
    journal *j = jt_open(f->path);
    char *mode = jt_sql_text(f->path, "PRAGMA journal_mode");
    assert_string_equal(mode, "wal");
    free(mode);
    assert_int_equal(jt_sql_int(f->path, "PRAGMA application_id"),
                     JOURNAL_APPLICATION_ID);
    assert_int_equal(jt_sql_int(f->path, "PRAGMA user_version"),
                     JOURNAL_SCHEMA_VERSION);
    journal_close(j);
    /* A second open finds the schema current and changes nothing. */
    j = jt_open(f->path);
    assert_int_equal(journal_interrupted_on_open(j), 0);
    journal_close(j);
}

static journal_module_progress prog(uint32_t i, journal_module_state s,
                                    uint64_t t, uint64_t b)
{
    return (journal_module_progress){.index = i, .state = s,
                                     .received_tensors = t,
                                     .received_bytes = b};
}

typedef struct mod_seen {
    char state[8][16];
    uint64_t received[8];
    char fp[8][20];
    size_t n;
} mod_seen;

static int keep_module(void *user, const journal_module_row *r)
{
    mod_seen *s = user;
    if (s->n < 8) {
        snprintf(s->state[s->n], 16, "%s", r->state);
        s->received[s->n] = r->received_tensors;
        snprintf(s->fp[s->n], 20, "%s", r->fingerprint ? r->fingerprint : "");
    }
    s->n++;
    return 0;
}

/* loading -> finalizing -> committed, with each module state on the way. */
static void test_commit_path(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    jt_update u;
    mod_seen seen = {0};
    jt_modules_make(&m, 3);
    journal *j = jt_open(f->path);
    int64_t id = jt_begin(j, &m, "step-1");
    jt_update_get(j, id, &u);
    assert_string_equal(u.state, "loading");
    assert_string_equal(u.mode, "normal");
    assert_int_equal(u.n_modules, 3);

    journal_module_progress p[2] = {prog(0, JOURNAL_MODULE_PARTIAL, 1, 4096),
                                    prog(1, JOURNAL_MODULE_COMPLETE, 2, 8192)};
    assert_int_equal(journal_modules_progress(j, id, 2, p), REFIT_OK);
    assert_int_equal(journal_modules_list(j, id, 0, keep_module, &seen), 0);
    assert_int_equal(seen.n, 3);
    assert_string_equal(seen.state[0], "partial");
    assert_int_equal(seen.received[0], 1);
    assert_string_equal(seen.state[1], "complete");
    assert_int_equal(seen.received[1], 2);
    assert_string_equal(seen.state[2], "pending");
    assert_int_equal(seen.received[2], 0);

    assert_int_equal(journal_update_state_set(j, id,
                     JOURNAL_UPDATE_FINALIZING), REFIT_OK);
    jt_update_get(j, id, &u);
    assert_string_equal(u.state, "finalizing");

    journal_module_progress e[3];
    for (uint32_t i = 0; i < 3; i++) {
        e[i] = prog(i, JOURNAL_MODULE_COMMITTED, 2, 8192);
        e[i].has_fingerprint = 1;
        e[i].fingerprint = 0xfedcba9876543210ull + i;
    }
    assert_int_equal(journal_update_end(j, id, JOURNAL_UPDATE_COMMITTED,
                     3 * 8192, 6, NULL, 3, e), REFIT_OK);
    jt_update_get(j, id, &u);
    assert_string_equal(u.state, "committed");
    assert_int_equal(u.tensors, 6);
    assert_int_equal(u.bytes, 3 * 8192);
    memset(&seen, 0, sizeof seen);
    assert_int_equal(journal_modules_list(j, id, 0, keep_module, &seen), 0);
    assert_string_equal(seen.state[2], "committed");
    assert_string_equal(seen.fp[0], "fedcba9876543210");
    assert_string_equal(seen.fp[2], "fedcba9876543212");
    /* Nothing incomplete is left. */
    memset(&seen, 0, sizeof seen);
    assert_int_equal(journal_modules_list(j, id, 1, keep_module, &seen), 0);
    assert_int_equal(seen.n, 0);
    /* The update is no longer open on the handle. */
    assert_int_equal(journal_modules_progress(j, id, 1, e), REFIT_ESTATE);
    journal_close(j);
    jt_modules_free(&m);
}

/* End one update in state s, module 0 in module state ms. */
static int64_t end_as(journal *j, const jt_modules *m, journal_update_state s,
                      journal_module_state ms, const char *error)
{
    int64_t id = jt_begin(j, m, "v");
    journal_module_progress p = prog(0, ms, 1, 4096);
    int rc = journal_update_end(j, id, s, 4096, 1, error, 1, &p);
    if (rc != REFIT_OK)
        fail_msg("end: %s", journal_errmsg(j));
    return id;
}

static void test_final_states(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    jt_update u;
    mod_seen seen = {0};
    jt_modules_make(&m, 2);
    journal *j = jt_open(f->path);
    int64_t a = end_as(j, &m, JOURNAL_UPDATE_ABORTED, JOURNAL_MODULE_PENDING,
                       NULL);
    int64_t r = end_as(j, &m, JOURNAL_UPDATE_ROLLED_BACK,
                       JOURNAL_MODULE_ROLLED_BACK, "aborted by caller");
    int64_t x = end_as(j, &m, JOURNAL_UPDATE_FAILED, JOURNAL_MODULE_POISONED,
                       "module 0 incomplete");
    int64_t i = end_as(j, &m, JOURNAL_UPDATE_INTERRUPTED,
                       JOURNAL_MODULE_PARTIAL, NULL);
    jt_update_get(j, a, &u);
    assert_string_equal(u.state, "aborted");
    jt_update_get(j, r, &u);
    assert_string_equal(u.state, "rolled_back");
    assert_string_equal(u.error, "aborted by caller");
    jt_update_get(j, x, &u);
    assert_string_equal(u.state, "failed");
    assert_string_equal(u.error, "module 0 incomplete");
    jt_update_get(j, i, &u);
    assert_string_equal(u.state, "interrupted");
    assert_int_equal(journal_modules_list(j, r, 0, keep_module, &seen), 0);
    assert_string_equal(seen.state[0], "rolled_back");
    memset(&seen, 0, sizeof seen);
    assert_int_equal(journal_modules_list(j, x, 1, keep_module, &seen), 0);
    assert_int_equal(seen.n, 2);
    assert_string_equal(seen.state[0], "poisoned");
    assert_int_equal(seen.received[0], 1);

    /* A replay of the failed update. */
    journal_update_info info = {
        .worker_id = "w0", .version = "v", .source_uri = "file:///ckpt",
        .source_digest = "sha256:abc", .replay_of = x, .rollback = 0};
    int64_t id = 0;
    assert_int_equal(journal_update_begin(j, &id, &info, m.n, m.info), 0);
    jt_update_get(j, id, &u);
    assert_string_equal(u.mode, "replay");
    assert_int_equal(u.replay_of, x);
    assert_int_equal(u.rollback, 0);
    /* A loading state is not a final state. */
    assert_int_equal(journal_update_end(j, id, JOURNAL_UPDATE_LOADING, 0, 0,
                     NULL, 0, NULL), REFIT_EINVAL);
    journal_close(j);
    jt_modules_free(&m);
}

static void test_bad_calls(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    mod_seen seen = {0};
    jt_modules_make(&m, 2);
    journal *j = jt_open(f->path);
    int64_t id = jt_begin(j, &m, "v");
    journal_module_progress p[2] = {prog(1, JOURNAL_MODULE_COMPLETE, 2, 8192),
                                    prog(2, JOURNAL_MODULE_COMPLETE, 2, 8192)};
    /* Index 2 does not exist: nothing of the batch is applied. */
    assert_int_equal(journal_modules_progress(j, id, 2, p), REFIT_EINVAL);
    assert_true(jt_has(journal_errmsg(j), "no module at index 2"));
    assert_int_equal(journal_modules_list(j, id, 0, keep_module, &seen), 0);
    assert_string_equal(seen.state[1], "pending");
    assert_int_equal(journal_modules_progress(j, id + 7, 1, p), REFIT_ESTATE);
    p[0].state = (journal_module_state)42;
    assert_int_equal(journal_modules_progress(j, id, 1, p), REFIT_EINVAL);
    assert_int_equal(journal_update_state_set(j, id, JOURNAL_UPDATE_COMMITTED),
                     REFIT_EINVAL);
    assert_int_equal(journal_update_state_set(j, id + 7,
                     JOURNAL_UPDATE_FINALIZING), REFIT_ENOTFOUND);
    assert_int_equal(journal_update_get(j, 999, NULL, NULL), REFIT_ENOTFOUND);
    assert_int_equal(journal_modules_list(j, 999, 0, keep_module, &seen),
                     REFIT_ENOTFOUND);
    /* An unregistered worker cannot begin. */
    journal_update_info info = {
        .worker_id = "nobody", .version = "v", .rollback = 1};
    assert_int_equal(journal_update_begin(j, &id, &info, m.n, m.info),
                     REFIT_EJOURNAL);
    assert_true(jt_has(journal_errmsg(j), "'nobody' is not registered"));
    assert_int_equal(id, 0);
    journal_close(j);

    /* A read-only handle refuses writes. */
    journal_opts ro = JOURNAL_OPTS_INIT;
    char err[256];
    ro.readonly = 1;
    assert_int_equal(journal_open(&j, f->path, &ro, err, sizeof err), 0);
    assert_int_equal(journal_event(j, 0, NULL, "x", "y"), REFIT_EINVAL);
    assert_true(jt_has(journal_errmsg(j), "read-only"));
    journal_close(j);
    assert_int_equal(journal_open(&j, "", NULL, err, sizeof err),
                     REFIT_EINVAL);
    assert_null(j);
    jt_modules_free(&m);
}

static int print_problem(void *user, const char *problem)
{
    (void)user;
    printf("# problem: %s\n", problem);
    return 0;
}

/* One plan per distinct module list; partial counts only where partial. */
static void test_plans_and_partials(void **state)
{
    jt_fixture *f = *state;
    jt_modules m, m2;
    mod_seen seen = {0};
    jt_modules_make(&m, 600);
    jt_modules_make(&m2, 5);
    journal *j = jt_open(f->path);
    int64_t a = jt_begin(j, &m, "a");
    assert_int_equal(journal_update_end(j, a, JOURNAL_UPDATE_ABORTED, 0, 0,
                     NULL, 0, NULL), 0);
    int64_t b = jt_begin(j, &m, "b");
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM plans"), 1);
    /* schema 2: no chunk rows until modules change; the view says pending */
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM module_chunks"
                     " WHERE update_id = 2"), 0);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM modules"
                     " WHERE update_id = 2 AND state = 'pending'"
                     " AND received_tensors = 0"), 600);
    journal_module_progress p = prog(599, JOURNAL_MODULE_PARTIAL, 1, 10);
    assert_int_equal(journal_modules_progress(j, b, 1, &p), 0);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM "
                     "module_received"), 1);
    p = prog(599, JOURNAL_MODULE_COMPLETE, 2, 8192);
    assert_int_equal(journal_modules_progress(j, b, 1, &p), 0);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM "
                     "module_received"), 0);
    assert_int_equal(jt_sql_int(f->path, "SELECT received_tensors FROM "
                     "modules WHERE update_id = 2 AND idx = 599"), 2);
    assert_int_equal(journal_modules_list(j, b, 1, keep_module, &seen), 0);
    assert_int_equal(seen.n, 599);
    /* Beginning another update while b is open records b interrupted. */
    int64_t c = jt_begin(j, &m2, "c");
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM plans"), 2);
    jt_update u;
    jt_update_get(j, b, &u);
    assert_string_equal(u.state, "interrupted");
    assert_true(jt_has(u.error, "never recorded"));
    jt_update_get(j, c, &u);
    assert_string_equal(u.state, "loading");
    /* A plan named by id skips the hash; one of another size is refused. */
    int64_t plan = 0, d = 0;
    assert_int_equal(journal_plan_prepare(j, m.n, m.info, &plan), 0);
    journal_update_info info = {.worker_id = "w0", .plan_id = plan};
    assert_int_equal(journal_update_begin(j, &d, &info, m2.n, m2.info),
                     REFIT_EINVAL);
    assert_true(jt_has(journal_errmsg(j), "plan"));
    jt_update_get(j, c, &u); /* the refused begin closed nothing */
    assert_string_equal(u.state, "loading");
    assert_int_equal(journal_update_begin(j, &d, &info, m.n, m.info), 0);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM plans"), 2);
    size_t problems = 99;
    assert_int_equal(journal_verify(j, print_problem, NULL, &problems), 0);
    assert_int_equal(problems, 0);
    journal_close(j);
    jt_modules_free(&m);
    jt_modules_free(&m2);
}

static int count_event(void *user, const journal_event_row *r)
{
    char *kinds = user;
    strcat(kinds, r->kind);
    strcat(kinds, ",");
    return 0;
}

static void test_events_health(void **state)
{
    jt_fixture *f = *state;
    char kinds[256] = "";
    journal *j = jt_open(f->path);
    assert_int_equal(journal_health(j, "w0", NULL, "EMPTY", "sealed", NULL),
                     0);
    assert_int_equal(journal_health(j, "w0", "empty", "ready", "loaded",
                     "step-1"), 0);
    assert_int_equal(journal_heartbeat(j, "w0"), 0);
    char *h = jt_sql_text(f->path, "SELECT health || ' ' || version FROM "
                          "workers");
    assert_string_equal(h, "ready step-1");
    free(h);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM "
                     "health_transitions WHERE to_health = 'empty'"), 1);
    for (int i = 0; i < 5; i++)
        assert_int_equal(journal_event(j, 0, "w0", i % 2 ? "odd" : "even",
                         "event %d of %s", i, "five"), 0);
    assert_int_equal(journal_events_list(j, 0, 2, count_event, kinds), 0);
    assert_string_equal(kinds, "odd,even,");
    char *msg = jt_sql_text(f->path, "SELECT message FROM events WHERE id = "
                            "(SELECT max(id) FROM events)");
    assert_string_equal(msg, "event 4 of five");
    free(msg);
    assert_int_equal(journal_health(j, "ghost", "a", "b", "c", NULL),
                     REFIT_EJOURNAL);
    journal_close(j);
}

/* ---- interrupted ------------------------------------------------------- */

/* Child: begin an update, report its id, wait to be killed. */
static void child_begin(const char *path, int fd)
{
    journal *j = NULL;
    jt_modules m;
    int64_t id = 0;
    char err[256];
    journal_update_info info = {
        .worker_id = "w0", .version = "v2", .source_uri = "file:///ckpt",
        .rollback = 0};
    jt_modules_make(&m, 4);
    if (journal_open(&j, path, NULL, err, sizeof err) ||
        journal_worker_register(j, "w0", 0) ||
        journal_health(j, "w0", "ready", "updating", "begin", NULL) ||
        journal_update_begin(j, &id, &info, m.n, m.info))
        id = -1;
    journal_module_progress p = prog(0, JOURNAL_MODULE_COMPLETE, 2, 8192);
    if (id > 0 && journal_modules_progress(j, id, 1, &p))
        id = -1;
    if (write(fd, &id, sizeof id) != sizeof id)
        _exit(3);
    for (;;)
        pause();
}

static int64_t spawn_and_kill(const char *path, int reap)
{
    int fds[2];
    int64_t id = 0;
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        child_begin(path, fds[1]);
    }
    close(fds[1]);
    assert_int_equal(read(fds[0], &id, sizeof id), sizeof id);
    close(fds[0]);
    assert_true(id > 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    if (reap) {
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFSIGNALED(st));
    } else {
        /* Not reaped: the child is a zombie; kill(pid, 0) still succeeds. */
        usleep(100 * 1000);
    }
    return id;
}

static int keep_worker(void *user, const journal_worker_row *r)
{
    snprintf(user, 64, "%s %s %d", r->health, r->last_update_state, r->alive);
    return 0;
}

static void test_interrupted_sigkill(void **state)
{
    jt_fixture *f = *state;
    journal *j = jt_open(f->path); /* creates it; w0 row of this process */
    journal_close(j);
    int64_t id = spawn_and_kill(f->path, 0);

    /* A reader cannot record it but shows it. */
    journal_opts ro = JOURNAL_OPTS_INIT;
    char err[256], w[64];
    jt_update u;
    ro.readonly = 1;
    assert_int_equal(journal_open(&j, f->path, &ro, err, sizeof err), 0);
    jt_update_get(j, id, &u);
    assert_string_equal(u.state, "interrupted");
    assert_string_equal(u.recorded, "loading");
    assert_int_equal(journal_workers_list(j, keep_worker, w), 0);
    assert_string_equal(w, "unknown interrupted 0");
    journal_close(j);
    while (waitpid(-1, NULL, 0) > 0)
        ;

    /* A writer records it, once. */
    assert_int_equal(journal_open(&j, f->path, NULL, err, sizeof err), 0);
    assert_int_equal(journal_interrupted_on_open(j), 1);
    jt_update_get(j, id, &u);
    assert_string_equal(u.recorded, "interrupted");
    assert_true(jt_has(u.error, "no longer runs"));
    journal_close(j);
    char *h = jt_sql_text(f->path, "SELECT health FROM workers");
    assert_string_equal(h, "unknown");
    free(h);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM events WHERE "
                     "kind = 'interrupted'"), 1);
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM "
                     "health_transitions WHERE from_health = 'updating' AND "
                     "to_health = 'unknown'"), 1);
    /* The module that arrived before the kill is still known. */
    assert_int_equal(jt_sql_int(f->path, "SELECT count(*) FROM modules WHERE"
                     " state = 'complete'"), 1);
    assert_int_equal(journal_open(&j, f->path, NULL, err, sizeof err), 0);
    assert_int_equal(journal_interrupted_on_open(j), 0);
    journal_close(j);
}

/* Another host, or a reused pid, is no live writer either. */
static void test_interrupted_host_and_pid(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    char err[256];
    jt_modules_make(&m, 2);
    journal *j = jt_open(f->path);
    int64_t a = jt_begin(j, &m, "a");
    journal_close(j);
    jt_sql_exec(f->path, "UPDATE updates SET host = 'elsewhere' WHERE id = 1");
    j = jt_open(f->path);
    assert_int_equal(journal_interrupted_on_open(j), 1);
    int64_t b = jt_begin(j, &m, "b");
    /* Our own pid, alive, but with another start time: a reused pid. */
    journal_close(j);
    jt_sql_exec(f->path, "UPDATE updates SET pid_start = 1 WHERE id = 2");
    assert_int_equal(journal_open(&j, f->path, NULL, err, sizeof err), 0);
    assert_int_equal(journal_interrupted_on_open(j), 1);
    jt_update u;
    jt_update_get(j, a, &u);
    assert_string_equal(u.state, "interrupted");
    jt_update_get(j, b, &u);
    assert_string_equal(u.state, "interrupted");
    journal_close(j);
    jt_modules_free(&m);
}

/* An update open in this (live) process is not interrupted by a reopen. */
static void test_live_writer_kept(void **state)
{
    jt_fixture *f = *state;
    jt_modules m;
    jt_modules_make(&m, 2);
    journal *j = jt_open(f->path);
    int64_t id = jt_begin(j, &m, "a");
    journal *k = NULL; /* another handle (not worker w0: that one is live) */
    char err[512];
    assert_int_equal(journal_open(&k, f->path, NULL, err, sizeof err), REFIT_OK);
    assert_int_equal(journal_interrupted_on_open(k), 0);
    jt_update u;
    jt_update_get(k, id, &u);
    assert_string_equal(u.state, "loading");
    journal_close(k);
    journal_close(j);
    jt_modules_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create, jt_setup, jt_teardown),
        cmocka_unit_test_setup_teardown(test_commit_path, jt_setup,
                                        jt_teardown),
        cmocka_unit_test_setup_teardown(test_final_states, jt_setup,
                                        jt_teardown),
        cmocka_unit_test_setup_teardown(test_bad_calls, jt_setup, jt_teardown),
        cmocka_unit_test_setup_teardown(test_plans_and_partials, jt_setup,
                                        jt_teardown),
        cmocka_unit_test_setup_teardown(test_events_health, jt_setup,
                                        jt_teardown),
        cmocka_unit_test_setup_teardown(test_interrupted_sigkill, jt_setup,
                                        jt_teardown),
        cmocka_unit_test_setup_teardown(test_interrupted_host_and_pid,
                                        jt_setup, jt_teardown),
        cmocka_unit_test_setup_teardown(test_live_writer_kept, jt_setup,
                                        jt_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
