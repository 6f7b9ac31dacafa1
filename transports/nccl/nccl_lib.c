/*
 * NCCL and the CUDA driver, found at run time. Order (nccl_shim.h):
 * an explicit path from the environment; symbols the process already has
 * (RTLD_DEFAULT); a library already loaded under its soname (RTLD_NOLOAD,
 * e.g. PyTorch's libnccl.so.2, loaded RTLD_LOCAL by its extension); the
 * soname on the library path. The first two keep one NCCL per process, so
 * refit's communicator and PyTorch's share its state and environment.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/refit.h>

#include "transports/nccl/nccl_shim.h"

typedef struct sym {
    const char *name;
    size_t off;                 /* of the function pointer in its table */
    bool optional;
} sym;

#define NS(f, opt) {"nccl" #f, offsetof(nccl_api, f), opt}
static const sym NCCL_SYMS[] = {
    NS(GetVersion, 0),        NS(GetUniqueId, 0),   NS(CommInitRank, 0),
    NS(CommInitRankConfig, 1), NS(CommFinalize, 1), NS(CommDestroy, 0),
    NS(CommAbort, 0),         NS(CommGetAsyncError, 0), NS(CommCount, 0),
    NS(CommUserRank, 0),      NS(CommCuDevice, 0),  NS(GetErrorString, 0),
    NS(GetLastError, 1),      NS(Broadcast, 0),     NS(AllReduce, 0),
};

