/* A small CUDA emulator for checking kernel logic where there is no GPU
 * (tests/gpu/emu/run.sh). A kernel source is compiled as host C++ with the
 * shims beside this file; a block's threads run as ucontext fibers in one
 * OS thread, switched at barriers: __syncthreads waits for the whole block,
 * a warp shuffle for its warp (twice: write, then read). A deadlock, a
 * shuffle with exited lanes, a __syncthreads some threads skipped, or a
 * misaligned vector access (EMU_AL, put in by run.sh) aborts with a
 * message. Not emulated: timing, memory ordering between blocks, the
 * hardware's own conversions (the shims use the CPU references).
 *
 * Two launch modes.
 * Ordinary (EMU_LAUNCH, what run.sh puts in place of <<<>>>; or
 * cudaLaunchKernelEx without the cooperative attribute): blocks run one
 * after another, and a fiber runs until it waits at a barrier, so a spin
 * wait (__nanosleep in a loop) that does not succeed at once never would:
 * it aborts, naming the deadlock a real GPU could reach (a block waiting
 * on work that no earlier ticket holds).
 * Cooperative (cudaLaunchKernelEx with cudaLaunchAttributeCooperative, as
 * on the GPU every block resident at once): every thread of every block is
 * a fiber from the start, so blocks may wait on each other; __nanosleep
 * yields to the others, and if for EMU_SPIN_ROUNDS scheduler rounds in a
 * row every live fiber spun or waited on a barrier nobody can release, the
 * launch aborts ("cooperative launch deadlocked", with each block's
 * threads by state). The launch is refused (cudaErrorCooperativeLaunchTooLarge)
 * past the blocks the emulated device holds at once (cuda_runtime.h).
 * A cooperative kernel must use dynamic shared memory only: a static
 * __shared__ variable is one `static` for the whole program, so the
 * blocks that run at once here would share it (in the ordinary mode one
 * copy is right: the blocks run in turn).
 *
 * Hopper's bulk copies into shared memory (kernels/onchip.cuh, REFIT_EMU):
 * emu_dyn_smem is the block's dynamic shared memory (filled with 0xff, a
 * NaN in every float format, at launch, so that reads of bytes never
 * written show); emu_bulk_load copies at once and completes its barrier's
 * phase, after checking sizes, alignment and that the bytes land in the
 * block's dynamic shared memory; emu_mbar_wait returns once the phase of
 * the parity asked has completed, as mbarrier.try_wait.parity: with k
 * phases completed, that of parity p is complete iff (k & 1) != p. A wait
 * on a phase not complete yields (the copy may be issued by another thread
 * of the block that has not run yet); once no thread of the block can
 * issue it, the launch aborts ("wait on a bulk copy never issued"). A
 * copy onto a barrier whose last completed phase nobody waited for aborts
 * too: that phase's bytes are overwritten unread, and on the GPU a wait on
 * it would then wait for the next phase of the same parity. */
#pragma once
#ifndef REFIT_EMU
#define REFIT_EMU 1 /* kernels/onchip.cuh: the emulator's bulk copies */
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <functional>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    dim3() = default; /* trivial, as CUDA's: a config may be memset */
    constexpr dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
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

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__
/* blocks run in turn: one copy is the block's (not in a cooperative launch:
 * see above) */
#define __shared__ static

/* a fiber's state: runnable, at __syncthreads, at a warp exchange, exited,
 * spinning (__nanosleep, cooperative launches), waiting on a bulk copy */
enum { EMU_RUN, EMU_BLOCK_BAR, EMU_WARP_BAR, EMU_DONE, EMU_SPIN, EMU_MBAR };

struct emu_fiber {
    ucontext_t ctx;
    int state;
    unsigned tid, block; /* threadIdx.x, blockIdx.x */
    char *stack;         /* kept from launch to launch */
    uint64_t *wbar;      /* EMU_MBAR: the barrier and parity waited on */
    uint32_t wparity;
};

