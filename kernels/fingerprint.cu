/* 64-bit content fingerprint on the GPU, bit-exact with
 * kern_fingerprint_view (kernels/fingerprint.c): the hash of the view's
 * bytes in row-major element order is mix(nbytes ^ sum_i mix(w_i ^ i*G))
 * over its little-endian 8-byte words w_i, the last zero-padded. The sum is
 * modulo 2^64, so each thread adds its words, then the block, then one
 * atomicAdd per block: any split gives the same value. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include <refit/format.h>

#include "kernels/launch_errors.cuh"

#define FP_GOLDEN 0x9e3779b97f4a7c15ull
#define FP_THREADS 256

extern "C" void kern_cuda_set_error(const char *msg);

static int fp_fail(cudaError_t e, const char *what)
{
    return kc_cuda_fail("kern_fingerprint_view_cuda", e, what);
}

__host__ __device__ __forceinline__ uint64_t fp_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The view as a walk over its elements: dims of extent 1 dropped, strides
 * in bytes, the innermost dim last. */
struct fp_walk {
    int nd;
    int e;                      /* element bytes; 0: raw bytes of a contiguous view */
    uint64_t nbytes;            /* of the logical byte stream */
    int64_t shape[REFIT_MAX_DIMS];
    int64_t st[REFIT_MAX_DIMS];
    const unsigned char *base;
    int contiguous;             /* the stream is base[0, nbytes) */
};

/* Byte offset of logical element i. */
__device__ __forceinline__ int64_t fp_offset(const fp_walk &w, int64_t i)
{
    int64_t off = 0;
    for (int k = w.nd - 1; k > 0; k--) {
        int64_t q = i / w.shape[k];
        off += (i - q * w.shape[k]) * w.st[k];
        i = q;
    }
    return off + i * w.st[0];
}

/* Little-endian word idx of the logical byte stream, zero-padded. */
__device__ __forceinline__ uint64_t fp_word(const fp_walk &w, uint64_t idx)
{
    uint64_t first = idx * 8, n = w.nbytes - first < 8 ? w.nbytes - first : 8;
    if (w.contiguous) {
        const unsigned char *p = w.base + first;
        if (n == 8 && ((uintptr_t)p & 7) == 0)
            return *(const uint64_t *)p;
        uint64_t v = 0;
        for (uint64_t b = 0; b < n; b++)
            v |= (uint64_t)p[b] << (8 * b);
        return v;
    }
    uint64_t v = 0;
    if (w.e == 1 || w.e == 2 || w.e == 4 || w.e == 8) {
        /* whole elements per word: one strided load each */
        int per = 8 / w.e;
        int64_t el = (int64_t)(first / (uint64_t)w.e);
        int cnt = (int)(n / (uint64_t)w.e);
        for (int k = 0; k < cnt && k < per; k++) {
            const unsigned char *p = w.base + fp_offset(w, el + k);
            uint64_t x;
            switch (w.e) {
            case 1: x = *p; break;
            case 2: x = *(const uint16_t *)p; break;
            case 4: x = *(const uint32_t *)p; break;
            default: x = *(const uint64_t *)p; break;
            }
            v |= x << (8 * k * w.e);
        }
        return v;
    }
    for (uint64_t b = 0; b < n; b++) {
        uint64_t pos = first + b;
        const unsigned char *p = w.base + fp_offset(w, (int64_t)(pos / (uint64_t)w.e));
        v |= (uint64_t)p[pos % (uint64_t)w.e] << (8 * b);
    }
    return v;
}

/* Every thread's sum into *acc: the warp, then the block, then one
 * atomicAdd per block. */
__device__ __forceinline__ void fp_block_add(uint64_t sum, unsigned long long *acc)
{
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_down_sync(0xffffffffu, sum, o);
    __shared__ uint64_t part[FP_THREADS / 32];
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t t = 0;
        for (int k = 0; k < FP_THREADS / 32; k++)
            t += part[k];
        atomicAdd(acc, (unsigned long long)t);
    }
}

