/* INT4 online quantization on the GPU (round-to-nearest, symmetric, per
 * group), bit-exact with kern_quant_int4 (kernels/quant_int4.c): the
 * arithmetic is the KERN_HD functions of quant_int4.h, compiled here for
 * the device (nvcc's defaults keep it exact: -prec-div=true, -ftz=false,
 * no --use_fast_math; rintf is the round-to-nearest-even instruction).
 *
 * A call quantizes n pieces in one launch (kern_quant_int4_cuda in
 * core/cuda/kern_cuda.h; more launches only past Q4_BATCH pieces). The
 * pieces travel in the kernel's parameters (a __grid_constant__ struct of
 * up to 31 KB, which sm_90 takes), so nothing is copied to the device but
 * the memset of a status word. The work is split into units:
 *
 *   k_q4_groups<L>  groups of 8L columns (8, 16, ..., 256): a unit is one
 *                   (row, group), taken by L lanes of a warp, one int32
 *                   word (8 elements, one 16-byte load for F16/BF16, two
 *                   for F32, where the row is contiguous and aligned) per
 *                   lane; the group's amax is a shuffle over its lanes, so
 *                   every lane holds the scale and writes its word with no
 *                   barrier. Warps walk the units grid-stride.
 *   k_q4_rows       any other group (not a multiple of 8, one scale per
 *                   row, or more than 256 columns): a unit is a row, taken
 *                   by a block: each group's amax is a block reduction,
 *                   thread 0 stores the scale, then (after a barrier) the
 *                   threads write the row's words, reading the stored
 *                   scales back (a word may span two groups).
 *
 * Unit order: where a piece's words run along N (the GPTQ layout's
 * transposed view, q strides [1, N]), units walk rows fastest, so that
 * neighbouring lanes' stores of one word index land side by side;
 * otherwise (the u8 layout's byte rows) groups walk fastest.
 *
 * A NaN or infinity in a group, or a scale past an F16 scale's range,
 * makes the unit atomicMin its piece's index into the status word and
 * write nothing; the call copies the word back and waits for the stream
 * once, at the end, to report it. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/format.h>

#include "kernels/status_word.cuh"
#include "kernels/quant_int4.h"

extern "C" void kern_cuda_set_error(const char *msg);

#define Q4_THREADS 256
#define Q4_BATCH 256             /* pieces per launch */
#define Q4_BLOCKS_MAX 4096       /* grid-stride beyond this */
#define Q4_FINITE 0x7f800000u    /* magnitude bits at and past infinity */
#define Q4_NONE KC_STATUS_NONE      /* status word: no piece failed */
#define Q4_DEVICES 64            /* devices with a cached status word */
#define Q4_SMALL 8               /* pieces of a launch with a short parameter block */
#define Q4_SHORT 64              /* kernel template flag: the short parameter block */

struct q4_piece {
    const char *x;
    char *q;                     /* the I32 words, checkpoint layout */
    char *s;                     /* the scales [n, groups] */
    int64_t n, k, words, groups;
    int64_t xs0, xs1, qs0, qs1, ss0, ss1; /* strides, in elements */
    int64_t first;               /* its first unit in the launch */
    int32_t idx;                 /* its index in the call */
    uint8_t kind, skind;         /* x and scale dtypes: 0 f32, 1 f16, 2 bf16 */
    uint8_t vx;                  /* rows of x contiguous and 16-byte aligned */
    uint8_t colmajor;            /* units walk rows fastest */
};

/* The launch's parameters. CAP Q4_SMALL for a launch of few pieces (a
 * call per weight, as post-load makes): the driver copies a launch's whole
 * parameter block, ~1.4 KB instead of ~31 KB. */
template <int CAP> struct q4_batch_of {
    int32_t np;
    int32_t pad;
    int64_t g_len;               /* columns per group, > 0 (k_q4_rows: 0 = k) */
    int64_t end;                 /* units of the launch */
    q4_piece p[CAP];
};
typedef q4_batch_of<Q4_BATCH> q4_batch;
typedef q4_batch_of<Q4_SMALL> q4_batch_small;
static_assert(sizeof(q4_batch) <= 32000, "q4_batch must fit the kernel parameters");
/* A kernel's parameters by its template flag (Q4_SHORT: the short block;
 * one template argument, as the emulator's launch macro needs). */