struct emu_state {
    /* the fibers running now: the block's (ordinary launch) or the grid's
     * (cooperative), fiber b * threads + t being thread t of the b-th */
    std::vector<emu_fiber> f;
    unsigned threads, grid;
    unsigned block; /* the first block among the fibers */
    bool coop;
    ucontext_t sched;
    emu_fiber *cur;
    const std::function<void()> *fn;
    std::vector<uint32_t> xv;
    uint32_t *xbuf; /* shuffle exchange, by fiber (emu_xi) */
    unsigned char *smem; /* dynamic shared memory, smem_stride bytes a block */
    size_t smem_bytes, smem_stride, smem_cap;
};

inline emu_state &emu()
{
    static emu_state s;
    return s;
}

inline dim3 emu_tidx() { return dim3{emu().cur->tid, 0, 0}; }
inline dim3 emu_bidx() { return dim3{emu().cur->block, 0, 0}; }
inline dim3 emu_bdim() { return dim3{emu().threads, 1, 1}; }
inline dim3 emu_gdim() { return dim3{emu().grid, 1, 1}; }
#define threadIdx (emu_tidx())
#define blockIdx (emu_bidx())
/* no parentheses: cudaLaunchConfig_t's cfg.gridDim becomes a call of its
 * member emu_gdim() (cuda_runtime.h) */
#define blockDim emu_bdim()
#define gridDim emu_gdim()

/* The running fiber's slot in xbuf: its thread index in an ordinary
 * launch, block * threads + thread in a cooperative one (a warp's lanes
 * are 32 consecutive slots either way). */
inline unsigned emu_xi() { return (unsigned)(emu().cur - emu().f.data()); }

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
    unsigned t = emu_xi();
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
/* one fiber runs at a time: its writes are visible to every other at once */
inline void __threadfence() {}
/* A spin wait's pause: in a cooperative launch, the others run meanwhile;
 * in an ordinary one nothing else could change what the spinner waits on
 * (see the top of the file). */
inline void __nanosleep(unsigned ns)
{
    (void)ns;
    if (emu().coop) {
        emu_wait(EMU_SPIN);
        return;
    }
    fprintf(stderr, "EMU: block %u, thread %u: a spin wait on work no earlier block did "
            "(on a GPU: a deadlock once the waiters fill the device)\n", emu().cur->block,
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


/* ---- dynamic shared memory and bulk copies (kernels/onchip.cuh) ---- */

/* The running fiber's block's dynamic shared memory. */
inline unsigned char *emu_smem_of_block()
{
    emu_state &E = emu();
    if (!E.smem_bytes) {
        fprintf(stderr, "EMU: block %u, thread %u: dynamic shared memory used by a launch that "
                "gave none (cudaLaunchConfig_t.dynamicSmemBytes 0)\n", E.cur->block, E.cur->tid);
        abort();
    }
    return E.smem + (size_t)(E.cur->block - E.block) * E.smem_stride;
}

inline void *emu_dyn_smem(void) { return emu_smem_of_block(); }

/* A barrier word here: EMU_MBAR_MAGIC in the top 16 bits (an uninitialised
 * one holds the launch's 0xff junk), then the phases completed when a
 * thread last waited, then the phases completed (24 bits each). */
#define EMU_MBAR_MAGIC 0xeb4bull
#define EMU_MBAR_PHASES 0xffffffull

inline void emu_mbar_fail(const char *what, const uint64_t *bar)
{
    fprintf(stderr, "EMU: block %u, thread %u: %s (barrier at %p)\n", emu().cur->block,
            emu().cur->tid, what, (const void *)bar);
    abort();
}

inline uint64_t emu_mbar_read(const uint64_t *bar)
{
    if ((uintptr_t)bar % 8)
        emu_mbar_fail("a misaligned mbarrier (needs 8 bytes)", bar);
    if (*bar >> 48 != EMU_MBAR_MAGIC)
        emu_mbar_fail("an mbarrier used before emu_mbar_init", bar);
    return *bar;
}

inline void emu_mbar_init(uint64_t *bar)
{
    if ((uintptr_t)bar % 8)
        emu_mbar_fail("a misaligned mbarrier (needs 8 bytes)", bar);
    *bar = EMU_MBAR_MAGIC << 48;
}

inline void emu_bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    emu_state &E = emu();
    const unsigned char *lo = emu_smem_of_block(), *d = (const unsigned char *)dst;
    if (bytes == 0 || bytes % 16) {
        fprintf(stderr, "EMU: block %u, thread %u: a bulk copy of %u bytes (a multiple of 16, "
                "not 0)\n", E.cur->block, E.cur->tid, bytes);
        abort();
    }
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) {
        fprintf(stderr, "EMU: block %u, thread %u: a bulk copy from %p to %p (both 16-byte "
                "aligned)\n", E.cur->block, E.cur->tid, src, dst);
        abort();
    }
    if (d < lo || d > lo + E.smem_bytes || bytes > (size_t)(lo + E.smem_bytes - d)) {
        fprintf(stderr, "EMU: block %u, thread %u: a bulk copy of %u bytes to %p, outside the "
                "block's dynamic shared memory (%zu bytes at %p)\n", E.cur->block, E.cur->tid,
                bytes, dst, E.smem_bytes, (const void *)lo);
        abort();
    }
    uint64_t v = emu_mbar_read(bar), done = v & EMU_MBAR_PHASES;
    if (((v >> 24) & EMU_MBAR_PHASES) != done)
        emu_mbar_fail("a bulk copy onto an mbarrier whose last completed phase nobody waited "
                      "for (its bytes overwritten unread; on a GPU a wait on it would wait "
                      "for the next phase of its parity)", bar);
    memcpy(dst, src, bytes);
    *bar = (v & ~EMU_MBAR_PHASES) | ((done + 1) & EMU_MBAR_PHASES);
}

