/* Masters of online modules (delta_master.c): refit's copy of the
 * checkpoint tensors a module's runtime is quantized from at post-load,
 * kept within refit_options.delta_master_budget, so that a delta update
 * can patch the copy and rebuild only the runtime bytes of the
 * quantization groups it touched (include/refit/format.h,
 * refit_quant_group). The txn layer: txn.c keeps them current and ends
 * them with the update; delta.c patches them. */
#ifndef REFIT_CORE_DELTA_MASTER_H
#define REFIT_CORE_DELTA_MASTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/load.h"

/* Elements [start, start + count) of a tensor take values [vpos, ..). */
typedef struct delta_run {
    int64_t start, count, vpos;
} delta_run;

/* After unit u's post-load (its staged views set): copy each staged
 * tensor into its master (made, within the budget, at the first one),
 * the old bytes saved first. Fails t on an error. */
int master_keep(refit_txn *t, uint32_t u, void *stream);
/* The update ends: what it wrote into masters becomes current on a
 * commit, and on an abort comes back (restored: the undo log, or an undo
 * source through the post-loads, put the bytes back) or is dropped. */
void master_txn_end(refit_model *m, bool committed, bool restored);
/* Module mi's runtime was written from elsewhere (a snapshot): its
 * masters no longer match it, however the update ends. */
void master_forget(refit_model *m, uint32_t mi);
/* The update's units start over (its scratch was reset): none patched. */
void master_units_clear(refit_model *m);
void master_free(refit_model *m);

/* Patched in the open update: unit u, and whether module mi was patched
 * with every unit of it either patched, untouched or complete (so it is
 * complete for the delta). */
bool master_unit_patched(const refit_model *m, uint32_t u);
bool master_module_settled(const refit_txn *t, uint32_t mi);

/* delta.c's check of a patch of d's STAGED route, before any write:
 * the format declared the tensor's group, a current master exists for
 * what the rebuild reads, and the unit took no whole tensor. */
int master_admit(refit_txn *t, const delivery *d);
/* The master of d's route as a view of this rank's slice (row-major). */
refit_view master_view(const refit_model *m, const delivery *d);
/* Whether d's master holds the whole tensor (no other rank's rows), so
 * that checkpoint indices are its offsets: then master_scatter writes a
 * patch in one pass. */
bool master_holds_whole(const delivery *d);
/* runs[0, n) (sorted by start; their values at vpos of values) into d's
 * master in one scatter, the old elements saved in the same pass. */
int master_scatter(refit_txn *t, const delivery *d, const delta_run *runs, size_t n,
                   const refit_view *values);
/* Write src into dst, a piece of d's master, the old bytes saved. */
int master_write(refit_txn *t, const delivery *d, const refit_view *dst,
                 const refit_view *src);
/* Rebuild the runtime bytes of the groups runs[0, n) touched (d's route:
 * its row bands, or the whole post-load unit), from the masters. */
int master_requantize(refit_txn *t, const delivery *d, const delta_run *runs, size_t n);
/* Whether d's patch rebuilds its whole unit (then delta.c rebuilds each
 * unit once, after every row: master_requantize_unit). */
bool master_whole_unit(const refit_model *m, const delivery *d);
int master_requantize_unit(refit_txn *t, const delivery *d);

#endif
