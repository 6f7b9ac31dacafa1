/* The CUDA side of the host services (core/host_services.h): compute
 * capability, device scratch, status words, and a plugin's own device code
 * loaded through the runtime's library API (cudaLibraryLoadData: one load
 * serves every device, kernels found by name), launched on the plugin's
 * stream after the copies the backend queued there (backend_cuda_run). No
 * format is named here. */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "core/cuda/backend_cuda.h"
#include "core/host_services.h"

static int cuda_msg(cudaError_t e, const char *what, char *msg, size_t n)
{
    snprintf(msg, n, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return e == cudaErrorMemoryAllocation ? REFIT_ENOMEM
         : e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidKernelImage ||
                   e == cudaErrorUnsupportedPtxVersion
               ? REFIT_EUNSUPPORTED
               : REFIT_EINTERNAL;
}

int gpusvc_device_cc(int dev, int *major, int *minor)
{
    *major = *minor = 0;
    if (!backend_cuda_get())
        return REFIT_EUNSUPPORTED;
    if (cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        *major = *minor = 0;
        return REFIT_EINTERNAL;
    }
    return REFIT_OK;
}

int gpusvc_device_sms(int dev)
{
    int v = 0;
    if (!backend_cuda_get() ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 0;
    return v;
}

void *gpusvc_alloc(int dev, size_t bytes, char *msg, size_t n)
{
    int prev = 0;
    cudaGetDevice(&prev);
    void *p = NULL;
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess)
        e = cudaMalloc(&p, bytes ? bytes : 1);
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
        cuda_msg(e, "cudaMalloc", msg, n);
        return NULL;
    }
    return p;
}

void gpusvc_free(int dev, void *p)
{
    if (!p)
        return;
    int prev = 0;
    cudaGetDevice(&prev);
    if (cudaSetDevice(dev) == cudaSuccess)
        cudaFree(p);
    cudaSetDevice(prev);
}

typedef struct word_set {
    uint32_t *word;
    uint32_t count;
    cudaError_t e;
} word_set;

static int set_words(void *arg, void *stream)
{
    word_set *w = arg;
    w->e = cudaMemsetAsync(w->word, 0xff, (size_t)w->count * sizeof *w->word,
                           (cudaStream_t)stream);
    return w->e == cudaSuccess ? REFIT_OK : REFIT_EINTERNAL;
}

int gpusvc_memset_word(int dev, uint32_t *word, uint32_t count, void *stream, char *msg,
                       size_t n)
{
    word_set w = {word, count, cudaSuccess};
    int rc = backend_cuda_run(dev, stream, set_words, &w);
    if (rc && w.e != cudaSuccess)
        return cuda_msg(w.e, "setting the status word", msg, n);
    if (rc)
        snprintf(msg, n, "%s", backend_cuda_last_error());
    return rc;
}

int gpusvc_read(int dev, void *host_dst, const void *src, size_t bytes, char *msg, size_t n)
{
    int prev = 0;
    cudaGetDevice(&prev);
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize(); /* the one wait: every post-load on dev is done */
    if (e == cudaSuccess)
        e = cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost);
    cudaSetDevice(prev);
    return e == cudaSuccess ? REFIT_OK : cuda_msg(e, "reading the status words", msg, n);
}

int gpusvc_load(const void *image, size_t size, void **lib, char *msg, size_t n)
{
    (void)size; /* a fatbin, cubin or PTX image carries its own length */
    if (!backend_cuda_get()) {
        snprintf(msg, n, "no CUDA device: %s", backend_cuda_unavailable());
        return REFIT_EUNSUPPORTED;
    }
    cudaLibrary_t l = NULL;
    cudaError_t e = cudaLibraryLoadData(&l, image, NULL, NULL, 0, NULL, NULL, 0);
    if (e != cudaSuccess)
        return cuda_msg(e, "cudaLibraryLoadData of the plugin's device code", msg, n);
    *lib = l;
    return REFIT_OK;
}

void gpusvc_unload(void *lib)
{
    if (lib)
        cudaLibraryUnload((cudaLibrary_t)lib);
}

int gpusvc_kernel(void *lib, const char *name, void **kernel, char *msg, size_t n)
{
    cudaKernel_t k = NULL;
    cudaError_t e = cudaLibraryGetKernel(&k, (cudaLibrary_t)lib, name);
    if (e == cudaErrorSymbolNotFound || e == cudaErrorInvalidDeviceFunction) {
        cudaGetLastError();
        snprintf(msg, n, "no kernel '%s' in the plugin's device code (an extern \"C\" "
                 "__global__ function of that name?)", name);
        return REFIT_ENOTFOUND;
    }
    if (e != cudaSuccess)
        return cuda_msg(e, "cudaLibraryGetKernel", msg, n);
    *kernel = k;
    return REFIT_OK;
}

typedef struct launch_call {
    void *kernel;
    const refit_gpu_launch *l;
    cudaError_t e;
} launch_call;

static unsigned dim1(uint32_t v)
{
    return v ? v : 1;
}

static int do_launch(void *arg, void *stream)
{
    launch_call *c = arg;
    const refit_gpu_launch *l = c->l;
    dim3 grid = {dim1(l->grid[0]), dim1(l->grid[1]), dim1(l->grid[2])};
    dim3 block = {dim1(l->block[0]), dim1(l->block[1]), dim1(l->block[2])};
    c->e = cudaLaunchKernel((const void *)c->kernel, grid, block, l->args, l->shared_bytes,
                            (cudaStream_t)stream);
    return c->e == cudaSuccess ? REFIT_OK : REFIT_EINTERNAL;
}

int gpusvc_launch(int dev, void *kernel, const refit_gpu_launch *l, void *stream, char *msg,
                  size_t n)
{
    launch_call c = {kernel, l, cudaSuccess};
    int rc = backend_cuda_run(dev, stream, do_launch, &c);
    if (rc && c.e != cudaSuccess) {
        cudaGetLastError();
        rc = cuda_msg(c.e, "cudaLaunchKernel", msg, n);
        if (rc == REFIT_EUNSUPPORTED) {
            int major = 0, minor = 0;
            gpusvc_device_cc(dev, &major, &minor);
            size_t used = strlen(msg);
            snprintf(msg + used, n - used, ": the plugin's device code has no code for "
                     "compute capability %d.%d (CUDA device %d)", major, minor, dev);
        }
        return rc;
    }
    if (rc)
        snprintf(msg, n, "%s", backend_cuda_last_error());
    return rc;
}

int gpusvc_run(int dev, void *stream, int (*fn)(void *arg, void *stream), void *arg, char *msg,
               size_t n)
{
    int rc = backend_cuda_run(dev, stream, fn, arg);
    if (rc)
        snprintf(msg, n, "%s", backend_cuda_last_error());
    return rc;
}