inline void emu_mbar_wait(uint64_t *bar, uint32_t parity)
{
    for (;;) {
        uint64_t v = emu_mbar_read(bar), done = v & EMU_MBAR_PHASES;
        if ((done & 1) != (parity & 1)) {
            *bar = (v & ~(EMU_MBAR_PHASES << 24)) | done << 24;
            return;
        }
        /* not issued yet: let the block's other threads run (the scheduler
         * aborts once none of them can issue it) */
        emu().cur->wbar = bar;
        emu().cur->wparity = parity & 1;
        emu_wait(EMU_MBAR);
    }
}

/* ---- the scheduler ---- */

/* scheduler rounds in a row in which only spinners ran, before a
 * cooperative launch is called deadlocked */
#define EMU_SPIN_ROUNDS 100000
#define EMU_STACK (256 * 1024)

inline void emu_trampoline()
{
    (*emu().fn)();
    emu().cur->state = EMU_DONE;
    swapcontext(&emu().cur->ctx, &emu().sched);
}

/* A fiber's stack, made on first use and kept: untouched pages cost no
 * memory, and a guard page below turns an overflow into a fault. */
inline char *emu_stack(emu_fiber *f)
{
    if (f->stack)
        return f->stack;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, EMU_STACK + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED || mprotect(p, page, PROT_NONE)) {
        fprintf(stderr, "EMU: out of memory for fiber stacks\n");
        abort();
    }
    return f->stack = (char *)p + page;
}

/* Release the warps of the bl-th running block whose live lanes all wait
 * at a shuffle; 1 if any. */
inline bool emu_release_warps(unsigned bl)
{
    emu_state &E = emu();
    bool any = false;
    for (unsigned w = 0; w < E.threads / 32; w++) {
        emu_fiber *lane = &E.f[bl * E.threads + w * 32];
        unsigned waiting = 0, done = 0;
        for (unsigned l = 0; l < 32; l++) {
            waiting += lane[l].state == EMU_WARP_BAR;
            done += lane[l].state == EMU_DONE;
        }
        if (!waiting || waiting + done != 32)
            continue;
        if (done) {
            fprintf(stderr, "EMU: block %u, warp %u: a shuffle with %u exited lanes\n",
                    E.block + bl, w, done);
            abort();
        }
        for (unsigned l = 0; l < 32; l++)
            lane[l].state = EMU_RUN;
        any = true;
    }
    return any;
}

