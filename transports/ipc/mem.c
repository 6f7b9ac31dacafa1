/* Shared memory of the IPC transport (mem.h): memfd on the host, driver
 * IPC handles and events on a CUDA device. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <refit/refit.h>

#include "transports/ipc/mem.h"
#include "core/errbuf.h"


/* ---- the driver ---- */

static void *sym(const ipc_cuda *c, const char *a, const char *b)
{
    void *h = c->cu.handle ? c->cu.handle : RTLD_DEFAULT;
    void *p = dlsym(h, a);
    return p || !b ? p : dlsym(h, b);
}

int ipc_cuda_open(ipc_cuda *c, int device, char *err, size_t errlen)
{
    if (c->open)
        return c->device == device ? REFIT_OK
               : errbuf_set(err, errlen, REFIT_EUNSUPPORTED, "CUDA IPC memory on device %d; this "
                      "transport serves device %d", device, c->device);
    memset(c, 0, sizeof *c);
    int rc = cu_api_open(&c->cu, err, errlen);
    if (rc)
        return rc;
    void *p[7] = {sym(c, "cuIpcGetMemHandle", NULL),
                  sym(c, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"),
                  sym(c, "cuIpcCloseMemHandle", NULL), sym(c, "cuIpcGetEventHandle", NULL),
                  sym(c, "cuIpcOpenEventHandle", NULL),
                  sym(c, "cuMemGetAddressRange_v2", NULL),
                  sym(c, "cuMemcpyDtoDAsync_v2", NULL)};
    for (int i = 0; i < 7; i++)
        if (!p[i])
            return errbuf_set(err, errlen, REFIT_EUNSUPPORTED, "the CUDA driver (%s) lacks its IPC "
                        "entry points (cuIpc*, cuMemGetAddressRange_v2)", c->cu.where);
    memcpy(&c->IpcGetMemHandle, &p[0], sizeof p[0]);
    memcpy(&c->IpcOpenMemHandle, &p[1], sizeof p[1]);
    memcpy(&c->IpcCloseMemHandle, &p[2], sizeof p[2]);
    memcpy(&c->IpcGetEventHandle, &p[3], sizeof p[3]);
    memcpy(&c->IpcOpenEventHandle, &p[4], sizeof p[4]);
    memcpy(&c->MemGetAddressRange, &p[5], sizeof p[5]);
    memcpy(&c->MemcpyDtoDAsync, &p[6], sizeof p[6]);
    void *et = sym(c, "cuEventElapsedTime_v2", "cuEventElapsedTime"); /* profiles only */
    if (et)
        memcpy(&c->EventElapsedTime, &et, sizeof et);
    CUresult r = c->cu.DeviceGet(&c->dev, device);
    if (r == CU_SUCCESS)
        r = c->cu.DevicePrimaryCtxRetain(&c->ctx, c->dev);
    if (r != CU_SUCCESS)
        return errbuf_set(err, errlen, REFIT_EUNSUPPORTED, "CUDA device %d: %s", device,
                    cu_errstr(&c->cu, r));
    c->device = device;
    c->open = true;
    return ipc_cuda_enter(c, err, errlen);
}

int ipc_cuda_enter(ipc_cuda *c, char *err, size_t errlen)
{
    CUcontext cur = NULL;
    if (c->cu.CtxGetCurrent(&cur) == CU_SUCCESS && cur)
        return REFIT_OK; /* the caller's (PyTorch's primary context, usually) */
    CUresult r = c->cu.CtxSetCurrent(c->ctx);
    return r == CU_SUCCESS ? REFIT_OK
           : errbuf_set(err, errlen, REFIT_EIO, "cuCtxSetCurrent: %s", cu_errstr(&c->cu, r));
}

void ipc_cuda_close(ipc_cuda *c)
{
    if (c->open)
        c->cu.DevicePrimaryCtxRelease(c->dev);
    cu_api_close(&c->cu);
    memset(c, 0, sizeof *c);
}

#define CU_TRY(c, call, what)                                                                \
    do {                                                                                     \
        CUresult r_ = (call);                                                                \
        if (r_ != CU_SUCCESS)                                                                \
            return errbuf_set(err, errlen, REFIT_EIO, "%s: %s", what, cu_errstr(&(c)->cu, r_));   \
    } while (0)

/* ---- worker ---- */

int ipc_mem_open(ipc_cuda *c, const ipc_mem_desc *d, void **base, char *err, size_t errlen)
{
    if (d->kind == IPC_MEM_HOST_FD) {
        /* a memfd its owner can shrink kills this process (SIGBUS) when
         * the copy reads past the new end */
        const int fixed = F_SEAL_SHRINK | F_SEAL_GROW;
        int seals = fcntl(d->fd, F_GET_SEALS);
        if (seals < 0 || (seals & fixed) != fixed)
            return errbuf_set(err, errlen, REFIT_ECORRUPT, "memory %u: its descriptor is not a "
                        "memfd sealed against resizing (F_SEAL_SHRINK|F_SEAL_GROW; seals "
                        "0x%x); refused", d->id, seals < 0 ? 0 : (unsigned)seals);
        off_t size = lseek(d->fd, 0, SEEK_END);
        if (size < 0 || (uint64_t)size < d->bytes)
            return errbuf_set(err, errlen, REFIT_ECORRUPT, "memory %u: its descriptor holds %lld "
                        "bytes, %llu announced", d->id, (long long)size,
                        (unsigned long long)d->bytes);
        void *p = mmap(NULL, d->bytes, PROT_READ, MAP_SHARED, d->fd, 0);
        if (p == MAP_FAILED)
            return errbuf_set(err, errlen, REFIT_EIO, "memory %u: mmap of %llu bytes: %s", d->id,
                        (unsigned long long)d->bytes, strerror(errno));
        *base = p;
        return REFIT_OK;
    }
    int rc = ipc_cuda_open(c, d->device, err, errlen);
    if (rc)
        return rc;
    if ((rc = ipc_cuda_enter(c, err, errlen)))
        return rc;
    CUipcMemHandle h;
    memcpy(h.reserved, d->handle, IPC_HANDLE_BYTES);
    CUdeviceptr p = 0;
    CU_TRY(c, c->IpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
           "cuIpcOpenMemHandle (the trainer's memory)");
    CUdeviceptr b = 0;
    size_t size = 0;
    if (c->MemGetAddressRange(&b, &size, p) != CU_SUCCESS || size < d->bytes) {
        c->IpcCloseMemHandle(p);
        return errbuf_set(err, errlen, REFIT_ECORRUPT, "memory %u: the opened allocation holds %zu "
                    "bytes, %llu announced", d->id, size, (unsigned long long)d->bytes);
    }
    *base = (void *)(uintptr_t)p;
    return REFIT_OK;
}

void ipc_mem_close(ipc_cuda *c, const ipc_mem_desc *d, void *base)
{
    if (!base)
        return;
    if (d->kind == IPC_MEM_HOST_FD)
        munmap(base, d->bytes);
    else if (c->open)
        c->IpcCloseMemHandle((CUdeviceptr)(uintptr_t)base);
}

int ipc_event_open(ipc_cuda *c, const uint8_t handle[IPC_HANDLE_BYTES], CUevent *out, char *err,
                   size_t errlen)
{
    CUipcEventHandle h;
    memcpy(h.reserved, handle, IPC_HANDLE_BYTES);
    CU_TRY(c, c->IpcOpenEventHandle(out, h), "cuIpcOpenEventHandle (the trainer's event)");
    return REFIT_OK;
}

/* ---- trainer ---- */

/* The descriptor a worker gets: the memfd reopened read-only (a new open
 * file description; /proc/self/fd may be closed to a process that changed
 * its uid), else the read-write one when F_SEAL_FUTURE_WRITE holds (no new
 * writable mapping, write or hole punch through any descriptor). -1: none
 * is safe to hand out. */
static int read_only_fd(int f, bool future_sealed)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", f);
    int ro = open(proc, O_RDONLY | O_CLOEXEC);
    if (ro >= 0 || !future_sealed)
        return ro;
    return fcntl(f, F_DUPFD_CLOEXEC, 0);
}

