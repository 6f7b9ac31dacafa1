/* NVFP4 post-load on the GPU, bit-exact with the CPU references of
 * plugins/nvfp4/quant_nvfp4.c (the arithmetic is defined in quant_nvfp4.h):
 *
 *   online      the amax pass over the piece (each block folds its share
 *               into the piece's device word with atomicMax of magnitude
 *               bits), then the encode pass: gs = 2688 / amax, and per
 *               block of 16 along a row its E4M3 scale (written to the
 *               swizzled 128x4 layout), its divisor e4m3(code) / gs and 16
 *               E2M1 codes (8 packed bytes); alpha = 1 / gs.
 *   checkpoint  the encode pass alone: every byte of the swizzled array,
 *               the staged scale or a pad zero, and alpha / input_scale_inv
 *               fused from the staged factors (no host round trip).
 *
 * Work items are the positions of the padded scale grid [Rp, Cp], row by
 * row, so a thread reads one block of 16 consecutive elements and every
 * pad byte is written by the item that owns it. Blocks of a launch are
 * shared among its pieces by their sizes (QN_BATCH pieces a launch, in
 * a __grid_constant__ parameter); a piece's blocks stride over its items.
 * One kernel, nvfp4_pass, runs both passes, a piece's blocks taking the
 * pass its entry names. Online pieces go in sets of about QN_SET_BYTES of
 * input, software-pipelined: launch j runs the encode pass of set j - 1
 * (whose amax launch j - 1 completed, stream order) and the amax pass of
 * set j. Sets were sized for the encode pass to find its set in L2 one
 * launch later (evict-first reads, __ldcs, and streamed stores, __stcs,
 * keep the set behind it there), but on the H200 it mostly does not (L2
 * hit 22%) and fewer, larger launches pay more: 96 MB sets beat 24 MB
 * ones by a quarter (docs/cuda.md, "Set size"). Within a launch the amax
 * blocks are spread evenly among the encode blocks (qn_find), so both
 * passes share every SM. Checkpoint
 * pieces ride in the first launch. n online pieces in s sets take s + 1
 * launches (more when a launch holds more than QN_BATCH entries).
 *
 * Element access, general path: one block of 16 a thread; 16-byte loads
 * (two for 16-bit inputs, four for F32) and one 8-byte store where the
 * rows are contiguous and aligned and the block is whole, element by
 * element otherwise (any strides, ragged K). Dense pieces (contiguous
 * F16/BF16, k a multiple of 16: every bench weight) take the dense path
 * instead (its section says how): warp units of 64 blocks, coalesced
 * 16-byte loads, 4 (encode) or 8 (amax) in flight a lane, no per-element
 * index math, NaN/infinity found on a CTA's max alone, the quotients by a
 * reciprocal and one FMA correction.
 *
 * nvcc's defaults keep this exact: -prec-div=true, -ftz=false (no
 * --use_fast_math); divisions, products, FMAs and the encoders' additions
 * are explicit (__fdiv_rn, __fmul_rn, __fmaf_rn, __fadd_rn), so nothing is
 * contracted or reassociated. A NaN or infinity makes its block lower
 * the status word to the piece's index (atomicMin: the lowest piece wins;
 * REFIT_STATUS_NONE means none), a word the launcher is given
 * (plugins/nvfp4/nvfp4_launch.c plans the launches; the host reads the
 * word at finalize, the GPU suites' direct entry after its one wait).
 * This file is device code only: built with nvcc --fatbin and embedded in
 * refit-fmt-nvfp4.so by refit-embed (the format SDK's path). */
#include <cuda_runtime.h>
#include <stdint.h>

#include <refit/format.h>
#include <refit/sdk/minifloat.h>

#include "plugins/nvfp4/nvfp4_gpu.h"
#include "plugins/nvfp4/nvfp4_piece.h"

/* ---- codecs (refit/sdk/minifloat.h; the block scales are E4M3 of
 * non-negative values, UE4M3) ---- */

