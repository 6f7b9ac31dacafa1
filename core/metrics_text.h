/* The Prometheus text exposition (format 0.0.4) of refit's metrics
 * (docs/operators.md "Metrics"): the figures of one or many workers, and
 * the one writer that prints them. A component below the core: the core
 * fills the figures as updates happen (refit_metrics_text), refitctl
 * fills them from journals (refitctl metrics); both print through
 * metrics_text, so the names, labels and buckets are one list. */
#ifndef REFIT_CORE_METRICS_TEXT_H
#define REFIT_CORE_METRICS_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Why an update ended without a commit (label reason). */
typedef enum metrics_reason {
    METRICS_REASON_CALLER,      /* refit_abort, refit_abort_reason */
    METRICS_REASON_FAILED,      /* a delivery or post-load had failed; finalize aborted */
    METRICS_REASON_FINALIZE,    /* a check of finalize refused the commit */
    METRICS_REASON_INTERRUPTED, /* the process ended mid-update (journal) */
    METRICS_N_REASONS
} metrics_reason;

/* Where an update's bytes came from (label source). */
typedef enum metrics_source {
    METRICS_SOURCE_MEMORY,
    METRICS_SOURCE_FILE,
    METRICS_SOURCE_NCCL,
    METRICS_SOURCE_IPC,
    METRICS_SOURCE_SNAPSHOT,    /* refit_restore */
    METRICS_SOURCE_KEEPER,      /* refit_ipc_restore */
    METRICS_N_SOURCES
} metrics_source;

/* Update phases (label phase of refit_update_phase_seconds). */
typedef enum metrics_phase {
    METRICS_PHASE_BEGIN,
    METRICS_PHASE_LOAD,
    METRICS_PHASE_POST_LOAD,
    METRICS_PHASE_FINALIZE,
    METRICS_PHASE_JOURNAL,
    METRICS_N_PHASES
} metrics_phase;

enum { METRICS_COMMITTED = 0, METRICS_ABORTED = 1 };  /* label outcome */
enum { METRICS_DEVICE = 0, METRICS_HOST = 1 };        /* label placement */
enum { METRICS_N_ROUTES = 3 };                        /* direct, view, staged */
enum { METRICS_N_STATUS = 32 };                       /* refusals by -status */
#define METRICS_SECONDS_BUCKETS 14
#define METRICS_BYTES_BUCKETS 16

typedef struct metrics_hist {
    uint64_t bucket[METRICS_BYTES_BUCKETS]; /* non-cumulative counts per bound */
    uint64_t count;
    double sum;
} metrics_hist;

/* Bytes accepted per route (REFIT_ROUTE_DIRECT - 1 ...) for one format. */
typedef struct metrics_format_bytes {
    const char *format;         /* NULL: the slot is free */
    uint64_t route[METRICS_N_ROUTES];
} metrics_format_bytes;

/* One worker's figures. Zero-initialized is a worker that did nothing. */
typedef struct metrics_worker {
    const char *worker;         /* label worker */
    int64_t rank;               /* label rank */
    bool live;                  /* a context: the context-only families too */
    uint64_t started, committed, rollbacks;
    uint64_t replays_started, replays_committed;
    uint64_t restores_started, restores_committed; /* from snapshots */
    uint64_t aborted[METRICS_N_REASONS], poisoned[METRICS_N_REASONS];
    uint64_t refusals[METRICS_N_STATUS];
    uint64_t source_bytes[METRICS_N_SOURCES];
    metrics_format_bytes *formats; /* n_formats slots (live only) */
    uint32_t n_formats;
    metrics_hist duration[2];   /* by outcome */
    metrics_hist phase[METRICS_N_PHASES];
    metrics_hist bytes;
    const char *health;         /* "empty" "ready" "updating" "poisoned"; other: all 0 */
    const char *version;        /* NULL: no version held */
    double commit_time;         /* Unix seconds; 0: none */
    bool has_undo;              /* an ended update recorded its undo placement */
    uint64_t undo[2];           /* by placement */
    uint64_t staging_peak;      /* live only */
} metrics_worker;

/* The reason class of an update that ended without a commit, from the
 * message recorded with its end (NULL: none) and whether the journal
 * found it interrupted. The core and refitctl classify the same text. */
metrics_reason metrics_reason_of(const char *error, bool interrupted);
/* The source kind of an update's source_uri (NULL: memory). */
metrics_source metrics_source_of(const char *uri);
/* Whether an update of that source kind is a restore (refit_restore,
 * refit_ipc_restore): counted by refit_restores_*_total. */
bool metrics_source_is_restore(metrics_source s);
/* Count v into h (seconds: the duration buckets; else the bytes buckets). */
void metrics_observe(metrics_hist *h, bool seconds, double v);
/* Count a refusal by its status (negative; others are ignored). */
void metrics_refusal(metrics_worker *w, int status);

/* The exposition of workers w[0..n), every family once (HELP, TYPE, then
 * each worker's series), in a malloc'ed NUL-terminated buffer (*len its
 * strlen). NULL when out of memory. */
char *metrics_text(const metrics_worker *w, size_t n, size_t *len);

#endif
