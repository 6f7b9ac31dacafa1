/*
 * journal: the SQLite record of updates, module completeness and worker
 * health (DESIGN.md section 7, docs/journal.md). Internal API: core/ writes
 * through it, tools/refitctl reads through it.
 *
 * Lifecycle:
 *   journal_open(&j, path, opts)           creates, migrates, marks updates
 *                                          of dead writers `interrupted`
 *     journal_worker_register(j, id, rank) once per worker process
 *     journal_plan_prepare(j, ..., &plan)  at seal: the module list, once
 *     journal_health(j, ...)               every health transition
 *     journal_update_begin(j, &uid, ...)   one SQLite transaction
 *       journal_modules_progress(j, uid..) one transaction per batch
 *       journal_update_state_set(FINALIZING)
 *     journal_update_end(j, uid, ...)      one transaction
 *   journal_close(j)
 *
 * Errors: every function returns a refit status. REFIT_EJOURNAL means
 * SQLite refused (read-only, full, locked beyond the busy timeout, corrupt);
 * journal_errmsg() then names the path, the operation and SQLite's text. A
 * failed write leaves no partial transaction behind. The journal applies no
 * policy: the core decides (journal=required refuses begin, best-effort goes
 * on and counts what it could not record with journal_note_gap; an event
 * listing the gaps rides in the next write transaction that succeeds).
 *
 * Threading: a journal handle is used by one thread at a time. Any number
 * of processes may open the same file; readers never block the writer (WAL).
 */
#ifndef REFIT_JOURNAL_JOURNAL_H
#define REFIT_JOURNAL_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include <refit/refit.h>

/* PRAGMA application_id of a refit journal ("RFTJ"). */
#define JOURNAL_APPLICATION_ID 0x5246544a
/* PRAGMA user_version this code writes; older files are migrated forward. */
#define JOURNAL_SCHEMA_VERSION 6

/* 1 when the handle's path still names the file it opened; 0 when the
 * file was deleted or replaced (writes would go to an unlinked file). */
struct journal;
int journal_same_file(const struct journal *j);
/* Busy timeout when the options say 0. */
#define JOURNAL_BUSY_TIMEOUT_MS 2000

typedef struct journal journal;

/* The policy the caller applies to failed writes; the journal behaves the
 * same either way (it reports, the caller decides) and keeps the mode for
 * journal_opened_mode(). */
typedef enum journal_mode {
    JOURNAL_REQUIRED = 0,    /* the core refuses begin when a write fails */
    JOURNAL_BEST_EFFORT = 1, /* the core goes on and notes gaps */
} journal_mode;

typedef struct journal_opts {
    journal_mode mode;
    int readonly;         /* 1: SQLITE_OPEN_READONLY, no migration, no writes */
    int busy_timeout_ms;  /* 0: JOURNAL_BUSY_TIMEOUT_MS */
} journal_opts;
#define JOURNAL_OPTS_INIT {JOURNAL_REQUIRED, 0, 0}

/* States of an update, stored as text (journal_update_state_name). */
typedef enum journal_update_state {
    JOURNAL_UPDATE_LOADING = 0,
    JOURNAL_UPDATE_FINALIZING,
    JOURNAL_UPDATE_COMMITTED,
    JOURNAL_UPDATE_ABORTED,     /* abort with nothing written */
    JOURNAL_UPDATE_ROLLED_BACK, /* abort, old bytes restored */
    JOURNAL_UPDATE_FAILED,      /* finalize or abort left the worker poisoned */
    JOURNAL_UPDATE_INTERRUPTED, /* the writer died; set by journal_open */
    JOURNAL_UPDATE_STATE_COUNT
} journal_update_state;

