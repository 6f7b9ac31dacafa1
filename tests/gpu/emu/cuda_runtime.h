/* The runtime API a kernel source (the kernels/ .cu files) calls, for the emulator:
 * "device" memory is host memory, streams are ignored (everything runs at
 * once, in order). Fresh allocations are filled with junk. */
#pragma once
#include "emu.h"

#include <tuple>
#include <utility>

typedef void *cudaStream_t;
typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorCooperativeLaunchTooLarge = 720,
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
inline cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
inline cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }
inline cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrCooperativeLaunch = 95 };
#define EMU_SMS 2
/* a small device: persistent grids of a few blocks, and the emulated
 * grid-stride loops go round several times; cooperative launches work */
inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev)
{
    (void)dev;
    *v = a == cudaDevAttrMultiProcessorCount ? EMU_SMS : a == cudaDevAttrCooperativeLaunch ? 1 : 0;
    return cudaSuccess;
}
/* events: no timing here (elapsed 0) */
typedef struct emu_event *cudaEvent_t;
inline cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = (cudaEvent_t)malloc(1);
    return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t)
{
    *ms = 0.0f;
    return cudaSuccess;
}

/* ---- kernel attributes, occupancy, cudaLaunchKernelEx ---- */

/* shared memory a block may have (H200: 227 KB), and what a kernel gets
 * without asking (cudaFuncAttributeMaxDynamicSharedMemorySize) */
#define EMU_SMEM_MAX (227 * 1024)
#define EMU_SMEM_DEFAULT (48 * 1024)

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

/* Each kernel's dynamic shared memory allowance, as set. */
struct emu_func_smem {
    const void *fn;
    int bytes;
};
inline std::vector<emu_func_smem> &emu_func_smem_table()
{
    static std::vector<emu_func_smem> t;
    return t;
}
inline int emu_func_smem_of(const void *fn)
{
    for (const emu_func_smem &e : emu_func_smem_table())
        if (e.fn == fn)
            return e.bytes;
    return EMU_SMEM_DEFAULT;
}

template <class T> inline cudaError_t cudaFuncSetAttribute(T *fn, cudaFuncAttribute a, int v)
{
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || v > EMU_SMEM_MAX)
        return cudaErrorInvalidValue;
    for (emu_func_smem &e : emu_func_smem_table())
        if (e.fn == reinterpret_cast<const void *>(fn)) {
            e.bytes = v;
            return cudaSuccess;
        }
    emu_func_smem_table().push_back(emu_func_smem{reinterpret_cast<const void *>(fn), v});
    return cudaSuccess;
}

/* One block an SM while the shared memory fits (the emulated kernels ask
 * for most of it; registers and static shared memory are not counted). */
template <class T>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, T fn, int threads,
                                                                 size_t smem)
{
    (void)fn;
    if (threads <= 0 || threads > 1024)
        return cudaErrorInvalidValue;
    *n = smem <= EMU_SMEM_MAX ? 1 : 0;
    return cudaSuccess;
}

enum cudaLaunchAttributeID { cudaLaunchAttributeCooperative = 2 };
union cudaLaunchAttributeValue {
    int cooperative;
    char pad[64];
};
struct cudaLaunchAttribute {
    cudaLaunchAttributeID id;
    cudaLaunchAttributeValue val;
};
/* gridDim and blockDim are emu.h's macros: cfg.gridDim is cfg.emu_gdim(),
 * the field by reference */
struct cudaLaunchConfig_t {
    dim3 grid_dim, block_dim;
    dim3 &emu_gdim() { return grid_dim; }
    dim3 &emu_bdim() { return block_dim; }
    const dim3 &emu_gdim() const { return grid_dim; }
    const dim3 &emu_bdim() const { return block_dim; }
    size_t dynamicSmemBytes;
    cudaStream_t stream; /* ignored: everything runs at once, in order */
    cudaLaunchAttribute *attrs;
    unsigned int numAttrs;
};

/* What the runtime refuses before a launch (the codes a GPU gives). */
inline cudaError_t emu_launch_refused(const cudaLaunchConfig_t *c, const void *fn, bool coop)
{
    if (c->gridDim.y != 1 || c->gridDim.z != 1 || c->blockDim.y != 1 || c->blockDim.z != 1) {
        fprintf(stderr, "EMU: only 1-D grids and blocks are emulated\n");
        abort();
    }
    if (c->gridDim.x == 0 || c->blockDim.x == 0 || c->blockDim.x > 1024)
        return cudaErrorInvalidConfiguration;
    if (c->dynamicSmemBytes > (size_t)emu_func_smem_of(fn))
        return cudaErrorInvalidValue; /* more than the kernel's allowance */
    int per = 0;
    if (coop && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, fn, (int)c->blockDim.x,
                                                               c->dynamicSmemBytes) ||
                 c->gridDim.x > (unsigned)(per * EMU_SMS)))
        return cudaErrorCooperativeLaunchTooLarge; /* not all resident at once */
    return cudaSuccess;
}

/* A launch with a config; cooperative (every block at once, blocks may
 * wait on each other: emu.h) when its attribute says so. The arguments
 * are converted to the kernel's parameter types once, as the launch
 * copies them. */
template <class... Exp, class... Act>
inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *c, void (*kernel)(Exp...),
                                      Act &&...args)
{
    static_assert(sizeof...(Exp) == sizeof...(Act), "cudaLaunchKernelEx: argument count");
    bool coop = false;
    for (unsigned int i = 0; i < c->numAttrs; i++) {
        if (c->attrs[i].id != cudaLaunchAttributeCooperative) {
            fprintf(stderr, "EMU: launch attribute %d is not emulated\n", (int)c->attrs[i].id);
            abort();
        }
        coop = c->attrs[i].val.cooperative != 0;
    }
    cudaError_t e = emu_launch_refused(c, reinterpret_cast<const void *>(kernel), coop);
    if (e != cudaSuccess)
        return e;
    std::tuple<Exp...> a(std::forward<Act>(args)...);
    emu_launch_ex(c->gridDim.x, c->blockDim.x, c->dynamicSmemBytes, coop,
                  [&]() { std::apply(kernel, a); });
    return cudaSuccess;
}