/* kern_f32_to_e2m1 of a non-NaN f32: the grid 0, .5, 1, 1.5, 2, 3, 4, 6,
 * ties to the even code, saturating at 6. Branch-free, by one f32
 * addition (as quant_mx.cu's mx_e2m1_code): adding M = 2^(23 + e), e the
 * exponent of the grid's spacing in the value's binade (binades below 1
 * share the spacing 0.5), rounds the magnitude to that spacing, to nearest
 * even, into the low bits of the sum; the code is those bits plus 2 per
 * binade above 1. Magnitudes from 7 up (infinity too) encode as 6, so they
 * are clamped to 7 first (code 8, saturated to 7), which keeps M finite.
 * Fewer instructions than comparing with the 7 midpoints; run_nvfp4.sh
 * checks it against kern_f32_to_e2m1 on every non-NaN f32, both signs. */
__device__ __forceinline__ uint32_t qn_e2m1(float x)
{
    uint32_t b = __float_as_uint(x), a = min(b & 0x7fffffffu, 0x40e00000u);
    uint32_t e = a >> 23, E = e > 127u ? e : 127u, m = (E + 22u) << 23;
    uint32_t code = __float_as_uint(__fadd_rn(__uint_as_float(a), __uint_as_float(m))) - m +
                    2u * (E - 127u);
    return min(code, 7u) | ((b >> 28) & 0x8u);
}

/* ---- pieces (plugins/nvfp4/nvfp4_gpu.h) ---- */

/* Block b's entry, its rank among the entry's blocks (*rel) and their
 * count (*nb). The amax blocks are spread evenly among the encode ones
 * (block b is an amax block where floor(b na / end) steps), not after
 * them: the encode pass (instruction-bound, reading from L2) and the
 * amax pass (reading HBM) then share every SM through the launch instead
 * of running one after the other. */
__device__ __forceinline__ int qn_find(const qn_batch &B, int64_t b, int64_t *rel, int64_t *nb)
{
    int64_t before = b * B.na / B.end;
    bool amax = (b + 1) * B.na / B.end > before;
    int64_t rank = amax ? before : b - before;
    int i = amax ? B.ne : 0, end = amax ? B.np : B.ne;
    while (i + 1 < end && rank >= B.p[i + 1].first)
        i++;
    *nb = (i + 1 < end ? B.p[i + 1].first : amax ? B.na : B.end - B.na) - B.p[i].first;
    *rel = rank - B.p[i].first;
    return i;
}

/* Row and padded block of item t. */
__device__ __forceinline__ void qn_rc(const qn_piece &p, int64_t t, int64_t *r, int64_t *c)
{
    if (t <= 0xffffffffll && p.cp <= 0xffffffffll) {
        uint32_t q = (uint32_t)t / (uint32_t)p.cp;
        *r = q;
        *c = t - (int64_t)q * p.cp;
    } else {
        *r = t / p.cp;
        *c = t - *r * p.cp;
    }
}

__device__ __forceinline__ int64_t qn_swizzle(int64_t r, int64_t c, int64_t cp)
{
    int64_t tile = (r >> 7) * (cp >> 2) + (c >> 2);
    return tile * 512 + (r & 31) * 16 + ((r & 127) >> 5) * 4 + (c & 3);
}

__device__ __forceinline__ float qn_decode(const char *p, int kind)
{
    if (kind == 0)
        return *(const float *)p;
    return refit_mf_half_to_f32(*(const uint16_t *)p, kind);
}

/* 16 aligned bytes; last: the data's last use (evict first). */
__device__ __forceinline__ uint4 qn_ld16(const char *a, bool last)
{
    return last ? __ldcs((const uint4 *)a) : *(const uint4 *)a;
}

