/* journal internals shared by journal.c, journal_write.c, journal_read.c. */
#ifndef REFIT_JOURNAL_JOURNAL_INT_H
#define REFIT_JOURNAL_JOURNAL_INT_H

#include <sqlite3.h>

#include "journal/journal.h"

/* Cached write statements: prepared on first use, finalized at close, so a
 * batch costs one bind/step/reset per row and no SQL compilation. */
#define JOURNAL_STMT_TABLE(X)                                                  \
    X(BEGIN, "BEGIN IMMEDIATE")                                                \
    X(COMMIT, "COMMIT")                                                        \
    X(ROLLBACK, "ROLLBACK")                                                    \
    X(WORKER_UPSERT,                                                           \
      "INSERT INTO workers(id, rank, pid, pid_start, host, heartbeat)"         \
      " VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(id) DO UPDATE SET"         \
      " rank = ?2, pid = ?3, pid_start = ?4, host = ?5, heartbeat = ?6")       \
    X(HEARTBEAT, "UPDATE workers SET heartbeat = ?2 WHERE id = ?1")            \
    X(WORKER_HEALTH,                                                           \
      "UPDATE workers SET health = ?2, version = coalesce(?3, version),"       \
      " heartbeat = ?4 WHERE id = ?1")                                         \
    X(HEALTH_INSERT,                                                           \
      "INSERT INTO health_transitions(worker, at, from_health, to_health,"    \
      " reason, version) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")                     \
    X(PLAN_FIND, "SELECT id, n_modules FROM plans WHERE digest = ?1")         \
    X(PLAN_CHECK, "SELECT n_modules FROM plans WHERE id = ?1")                 \
    X(PLAN_INSERT,                                                             \
      "INSERT INTO plans(digest, n_modules, created_at) VALUES (?1, ?2, ?3)")  \
    X(PLAN_MODULE_INSERT,                                                      \
      "INSERT INTO plan_modules(plan_id, idx, name, expected_tensors,"         \
      " expected_bytes) VALUES (?1, ?2, ?3, ?4, ?5)")                          \
    X(UPDATE_INSERT,                                                           \
      "INSERT INTO updates(worker, version, source_uri, source_digest, mode,"  \
      " replay_of, rollback_on, state, started_at, plan_id, n_modules, pid,"   \
      " pid_start, host, partial, base_version) VALUES (?1, ?2, ?3, ?4, ?5,"   \
      " ?6, ?7, 'loading', ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)")             \
    X(CHUNK_WRITE,                                                             \
      "INSERT INTO module_chunks(update_id, chunk, states, fingerprints)"      \
      " VALUES (?1, ?2, ?3, ?4) ON CONFLICT(update_id, chunk)"                 \
      " DO UPDATE SET states = ?3, fingerprints = ?4")                         \
    X(RECEIVED_UPSERT,                                                         \
      "INSERT INTO module_received(update_id, idx, received_tensors,"          \
      " received_bytes) VALUES (?1, ?2, ?3, ?4) ON CONFLICT(update_id, idx)"   \
      " DO UPDATE SET received_tensors = ?3, received_bytes = ?4")             \
    X(RECEIVED_DELETE,                                                         \
      "DELETE FROM module_received WHERE update_id = ?1 AND idx = ?2")         \
    X(RECEIVED_CLEAR, "DELETE FROM module_received WHERE update_id = ?1")      \
    X(UPDATE_ABANDON,                                                          \
      "UPDATE updates SET state = 'interrupted', ended_at = ?2,"              \
      " error = coalesce(error, ?3) WHERE id = ?1"                             \
      " AND state IN ('loading', 'finalizing')")                               \
    X(UPDATE_STATE,                                                            \
      "UPDATE updates SET state = ?2 WHERE id = ?1"                            \
      " AND state IN ('loading', 'finalizing')")                               \
    X(UPDATE_END,                                                              \
      "UPDATE updates SET state = ?2, bytes = ?3, tensors = ?4, error = ?5,"   \
      " ended_at = ?6, undo_device_bytes = ?7, undo_host_bytes = ?8,"          \
      " undo_source = ?9"                                                      \
      " WHERE id = ?1 AND state IN ('loading', 'finalizing')")                 \
    X(EVENT_INSERT,                                                            \
      "INSERT INTO events(at, update_id, worker, kind, message)"               \
      " VALUES (?1, ?2, ?3, ?4, ?5)")

enum journal_stmt_id {
#define JOURNAL_X_(name, sql) JS_##name,
    JOURNAL_STMT_TABLE(JOURNAL_X_)
#undef JOURNAL_X_
    JS_COUNT
};