#define Q4_PARAMS(F) q4_batch_of<((F) & Q4_SHORT) ? Q4_SMALL : Q4_BATCH>

/* The piece unit u belongs to (the last whose first unit <= u): pi when
 * it still is (units only grow along a thread's loop), else searched. */
template <class BATCH>
__device__ __forceinline__ int q4_find(const BATCH &B, int64_t u, int pi = 0)
{
    if (B.p[pi].first <= u && (pi + 1 >= B.np || u < B.p[pi + 1].first))
        return pi;
    int lo = 0, hi = B.np - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (B.p[mid].first <= u)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

__device__ __forceinline__ float q4_decode(const char *p, int kind)
{
    if (kind == 0)
        return *(const float *)p;
    uint16_t h = *(const uint16_t *)p;
    return __uint_as_float(kind == 1 ? kern_bits_f16_to_f32(h) : kern_bits_bf16_to_f32(h));
}

__device__ __forceinline__ float q4_half(uint32_t w, int hi, int kind)
{
    uint16_t h = (uint16_t)(hi ? w >> 16 : w & 0xffffu);
    return __uint_as_float(kind == 1 ? kern_bits_f16_to_f32(h) : kern_bits_bf16_to_f32(h));
}

/* Elements 8w .. 8w+7 of row i (0 past k). */
__device__ __forceinline__ void q4_load8(const q4_piece &p, int64_t i, int64_t w, float v[8])
{
    int64_t j0 = 8 * w;
    int64_t es = p.kind == 0 ? 4 : 2;
    if (p.vx && j0 + 8 <= p.k) {
        const char *a = p.x + (i * p.xs0 + j0) * es;
        if (p.kind == 0) {
            float4 lo = *(const float4 *)a, hi = *(const float4 *)(a + 16);
            v[0] = lo.x; v[1] = lo.y; v[2] = lo.z; v[3] = lo.w;
            v[4] = hi.x; v[5] = hi.y; v[6] = hi.z; v[7] = hi.w;
        } else {
            uint4 u = *(const uint4 *)a;
            v[0] = q4_half(u.x, 0, p.kind); v[1] = q4_half(u.x, 1, p.kind);
            v[2] = q4_half(u.y, 0, p.kind); v[3] = q4_half(u.y, 1, p.kind);
            v[4] = q4_half(u.z, 0, p.kind); v[5] = q4_half(u.z, 1, p.kind);
            v[6] = q4_half(u.w, 0, p.kind); v[7] = q4_half(u.w, 1, p.kind);
        }
        return;
    }
#pragma unroll
    for (int e = 0; e < 8; e++)
        v[e] = j0 + e < p.k ? q4_decode(p.x + (i * p.xs0 + (j0 + e) * p.xs1) * es, p.kind)
                            : 0.0f;
}

__device__ __forceinline__ uint32_t q4_mag_max(uint32_t m, const float v[8])
{
#pragma unroll
    for (int e = 0; e < 8; e++)
        m = max(m, __float_as_uint(v[e]) & 0x7fffffffu);
    return m;
}

__device__ __forceinline__ void q4_store_scale(const q4_piece &p, int64_t i, int64_t g,
                                               uint32_t bits)
{
    char *a = p.s + (i * p.ss0 + g * p.ss1) * (p.skind == 0 ? 4 : 2);
    if (p.skind == 0)
        *(uint32_t *)a = bits;
    else
        *(uint16_t *)a = (uint16_t)bits;
}

__device__ __forceinline__ float q4_load_scale(const q4_piece &p, int64_t i, int64_t g)
{
    const char *a = p.s + (i * p.ss0 + g * p.ss1) * (p.skind == 0 ? 4 : 2);
    return kern_int4_scale_value(p.skind == 0 ? *(const uint32_t *)a : *(const uint16_t *)a,
                                 p.skind);
}

__device__ __forceinline__ void q4_store_word(const q4_piece &p, int64_t i, int64_t w,
                                              uint32_t word)
{
    *(uint32_t *)(p.q + (i * p.qs0 + w * p.qs1) * 4) = word;
}

/* kern_int4_encode(x, s), the code of round(clamp(x / s, -8, 7)) with
 * x / s correctly rounded, by a multiply where that provably gives the
 * same integer (a division is the costliest step of the kernel). With
 * inv = RN(1/s), t = RN(x * inv) and m = rint(t): for |t| < 16,
 * |t - x/s| <= |x/s| * 2^-23 < 2^-19 and RN(x/s) is within 2^-21 of x/s,
 * so when |t - m| < 1/2 - 2^-17 (t more than 2^-17 from both half-integers
 * beside m) x/s and RN(x/s) round to m too; for |t| >= 16 both clamp to
 * the same end. t - m is exact (Sterbenz). Near a half-integer, or for an
 * infinite inv (a tiny scale: t - m is then NaN), the exact division
 * decides. __fmul_rn: never contracted into an FMA. */
__device__ __forceinline__ uint32_t q4_encode(float x, float s, float inv)
{
    float t = __fmul_rn(x, inv), m = rintf(t);
    if (fabsf(t - m) < 0.5f - 0x1p-17f)
        return (uint32_t)((int)fminf(fmaxf(m, -8.0f), 7.0f) + 8);
    return kern_int4_encode(x, s);
}

/* Row and group of unit r of piece p (32-bit division where it fits: a
 * 64-bit one costs several times more, once per unit). */
__device__ __forceinline__ void q4_unit(const q4_piece &p, int64_t r, int64_t *i, int64_t *g)
{
    int64_t d = p.colmajor ? p.n : p.groups, a;
    if (((uint64_t)r | (uint64_t)d) <= 0xffffffffull)
        a = (int64_t)((uint32_t)r / (uint32_t)d);
    else
        a = r / d;
    if (p.colmajor) {
        *g = a;
        *i = r - a * p.n;
    } else {
        *i = a;
        *g = r - a * p.groups;
    }
}

/* ---- groups of 8L columns: L lanes a (row, group) ---- */

template <int LS> /* L | Q4_SHORT for the short parameter block */
__global__ void __launch_bounds__(Q4_THREADS)
k_q4_groups(const __grid_constant__ Q4_PARAMS(LS) B, unsigned int *status)
{
    constexpr int L = LS & (Q4_SHORT - 1);
    const int per_warp = 32 / L;
    int lane = threadIdx.x & 31, sub = lane & (L - 1);
    int64_t warp = ((int64_t)blockIdx.x * Q4_THREADS + threadIdx.x) >> 5;
    int64_t warps = ((int64_t)gridDim.x * Q4_THREADS) >> 5;
    int pi = 0; /* the piece of the last unit */
    for (int64_t base = warp * per_warp; base < B.end; base += warps * per_warp) {
        int64_t u = base + lane / L, i = 0, g = 0, w = 0;
        bool live = u < B.end;
        float v[8];
        uint32_t m = 0;
        if (live) {
            pi = q4_find(B, u, pi);
            q4_unit(B.p[pi], u - B.p[pi].first, &i, &g);
            w = g * L + sub;
            q4_load8(B.p[pi], i, w, v);
            m = q4_mag_max(0, v);
        }
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1)
            m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (!live)
            continue;
        const q4_piece &p = B.p[pi];
        uint32_t sb = m >= Q4_FINITE ? KERN_INT4_SCALE_OVERFLOW
                                     : kern_int4_scale_bits(__uint_as_float(m), p.skind);
        if (sb == KERN_INT4_SCALE_OVERFLOW) {
            if (sub == 0)
                atomicMin(status, (unsigned int)p.idx);
            continue;
        }
        if (sub == 0)
            q4_store_scale(p, i, g, sb);
        if (w >= p.words)
            continue;
        float s = kern_int4_scale_value(sb, p.skind), inv = __fdiv_rn(1.0f, s);
        uint32_t word = 0;
#pragma unroll
        for (int e = 0; e < 8; e++)
            word |= q4_encode(v[e], s, inv) << (4 * e);
        /* nibbles past k are 0: every element encoded (those past k were
         * loaded as 0), then masked once, rather than a 64-bit bound
         * check per element */
        int64_t left = p.k - 8 * w;
        q4_store_word(p, i, w, left >= 8 ? word : word & ((1u << (4 * left)) - 1u));
    }
}

