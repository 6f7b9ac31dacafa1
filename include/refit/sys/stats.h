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

#ifdef __cplusplus
}
#endif

#endif
