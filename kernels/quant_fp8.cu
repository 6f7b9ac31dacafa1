/* FP8 (E4M3) weight quantization on the GPU, bit-exact with kern_quant_fp8
 * (kernels/quant_fp8.c; the arithmetic is defined in quant_fp8.h):
 *
 *   amax  = max |x| over the group        (the max of the magnitude bits:
 *                                          for non-negative floats the bit
 *                                          order is the value order)
 *   scale = __fdiv_rn(amax, 448), 1 when that is 0
 *   q     = e4m3_sat(__fdiv_rn(x, scale)) (the integer encoder of
 *                                          kernels/minifloat.c, written again
 *                                          below, or the hardware's
 *                                          cvt.rn.satfinite.e4m3x2.f32 where
 *                                          kern_fp8_cvt_check_cuda found it
 *                                          equal to that encoder on every
 *                                          finite f32: the caller chooses)
 *
 * nvcc's defaults keep this exact: -prec-div=true, -ftz=false (no
 * --use_fast_math), so divisions are correctly rounded and subnormals kept,
 * as on the CPU.
 *
 * A call quantizes n pieces (kern_quant_fp8_cuda in core/cuda/kern_cuda.h):
 *
 *   per-tensor   pieces whose scale views start at the same element form a
 *                group; k_amax folds each piece into its group's amax (a
 *                device word, atomicMax of magnitude bits), then k_encode
 *                turns the amax into the scale and writes the piece. Groups
 *                go in sets of about QF_SET_BYTES of input, amax then encode
 *                per set, so the second read of a set mostly hits L2.
 *   per-channel  one block per tile (a row; a 128x128 tile, ragged at the
 *   block-128    edges): the block reads its tile into registers (up to
 *                QF_CH groups of 8 elements per thread, else it reads the
 *                tile twice), reduces the amax, writes the scale, encodes.
 *
 * Pieces travel in the kernel's parameters (QF_BATCH per launch, a
 * __grid_constant__ struct), so nothing is copied to the device but two
 * memsets of a small scratch (the status word and the per-tensor amaxes,
 * from cudaMallocAsync). A NaN or infinity makes its block atomicMin the
 * piece's index into the status word; the call copies that word back and
 * waits for the stream once, at the end, to report it.
 *
 * Element access: 8 consecutive elements of a row per thread ("a group"),
 * one 16-byte load (two for F32) and one 8-byte store where the row is
 * contiguous and aligned, element by element otherwise (any strides). */
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/format.h>

#include "kernels/cast_bits.h"

extern "C" void kern_cuda_set_error(const char *msg);

#define QF_HD __host__ __device__ __forceinline__
#define QF_THREADS 256
#define QF_BATCH 24                    /* pieces per launch (4 KB of parameters) */
#define QF_CH 8                        /* groups of 8 a thread keeps in registers */
#define QF_BLOCKS_MAX 8192             /* per-tensor blocks per piece */
#define QF_SET_BYTES ((int64_t)24 << 20)
#define QF_FINITE_MAX 0x7f7fffffu      /* magnitude bits of FLT_MAX */
#define QF_NONE 0xffffffffu            /* status word: no piece failed */

/* ---- the E4M3 encoder (kernels/minifloat.c: encode_mag, e4m3_encode) ---- */

/* m >> shift rounded to nearest, ties to even; 0 when shift > 25 (m < 2^24
 * in the one caller that shifts that far). */
QF_HD uint32_t qf_shift_rne(uint32_t m, unsigned shift)
{
    if (shift == 0)
        return m;
    if (shift > 25)
        return 0;
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u)))
        r++;
    return r;
}

/* kern_f32_to_e4m3_sat on the bits of an f32: NaN stays NaN (0x7f with the
 * sign), everything else past 448, infinities too, saturates to +-448. */