/* Block c of row r of an online piece into v (w elements; 0 past them). */
__device__ __forceinline__ void qn_load16(const qn_piece &p, int64_t r, int64_t c, int w,
                                          float v[16], bool last)
{
    int es = p.kind == 0 ? 4 : 2;
    if (p.vx && w == 16) {
        const char *a = p.x + (r * p.xs0 + c * 16) * es;
        if (p.kind == 0) {
#pragma unroll
            for (int u = 0; u < 4; u++) {
                uint4 f = qn_ld16(a + 16 * u, last);
                v[4 * u] = __uint_as_float(f.x); v[4 * u + 1] = __uint_as_float(f.y);
                v[4 * u + 2] = __uint_as_float(f.z); v[4 * u + 3] = __uint_as_float(f.w);
            }
        } else {
#pragma unroll
            for (int u = 0; u < 2; u++) {
                uint4 h = qn_ld16(a + 16 * u, last);
                v[8 * u] = refit_mf_pair_to_f32(h.x, 0, p.kind);
                v[8 * u + 1] = refit_mf_pair_to_f32(h.x, 1, p.kind);
                v[8 * u + 2] = refit_mf_pair_to_f32(h.y, 0, p.kind);
                v[8 * u + 3] = refit_mf_pair_to_f32(h.y, 1, p.kind);
                v[8 * u + 4] = refit_mf_pair_to_f32(h.z, 0, p.kind);
                v[8 * u + 5] = refit_mf_pair_to_f32(h.z, 1, p.kind);
                v[8 * u + 6] = refit_mf_pair_to_f32(h.w, 0, p.kind);
                v[8 * u + 7] = refit_mf_pair_to_f32(h.w, 1, p.kind);
            }
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < 16; u++)
        v[u] = u < w ? qn_decode(p.x + (r * p.xs0 + (c * 16 + u) * p.xs1) * es, p.kind) : 0.0f;
}

__device__ __forceinline__ uint32_t qn_mag_max(const float v[16])
{
    uint32_t m = 0;
#pragma unroll
    for (int u = 0; u < 16; u++)
        m = max(m, __float_as_uint(v[u]) & 0x7fffffffu);
    return m;
}

/* The max of m over the block, in every thread. */
__device__ __forceinline__ uint32_t qn_block_max(uint32_t m)
{
    __shared__ uint32_t part[QN_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1)
        m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x / 32] = m;
    __syncthreads();
    m = part[0];
    for (int k = 1; k < QN_THREADS / 32; k++)
        m = max(m, part[k]);
    return m;
}

/* gs from the amax bits (kern_nvfp4_global_scale). */
__device__ __forceinline__ float qn_global(uint32_t amax_bits)
{
    if (amax_bits == 0)
        return 1.0f;
    float gs = __fdiv_rn(2688.0f, __uint_as_float(amax_bits));
    return __float_as_uint(gs) >= 0x7f800000u ? __uint_as_float(QN_FINITE_MAX) : gs;
}

/* ---- amax ---- */

/* The amax pass: this block's share of the piece (nb blocks, rel its
 * rank among them). */
__device__ __forceinline__ void qn_amax(const qn_piece &p, int64_t rel, int64_t nb,
                                        unsigned int *status)
{
    uint32_t m = 0;
    for (int64_t t = rel * QN_THREADS + threadIdx.x; t < p.items; t += nb * QN_THREADS) {
        int64_t r, c;
        qn_rc(p, t, &r, &c);
        if (r >= p.n || c >= p.cb)
            continue;
        int64_t w = p.k - c * 16;
        float v[16];
        qn_load16(p, r, c, w < 16 ? (int)w : 16, v, false);
        m = max(m, qn_mag_max(v));
    }
    m = qn_block_max(m);
    if (threadIdx.x == 0) {
        atomicMax(p.amax, m);
        if (m > QN_FINITE_MAX)
            atomicMin(status, (unsigned int)p.idx);
    }
}

/* ---- the dense path ----
 *
 * A dense piece (qn_piece_init decides, per piece): online, F16 or BF16,
 * x and q contiguous (rows of k and k / 2 with no gap), k a multiple of
 * 16, x 16-byte and q 4-byte aligned, under 2^30 blocks and 2^31 scale
 * bytes. Its blocks are then one flat run, so the work is addressed by
 * 32-bit block numbers from one 64-bit base, with no per-element index
 * math: warp unit u is blocks 64 u .. 64 u + 63, four 512-byte segments,
 * lane l reading bytes 16 l .. 16 l + 15 of each (4 loads in flight,
 * coalesced; lanes 2b and 2b + 1 hold the halves of block b of a
 * segment) and storing 4 packed bytes (a half block) per segment. Bench
 * weights (TinyLlama, BF16, contiguous, k a multiple of 128) are all
 * dense; everything else keeps the general path above. */