/* The bl-th running block's threads by state. */
struct emu_census {
    unsigned n[EMU_MBAR + 1];
    const emu_fiber *spin, *mbar; /* the first of each */
};

inline emu_census emu_count(unsigned bl)
{
    emu_state &E = emu();
    emu_census c = {};
    for (unsigned t = 0; t < E.threads; t++) {
        const emu_fiber *f = &E.f[bl * E.threads + t];
        c.n[f->state]++;
        if (f->state == EMU_SPIN && !c.spin)
            c.spin = f;
        if (f->state == EMU_MBAR && !c.mbar)
            c.mbar = f;
    }
    return c;
}

/* Release the bl-th running block's __syncthreads once all its threads
 * are there; 1 if released. */
inline bool emu_release_block(unsigned bl)
{
    emu_state &E = emu();
    emu_census c = emu_count(bl);
    unsigned bar = c.n[EMU_BLOCK_BAR], done = c.n[EMU_DONE];
    if (!bar || bar + done != E.threads)
        return false;
    if (done) {
        fprintf(stderr, "EMU: block %u: stuck (%u threads exited, %u at __syncthreads)\n",
                E.block + bl, done, bar);
        abort();
    }
    for (unsigned t = 0; t < E.threads; t++)
        E.f[bl * E.threads + t].state = EMU_RUN;
    return true;
}

inline void emu_never_issued(const emu_fiber *f)
{
    emu_state &E = emu();
    uint64_t done = *f->wbar & EMU_MBAR_PHASES;
    fprintf(stderr, "EMU: block %u, thread %u: wait on a bulk copy never issued (mbarrier at "
            "dynamic shared memory offset %td: %llu phases completed, parity %u asked)\n",
            f->block, f->tid,
            (const unsigned char *)f->wbar - (E.smem + (size_t)(f->block - E.block) * E.smem_stride),
            (unsigned long long)done, f->wparity);
    abort();
}

/* Nothing ran for `rounds` rounds: say where every block is, and stop. */
inline void emu_deadlock(unsigned nb, unsigned rounds)
{
    emu_state &E = emu();
    if (!E.coop) {
        emu_census c = emu_count(0);
        fprintf(stderr, "EMU: block %u: stuck (%u threads exited, %u at __syncthreads)\n",
                E.block, c.n[EMU_DONE], c.n[EMU_BLOCK_BAR]);
        abort();
    }
    fprintf(stderr, "EMU: cooperative launch deadlocked (%u rounds with only spin waits)\n",
            rounds);
    for (unsigned bl = 0; bl < nb; bl++) {
        emu_census c = emu_count(bl);
        fprintf(stderr, "EMU:   block %u: %u spinning (thread %d first), %u at __syncthreads, "
                "%u at a warp exchange, %u waiting on a bulk copy (thread %d first), %u exited\n",
                E.block + bl, c.n[EMU_SPIN], c.spin ? (int)c.spin->tid : -1,
                c.n[EMU_BLOCK_BAR], c.n[EMU_WARP_BAR], c.n[EMU_MBAR],
                c.mbar ? (int)c.mbar->tid : -1, c.n[EMU_DONE]);
    }
    abort();
}

/* Run blocks first .. first + nb - 1 to the end, their threads as fibers
 * at once. A round resumes every fiber that can go on; only when none
 * moved (spinners and bulk-copy waiters that came back still waiting do
 * not count) are barriers released. */
