/* The scatter on the GPU (kernels/scatter.h; host reference
 * kernels/scatter.c, bit for bit the same): one thread an element, or, in
 * the run form, one block a run. The old bytes of each element are read
 * and written to `old` by the thread that then writes the new value, so
 * the undo log's gather and the patch are one pass over the tensor. Casts
 * are the host's algorithms (refit/sdk/minifloat.h), as kernels/copy.cu's.
 *
 * kern_scatter_cuda takes device-readable pointers only (device memory or
 * mapped pinned memory; core/cuda/scatter.c stages the rest) and is
 * asynchronous on the caller's stream. */
#include <cuda_runtime.h>
#include <stdint.h>

#include <refit/format.h>
#include <refit/sdk/minifloat.h>

#include "kernels/launch_errors.cuh"
#include "kernels/scatter.h"

#define SC_THREADS 256
#define SC_MAX_BLOCKS 65536u

/* Same dtype, one element a thread (grid-stride). */
template <typename T>
__global__ void k_scatter_elems(T *__restrict__ dst, const int64_t *__restrict__ off,
                                const T *__restrict__ vals, int64_t vs, T *__restrict__ old,
                                int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = off[i];
        if (o < 0)
            continue;
        T v = vals[i * vs];
        if (old)
            old[i] = dst[o];
        dst[o] = v;
    }
}

/* A float kind: 0 F32, 1 F16, 2 BF16. */
__device__ __forceinline__ float sc_load(const char *p, int kind)
{
    if (kind == 0)
        return *(const float *)p;
    uint16_t h = *(const uint16_t *)p;
    return __uint_as_float(kind == 1 ? refit_mf_bits_f16_to_f32(h) : refit_mf_bits_bf16_to_f32(h));
}

__device__ __forceinline__ void sc_store(char *p, int kind, float f)
{
    if (kind == 0) {
        *(float *)p = f;
        return;
    }
    uint32_t u = __float_as_uint(f);
    *(uint16_t *)p = kind == 1 ? refit_mf_bits_f32_to_f16(u) : refit_mf_bits_f32_to_bf16(u);
}

/* One element of value j into dst element o: the bytes it held to old[j]
 * first; same dtype (kinds < 0) a copy of e bytes, else a cast. */
__device__ __forceinline__ void sc_put(char *dst, int64_t o, const char *vals, int64_t j,
                                       int64_t vs, char *old, int de, int ve, int dk, int vk)
{
    char *d = dst + o * de;
    const char *v = vals + j * vs * ve;
    if (old)
        for (int b = 0; b < de; b++)
            old[j * de + b] = d[b];
    if (dk < 0)
        for (int b = 0; b < de; b++)
            d[b] = v[b];
    else
        sc_store(d, dk, sc_load(v, vk));
}

/* Any element size or a cast, one element a thread. */
__global__ void k_scatter_elems_any(char *dst, const int64_t *__restrict__ off, const char *vals,
                                    int64_t vs, char *old, int64_t n, int de, int ve, int dk,
                                    int vk)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        if (off[i] >= 0)
            sc_put(dst, off[i], vals, i, vs, old, de, ve, dk, vk);
}

/* Runs: block b takes runs b, b + gridDim.x, ...; vstart[i] is the index
 * of run i's first value. Same dtype of T. */
template <typename T>
__global__ void k_scatter_runs(T *__restrict__ dst, const int64_t *__restrict__ off,
                               const int64_t *__restrict__ counts,
                               const int64_t *__restrict__ vstart, int64_t stride,
                               const T *__restrict__ vals, int64_t vs, T *__restrict__ old,
                               int64_t n)
{
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        int64_t o = off[r], c = counts[r], j0 = vstart[r];
        if (o < 0)
            continue;
        for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
            T v = vals[(j0 + k) * vs];
            T *d = dst + o + k * stride;
            if (old)
                old[j0 + k] = *d;
            *d = v;
        }
    }
}

__global__ void k_scatter_runs_any(char *dst, const int64_t *__restrict__ off,
                                   const int64_t *__restrict__ counts,
                                   const int64_t *__restrict__ vstart, int64_t stride,
                                   const char *vals, int64_t vs, char *old, int64_t n, int de,
                                   int ve, int dk, int vk)
{
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        int64_t o = off[r], c = counts[r], j0 = vstart[r];
        if (o < 0)
            continue;
        for (int64_t k = threadIdx.x; k < c; k += blockDim.x)
            sc_put(dst, o + k * stride, vals, j0 + k, vs, old, de, ve, dk, vk);
    }
}

