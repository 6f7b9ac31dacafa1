/* A small CUDA emulator for checking kernel logic where there is no GPU
 * (tests/gpu/emu/run.sh). A kernel source is compiled as host C++ with the
 * shims beside this file; each launch runs its blocks one after another,
 * and a block's threads as ucontext fibers in one OS thread, switched at
 * barriers: __syncthreads waits for the whole block, a warp shuffle for its
 * warp (twice: write, then read). A deadlock, a shuffle with exited lanes,
 * a __syncthreads some threads skipped, or a misaligned vector access
 * (EMU_AL, put in by run.sh) aborts with a message. Not emulated: timing,
 * memory ordering between blocks (blocks run in turn), the hardware's own
 * conversions (the shims use the CPU references). Blocks run in turn and a
 * fiber runs until it waits at a barrier, so a spin wait (__nanosleep in a
 * loop) that does not succeed at once never would: it aborts, naming the
 * deadlock a real GPU could reach (a block waiting on work that no earlier
 * ticket holds).
 *
 * The kernels are found by name, as a launcher asks refit/sdk/pgpu.h's
 * table for them: run.sh lists the source's extern "C" kernels and puts an
 * EMU_IMAGE after the source, which defines the format's image symbol
 * (fp8_image, ...) and registers a kernel table under it; pgpu_emu.cc's
 * launch table (the sdk/pgpu_cudart.h entry points, over host memory)
 * looks a kernel up in the image it was begun with and runs it through
 * emu_launch, its arguments read from the launch's void ** as the kernel's
 * parameter types, the way cudaLaunchKernel reads them. */
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

struct dim3 {
    unsigned x, y, z;
};
struct float4 {
    float x, y, z, w;
};
struct uint4 {
    unsigned x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
    return uint4{x, y, z, w};
}

#ifdef EMU_LIST_KERNELS /* run.sh's preprocessing pass: a kernel keeps a mark */
#define __global__ emu_global
#else
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static /* blocks run in turn: one copy is the block's */

enum { EMU_RUN, EMU_BLOCK_BAR, EMU_WARP_BAR, EMU_DONE };

struct emu_fiber {
    ucontext_t ctx;
    int state;
    unsigned tid;
    char *stack;
};

struct emu_state {
    emu_fiber f[1024];
    unsigned threads, block, grid;
    ucontext_t sched;
    emu_fiber *cur;
    const std::function<void()> *fn;
    uint32_t xbuf[1024]; /* shuffle exchange */
};

inline emu_state &emu()
{
    static emu_state s;
    return s;
}

inline dim3 emu_tidx() { return dim3{emu().cur->tid, 0, 0}; }
inline dim3 emu_bidx() { return dim3{emu().block, 0, 0}; }
inline dim3 emu_bdim() { return dim3{emu().threads, 1, 1}; }
inline dim3 emu_gdim() { return dim3{emu().grid, 1, 1}; }
#define threadIdx (emu_tidx())
#define blockIdx (emu_bidx())
#define blockDim (emu_bdim())
#define gridDim (emu_gdim())

inline void emu_wait(int state)
{
    emu_fiber *f = emu().cur;
    f->state = state;
    swapcontext(&f->ctx, &emu().sched);
}

inline void __syncthreads() { emu_wait(EMU_BLOCK_BAR); }

inline uint32_t __shfl_xor_sync(unsigned mask, uint32_t v, int lane_mask)
{
    (void)mask;
    unsigned t = emu().cur->tid;
    emu().xbuf[t] = v;
    emu_wait(EMU_WARP_BAR);
    uint32_t r = emu().xbuf[(t & ~31u) | ((t & 31u) ^ (unsigned)lane_mask)];
    emu_wait(EMU_WARP_BAR);
    return r;
}

