/* INT4 online quantization on the GPU (round-to-nearest, symmetric, per
 * group), bit-exact with kern_quant_int4 (plugins/int4/quant_int4.c): the
 * arithmetic is the REFIT_HD functions of quant_int4.h, compiled here for
 * the device (nvcc's defaults keep it exact: -prec-div=true, -ftz=false,
 * no --use_fast_math; rintf is the round-to-nearest-even instruction).
 *
 * A call quantizes n pieces in one launch, or two where some pieces take
 * the dense path and some do not (kern_quant_int4_cuda in
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
 *   k_q4_dense<L>   the dense fast path, taken per piece where it applies
 *                   (F16/BF16 weights and scales, aligned contiguous rows,
 *                   K whole groups of 32..256 columns, words along N or
 *                   along K): tiles of 1024/group rows x one group, four
 *                   16-byte loads a lane, no division (its section below).
 *                   A call launches it for its dense pieces and the
 *                   kernels above for the rest; one status word for all.
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
#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>

#include "plugins/int4/int4_gpu.h"
#include "plugins/int4/quant_int4.h"

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
    return refit_mf_half_to_f32(*(const uint16_t *)p, kind);
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
            v[0] = refit_mf_pair_to_f32(u.x, 0, p.kind);
            v[1] = refit_mf_pair_to_f32(u.x, 1, p.kind);
            v[2] = refit_mf_pair_to_f32(u.y, 0, p.kind);
            v[3] = refit_mf_pair_to_f32(u.y, 1, p.kind);
            v[4] = refit_mf_pair_to_f32(u.z, 0, p.kind);
            v[5] = refit_mf_pair_to_f32(u.z, 1, p.kind);
            v[6] = refit_mf_pair_to_f32(u.w, 0, p.kind);
            v[7] = refit_mf_pair_to_f32(u.w, 1, p.kind);
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
__device__ __forceinline__ void
k_q4_groups(const Q4_PARAMS(LS) &B, unsigned int *status)
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
__device__ __forceinline__ void
k_q4_rows(const Q4_PARAMS(S) &B, unsigned int *status)
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

/* ---- the dense fast path: 16-bit x, 16-bit scales, contiguous rows ----
 *
 * k_q4_dense<L> takes the pieces whose rows are contiguous and 16-byte
 * aligned, whose weights and scales are F16/BF16, whose K is a whole
 * number of groups of 8L columns (L = 4..32: groups of 32..256) and whose
 * words lie along N (the GPTQ layout) or along K (the u8 layout). A tile
 * is R = 128/L rows x one group: each lane makes 4 independent 16-byte
 * loads (one word of one row each; L lanes a row, coalesced), the L lanes
 * of a row reduce its magnitude bits with __vmaxu2 (two rows packed a
 * register), lane j computes row j's scale and 1/scale once and hands
 * 1/scale back with a shuffle. Each warp walks a contiguous run of tiles
 * (rows fastest, then groups), so a piece's fields are read from the
 * parameters once per piece, not per tile, and (row tile, group) is
 * stepped, not divided. GPTQ words go through a per-warp shared tile so
 * that each store instruction writes R consecutive rows of a word index
 * (whole 32-byte sectors for L <= 16); u8 words are stored as loaded (L
 * consecutive words a row).
 *
 * Encoding without a division. With 16-bit x = X 2^a and a 16-bit scale
 * s = S 2^b (|X|, S < 2^11), x / s is either a half-integer h or at least
 * min(1/(2S), 2^(a-b)/S) > 2^-12.3 from every h with |x/s| >= 0.4 (the
 * difference 2X 2^a - (2m+1) S 2^b is a nonzero multiple of
 * 2^min(a+1, b)). u = RN(x * inv + 768) with inv = RN(1/s) (one FMA: the
 * product exact) is x/s to within 7.53 * 2^-24 + 2^-15, snapped to the
 * 2^-14 grid, so it equals h exactly at a tie and lies strictly on the
 * same side of every half-integer otherwise; RN(u + 12582152) is then
 * rint(x / s) + 1.5 * 2^23 + 8 (ties to even: the offset is even), whose
 * low 4 bits, after clamping at 1.5 * 2^23 + 15, are the code. No lower
 * clamp: a scale normal in its dtype is within 2^-8 of amax / 7.5, so
 * |x / s| <= 7.53. A group whose scale is subnormal in its dtype takes
 * the same steps on x and s times 2^64, clamped at both ends (q4d_code's
 * WIDE). No division anywhere: nothing the tile loop calls. */

