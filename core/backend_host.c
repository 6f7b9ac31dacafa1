/* The host backend: CPU and pinned memory, reference kernels. */
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "kernels/copy.h"
#include "kernels/fingerprint.h"
#include "kernels/scatter.h"
#ifdef REFIT_HAVE_CUDA
#include "core/cuda/backend_cuda.h"
#endif

static int host_can_read(refit_device src)
{
    return src.device_type == REFIT_DEVICE_CPU || src.device_type == REFIT_DEVICE_CUDA_HOST;
}

static int host_copy(const refit_view *dst, const refit_view *src, void *stream)
{
    (void)stream;
    return kern_copy(dst, src);
}

static int host_zero(const refit_view *dst, void *stream)
{
    (void)stream;
    return kern_zero(dst);
}

static int host_fingerprint(const refit_view *v, uint64_t *out, void *stream)
{
    (void)stream;
    *out = kern_fingerprint_view(v);
    return REFIT_OK;
}

static void *host_staging_alloc(size_t bytes)
{
    return malloc(bytes ? bytes : 1);
}

static int host_move(void *dst, const void *src, size_t n, void *stream)
{
    (void)stream;
    if (n)
        memcpy(dst, src, n);
    return REFIT_OK;
}

static void *host_undo_alloc(size_t bytes)
{
    return malloc(bytes ? bytes : 1);
}

/* The host backend's "device" undo memory is its own memory too, so the
 * device placement of the undo log runs (and is tested) without a GPU. */
static void *host_undo_dev_alloc(int device, size_t bytes)
{
    (void)device;
    return malloc(bytes ? bytes : 1);
}

static void host_undo_dev_free(int device, void *p)
{
    (void)device;
    free(p);
}

static int host_save_dev(void *dst, const void *src, size_t n, int device, void *stream)
{
    (void)device;
    return host_move(dst, src, n, stream);
}

static int host_restore_dev(void *dst, const void *src, size_t n, int device)
{
    (void)device;
    return host_move(dst, src, n, NULL);
}

static int host_scatter(const backend_scatter *s, void *stream)
{
    (void)stream;
    return kern_scatter_host(s);
}

static int host_sync(void *stream)
{
    (void)stream;
    return REFIT_OK;
}

/* Host kernels fail only on arguments, which their status says. */
static const char *host_last_error(void)
{
    return "";
}

const backend backend_host = {
    .name = "host",
    .can_read = host_can_read,
    .copy = host_copy,
    .flush = host_sync,
    .zero = host_zero,
    .fingerprint = host_fingerprint,
    .staging_alloc = host_staging_alloc,
    .staging_free = free,
    .undo_alloc = host_undo_alloc,
    .undo_free = free,
    .save = host_move,
    .restore = host_move,
    .sync = host_sync,
    .last_error = host_last_error,
    .undo_dev_alloc = host_undo_dev_alloc,
    .undo_dev_free = host_undo_dev_free,
    .save_dev = host_save_dev,
    .restore_dev = host_restore_dev,
    .scatter = host_scatter,
};

const backend *backend_for_device(refit_device dev)
{
    switch (dev.device_type) {
    case REFIT_DEVICE_CPU:
    case REFIT_DEVICE_CUDA_HOST:
        return &backend_host;
#ifdef REFIT_HAVE_CUDA
    case REFIT_DEVICE_CUDA:
        return backend_cuda_get(); /* NULL when the runtime finds no device */
#endif
    default:
        return NULL;
    }
}

int backend_read(const backend *be, void *dst, const void *src, size_t n, void *stream)
{
    if (n == 0)
        return REFIT_OK;
    int rc = be->flush(stream);
    void *buf = rc ? NULL : be->undo_alloc(n); /* a save's destination: pinned */
    if (!rc && !buf)
        rc = REFIT_ENOMEM;
    if (!rc)
        rc = be->save(buf, src, n, stream);
    if (!rc)
        rc = be->sync(stream);
    if (!rc)
        memcpy(dst, buf, n);
    if (buf)
        be->undo_free(buf);
    return rc;
}
