/*
 * Journal schema: the SQL of each version and the forward migration.
 *
 * PRAGMA application_id marks a file as a refit journal; PRAGMA
 * user_version is the schema version. A migration step takes a file from
 * version N-1 to N; journal_open runs every step above the file's version
 * in one transaction, so a file is always at one whole version. To change
 * the schema: append a step, bump JOURNAL_SCHEMA_VERSION, add the new
 * tables/columns to `expected` below and to docs/journal.md. Never edit a
 * step that has shipped.
 */
#include <stdio.h>
#include <string.h>

#include "journal/journal_int.h"

/* Version 1. States are CHECKed so that a bad writer fails loudly instead
 * of leaving a row refitctl cannot explain. Times are ISO 8601 UTC text:
 * readable in plain sqlite3, sortable, understood by SQLite's date
 * functions.
 *
 * Module state is stored compactly because a row per module per update
 * costs 1.5-5 us per row written (measured: 10,000 modules took 50-170 ms
 * per update, against a budget of a few ms):
 *   plans / plan_modules   the module list (name, expected counts), written
 *                          once per distinct plan, shared by its updates;
 *   module_chunks          per update, 256 modules per row: one state
 *                          letter per module (TEXT) and, after finalize,
 *                          9 bytes per module (presence, big-endian u64);
 *   module_received        per update, rows only for modules whose received
 *                          counts are not the obvious ones (0 when pending,
 *                          expected otherwise): partial deliveries;
 *   modules (view)         one row per module per update, for refitctl and
 *                          for operators in plain sqlite3. */
#define JOURNAL_STATE_LETTERS                                                  \
    " CASE substr(c.states, m.idx % 256 + 1, 1) WHEN '.' THEN 'pending'"      \
    " WHEN 'p' THEN 'partial' WHEN 'c' THEN 'complete'"                        \
    " WHEN 'C' THEN 'committed' WHEN 'r' THEN 'rolled_back'"                   \
    " WHEN 'X' THEN 'poisoned' END"
static const char schema_v1[] =
    "CREATE TABLE workers ("
    " id TEXT PRIMARY KEY NOT NULL,"
    " rank INTEGER NOT NULL,"
    " pid INTEGER NOT NULL,"
    " pid_start INTEGER,"
    " host TEXT NOT NULL,"
    " health TEXT NOT NULL DEFAULT 'unknown',"
    " version TEXT,"
    " heartbeat TEXT NOT NULL);"
    "CREATE TABLE plans ("
    " id INTEGER PRIMARY KEY,"
    " digest TEXT NOT NULL UNIQUE,"
    " n_modules INTEGER NOT NULL,"
    " created_at TEXT NOT NULL);"
    "CREATE TABLE plan_modules ("
    " plan_id INTEGER NOT NULL REFERENCES plans(id) ON DELETE CASCADE,"
    " idx INTEGER NOT NULL,"
    " name TEXT NOT NULL,"
    " expected_tensors INTEGER NOT NULL,"
    " expected_bytes INTEGER NOT NULL,"
    " PRIMARY KEY (plan_id, idx)) WITHOUT ROWID;"
    "CREATE TABLE updates ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " worker TEXT NOT NULL REFERENCES workers(id),"
    " version TEXT,"
    " source_uri TEXT,"
    " source_digest TEXT,"
    " mode TEXT NOT NULL CHECK (mode IN ('normal', 'replay')),"
    " replay_of INTEGER REFERENCES updates(id),"
    " rollback_on INTEGER NOT NULL CHECK (rollback_on IN (0, 1)),"
    " state TEXT NOT NULL CHECK (state IN ('loading', 'finalizing',"
    "  'committed', 'aborted', 'rolled_back', 'failed', 'interrupted')),"
    " started_at TEXT NOT NULL,"
    " ended_at TEXT,"
    " bytes INTEGER NOT NULL DEFAULT 0,"
    " tensors INTEGER NOT NULL DEFAULT 0,"
    " error TEXT,"
    " plan_id INTEGER NOT NULL REFERENCES plans(id),"
    " n_modules INTEGER NOT NULL,"
    " pid INTEGER NOT NULL,"
    " pid_start INTEGER,"
    " host TEXT NOT NULL,"
    " CHECK ((mode = 'replay') = (replay_of IS NOT NULL)));"
    "CREATE INDEX updates_by_worker ON updates(worker, id);"
    "CREATE INDEX updates_open ON updates(state)"
    " WHERE state IN ('loading', 'finalizing');"
    "CREATE TABLE module_chunks ("
    " update_id INTEGER NOT NULL REFERENCES updates(id) ON DELETE CASCADE,"
    " chunk INTEGER NOT NULL,"
    " states TEXT NOT NULL,"
    " fingerprints BLOB,"
    " PRIMARY KEY (update_id, chunk));"
    "CREATE TABLE module_received ("
    " update_id INTEGER NOT NULL REFERENCES updates(id) ON DELETE CASCADE,"
    " idx INTEGER NOT NULL,"
    " received_tensors INTEGER NOT NULL,"
    " received_bytes INTEGER NOT NULL,"
    " PRIMARY KEY (update_id, idx)) WITHOUT ROWID;"
    "CREATE VIEW modules AS SELECT"
    " u.id AS update_id, m.idx AS idx, m.name AS name,"
    JOURNAL_STATE_LETTERS " AS state,"
    " m.expected_tensors AS expected_tensors,"
    " coalesce(r.received_tensors, CASE substr(c.states, m.idx % 256 + 1, 1)"
    "  WHEN '.' THEN 0 ELSE m.expected_tensors END) AS received_tensors,"
    " m.expected_bytes AS expected_bytes,"
    " coalesce(r.received_bytes, CASE substr(c.states, m.idx % 256 + 1, 1)"
    "  WHEN '.' THEN 0 ELSE m.expected_bytes END) AS received_bytes,"
    " CASE substr(c.fingerprints, (m.idx % 256) * 9 + 1, 1) WHEN x'01'"
    "  THEN lower(hex(substr(c.fingerprints, (m.idx % 256) * 9 + 2, 8)))"
    "  END AS fingerprint"
    " FROM updates u"
    " JOIN plan_modules m ON m.plan_id = u.plan_id"
    " JOIN module_chunks c ON c.update_id = u.id AND c.chunk = m.idx / 256"
    " LEFT JOIN module_received r ON r.update_id = u.id AND r.idx = m.idx;"
    "CREATE TABLE health_transitions ("
    " id INTEGER PRIMARY KEY,"
    " worker TEXT NOT NULL REFERENCES workers(id),"
    " at TEXT NOT NULL,"
    " from_health TEXT,"
    " to_health TEXT NOT NULL,"
    " reason TEXT,"
    " version TEXT);"
    "CREATE TABLE events ("
    " id INTEGER PRIMARY KEY,"
    " at TEXT NOT NULL,"
    " update_id INTEGER REFERENCES updates(id) ON DELETE CASCADE,"
    " worker TEXT,"
    " kind TEXT NOT NULL,"
    " message TEXT NOT NULL);"
    "CREATE INDEX events_by_update ON events(update_id)"
    " WHERE update_id IS NOT NULL;";