/* ---- any group: a block a row ---- */

/* The max of m over the block, in every thread; part is free again on
 * return. */
__device__ __forceinline__ uint32_t q4_block_max(uint32_t m, uint32_t *part)
{
    for (int o = 16; o > 0; o >>= 1)
        m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x / 32] = m;
    __syncthreads();
    m = part[0];
    for (int w = 1; w < Q4_THREADS / 32; w++)
        m = max(m, part[w]);
    __syncthreads();
    return m;
}

template <int S> /* Q4_SHORT for the short parameter block, else 0 */
__global__ void __launch_bounds__(Q4_THREADS)
k_q4_rows(const __grid_constant__ Q4_PARAMS(S) B, unsigned int *status)
{
    __shared__ uint32_t part[Q4_THREADS / 32];
    for (int64_t u = blockIdx.x; u < B.end; u += gridDim.x) {
        const q4_piece &p = B.p[q4_find(B, u)];
        int64_t i = u - p.first;
        int64_t g_len = B.g_len > 0 ? B.g_len : (p.k > 0 ? p.k : 1);
        bool failed = false;
        for (int64_t g = 0; g < p.groups && !failed; g++) {
            int64_t c0 = g * g_len, c1 = c0 + g_len < p.k ? c0 + g_len : p.k;
            uint32_t m = 0;
            if (g_len % 8 == 0) { /* whole words */
                for (int64_t w = c0 / 8 + threadIdx.x; 8 * w < c1; w += Q4_THREADS) {
                    float v[8];
                    q4_load8(p, i, w, v);
                    m = q4_mag_max(m, v);
                }
            } else {
                int64_t es = p.kind == 0 ? 4 : 2;
                for (int64_t j = c0 + threadIdx.x; j < c1; j += Q4_THREADS)
                    m = max(m, __float_as_uint(q4_decode(p.x + (i * p.xs0 + j * p.xs1) * es,
                                                         p.kind)) & 0x7fffffffu);
            }
            m = q4_block_max(m, part); /* the same m in every thread */
            uint32_t sb = m >= Q4_FINITE ? KERN_INT4_SCALE_OVERFLOW
                                         : kern_int4_scale_bits(__uint_as_float(m), p.skind);
            if (sb == KERN_INT4_SCALE_OVERFLOW)
                failed = true;
            else if (threadIdx.x == 0)
                q4_store_scale(p, i, g, sb);
        }
        if (failed) {
            if (threadIdx.x == 0)
                atomicMin(status, (unsigned int)p.idx);
            continue;
        }
        __syncthreads(); /* the row's scales, stored by thread 0, are visible */
        for (int64_t w = threadIdx.x; w < p.words; w += Q4_THREADS) {
            float v[8];
            q4_load8(p, i, w, v);
            /* the group of the word's first element; the next one starts
             * at g_end (a word may cross into it) */
            int64_t g_at = 8 * w / g_len, g_end = (g_at + 1) * g_len;
            float s = q4_load_scale(p, i, g_at), inv = __fdiv_rn(1.0f, s);
            uint32_t word = 0;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                int64_t j = 8 * w + e;
                if (j >= p.k)
                    break;
                if (j >= g_end) {
                    g_at++;
                    g_end += g_len;
                    s = q4_load_scale(p, i, g_at);
                    inv = __fdiv_rn(1.0f, s);
                }
                word |= q4_encode(v[e], s, inv) << (4 * e);
            }
            q4_store_word(p, i, w, word);
        }
        __syncthreads(); /* before thread 0 stores the next row's scales */
    }
}

