/* Backends move bytes on one kind of memory. The host backend serves CPU
 * and pinned memory and always builds; the CUDA backend (core/cuda/, with
 * the CUDA issue) serves device memory. The state machine calls these and
 * never a memcpy of its own, so a device model changes only this table. */
#ifndef REFIT_CORE_BACKEND_H
#define REFIT_CORE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>

typedef struct backend {
    const char *name;
    /* dst <- src (same shape), casting F32/F16/BF16 where dtypes differ.
     * src may be host memory for any backend. */
    int (*copy)(const refit_view *dst, const refit_view *src, void *stream);
    /* Every element of dst to zero bytes. */
    int (*zero)(const refit_view *dst, void *stream);
    /* Content fingerprint of v (kernels/fingerprint.h). */
    int (*fingerprint)(const refit_view *v, uint64_t *out, void *stream);
    /* Staging memory for STAGED routes; NULL when none is left. */
    void *(*staging_alloc)(size_t bytes);
    void (*staging_free)(void *p);
    /* Undo log: save n bytes at src into host memory at dst, and back. */
    int (*save)(void *host_dst, const void *src, size_t n, void *stream);
    int (*restore)(void *dst, const void *host_src, size_t n, void *stream);
    /* Wait for work queued on stream. */
    int (*sync)(void *stream);
} backend;

extern const backend backend_host;

/* The backend serving memory on dev, or NULL when none does here. */
const backend *backend_for_device(refit_device dev);

#endif