#define QN_MAG2 0x7fff7fffu        /* magnitude bits of two 16-bit values */
#define QN_SAFE_LO 0x0d800000u     /* 2^-100 .. 2^100: where qn_quot's reciprocal form holds */
#define QN_SAFE_HI 0x71800000u

/* An F32's bits from a 16-bit magnitude: BF16 by a shift; F16 exactly. */
template <int KIND> __device__ __forceinline__ uint32_t qn_f32_of(uint32_t h)
{
    return KIND == 2 ? h << 16 : refit_mf_bits_f16_to_f32((uint16_t)h);
}

/* An F16 magnitude (bits 13..27 of f, the rest 0) as F32: those bits
 * read as an F32 are the value times 2^-112 (subnormals too), and the
 * product by 2^112 is exact. Finite values only (the encode pass runs
 * on pieces whose amax was finite). */
__device__ __forceinline__ float qn_f16_finite(uint32_t f)
{
    return __fmul_rn(__uint_as_float(f), 0x1p112f);
}

/* The low and high 16-bit values of a magnitude word, as F32 (finite). */
template <int KIND> __device__ __forceinline__ float qn_lo(uint32_t m)
{
    return KIND == 2 ? __uint_as_float(m << 16) : qn_f16_finite((m << 13) & 0x0fffe000u);
}
template <int KIND> __device__ __forceinline__ float qn_hi(uint32_t m)
{
    return KIND == 2 ? __uint_as_float(m & 0xffff0000u) : qn_f16_finite((m >> 3) & 0x0fffe000u);
}

/* The max of the 8 magnitudes of a 16-byte load, in both halves of a
 * word's pairwise maxima (unsigned 16-bit max of magnitude bits orders
 * them as values; NaN and infinity above every finite one). */
__device__ __forceinline__ uint32_t qn_vmax8(uint4 w)
{
    return __vmaxu2(__vmaxu2(w.x & QN_MAG2, w.y & QN_MAG2), __vmaxu2(w.z & QN_MAG2, w.w & QN_MAG2));
}

/* The dense amax pass: a warp takes 8 segments a trip (8 loads in
 * flight a lane), folds them with __vmaxu2 on magnitude bits, and the
 * block's max goes to the piece's word in one atomicMax; a NaN or an
 * infinity is found on that max alone. */
template <int KIND>
__device__ __forceinline__ void qn_amax_dense(const qn_piece &p, uint32_t rel, uint32_t nb,
                                              unsigned int *status)
{
    const char *x = p.x;
    const uint32_t chunks = p.nblk * 2u; /* 16-byte loads of the piece */
    const uint32_t lane = threadIdx.x & 31u, warps = QN_THREADS / 32;
    uint32_t acc = 0;
    for (uint32_t t = rel * warps + (threadIdx.x >> 5); t * 256u < chunks; t += nb * warps) {
        const uint32_t c0 = t * 256u + lane;
        const char *a = x + (size_t)c0 * 16u;
        uint4 w[8];
#pragma unroll
        for (int j = 0; j < 8; j++)
            w[j] = c0 + 32u * j < chunks ? qn_ld16(a + 512 * j, false) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc = __vmaxu2(acc, qn_vmax8(w[j]));
    }
    uint32_t m = qn_block_max(qn_f32_of<KIND>(max(acc & 0xffffu, acc >> 16)));
    if (threadIdx.x == 0) {
        atomicMax(p.amax, m);
        if (m > QN_FINITE_MAX)
            atomicMin(status, (unsigned int)p.idx);
    }
}

/* bmax / 6 as __fdiv_rn gives it: the product by RN(1/6) corrected by one
 * FMA of the exact residual (Markstein), in full below 2^-100 (where the
 * residual may leave the normal range). run_nvfp4.sh checks it against
 * the division on every F16 and BF16 magnitude. */