__global__ void __launch_bounds__(FP_THREADS) k_fingerprint(fp_walk w, unsigned long long *acc)
{
    uint64_t words = (w.nbytes + 7) / 8, sum = 0;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        sum += fp_mix(fp_word(w, i) ^ (i * FP_GOLDEN));
    fp_block_add(sum, acc);
}

__device__ __forceinline__ uint4 fp_ld16(const unsigned char *p)
{
    return *(const uint4 *)p;
}

/* Words 2j and 2j + 1 of the stream, as one 16-byte load (little-endian). */
__device__ __forceinline__ uint64_t fp_pair(uint4 v, uint64_t j)
{
    uint64_t w0 = v.x | (uint64_t)v.y << 32, w1 = v.z | (uint64_t)v.w << 32;
    return fp_mix(w0 ^ (2 * j * FP_GOLDEN)) + fp_mix(w1 ^ ((2 * j + 1) * FP_GOLDEN));
}

/* kern_fingerprint_to_cuda's pass over contiguous, 16-byte aligned bytes:
 * two 16-byte loads in flight per thread, the last words (past the last
 * whole 16 bytes) by one thread. Launched with a few blocks per SM only,
 * so it runs beside a broadcast instead of holding its CTAs back. */
__global__ void __launch_bounds__(FP_THREADS) k_fingerprint_flat(fp_walk w,
                                                                 unsigned long long *acc)
{
    uint64_t n16 = w.nbytes / 16, sum = 0;
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; j + stride < n16; j += 2 * stride) {
        uint4 a = fp_ld16(w.base + 16 * j), b = fp_ld16(w.base + 16 * (j + stride));
        sum += fp_pair(a, j) + fp_pair(b, j + stride);
    }
    if (j < n16)
        sum += fp_pair(fp_ld16(w.base + 16 * j), j);
    if (blockIdx.x == 0 && threadIdx.x == 0)
        for (uint64_t i = 2 * n16; i < (w.nbytes + 7) / 8; i++)
            sum += fp_mix(fp_word(w, i) ^ (i * FP_GOLDEN));
    fp_block_add(sum, acc);
}

static int64_t numel_of(const refit_view *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++)
        n *= v->shape[i];
    return n;
}

static void fp_walk_init(fp_walk *w, const refit_view *v)
{
    int e = (v->dtype.bits % 8 == 0 && v->dtype.lanes == 1) ? v->dtype.bits / 8 : 0;
    int64_t numel = numel_of(v);
    w->base = (const unsigned char *)v->data;
    w->nd = 0;
    w->e = e;
    if (e == 0) { /* sub-byte: whole, contiguous bytes only (as the reference) */
        w->nbytes = (uint64_t)((numel * v->dtype.bits + 7) / 8);
        w->contiguous = 1;
        return;
    }
    w->nbytes = (uint64_t)numel * (uint64_t)e;
    for (int i = 0; i < v->ndim; i++) {
        if (v->shape[i] == 1)
            continue;
        int64_t s = v->strides[i] * e;
        int k = w->nd - 1;
        if (k >= 0 && w->st[k] == s * v->shape[i]) {
            w->shape[k] *= v->shape[i];
            w->st[k] = s;
            continue;
        }
        w->shape[w->nd] = v->shape[i];
        w->st[w->nd] = s;
        w->nd++;
    }
    if (w->nd == 0) {
        w->nd = 1;
        w->shape[0] = 1;
        w->st[0] = e;
    }
    w->contiguous = w->nd == 1 && (w->st[0] == e || w->shape[0] == 1);
}

/* Fingerprint of a device-readable view. Ordered on stream, and waits for
 * the stream (it returns the value); not for the hot path. */