/* Version 2: an update's module_chunks rows are written when its modules
 * first change, not at begin (a missing row is 256 pending modules), so a
 * begin writes the same few rows whatever the model's size. */
#define JOURNAL_STATE_LETTER_V2 "coalesce(substr(c.states, m.idx % 256 + 1, 1), '.')"
static const char schema_v2[] =
    "DROP VIEW modules;"
    "CREATE VIEW modules AS SELECT"
    " u.id AS update_id, m.idx AS idx, m.name AS name,"
    " CASE " JOURNAL_STATE_LETTER_V2 " WHEN '.' THEN 'pending'"
    " WHEN 'p' THEN 'partial' WHEN 'c' THEN 'complete'"
    " WHEN 'C' THEN 'committed' WHEN 'r' THEN 'rolled_back'"
    " WHEN 'X' THEN 'poisoned' END AS state,"
    " m.expected_tensors AS expected_tensors,"
    " coalesce(r.received_tensors, CASE " JOURNAL_STATE_LETTER_V2
    "  WHEN '.' THEN 0 ELSE m.expected_tensors END) AS received_tensors,"
    " m.expected_bytes AS expected_bytes,"
    " coalesce(r.received_bytes, CASE " JOURNAL_STATE_LETTER_V2
    "  WHEN '.' THEN 0 ELSE m.expected_bytes END) AS received_bytes,"
    " CASE substr(c.fingerprints, (m.idx % 256) * 9 + 1, 1) WHEN x'01'"
    "  THEN lower(hex(substr(c.fingerprints, (m.idx % 256) * 9 + 2, 8)))"
    "  END AS fingerprint"
    " FROM updates u"
    " JOIN plan_modules m ON m.plan_id = u.plan_id"
    " LEFT JOIN module_chunks c ON c.update_id = u.id AND c.chunk = m.idx / 256"
    " LEFT JOIN module_received r ON r.update_id = u.id AND r.idx = m.idx;";

/* Version 3: an update's scope. 1: a partial update (a delta): the
 * modules it did not deliver kept their bytes and version. */
static const char schema_v3[] =
    "ALTER TABLE updates ADD COLUMN partial INTEGER NOT NULL DEFAULT 0"
    " CHECK (partial IN (0, 1));";

/* Version 4: where the undo log of an update kept its bytes (device memory
 * within the context's undo_device_budget, host memory for the rest),
 * written with the update's end; NULL for updates recorded before. */