QF_HD uint8_t qf_e4m3_sat(uint32_t x)
{
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    if (a == 0x7f800000u)
        return (uint8_t)(sign | 0x7eu);
    int e = (int)(a >> 23);
    uint32_t code;
    if (e >= 121) { /* e - 127 >= 1 - bias: a destination normal */
        code = qf_shift_rne(a - (120u << 23), 20);
    } else {        /* a destination subnormal: unit 2^-9 */
        uint32_t sig = a & 0x7fffffu;
        if (e == 0)
            e = 1;
        else
            sig |= 0x800000u;
        code = qf_shift_rne(sig, (unsigned)(141 - e));
    }
    if (code > 0x7eu)
        return (uint8_t)(sign | 0x7eu);
    return (uint8_t)(sign | code);
}

/* ---- pieces ---- */

struct qf_piece {
    const char *x;
    unsigned char *q;
    float *s;                   /* the scale grid (per-tensor: the group's scale) */
    int64_t n, k;               /* rows, columns (a contiguous per-tensor piece: 1, n*k) */
    int64_t xs0, xs1, qs0, qs1, ss0, ss1; /* strides, in elements */
    int64_t first;              /* its first block (per-tensor) or tile in the launch */
    unsigned int *amax;         /* per-tensor: the group's amax bits */
    int32_t idx;                /* its index in the call */
    uint8_t kind;               /* x: 0 f32, 1 f16, 2 bf16 */
    uint8_t vx, vq;             /* rows of x (q) are 16 (8) byte aligned and contiguous */
    uint8_t leader;             /* per-tensor: writes the group's scale */
};

struct qf_batch {
    int32_t np;
    int32_t hw;                 /* encode with the hardware conversion */
    int64_t end;                /* blocks of the launch */
    qf_piece p[QF_BATCH];
};
static_assert(sizeof(qf_batch) <= 4000, "qf_batch must fit the kernel parameters");

/* A rectangle of a piece, walked in row-major order by groups of 8. */
struct qf_tile {
    int64_t r0, c0, h, w;
};

/* The piece that block b belongs to (the last whose first block <= b). */
__device__ __forceinline__ int qf_find(const qf_batch &B, int64_t b)
{
    int i = 0;
    while (i + 1 < B.np && b >= B.p[i + 1].first)
        i++;
    return i;
}

__device__ __forceinline__ float qf_decode(const char *p, int kind)
{
    if (kind == 0)
        return *(const float *)p;
    uint16_t h = *(const uint16_t *)p;
    return __uint_as_float(kind == 1 ? kern_bits_f16_to_f32(h) : kern_bits_bf16_to_f32(h));
}

__device__ __forceinline__ float qf_half(uint32_t w, int hi, int kind)
{
    uint16_t h = (uint16_t)(hi ? w >> 16 : w & 0xffffu);
    return __uint_as_float(kind == 1 ? kern_bits_f16_to_f32(h) : kern_bits_bf16_to_f32(h));
}

/* Row and column, in the tile, of element e. */
__device__ __forceinline__ void qf_rc(const qf_tile &t, int64_t e, int64_t *r, int64_t *c)
{
    if (t.h == 1) {
        *r = 0;
        *c = e;
    } else if (e <= 0xffffffffll && t.w <= 0xffffffffll) {
        uint32_t q = (uint32_t)e / (uint32_t)t.w;
        *r = q;
        *c = e - (int64_t)q * t.w;
    } else {
        *r = e / t.w;
        *c = e - *r * t.w;
    }
}