extern "C" int kern_fingerprint_view_cuda(const refit_view *v, uint64_t *out, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    fp_walk w;
    fp_walk_init(&w, v);
    uint64_t acc = 0;
    if (w.nbytes > 0) {
        unsigned long long *dacc = NULL;
        bool pooled = true;
        cudaError_t e = cudaMallocAsync((void **)&dacc, sizeof *dacc, st);
        if (e == cudaErrorNotSupported) { /* no stream-ordered allocator here */
            (void)cudaGetLastError();
            pooled = false;
            e = cudaMalloc((void **)&dacc, sizeof *dacc);
        }
        if (e != cudaSuccess)
            return fp_fail(e, "allocating the accumulator");
        uint64_t words = (w.nbytes + 7) / 8;
        uint64_t nb = (words + FP_THREADS - 1) / FP_THREADS;
        unsigned blocks = (unsigned)(nb < 132 * 16 ? nb : 132 * 16);
        (void)cudaGetLastError();
        e = cudaMemsetAsync(dacc, 0, sizeof *dacc, st);
        if (e == cudaSuccess) {
            k_fingerprint<<<blocks, FP_THREADS, 0, st>>>(w, dacc);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(&acc, dacc, sizeof acc, cudaMemcpyDeviceToHost, st);
        cudaError_t fe = pooled ? cudaFreeAsync(dacc, st) : cudaSuccess;
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(st);
        if (!pooled)
            fe = cudaFree(dacc);
        if (e == cudaSuccess)
            e = fe;
        if (e != cudaSuccess)
            return fp_fail(e, "reduction");
    }
    *out = fp_mix(acc ^ w.nbytes);
    return REFIT_OK;
}

/* The last step of kern_fingerprint_to_cuda: the summed words, mixed with
 * the length as kern_fp_final does, replace the sum in place. One warp
 * (the emulator runs whole warps), one thread writes. */
__global__ void k_fingerprint_final(unsigned long long *acc, uint64_t nbytes)
{
    if (threadIdx.x == 0)
        *acc = (unsigned long long)fp_mix((uint64_t)*acc ^ nbytes);
}

/* Blocks of k_fingerprint_flat on the current device: FP_FLAT_PER_SM a
 * multiprocessor (512 of its 2048 threads), cached per device. */
#define FP_FLAT_PER_SM 2
static unsigned fp_flat_blocks(void)
{
    static int sms[64];
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        (void)cudaGetLastError();
        return 132 * FP_FLAT_PER_SM;
    }
    if (sms[dev] == 0) {
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            n <= 0) {
            (void)cudaGetLastError();
            n = 132;
        }
        sms[dev] = n; /* the same value from any thread that races here */
    }
    return (unsigned)sms[dev] * FP_FLAT_PER_SM;
}

/* Fingerprint of a device-readable view into the 8 bytes at dst (device
 * memory or mapped pinned memory, 8-byte aligned), ordered on stream:
 * zero the word, add every block's sum into it, mix it with the length.
 * Allocates nothing and never waits, so a hot path can queue it between
 * a copy and a collective that reads its result. */
extern "C" int kern_fingerprint_to_cuda(const refit_view *v, uint64_t *dst, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (((uintptr_t)dst & 7) != 0) {
        kern_cuda_set_error("kern_fingerprint_to_cuda: destination not 8-byte aligned");
        return REFIT_EINVAL;
    }
    fp_walk w;
    fp_walk_init(&w, v);
    unsigned long long *acc = (unsigned long long *)dst;
    (void)cudaGetLastError();
    cudaError_t e = cudaMemsetAsync(acc, 0, sizeof *acc, st);
    if (e == cudaSuccess && w.nbytes > 0) {
        uint64_t words = (w.nbytes + 7) / 8;
        uint64_t nb = (words + FP_THREADS - 1) / FP_THREADS;
        unsigned blocks = (unsigned)(nb < 132 * 16 ? nb : 132 * 16);
        if (w.contiguous && ((uintptr_t)w.base & 15) == 0) {
            uint64_t nf = (w.nbytes / 16 + FP_THREADS - 1) / FP_THREADS;
            unsigned cap = fp_flat_blocks();
            blocks = (unsigned)(nf == 0 ? 1 : nf < cap ? nf : cap);
            k_fingerprint_flat<<<blocks, FP_THREADS, 0, st>>>(w, acc);
        } else {
            k_fingerprint<<<blocks, FP_THREADS, 0, st>>>(w, acc);
        }
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) {
        k_fingerprint_final<<<1, 32, 0, st>>>(acc, w.nbytes);
        e = cudaGetLastError();
    }
    return e == cudaSuccess ? REFIT_OK : fp_fail(e, "enqueueing the reduction");
}