__device__ __forceinline__ float qn_div6(float b)
{
    if (__float_as_uint(b) < QN_SAFE_LO)
        return __fdiv_rn(b, 6.0f);
    const float y6 = 0x1.555556p-3f; /* RN(1/6) */
    float q0 = __fmul_rn(b, y6);
    return __fmaf_rn(__fmaf_rn(-q0, 6.0f, b), y6, q0);
}

/* refit_mf_ue4m3_sat of a non-negative, non-NaN f32 by one f32 addition (the
 * trick of qn_e2m1): adding M = 2^(E - 107), E the binade's exponent
 * (121, E4M3's least normal one, for the subnormals), rounds to E4M3's
 * spacing there, to nearest even, into the sum's low bits; the code is
 * those bits plus 8 per binade above 121. Magnitudes from 512 (infinity
 * too) are clamped to 512, which saturates as they do. About 8
 * instructions instead of refit_mf_ue4m3_sat's two shifted roundings (about 40);
 * run_nvfp4.sh checks it against kern_f32_to_e4m3_sat on every
 * non-negative non-NaN f32. */
__device__ __forceinline__ uint32_t qn_e4m3_add(uint32_t a)
{
    a = min(a, 0x44000000u);
    uint32_t e = a >> 23, E = e > 121u ? e : 121u, m = (E + 20u) << 23;
    uint32_t code = __float_as_uint(__fadd_rn(__uint_as_float(a), __uint_as_float(m))) - m +
                    8u * (E - 121u);
    return min(code, 0x7eu);
}

/* A block's E4M3 scale code from its magnitude max (F32 bits). */
__device__ __forceinline__ uint32_t qn_scale_code(uint32_t bmax, float gs)
{
    uint32_t code = qn_e4m3_add(__float_as_uint(__fmul_rn(gs, qn_div6(__uint_as_float(bmax)))));
    return code ? code : 0x20u; /* KERN_NVFP4_ZERO_SCALE */
}

/* a / d as __fdiv_rn gives it, where it decides an E2M1 code: with y =
 * RN(1/d) and d in [2^-100, 2^100], the product a * y corrected by one
 * FMA of the exact residual (Markstein). a is a magnitude: the sign is
 * put back from the input's bits, so -0 keeps its sign bit. run_nvfp4.sh
 * checks the codes against the full division (kern_f32_to_e2m1 of
 * __fdiv_rn) on every F16 and BF16 magnitude for divisors across the
 * range and near every E2M1 midpoint. */
__device__ __forceinline__ float qn_quot(float a, float d, float y)
{
    float q0 = __fmul_rn(a, y);
    return __fmaf_rn(__fmaf_rn(-q0, d, a), y, q0);
}

/* kern_f32_to_e2m1 of a non-negative quotient, without sign: qn_e2m1 with
 * the clamp at 6 (every magnitude from 6 up, infinity and a NaN from an
 * overflowed residual too, encodes as 7), so no clamp of the code. */
__device__ __forceinline__ uint32_t qn_e2m1_mag(float q)
{
    uint32_t a = min(__float_as_uint(q), 0x40c00000u);
    uint32_t e = a >> 23, E = e > 127u ? e : 127u, m = (E + 22u) << 23;
    return __float_as_uint(__fadd_rn(__uint_as_float(a), __uint_as_float(m))) - m +
           2u * (E - 127u);
}

/* The sign bits of a 16-byte load's 8 values, at bit 3 of each nibble of
 * the packed word (value e's nibble is e): the high byte of each value
 * gathered with byte permutes, even values' bytes shifted down 4. */
__device__ __forceinline__ uint32_t qn_signs8(uint4 w)
{
    uint32_t l = __byte_perm(w.x, w.y, 0x7351), m = __byte_perm(w.z, w.w, 0x7351);
    uint32_t even = __byte_perm(l, m, 0x5410), odd = __byte_perm(l, m, 0x7632);
    return (odd & 0x80808080u) | ((even >> 4) & 0x08080808u);
}

/* 8 values (one load: half a block) as 8 E2M1 codes, value e in nibble
 * e, with divisor d; y = RN(1/d), or 0 where d is out of qn_quot's range
 * (then divided in full). */
