/* The runtime API a C GPU test and a format's direct entries
 * (plugins/<fmt>/<fmt>_direct.c) call, for the emulator: "device" memory is
 * host memory, streams are tokens (the emulated kernels run at their
 * launch, so every copy and wait is done at once), one device, events
 * without timing. */
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void *cudaStream_t;
typedef enum { cudaSuccess = 0 } cudaError_t;
typedef enum {
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;
#define cudaStreamNonBlocking 1
#define cudaHostAllocDefault 0

static inline const char *cudaGetErrorString(cudaError_t e)
{
    (void)e;
    return "emulated";
}
static inline cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = malloc(n ? n : 1);
    return cudaSuccess;
}
static inline cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k)
{
    (void)k;
    memmove(d, s, n);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    *s = (cudaStream_t)(uintptr_t)0x5;
    return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}
static inline cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int d)
{
    return d == 0 ? cudaSuccess : (cudaError_t)101; /* cudaErrorInvalidDevice */
}
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k,
                                          cudaStream_t st)
{
    (void)st;
    return cudaMemcpy(d, s, n, k);
}
static inline cudaError_t cudaMemset(void *p, int v, size_t n)
{
    memset(p, v, n);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
static inline cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    (void)flags;
    return cudaMalloc(p, n);
}
static inline cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }
/* events: no timing (elapsed 0) */
typedef struct emu_event *cudaEvent_t;
static inline cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = (cudaEvent_t)malloc(1);
    return cudaSuccess;
}
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    (void)e;
    (void)s;
    return cudaSuccess;
}
static inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    (void)a;
    (void)b;
    *ms = 0.0f;
    return cudaSuccess;
}