/* ---- host side ---- */

static int q4_fail(cudaError_t e, const char *what)
{
    char m[256];
    snprintf(m, sizeof m, "kern_quant_int4_cuda: %s: %s (%s)", what, cudaGetErrorString(e),
             cudaGetErrorName(e));
    kern_cuda_set_error(m);
    return e == cudaErrorMemoryAllocation ? REFIT_ENOMEM : REFIT_EINTERNAL;
}

static int q4_refuse(int rc, const char *what, uint32_t i)
{
    char m[256];
    snprintf(m, sizeof m, "kern_quant_int4_cuda: piece %u: %s", i, what);
    kern_cuda_set_error(m);
    return rc;
}

static int q4_kind(refit_dtype d)
{
    if (d.lanes != 1)
        return -1;
    if (d.code == REFIT_DTYPE_FLOAT && (d.bits == 32 || d.bits == 16))
        return d.bits == 32 ? 0 : 1;
    return d.code == REFIT_DTYPE_BFLOAT && d.bits == 16 ? 2 : -1;
}

static int64_t q4_cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Piece i as the kernels read it, checked as kern_quant_int4_check does. */
static int q4_piece_init(q4_piece *pc, const refit_view *q, const refit_view *s,
                         const refit_view *x, int64_t group, uint32_t i)
{
    int kind = q4_kind(x->dtype), skind = q4_kind(s->dtype);
    if (kind < 0 || skind < 0 || q->dtype.bits != 32 || q->dtype.lanes != 1 ||
        (q->dtype.code != REFIT_DTYPE_INT && q->dtype.code != REFIT_DTYPE_UINT))
        return q4_refuse(REFIT_EUNSUPPORTED, "dtypes: x and scale f32/f16/bf16, q 32-bit", i);
    if (x->ndim != 2 || q->ndim != 2 || s->ndim != 2 || x->shape[0] < 0 || x->shape[1] < 0)
        return q4_refuse(REFIT_EMISMATCH, "x, q and scale must be 2-D", i);
    int64_t n = x->shape[0], k = x->shape[1];
    int64_t words = q4_cdiv(k, 8), groups = group > 0 ? q4_cdiv(k, group) : 1;
    if (q->shape[0] != n || q->shape[1] != words || s->shape[0] != n || s->shape[1] != groups)
        return q4_refuse(REFIT_EMISMATCH, "q must be [n, ceil(k/8)], scale [n, groups]", i);
    memset(pc, 0, sizeof *pc);
    int64_t es = kind == 0 ? 4 : 2;
    pc->x = (const char *)x->data;
    pc->q = (char *)q->data;
    pc->s = (char *)s->data;
    pc->n = n;
    pc->k = k;
    pc->words = words;
    pc->groups = groups;
    pc->xs0 = x->strides[0];
    pc->xs1 = x->strides[1];
    pc->qs0 = q->strides[0];
    pc->qs1 = q->strides[1];
    pc->ss0 = s->strides[0];
    pc->ss1 = s->strides[1];
    pc->idx = (int32_t)i;
    pc->kind = (uint8_t)kind;
    pc->skind = (uint8_t)skind;
    pc->vx = ((uintptr_t)pc->x % 16 == 0) && (k <= 1 || pc->xs1 == 1) &&
             (n <= 1 || (pc->xs0 * es) % 16 == 0);
    pc->colmajor = n > 1 && pc->qs0 == 1 && pc->qs1 != 1;
    return REFIT_OK;
}

