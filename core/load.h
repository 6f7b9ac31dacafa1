/* Loading checkpoint tensors into an open transaction: the pieces every
 * path shares (refit_load, refit_load_part, refit_load_many, source sets,
 * the NCCL receiver's claims). One check of a descriptor against its route
 * (load_check.c), one check against what the transaction already holds and
 * one execution (txn.c); the paths only sequence them. */
#ifndef REFIT_CORE_LOAD_H
#define REFIT_CORE_LOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/model.h"

/* Where a delivery lands: src rows [a, b) of split dim d. */
typedef struct delivery {
    const char *name;           /* as delivered (a tied name, maybe) */
    uint32_t name_ri;           /* the route of that name */
    route *r;                   /* the route written (primary of an alias) */
    uint32_t ri;
    refit_view src;             /* the whole delivered piece */
    int64_t off, len;           /* its rows of the split dim */
    int64_t a, b;               /* rows of this rank's [lo, hi) it covers */
    void *stream;
} delivery;

/* Start a delivery of name: d->name, d->name_ri, and d->r/d->ri (the
 * primary of a tied name). REFIT_EUNEXPECTED (message set) when no module
 * expects the name. */
int load_resolve(refit_model *m, const char *name, delivery *d);
/* load_resolve, trying route *hint first (rows that arrive in the model's
 * order then need no hash look-up); *hint gets the route found, plus one. */
int load_resolve_next(refit_model *m, const char *name, uint32_t *hint, delivery *d);

/* The descriptor checks, the same for every path: src (whole, or the part
 * at d->off) against the route of d (dims, dtype, device, extents, data).
 * described: src->data is not read (a claim). Fills d->src, d->off,
 * d->len, d->a, d->b; on a refusal the message of m's context says why and
 * nothing changed. Needs no transaction: a source set runs it at build. */
int load_check(refit_model *m, delivery *d, const refit_tensor *src, bool whole,
               bool described);

/* txn.c. A delivery (or a batch) was refused, nothing written: unless the
 * caller opted to go on (refit_update_opts.keep_going) the update fails
 * closed (FAILED) and the message says so. Returns status. */
int txn_load_refused(refit_txn *t, int status);
/* May t take a delivery now? name: for the message. */
int txn_load_open(refit_txn *t, const char *name);
/* The checks against what t already holds (duplicate, overlap, a tied
 * name's other name): *skip when d is a tied name to accept and skip (one
 * storage, one write). Changes nothing. */
int txn_load_admit(refit_txn *t, const delivery *d, bool whole, bool *skip);
/* Every check of one delivery: open, resolve, load_check, admit. */
int txn_load_check(refit_txn *t, const char *name, int64_t off, const refit_tensor *src,
                   bool whole, bool described, delivery *d, bool *skip);
/* Staging of d's unit (a STAGED route's module, or its expert's slice:
 * model.h, stage_unit), within the budget; or, when d
 * is read in place (txn_load_in_place), none: its bytes become the staged
 * view, and the apply that follows copies nothing. */
int txn_load_staging(refit_txn *t, const delivery *d, bool whole, void **staging);
/* Whether whole delivery d, a STAGED route's, would be read in place by
 * its module's post-load (REFIT_MODULE_STAGED_IN_PLACE) when it completes
 * its unit (completes): then it takes no staging. */
bool txn_load_in_place(const refit_txn *t, const delivery *d, bool completes);
/* Around a loading call of many rows: with defer, complete units'
 * post-loads wait; without (the call's end), they run, one
 * post_load_many per format where it has one (a failure fails t). On a
 * failed t the waiting ones are dropped and its status returned. */
int txn_post_load_defer(refit_txn *t, bool defer);
/* The running call of many rows (deferring) completes unit u: every row
 * it delivers to u's STAGED routes may then be read in place. */
void txn_call_completes(refit_txn *t, uint32_t u);
/* Execute an admitted delivery: bookkeeping, the copy (or, claim, only
 * the undo save: the caller writes the bytes), completion, post-load.
 * A failure here is sticky (the txn FAILED). */