inline void emu_run(unsigned first, unsigned nb)
{
    emu_state &E = emu();
    const unsigned n = nb * E.threads;
    E.block = first;
    for (unsigned i = 0; i < n; i++) {
        emu_fiber *f = &E.f[i];
        f->tid = i % E.threads;
        f->block = first + i / E.threads;
        f->state = EMU_RUN;
        f->wbar = NULL;
        getcontext(&f->ctx);
        f->ctx.uc_stack.ss_sp = emu_stack(f);
        f->ctx.uc_stack.ss_size = EMU_STACK;
        f->ctx.uc_link = NULL;
        makecontext(&f->ctx, emu_trampoline, 0);
    }
    unsigned idle = 0;
    for (;;) {
        bool moved = false, waits = false;
        for (unsigned i = 0; i < n; i++) {
            emu_fiber *f = &E.f[i];
            int s = f->state;
            if (s != EMU_RUN && s != EMU_SPIN && s != EMU_MBAR)
                continue;
            E.cur = f;
            f->state = EMU_RUN;
            swapcontext(&E.sched, &f->ctx);
            if (s != EMU_RUN && f->state == s)
                waits = true;
            else
                moved = true;
        }
        if (moved) {
            idle = 0;
            continue;
        }
        bool released = false;
        for (unsigned bl = 0; bl < nb; bl++)
            released |= emu_release_warps(bl);
        for (unsigned bl = 0; bl < nb && !released; bl++)
            released |= emu_release_block(bl);
        if (released) {
            idle = 0;
            continue;
        }
        if (!waits)
            break; /* all exited (a stuck barrier aborted above) */
        /* A block none of whose threads runs or spins cannot issue a copy
         * any of them waits on (no other block writes its shared memory). */
        for (unsigned bl = 0; bl < nb; bl++) {
            emu_census c = emu_count(bl);
            if (c.mbar && !c.spin)
                emu_never_issued(c.mbar);
        }
        if (++idle >= EMU_SPIN_ROUNDS)
            emu_deadlock(nb, idle);
    }
    for (unsigned i = 0; i < n; i++)
        if (E.f[i].state != EMU_DONE)
            emu_deadlock(nb, idle);
}

/* grid blocks of `threads`, each with smem bytes of dynamic shared memory;
 * cooperative: all blocks at once. */
inline void emu_launch_ex(unsigned grid, unsigned threads, size_t smem, bool coop,
                          const std::function<void()> &fn)
{
    emu_state &E = emu();
    if (threads == 0 || threads > 1024 || threads % 32) {
        fprintf(stderr, "EMU: %u threads a block\n", threads);
        abort();
    }
    const unsigned nb = coop ? grid : 1;
    const size_t fibers = (size_t)nb * threads;
    if (E.f.size() < fibers)
        E.f.resize(fibers, emu_fiber{});
    if (E.xv.size() < fibers)
        E.xv.resize(fibers);
    E.xbuf = E.xv.data();
    E.smem_bytes = smem;
    E.smem_stride = (smem + 127) & ~(size_t)127;
    if (smem && E.smem_cap < E.smem_stride * nb) {
        free(E.smem);
        E.smem_cap = E.smem_stride * nb;
        if (!(E.smem = (unsigned char *)aligned_alloc(128, E.smem_cap))) {
            fprintf(stderr, "EMU: out of memory for dynamic shared memory\n");
            abort();
        }
    }
    E.threads = threads;
    E.grid = grid;
    E.fn = &fn;
    E.coop = coop;
    if (coop) {
        if (smem)
            memset(E.smem, 0xff, E.smem_stride * nb);
        if (grid)
            emu_run(0, grid);
    } else {
        for (unsigned b = 0; b < grid; b++) {
            if (smem)
                memset(E.smem, 0xff, smem);
            emu_run(b, 1);
        }
    }
    E.coop = false;
    E.smem_bytes = 0;
}

inline void emu_launch(unsigned grid, unsigned threads, const std::function<void()> &fn)
{
    emu_launch_ex(grid, threads, 0, false, fn);
}

/* What run.sh puts in place of kernel<<<grid, threads, 0, stream>>>(args). */
#define EMU_LAUNCH(grid, threads, k, ...) emu_launch((grid), (threads), [&]() { k(__VA_ARGS__); })
