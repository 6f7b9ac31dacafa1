/*
 * Shared memory of the IPC transport, both ends (docs/ipc.md): the trainer
 * exports, the worker opens. Two kinds behind one interface, so the
 * worker's logic is the same for both and is tested on the host:
 *
 *   IPC_MEM_CUDA     device memory: cuIpcGetMemHandle / cuIpcOpenMemHandle
 *                    (the whole allocation; buckets are offsets in it), and
 *                    one interprocess event (cuIpcGetEventHandle) that the
 *                    worker's stream waits on: no host round trip
 *   IPC_MEM_HOST_FD  host memory: a memfd, its descriptor passed over the
 *                    control socket, mapped shared on both sides; the
 *                    socket's own ordering stands in for the event
 *
 * The CUDA driver is looked up at run time (transports/nccl/nccl_lib.c's
 * cu_api_open, and the IPC entry points beside it): nothing links CUDA.
 */
#ifndef REFIT_CORE_IPC_MEM_H
#define REFIT_CORE_IPC_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transports/ipc/msg.h"
#include "transports/nccl/nccl_shim.h"

typedef struct CUipcMemHandle_s { char reserved[IPC_HANDLE_BYTES]; } CUipcMemHandle;
typedef struct CUipcEventHandle_s { char reserved[IPC_HANDLE_BYTES]; } CUipcEventHandle;
#define CU_EVENT_INTERPROCESS 0x4u
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1u

/* The driver, with its IPC entry points, on one device's primary context. */
typedef struct ipc_cuda {
    cu_api cu;
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *h, CUdeviceptr p);
    CUresult (*IpcOpenMemHandle)(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags);
    CUresult (*IpcCloseMemHandle)(CUdeviceptr p);
    CUresult (*IpcGetEventHandle)(CUipcEventHandle *h, CUevent e);
    CUresult (*IpcOpenEventHandle)(CUevent *e, CUipcEventHandle h);
    CUresult (*MemGetAddressRange)(CUdeviceptr *base, size_t *size, CUdeviceptr p);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
    CUresult (*EventElapsedTime)(float *ms, CUevent start, CUevent end); /* NULL: none */
    bool open;
    int device;
    CUdevice dev;
    CUcontext ctx;              /* the device's primary context (retained) */
} ipc_cuda;

/* Resolve the driver and retain device's primary context (once; later
 * calls check the device). REFIT_EUNSUPPORTED with err. */
int ipc_cuda_open(ipc_cuda *c, int device, char *err, size_t errlen);
/* Make the context current on this thread when none is. */
int ipc_cuda_enter(ipc_cuda *c, char *err, size_t errlen);
void ipc_cuda_close(ipc_cuda *c);

/* ---- worker: open what the trainer exported ---- */

/* Map d (its descriptor stays with the table). *base: where the memory's
 * first byte is in this process. */
int ipc_mem_open(ipc_cuda *c, const ipc_mem_desc *d, void **base, char *err, size_t errlen);
void ipc_mem_close(ipc_cuda *c, const ipc_mem_desc *d, void *base);
int ipc_event_open(ipc_cuda *c, const uint8_t handle[IPC_HANDLE_BYTES], CUevent *out, char *err,
                   size_t errlen);

/* ---- trainer: export ---- */

/* A memfd of bytes, mapped shared at *base. */
int ipc_host_export(size_t bytes, int *fd, void **base, char *err, size_t errlen);
/* bytes of fresh device memory and its handle. */
int ipc_cuda_alloc_export(ipc_cuda *c, size_t bytes, CUdeviceptr *p,
                          uint8_t handle[IPC_HANDLE_BYTES], char *err, size_t errlen);
/* The allocation holding p (base, size) and its handle. */
int ipc_cuda_share(ipc_cuda *c, CUdeviceptr p, CUdeviceptr *base, size_t *size,
                   uint8_t handle[IPC_HANDLE_BYTES], char *err, size_t errlen);
/* An interprocess event and its handle. */
int ipc_cuda_event_export(ipc_cuda *c, CUevent *e, uint8_t handle[IPC_HANDLE_BYTES], char *err,
                          size_t errlen);

#endif