static const char schema_v4[] =
    "ALTER TABLE updates ADD COLUMN undo_device_bytes INTEGER;"
    "ALTER TABLE updates ADD COLUMN undo_host_bytes INTEGER;";

/* Version 5: delta updates (docs/core.md "Delta updates"): the base
 * version a delta update patched (NULL: not a delta), the elements its
 * patches changed, and each patched tensor with its elements. */
static const char schema_v5[] =
    "ALTER TABLE updates ADD COLUMN base_version TEXT;"
    "ALTER TABLE updates ADD COLUMN delta_elements INTEGER;"
    "CREATE TABLE delta_tensors ("
    " update_id INTEGER NOT NULL REFERENCES updates(id) ON DELETE CASCADE,"
    " name TEXT NOT NULL,"
    " elements INTEGER NOT NULL,"
    " PRIMARY KEY (update_id, name)) WITHOUT ROWID;";

/* Version 6: what served an update's rollback (docs/core.md "Undo
 * sources"): "undo-log" (with what was passed over and why), "files URI",
 * "snapshot URI", "none" (rollback off); written with the update's end,
 * NULL for updates recorded before. */
static const char schema_v6[] =
    "ALTER TABLE updates ADD COLUMN undo_source TEXT;";

/* The steps; steps[i] takes the file to version i + 1. */
static const char *const steps[] = {schema_v1, schema_v2, schema_v3, schema_v4, schema_v5,
                                    schema_v6};
_Static_assert(sizeof steps / sizeof steps[0] == JOURNAL_SCHEMA_VERSION,
               "one migration step per schema version");

/* What the current version must contain, for verify: table, columns. */
static const struct {
    const char *table;
    const char *columns;
} expected[] = {
    {"workers", "id rank pid pid_start host health version heartbeat"},
    {"plans", "id digest n_modules created_at"},
    {"plan_modules", "plan_id idx name expected_tensors expected_bytes"},
    {"updates", "id worker version source_uri source_digest mode replay_of "
                "rollback_on state started_at ended_at bytes tensors error "
                "plan_id n_modules pid pid_start host partial undo_device_bytes "
                "undo_host_bytes base_version delta_elements undo_source"},
    {"delta_tensors", "update_id name elements"},
    {"module_chunks", "update_id chunk states fingerprints"},
    {"module_received", "update_id idx received_tensors received_bytes"},
    {"modules", "update_id idx name state expected_tensors received_tensors "
                "expected_bytes received_bytes fingerprint"},
    {"health_transitions", "id worker at from_health to_health reason "
                           "version"},
    {"events", "id at update_id worker kind message"},
};

static int pragma_int(journal *j, const char *sql, int64_t *out)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(j->db, sql, -1, &s, NULL);
    if (rc == SQLITE_OK && (rc = jr_step(j, s)) == SQLITE_ROW) {
        *out = sqlite3_column_int64(s, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    return rc;
}

/* Decide whether the file is ours. *need_migrate: OUT, 1 when the file is
 * new (empty) or older than this code. */
int jr_schema_check(journal *j, int *need_migrate)
{
    int64_t app = 0, ver = 0, objects = 0;
    *need_migrate = 0;
    /* The first read of the file: "file is not a database" shows here. */
    if (pragma_int(j, "PRAGMA application_id", &app) != SQLITE_OK ||
        pragma_int(j, "PRAGMA user_version", &ver) != SQLITE_OK ||
        pragma_int(j, "SELECT count(*) FROM sqlite_schema", &objects) !=
            SQLITE_OK)
        return jr_fail_sqlite(j, "reading the schema");
    if (app == 0 && ver == 0 && objects == 0) {
        *need_migrate = 1;
        return REFIT_OK;
    }
    if (app != JOURNAL_APPLICATION_ID)
        return jr_fail(j, REFIT_EJOURNAL,
                       "journal %s: not a refit journal (a SQLite database "
                       "with application_id 0x%08llx, not 0x%08x, and %lld "
                       "schema objects); refusing to touch it",
                       j->path, (unsigned long long)(uint32_t)app,
                       JOURNAL_APPLICATION_ID, (long long)objects);
    if (ver > JOURNAL_SCHEMA_VERSION)
        return jr_fail(j, REFIT_EJOURNAL,
                       "journal %s: schema version %lld is newer than this "
                       "refit understands (%d); use a newer refit",
                       j->path, (long long)ver, JOURNAL_SCHEMA_VERSION);
    if (ver < JOURNAL_SCHEMA_VERSION)
        *need_migrate = 1;
    return REFIT_OK;
}

/* Run every step above the file's version in one transaction. Re-reads the
 * version inside it: another process may have migrated meanwhile. */
int jr_schema_migrate(journal *j)
{
    int64_t app = 0, ver = 0;
    int rc = jr_tx_begin(j, "migrating the schema");
    if (rc != REFIT_OK)
        return rc;
    if (pragma_int(j, "PRAGMA application_id", &app) != SQLITE_OK ||
        pragma_int(j, "PRAGMA user_version", &ver) != SQLITE_OK)
        return jr_fail_sqlite(j, "reading the schema version");
    if (app != 0 && app != JOURNAL_APPLICATION_ID) {
        jr_tx_rollback(j);
        return jr_fail(j, REFIT_EJOURNAL, "journal %s: became a foreign "
                       "database while opening", j->path);
    }
    for (int64_t v = ver; v < JOURNAL_SCHEMA_VERSION; v++) {
        char what[64];
        snprintf(what, sizeof what, "migrating the schema to version %lld",
                 (long long)v + 1);
        if (sqlite3_exec(j->db, steps[v], NULL, NULL, NULL) != SQLITE_OK)
            return jr_fail_sqlite(j, what);
    }
    char sql[96];
    snprintf(sql, sizeof sql, "PRAGMA application_id = %d; "
             "PRAGMA user_version = %d", JOURNAL_APPLICATION_ID,
             JOURNAL_SCHEMA_VERSION);
    if (sqlite3_exec(j->db, sql, NULL, NULL, NULL) != SQLITE_OK)
        return jr_fail_sqlite(j, "setting the schema version");
    return jr_tx_commit(j, "migrating the schema");
}

/* 1 when `column` is one of the space-separated names in list. */
static int in_list(const char *list, const char *column)
{
    size_t n = strlen(column);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, " ");
        if (len == n && !strncmp(p, column, n))
            return 1;
        p += len;
        p += strspn(p, " ");
    }
    return 0;
}