/* Group g of tile t: elements 8g .. 8g+7 (0 past the end). */
__device__ __forceinline__ void qf_load8(const qf_piece &p, const qf_tile &t, int64_t g,
                                         float v[8])
{
    int64_t total = t.h * t.w, e = 8 * g, r, c;
    qf_rc(t, e, &r, &c);
    size_t es = p.kind == 0 ? 4 : 2;
    if (p.vx && c + 8 <= t.w && ((t.c0 + c) & 7) == 0) {
        const char *a = p.x + ((t.r0 + r) * p.xs0 + t.c0 + c) * (int64_t)es;
        if (p.kind == 0) {
            float4 lo = *(const float4 *)a, hi = *(const float4 *)(a + 16);
            v[0] = lo.x; v[1] = lo.y; v[2] = lo.z; v[3] = lo.w;
            v[4] = hi.x; v[5] = hi.y; v[6] = hi.z; v[7] = hi.w;
        } else {
            uint4 w = *(const uint4 *)a;
            v[0] = qf_half(w.x, 0, p.kind); v[1] = qf_half(w.x, 1, p.kind);
            v[2] = qf_half(w.y, 0, p.kind); v[3] = qf_half(w.y, 1, p.kind);
            v[4] = qf_half(w.z, 0, p.kind); v[5] = qf_half(w.z, 1, p.kind);
            v[6] = qf_half(w.w, 0, p.kind); v[7] = qf_half(w.w, 1, p.kind);
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < 8; u++) {
        v[u] = 0.0f;
        if (e + u < total)
            v[u] = qf_decode(p.x + ((t.r0 + r) * p.xs0 + (t.c0 + c) * p.xs1) * (int64_t)es,
                             p.kind);
        if (++c == t.w) {
            c = 0;
            r++;
        }
    }
}

/* The hardware conversion of two finite floats: lo in the low byte. */
__device__ __forceinline__ uint16_t qf_cvt2(float lo, float hi)
{
    return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

/* Encode group g of tile t with scale s and store it. */
__device__ __forceinline__ void qf_store8(const qf_piece &p, const qf_tile &t, int64_t g,
                                          const float v[8], float s, int hw)
{
    uint8_t b[8];
    if (hw) {
#pragma unroll
        for (int u = 0; u < 8; u += 2) {
            uint16_t two = qf_cvt2(__fdiv_rn(v[u], s), __fdiv_rn(v[u + 1], s));
            b[u] = (uint8_t)(two & 0xffu);
            b[u + 1] = (uint8_t)(two >> 8);
        }
    } else {
#pragma unroll
        for (int u = 0; u < 8; u++)
            b[u] = qf_e4m3_sat(__float_as_uint(__fdiv_rn(v[u], s)));
    }
    int64_t total = t.h * t.w, e = 8 * g, r, c;
    qf_rc(t, e, &r, &c);
    if (p.vq && c + 8 <= t.w && ((t.c0 + c) & 7) == 0) {
        uint2 w;
        w.x = b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        w.y = b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24;
        *(uint2 *)(p.q + (t.r0 + r) * p.qs0 + t.c0 + c) = w;
        return;
    }
#pragma unroll
    for (int u = 0; u < 8; u++) {
        if (e + u < total)
            p.q[(t.r0 + r) * p.qs0 + (t.c0 + c) * p.qs1] = b[u];
        if (++c == t.w) {
            c = 0;
            r++;
        }
    }
}

__device__ __forceinline__ uint32_t qf_mag_max(uint32_t m, const float v[8])
{
#pragma unroll
    for (int u = 0; u < 8; u++)
        m = max(m, __float_as_uint(v[u]) & 0x7fffffffu);
    return m;
}

/* The max of m over the block, in every thread. */
__device__ __forceinline__ uint32_t qf_block_max(uint32_t m)
{
    __shared__ uint32_t part[QF_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1)
        m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x / 32] = m;
    __syncthreads();
    m = part[0];
    for (int k = 1; k < QF_THREADS / 32; k++)
        m = max(m, part[k]);
    return m;
}

__device__ __forceinline__ float qf_scale(uint32_t amax_bits)
{
    float s = __fdiv_rn(__uint_as_float(amax_bits), 448.0f);
    return s > 0.0f ? s : 1.0f;
}

/* ---- per-tensor: amax, then encode ---- */

__global__ void __launch_bounds__(QF_THREADS)
k_amax(const __grid_constant__ qf_batch B, unsigned int *status)
{
    int i = qf_find(B, blockIdx.x);
    const qf_piece &p = B.p[i];
    int64_t nb = (i + 1 < B.np ? B.p[i + 1].first : B.end) - p.first;
    qf_tile t = {0, 0, p.n, p.k};
    int64_t ng = (p.n * p.k + 7) / 8;
    uint32_t m = 0;
    for (int64_t g = ((int64_t)blockIdx.x - p.first) * QF_THREADS + threadIdx.x; g < ng;
         g += nb * QF_THREADS) {
        float v[8];
        qf_load8(p, t, g, v);
        m = qf_mag_max(m, v);
    }
    m = qf_block_max(m);
    if (threadIdx.x == 0) {
        atomicMax(p.amax, m);
        if (m > QF_FINITE_MAX)
            atomicMin(status, (unsigned int)p.idx);
    }
}

__global__ void __launch_bounds__(QF_THREADS) k_encode(const __grid_constant__ qf_batch B)
{
    int i = qf_find(B, blockIdx.x);
    const qf_piece &p = B.p[i];
    int64_t nb = (i + 1 < B.np ? B.p[i + 1].first : B.end) - p.first;
    int64_t rel = (int64_t)blockIdx.x - p.first;
    uint32_t a = *p.amax;
    if (a > QF_FINITE_MAX)
        return; /* refused: the status word names a piece of the group */
    float s = qf_scale(a);
    if (p.leader && rel == 0 && threadIdx.x == 0)
        *p.s = s;
    qf_tile t = {0, 0, p.n, p.k};
    int64_t ng = (p.n * p.k + 7) / 8;
    for (int64_t g = rel * QF_THREADS + threadIdx.x; g < ng; g += nb * QF_THREADS) {
        float v[8];
        qf_load8(p, t, g, v);
        qf_store8(p, t, g, v, s, B.hw);
    }
}

/* ---- per-channel and block-128: one block per tile ---- */

/* CH: groups of 8 a thread keeps in registers (a tile of up to CH * 256
 * groups is read once; a larger one twice). The launch picks the smallest
 * CH that holds its largest tile: registers limit how many blocks an SM
 * runs, and short rows need many. */
template <int CH>
__global__ void __launch_bounds__(QF_THREADS)
k_tiles(const __grid_constant__ qf_batch B, int block128, unsigned int *status)
{
    int i = qf_find(B, blockIdx.x);
    const qf_piece &p = B.p[i];
    int64_t tile = (int64_t)blockIdx.x - p.first, si, sj;
    qf_tile t;
    if (block128) {
        int64_t bk = (p.k + 127) / 128;
        si = tile / bk;
        sj = tile - si * bk;
        t.r0 = si * 128;
        t.c0 = sj * 128;
        t.h = p.n - t.r0 < 128 ? p.n - t.r0 : 128;
        t.w = p.k - t.c0 < 128 ? p.k - t.c0 : 128;
    } else {
        si = tile;
        sj = 0;
        t.r0 = tile;
        t.c0 = 0;
        t.h = 1;
        t.w = p.k;
    }
    int64_t ng = (t.h * t.w + 7) / 8;
    bool cached = ng <= (int64_t)CH * QF_THREADS;
    float v[CH][8];
    uint32_t m = 0;
    if (cached) {
#pragma unroll
        for (int c = 0; c < CH; c++) {
            int64_t g = (int64_t)c * QF_THREADS + threadIdx.x;
            if (g < ng) {
                qf_load8(p, t, g, v[c]);
                m = qf_mag_max(m, v[c]);
            }
        }
    } else {
        for (int64_t g = threadIdx.x; g < ng; g += QF_THREADS) {
            float w[8];
            qf_load8(p, t, g, w);
            m = qf_mag_max(m, w);
        }
    }
    m = qf_block_max(m);
    if (m > QF_FINITE_MAX) {
        if (threadIdx.x == 0)
            atomicMin(status, (unsigned int)p.idx);
        return;
    }
    float s = qf_scale(m);
    if (threadIdx.x == 0)
        p.s[si * p.ss0 + sj * p.ss1] = s;
    if (cached) {
#pragma unroll
        for (int c = 0; c < CH; c++) {
            int64_t g = (int64_t)c * QF_THREADS + threadIdx.x;
            if (g < ng)
                qf_store8(p, t, g, v[c], s, B.hw);
        }
    } else {
        for (int64_t g = threadIdx.x; g < ng; g += QF_THREADS) {
            float w[8];
            qf_load8(p, t, g, w);
            qf_store8(p, t, g, w, s, B.hw);
        }
    }
}

/* ---- the hardware conversion against the encoder ---- */

/* Every finite f32 x (and -x beside it, so that the byte order is checked
 * too) through qf_cvt2 and qf_e4m3_sat: count the differences, keep the
 * smallest differing input. */
__global__ void __launch_bounds__(QF_THREADS)
k_cvt_check(unsigned long long *count, unsigned int *first)
{
    uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    unsigned long long n = 0;
    unsigned int lo = 0xffffffffu;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (1ull << 31);
         i += stride) {
        uint32_t x = (uint32_t)i; /* the non-negative half; -x is the other */
        if ((x & 0x7f800000u) == 0x7f800000u)
            continue;
        float f = __uint_as_float(x);
        uint16_t two = qf_cvt2(f, -f);
        bool bad = (two & 0xffu) != qf_e4m3_sat(x) ||
                   (two >> 8) != qf_e4m3_sat(x | 0x80000000u);
        if (bad) {
            n++;
            lo = min(lo, x);
        }
    }
    if (n) {
        atomicAdd(count, n);
        atomicMin(first, lo);
    }
}