/* A piece's fields, read once into registers. */
struct q4d_regs {
    const char *x;
    char *q, *s;
    int32_t xs0, qs, ss0, ss1;   /* bytes, elements (the host checked they fit) */
    int32_t n, nrt, idx;
    int skind;
    bool colmajor;
};

/* Element 2h (lo) or 2h+1 (hi) of a 32-bit pair, as f32 (exact). */
template <int KIND> __device__ __forceinline__ float q4d_lo(uint32_t w)
{
    if (KIND == 2)
        return __uint_as_float(w << 16);
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(w & 0xffffu)));
    return f;
#else
    return __uint_as_float(refit_mf_bits_f16_to_f32((uint16_t)(w & 0xffffu)));
#endif
}
template <int KIND> __device__ __forceinline__ float q4d_hi(uint32_t w)
{
    if (KIND == 2)
        return __uint_as_float(w & 0xffff0000u);
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(w >> 16)));
    return f;
#else
    return __uint_as_float(refit_mf_bits_f16_to_f32((uint16_t)(w >> 16)));
#endif
}

/* The code of x (low nibble; bits 4..7 zero) under 1/scale inv (above).
 * WIDE, for a tile with a scale subnormal in its dtype: for that group x
 * and the scale both times f = 2^64 (exact: the scale is then normal, its
 * reciprocal finite; x / s is the same, and the same 16-bit significands
 * keep the bound above), inv = RN(1/(s 2^64)), and a lower clamp too: a
 * subnormal scale may be far below amax / 7.5, so |x / s| may pass 8 (not
 * 16: the scale is at least 2/3 of amax / 7.5, or 0 made epsilon); the
 * tile's other groups take f = 1 (the same steps, the clamp idle). */
template <bool WIDE> __device__ __forceinline__ uint32_t q4d_code(float x, float inv, float f)
{
    if (!WIDE) {
        float u = __fmaf_rn(x, inv, 768.0f);
        return __float_as_uint(fminf(__fadd_rn(u, 12582152.0f), 12582927.0f));
    }
    float u = __fmaf_rn(__fmul_rn(x, f), inv, 768.0f);
    return __float_as_uint(fminf(fmaxf(__fadd_rn(u, 12582152.0f), 12582912.0f), 12582927.0f));
}

/* Two codes as a byte (element 2h low); the garbage above bit 7 is left. */
template <int KIND, bool WIDE>
__device__ __forceinline__ uint32_t q4d_pair(uint32_t w, float inv, float f)
{
    return q4d_code<WIDE>(q4d_hi<KIND>(w), inv, f) * 16u + q4d_code<WIDE>(q4d_lo<KIND>(w), inv, f);
}

/* The word of 8 elements. */
/* The word of 8 elements (f: WIDE's factor, 2^64 or 1). */
template <int KIND, bool WIDE>
__device__ __forceinline__ uint32_t q4d_word(uint4 u, float inv, float f = 1.0f)
{
    uint32_t lo = __byte_perm(q4d_pair<KIND, WIDE>(u.x, inv, f), q4d_pair<KIND, WIDE>(u.y, inv, f),
                              0x0040);
    uint32_t hi = __byte_perm(q4d_pair<KIND, WIDE>(u.z, inv, f), q4d_pair<KIND, WIDE>(u.w, inv, f),
                              0x0040);
    return __byte_perm(lo, hi, 0x5410);
}

/* Magnitude bits of 8 16-bit elements, max per half. */
__device__ __forceinline__ uint32_t q4d_mag(uint4 u)
{
    const uint32_t m = 0x7fff7fffu;
    return __vmaxu2(__vmaxu2(u.x & m, u.y & m), __vmaxu2(u.z & m, u.w & m));
}

