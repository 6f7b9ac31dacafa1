/* Transactions (txn.c): begin, load, finalize, abort. The top of the
 * txn -> plan -> model layers. */
#ifndef REFIT_CORE_TXN_H
#define REFIT_CORE_TXN_H

#include <stdbool.h>
#include <stdint.h>

#include <refit/refit.h>

#include "core/model.h"

/* Transactions (txn.c). replay_of: journal id of the update replayed, or 0. */
int txn_begin(refit_txn **out, refit_model *m, const refit_update_opts *opts, int64_t replay_of);
/* Free what the model keeps for its updates (the per-route and per-module
 * scratch every txn reuses); refit_model_destroy, with no txn open. */
void txn_model_release(refit_model *m);
/* A zero-copy delivery (the NCCL receiver's DIRECT buckets): rows [row0,
 * row0 + rows) of dim 0 of name (part), or all of it, as src describes
 * them (src->data is not read: the caller's transport will write the
 * bytes, from memory on src->device). Validated exactly as refit_load /
 * refit_load_part (an error is theirs: refused and nothing changed, or the
 * txn failed). When the route copies exactly those bytes, unconverted,
 * onto contiguous bytes of a runtime tensor on src->device (DIRECT or
 * VIEW, no cast, no post-load, not tied, every row this rank's), the
 * delivery is accepted as a load's would be (duplicates, completeness,
 * module bookkeeping; with rollback the undo save queued on stream, which
 * the caller's write must follow on the device) and *dst is where the
 * bytes go. Otherwise *dst is NULL and nothing changed: load the bytes. */
int txn_claim_direct(refit_txn *t, const char *name, bool part, int64_t row0,
                     const refit_tensor *src, void *stream, void **dst);

/* A restore (core/snapshot.c): write module mi's runtime tensors from
 * src[k] (one view per runtime tensor, in the module's order, on a device
 * its backend reads), the undo log first as for any write, and count the
 * module complete with no post-load. A failed copy fails the txn. */
int txn_restore_module(refit_txn *t, uint32_t mi, const refit_view *src, void *stream);

/* While an abort runs (an undo source's restore): the failure it is for
 * (a failed prepare's status; 0 when the caller aborted) and *why, its
 * reason (NULL: none given; valid until the abort returns). */
int txn_abort_cause(const refit_txn *t, const char **why);

/* refit_load_source delivered `tensors` tensors of src into t: an update
 * that took every tensor from one durable source makes it, at commit, the
 * next update's undo source (core/undo_source.h). Holds src until t ends. */
void txn_note_source(refit_txn *t, refit_source *src, uint64_t tensors);

#endif