/* States of one module within one update. */
typedef enum journal_module_state {
    JOURNAL_MODULE_PENDING = 0,  /* nothing received */
    JOURNAL_MODULE_PARTIAL,      /* some tensors received */
    JOURNAL_MODULE_COMPLETE,     /* every expected tensor received */
    JOURNAL_MODULE_COMMITTED,    /* finalized; fingerprint recorded */
    JOURNAL_MODULE_ROLLED_BACK,  /* old bytes restored */
    JOURNAL_MODULE_POISONED,     /* bytes written, not restored */
    JOURNAL_MODULE_STATE_COUNT
} journal_module_state;

/* "loading", "committed" ...; NULL when out of range. */
const char *journal_update_state_name(journal_update_state s);
const char *journal_module_state_name(journal_module_state s);

/* Open (creating when absent and not readonly) the journal at path. opts
 * NULL: JOURNAL_OPTS_INIT. Refuses a file that is not SQLite, a SQLite file
 * that is not a refit journal, and a journal of a newer schema. On failure
 * *out is NULL, a message naming path and reason is in err (when errlen > 0)
 * and the status is REFIT_EJOURNAL (or REFIT_EINVAL / REFIT_ENOMEM). */
int journal_open(journal **out, const char *path, const journal_opts *opts,
                 char *err, size_t errlen);
/* Finalizes cached statements and closes. NULL is ok. */
void journal_close(journal *j);
/* Message of the last failing call on j, or "". Valid until the next call. */
const char *journal_errmsg(const journal *j);
/* Path the journal was opened with. */
const char *journal_path(const journal *j);
/* The mode given at open. */
journal_mode journal_opened_mode(const journal *j);
/* Updates journal_open marked interrupted (for the caller's log). */
size_t journal_interrupted_on_open(const journal *j);

/* ---- writes -------------------------------------------------------------- */

/* Insert or refresh the worker row: rank, this process's pid and start
 * time, host name, heartbeat now. A new row starts with health "unknown".
 * The handle holds the worker id's lock (PATH-writers) until it closes:
 * REFIT_EEXIST, nothing written, when another live descriptor holds it
 * (two workers may not share one id; the message names the holder). */
int journal_worker_register(journal *j, const char *worker_id, int rank);
/* Refresh the worker's heartbeat. */
int journal_heartbeat(journal *j, const char *worker_id);
/* Record a health transition (names lowercased: "ready", "poisoned" ...)
 * with its reason, and set the worker's current health; version (may be
 * NULL) becomes the worker's version when not NULL. One transaction. */
int journal_health(journal *j, const char *worker_id, const char *from,
                   const char *to, const char *reason, const char *version);

typedef struct journal_update_info {
    const char *worker_id;     /* a registered worker */
    const char *version;       /* label of the weights, may be NULL */
    const char *source_uri;    /* may be NULL */
    const char *source_digest; /* may be NULL */
    int64_t replay_of;         /* 0: mode "normal"; > 0: mode "replay" of it */
    int rollback;              /* 1: undo log kept */
    int partial;               /* 1: a delta (refit_update_opts.partial) */
    int64_t plan_id;           /* 0: find the plan of the modules given (a
                                  hash over every name); > 0: the id
                                  journal_plan_prepare returned on this
                                  journal for the same list (no hashing) */
    const char *health_from;   /* not NULL: the same transaction records the
                                  worker's transition from this health to
                                  "updating" (as journal_health would) */
    const char *health_reason;
    const char *base_version;  /* a delta update's base (NULL: not a delta) */
} journal_update_info;

/* A health transition recorded inside another write's transaction. */
typedef struct journal_health_change {
    const char *worker_id;
    const char *from, *to, *reason;
    const char *version;       /* may be NULL */
} journal_health_change;

typedef struct journal_module_info {
    const char *name;
    uint64_t expected_tensors;
    uint64_t expected_bytes;
} journal_module_info;

/* Progress or final state of the module at position `index` of the array
 * given to journal_update_begin. */
typedef struct journal_module_progress {
    uint32_t index;
    journal_module_state state;
    uint64_t received_tensors;
    uint64_t received_bytes;
    int has_fingerprint;       /* 1: fingerprint is recorded (hex) */
    uint64_t fingerprint;
} journal_module_progress;

