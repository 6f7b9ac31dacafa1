/* Backends move bytes on one kind of memory. The host backend serves CPU
 * and pinned memory and always builds; the CUDA backend (core/cuda/, with
 * the CUDA issue) serves device memory. The state machine calls these and
 * never a memcpy of its own, so a device model changes only this table. */
#ifndef REFIT_CORE_BACKEND_H
#define REFIT_CORE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>

#include "kernels/scatter.h"

/* One scatter (core/delta.c's patches, core/undo.c's restore of them):
 * kernels/scatter.h says what each field means. */
typedef kern_scatter backend_scatter;

typedef struct backend {
    const char *name;
    /* 1 when copy() can read a source on that device (host memory can be
     * read by every backend). */
    int (*can_read)(refit_device src);
    /* dst <- src (same shape), casting F32/F16/BF16 where dtypes differ.
     * May only enqueue the work (batched with other small copies): a
     * pageable host src is consumed before it returns, a device or pinned
     * src must stay valid until flush + sync of the stream. */
    int (*copy)(const refit_view *dst, const refit_view *src, void *stream);
    /* Submit whatever copy() queued on stream (does not wait). */
    int (*flush)(void *stream);
    /* Every element of dst to zero bytes. */
    int (*zero)(const refit_view *dst, void *stream);
    /* Content fingerprint of v (kernels/fingerprint.h). */
    int (*fingerprint)(const refit_view *v, uint64_t *out, void *stream);
    /* Staging memory for STAGED routes; NULL when none is left. */
    void *(*staging_alloc)(size_t bytes);
    void (*staging_free)(void *p);
    /* Host memory for the undo log (pinned where that makes saves async). */
    void *(*undo_alloc)(size_t bytes);
    void (*undo_free)(void *p);
    /* Undo log: save n bytes at src into host memory from undo_alloc, ordered
     * on stream; restore them (blocking: abort is not a hot path). */
    int (*save)(void *host_dst, const void *src, size_t n, void *stream);
    int (*restore)(void *dst, const void *host_src, size_t n, void *stream);
    /* Flush, then wait for everything queued on stream; reports a failure
     * of any queued work. Waits for the stream only, never the device. */
    int (*sync)(void *stream);
    /* What the last failing call on this thread saw ("" when nothing), for
     * the transaction's message. */
    const char *(*last_error)(void);
    /* on = 1: until the call with on = 0 for the same stream, a pageable
     * src given to copy() on stream stays valid and unchanged, so copy() may
     * return before reading it (refit_load_source holds its mapped files
     * around its loop). on = 0 returns once every such byte was read; it
     * reports a failure of the deferred work. NULL: copy() always reads
     * pageable sources before it returns. */
    int (*hold_host_sources)(void *stream, int on);
    /* ---- device undo log (core/undo.c); NULL: the log is host only ---- */
    /* Memory of this backend's own kind on device, for undo saves within
     * the context's undo_device_budget (the log counts and pools it: this
     * may be slow, like cudaMalloc). NULL when none can be had. */
    void *(*undo_dev_alloc)(int device, size_t bytes);
    void (*undo_dev_free)(int device, void *p);
    /* n bytes at src into dev_dst (from undo_dev_alloc) on the device,
     * queued on stream ahead of any later write queued there; no wait. */
    int (*save_dev)(void *dev_dst, const void *src, size_t n, int device, void *stream);
    /* Put them back; blocking (every stream was waited for first). */
    int (*restore_dev)(void *dst, const void *dev_src, size_t n, int device);
    /* The scatter s, ordered on stream (no wait); the host backend's
     * returns with it done. */
    int (*scatter)(const backend_scatter *s, void *stream);
} backend;

extern const backend backend_host;

/* The backend serving memory on dev, or NULL when none does here. */
const backend *backend_for_device(refit_device dev);

/* n bytes at src (memory be serves) into dst (any host memory), after
 * every copy queued on stream before the call: flushed first, since a
 * save waiting in a batch would run ahead of them; waits for the stream. */
int backend_read(const backend *be, void *dst, const void *src, size_t n, void *stream);

#endif