/* Report `name` from list a that is not in list b. */
static int list_diff(const char *a, const char *b, const char *table,
                     const char *fmt, journal_problem_fn fn, void *user)
{
    char name[64], msg[256];
    int problems = 0;
    for (const char *p = a; *p;) {
        size_t len = strcspn(p, " ");
        snprintf(name, sizeof name, "%.*s", (int)len, p);
        if (!in_list(b, name)) {
            snprintf(msg, sizeof msg, fmt, table, name);
            fn(user, msg);
            problems++;
        }
        p += len;
        p += strspn(p, " ");
    }
    return problems;
}

/* Columns of table missing from the file or unknown to this code. */
static int verify_table(journal *j, size_t t, journal_problem_fn fn,
                        void *user)
{
    char sql[128], have[1024] = "";
    size_t used = 0;
    sqlite3_stmt *s = NULL;
    int rc;
    snprintf(sql, sizeof sql, "SELECT name FROM pragma_table_info('%s')",
             expected[t].table);
    if (sqlite3_prepare_v2(j->db, sql, -1, &s, NULL) != SQLITE_OK)
        return -1;
    while ((rc = jr_step(j, s)) == SQLITE_ROW) {
        const char *col = (const char *)sqlite3_column_text(s, 0);
        int n = snprintf(have + used, sizeof have - used, "%s%s",
                         used ? " " : "", col ? col : "?");
        if (n > 0 && (size_t)n < sizeof have - used)
            used += (size_t)n;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return -1;
    if (!used) {
        char msg[128];
        snprintf(msg, sizeof msg, "table %s is missing", expected[t].table);
        fn(user, msg);
        return 1;
    }
    return list_diff(expected[t].columns, have, expected[t].table,
                     "table %s: column %s is missing", fn, user) +
           list_diff(have, expected[t].columns, expected[t].table,
                     "table %s: unexpected column %s", fn, user);
}

int jr_schema_verify(journal *j, journal_problem_fn fn, void *user)
{
    int64_t app = 0, ver = 0;
    int problems = 0;
    char msg[160];
    if (pragma_int(j, "PRAGMA application_id", &app) != SQLITE_OK ||
        pragma_int(j, "PRAGMA user_version", &ver) != SQLITE_OK)
        return -1;
    if (app != JOURNAL_APPLICATION_ID) {
        snprintf(msg, sizeof msg, "application_id is 0x%08llx, not 0x%08x",
                 (unsigned long long)(uint32_t)app, JOURNAL_APPLICATION_ID);
        fn(user, msg);
        problems++;
    }
    if (ver != JOURNAL_SCHEMA_VERSION) {
        snprintf(msg, sizeof msg, "schema version is %lld, not %d",
                 (long long)ver, JOURNAL_SCHEMA_VERSION);
        fn(user, msg);
        problems++;
    }
    for (size_t t = 0; t < sizeof expected / sizeof expected[0]; t++) {
        int n = verify_table(j, t, fn, user);
        if (n < 0)
            return -1;
        problems += n;
    }
    return problems;
}