/* ---- host side ---- */

static int qf_fail(cudaError_t e, const char *what)
{
    char m[256];
    snprintf(m, sizeof m, "kern_quant_fp8_cuda: %s: %s (%s)", what, cudaGetErrorString(e),
             cudaGetErrorName(e));
    kern_cuda_set_error(m);
    return e == cudaErrorMemoryAllocation ? REFIT_ENOMEM : REFIT_EINTERNAL;
}

static int qf_refuse(int rc, const char *what, uint32_t i)
{
    char m[256];
    snprintf(m, sizeof m, "kern_quant_fp8_cuda: piece %u: %s", i, what);
    kern_cuda_set_error(m);
    return rc;
}

static int qf_kind(refit_dtype d)
{
    if (d.lanes != 1)
        return -1;
    if (d.code == REFIT_DTYPE_FLOAT && d.bits == 32)
        return 0;
    if (d.code == REFIT_DTYPE_FLOAT && d.bits == 16)
        return 1;
    if (d.code == REFIT_DTYPE_BFLOAT && d.bits == 16)
        return 2;
    return -1;
}

/* 1 when a 2-D view's elements are one row-major run. */
static bool qf_contiguous(const refit_view *v)
{
    return (v->shape[0] <= 1 || v->strides[0] == v->shape[1]) &&
           (v->shape[1] <= 1 || v->strides[1] == 1);
}

