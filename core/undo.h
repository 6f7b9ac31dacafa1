/* The undo log of a transaction with rollback: the old bytes of every
 * runtime tensor, saved before its first write, restored last-in first-out
 * (so tensors that share storage come back in the right order).
 *
 * Saved bytes go to device memory while the context's undo_device_budget
 * lasts (a copy on the device, no PCIe), then to the backend's host undo
 * memory (pinned for a device backend). One save may be split between
 * the two. Chunks of both kinds are pooled by the model across updates;
 * device chunks held, pooled or in use, never exceed the budget.
 *
 * The pool can be filled ahead of the first update (undo_pool_reserve, at
 * seal): on a thread of its own, with what a full update of the model
 * would take, so that the first update allocates nothing (docs/core.md
 * "Undo log"). */
#ifndef REFIT_CORE_UNDO_H
#define REFIT_CORE_UNDO_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"

typedef enum undo_place {
    UNDO_DEVICE = 0,            /* backend->undo_dev_alloc memory */
    UNDO_HOST = 1,              /* backend->undo_alloc memory */
} undo_place;

typedef struct undo_entry {
    char *dst;                  /* runtime bytes */
    char *saved;                /* their old contents, in a chunk */
    size_t n;
    const backend *be;
    int device;                 /* of dst */
    undo_place place;
    /* a scatter's (undo_scatter): the elements it wrote, as scattered
     * (offsets, counts in a host chunk); off NULL: a span of n bytes */
    const int64_t *off, *counts;
    size_t n_off;
    int64_t run_stride;
    refit_dtype dtype;
    refit_device dst_device;
} undo_entry;

typedef struct undo_chunk undo_chunk;
typedef struct undo_pool undo_pool;

typedef struct undo_log {
    undo_entry *e;
    uint32_t n_entries, cap;
    uint32_t n;                 /* saves (undo_save calls that succeeded) */
    undo_chunk *chunks;         /* taken by this log, newest first */
    undo_chunk *cur[2];         /* being filled, per undo_place */
    uint64_t bytes;             /* total saved */
    uint64_t placed[2];         /* bytes saved per undo_place */
    uint64_t device_budget;     /* device chunk bytes the model may hold */
    uint64_t held[2];           /* chunk bytes per undo_place, pooled or taken */
    int device_refused;         /* undo_dev_alloc failed: host for the rest */
    int settled;                /* the pool's reservation was waited for, held read */
    undo_pool **pool;           /* where chunks go back to, or NULL */
} undo_log;

/* Start a log whose chunks come from and go back to *pool (pool NULL: no
 * pool; *pool NULL: one is made when chunks go back), with up to
 * device_budget bytes of device chunks (0: host only). Never waits: a
 * reservation still running is waited for at the first save. */
void undo_init(undo_log *u, undo_pool **pool, uint64_t device_budget);
/* Save n bytes at dst (on device `device` of be) before they are first
 * overwritten: queued on stream ahead of any later write queued there. */
int undo_save(undo_log *u, const backend *be, int device, char *dst, size_t n, void *stream);
/* Apply scatter s with be->scatter (ordered on stream), saving first the
 * old bytes of exactly the elements it writes: the backend gathers them in
 * the same pass into the log's memory (device while the budget lasts,
 * else host), and the offsets (and counts) are copied into a host chunk
 * for the restore, which scatters the old bytes back. s may go as several
 * pieces, split where a chunk ends. */
int undo_scatter(undo_log *u, const backend *be, int device, const backend_scatter *s,
                 void *stream);
/* Put every saved byte back, newest first, and wait for it. Returns the
 * first failure but still tries every entry. */
int undo_restore_all(undo_log *u, void *stream);
/* Release the log; its chunks go back to the pool when it has one. */
void undo_free(undo_log *u);

/* ---- the model's pool ---- */

/* One runtime tensor's span, as a full update with rollback saves it. */
typedef struct undo_span {
    const backend *be;
    int device;
    size_t bytes;
} undo_span;

/* Fill *pool (made if NULL) with chunks enough for saving spans[0, n) with
 * up to device_budget bytes in device memory: device chunks first, within
 * the budget, where the backend has them; host chunks for the rest. What
 * the pool already holds counts. background: on a thread of its own, so
 * this returns at once (a thread that cannot start: here). A failed
 * allocation ends the reservation (an update then allocates what it
 * lacks, as with none). Returns REFIT_OK or REFIT_ENOMEM (no pool). */
int undo_pool_reserve(undo_pool **pool, const undo_span *spans, uint32_t n,
                      uint64_t device_budget, int background);
/* Wait for a reservation in progress (none: returns at once); a hold
 * ends. */
void undo_pool_settle(undo_pool *pool);
/* on 1: a reservation in progress allocates no further chunk until on 0
 * (an update that saves nothing copies meanwhile: each pinned allocation
 * stalls the driver's other calls while it runs). NULL: no-op. */
void undo_pool_hold(undo_pool *pool, int on);

typedef struct undo_pool_stats {
    uint64_t bytes[2];          /* chunk bytes pooled, per undo_place */
    uint32_t chunks;            /* chunks pooled */
    uint64_t allocs;            /* chunks ever allocated for the pool (reservation and logs) */
    uint64_t reserved[2];       /* of those, bytes the reservation allocated */
    uint64_t reserve_ns;        /* time the reservation took */
    int reserving;              /* 1 while its thread runs (nothing else read then) */
    int reserve_failed;         /* an allocation of the reservation failed */
} undo_pool_stats;
/* The pool's figures (pool NULL: zeros). Does not wait: while the
 * reservation runs only `reserving` is filled in. */
void undo_pool_stats_get(undo_pool *pool, undo_pool_stats *out);
/* Bytes of chunks in a pool, per undo_place (out[2]); chunks counted.
 * Waits for a reservation in progress. */
uint32_t undo_pool_bytes(undo_pool *const *pool, uint64_t out[2]);
/* Wait for a reservation, free every chunk and the pool; *pool = NULL. */
void undo_pool_free(undo_pool **pool);

#endif