int txn_load_apply(refit_txn *t, delivery *d, bool whole, bool skip, void *staging,
                   bool claim);

/* Patches (delta.c, txn.c). The base version of a delta update, or NULL
 * when t is not one (then no patch is accepted). */
const char *txn_base_version(const refit_txn *t);
const char *txn_version_label(const refit_txn *t);
/* An admitted patch of d's tensor (elements given): bookkeeping as
 * txn_load_apply's (touch, tie owner, stats, LOADING). skip: a tied name
 * whose other name was delivered (nothing more to do). */
int txn_delta_accept(refit_txn *t, delivery *d, bool skip, uint64_t elements);
/* One piece of the patch: with rollback, save exactly dst's bytes (unless
 * the target's whole span is saved), then copy src into dst on
 * d->stream. A failure fails t (sticky). */
int txn_delta_write(refit_txn *t, const delivery *d, const refit_view *dst,
                    const refit_view *src);
/* A patch's elements in one scatter (sc->dst in d's target): with
 * rollback, the undo log saves exactly the elements written, gathered by
 * the backend in the same pass (undo_scatter), unless the target's whole
 * span is saved; else be->scatter alone. A failure fails t (sticky). */
int txn_delta_scatter(refit_txn *t, const delivery *d, const backend_scatter *sc);
/* Every piece written: the tensor counts as delivered (its pad rows,
 * never touched, stay zero). */
int txn_delta_done(refit_txn *t, delivery *d);

/* Patches into online modules (delta_master.c, txn.c). Each fails t
 * (sticky) on an error. With rollback (and no undo source): save the
 * bytes of v in runtime ti (unless its whole span is saved) / the whole
 * span / n bytes at `at` of other memory (`what`, for the message) before
 * they are overwritten on d->stream; the first two mark the module
 * written. */
bool txn_saves_bytes(const refit_txn *t);
int txn_save_span(refit_txn *t, const delivery *d, uint32_t ti, const refit_view *v);
int txn_save_whole(refit_txn *t, const delivery *d, uint32_t ti);
int txn_save_bytes(refit_txn *t, const delivery *d, const backend *be, int device, void *at,
                   size_t n, const char *what);
/* Scatter sc into other memory (`what`) on d->stream, the old bytes of
 * exactly its elements saved in the same pass with rollback. */
int txn_scatter_bytes(refit_txn *t, const delivery *d, const backend *be, int device,
                      const backend_scatter *sc, const char *what);
/* Work was queued on (be, stream): finalize and abort wait for it. */
int txn_stream_used(refit_txn *t, const backend *be, void *stream);

/* What the batch's staging forecast reads (txn.c). */
size_t txn_staging_in_use(const refit_txn *t);
bool txn_unit_has_staging(const refit_txn *t, uint32_t u);
uint32_t txn_unit_complete(const refit_txn *t, uint32_t u);
bool txn_wrote(const refit_txn *t);
/* Nothing delivered yet (OPEN). */
bool txn_untouched(const refit_txn *t);
refit_model *txn_model(const refit_txn *t);
/* Fail t (sticky) with status; returns it. */
int txn_load_fail(refit_txn *t, int status);

/* load_many.c: deliver rows [0, n) of a table, whole, all checked first.
 * The row source is either a descriptor table (fresh: checked here) or a
 * prepared set (checked when built: admitted only). */
typedef struct load_table {
    size_t n;
    const char *const *names;   /* fresh */
    const refit_tensor *srcs;   /* fresh */
    const delivery *prepared;   /* a set: every row load_check'ed */
    bool plain;                 /* prepared, names unique, no STAGED route: into
                                   a txn with nothing delivered, no row can be
                                   refused (no forecast needed) */
} load_table;
int load_table_run(refit_txn *t, const load_table *tab, void *stream, const char *call);

/* refit_model_destroy (model.c): free the marks of load_many.c, and
 * detach the model's source sets (load_set.c), which then refuse loads. */
void load_model_release(refit_model *m);
void load_marks_free(refit_model *m);

#endif