template <int KIND>
__device__ __forceinline__ uint32_t qn_pack8(uint4 w, float d, float y)
{
    uint32_t m[4] = {w.x & QN_MAG2, w.y & QN_MAG2, w.z & QN_MAG2, w.w & QN_MAG2};
    uint32_t out = qn_signs8(w);
    if (y != 0.0f) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            out |= qn_e2m1_mag(qn_quot(qn_lo<KIND>(m[i]), d, y)) << (8 * i) |
                   qn_e2m1_mag(qn_quot(qn_hi<KIND>(m[i]), d, y)) << (8 * i + 4);
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++)
            out |= qn_e2m1_mag(__fdiv_rn(qn_lo<KIND>(m[i]), d)) << (8 * i) |
                   qn_e2m1_mag(__fdiv_rn(qn_hi<KIND>(m[i]), d)) << (8 * i + 4);
    }
    return out;
}

/* Offset of block g's scale in the swizzled array: row r = g / cb by the
 * multiply of qn_piece_init, column c, then the fixed permutation within
 * 128x4 tiles (kern_swizzle_offset) in 32 bits. */
__device__ __forceinline__ uint32_t qn_swz(uint32_t g, uint32_t cb, uint32_t dmul,
                                           uint32_t dshift, uint32_t tiles_row)
{
    uint32_t r = cb == 1u ? g : __umulhi(g, dmul) >> dshift;
    uint32_t c = g - r * cb;
    return ((r >> 7) * tiles_row + (c >> 2)) << 9 | (r & 31u) << 4 | (r & 96u) >> 3 | (c & 3u);
}

/* The scale grid's pad bytes of a dense piece (columns cb .. cp - 1 of
 * rows < n, then rows n .. up to a multiple of 128): zero. */
__device__ __forceinline__ void qn_pads(const qn_piece &p, uint32_t rel, uint32_t nb)
{
    uint32_t n = (uint32_t)p.n, cb = (uint32_t)p.cb, cp = (uint32_t)p.cp;
    uint32_t side = n * (cp - cb), rows = (uint32_t)(p.items / p.cp) - n;
    for (uint32_t t = rel * QN_THREADS + threadIdx.x; t < side + rows * cp; t += nb * QN_THREADS) {
        uint32_t r, c;
        if (t < side) {
            r = t / (cp - cb);
            c = cb + (t - r * (cp - cb));
        } else {
            r = n + (t - side) / cp;
            c = (t - side) - (r - n) * cp;
        }
        p.s[qn_swizzle(r, c, p.cp)] = 0;
    }
}

/* The dense encode pass. A CTA's table holds, for every scale code, the
 * divisor e4m3(code) / gs and its reciprocal (computed once a CTA, not per
 * block). Per unit, each lane pair finds its four blocks' maxima (one
 * shuffle a pair of segments), the even lane computes the scales of
 * segments 0 and 1, the odd one those of 2 and 3 (one shuffle swaps the
 * codes), each writes its two scale bytes, and every lane packs and
 * stores its four half blocks. */