__device__ __forceinline__ void q4d_put16(char *a, uint32_t bits)
{
    *(uint16_t *)a = (uint16_t)bits;
}

__device__ __forceinline__ void q4d_put32(char *a, uint32_t word)
{
    *(uint32_t *)a = word;
}

/* cnt tiles of piece P from (row tile rt, group g) on. */
template <int L, int KIND>
__device__ __forceinline__ void q4d_tiles(const q4d_regs &P, int32_t g, int32_t rt, int32_t cnt,
                                          uint32_t *sh, unsigned int *status)
{
    constexpr int RPL = 32 / L, R = Q4D_LOADS * RPL;
    const int lane = threadIdx.x & 31, c = lane / L, wl = lane & (L - 1);
    const uint32_t inf16 = KIND == 2 ? 0x7f80u : 0x7c00u;
    const uint32_t snorm = P.skind == 2 ? 0x7f80u : 0x7c00u;
    /* Per lane, per piece: its byte offsets within a tile (32 bits: the
     * host checked they fit) and the steps between its loads and stores;
     * per tile the three pointers step by a row tile, and are set again
     * from the group where a group's row tiles end. */
    const uint32_t xoff = (uint32_t)(c * P.xs0 + wl * 16), xstep = (uint32_t)(RPL * P.xs0);
    uint32_t qoff, qstep, qrow, qgrp;
    if (P.colmajor) { /* lane stores row lane % R of word index k*32/R + lane/R */
        qoff = (uint32_t)(((lane / R) * P.qs + lane % R) * 4);
        qstep = (uint32_t)((32 / R) * P.qs * 4);
        qrow = R * 4;
        qgrp = (uint32_t)(L * P.qs * 4);
    } else {          /* lane stores row r*RPL + c, word wl */
        qoff = (uint32_t)((c * P.qs + wl) * 4);
        qstep = (uint32_t)(RPL * P.qs * 4);
        qrow = (uint32_t)(R * P.qs * 4);
        qgrp = L * 4;
    }
    int32_t i0 = rt * R;
    const char *xp = P.x + ((int64_t)i0 * P.xs0 + (int64_t)g * (16 * L) + xoff);
    uint32_t qo = (uint32_t)rt * qrow + (uint32_t)g * qgrp + qoff;   /* q and s: 32-bit */
    uint32_t so = 2u * ((uint32_t)(i0 + lane) * P.ss0 + (uint32_t)g * P.ss1); /* offsets */
    /* the shared tile (GPTQ): word index w, row i at [w * (R + 1) + i] */
    uint32_t *const shw = sh + wl * (R + 1) + c;                          /* row r*RPL + c */
    const uint32_t *const shr = sh + (lane / R) * (R + 1) + lane % R;     /* for the stores */
    /* lane j computes row j's scale: it is in lanes (j % RPL)*L.., load j / RPL */
    const int jsrc = (lane % RPL) * L, jr = lane / RPL;
    for (; cnt > 0; cnt--) {
        const int32_t left = P.n - i0; /* rows of the tile in the piece, if < R */
        uint4 u[Q4D_LOADS];
        if (left >= R) { /* warp-uniform: a whole tile, no predicates */
#pragma unroll
            for (int r = 0; r < Q4D_LOADS; r++)
                u[r] = __ldcs((const uint4 *)(xp + r * xstep));
        } else {
#pragma unroll
            for (int r = 0; r < Q4D_LOADS; r++)
                u[r] = r * RPL + c < left ? __ldcs((const uint4 *)(xp + r * xstep))
                                          : make_uint4(0, 0, 0, 0);
        }
        uint32_t m0 = q4d_mag(u[0]), m1 = q4d_mag(u[1]), m2 = q4d_mag(u[2]), m3 = q4d_mag(u[3]);
        /* rows of loads 0 and 1 in one register, 2 and 3 in another */
        uint32_t a01 = __vmaxu2(__byte_perm(m0, m1, 0x5410), __byte_perm(m0, m1, 0x7632));
        uint32_t a23 = __vmaxu2(__byte_perm(m2, m3, 0x5410), __byte_perm(m2, m3, 0x7632));
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) {
            a01 = __vmaxu2(a01, __shfl_xor_sync(0xffffffffu, a01, o));
            a23 = __vmaxu2(a23, __shfl_xor_sync(0xffffffffu, a23, o));
        }
        /* lane j < R: row j's scale, stored, and 1/scale (0: not fast) */
        uint32_t v01 = __shfl_sync(0xffffffffu, a01, jsrc);
        uint32_t v23 = __shfl_sync(0xffffffffu, a23, jsrc);
        uint32_t pick = jr < 2 ? v01 : v23, mag = jr & 1 ? pick >> 16 : pick & 0xffffu;
        bool jlive = lane < R && lane < left;
        uint32_t sb = KERN_INT4_SCALE_OVERFLOW;
        if (jlive && mag < inf16)
            sb = kern_int4_scale_bits(__uint_as_float(KIND == 2 ? mag << 16
                                                      : refit_mf_bits_f16_to_f32((uint16_t)mag)),
                                      P.skind);
        bool put = jlive && sb != KERN_INT4_SCALE_OVERFLOW;
        float inv = 0.0f;
        if (put) { /* inv < 0: a subnormal scale, the WIDE encoding with -inv */
            q4d_put16(P.s + so, sb);
            float sv = kern_int4_scale_value(sb, P.skind);
            inv = sb & snorm ? __frcp_rn(sv) : -__frcp_rn(__fmul_rn(sv, 0x1p64f));
        } else if (jlive) {
            atomicMin(status, (unsigned int)P.idx);
        }
        const uint32_t ok = __ballot_sync(0xffffffffu, put); /* bit j: row j written */
        uint32_t word[Q4D_LOADS];
        if (!__ballot_sync(0xffffffffu, inv < 0.0f)) { /* warp-uniform: no subnormal scale */
#pragma unroll
            for (int r = 0; r < Q4D_LOADS; r++)
                word[r] = q4d_word<KIND, false>(
                    u[r], __uint_as_float(__shfl_sync(0xffffffffu, __float_as_uint(inv), r * RPL + c)));
        } else {
#pragma unroll
            for (int r = 0; r < Q4D_LOADS; r++) {
                float iv = __uint_as_float(__shfl_sync(0xffffffffu, __float_as_uint(inv), r * RPL + c));
                word[r] = q4d_word<KIND, true>(u[r], fabsf(iv), iv < 0.0f ? 0x1p64f : 1.0f);
            }
        }
        if (P.colmajor) {
#pragma unroll
            for (int r = 0; r < Q4D_LOADS; r++)
                shw[r * RPL] = word[r];
            __syncwarp();
            if ((ok >> (lane % R)) & 1u) {
#pragma unroll
                for (int k = 0; k < Q4D_LOADS; k++)
                    q4d_put32(P.q + (qo + k * qstep), shr[k * (32 / R) * (R + 1)]);
            }
            __syncwarp(); /* the tile read before the next one is written */
        } else {
#pragma unroll
            for (int r = 0; r < Q4D_LOADS; r++)
                if ((ok >> (r * RPL + c)) & 1u)
                    q4d_put32(P.q + (qo + r * qstep), word[r]);
        }
        if (++rt == P.nrt) { /* the next group's first row tile */
            rt = 0;
            i0 = 0;
            g++;
            xp = P.x + ((int64_t)g * (16 * L) + xoff);
            qo = (uint32_t)g * qgrp + qoff;
            so = 2u * ((uint32_t)lane * P.ss0 + (uint32_t)g * P.ss1);
        } else {
            i0 += R;
            xp += (int64_t)R * P.xs0;
            qo += qrow;
            so += 2u * R * P.ss0;
        }
    }
}