/* Piece i as the kernels read it; flat: a contiguous per-tensor piece is
 * walked as one row. The views were checked as kern_quant_fp8 checks them;
 * the dtype and ranks are checked again here. */
static int qf_piece_init(qf_piece *pc, const refit_view *q, const refit_view *s,
                         const refit_view *x, uint32_t i, int scheme)
{
    int kind = qf_kind(x->dtype);
    if (kind < 0 || q->dtype.bits != 8 || q->dtype.lanes != 1 || qf_kind(s->dtype) != 0)
        return qf_refuse(REFIT_EUNSUPPORTED, "dtypes: x f32/f16/bf16, q one byte, scale f32", i);
    if (x->ndim != 2 || q->ndim != 2 || s->ndim != 2 || q->shape[0] != x->shape[0] ||
        q->shape[1] != x->shape[1] || x->shape[0] < 0 || x->shape[1] < 0)
        return qf_refuse(REFIT_EMISMATCH, "x and q must be 2-D of one shape, scale 2-D", i);
    memset(pc, 0, sizeof *pc);
    int64_t es = kind == 0 ? 4 : 2;
    pc->x = (const char *)x->data;
    pc->q = (unsigned char *)q->data;
    pc->s = (float *)s->data;
    pc->n = x->shape[0];
    pc->k = x->shape[1];
    pc->xs0 = x->strides[0];
    pc->xs1 = x->strides[1];
    pc->qs0 = q->strides[0];
    pc->qs1 = q->strides[1];
    pc->ss0 = s->strides[0];
    pc->ss1 = s->strides[1];
    pc->idx = (int32_t)i;
    pc->kind = (uint8_t)kind;
    if (scheme == 0 && qf_contiguous(x) && qf_contiguous(q)) {
        pc->k = pc->n * pc->k;
        pc->n = 1;
        pc->xs0 = pc->qs0 = pc->k;
        pc->xs1 = pc->qs1 = 1;
    }
    bool one_row = pc->n <= 1;
    pc->vx = ((uintptr_t)pc->x % 16 == 0) && pc->xs1 == 1 && (one_row || (pc->xs0 * es) % 16 == 0);
    pc->vq = ((uintptr_t)pc->q % 8 == 0) && pc->qs1 == 1 && (one_row || pc->qs0 % 8 == 0);
    return REFIT_OK;
}