/* Modules per module_chunks row; the SQL of the modules view (journal_
 * schema.c) spells the same number. 256 keeps a row (256 letters, 256 x 9
 * fingerprint bytes) inside one 4 KiB page. */
#define JOURNAL_CHUNK 256
/* Bytes per module in module_chunks.fingerprints: presence, then the
 * fingerprint big-endian (so hex() of the 8 bytes reads as the number). */
#define JOURNAL_FP_BYTES 9

/* Per-chunk flags of the open update. */
#define JR_CHUNK_DIRTY 0x1u  /* memory differs from the row */
#define JR_CHUNK_FP 0x2u     /* some module of the chunk has a fingerprint */
/* Per-module flags. */
#define JR_MOD_ROW 0x1u      /* a module_received row exists */

/* The update open on this handle, in memory: the truth of what the core
 * reported. Each write transaction sends the part that changed; after a
 * failed one (resync) the next rewrites everything, so a lost batch is
 * repaired by the next batch that gets through. */
typedef struct jr_update {
    int64_t id;            /* 0: none open */
    size_t n, n_chunks;
    char *states;          /* n state letters */
    uint8_t *fps;          /* n * JOURNAL_FP_BYTES */
    uint64_t *expected;    /* 2n: tensors, bytes */
    uint64_t *received;    /* 2n: tensors, bytes */
    uint8_t *mod_flags;    /* n: JR_MOD_* */
    uint8_t *chunk_flags;  /* n_chunks: JR_CHUNK_* */
    int resync;
    int has_undo;          /* journal_update_undo was called */
    uint64_t undo[2];      /* device, host bytes */
    char *undo_source;     /* journal_update_undo_source's text, or NULL */
} jr_update;

/* The end of an update whose write failed, kept for the next write
 * transaction (journal_held.c). Strings are copies. */
typedef struct jr_held {
    int64_t id;            /* 0: none held */
    char *state;           /* final state name */
    uint64_t bytes, tensors;
    char *error;           /* may be NULL */
    char at[32];           /* when the update ended */
    char *why;             /* the failed write's message */
    int has_health;        /* the worker's transition rides with it */
    char *worker, *from, *to, *reason, *version;
    int in_tx;             /* written in the open transaction */
} jr_held;

#define JOURNAL_HOST_MAX 256
#define JOURNAL_ERR_MAX 1024
#define JOURNAL_GAP_TEXT_MAX 512

struct journal {
    sqlite3 *db;
    char *path;
    journal_mode mode;
    int readonly;
    int in_tx;                     /* a BEGIN of ours is open */
    int last_rc;                   /* error of the last failed step */
    int64_t pid, pid_start;        /* this process */
    char host[JOURNAL_HOST_MAX];
    sqlite3_stmt *stmt[JS_COUNT];
    size_t interrupted;            /* marked by journal_open */
    jr_update cur;                 /* the update open on this handle */
    jr_held held;                  /* an end not written yet */
    size_t gaps;                   /* best-effort writes not recorded */
    char gap_text[JOURNAL_GAP_TEXT_MAX];
    char err[JOURNAL_ERR_MAX];
    uint64_t dev, ino;             /* the file opened (journal_same_file) */
    int lock_fd;                   /* PATH-writers (journal_lock.c); -1 */
    int64_t locked_update;         /* the update whose lock this holds; 0 */
};

/* Record "journal PATH: what: sqlite text (code, os error)" and return
 * REFIT_EJOURNAL. Rolls back an open transaction of ours (journal_tx.c). */