template <int KIND>
__device__ __forceinline__ void qn_encode_dense(const qn_piece &p, float gs, uint32_t rel,
                                                uint32_t nb)
{
    __shared__ uint2 tab[128];
    if (threadIdx.x < 128) {
        float d = __fdiv_rn(refit_mf_ue4m3_to_f32(threadIdx.x < 0x7fu ? threadIdx.x : 0x7eu), gs);
        uint32_t db = __float_as_uint(d);
        float y = db >= QN_SAFE_LO && db < QN_SAFE_HI ? __frcp_rn(d) : 0.0f;
        tab[threadIdx.x] = uint2{db, __float_as_uint(y)};
    }
    __syncthreads();
    qn_pads(p, rel, nb);
    const char *x = p.x;
    unsigned char *q = p.q, *s = p.s;
    const uint32_t nblk = p.nblk, cb = (uint32_t)p.cb, dmul = p.dmul, dshift = p.dshift;
    const uint32_t tiles_row = (uint32_t)(p.cp >> 2), warps = QN_THREADS / 32;
    const uint32_t lane = threadIdx.x & 31u, odd = lane & 1u;
    for (uint32_t u = rel * warps + (threadIdx.x >> 5); u * QN_UNIT_BLOCKS < nblk;
         u += nb * warps) {
        const uint32_t g0 = u * QN_UNIT_BLOCKS + (lane >> 1); /* its block in segment 0 */
        const char *a = x + (size_t)u * (QN_UNIT_BLOCKS * 32) + lane * 16u;
        uint4 w[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            w[j] = g0 + 16u * j < nblk ? qn_ld16(a + 512 * j, true) : make_uint4(0, 0, 0, 0);
        /* block maxima: segments 0, 1 in the halves of lo, 2, 3 in hi */
        uint32_t h0 = qn_vmax8(w[0]), h1 = qn_vmax8(w[1]), h2 = qn_vmax8(w[2]),
                 h3 = qn_vmax8(w[3]);
        uint32_t lo = __vmaxu2(__byte_perm(h0, h1, 0x5410), __byte_perm(h0, h1, 0x7632));
        uint32_t hi = __vmaxu2(__byte_perm(h2, h3, 0x5410), __byte_perm(h2, h3, 0x7632));
        lo = __vmaxu2(lo, __shfl_xor_sync(0xffffffffu, lo, 1));
        hi = __vmaxu2(hi, __shfl_xor_sync(0xffffffffu, hi, 1));
        const uint32_t mine = odd ? hi : lo;
        const uint32_t ca = qn_scale_code(__float_as_uint(qn_lo<KIND>(mine)), gs);
        const uint32_t cb2 = qn_scale_code(__float_as_uint(qn_hi<KIND>(mine)), gs);
        const uint32_t own = ca | cb2 << 8, other = __shfl_xor_sync(0xffffffffu, own, 1);
        const uint32_t codes = odd ? other | own << 16 : own | other << 16; /* segment j: byte j */
        const uint32_t ga = g0 + 32u * odd;
        if (ga < nblk)
            s[qn_swz(ga, cb, dmul, dshift, tiles_row)] = (unsigned char)ca;
        if (ga + 16u < nblk)
            s[qn_swz(ga + 16u, cb, dmul, dshift, tiles_row)] = (unsigned char)cb2;
        unsigned char *o = q + (size_t)u * (QN_UNIT_BLOCKS * 8) + lane * 4u;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (g0 + 16u * j >= nblk)
                break;
            uint2 t = tab[(codes >> (8 * j)) & 0x7fu];
            __stcs((unsigned int *)(o + 128 * j),
                   qn_pack8<KIND>(w[j], __uint_as_float(t.x), __uint_as_float(t.y)));
        }
    }
}

/* ---- encode (online) and swizzle + fuse (checkpoint) ---- */

/* Item (r, c) of an online piece: one block's scale and packed bytes. */
__device__ __forceinline__ void qn_encode_item(const qn_piece &p, float gs, int64_t r, int64_t c)
{
    int64_t w = p.k - c * 16;
    int wi = w < 16 ? (int)w : 16;
    float v[16];
    qn_load16(p, r, c, wi, v, true);
    uint32_t code = refit_mf_ue4m3_sat(__float_as_uint(__fmul_rn(gs, __fdiv_rn(
                        __uint_as_float(qn_mag_max(v)), 6.0f))));
    if (code == 0)
        code = 0x20u; /* KERN_NVFP4_ZERO_SCALE */
    p.s[qn_swizzle(r, c, p.cp)] = (unsigned char)code;
    float div = __fdiv_rn(refit_mf_ue4m3_to_f32(code), gs);
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int u = 0; u < 8; u++)
        lo |= qn_e2m1(__fdiv_rn(v[u], div)) << (4 * u);