/* Record the module list (a "plan": names and expected counts, in the
 * order progress indexes them) ahead of the first update that uses it, so
 * that update's begin does not pay for it. Optional: begin records an
 * unknown list itself. *plan_id: OUT, may be NULL. One transaction. */
int journal_plan_prepare(journal *j, size_t n_modules,
                         const journal_module_info *modules,
                         int64_t *plan_id);
/* One SQLite transaction: the update row (state loading, writer pid/host),
 * its plan (found, or written when new) and every module's state, pending.
 * One update is open per handle: beginning another while one is open
 * records the earlier one `interrupted` (its end was never recorded).
 * *update_id: OUT, the new id. */
int journal_update_begin(journal *j, int64_t *update_id,
                         const journal_update_info *info, size_t n_modules,
                         const journal_module_info *modules);
/* Move the update to a non-final state (loading -> finalizing). */
int journal_update_state_set(journal *j, int64_t update_id,
                             journal_update_state state);
/* One SQLite transaction for the whole batch, whatever n is, writing only
 * what changed (one row per 256 touched modules, plus a row per module
 * whose received counts are partial). update_id must be the update open on
 * this handle (else REFIT_ESTATE); an index beyond its modules or a bad
 * state is REFIT_EINVAL and changes nothing. After a failed write the next
 * successful one also writes what the failed one lost. */
int journal_modules_progress(journal *j, int64_t update_id, size_t n,
                             const journal_module_progress *p);
/* One SQLite transaction: final state, totals, error text (may be NULL),
 * end time, and the n module entries in p (final states, fingerprints),
 * with anything earlier batches failed to write. Closes the update on this
 * handle when it succeeds. */
int journal_update_end(journal *j, int64_t update_id,
                       journal_update_state state, uint64_t bytes,
                       uint64_t tensors, const char *error, size_t n,
                       const journal_module_progress *p);
/* Where the undo log of the update open on this handle kept its bytes:
 * kept in memory and written by its journal_update_end (no transaction of
 * its own); an end without it records NULL (unknown). REFIT_ESTATE when
 * update_id is not the update open here. */
int journal_update_undo(journal *j, int64_t update_id, uint64_t device_bytes,
                        uint64_t host_bytes);
/* What served the rollback of the update open on this handle ("undo-log",
 * "files file:///...", "snapshot snapshot://...", "none"; docs/journal.md),
 * kept (copied) and written by its journal_update_end as journal_update_undo
 * is. REFIT_ESTATE when update_id is not the update open here. */
int journal_update_undo_source(journal *j, int64_t update_id, const char *text);
/* A delta update's patches, in one transaction of their own: n tensors
 * (names[i] changed in elements[i] elements) and their total, for the
 * update open on this handle. REFIT_ESTATE when it is not. */
int journal_update_delta(journal *j, int64_t update_id, size_t n,
                         const char *const *names, const uint64_t *elements);
/* The same, and the worker's health transition h (not NULL) in the same
 * transaction: one write ends an update and says what the worker is now. */
int journal_update_end_health(journal *j, int64_t update_id,
                              journal_update_state state, uint64_t bytes,
                              uint64_t tensors, const char *error, size_t n,
                              const journal_module_progress *p,
                              const journal_health_change *h);
/* When journal_update_end(_health) fails with REFIT_EJOURNAL the update
 * ended all the same: its record (final state, module rows, the health
 * transition, the time) is held on the handle and written first by the
 * next write transaction, with an event of kind "late"; until then
 * readers see the update as it was (finalizing). journal_held_end: the id
 * of the update whose end is held, 0 when none. journal_write_held: write
 * it alone now (REFIT_OK when none is held); journal_close drops it, so
 * call this first. */
