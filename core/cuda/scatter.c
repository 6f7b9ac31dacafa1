/* The CUDA backend's scatter: what the device cannot read is staged, then
 * one kernel (kern_scatter_cuda) writes the patch and gathers the old
 * bytes into the undo log's memory in the same pass. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "core/cuda/backend_cuda.h"
#include "core/cuda/kern_cuda.h"
#include "core/cuda/scatter.h"
#include "kernels/copy.h"

/* The device address of host memory p when it is pinned (mapped into the
 * device's address space), else NULL. */
static void *mapped(const void *p)
{
    void *d = NULL;
    if (cudaHostGetDevicePointer(&d, (void *)p, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return d;
}

static int cu_err(cudaError_t e, const char *what)
{
    char m[256];
    snprintf(m, sizeof m, "scatter: %s: %s (%s)", what, cudaGetErrorString(e),
             cudaGetErrorName(e));
    kern_cuda_set_error(m);
    return e == cudaErrorMemoryAllocation ? REFIT_ENOMEM : REFIT_EINTERNAL;
}

static size_t up16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Staged parts: where each lands in the device block (SIZE_MAX: not
 * staged). */
typedef struct stage {
    size_t off, counts, vstart, values, peer, bytes;
} stage;

/* Runs on the device of s->dst under the backend's lock (backend_cuda_run). */
static int scatter_launch(void *arg, void *stream)
{
    const backend_scatter *s = arg;
    cudaStream_t st = (cudaStream_t)stream;
    kern_scatter k = *s;
    size_t ve = kern_dtype_size(s->values_dtype), n8 = s->n * sizeof(int64_t);
    size_t vbytes = (size_t)s->elements * ve;
    bool runs = s->counts != NULL;
    /* the caller's arrays are read before the call returns: staged, unless
     * the undo log holds them (pinned, valid until the stream is synced) */
    const void *off_d = s->arrays_held ? mapped(s->off) : NULL;
    const void *cnt_d = runs && s->arrays_held ? mapped(s->counts) : NULL;
    const void *val_d = NULL;
    bool peer = false;
    if (s->values_device.device_type == REFIT_DEVICE_CUDA) {
        peer = s->values_device.device_id != s->dst_device.device_id;
        val_d = peer ? NULL : s->values;
    } else {
        val_d = mapped(s->values);
    }
    if (s->old) {
        k.old = s->old_on_device ? s->old : mapped(s->old);
        if (!k.old) {
            kern_cuda_set_error("scatter: the undo log's host memory is not pinned");
            return REFIT_EINTERNAL;
        }
    }
    stage g = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, 0};
    if (!off_d)
        g.off = g.bytes, g.bytes += up16(n8);
    if (runs && !cnt_d)
        g.counts = g.bytes, g.bytes += up16(n8);
    if (runs)
        g.vstart = g.bytes, g.bytes += up16(n8);
    if (!val_d && !peer)
        g.values = g.bytes, g.bytes += up16(vbytes);
    size_t host_bytes = g.bytes; /* [0, host_bytes) is packed on the host */
    if (peer)
        g.peer = g.bytes, g.bytes += up16(vbytes);
    char *dev = NULL, *host = NULL;
    int rc = REFIT_OK;
    cudaError_t e;
    if (g.bytes && (e = cudaMallocAsync((void **)&dev, g.bytes, st)) != cudaSuccess)
        return cu_err(e, "cudaMallocAsync (staging)");
    if (host_bytes && !(host = malloc(host_bytes))) {
        kern_cuda_set_error("scatter: out of host memory for staging");
        rc = REFIT_ENOMEM;
        goto out;
    }
    if (g.off != SIZE_MAX)
        memcpy(host + g.off, s->off, n8);
    if (g.counts != SIZE_MAX)
        memcpy(host + g.counts, s->counts, n8);
    if (g.vstart != SIZE_MAX) {
        int64_t *v = (int64_t *)(void *)(host + g.vstart), j = 0;
        for (size_t i = 0; i < s->n; i++) {
            v[i] = j;
            j += s->counts[i];
        }
    }
    if (g.values != SIZE_MAX) {
        char *v = host + g.values;
        if (s->values_stride == 1)
            memcpy(v, s->values, vbytes);
        else
            for (int64_t i = 0; i < s->elements; i++)
                memcpy(v + i * (int64_t)ve,
                       (const char *)s->values + i * s->values_stride * (int64_t)ve, ve);
    }
    /* pageable source: returns once the bytes are staged, so host may go */
    if (host_bytes &&
        (e = cudaMemcpyAsync(dev, host, host_bytes, cudaMemcpyHostToDevice, st)) != cudaSuccess) {
        rc = cu_err(e, "cudaMemcpyAsync (staging)");
        goto out;
    }
    if (peer) {
        if (s->values_stride != 1) {
            kern_cuda_set_error("scatter: strided values on another device");
            rc = REFIT_EUNSUPPORTED;
            goto out;
        }
        e = cudaMemcpyPeerAsync(dev + g.peer, s->dst_device.device_id, s->values,
                                s->values_device.device_id, vbytes, st);
        if (e != cudaSuccess) {
            rc = cu_err(e, "cudaMemcpyPeerAsync (values)");
            goto out;
        }
    }
    k.off = g.off != SIZE_MAX ? (const int64_t *)(void *)(dev + g.off) : off_d;
    if (runs)
        k.counts = g.counts != SIZE_MAX ? (const int64_t *)(void *)(dev + g.counts) : cnt_d;
    if (g.values != SIZE_MAX || peer) {
        k.values = dev + (peer ? g.peer : g.values);
        k.values_stride = 1;
    } else {
        k.values = val_d;
    }
    rc = kern_scatter_cuda(&k, runs ? (const int64_t *)(void *)(dev + g.vstart) : NULL, st);
out:
    free(host);
    if (dev && (e = cudaFreeAsync(dev, st)) != cudaSuccess && !rc)
        rc = cu_err(e, "cudaFreeAsync (staging)");
    return rc;
}

int backend_cuda_scatter(const backend_scatter *s, void *stream)
{
    if (s->dst_device.device_type != REFIT_DEVICE_CUDA) {
        kern_cuda_set_error("scatter: destination is not device memory");
        return REFIT_EUNSUPPORTED;
    }
    if (s->n == 0)
        return REFIT_OK;
    return backend_cuda_run(s->dst_device.device_id, stream, scatter_launch, (void *)s);
}
