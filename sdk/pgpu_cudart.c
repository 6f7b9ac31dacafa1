/* pgpu_cudart.h: the launch table over the CUDA runtime (test-only). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "sdk/pgpu_cudart.h"

#define PC_DEVICES 64
#define PC_IMAGES 16

typedef struct pc_dev {
    char *scratch;
    size_t cap;
    uint32_t *word, *host_word;
    int sms;
} pc_dev;

static pthread_mutex_t pc_mu = PTHREAD_MUTEX_INITIALIZER;
static pc_dev pc_devs[PC_DEVICES];
static struct {
    const void *image;
    cudaLibrary_t lib;
} pc_libs[PC_IMAGES];

static int pc_cuda(refit_pgpu *g, cudaError_t e, const char *what)
{
    return refit_pgpu_fail(g, e == cudaErrorMemoryAllocation ? REFIT_ENOMEM : REFIT_EINTERNAL,
                           "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static pgpu_cudart *of(refit_pgpu *g)
{
    return (pgpu_cudart *)(void *)g;
}

static int pc_kernel(refit_pgpu *g, const char *name, void **kernel)
{
    cudaKernel_t k = NULL;
    cudaError_t e = cudaLibraryGetKernel(&k, (cudaLibrary_t)of(g)->lib, name);
    if (e != cudaSuccess)
        return pc_cuda(g, e, name);
    *kernel = k;
    return REFIT_OK;
}

static int pc_launch(refit_pgpu *g, void *kernel, uint32_t grid, uint32_t block, void **args)
{
    dim3 gd = {grid ? grid : 1, 1, 1}, bd = {block ? block : 1, 1, 1};
    cudaError_t e = cudaLaunchKernel((const void *)kernel, gd, bd, args, 0,
                                     (cudaStream_t)of(g)->stream);
    return e == cudaSuccess ? REFIT_OK : pc_cuda(g, e, "cudaLaunchKernel");
}

static int pc_launch_dims(refit_pgpu *g, void *kernel, const refit_gpu_launch *l)
{
    dim3 gd = {l->grid[0] ? l->grid[0] : 1, l->grid[1] ? l->grid[1] : 1,
               l->grid[2] ? l->grid[2] : 1};
    dim3 bd = {l->block[0] ? l->block[0] : 1, l->block[1] ? l->block[1] : 1,
               l->block[2] ? l->block[2] : 1};
    cudaError_t e = cudaLaunchKernel((const void *)kernel, gd, bd, l->args, l->shared_bytes,
                                     (cudaStream_t)of(g)->stream);
    return e == cudaSuccess ? REFIT_OK : pc_cuda(g, e, "cudaLaunchKernel");
}

/* Slices of the device's buffer; a call that needs more than it holds
 * waits for the device and grows it (only before its first slice). */
static void *pc_scratch(refit_pgpu *g, size_t bytes)
{
    pgpu_cudart *p = of(g);
    pc_dev *d = &pc_devs[p->dev];
    size_t at = (p->used + 255) & ~(size_t)255;
    if (at + bytes > d->cap) {
        if (p->used) {
            refit_pgpu_fail(g, REFIT_ENOMEM, "test scratch: a second slice past the buffer");
            return NULL;
        }
        size_t cap = bytes + bytes / 2 + 4096;
        char *n = NULL;
        cudaError_t e = cudaMalloc((void **)&n, cap);
        if (e != cudaSuccess) {
            pc_cuda(g, e, "test scratch");
            return NULL;
        }
        if (d->scratch) {
            cudaDeviceSynchronize();
            cudaFree(d->scratch);
        }
        d->scratch = n;
        d->cap = cap;
        at = 0;
    }
    p->used = at + bytes;
    return d->scratch + at;
}

static int pc_zero(refit_pgpu *g, void *ptr, size_t bytes)
{
    cudaError_t e = cudaMemsetAsync(ptr, 0, bytes, (cudaStream_t)of(g)->stream);
    return e == cudaSuccess ? REFIT_OK : pc_cuda(g, e, "zeroing scratch");
}

/* Synchronous from pageable memory, so src may be reused at once. */
static int pc_upload(refit_pgpu *g, void *dst, const void *src, size_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                                    (cudaStream_t)of(g)->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize((cudaStream_t)of(g)->stream);
    return e == cudaSuccess ? REFIT_OK : pc_cuda(g, e, "uploading a table");
}