#pragma unroll
    for (int u = 0; u < 8; u++)
        hi |= qn_e2m1(__fdiv_rn(v[8 + u], div)) << (4 * u);
    int bytes = (wi + 1) / 2; /* past wi, v holds zeros: code 0 (an odd k's high nibble) */
    if (p.vq && wi == 16) {
        uint2 o;
        o.x = lo;
        o.y = hi;
        __stcs((uint2 *)(p.q + r * p.qs0 + c * 8), o);
        return;
    }
    for (int u = 0; u < bytes; u++)
        p.q[r * p.qs0 + (c * 8 + u) * p.qs1] =
            (unsigned char)((u < 4 ? lo >> (8 * u) : hi >> (8 * (u - 4))) & 0xffu);
}

/* alpha and input_scale_inv of a checkpoint piece (kern_nvfp4_fuse); a
 * factor that makes either non-finite (NaN, infinity, a zero divisor)
 * lowers the status word instead. */
__device__ __forceinline__ void qn_fuse(const qn_piece &p, unsigned int *status)
{
    float wf = *p.wf, in = p.in ? *p.in : 0.0f, alpha, inv = 1.0f;
    if (p.mode == REFIT_NVFP4_CT) {
        alpha = p.in ? __fdiv_rn(1.0f, __fmul_rn(in, wf)) : __fdiv_rn(1.0f, wf);
        inv = in;
    } else {
        alpha = p.in ? __fmul_rn(in, wf) : wf;
        inv = p.in ? __fdiv_rn(1.0f, in) : 1.0f;
    }
    if (!isfinite(alpha) || !isfinite(inv)) {
        atomicMin(status, (unsigned int)p.idx);
        return;
    }
    *p.alpha = alpha;
    if (p.in && p.inv)
        *p.inv = inv;
}

/* E4M3 (FN) has no infinity; S.1111.111 is its NaN. */
__device__ __forceinline__ bool qn_e4m3_nan(unsigned char x)
{
    return (x & 0x7fu) == 0x7fu;
}

/* The encode pass (online) or swizzle and fuse (checkpoint). */
__device__ __forceinline__ void qn_encode(const qn_piece &p, int64_t rel, int64_t nb,
                                          unsigned int *status)
{
    bool online = p.mode == REFIT_NVFP4_ONLINE;
    float gs = 1.0f;
    if (online) {
        uint32_t a = *p.amax;
        if (a > QN_FINITE_MAX)
            return; /* refused: the status word names the piece */
        gs = qn_global(a);
        if (rel == 0 && threadIdx.x == 0)
            *p.alpha = __fdiv_rn(1.0f, gs);
    } else if (rel == 0 && threadIdx.x == 0) {
        qn_fuse(p, status);
    }
    if (p.nblk && p.kind == 2)
        return qn_encode_dense<2>(p, gs, (uint32_t)rel, (uint32_t)nb);
    if (p.nblk)
        return qn_encode_dense<1>(p, gs, (uint32_t)rel, (uint32_t)nb);
    for (int64_t t = rel * QN_THREADS + threadIdx.x; t < p.items; t += nb * QN_THREADS) {
        int64_t r, c;
        qn_rc(p, t, &r, &c);
        if (r >= p.n || c >= p.cb)
            p.s[qn_swizzle(r, c, p.cp)] = 0;
        else if (online)
            qn_encode_item(p, gs, r, c);
        else {
            unsigned char x = (unsigned char)p.x[r * p.xs0 + c * p.xs1];
            if (qn_e4m3_nan(x))
                atomicMin(status, (unsigned int)p.idx);
            p.s[qn_swizzle(r, c, p.cp)] = x;
        }
    }
}

/* Every block runs one pass of one piece: the entry it falls in. */
extern "C" __global__ void __launch_bounds__(QN_THREADS)
nvfp4_pass(const __grid_constant__ qn_batch B, unsigned int *status)
{
    int64_t rel, nb;
    const qn_piece &p = B.p[qn_find(B, blockIdx.x, &rel, &nb)];
    if (p.pass == 0) {
        if (p.nblk && p.kind == 2)
            qn_amax_dense<2>(p, (uint32_t)rel, (uint32_t)nb, status);
        else if (p.nblk)
            qn_amax_dense<1>(p, (uint32_t)rel, (uint32_t)nb, status);
        else
            qn_amax(p, rel, nb, status);
    } else {
        qn_encode(p, rel, nb, status);
    }
}

