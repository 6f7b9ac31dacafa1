/* Helpers shared by the journal tests. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "jtest.h"

int jt_setup(void **state)
{
    jt_fixture *f = calloc(1, sizeof *f);
    const char *tmp = getenv("TMPDIR");
    if (!f)
        return -1;
    snprintf(f->dir, sizeof f->dir, "%s/refit-journal-XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(f->dir)) {
        free(f);
        return -1;
    }
    jt_join(f->path, sizeof f->path, f->dir, "j.db");
    *state = f;
    return 0;
}

int jt_teardown(void **state)
{
    jt_fixture *f = *state;
    DIR *d = opendir(f->dir);
    struct dirent *e;
    char p[600];
    chmod(f->dir, 0700);
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", f->dir, e->d_name);
        unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(f->dir);
    free(f);
    return 0;
}

void jt_join(char *out, size_t len, const char *dir, const char *name)
{
    snprintf(out, len, "%s/%s", dir, name);
}

void jt_modules_make(jt_modules *m, size_t n)
{
    const size_t w = 48;
    m->n = n;
    m->info = calloc(n ? n : 1, sizeof *m->info);
    m->names = calloc(n ? n : 1, w);
    assert_non_null(m->info);
    assert_non_null(m->names);
    for (size_t i = 0; i < n; i++) {
        char *name = m->names + i * w;
        snprintf(name, w, "model.layers.%zu.mlp.experts.%zu", i / 64, i % 64);
        m->info[i] = (journal_module_info){name, 2, 2 * 4096};
    }
}

void jt_modules_free(jt_modules *m)
{
    free(m->info);
    free(m->names);
}

journal *jt_open(const char *path)
{
    journal *j = NULL;
    char err[512];
    int rc = journal_open(&j, path, NULL, err, sizeof err);
    if (rc != REFIT_OK)
        fail_msg("journal_open: %s", err);
    assert_int_equal(journal_worker_register(j, "w0", 0), REFIT_OK);
    return j;
}

int64_t jt_begin(journal *j, const jt_modules *m, const char *v)
{
    journal_update_info info = {
        .worker_id = "w0", .version = v, .source_uri = "file:///ckpt",
        .source_digest = "sha256:abc", .rollback = 1};
    int64_t id = 0;
    int rc = journal_update_begin(j, &id, &info, m->n, m->info);
    if (rc != REFIT_OK)
        fail_msg("update_begin: %s", journal_errmsg(j));
    assert_true(id > 0);
    return id;
}

static sqlite3 *raw_open(const char *path)
{
    sqlite3 *db = NULL;
    if (sqlite3_open(path, &db) != SQLITE_OK)
        fail_msg("sqlite3_open %s: %s", path, sqlite3_errmsg(db));
    sqlite3_busy_timeout(db, 2000);
    return db;
}

int64_t jt_sql_int(const char *path, const char *sql)
{
    sqlite3 *db = raw_open(path);
    sqlite3_stmt *s = NULL;
    int64_t v = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(db));
    if (sqlite3_step(s) == SQLITE_ROW)
        v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

char *jt_sql_text(const char *path, const char *sql)
{
    sqlite3 *db = raw_open(path);
    sqlite3_stmt *s = NULL;
    char *v = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(db));
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0))
        v = strdup((const char *)sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

void jt_sql_exec(const char *path, const char *sql)
{
    sqlite3 *db = raw_open(path);
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
        fail_msg("%s: %s", sql, err ? err : "?");
    sqlite3_close(db);
}

static int keep_update(void *user, const journal_update_row *r)
{
    jt_update *u = user;
    snprintf(u->state, sizeof u->state, "%s", r->state);
    snprintf(u->recorded, sizeof u->recorded, "%s", r->state_recorded);
    snprintf(u->mode, sizeof u->mode, "%s", r->mode);
    snprintf(u->error, sizeof u->error, "%s", r->error ? r->error : "");
    snprintf(u->version, sizeof u->version, "%s",
             r->version ? r->version : "");
    u->replay_of = r->replay_of;
    u->n_modules = r->n_modules;
    u->bytes = r->bytes;
    u->tensors = r->tensors;
    u->rollback = r->rollback;
    return 0;
}

void jt_update_get(journal *j, int64_t id, jt_update *out)
{
    memset(out, 0, sizeof *out);
    int rc = journal_update_get(j, id, keep_update, out);
    if (rc != REFIT_OK)
        fail_msg("update_get %lld: %s", (long long)id, journal_errmsg(j));
}

int jt_as_nobody(int (*fn)(void *arg), void *arg)
{
    int status = 0;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* A crash must end the child, not return into cmocka's runner. */
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        signal(SIGABRT, SIG_DFL);
        signal(SIGILL, SIG_DFL);
        signal(SIGFPE, SIG_DFL);
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
            _exit(100);
        _exit(fn(arg));
    }
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

int jt_has(const char *s, const char *needle)
{
    return s && needle && strstr(s, needle) != NULL;
}
