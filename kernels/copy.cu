/* Strided copy with F32/F16/BF16 casts, zero, and the batched copy of many
 * contiguous pieces, on the GPU. Bit-exact with kernels/copy.c: the casts
 * below are the same round-to-nearest-even algorithms as kernels/cast.c
 * (NaN payloads kept, made quiet), not CUDA's intrinsics, which return a
 * canonical NaN.
 *
 * Every entry point is asynchronous on the caller's stream (NULL = the
 * legacy default stream) and never waits for the device. Pointers must be
 * readable by the device: device memory, or pinned host memory mapped into
 * the device's address space (the CUDA backend passes mapped pointers). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <refit/format.h>
#include <refit/sdk/minifloat.h>

/* One piece of a batched copy: the layout core/cuda/kern_cuda.h declares. */
struct kern_batch_row {
    uint64_t src;
    uint64_t dst;
    uint64_t bytes;
};
static_assert(sizeof(kern_batch_row) == 24, "kern_batch_row layout");

static thread_local char cuda_err[256];

/* Remember what failed (for kern_cuda_last_error) and map it to a status. */
static int cuda_fail(cudaError_t e, const char *what)
{
    snprintf(cuda_err, sizeof cuda_err, "%s: %s (%s)", what, cudaGetErrorString(e),
             cudaGetErrorName(e));
    return e == cudaErrorMemoryAllocation ? REFIT_ENOMEM : REFIT_EINTERNAL;
}

extern "C" const char *kern_cuda_last_error(void)
{
    return cuda_err;
}

extern "C" void kern_cuda_set_error(const char *msg)
{
    snprintf(cuda_err, sizeof cuda_err, "%s", msg);
}

/* ---- casts: the same algorithms as the host (refit/sdk/minifloat.h) ---- */

__device__ __forceinline__ float d_f16_to_f32(uint16_t h)
{
    return __uint_as_float(refit_mf_bits_f16_to_f32(h));
}

__device__ __forceinline__ uint16_t d_f32_to_f16(float f)
{
    return refit_mf_bits_f32_to_f16(__float_as_uint(f));
}

__device__ __forceinline__ float d_bf16_to_f32(uint16_t b)
{
    return __uint_as_float(refit_mf_bits_bf16_to_f32(b));
}

__device__ __forceinline__ uint16_t d_f32_to_bf16(float f)
{
    return refit_mf_bits_f32_to_bf16(__float_as_uint(f));
}

/* ---- strided walks ---- */

#define KMAX_DIMS REFIT_MAX_DIMS

/* Both views coalesced on the host: size-1 dims dropped, dims contiguous
 * in both merged. Strides in bytes. Passed by value to the kernel. */
struct walk2 {
    int nd;
    int64_t n;                  /* elements */
    int64_t shape[KMAX_DIMS];
    int64_t ds[KMAX_DIMS];
    int64_t ss[KMAX_DIMS];
    char *d;
    const char *s;
};

/* The same merge as kernels/copy.c's walk_init (src may be NULL). */
static void walk2_init(walk2 *w, const refit_view *dst, const refit_view *src, size_t de,
                       size_t se)
{
    w->nd = 0;
    w->n = 1;
    for (int i = 0; i < dst->ndim; i++) {
        w->n *= dst->shape[i];
        if (dst->shape[i] == 1)
            continue;
        int64_t d = dst->strides[i] * (int64_t)de;
        int64_t s = src ? src->strides[i] * (int64_t)se : 0;
        int k = w->nd - 1;
        if (k >= 0 && w->ds[k] == d * dst->shape[i] && (!src || w->ss[k] == s * dst->shape[i])) {
            w->shape[k] *= dst->shape[i];
            w->ds[k] = d;
            w->ss[k] = s;
            continue;
        }
        w->shape[w->nd] = dst->shape[i];
        w->ds[w->nd] = d;
        w->ss[w->nd] = s;
        w->nd++;
    }
    if (w->nd == 0) {
        w->nd = 1;
        w->shape[0] = 1;
        w->ds[0] = (int64_t)de;
        w->ss[0] = (int64_t)se;
    }
    w->d = (char *)dst->data;
    w->s = src ? (const char *)src->data : NULL;
}

