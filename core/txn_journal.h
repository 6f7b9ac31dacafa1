/* The core's side of the journal (journal/journal.h): when to write what.
 * Writes are batched: one transaction at begin, module progress in batches
 * of modules that completed, one at the end. Never one per tensor. A
 * failure here never changes the model: begin refuses before touching it
 * (journal=required) or the gap is counted and recorded later. */
#ifndef REFIT_CORE_TXN_JOURNAL_H
#define REFIT_CORE_TXN_JOURNAL_H

#include "core/model.h"
#include "journal/journal.h"

/* Modules that completed since the last progress write (p is also where
 * the final rows are built at the end). */
typedef struct txj_batch {
    journal_module_progress *p;
    uint32_t n, cap;
    uint32_t *done;             /* indexes of modules completed since */
    uint32_t n_done, cap_done;
    double last_write;          /* monotonic seconds of the last progress write */
} txj_batch;

/* Progress is written when the last write is this old, the clock read
 * once every TXJ_CLOCK_EVERY completed modules: a reload of a few
 * milliseconds writes none, a long one leaves a trail an operator can
 * follow. */
#define TXJ_BATCH_SECONDS 0.25
#define TXJ_CLOCK_EVERY 256

/* Context: open the journal named by the options (errors kept for begin). */
void txj_open(refit_ctx *ctx);
void txj_close(refit_ctx *ctx);
/* Seal: the module list, and the worker's health. */
void txj_seal(refit_model *m);
/* A health transition of the worker. */
void txj_health(refit_model *m, refit_health from, refit_health to, const char *reason);
/* Begin: record the update and the worker going from before to UPDATING. REFIT_EJOURNAL (message set) when it cannot be
 * recorded and the journal is required; *id is 0 when nothing is recorded. */
int txj_begin(refit_model *m, const refit_update_opts *o, int64_t replay_of,
              refit_health before, int64_t *id);
/* A module completed: remember it; write the progress batch once the
 * interval passed. */
void txj_module_done(refit_model *m, int64_t id, txj_batch *b, uint32_t mi);
/* Finalize began (a crash from here on is a crash while finalizing). */
void txj_finalizing(refit_model *m, int64_t id);
/* End: final state and each touched module's final row. */
/* End: final state, each touched module's final row, and the worker's
 * health after it, in one write. */
void txj_end(refit_model *m, int64_t id, txj_batch *b, journal_update_state st,
             uint64_t bytes, uint64_t tensors, const char *error, refit_health after,
             const char *reason);
/* Before txj_end: where the undo log kept its bytes (written with the end). */
void txj_undo(refit_model *m, int64_t id, uint64_t device_bytes, uint64_t host_bytes);
/* Before txj_end: what served the update's rollback (updates.undo_source). */
void txj_undo_source(refit_model *m, int64_t id, const char *text);
/* Before txj_end of a delta update: each patched tensor and the elements
 * its patch changed (one write of its own). */
void txj_delta(refit_model *m, int64_t id, size_t n, const char *const *names,
               const uint64_t *elements);
void txj_batch_free(txj_batch *b);
/* An event of the worker (kind "snapshot", "restore" ...) about update_id
 * (0: none); a failed write is a gap, as any. */
void txj_event(refit_model *m, int64_t update_id, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
