/* Helpers shared by the journal tests. */
#ifndef REFIT_TESTS_JOURNAL_JTEST_H
#define REFIT_TESTS_JOURNAL_JTEST_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "journal/journal.h"

/* A fresh directory per test and a journal path inside it. */
typedef struct jt_fixture {
    char dir[256];
    char path[300];
} jt_fixture;

int jt_setup(void **state);
int jt_teardown(void **state);

/* path = dir/name. */
void jt_join(char *out, size_t len, const char *dir, const char *name);

/* Module lists: names "model.layers.L.mlp.experts.E", 2 tensors each. */
typedef struct jt_modules {
    size_t n;
    journal_module_info *info;
    char *names;
} jt_modules;
void jt_modules_make(jt_modules *m, size_t n);
void jt_modules_free(jt_modules *m);

/* Open read-write (asserting success), register worker "w0". */
journal *jt_open(const char *path);
/* Begin an update of m for worker "w0" (version label v). */
int64_t jt_begin(journal *j, const jt_modules *m, const char *v);

/* One integer / one text (strdup'ed, NULL for NULL) from SQL on a plain
 * SQLite connection to path. */
int64_t jt_sql_int(const char *path, const char *sql);
char *jt_sql_text(const char *path, const char *sql);
/* Run SQL on a plain connection; asserts success. */
void jt_sql_exec(const char *path, const char *sql);

/* Recorded and effective state of an update (through the read API). */
typedef struct jt_update {
    char state[32], recorded[32], mode[16], error[256], version[64];
    int64_t replay_of, n_modules;
    uint64_t bytes, tensors;
    int rollback;
} jt_update;
void jt_update_get(journal *j, int64_t id, jt_update *out);

/* Run fn(arg) in a child process as an unprivileged user (root bypasses
 * file permissions); returns the child's exit status, or -1. */
int jt_as_nobody(int (*fn)(void *arg), void *arg);

/* 1 when s contains needle. */
int jt_has(const char *s, const char *needle);

#endif