/* Blocks of a per-tensor piece: about two groups a thread, at least one
 * block (which writes the scale of an empty piece). */
static int64_t qf_blocks(const qf_piece *p)
{
    int64_t ng = (p->n * p->k + 7) / 8, b = (ng + 2 * QF_THREADS - 1) / (2 * QF_THREADS);
    return b < 1 ? 1 : b > QF_BLOCKS_MAX ? QF_BLOCKS_MAX : b;
}

static int64_t qf_tiles(const qf_piece *p, int scheme)
{
    if (scheme == 1)
        return p->n;
    return ((p->n + 127) / 128) * ((p->k + 127) / 128);
}

/* Groups of 8 in the largest tile of the launch. */
static int64_t qf_tile_groups(const qf_batch *b, int scheme)
{
    int64_t most = 0;
    for (int j = 0; j < b->np; j++) {
        int64_t h = scheme == 1 ? 1 : b->p[j].n < 128 ? b->p[j].n : 128;
        int64_t w = scheme == 1 || b->p[j].k < 128 ? b->p[j].k : 128;
        int64_t g = (h * w + 7) / 8;
        most = g > most ? g : most;
    }
    return most;
}

static void qf_tiles_launch(const qf_batch *b, int scheme, unsigned int *status, cudaStream_t st)
{
    int64_t g = qf_tile_groups(b, scheme);
    unsigned grid = (unsigned)b->end;
    if (g <= QF_THREADS)
        k_tiles<1><<<grid, QF_THREADS, 0, st>>>(*b, scheme == 2, status);
    else if (g <= 2 * QF_THREADS)
        k_tiles<2><<<grid, QF_THREADS, 0, st>>>(*b, scheme == 2, status);
    else if (g <= 4 * QF_THREADS)
        k_tiles<4><<<grid, QF_THREADS, 0, st>>>(*b, scheme == 2, status);
    else if (g <= QF_CH * QF_THREADS)
        k_tiles<QF_CH><<<grid, QF_THREADS, 0, st>>>(*b, scheme == 2, status);
    else /* read twice anyway: the fewest registers */
        k_tiles<1><<<grid, QF_THREADS, 0, st>>>(*b, scheme == 2, status);
}

/* Launch kernel `kind` (0 k_amax, 1 k_encode, 2 k_tiles) over pieces
 * ord[0..m) of pcs, QF_BATCH a launch. */
static int qf_launch(int kind, const qf_piece *pcs, const uint32_t *ord, uint32_t m, int scheme,
                     int hw, unsigned int *status, cudaStream_t st)
{
    qf_batch *b = (qf_batch *)malloc(sizeof *b); /* 3 KB: off the stack */
    if (!b)
        return qf_fail(cudaErrorMemoryAllocation, "host memory for a launch");
    int rc = REFIT_OK;
    for (uint32_t at = 0; at < m && !rc; at += QF_BATCH) {
        uint32_t np = m - at < QF_BATCH ? m - at : QF_BATCH;
        int64_t end = 0;
        b->np = (int32_t)np;
        b->hw = hw;
        for (uint32_t j = 0; j < np; j++) {
            b->p[j] = pcs[ord ? ord[at + j] : at + j];
            b->p[j].first = end;
            end += kind == 2 ? qf_tiles(&b->p[j], scheme) : qf_blocks(&b->p[j]);
        }
        b->end = end;
        if (end == 0)
            continue;
        if (end > 0x7fffffffll) {
            kern_cuda_set_error("kern_quant_fp8_cuda: more than 2^31 - 1 tiles in one launch");
            rc = REFIT_EUNSUPPORTED;
            break;
        }
        if (kind == 0)
            k_amax<<<(unsigned)end, QF_THREADS, 0, st>>>(*b, status);
        else if (kind == 1)
            k_encode<<<(unsigned)end, QF_THREADS, 0, st>>>(*b);
        else
            qf_tiles_launch(b, scheme, status, st);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            rc = qf_fail(e, "launching a quantization kernel");
    }
    free(b);
    return rc;
}