#define CS(f, name) {name, offsetof(cu_api, f), 0}
#define CS_OPT(f, name) {name, offsetof(cu_api, f), 1}
static const sym CU_SYMS[] = {
    CS(Init, "cuInit"),
    CS(DeviceGet, "cuDeviceGet"),
    CS(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    CS(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    CS(CtxGetCurrent, "cuCtxGetCurrent"),
    CS(CtxSetCurrent, "cuCtxSetCurrent"),
    CS(MemAlloc, "cuMemAlloc_v2"),
    CS(MemFree, "cuMemFree_v2"),
    CS(MemHostAlloc, "cuMemHostAlloc"),
    CS(MemFreeHost, "cuMemFreeHost"),
    CS(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    CS(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    CS(StreamCreate, "cuStreamCreate"),
    CS(StreamDestroy, "cuStreamDestroy_v2"),
    CS(StreamQuery, "cuStreamQuery"),
    CS(EventCreate, "cuEventCreate"),
    CS(EventRecord, "cuEventRecord"),
    CS(EventQuery, "cuEventQuery"),
    CS(EventDestroy, "cuEventDestroy_v2"),
    CS(StreamWaitEvent, "cuStreamWaitEvent"),
    CS(GetErrorString, "cuGetErrorString"),
    CS(MemcpyHtoD, "cuMemcpyHtoD_v2"),
    CS(MemcpyDtoH, "cuMemcpyDtoH_v2"),
    CS(DeviceGetCount, "cuDeviceGetCount"),
    CS_OPT(CtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange"),
    CS_OPT(StreamCreateWithPriority, "cuStreamCreateWithPriority"),
};

typedef struct lib_spec {
    const char *env, *soname, *probe;
    const sym *syms;
    size_t n;
} lib_spec;

static const lib_spec NCCL_LIB = {"REFIT_NCCL_LIBRARY", "libnccl.so.2", "ncclGetVersion",
                                  NCCL_SYMS, sizeof NCCL_SYMS / sizeof *NCCL_SYMS};
static const lib_spec CU_LIB = {"REFIT_CUDA_DRIVER_LIBRARY", "libcuda.so.1", "cuInit", CU_SYMS,
                                sizeof CU_SYMS / sizeof *CU_SYMS};

/* Fill table from handle (NULL: RTLD_DEFAULT); the first missing required
 * symbol, or NULL. */
static const char *resolve(void *handle, const lib_spec *l, void *table)
{
    for (size_t i = 0; i < l->n; i++) {
        void *p = dlsym(handle ? handle : RTLD_DEFAULT, l->syms[i].name);
        if (!p && !l->syms[i].optional)
            return l->syms[i].name;
        memcpy((char *)table + l->syms[i].off, &p, sizeof p);
    }
    return NULL;
}

/* The file a resolved symbol lives in. */
static const char *file_of(void *handle, const lib_spec *l)
{
    Dl_info info;
    void *p = dlsym(handle ? handle : RTLD_DEFAULT, l->probe);
    return p && dladdr(p, &info) && info.dli_fname ? info.dli_fname : l->soname;
}

static void note(char *log, size_t n, const char *fmt, const char *a, const char *b)
{
    size_t len = strlen(log);
    if (len < n)
        snprintf(log + len, n - len, fmt, a, b);
}

/* A dlopen failure, a missing file told apart from a broken one. */
static void dl_note(char *log, size_t n, const char *what)
{
    const char *e = dlerror();
    bool missing = e && strstr(e, "No such file");
    note(log, n, "%s: %s; ", what, missing ? "not found" : (e ? e : "failed"));
}

static int try_handle(void *h, const lib_spec *l, void *table, void **out, char *where,
                      size_t wn, const char *how, char *log, size_t n)
{
    const char *missing = resolve(h, l, table);
    if (missing) {
        note(log, n, "%s lacks %s; ", how, missing);
        if (h)
            dlclose(h);
        return -1;
    }
    *out = h;
    snprintf(where, wn, "%s (%s)", file_of(h, l), how);
    return 0;
}

static int lib_open(const lib_spec *l, void *table, void **handle, char *where, size_t wn,
                    char *err, size_t errlen)
{
    char log[1024] = "";
    const char *path = getenv(l->env);
    void *h;
    if (path && *path) {
        if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) &&
            !try_handle(h, l, table, handle, where, wn, l->env, log, sizeof log))
            return REFIT_OK;
        if (!h)
            dl_note(log, sizeof log, path);
    } else {
        if (dlsym(RTLD_DEFAULT, l->probe) &&
            !try_handle(NULL, l, table, handle, where, wn, "already in the process", log,
                        sizeof log))
            return REFIT_OK;
        if ((h = dlopen(l->soname, RTLD_NOW | RTLD_NOLOAD)) &&
            !try_handle(h, l, table, handle, where, wn, "already loaded", log, sizeof log))
            return REFIT_OK;
        if ((h = dlopen(l->soname, RTLD_NOW | RTLD_LOCAL)) &&
            !try_handle(h, l, table, handle, where, wn, "loaded from the library path", log,
                        sizeof log))
            return REFIT_OK;
        if (!h)
            dl_note(log, sizeof log, l->soname);
    }
    snprintf(err, errlen, "%s could not be used: %s(set %s to its path)", l->soname, log,
             l->env);
    return REFIT_EUNSUPPORTED;
}

int nccl_api_open(nccl_api *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    char where[400];
    int rc = lib_open(&NCCL_LIB, a, &a->handle, where, sizeof where, err, errlen);
    if (rc)
        return rc;
    if (a->GetVersion(&a->version) != ncclSuccess)
        a->version = 0;
    snprintf(a->where, sizeof a->where, "NCCL %d.%d.%d from %s", a->version / 10000,
             a->version / 100 % 100, a->version % 100, where);
    return REFIT_OK;
}

/* Never dlclose'd: NCCL keeps process-wide state (bootstrap and proxy
 * threads, atexit hooks) and the driver is the process's; unloading either
 * under a live communicator or context is unsafe. dlopen counts, so a
 * handle kept open costs nothing. */
void nccl_api_close(nccl_api *a)
{
    memset(a, 0, sizeof *a);
}

int cu_api_open(cu_api *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    int rc = lib_open(&CU_LIB, a, &a->handle, a->where, sizeof a->where, err, errlen);
    if (rc)
        return rc;
    CUresult r = a->Init(0);
    if (r != CU_SUCCESS) {
        snprintf(err, errlen, "the CUDA driver (%s) has no usable device: cuInit: %s", a->where,
                 cu_errstr(a, r));
        cu_api_close(a);
        return REFIT_EUNSUPPORTED;
    }
    return REFIT_OK;
}

void cu_api_close(cu_api *a)
{
    memset(a, 0, sizeof *a); /* kept loaded: see nccl_api_close */
}

const char *cu_errstr(const cu_api *a, CUresult r)
{
    const char *s = NULL;
    if (a->GetErrorString && a->GetErrorString(r, &s) == CU_SUCCESS && s)
        return s;
    return "unknown CUDA driver error";
}

const char *nccl_errstr(const nccl_api *a, ncclResult_t r)
{
    const char *s = a->GetErrorString ? a->GetErrorString(r) : NULL;
    return s ? s : "unknown NCCL error";
}
