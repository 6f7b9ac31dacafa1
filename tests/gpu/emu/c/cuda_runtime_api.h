/* The runtime API a C GPU test calls, for the emulator: "device" memory is
 * host memory, streams are tokens. */
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
