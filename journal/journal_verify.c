/*
 * journal_verify: what `refitctl journal verify` reports. SQLite's own
 * checks (integrity_check, foreign_key_check), the schema against what
 * this code expects, then rules no CHECK constraint can express.
 */
#include <stdio.h>
#include <string.h>

#include "journal/journal_int.h"

/* Pass each line of text as a problem: integrity_check packs several
 * lines into one row, behind a "*** in database main ***" header. A line
 * longer than 511 bytes is reported cut there. */
static void report(const char *text, journal_problem_fn fn, void *user,
                   size_t *n)
{
    char line[512];
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, "\n"), keep = len < sizeof line ? len : sizeof line - 1;
        memcpy(line, p, keep);
        line[keep] = '\0';
        if (len && strncmp(line, "*** ", 4) != 0) {
            fn(user, line);
            (*n)++;
        }
        p += len;
        p += strspn(p, "\n");
    }
}

/* Rows of a query, each a problem: the row's first column is the text. A
 * check that cannot run (a damaged file) is a problem too. */
static void each_problem(journal *j, const char *sql, const char *ok,
                         journal_problem_fn fn, void *user, size_t *n)
{
    sqlite3_stmt *s = NULL;
    char msg[512];
    int rc = sqlite3_prepare_v2(j->db, sql, -1, &s, NULL);
    while (rc == SQLITE_OK && (rc = jr_step(j, s)) == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(s, 0);
        rc = SQLITE_OK;
        if (!ok || !t || strcmp(t, ok))
            report(t ? t : "(null)", fn, user, n);
    }
    if (rc != SQLITE_DONE) {
        snprintf(msg, sizeof msg, "a check could not run: %s (sqlite %d)",
                 sqlite3_errmsg(j->db), sqlite3_extended_errcode(j->db));
        fn(user, msg);
        (*n)++;
    }
    sqlite3_finalize(s);
    j->last_rc = 0;
}

/* Consistency rules, each a query yielding one message per offending row. */
static const char *const rules[] = {
    "SELECT 'plan ' || p.id || ': ' || count(m.idx) || ' module rows, "
    "n_modules says ' || p.n_modules FROM plans p LEFT JOIN plan_modules m "
    "ON m.plan_id = p.id GROUP BY p.id HAVING count(m.idx) != p.n_modules",
    "SELECT 'update ' || u.id || ': n_modules ' || u.n_modules || ' but its "
    "plan has ' || p.n_modules FROM updates u JOIN plans p ON p.id = "
    "u.plan_id WHERE u.n_modules != p.n_modules",
    "SELECT 'update ' || u.id || ': ' || count(c.chunk) || ' module chunks "
    "for ' || u.n_modules || ' modules' FROM updates u LEFT JOIN "
    "module_chunks c ON c.update_id = u.id GROUP BY u.id HAVING "
    "count(c.chunk) > (u.n_modules + 255) / 256",
    "SELECT 'update ' || c.update_id || ' chunk ' || c.chunk || ': bad "
    "states or fingerprints' FROM module_chunks c JOIN updates u ON u.id = "
    "c.update_id WHERE length(c.states) != min(256, u.n_modules - c.chunk * "
    "256) OR c.states GLOB '*[^.pcCrX]*' OR (c.fingerprints IS NOT NULL AND "
    "length(c.fingerprints) != 9 * length(c.states))",
    "SELECT 'update ' || r.update_id || ': received counts for module ' || "
    "r.idx || ' beyond its ' || u.n_modules || ' modules' FROM "
    "module_received r JOIN updates u ON u.id = r.update_id WHERE r.idx >= "
    "u.n_modules",
    "SELECT 'update ' || update_id || ' module ' || name || ': received ' || "
    "received_tensors || ' of ' || expected_tensors || ' tensors' FROM "
    "modules WHERE received_tensors > expected_tensors",
    "SELECT 'update ' || u.id || ' is committed but module ' || m.name || "
    "' is ' || m.state FROM updates u JOIN modules m ON m.update_id = u.id "
    "WHERE u.state = 'committed' AND m.state IN ('partial', 'poisoned', "
    "'rolled_back')",
    "SELECT 'update ' || id || ' is ' || state || ' but has no end time' "
    "FROM updates WHERE state NOT IN ('loading', 'finalizing') AND "
    "ended_at IS NULL",
};

int journal_verify(journal *j, journal_problem_fn fn, void *user,
                   size_t *n_problems)
{
    size_t n = 0;
    if (!j || !fn || !n_problems)
        return REFIT_EINVAL;
    each_problem(j, "PRAGMA integrity_check", "ok", fn, user, &n);
    each_problem(j, "SELECT 'foreign key: ' || \"table\" || ' row ' || "
                 "coalesce(rowid, '?') || ' references a missing ' || parent "
                 "FROM pragma_foreign_key_check", NULL, fn, user, &n);
    int schema = jr_schema_verify(j, fn, user);
    if (schema < 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "the schema could not be read: %s",
                 sqlite3_errmsg(j->db));
        fn(user, msg);
        n++;
    } else {
        n += (size_t)schema;
    }
    /* The rules read the tables the schema check found; with the schema
     * wrong they would only fail. */
    for (size_t i = 0; !schema && i < sizeof rules / sizeof *rules; i++)
        each_problem(j, rules[i], NULL, fn, user, &n);
    *n_problems = n;
    return REFIT_OK;
}