/* Byte offsets of logical element i in both views. */
__device__ __forceinline__ void walk2_offsets(const walk2 &w, int64_t i, int64_t *doff,
                                              int64_t *soff)
{
    int64_t d = 0, s = 0;
    for (int k = w.nd - 1; k > 0; k--) {
        int64_t ext = w.shape[k];
        int64_t q = i / ext;
        int64_t r = i - q * ext;
        d += r * w.ds[k];
        s += r * w.ss[k];
        i = q;
    }
    *doff = d + i * w.ds[0];
    *soff = s + i * w.ss[0];
}

/* 0 = f32, 1 = f16, 2 = bf16 (kernels/copy.c's float_kind). */
static int float_kind(refit_dtype d)
{
    if (d.code == REFIT_DTYPE_BFLOAT)
        return 2;
    return d.bits == 32 ? 0 : 1;
}

__device__ __forceinline__ float ld_kind(const char *p, int k)
{
    if (k == 0)
        return *(const float *)p;
    uint16_t h = *(const uint16_t *)p;
    return k == 1 ? d_f16_to_f32(h) : d_bf16_to_f32(h);
}

__device__ __forceinline__ void st_kind(char *p, int k, float f)
{
    if (k == 0)
        *(float *)p = f;
    else
        *(uint16_t *)p = k == 1 ? d_f32_to_f16(f) : d_f32_to_bf16(f);
}

template <int DK, int SK>
__global__ void k_cast(walk2 w)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < w.n; i += stride) {
        int64_t doff, soff;
        walk2_offsets(w, i, &doff, &soff);
        st_kind(w.d + doff, DK, ld_kind(w.s + soff, SK));
    }
}

template <typename T>
__global__ void k_strided(walk2 w)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < w.n; i += stride) {
        int64_t doff, soff;
        walk2_offsets(w, i, &doff, &soff);
        *(T *)(w.d + doff) = *(const T *)(w.s + soff);
    }
}

/* An element of unusual size (3, 6, 12 ... bytes), byte by byte. */
__global__ void k_strided_bytes(walk2 w, int e)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < w.n; i += stride) {
        int64_t doff, soff;
        walk2_offsets(w, i, &doff, &soff);
        for (int b = 0; b < e; b++)
            w.d[doff + b] = w.s[soff + b];
    }
}

template <typename T>
__global__ void k_zero(walk2 w)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < w.n; i += stride) {
        int64_t doff, soff;
        walk2_offsets(w, i, &doff, &soff);
        *(T *)(w.d + doff) = T(0);
    }
}

__global__ void k_zero_bytes(walk2 w, int e)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < w.n; i += stride) {
        int64_t doff, soff;
        walk2_offsets(w, i, &doff, &soff);
        for (int b = 0; b < e; b++)
            w.d[doff + b] = 0;
    }
}

#define EW_THREADS 256

static unsigned ew_blocks(int64_t n)
{
    int64_t b = (n + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(b < 65536 * 8 ? (b > 0 ? b : 1) : 65536 * 8);
}

static int launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? REFIT_OK : cuda_fail(e, what);
}

static int64_t view_numel(const refit_view *v)
{
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++)
        n *= v->shape[i];
    return n;
}

static size_t dtype_size(refit_dtype dt)
{
    if (dt.bits == 0 || dt.bits % 8 != 0 || dt.lanes != 1)
        return 0;
    return dt.bits / 8u;
}

