/* Shareable memory for a keeper's runtime tensors (pool.h). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "transports/ipc/pool.h"
#include "core/ctx.h"

int refit_ipc_pool_create(refit_ipc_pool **out, refit_ctx *ctx, int32_t device, uint64_t bytes)
{
    if (!out || !ctx)
        return REFIT_EINVAL;
    *out = NULL;
    ctx_clear_error(ctx);
    if (bytes == 0 || bytes > ((uint64_t)1 << 50))
        return ctx_error(ctx, REFIT_EINVAL, "ipc pool: %llu bytes", (unsigned long long)bytes);
    refit_ipc_pool *p = calloc(1, sizeof *p);
    if (!p)
        return ctx_error(ctx, REFIT_ENOMEM, "ipc pool: out of memory");
    p->ctx = ctx;
    p->d = (ipc_mem_desc){.id = 1, .gen = 1, .device = device, .bytes = bytes, .fd = -1};
    int rc;
    if (device < 0) {
        void *base = NULL;
        p->d.kind = IPC_MEM_HOST_FD;
        rc = ipc_host_export((size_t)bytes, &p->d.fd, &base, p->err, sizeof p->err);
        p->base = base;
    } else {
        CUdeviceptr dp = 0;
        p->d.kind = IPC_MEM_CUDA;
        rc = ipc_cuda_open(&p->cu, device, p->err, sizeof p->err);
        if (!rc)
            rc = ipc_cuda_enter(&p->cu, p->err, sizeof p->err);
        if (!rc)
            rc = ipc_cuda_alloc_export(&p->cu, (size_t)bytes, &dp, p->d.handle, p->err,
                                       sizeof p->err);
        p->base = (uint8_t *)(uintptr_t)dp;
    }
    if (rc) {
        ctx_error(ctx, rc, "ipc pool of %llu bytes: %s", (unsigned long long)bytes, p->err);
        refit_ipc_pool_destroy(p);
        return rc;
    }
    *out = p;
    return REFIT_OK;
}

int refit_ipc_pool_alloc(refit_ipc_pool *p, uint64_t bytes, void **out)
{
    if (!p || !out)
        return REFIT_EINVAL;
    *out = NULL;
    uint64_t at = (p->used + 255) & ~(uint64_t)255;
    if (bytes == 0 || at < p->used || bytes > p->d.bytes || at > p->d.bytes - bytes)
        return ctx_error(p->ctx, REFIT_ENOMEM, "ipc pool: %llu bytes asked, %llu of %llu "
                         "left", (unsigned long long)bytes,
                         (unsigned long long)(p->d.bytes - (at < p->d.bytes ? at : p->d.bytes)),
                         (unsigned long long)p->d.bytes);
    p->used = at + bytes;
    *out = p->base + at;
    return REFIT_OK;
}

void refit_ipc_pool_destroy(refit_ipc_pool *p)
{
    if (!p)
        return;
    if (p->d.kind == IPC_MEM_HOST_FD) {
        if (p->base)
            munmap(p->base, (size_t)p->d.bytes);
        if (p->d.fd >= 0)
            close(p->d.fd);
    } else if (p->d.kind == IPC_MEM_CUDA && p->cu.open) {
        if (p->base && !ipc_cuda_enter(&p->cu, p->err, sizeof p->err))
            p->cu.cu.MemFree((CUdeviceptr)(uintptr_t)p->base);
        ipc_cuda_close(&p->cu);
    }
    free(p);
}

int ipc_pool_holds(const refit_ipc_pool *pool, const void *p, uint64_t n, uint64_t *off)
{
    if (!pool || !pool->base)
        return 0;
    uintptr_t b = (uintptr_t)pool->base, a = (uintptr_t)p;
    if (a < b || a - b > pool->d.bytes || n > pool->d.bytes - (a - b))
        return 0;
    *off = a - b;
    return 1;
}