int jr_fail_sqlite(journal *j, const char *what);
/* Record a message that is not SQLite's; returns status. */
int jr_fail(journal *j, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The cached statement id, prepared on first use; NULL on failure (the
 * caller reports it with jr_fail_sqlite). */
sqlite3_stmt *jr_stmt(journal *j, enum journal_stmt_id id);
/* sqlite3_step, remembering an error code for jr_fail_sqlite. */
int jr_step(journal *j, sqlite3_stmt *s);
/* Step a statement that returns no row and reset it. SQLITE_DONE or the
 * SQLite error code. */
int jr_step_done(journal *j, sqlite3_stmt *s);
/* Write transactions (journal_tx.c): BEGIN IMMEDIATE takes the write lock
 * up front so a busy writer is waited for (busy_timeout) instead of failing
 * a read-to-write upgrade. Begin writes a held end first; commit also
 * records pending best-effort gaps. */
int jr_tx_begin(journal *j, const char *what);
int jr_tx_commit(journal *j, const char *what);
void jr_tx_rollback(journal *j);
/* Writes are refused on a read-only handle. */
int jr_check_writable(journal *j, const char *what);

/* UTC time "2024-05-01T12:00:00.123Z" into buf (at least 32 bytes). */
void jr_now(char *buf, size_t len);
/* journal_rows.c (to jr_write_batch): rows inside the caller's transaction
 * and the open update's memory, calling nothing above the handle. */
/* Health names stored lowercased ("READY" -> "ready"); NULL stays NULL. */
const char *jr_health_lower(const char *in, char *buf, size_t len);
/* The worker row's health and a health-transition row, inside the caller's
 * transaction. Returns SQLITE_DONE or the failing SQLite code. */
int jr_health_rows(journal *j, const char *worker_id, const char *from,
                   const char *to, const char *reason, const char *version);
/* The same at a given time (at: jr_now's format). */
int jr_health_rows_at(journal *j, const char *worker_id, const char *from,
                      const char *to, const char *reason, const char *version,
                      const char *at);
/* One event row inside the caller's transaction; SQLITE_DONE or the code. */
int jr_event_row(journal *j, int64_t update_id, const char *worker_id,
                 const char *kind, const char *msg);
/* This process's start time in clock ticks since boot (/proc), or 0. */
int64_t jr_proc_start(int64_t pid);
/* Whether the process that wrote (host, pid, pid_start) may still run:
 * same host, the pid exists, is not a zombie and started when recorded. */
int jr_writer_alive(const journal *j, const char *host, int64_t pid,
                    int64_t pid_start);

/* Liveness by lock (journal_lock.c): a worker id and an open update each
 * have a lock their writer holds while it lives. Open: writers create
 * PATH-writers (failure is an error), readers use it when it exists. The
 * live tests: held by another descriptor, else jr_writer_alive's pid test
 * (writers of older versions take no lock). */
int jr_lock_open(journal *j);
void jr_lock_close(journal *j);
int jr_worker_live(const journal *j, const char *worker_id, const char *host,
                   int64_t pid, int64_t pid_start);
int jr_update_live(const journal *j, int64_t update_id, const char *host,
                   int64_t pid, int64_t pid_start);
/* REFIT_EEXIST naming the live holder (its workers row) when another
 * descriptor holds worker_id; REFIT_EJOURNAL when fcntl fails. */
int jr_lock_worker(journal *j, const char *worker_id);
int jr_lock_update(journal *j, int64_t update_id);
void jr_unlock_update(journal *j, int64_t update_id);

/* Schema creation and forward migration (journal_schema.c). */
int jr_schema_check(journal *j, int *need_migrate);
int jr_schema_migrate(journal *j);
/* Consistency of tables and columns with the current schema; problems go
 * to fn. Returns the number of problems, or -1 when SQLite failed. */
int jr_schema_verify(journal *j, journal_problem_fn fn, void *user);

/* Plan of a module list: found by digest or written (journal_plan.c).
 * Inside the caller's transaction; SQLite code on failure. */
int jr_plan_get(journal *j, size_t n, const journal_module_info *m,
                int64_t *plan_id);
/* The plan a caller named (journal_update_info.plan_id): SQLITE_DONE when
 * it exists with n modules, SQLITE_MISMATCH when not, else SQLite's code. */
int jr_plan_check(journal *j, int64_t plan_id, size_t n);
/* Free the open update's memory. */
void jr_update_free(jr_update *u);
/* Inside the caller's transaction: the end row of an
 * update at time at (NULL: now), SQLITE_NOTFOUND when it has no row; and
 * the touched chunks and partial-count rows of u (all of them on resync). */
int jr_end_row(journal *j, int64_t update_id, const char *state,
               uint64_t bytes, uint64_t tensors, const char *error,
               const char *at);
/* jr_end_row found the row ended already (another process marked it
 * interrupted): it is left as it is, and an event of kind "ended_late"
 * says how the update did end. Not a SQLite code. */
#define JR_ROW_CLOSED (-2)
int jr_end_closed_event(journal *j, int64_t update_id, const char *worker,
                        const char *state, const char *at);
int jr_write_batch(journal *j, jr_update *u, size_t n,
                   const journal_module_progress *p);

/* The held end (journal_held.c). keep: copy the record (REFIT_ENOMEM
 * leaves the earlier one); write: inside the open transaction (called by
 * jr_tx_begin); committed / rolled_back: that transaction's outcome. */
int jr_held_keep(journal *j, int64_t update_id, const char *state,
                 uint64_t bytes, uint64_t tensors, const char *error,
                 const char *at, const journal_health_change *hc);
int jr_held_write(journal *j);
void jr_held_committed(journal *j);
void jr_held_rolled_back(journal *j);
void jr_held_free(jr_held *h);

/* Mark updates of dead writers interrupted (journal_write.c). */
int jr_mark_interrupted(journal *j);

#endif /* REFIT_JOURNAL_JOURNAL_INT_H */