/* The piece tile t belongs to (the last whose first tile <= t). */
template <class BATCH> __device__ __forceinline__ int q4d_find(const BATCH &B, int64_t t)
{
    int lo = 0, hi = B.np - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (B.p[mid].first <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

template <int LS> /* L | Q4_SHORT for the short parameter block */
__device__ __forceinline__ void
k_q4_dense(const Q4D_PARAMS(LS) &B, unsigned int *status)
{
    constexpr int L = LS & (Q4_SHORT - 1);
    constexpr int R = Q4D_LOADS * 32 / L;
    __shared__ uint32_t stage[Q4_THREADS / 32][L * (R + 1)];
    uint32_t *sh = stage[threadIdx.x >> 5];
    int64_t warp = ((int64_t)blockIdx.x * Q4_THREADS + threadIdx.x) >> 5;
    int64_t t = warp * B.per_warp, t_end = t + B.per_warp < B.end ? t + B.per_warp : B.end;
    while (t < t_end) { /* warp-uniform: one piece a round */
        const int pi = q4d_find(B, t);
        const q4d_piece &p = B.p[pi];
        q4d_regs P;
        P.x = p.x;
        P.q = p.q;
        P.s = p.s;
        P.xs0 = (int32_t)p.xs0;
        P.qs = (int32_t)p.qs;
        P.ss0 = (int32_t)p.ss0;
        P.ss1 = (int32_t)p.ss1;
        P.n = p.n;
        P.nrt = p.nrt;
        P.idx = p.idx;
        P.skind = p.skind;
        P.colmajor = p.colmajor;
        int64_t p_end = pi + 1 < B.np ? B.p[pi + 1].first : B.end;
        int32_t local = (int32_t)(t - p.first);
        int32_t g = local / P.nrt, rt = local - g * P.nrt;
        int32_t cnt = (int32_t)((t_end < p_end ? t_end : p_end) - t);
        t += cnt;
        if (p.kind == 2)
            q4d_tiles<L, 2>(P, g, rt, cnt, sh, status);
        else
            q4d_tiles<L, 1>(P, g, rt, cnt, sh, status);
    }
}

/* ---- the kernels int4_launch.c looks up by name ---- */

#define Q4_GROUPS(L, S, SUF)                                                           \
    extern "C" __global__ void __launch_bounds__(Q4_THREADS)                           \
        q4_groups_##L##SUF(const __grid_constant__ Q4_PARAMS((L) | (S)) B, unsigned int *status) \
    {                                                                                  \
        k_q4_groups<(L) | (S)>(B, status);                                             \
    }
#define Q4_ROWS(S, SUF)                                                                \
    extern "C" __global__ void __launch_bounds__(Q4_THREADS)                           \
        q4_rows##SUF(const __grid_constant__ Q4_PARAMS(S) B, unsigned int *status)     \
    {                                                                                  \
        k_q4_rows<S>(B, status);                                                       \
    }
#define Q4_DENSE(L, S, SUF)                                                            \
    extern "C" __global__ void __launch_bounds__(Q4_THREADS, Q4D_BLOCKS_PER_SM)        \
        q4_dense_##L##SUF(const __grid_constant__ Q4D_PARAMS((L) | (S)) B, unsigned int *status) \
    {                                                                                  \
        k_q4_dense<(L) | (S)>(B, status);                                              \
    }
/* _s: the short parameter block (Q4_SMALL pieces) */
#define Q4_BOTH(M, ...) M(__VA_ARGS__, 0, ) M(__VA_ARGS__, Q4_SHORT, _s)
Q4_BOTH(Q4_GROUPS, 1)
Q4_BOTH(Q4_GROUPS, 2)
Q4_BOTH(Q4_GROUPS, 4)
Q4_BOTH(Q4_GROUPS, 8)
Q4_BOTH(Q4_GROUPS, 16)
Q4_BOTH(Q4_GROUPS, 32)
Q4_ROWS(0, )
Q4_ROWS(Q4_SHORT, _s)
Q4_BOTH(Q4_DENSE, 4)
Q4_BOTH(Q4_DENSE, 8)
Q4_BOTH(Q4_DENSE, 16)
Q4_BOTH(Q4_DENSE, 32)