static unsigned sc_blocks(int64_t n)
{
    int64_t b = (n + SC_THREADS - 1) / SC_THREADS;
    return b < 1 ? 1u : b > (int64_t)SC_MAX_BLOCKS ? SC_MAX_BLOCKS : (unsigned)b;
}

template <typename T>
static void launch_elems(const kern_scatter *s, cudaStream_t st)
{
    k_scatter_elems<T><<<sc_blocks((int64_t)s->n), SC_THREADS, 0, st>>>(
        (T *)s->dst, s->off, (const T *)s->values, s->values_stride, (T *)s->old,
        (int64_t)s->n);
}

template <typename T>
static void launch_runs(const kern_scatter *s, const int64_t *vstart, cudaStream_t st)
{
    unsigned nb = s->n < SC_MAX_BLOCKS ? (unsigned)(s->n ? s->n : 1) : SC_MAX_BLOCKS;
    k_scatter_runs<T><<<nb, SC_THREADS, 0, st>>>((T *)s->dst, s->off, s->counts, vstart,
                                                 s->run_stride, (const T *)s->values,
                                                 s->values_stride, (T *)s->old, (int64_t)s->n);
}

/* s: every pointer device-readable; vstart: with counts, each run's first
 * value (device-readable), else NULL. Asynchronous on stream. */
extern "C" int kern_scatter_cuda(const kern_scatter *s, const int64_t *vstart, void *stream)
{
    static const char fn[] = "kern_scatter_cuda";
    int de = (int)(s->dst_dtype.bits / 8), ve = (int)(s->values_dtype.bits / 8);
    bool same = s->dst_dtype.code == s->values_dtype.code &&
                s->dst_dtype.bits == s->values_dtype.bits &&
                s->dst_dtype.lanes == s->values_dtype.lanes;
    int dk = same ? -1 : kc_float_kind(s->dst_dtype), vk = same ? -1 : kc_float_kind(s->values_dtype);
    if (de == 0 || ve == 0 || s->dst_dtype.bits % 8 || (!same && (dk < 0 || vk < 0)))
        return kc_refuse(fn, REFIT_EUNSUPPORTED, "no scatter between these dtypes", 0);
    if (s->counts && !vstart)
        return kc_refuse(fn, REFIT_EINVAL, "runs without their value starts", 0);
    if (s->n == 0)
        return REFIT_OK;
    cudaStream_t st = (cudaStream_t)stream;
    (void)cudaGetLastError();
    if (!s->counts && same && (de == 1 || de == 2 || de == 4 || de == 8)) {
        switch (de) {
        case 1: launch_elems<uint8_t>(s, st); break;
        case 2: launch_elems<uint16_t>(s, st); break;
        case 4: launch_elems<uint32_t>(s, st); break;
        default: launch_elems<uint64_t>(s, st); break;
        }
    } else if (!s->counts) {
        k_scatter_elems_any<<<sc_blocks((int64_t)s->n), SC_THREADS, 0, st>>>(
            s->dst, s->off, (const char *)s->values, s->values_stride, (char *)s->old,
            (int64_t)s->n, de, ve, dk, vk);
    } else if (same && (de == 1 || de == 2 || de == 4 || de == 8)) {
        switch (de) {
        case 1: launch_runs<uint8_t>(s, vstart, st); break;
        case 2: launch_runs<uint16_t>(s, vstart, st); break;
        case 4: launch_runs<uint32_t>(s, vstart, st); break;
        default: launch_runs<uint64_t>(s, vstart, st); break;
        }
    } else {
        unsigned nb = s->n < SC_MAX_BLOCKS ? (unsigned)s->n : SC_MAX_BLOCKS;
        k_scatter_runs_any<<<nb, SC_THREADS, 0, st>>>(
            s->dst, s->off, s->counts, vstart, s->run_stride, (const char *)s->values,
            s->values_stride, (char *)s->old, (int64_t)s->n, de, ve, dk, vk);
    }
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? REFIT_OK : kc_cuda_fail(fn, e, "launch");
}
