/* The undo log of a transaction with rollback: the old bytes of every
 * runtime tensor, saved before its first write, restored last-in first-out
 * (so tensors that share storage come back in the right order). */
#ifndef REFIT_CORE_UNDO_H
#define REFIT_CORE_UNDO_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"

typedef struct undo_entry {
    char *dst;                  /* runtime bytes */
    char *saved;                /* their old contents, in the arena */
    size_t n;
    const backend *be;
} undo_entry;

typedef struct undo_chunk undo_chunk;

typedef struct undo_log {
    undo_entry *e;
    uint32_t n, cap;
    undo_chunk *chunks;         /* arena for saved bytes */
    uint64_t bytes;             /* total saved */
    undo_chunk **pool;          /* where chunks go back to (pinned memory is
                                   slow to allocate: reuse it), or NULL */
} undo_log;

/* Save n bytes at dst before they are first overwritten. */
int undo_save(undo_log *u, const backend *be, char *dst, size_t n, void *stream);
/* Put every saved byte back, newest first. Returns the first failure but
 * still tries every entry. */
int undo_restore_all(undo_log *u, void *stream);
/* Release the log; its chunks go back to the pool when it has one. */
void undo_free(undo_log *u);
/* Free every chunk of a pool. */
void undo_pool_free(undo_chunk **pool);

#endif