int ipc_host_export(size_t bytes, int *fd, void **base, char *err, size_t errlen)
{
    int f = memfd_create("refit-ipc", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (f < 0)
        return errbuf_set(err, errlen, REFIT_EIO, "memfd_create: %s", strerror(errno));
    void *p = MAP_FAILED;
    if (ftruncate(f, (off_t)bytes) == 0)
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(f);
        return errbuf_set(err, errlen, REFIT_ENOMEM, "shared host memory of %zu bytes: %s", bytes,
                    strerror(e));
    }
    /* this mapping stays writable; after the seals no other can be made,
     * and the size is fixed (a worker reading a shrunk memfd dies of
     * SIGBUS). Before Linux 5.1 there is no FUTURE_WRITE: the read-only
     * descriptor alone keeps the worker from writing. */
    const int fixed = F_SEAL_SHRINK | F_SEAL_GROW;
    bool future = fcntl(f, F_ADD_SEALS, fixed | F_SEAL_FUTURE_WRITE) == 0;
    int rc = future || fcntl(f, F_ADD_SEALS, fixed) == 0 ? REFIT_OK : REFIT_EIO;
    int ro = rc ? -1 : read_only_fd(f, future);
    if (ro < 0 || fcntl(f, F_ADD_SEALS, F_SEAL_SEAL)) {
        int e = errno;
        munmap(p, bytes);
        close(f);
        if (ro >= 0)
            close(ro);
        return errbuf_set(err, errlen, REFIT_EIO, "shared host memory: no read-only, sealed "
                    "descriptor of it for the workers (%s)", strerror(e));
    }
    close(f); /* the mapping holds the memory */
    *fd = ro;
    *base = p;
    return REFIT_OK;
}