static int dtype_eq(refit_dtype a, refit_dtype b)
{
    return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

static int float16ish(refit_dtype d)
{
    return d.lanes == 1 && ((d.code == REFIT_DTYPE_FLOAT && (d.bits == 16 || d.bits == 32)) ||
                            (d.code == REFIT_DTYPE_BFLOAT && d.bits == 16));
}

/* 1 when the coalesced walk is one run of contiguous elements in both. */
static int walk2_contiguous(const walk2 *w, size_t de, size_t se)
{
    return w->nd == 1 && (w->ds[0] == (int64_t)de || w->shape[0] == 1) &&
           (w->ss[0] == (int64_t)se || w->shape[0] == 1);
}

template <int DK>
static void launch_cast_from(const walk2 &w, int sk, cudaStream_t st)
{
    unsigned nb = ew_blocks(w.n);
    switch (sk) {
    case 0: k_cast<DK, 0><<<nb, EW_THREADS, 0, st>>>(w); break;
    case 1: k_cast<DK, 1><<<nb, EW_THREADS, 0, st>>>(w); break;
    default: k_cast<DK, 2><<<nb, EW_THREADS, 0, st>>>(w); break;
    }
}

extern "C" int kern_copy_cuda(const refit_view *dst, const refit_view *src, void *stream)
{
    if (dst->ndim != src->ndim)
        return REFIT_EMISMATCH;
    for (int i = 0; i < dst->ndim; i++)
        if (dst->shape[i] != src->shape[i])
            return REFIT_EMISMATCH;
    int same = dtype_eq(dst->dtype, src->dtype);
    size_t de = dtype_size(dst->dtype), se = dtype_size(src->dtype);
    if (same ? de == 0 : !(float16ish(dst->dtype) && float16ish(src->dtype)))
        return REFIT_EUNSUPPORTED;
    if (view_numel(dst) == 0)
        return REFIT_OK;
    cudaStream_t st = (cudaStream_t)stream;
    walk2 w;
    walk2_init(&w, dst, src, de, se);
    (void)cudaGetLastError(); /* a stale error is not this launch's */
    if (same && walk2_contiguous(&w, de, se)) {
        cudaError_t e = cudaMemcpyAsync(w.d, w.s, (size_t)w.n * de, cudaMemcpyDefault, st);
        return e == cudaSuccess ? REFIT_OK : cuda_fail(e, "kern_copy_cuda: cudaMemcpyAsync");
    }
    if (!same) {
        int dk = float_kind(dst->dtype), sk = float_kind(src->dtype);
        switch (dk) {
        case 0: launch_cast_from<0>(w, sk, st); break;
        case 1: launch_cast_from<1>(w, sk, st); break;
        default: launch_cast_from<2>(w, sk, st); break;
        }
        return launched("kern_copy_cuda: cast kernel");
    }
    unsigned nb = ew_blocks(w.n);
    switch (de) {
    case 1: k_strided<uint8_t><<<nb, EW_THREADS, 0, st>>>(w); break;
    case 2: k_strided<uint16_t><<<nb, EW_THREADS, 0, st>>>(w); break;
    case 4: k_strided<uint32_t><<<nb, EW_THREADS, 0, st>>>(w); break;
    case 8: k_strided<uint64_t><<<nb, EW_THREADS, 0, st>>>(w); break;
    default: k_strided_bytes<<<nb, EW_THREADS, 0, st>>>(w, (int)de); break;
    }
    return launched("kern_copy_cuda: strided kernel");
}

extern "C" int kern_zero_cuda(const refit_view *dst, void *stream)
{
    size_t e = dtype_size(dst->dtype);
    if (e == 0)
        return REFIT_EUNSUPPORTED;
    if (view_numel(dst) == 0)
        return REFIT_OK;
    cudaStream_t st = (cudaStream_t)stream;
    walk2 w;
    walk2_init(&w, dst, NULL, e, 0);
    (void)cudaGetLastError();
    if (w.nd == 1 && (w.ds[0] == (int64_t)e || w.shape[0] == 1)) {
        cudaError_t err = cudaMemsetAsync(w.d, 0, (size_t)w.n * e, st);
        return err == cudaSuccess ? REFIT_OK : cuda_fail(err, "kern_zero_cuda: cudaMemsetAsync");
    }
    unsigned nb = ew_blocks(w.n);
    switch (e) {
    case 1: k_zero<uint8_t><<<nb, EW_THREADS, 0, st>>>(w); break;
    case 2: k_zero<uint16_t><<<nb, EW_THREADS, 0, st>>>(w); break;
    case 4: k_zero<uint32_t><<<nb, EW_THREADS, 0, st>>>(w); break;
    case 8: k_zero<uint64_t><<<nb, EW_THREADS, 0, st>>>(w); break;
    default: k_zero_bytes<<<nb, EW_THREADS, 0, st>>>(w, (int)e); break;
    }
    return launched("kern_zero_cuda: zero kernel");
}

/* ---- batched copy: one block per row ---- */

#define BATCH_THREADS 256

/* Words of type T, both pointers aligned to sizeof(T); U loads in flight
 * per thread before the first store. */
template <typename T, int U>
__device__ __forceinline__ void copy_words(char *d, const char *s, uint64_t n)
{
    const T *sv = (const T *)s;
    T *dv = (T *)d;
    uint64_t cnt = n / sizeof(T), step = blockDim.x, i = threadIdx.x;
    for (; i + (U - 1) * step < cnt; i += U * step) {
        T v[U];
#pragma unroll
        for (int k = 0; k < U; k++)
            v[k] = sv[i + k * step];
#pragma unroll
        for (int k = 0; k < U; k++)
            dv[i + k * step] = v[k];
    }
    for (; i < cnt; i += step)
        dv[i] = sv[i];
}

/* 16-byte words with streaming hints: the data is touched once. */
template <int U>
__device__ __forceinline__ void copy_words_cs(char *d, const char *s, uint64_t n)
{
    const uint4 *sv = (const uint4 *)s;
    uint4 *dv = (uint4 *)d;
    uint64_t cnt = n / 16, step = blockDim.x, i = threadIdx.x;
    for (; i + (U - 1) * step < cnt; i += U * step) {
        uint4 v[U];
#pragma unroll
        for (int k = 0; k < U; k++)
            v[k] = __ldcs(sv + i + k * step);
#pragma unroll
        for (int k = 0; k < U; k++)
            __stcs(dv + i + k * step, v[k]);
    }
    for (; i < cnt; i += step)
        __stcs(dv + i, __ldcs(sv + i));
}

/* One row: its head bytes, the widest words both pointers allow, its tail. */
template <int V>
__device__ __forceinline__ void batch_row(const kern_batch_row &x)
{
    char *d = (char *)x.dst;
    const char *s = (const char *)x.src;
    uint64_t len = x.bytes;
    /* widest word both pointers can be aligned to at once */
    uint64_t mis = x.dst ^ x.src;
    unsigned w = (mis & 15) == 0 ? 16 : (mis & 7) == 0 ? 8 : (mis & 3) == 0 ? 4
               : (mis & 1) == 0 ? 2 : 1;
    uint64_t head = (w - (x.dst & (w - 1))) & (w - 1);
    if (head > len)
        head = len;
    if (threadIdx.x < head)
        d[threadIdx.x] = s[threadIdx.x];
    d += head;
    s += head;
    len -= head;
    uint64_t body = len & ~(uint64_t)(w - 1);
    switch (w) {
    case 16:
        if (V == 0)
            copy_words<uint4, 4>(d, s, body);
        else if (V == 1)
            copy_words<uint4, 8>(d, s, body);
        else if (V == 2)
            copy_words_cs<4>(d, s, body);
        else
            copy_words_cs<8>(d, s, body);
        break;
    case 8: copy_words<uint64_t, 4>(d, s, body); break;
    case 4: copy_words<uint32_t, 4>(d, s, body); break;
    case 2: copy_words<uint16_t, 4>(d, s, body); break;
    default: copy_words<uint8_t, 4>(d, s, body); break;
    }
    for (uint64_t i = body + threadIdx.x; i < len; i += blockDim.x)
        d[i] = s[i];
}

/* A block a row (rows past the grid: strided). */
template <int V>
__global__ void __launch_bounds__(BATCH_THREADS) k_batch(const kern_batch_row *rows, uint32_t n)
{
    for (uint32_t r = blockIdx.x; r < n; r += gridDim.x)
        batch_row<V>(rows[r]);
}

static int batch_variant = 1, batch_grid;

extern "C" void kern_copy_batch_variant(int v, int grid)
{
    batch_variant = v;
    batch_grid = grid;
}

/* rows: a device-readable table of n rows. One launch for all of them. */
extern "C" int kern_copy_batch_cuda(const void *rows, uint32_t n, void *stream)
{
    if (n == 0)
        return REFIT_OK;
    (void)cudaGetLastError();
    unsigned nb = n < (1u << 30) ? n : (1u << 30);
    if (batch_grid > 0 && (unsigned)batch_grid < nb)
        nb = (unsigned)batch_grid;
    const kern_batch_row *r = (const kern_batch_row *)rows;
    cudaStream_t st = (cudaStream_t)stream;
    switch (batch_variant) {
    case 1: k_batch<1><<<nb, BATCH_THREADS, 0, st>>>(r, n); break;
    case 2: k_batch<2><<<nb, BATCH_THREADS, 0, st>>>(r, n); break;
    case 3: k_batch<3><<<nb, BATCH_THREADS, 0, st>>>(r, n); break;
    default: k_batch<0><<<nb, BATCH_THREADS, 0, st>>>(r, n); break;
    }
    return launched("kern_copy_batch_cuda");
}
