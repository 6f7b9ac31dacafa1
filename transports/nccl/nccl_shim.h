/*
 * The few NCCL and CUDA driver declarations refit uses, written from the
 * NCCL and CUDA driver API documentation (no nccl.h or cuda.h is needed to
 * build, nothing is linked): functions are looked up at run time
 * (nccl_lib.c) and called through the tables below.
 */
#ifndef REFIT_CORE_NCCL_SHIM_H
#define REFIT_CORE_NCCL_SHIM_H

#include <limits.h>
#include <stddef.h>

/* ---- NCCL (documented types, NCCL >= 2.12) ---- */

typedef struct ncclComm *ncclComm_t;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,         /* non-blocking communicators: not done yet */
} ncclResult_t;

typedef enum { ncclUint8 = 1, ncclInt32 = 2 } ncclDataType_t;
typedef enum { ncclMin = 3 } ncclRedOp_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* ncclConfig_t as documented for NCCL 2.14 (the first with non-blocking
 * communicators). NCCL reads size and version first and only the members
 * that version had, so an older layout is accepted by newer libraries. */
typedef struct {
    size_t size;
    unsigned int magic;         /* NCCL_CONFIG_MAGIC */
    unsigned int version;       /* NCCL_VERSION(2, 14, 0) */
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
} nccl_config_v214;
#define NCCL_CONFIG_MAGIC 0xcafebeefu
#define NCCL_CONFIG_UNSET INT_MIN
#define NCCL_VERSION_CODE(x, y, z) ((x) * 10000 + (y) * 100 + (z))

typedef struct nccl_api {
    ncclResult_t (*GetVersion)(int *version);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *id);
    ncclResult_t (*CommInitRank)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
    /* optional (2.14): non-blocking creation */
    ncclResult_t (*CommInitRankConfig)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                       nccl_config_v214 *config);
    ncclResult_t (*CommFinalize)(ncclComm_t comm); /* optional (2.14) */
    ncclResult_t (*CommDestroy)(ncclComm_t comm);
    ncclResult_t (*CommAbort)(ncclComm_t comm);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t comm, ncclResult_t *async_error);
    ncclResult_t (*CommCount)(const ncclComm_t comm, int *count);
    ncclResult_t (*CommUserRank)(const ncclComm_t comm, int *rank);
    ncclResult_t (*CommCuDevice)(const ncclComm_t comm, int *device);
    const char *(*GetErrorString)(ncclResult_t result);
    const char *(*GetLastError)(ncclComm_t comm); /* optional (2.13) */
    ncclResult_t (*Broadcast)(const void *sendbuff, void *recvbuff, size_t count,
                              ncclDataType_t datatype, int root, ncclComm_t comm, void *stream);
    ncclResult_t (*AllReduce)(const void *sendbuff, void *recvbuff, size_t count,
                              ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                              void *stream);
    void *handle;               /* dlopen handle, or NULL for RTLD_DEFAULT */
    int version;
    char where[512];            /* the library and how it was found */
} nccl_api;

/* ---- CUDA driver API (the handful refit's NCCL transport needs) ---- */

typedef int CUresult;           /* CUDA_SUCCESS 0, CUDA_ERROR_NOT_READY 600 */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;
#define CU_SUCCESS 0
#define CU_NOT_READY 600
#define CU_STREAM_NON_BLOCKING 0x1u
#define CU_EVENT_DISABLE_TIMING 0x2u
#define CU_MEMHOSTALLOC_PORTABLE 0x1u

typedef struct cu_api {
    CUresult (*Init)(unsigned int flags);
    CUresult (*DeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice dev); /* _v2 */
    CUresult (*CtxGetCurrent)(CUcontext *ctx);
    CUresult (*CtxSetCurrent)(CUcontext ctx);
    CUresult (*MemAlloc)(CUdeviceptr *p, size_t bytes);          /* _v2 */
    CUresult (*MemFree)(CUdeviceptr p);                          /* _v2 */
    CUresult (*MemHostAlloc)(void **p, size_t bytes, unsigned int flags);
    CUresult (*MemFreeHost)(void *p);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t n, CUstream s); /* _v2 */
    CUresult (*MemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t n, CUstream s);       /* _v2 */
    CUresult (*StreamCreate)(CUstream *s, unsigned int flags);
    CUresult (*StreamDestroy)(CUstream s);                       /* _v2 */
    CUresult (*StreamQuery)(CUstream s);
    CUresult (*EventCreate)(CUevent *e, unsigned int flags);
    CUresult (*EventRecord)(CUevent e, CUstream s);
    CUresult (*EventQuery)(CUevent e);
    CUresult (*EventDestroy)(CUevent e);                         /* _v2 */
    CUresult (*StreamWaitEvent)(CUstream s, CUevent e, unsigned int flags);
    CUresult (*GetErrorString)(CUresult r, const char **s);
    /* for tools and tests: synchronous copies, device count */
    CUresult (*MemcpyHtoD)(CUdeviceptr dst, const void *src, size_t n);         /* _v2 */
    CUresult (*MemcpyDtoH)(void *dst, CUdeviceptr src, size_t n);               /* _v2 */
    CUresult (*DeviceGetCount)(int *n);
    /* optional: the transport's own stream at the highest priority */
    CUresult (*CtxGetStreamPriorityRange)(int *least, int *greatest);
    CUresult (*StreamCreateWithPriority)(CUstream *s, unsigned int flags, int priority);
    void *handle;
    char where[512];
} cu_api;

/* Look NCCL up: $REFIT_NCCL_LIBRARY if set; else symbols already in the
 * process (RTLD_DEFAULT), then an already loaded libnccl.so.2 (RTLD_NOLOAD:
 * PyTorch's copy), then libnccl.so.2 from the library path. On failure err
 * says what each attempt found (a missing file apart from other errors). */
int nccl_api_open(nccl_api *a, char *err, size_t errlen);
void nccl_api_close(nccl_api *a);
/* The same for the CUDA driver (libcuda.so.1), and cuInit(0). */
int cu_api_open(cu_api *a, char *err, size_t errlen);
void cu_api_close(cu_api *a);
const char *cu_errstr(const cu_api *a, CUresult r);
const char *nccl_errstr(const nccl_api *a, ncclResult_t r);

#endif
