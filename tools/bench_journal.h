/* Journal overhead figure for refit-bench (issue 3). */
#ifndef REFIT_TOOLS_BENCH_JOURNAL_H
#define REFIT_TOOLS_BENCH_JOURNAL_H

#include <stddef.h>

/* Write, to the journal at path (created if absent), the rows of one
 * update of n_modules modules and n_tensors tensors as the core writes
 * them: health to updating, begin with every module row, module progress
 * in batches as modules complete, end with every module committed and
 * fingerprinted, health to ready. *seconds_out: OUT, wall time of those
 * writes (open, worker registration and the plan excluded: the core does
 * them once, at open and seal).
 * Returns a refit status; prints the journal's message on failure. */
int bench_journal_write(const char *path, size_t n_modules, size_t n_tensors,
                        double *seconds_out);

#endif