inline float __uint_as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline uint32_t __float_as_uint(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
/* SSE division: correctly rounded, subnormals kept, as __fdiv_rn */
inline float __fdiv_rn(float a, float b)
{
    volatile float r = a / b;
    return r;
}
/* IEEE single operations, rounded to nearest even (no contraction: x86-64
 * without -mfma has no FMA instruction to contract into; fmaf is exact) */
inline float __fmul_rn(float a, float b)
{
    volatile float r = a * b;
    return r;
}
inline float __frcp_rn(float a)
{
    volatile float r = 1.0f / a;
    return r;
}
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline uint32_t max(uint32_t a, uint32_t b) { return a > b ? a : b; }
inline uint32_t min(uint32_t a, uint32_t b) { return a < b ? a : b; }
/* one fiber runs at a time: plain read-modify-writes are atomic here */
inline unsigned atomicMax(unsigned *p, unsigned v)
{
    unsigned o = *p;
    *p = v > o ? v : o;
    return o;
}
inline unsigned atomicMin(unsigned *p, unsigned v)
{
    unsigned o = *p;
    *p = v < o ? v : o;
    return o;
}
inline unsigned atomicAdd(unsigned *p, unsigned v)
{
    unsigned o = *p;
    *p = o + v;
    return o;
}
/* one block at a time: its writes are visible to the next at once */
inline void __threadfence() {}
inline void __nanosleep(unsigned ns)
{
    (void)ns;
    fprintf(stderr, "EMU: block %u, thread %u: a spin wait on work no earlier block did "
            "(on a GPU: a deadlock once the waiters fill the device)\n", emu().block,
            emu().cur->tid);
    abort();
}
/* per 16-bit half: the unsigned max */
inline uint32_t __vmaxu2(uint32_t a, uint32_t b)
{
    uint32_t lo = (a & 0xffffu) > (b & 0xffffu) ? a & 0xffffu : b & 0xffffu;
    uint32_t hi = (a >> 16) > (b >> 16) ? a >> 16 : b >> 16;
    return hi << 16 | lo;
}
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
    unsigned long long o = *p;
    *p = o + v;
    return o;
}

inline const void *emu_al_check(const void *p, unsigned align, const char *type)
{
    if ((uintptr_t)p % align) {
        fprintf(stderr, "EMU: misaligned %s access at %p (needs %u)\n", type, p, align);
        abort();
    }
    return p;
}
#define EMU_AL(T, A, p) ((T *)emu_al_check((const void *)(p), (A), #T))
/* cache-hinted loads and stores: plain ones here, alignment checked */
template <class T> inline T __ldcs(const T *p)
{
    return *(const T *)emu_al_check(p, sizeof(T), "__ldcs");
}
template <class T> inline void __stcs(T *p, T v)
{
    *(T *)emu_al_check(p, sizeof(T), "__stcs") = v;
}

inline void emu_trampoline()
{
    (*emu().fn)();
    emu().cur->state = EMU_DONE;
    swapcontext(&emu().cur->ctx, &emu().sched);
}

/* Release the warps whose live lanes all wait at a shuffle; 1 if any. */
inline bool emu_release_warps(unsigned b)
{
    emu_state &E = emu();
    bool any = false;
    for (unsigned w = 0; w < E.threads / 32; w++) {
        unsigned waiting = 0, done = 0;
        for (unsigned l = 0; l < 32; l++) {
            int s = E.f[w * 32 + l].state;
            waiting += s == EMU_WARP_BAR;
            done += s == EMU_DONE;
        }
        if (!waiting || waiting + done != 32)
            continue;
        if (done) {
            fprintf(stderr, "EMU: block %u, warp %u: a shuffle with %u exited lanes\n", b, w,
                    done);
            abort();
        }
        for (unsigned l = 0; l < 32; l++)
            E.f[w * 32 + l].state = EMU_RUN;
        any = true;
    }
    return any;
}