/* Per-tensor: groups (by scale element), amax scratch per group, pieces
 * ordered by group, sets of about QF_SET_BYTES, amax then encode per set. */
static int qf_per_tensor(qf_piece *pcs, uint32_t n, const refit_view *x, unsigned int *scratch,
                         uint32_t *ord, const uint32_t *grp, uint32_t ngroups, int hw,
                         cudaStream_t st)
{
    /* ord: pieces by group (counting sort, stable) */
    uint32_t *start = (uint32_t *)calloc((size_t)ngroups + 1, sizeof *start);
    if (!start)
        return qf_fail(cudaErrorMemoryAllocation, "host memory for the groups");
    for (uint32_t i = 0; i < n; i++)
        start[grp[i] + 1]++;
    for (uint32_t g = 0; g < ngroups; g++)
        start[g + 1] += start[g];
    for (uint32_t i = 0; i < n; i++) {
        uint32_t at = start[grp[i]]++;
        ord[at] = i;
        pcs[i].amax = scratch + 1 + grp[i];
        pcs[i].leader = 0;
    }
    for (uint32_t g = 0, at = 0; g < ngroups; g++) { /* start[g] is now the end of g */
        pcs[ord[at]].leader = 1;
        at = start[g];
    }
    int rc = REFIT_OK;
    for (uint32_t a = 0; a < n && !rc;) {
        int64_t bytes = 0;
        uint32_t b = a;
        while (b < n && (b == a || bytes < QF_SET_BYTES)) { /* whole groups */
            uint32_t g = grp[ord[b]];
            for (; b < n && grp[ord[b]] == g; b++)
                bytes += x[ord[b]].shape[0] * x[ord[b]].shape[1] * (int64_t)(x[ord[b]].dtype.bits / 8);
        }
        rc = qf_launch(0, pcs, ord + a, b - a, 0, hw, scratch, st);
        if (!rc)
            rc = qf_launch(1, pcs, ord + a, b - a, 0, hw, scratch, st);
        a = b;
    }
    free(start);
    return rc;
}

/* Dense group numbers of per-tensor pieces: pieces whose scale views start
 * at the same element share a group, numbered by first appearance. */
static uint32_t qf_groups(const refit_view *scale, uint32_t n, uint32_t *grp)
{
    uint32_t ng = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t j = 0;
        while (j < i && scale[j].data != scale[i].data)
            j++;
        grp[i] = j < i ? grp[j] : ng++;
    }
    return ng;
}

/* Device scratch in stream order (cudaMalloc where the device has no
 * stream-ordered allocator), set to `fill` bytes; NULL on failure. */
static void *qf_scratch(size_t bytes, int fill, bool *pooled, cudaStream_t st, int *rc)
{
    void *p = NULL;
    *pooled = true;
    (void)cudaGetLastError();
    cudaError_t e = cudaMallocAsync(&p, bytes, st);
    if (e == cudaErrorNotSupported) {
        (void)cudaGetLastError();
        *pooled = false;
        e = cudaMalloc(&p, bytes);
    }
    if (e == cudaSuccess)
        e = cudaMemsetAsync(p, fill, bytes, st);
    if (e != cudaSuccess) {
        *rc = qf_fail(e, "device scratch");
        if (p)
            (void)(*pooled ? cudaFreeAsync(p, st) : cudaFree(p));
        return NULL;
    }
    return p;
}

/* Copy n bytes of scratch back (unless the launches failed: rc), free it
 * in stream order, wait for the stream; the first failure wins. */
