/* The runtime API a kernel source (the kernels/ .cu files) calls, for the emulator:
 * "device" memory is host memory, streams are ignored (everything runs at
 * once, in order). Fresh allocations are filled with junk. */
#pragma once
#include "emu.h"

typedef void *cudaStream_t;
typedef enum {
    cudaSuccess = 0,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNotSupported = 801,
} cudaError_t;
typedef enum {
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

inline const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated error" : "no error"; }
inline const char *cudaGetErrorName(cudaError_t e) { return e ? "cudaErrorEmu" : "cudaSuccess"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = malloc(n ? n : 1);
    if (!*p)
        return cudaErrorMemoryAllocation;
    memset(*p, 0xa5, n);
    return cudaSuccess;
}
inline cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t) { return cudaMalloc(p, n); }
inline cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaFreeAsync(void *p, cudaStream_t) { return cudaFree(p); }
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t)
{
    memset(p, v, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind,
                                   cudaStream_t)
{
    memmove(d, s, n);
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