static cudaLibrary_t pc_lib(const void *image, cudaError_t *e)
{
    int free_at = -1;
    for (int i = 0; i < PC_IMAGES; i++) {
        if (pc_libs[i].image == image)
            return pc_libs[i].lib;
        if (!pc_libs[i].image && free_at < 0)
            free_at = i;
    }
    cudaLibrary_t l = NULL;
    *e = free_at < 0 ? cudaErrorMemoryAllocation
                     : cudaLibraryLoadData(&l, image, NULL, NULL, 0, NULL, NULL, 0);
    if (*e != cudaSuccess)
        return NULL;
    pc_libs[free_at].image = image;
    pc_libs[free_at].lib = l;
    return l;
}

static int pc_say(const char *fn, int rc, const char *msg)
{
    char m[320];
    snprintf(m, sizeof m, "%s: %s", fn, msg);
    kern_cuda_set_error(m);
    return rc;
}

int pgpu_cudart_begin(pgpu_cudart *p, const char *fn, const void *image, void *stream)
{
    memset(p, 0, sizeof *p);
    p->g.kernel = pc_kernel;
    p->g.launch = pc_launch;
    p->g.launch_dims = pc_launch_dims;
    p->g.scratch = pc_scratch;
    p->g.zero = pc_zero;
    p->g.upload = pc_upload;
    p->stream = stream;
    pthread_mutex_lock(&pc_mu);
    cudaError_t e = cudaGetDevice(&p->dev);
    int rc = REFIT_OK;
    if (e != cudaSuccess)
        rc = pc_cuda(&p->g, e, "the current device");
    else if (p->dev < 0 || p->dev >= PC_DEVICES)
        rc = refit_pgpu_fail(&p->g, REFIT_EINTERNAL, "device %d past the test table", p->dev);
    pc_dev *d = rc ? NULL : &pc_devs[p->dev];
    if (d && !d->sms) {
        int v = 0;
        if ((e = cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, p->dev)))
            rc = pc_cuda(&p->g, e, "the multiprocessor count");
        d->sms = v > 0 ? v : 1;
    }
    if (!rc && !d->word && (e = cudaMalloc((void **)&d->word, sizeof *d->word)))
        rc = pc_cuda(&p->g, e, "the status word"), d->word = NULL;
    if (!rc && !d->host_word &&
        (e = cudaMallocHost((void **)&d->host_word, sizeof *d->host_word)))
        rc = pc_cuda(&p->g, e, "the pinned status word"), d->host_word = NULL;
    if (!rc && !(p->lib = pc_lib(image, &e)))
        rc = pc_cuda(&p->g, e, "cudaLibraryLoadData of the format's device code");
    if (!rc && (e = cudaMemsetAsync(d->word, 0xff, sizeof *d->word, (cudaStream_t)stream)))
        rc = pc_cuda(&p->g, e, "setting the status word");
    if (rc) {
        pthread_mutex_unlock(&pc_mu);
        return pc_say(fn, rc, p->g.msg);
    }
    p->g.status = d->word;
    p->g.multiprocessors = d->sms;
    return REFIT_OK;
}

int pgpu_cudart_end(pgpu_cudart *p, const char *fn, int rc, int wait, uint32_t *word)
{
    pc_dev *d = &pc_devs[p->dev];
    cudaStream_t st = (cudaStream_t)p->stream;
    *word = REFIT_STATUS_NONE;
    if (rc && p->g.msg[0])
        pc_say(fn, rc, p->g.msg);
    if (wait) {
        cudaError_t e = rc ? cudaSuccess
                           : cudaMemcpyAsync(d->host_word, d->word, sizeof *d->word,
                                             cudaMemcpyDeviceToHost, st);
        cudaError_t se = cudaStreamSynchronize(st);
        if (e == cudaSuccess)
            e = se;
        if (!rc && e != cudaSuccess)
            rc = pc_say(fn, pc_cuda(&p->g, e, "the device work"), p->g.msg);
        if (!rc)
            *word = *d->host_word;
    }
    pthread_mutex_unlock(&pc_mu);
    return rc;
}