/* Lanes a group takes in k_q4_groups, or 0 for k_q4_rows. */
static int q4_lanes(int64_t group)
{
    if (group <= 0 || group % 8 || group > 256)
        return 0;
    int64_t l = group / 8;
    return (l & (l - 1)) == 0 ? (int)l : 0;
}

/* The kernel for `lanes` with parameters b (S: Q4_SHORT for the short
 * block, else 0). */
template <int S, class BATCH>
static void q4_launch_as(const BATCH &b, int lanes, unsigned grid, unsigned int *status,
                         cudaStream_t st)
{
    switch (lanes) {
    case 1: k_q4_groups<1 | S><<<grid, Q4_THREADS, 0, st>>>(b, status); break;
    case 2: k_q4_groups<2 | S><<<grid, Q4_THREADS, 0, st>>>(b, status); break;
    case 4: k_q4_groups<4 | S><<<grid, Q4_THREADS, 0, st>>>(b, status); break;
    case 8: k_q4_groups<8 | S><<<grid, Q4_THREADS, 0, st>>>(b, status); break;
    case 16: k_q4_groups<16 | S><<<grid, Q4_THREADS, 0, st>>>(b, status); break;
    case 32: k_q4_groups<32 | S><<<grid, Q4_THREADS, 0, st>>>(b, status); break;
    default: k_q4_rows<S><<<grid, Q4_THREADS, 0, st>>>(b, status); break;
    }
}

static void q4_launch_one(const q4_batch *b, int lanes, unsigned int *status, cudaStream_t st)
{
    int64_t threads = lanes ? b->end * lanes : b->end * Q4_THREADS;
    int64_t blocks = (threads + Q4_THREADS - 1) / Q4_THREADS;
    unsigned grid = (unsigned)(blocks > Q4_BLOCKS_MAX ? Q4_BLOCKS_MAX : blocks);
    if (b->np <= Q4_SMALL) {
        q4_batch_small sb;
        memset(&sb, 0, sizeof sb);
        memcpy(&sb, b, offsetof(q4_batch, p) + sizeof b->p[0] * (size_t)b->np);
        q4_launch_as<Q4_SHORT>(sb, lanes, grid, status, st);
    } else {
        q4_launch_as<0>(*b, lanes, grid, status, st);
    }
}

