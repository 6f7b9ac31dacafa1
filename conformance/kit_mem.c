/* The kit's buffers: see kit_mem.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef REFIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda/backend_cuda.h"
#endif

#include "conformance/kit_mem.h"

static int on_host(refit_device dev)
{
    return dev.device_type != REFIT_DEVICE_CUDA;
}

#ifdef REFIT_HAVE_CUDA
int kit_mem_device_ready(int dev, char *why, size_t n)
{
    int count = backend_cuda_device_count();
    if (count == 0) {
        const char *u = backend_cuda_unavailable();
        snprintf(why, n, "no CUDA device: %s", u && *u ? u : "the CUDA runtime finds none");
        return 0;
    }
    if (dev < 0 || dev >= count) {
        snprintf(why, n, "no CUDA device %d: the runtime sees %d (cuda:0 to cuda:%d)", dev, count,
                 count - 1);
        return 0;
    }
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        snprintf(why, n, "cudaSetDevice(%d): %s", dev, cudaGetErrorString(e));
        return 0;
    }
    return 1;
}
#else
int kit_mem_device_ready(int dev, char *why, size_t n)
{
    snprintf(why, n, "this refit-format-conformance was built without CUDA (refit was "
             "configured with -Dcuda=disabled or found no nvcc), so it cannot run on cuda:%d",
             dev);
    return 0;
}
#endif

void *kit_mem_alloc(refit_device dev, size_t bytes)
{
    size_t n = bytes ? (bytes + 63) & ~(size_t)63 : 64;
    if (on_host(dev))
        return aligned_alloc(64, n);
#ifdef REFIT_HAVE_CUDA
    void *p = NULL;
    if (cudaSetDevice(dev.device_id) != cudaSuccess || cudaMalloc(&p, n) != cudaSuccess)
        return NULL;
    return p;
#else
    return NULL;
#endif
}

void kit_mem_free(refit_device dev, void *p)
{
    if (!p)
        return;
    if (on_host(dev)) {
        free(p);
        return;
    }
#ifdef REFIT_HAVE_CUDA
    cudaSetDevice(dev.device_id);
    cudaFree(p);
#endif
}

int kit_mem_put(refit_device dev, void *p, const void *src, size_t bytes)
{
    if (on_host(dev)) {
        memcpy(p, src, bytes);
        return 0;
    }
#ifdef REFIT_HAVE_CUDA
    return cudaSetDevice(dev.device_id) == cudaSuccess &&
                   cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess
               ? 0 : -1;
#else
    return -1;
#endif
}

int kit_mem_get(refit_device dev, void *dst, const void *p, size_t bytes)
{
    if (on_host(dev)) {
        memcpy(dst, p, bytes);
        return 0;
    }
#ifdef REFIT_HAVE_CUDA
    /* cudaMemcpy waits for the device: what the update queued is done */
    return cudaSetDevice(dev.device_id) == cudaSuccess &&
                   cudaMemcpy(dst, p, bytes, cudaMemcpyDeviceToHost) == cudaSuccess
               ? 0 : -1;
#else
    return -1;
#endif
}

int kit_mem_fill(refit_device dev, void *p, unsigned char b, size_t bytes)
{
    if (on_host(dev)) {
        memset(p, b, bytes);
        return 0;
    }
#ifdef REFIT_HAVE_CUDA
    return cudaSetDevice(dev.device_id) == cudaSuccess &&
                   cudaMemset(p, b, bytes) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess
               ? 0 : -1;
#else
    return -1;
#endif
}
