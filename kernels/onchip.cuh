/* What a kernel needs to hold a weight on chip for one pass over HBM
 * (kernels/quant_fp8.cu k_tensor_onchip; docs/cuda.md "Per-tensor on
 * chip"): the block's dynamic shared memory, Hopper's bulk copy from
 * global into shared memory completing on a shared-memory barrier
 * (mbarrier), and the waits and fences around them. Plain sm_90, no
 * cluster launch. Under the CPU emulator (tests/gpu/emu, REFIT_EMU) the
 * same calls go to emu.h, which copies at once and checks what it can:
 * alignment, sizes, and that a wait is on a copy that was issued. */
#ifndef REFIT_KERNELS_ONCHIP_CUH
#define REFIT_KERNELS_ONCHIP_CUH

#include <stdint.h>

#ifdef REFIT_EMU

#define OC_SMEM() ((unsigned char *)emu_dyn_smem())
__device__ __forceinline__ void oc_mbar_init(uint64_t *bar) { emu_mbar_init(bar); }
__device__ __forceinline__ void oc_fence_init(void) {}
__device__ __forceinline__ void oc_fence_reuse(void) {}
__device__ __forceinline__ void oc_bulk_load(void *dst, const void *src, uint32_t bytes,
                                             uint64_t *bar)
{
    emu_bulk_load(dst, src, bytes, bar);
}
__device__ __forceinline__ void oc_mbar_wait(uint64_t *bar, uint32_t parity)
{
    emu_mbar_wait(bar, parity);
}
__device__ __forceinline__ void oc_prefetch_l2(const void *src, uint32_t bytes)
{
    (void)src;
    (void)bytes;
}

#else

extern __shared__ __align__(128) unsigned char oc_dyn_smem[];
#define OC_SMEM() oc_dyn_smem

__device__ __forceinline__ uint32_t oc_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* A barrier one arrival (the thread that issues the copy) completes, once
 * its copy's bytes have landed. */
__device__ __forceinline__ void oc_mbar_init(uint64_t *bar)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(oc_addr(bar)) : "memory");
}

/* After the barriers are made, before the copy engine may use them (then
 * __syncthreads for the other threads). */
__device__ __forceinline__ void oc_fence_init(void)
{
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* Before a copy lands where this block's threads read before (ordered
 * after those reads by a __syncthreads). */
__device__ __forceinline__ void oc_fence_reuse(void)
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) from global
 * src to shared dst; bar's current phase completes when they land. */
__device__ __forceinline__ void oc_bulk_load(void *dst, const void *src, uint32_t bytes,
                                             uint64_t *bar)
{
    uint32_t b = oc_addr(bar);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];" ::"r"(oc_addr(dst)),
                 "l"(src), "r"(bytes), "r"(b)
                 : "memory");
}

/* Ask L2 to fetch bytes (a multiple of 16, src 16-byte aligned) from
 * global src ahead of a copy that will read them. */
__device__ __forceinline__ void oc_prefetch_l2(const void *src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

/* Wait until the phase of bar with this parity has completed. */
__device__ __forceinline__ void oc_mbar_wait(uint64_t *bar, uint32_t parity)
{
    uint32_t b = oc_addr(bar), done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(b), "r"(parity)
                     : "memory");
    } while (!done);
}

#endif /* REFIT_EMU */

#endif /* REFIT_KERNELS_ONCHIP_CUH */