int64_t journal_held_end(const journal *j);
int journal_write_held(journal *j);
/* An event row. update_id 0 and worker_id NULL mean "none". */
int journal_event(journal *j, int64_t update_id, const char *worker_id,
                  const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Count a write the caller could not record (best effort): the next
 * successful write transaction also records one event of kind "gap" with
 * the count and the first descriptions. The journal never notes gaps by
 * itself: the caller knows which failures it went on after. */
void journal_note_gap(journal *j, const char *what);
/* Gaps noted and not yet recorded. */
size_t journal_pending_gaps(const journal *j);

/* ---- reads (rows borrowed: valid during the callback only) ---------------- */

typedef struct journal_worker_row {
    const char *id, *host, *version, *heartbeat;
    const char *health;          /* effective: "unknown" when the worker died
                                    inside an update not yet marked */
    const char *health_recorded; /* as stored */
    int64_t rank, pid;
    int alive;                   /* its process runs (on this host) */
    int64_t last_update;         /* 0: none */
    const char *last_update_state; /* effective, as journal_update_row.state */
} journal_worker_row;

typedef struct journal_update_row {
    int64_t id;
    const char *worker, *version, *source_uri, *source_digest;
    const char *mode;           /* "normal", "replay", or "restore" (a normal
                                   update whose source is snapshot://PATH or
                                   keeper://PATH) */
    int64_t replay_of;          /* 0: none */
    int rollback;
    int partial;                /* 1: a delta: modules not delivered kept theirs */
    const char *state;          /* effective: "interrupted" for a dead writer */
    const char *state_recorded; /* as stored */
    const char *started_at, *ended_at, *error, *host;
    uint64_t bytes, tensors;
    int64_t pid, n_modules;
    int undo_recorded;          /* 0: placement unknown (older or unended) */
    uint64_t undo_device_bytes, undo_host_bytes;
    const char *undo_source;    /* what served rollback; NULL before schema 6 */
} journal_update_row;

typedef struct journal_module_row {
    int64_t update_id, index;
    const char *name, *state, *fingerprint;
    uint64_t expected_tensors, received_tensors;
    uint64_t expected_bytes, received_bytes;
} journal_module_row;

typedef struct journal_event_row {
    int64_t id, update_id;
    const char *at, *worker, *kind, *message;
} journal_event_row;

/* Callbacks return 0 to go on, anything else to stop (returned as is). A
 * NULL callback reads and drops the rows (update_get: an existence test). */
typedef int (*journal_worker_fn)(void *user, const journal_worker_row *row);
typedef int (*journal_update_fn)(void *user, const journal_update_row *row);
typedef int (*journal_module_fn)(void *user, const journal_module_row *row);
typedef int (*journal_event_fn)(void *user, const journal_event_row *row);
typedef int (*journal_problem_fn)(void *user, const char *problem);

int journal_workers_list(journal *j, journal_worker_fn fn, void *user);
/* Every update, oldest first. */
int journal_updates_list(journal *j, journal_update_fn fn, void *user);
/* One update; REFIT_ENOTFOUND when there is none with that id. */
int journal_update_get(journal *j, int64_t update_id, journal_update_fn fn,
                       void *user);
/* Modules of an update in begin order; incomplete_only: those not
 * `complete` or `committed` (what a replay has to send). REFIT_ENOTFOUND
 * when the update does not exist. */
int journal_modules_list(journal *j, int64_t update_id, int incomplete_only,
                         journal_module_fn fn, void *user);
/* Events, oldest first; update_id 0: all; limit 0: no limit (the newest
 * `limit` events when set). */
int journal_events_list(journal *j, int64_t update_id, int64_t limit,
                        journal_event_fn fn, void *user);
/* Integrity, foreign keys, schema and consistency checks. Each problem (one
 * line of text; a check that could not run is one too) is passed to fn;
 * *n_problems: OUT. REFIT_OK unless the arguments are bad. */
int journal_verify(journal *j, journal_problem_fn fn, void *user,
                   size_t *n_problems);

#endif /* REFIT_JOURNAL_JOURNAL_H */