static int qf_finish(void *scratch, bool pooled, void *out, size_t n, int rc, cudaStream_t st)
{
    cudaError_t e = rc ? cudaSuccess
                       : cudaMemcpyAsync(out, scratch, n, cudaMemcpyDeviceToHost, st);
    cudaError_t fe = pooled ? cudaFreeAsync(scratch, st) : cudaSuccess;
    cudaError_t se = cudaStreamSynchronize(st);
    if (!pooled)
        fe = cudaFree(scratch);
    if (e == cudaSuccess)
        e = se != cudaSuccess ? se : fe;
    if (!rc && e != cudaSuccess)
        rc = qf_fail(e, "the device work");
    return rc;
}

/* Quantize pieces (the contract is kern_cuda.h's). */
extern "C" int kern_quant_fp8_cuda(uint32_t n, const refit_view *q, const refit_view *scale,
                                   const refit_view *x, int scheme, int hw, int32_t *bad,
                                   void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    *bad = -1;
    if (scheme < 0 || scheme > 2 || n > 0x7fffffffu) {
        kern_cuda_set_error("kern_quant_fp8_cuda: scheme must be 0, 1 or 2, pieces < 2^31");
        return REFIT_EINVAL;
    }
    if (n == 0)
        return REFIT_OK;
    qf_piece *pcs = (qf_piece *)malloc(sizeof *pcs * n);
    uint32_t *ord = (uint32_t *)malloc(sizeof *ord * n * 2);
    uint32_t *grp = ord + n, ngroups = 0;
    int rc = pcs && ord ? REFIT_OK : qf_fail(cudaErrorMemoryAllocation, "host memory");
    for (uint32_t i = 0; i < n && !rc; i++)
        if ((rc = qf_piece_init(&pcs[i], &q[i], &scale[i], &x[i], i, scheme)))
            *bad = (int32_t)i;
    if (!rc && scheme == 0)
        ngroups = qf_groups(scale, n, grp);
    /* the status word (0xffffffff: no piece failed), then the amaxes (0) */
    bool pooled;
    unsigned int *scratch = NULL, status = QF_NONE;
    if (!rc)
        scratch = (unsigned int *)qf_scratch(sizeof *scratch * ((size_t)ngroups + 1), 0,
                                             &pooled, st, &rc);
    cudaError_t e = scratch ? cudaMemsetAsync(scratch, 0xff, sizeof *scratch, st) : cudaSuccess;
    if (e != cudaSuccess)
        rc = qf_fail(e, "device scratch");
    if (!rc)
        rc = scheme == 0 ? qf_per_tensor(pcs, n, x, scratch, ord, grp, ngroups, hw != 0, st)
                         : qf_launch(2, pcs, NULL, n, scheme, hw != 0, scratch, st);
    if (scratch)
        rc = qf_finish(scratch, pooled, &status, sizeof status, rc, st);
    if (!rc && status != QF_NONE) {
        *bad = (int32_t)status;
        rc = qf_refuse(REFIT_ECORRUPT, "NaN or infinity in the weight", status);
    }
    free(pcs);
    free(ord);
    return rc;
}

/* The hardware conversion against the encoder on every finite f32 (the
 * contract is kern_cuda.h's). */
extern "C" int kern_fp8_cvt_check_cuda(uint64_t *mismatches, uint32_t *first, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    struct res {
        unsigned long long count;
        unsigned int first;
    } h = {0, 0xffffffffu};
    bool pooled;
    int rc = REFIT_OK;
    /* zeros, then the first as 0xffffffff */
    res *d = (res *)qf_scratch(sizeof h, 0, &pooled, st, &rc);
    if (!d)
        return rc;
    cudaError_t e = cudaMemsetAsync(&d->first, 0xff, sizeof d->first, st);
    if (e == cudaSuccess) {
        k_cvt_check<<<132 * 8, QF_THREADS, 0, st>>>(&d->count, &d->first);
        e = cudaGetLastError();
    }
    if (e != cudaSuccess)
        rc = qf_fail(e, "the conversion check");
    rc = qf_finish(d, pooled, &h, sizeof h, rc, st);
    if (!rc) {
        *mismatches = h.count;
        *first = h.first;
    }
    return rc;
}