int ipc_cuda_alloc_export(ipc_cuda *c, size_t bytes, CUdeviceptr *p,
                          uint8_t handle[IPC_HANDLE_BYTES], char *err, size_t errlen)
{
    CU_TRY(c, c->cu.MemAlloc(p, bytes), "cuMemAlloc (an IPC bucket)");
    CUipcMemHandle h;
    CUresult r = c->IpcGetMemHandle(&h, *p);
    if (r != CU_SUCCESS) {
        c->cu.MemFree(*p);
        return errbuf_set(err, errlen, REFIT_EIO, "cuIpcGetMemHandle: %s", cu_errstr(&c->cu, r));
    }
    memcpy(handle, h.reserved, IPC_HANDLE_BYTES);
    return REFIT_OK;
}

int ipc_cuda_share(ipc_cuda *c, CUdeviceptr p, CUdeviceptr *base, size_t *size,
                   uint8_t handle[IPC_HANDLE_BYTES], char *err, size_t errlen)
{
    CU_TRY(c, c->MemGetAddressRange(base, size, p),
           "cuMemGetAddressRange (is the tensor in device memory of this context?)");
    CUipcMemHandle h;
    CU_TRY(c, c->IpcGetMemHandle(&h, *base),
           "cuIpcGetMemHandle (memory from cuMemCreate, e.g. PyTorch's expandable segments, "
           "cannot be shared this way: add the tensor with REFIT_IPC_PACK)");
    memcpy(handle, h.reserved, IPC_HANDLE_BYTES);
    return REFIT_OK;
}

int ipc_cuda_event_export(ipc_cuda *c, CUevent *e, uint8_t handle[IPC_HANDLE_BYTES], char *err,
                          size_t errlen)
{
    CU_TRY(c, c->cu.EventCreate(e, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS),
           "cuEventCreate (interprocess)");
    CUipcEventHandle h;
    CUresult r = c->IpcGetEventHandle(&h, *e);
    if (r != CU_SUCCESS) {
        c->cu.EventDestroy(*e);
        return errbuf_set(err, errlen, REFIT_EIO, "cuIpcGetEventHandle: %s", cu_errstr(&c->cu, r));
    }
    memcpy(handle, h.reserved, IPC_HANDLE_BYTES);
    return REFIT_OK;
}
