/* refit/sys: for implementors and benches, beyond the API (libgit2's
 * git2/sys/ split). What is here is exported and versioned like the API,
 * but promises less: a counter may change meaning or go away in a minor
 * release, listed in the release notes; docs/abi.md says what holds. */
#ifndef REFIT_SYS_STATS_H
#define REFIT_SYS_STATS_H

#include <refit/refit.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Wall seconds ctx has spent in journal writes since refit_open (0 for a
 * NULL ctx or no journal): refit-bench's journal share of a reload. */
REFIT_API double refit_sys_journal_seconds(const refit_ctx *ctx);

/* The most bytes of staging txn has held at once so far (0 for NULL):
 * what a staging_budget must allow for this order of loads. */
REFIT_API size_t refit_sys_txn_staging_peak(const refit_txn *txn);

/* What the patches (refit_load_delta, refit_load_delta_runs) of txn have
 * changed so far: checkpoint elements given, tensors patched (0 for NULL;
 * either pointer may be NULL). */
REFIT_API void refit_sys_txn_delta(const refit_txn *txn, uint64_t *elements,
                                   uint32_t *tensors);

/* The undo log's memory model holds between updates with rollback
 * (docs/core.md "Undo log"): *device_bytes (within undo_device_budget) and
 * *host_bytes (pinned on a GPU), reserved at seal on a thread of its own
 * and grown by any update that needed more. wait 1: first wait for that
 * thread (a bench that times the first update apart from it); wait 0
 * while it runs, or an update open: REFIT_ESTATE, nothing written.
 * REFIT_EINVAL for NULL. */
REFIT_API int refit_sys_undo_held(refit_model *model, int wait, uint64_t *device_bytes,
                                  uint64_t *host_bytes);

#ifdef __cplusplus
}
#endif

#endif
