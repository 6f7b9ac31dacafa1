/* The undo log of a transaction with rollback: the old bytes of every
 * runtime tensor, saved before its first write, restored last-in first-out
 * (so tensors that share storage come back in the right order).
 *
 * Saved bytes go to device memory while the context's undo_device_budget
 * lasts (a copy on the device, no PCIe), then to the backend's host undo
 * memory (pinned for a device backend). One save may be split between
 * the two. Chunks of both kinds are pooled by the model across updates;
 * device chunks held, pooled or in use, never exceed the budget. */
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
} undo_entry;

typedef struct undo_chunk undo_chunk;

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
    undo_chunk **pool;          /* where chunks go back to, or NULL */
} undo_log;

/* Start a log whose chunks come from and go back to *pool (NULL: none),
 * with up to device_budget bytes of device chunks (0: host only). */
void undo_init(undo_log *u, undo_chunk **pool, uint64_t device_budget);
/* Save n bytes at dst (on device `device` of be) before they are first
 * overwritten: queued on stream ahead of any later write queued there. */
int undo_save(undo_log *u, const backend *be, int device, char *dst, size_t n, void *stream);
/* Put every saved byte back, newest first, and wait for it. Returns the
 * first failure but still tries every entry. */
int undo_restore_all(undo_log *u, void *stream);
/* Release the log; its chunks go back to the pool when it has one. */
void undo_free(undo_log *u);
/* Free every chunk of a pool. */
void undo_pool_free(undo_chunk **pool);
/* Bytes of chunks in a pool, per undo_place (out[2]); chunks counted. */
uint32_t undo_pool_bytes(undo_chunk *const *pool, uint64_t out[2]);

#endif