inline void emu_block(unsigned b)
{
    emu_state &E = emu();
    const size_t stack = 256 * 1024;
    E.block = b;
    for (unsigned t = 0; t < E.threads; t++) {
        emu_fiber *f = &E.f[t];
        if (!f->stack && !(f->stack = (char *)malloc(stack))) {
            fprintf(stderr, "EMU: out of memory\n");
            abort();
        }
        f->tid = t;
        f->state = EMU_RUN;
        getcontext(&f->ctx);
        f->ctx.uc_stack.ss_sp = f->stack;
        f->ctx.uc_stack.ss_size = stack;
        f->ctx.uc_link = NULL;
        makecontext(&f->ctx, emu_trampoline, 0);
    }
    for (;;) {
        bool ran = false;
        for (unsigned t = 0; t < E.threads; t++)
            if (E.f[t].state == EMU_RUN) {
                E.cur = &E.f[t];
                ran = true;
                swapcontext(&E.sched, &E.f[t].ctx);
            }
        if (ran || emu_release_warps(b))
            continue;
        unsigned done = 0, bar = 0;
        for (unsigned t = 0; t < E.threads; t++) {
            done += E.f[t].state == EMU_DONE;
            bar += E.f[t].state == EMU_BLOCK_BAR;
        }
        if (done == E.threads)
            return;
        if (bar && bar + done == E.threads && !done) {
            for (unsigned t = 0; t < E.threads; t++)
                E.f[t].state = EMU_RUN;
            continue;
        }
        fprintf(stderr, "EMU: block %u: stuck (%u threads exited, %u at __syncthreads)\n", b,
                done, bar);
        abort();
    }
}

inline void emu_launch(unsigned grid, unsigned threads, const std::function<void()> &fn)
{
    emu_state &E = emu();
    if (threads == 0 || threads > 1024 || threads % 32) {
        fprintf(stderr, "EMU: %u threads a block\n", threads);
        abort();
    }
    E.threads = threads;
    E.grid = grid;
    E.fn = &fn;
    for (unsigned b = 0; b < grid; b++)
        emu_block(b);
}

/* What a script puts in place of kernel<<<grid, threads, 0, stream>>>(args)
 * in a source that still launches its own kernels (kernels/fingerprint.cu:
 * tests/nccl/emu_fingerprint.sh). */
#define EMU_LAUNCH(grid, threads, k, ...) emu_launch((grid), (threads), [&]() { k(__VA_ARGS__); })

/* ---- kernels by name (pgpu_emu.cc) ---- */

/* A kernel as a launch table runs it: grid blocks of block threads,
 * args[i] pointing at parameter i. */
typedef void (*emu_run_fn)(unsigned grid, unsigned block, void **args);
struct emu_kernel {
    const char *name;
    emu_run_fn run;
};
/* pgpu_emu.cc: the kernels of the image at `image` */
extern "C" void emu_register_image(const void *image, const char *what, const emu_kernel *k,
                                   unsigned n);

/* The arguments copied at the launch (as the runtime copies them), then
 * the kernel on every thread of every block. */
template <class... A, size_t... I>
inline void emu_run_args(void (*k)(A...), unsigned grid, unsigned block, void **args,
                         std::index_sequence<I...>)
{
    std::tuple<std::remove_cv_t<std::remove_reference_t<A>>...> v(
        *(std::remove_cv_t<std::remove_reference_t<A>> *)args[I]...);
    (void)args;
    emu_launch(grid, block, [&]() { k(std::get<I>(v)...); });
}
template <class... A> constexpr size_t emu_arity(void (*)(A...)) { return sizeof...(A); }
template <auto K> void emu_run(unsigned grid, unsigned block, void **args)
{
    emu_run_args(K, grid, block, args, std::make_index_sequence<emu_arity(K)>{});
}
#define EMU_KERNEL(k) emu_kernel{#k, emu_run<&k>}
/* The image symbol a launcher's direct entry passes (its bytes are only a
 * name here) and its kernels, registered before main. */
#define EMU_IMAGE(image, ...)                                                          \
    extern "C" const unsigned char image[] = "emulated " #image;                       \
    static const emu_kernel emu_kernels_##image[] = {__VA_ARGS__};                     \
    static const int emu_registered_##image = (emu_register_image(                     \
        image, #image, emu_kernels_##image,                                            \
        sizeof emu_kernels_##image / sizeof emu_kernels_##image[0]), 0);