/* Per device, made by its first call and kept: the status word
 * (kernels/status_word.cuh) and the launch parameters (31 KB, off the
 * stack). Calls are serialized by q4_mu (the backend calls under its own
 * lock anyway). */
struct q4_cache {
    kc_status word;
    q4_batch *batch;
};
static q4_cache q4_dev[Q4_DEVICES];
static pthread_mutex_t q4_mu = PTHREAD_MUTEX_INITIALIZER;

static int q4_cache_get(q4_cache **out, cudaStream_t st)
{
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return q4_fail(e, "the current device");
    if (dev < 0 || dev >= Q4_DEVICES)
        return q4_fail(cudaErrorInvalidDevice, "device number");
    q4_cache *c = &q4_dev[dev];
    if (!c->batch && !(c->batch = (q4_batch *)malloc(sizeof *c->batch)))
        return q4_fail(cudaErrorMemoryAllocation, "host memory for a launch");
    const char *what = NULL;
    if ((e = kc_status_ready(&c->word, st, &what)) != cudaSuccess)
        return q4_fail(e, what);
    *out = c;
    return REFIT_OK;
}

/* Pieces Q4_BATCH a launch. */
static int q4_launch(const q4_cache *c, const q4_piece *pcs, uint32_t n, int64_t group,
                     cudaStream_t st)
{
    q4_batch *b = c->batch;
    unsigned int *status = c->word.dev;
    int lanes = q4_lanes(group), rc = REFIT_OK;
    for (uint32_t at = 0; at < n && !rc; at += Q4_BATCH) {
        uint32_t np = n - at < Q4_BATCH ? n - at : Q4_BATCH;
        int64_t end = 0;
        memset(b, 0, offsetof(q4_batch, p));
        b->np = (int32_t)np;
        b->g_len = group > 0 ? group : 0;
        for (uint32_t j = 0; j < np; j++) {
            b->p[j] = pcs[at + j];
            b->p[j].first = end;
            end += lanes ? b->p[j].n * b->p[j].groups : b->p[j].n;
        }
        b->end = end;
        if (end == 0)
            continue;
        q4_launch_one(b, lanes, status, st);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            rc = q4_fail(e, "launching the quantization kernel");
    }
    return rc;
}

/* Copy the status word back into *out (unless the launches failed: rc)
 * and wait for the stream, even after a failure (the next call rewrites
 * the pinned word and the parameters); the first failure wins. */
static int q4_finish_call(q4_cache *c, unsigned int *out, int rc, cudaStream_t st)
{
    cudaError_t e = kc_status_read(&c->word, !rc, out, st);
    if (!rc && e != cudaSuccess)
        rc = q4_fail(e, "the device work");
    return rc;
}

/* Quantize pieces (the contract is kern_cuda.h's). */
extern "C" int kern_quant_int4_cuda(uint32_t n, const refit_view *q, const refit_view *scale,
                                    const refit_view *x, int64_t group, int32_t *bad,
                                    void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    *bad = -1;
    if (group < 0 || n > 0x7fffffffu) {
        kern_cuda_set_error("kern_quant_int4_cuda: group must be >= 0, pieces < 2^31");
        return REFIT_EINVAL;
    }
    if (n == 0)
        return REFIT_OK;
    q4_piece *pcs = (q4_piece *)malloc(sizeof *pcs * n);
    int rc = pcs ? REFIT_OK : q4_fail(cudaErrorMemoryAllocation, "host memory");
    for (uint32_t i = 0; i < n && !rc; i++)
        if ((rc = q4_piece_init(&pcs[i], &q[i], &scale[i], &x[i], group, i)))
            *bad = (int32_t)i;
    unsigned int found = Q4_NONE;
    if (!rc) {
        q4_cache *c = NULL;
        pthread_mutex_lock(&q4_mu);
        rc = q4_cache_get(&c, st);
        if (!rc) {
            rc = q4_launch(c, pcs, n, group, st);
            rc = q4_finish_call(c, &found, rc, st);
        }
        pthread_mutex_unlock(&q4_mu);
    }
    if (!rc && found != Q4_NONE) {
        *bad = (int32_t)found;
        rc = q4_refuse(REFIT_ECORRUPT, "NaN or infinity in the weight, or a scale past the "
                       "scale dtype's range", found);
    }
    free(pcs);
    return rc;
}
