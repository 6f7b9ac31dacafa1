/* FP8 (E4M3) weight quantization on the GPU, bit-exact with kern_quant_fp8
 * (plugins/fp8/quant_fp8.c; the arithmetic is defined in quant_fp8.h):
 *
 *   amax  = max |x| over the group        (the max of the magnitude bits:
 *                                          for non-negative floats the bit
 *                                          order is the value order, in
 *                                          F16 and BF16 as in F32)
 *   scale = __fdiv_rn(amax, 448), 1 when that is 0
 *   q     = e4m3_sat(x / scale)         (x / scale: __fdiv_rn, or for
 *                                          F16/BF16 a reciprocal and one
 *                                          FMA correction that gives the
 *                                          same bytes: qf_div; e4m3_sat:
 *                                          the integer encoder of
 *                                          kernels/minifloat.c, written again
 *                                          below, or the hardware's
 *                                          cvt.rn.satfinite.e4m3x2.f32 where
 *                                          kern_fp8_cvt_check_cuda found it
 *                                          equal to that encoder on every
 *                                          finite f32: the caller chooses)
 *
 * Under QF_RECIP (the `hw` flags word) q is instead KERN_FP8_RECIPROCAL's
 * e4m3(clamp(x * __frcp_rn(scale))): qf_encode on the general path,
 * qf_enc_pair<KIND, true> on the dense one.
 *
 * nvcc's defaults keep this exact: -prec-div=true, -ftz=false (no
 * --use_fast_math), so divisions are correctly rounded and subnormals kept,
 * as on the CPU.
 *
 * Built for bandwidth: a call is one kernel launch whatever its pieces (two
 * for per-channel calls with both short and long rows), and
 * every thread keeps several 16-byte loads in flight before it uses any.
 * A "group" is 16 bytes of a row of x (8 F16/BF16 or 4 F32 elements): one
 * vector load where the row is contiguous and aligned, element loads
 * otherwise (a ragged row end, any strides), the encoded bytes one 8-byte
 * (4-byte) store or byte stores likewise. Groups stay raw in registers
 * (one uint4 each) and the amax is taken on their raw magnitude bits.
 *
 *   per-channel  k_rows<CH>: a warp per row (rows of all pieces in one
 *                grid-stride loop); each lane keeps up to CH groups of the
 *                row (CH * 256 elements of a 16-bit row in the warp), so a
 *                row is read once; groups past that are read again for the
 *                encode (from L1/L2). Rows of up to 256 groups and longer
 *                ones go in separate launches, each at its own depth.
 *   block-128    k_tiles<CH>: a 256-thread block per 128x128 tile (CH = 8
 *                groups a thread holds a 16-bit tile, 16 an F32 one), a
 *                block-wide max through shared memory.
 *   per-tensor   k_tensor: chunks of 2048 groups; a persistent grid takes
 *                tickets (an atomic counter) that walk the chunks twice,
 *                amax then encode, the encode pass lagging the amax pass by
 *                a few rounds of QF_ROUND chunks, so that a chunk is read
 *                again while it is still in L2 (2 bytes of HBM a BF16
 *                element, not 4). An encode chunk waits (spins) until every
 *                amax chunk of its group is done; the lag is at least the
 *                largest group's span in rounds, so what it waits on holds
 *                an earlier ticket, taken by a running block: no deadlock
 *                whatever the number of resident blocks.
 *
 * Beside each, a dense fast path (k_tiles_dense, k_rows_dense<class>,
 * k_tensor<1>; the dense path's helpers say what it assumes and does)
 * for the pieces qf_dense_ok finds dense: F16/BF16 rows contiguous and
 * aligned, whole groups, the conversion instruction as the encoder. It
 * does the least work an element (no per-group index arithmetic, bounds
 * or piece lookups, NaN/Inf on the amax alone, the encoder inlined); the
 * other pieces take the general kernels above in their own launch.
 *
 * Device code only (extern "C" kernels, compiled to a fatbin embedded in
 * refit-fmt-fp8.so): plugins/fp8/fp8_launch.c plans the pieces and launches
 * these through the host's GPU service (refit/sdk/pgpu.h). The pieces
 * travel in a table in scratch memory (fp8_gpu.h) with the per-tensor
 * groups' words beside it. A NaN or infinity makes its warp/block atomicMin
 * the piece's index into the module's status word, which the host reads
 * once at finalize. */
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <refit/format.h>
#include <refit/sdk/minifloat.h>

#include "plugins/fp8/fp8_gpu.h"

/* ---- pieces ---- */

/* The piece of unit t (row, tile or chunk): the last whose first unit is
 * <= t, searched from lo up (P[lo].first <= t; t only grows in a loop). */
__device__ __forceinline__ int qf_find(const qf_piece *P, int np, int64_t t, int lo)
{
    if (lo + 1 >= np || P[lo + 1].first > t)
        return lo;
    int hi = np - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (P[mid].first <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* ---- a group: 16 bytes of a row of x ---- */

__device__ __forceinline__ const char *qf_xat(const qf_piece &p, int64_t r, int64_t c)
{
    return p.x + (r * p.xs0 + c * p.xs1) * (p.kind == 0 ? 4 : 2);
}

__device__ __forceinline__ uint4 qf_ld16(const char *a)
{
    return *(const uint4 *)a;
}

/* A last read (the per-tensor encode pass): evict-first, so that L2 keeps
 * the chunks the amax pass has read and the encode pass has not. */
__device__ __forceinline__ uint4 qf_ld16_last(const char *a)
{
    return __ldcs((const uint4 *)a);
}

__device__ __forceinline__ uint32_t qf_ld4(const char *a)
{
    return *(const uint32_t *)a;
}

__device__ __forceinline__ uint32_t qf_ld2(const char *a)
{
    return *(const uint16_t *)a;
}

/* The elements of group gg of row r one by one (0 past the row's end,
 * which adds nothing to an amax and is never stored). Out of line, as the
 * other rare paths: the kernels unroll their groups, and inlined copies
 * of every path overflowed the instruction cache (ncu, H200: warps waiting
 * on instruction fetch most of the time). */
__device__ __noinline__ uint4 qf_load_slow(const qf_piece &p, int64_t r, int64_t gg)
{
    int64_t c = gg << p.shift;
    uint32_t w[4] = {0, 0, 0, 0};
    if (p.kind == 0) {
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (c + u < p.k)
                w[u] = qf_ld4(qf_xat(p, r, c + u));
    } else {
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (c + u < p.k)
                w[u >> 1] |= qf_ld2(qf_xat(p, r, c + u)) << (16 * (u & 1));
    }
    uint4 v;
    v.x = w[0];
    v.y = w[1];
    v.z = w[2];
    v.w = w[3];
    return v;
}

/* Group gg of row r, raw: one vector load where the row allows (last: the
 * group's last read), else qf_load_slow. */
__device__ __forceinline__ uint4 qf_load(const qf_piece &p, int64_t r, int64_t gg,
                                         bool last = false)
{
    int64_t c = gg << p.shift, ne = (int64_t)1 << p.shift;
    if (p.vx && c + ne <= p.k)
        return last ? qf_ld16_last(qf_xat(p, r, c)) : qf_ld16(qf_xat(p, r, c));
    return qf_load_slow(p, r, gg);
}

/* The largest magnitude of a raw group, in the bits of its own dtype (an
 * F16/BF16 magnitude orders as its value does, as an F32 one does). */
__device__ __forceinline__ uint32_t qf_gmax(uint4 w, int kind)
{
    if (kind == 0)
        return max(max(w.x & 0x7fffffffu, w.y & 0x7fffffffu),
                   max(w.z & 0x7fffffffu, w.w & 0x7fffffffu));
    const uint32_t m = 0x7fff7fffu;
    uint32_t t = __vmaxu2(__vmaxu2(w.x & m, w.y & m), __vmaxu2(w.z & m, w.w & m));
    return max(t & 0xffffu, t >> 16);
}

/* A max of qf_gmax values as F32 magnitude bits (NaN and infinity stay
 * above QF_FINITE_MAX). */
__device__ __forceinline__ uint32_t qf_mag_f32(uint32_t m, int kind)
{
    if (kind == 0)
        return m;
    return kind == 1 ? refit_mf_bits_f16_to_f32((uint16_t)m) : m << 16;
}

/* The hardware conversion of two finite floats: lo in the low byte. */
__device__ __forceinline__ uint16_t qf_cvt2(float lo, float hi)
{
    return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

/* The reciprocal of scale s for qf_div, or 0 where x / s is divided in
 * full (__fdiv_rn, ~10 instructions): F32 weights, scales below 2^-100
 * (where the reciprocal loses range), and per-tensor groups mixing dtypes
 * (ok = 0: their scale may come from another dtype's amax). */
__device__ __forceinline__ float qf_recip(float s, int kind, bool ok)
{
    return kind != 0 && ok && s >= 0x1p-100f ? __frcp_rn(s) : 0.0f;
}

/* x / s as __fdiv_rn gives it, for what the encoder sees: with r =
 * qf_recip(s) != 0, the product x * r corrected by one FMA of the exact
 * residual (Markstein), written so that -0 stays -0 with no test.
 * For every F16/BF16 x with |x| <= amax and s = amax / 448 the E4M3 bytes
 * equal those of the full division (tests/gpu/emu/fastdiv.cc checks all
 * 2^31 pairs of each dtype on the CPU, through this code); the quotients
 * themselves differ only where x and s are so small that the residual
 * underflows, and then by less than 2^-12, which E4M3 rounds to 0. */
__device__ __forceinline__ float qf_div_recip(float x, float s, float r)
{
    /* the residual negated, e = q0 s - x, and q0 - e r: the same bits as
     * "x - q0 s, and q0 where that is 0, else q0 + e r" (negation and
     * round-to-nearest commute), without the test: an exact 0 residual
     * rounds to +0 here, so -e is -0 and q0 + -0 is q0 even where q0 is -0
     * (x = -0), which the unnegated form lost. 3 instructions. */
    float q0 = __fmul_rn(x, r);
    float e = __fmaf_rn(q0, s, -x);
    return __fmaf_rn(-e, r, q0);
}

/* qf_div_recip where r != 0 (the dense path calls that directly, its
 * test of r hoisted out of the group loop), the full division where not. */
__device__ __forceinline__ float qf_div(float x, float s, float r)
{
    if (r == 0.0f)
        return __fdiv_rn(x, s);
    return qf_div_recip(x, s, r);
}

/* A raw group encoded with scale s (r: qf_recip of it; unused under
 * QF_RECIP): byte u is element u (4 of an F32 group, 8 of a 16-bit one).
 * hw: the flags word (QF_HW, QF_RECIP). */
__device__ __noinline__ uint2 qf_encode(uint4 w, int kind, float s, float r, int hw)
{
    float v[8];
    int ne = kind == 0 ? 4 : 8;
    if (kind == 0) {
        v[0] = __uint_as_float(w.x);
        v[1] = __uint_as_float(w.y);
        v[2] = __uint_as_float(w.z);
        v[3] = __uint_as_float(w.w);
        v[4] = v[5] = v[6] = v[7] = 0.0f;
    } else {
        v[0] = refit_mf_pair_to_f32(w.x, 0, kind); v[1] = refit_mf_pair_to_f32(w.x, 1, kind);
        v[2] = refit_mf_pair_to_f32(w.y, 0, kind); v[3] = refit_mf_pair_to_f32(w.y, 1, kind);
        v[4] = refit_mf_pair_to_f32(w.z, 0, kind); v[5] = refit_mf_pair_to_f32(w.z, 1, kind);
        v[6] = refit_mf_pair_to_f32(w.w, 0, kind); v[7] = refit_mf_pair_to_f32(w.w, 1, kind);
    }
    if (hw & QF_RECIP) {
        /* vLLM's arithmetic (quant_fp8.h): its reciprocal rounded once,
         * whatever r says, the product clamped (fminf/fmaxf: a NaN product
         * gives +448, as in vLLM's scaled_fp8_conversion) */
        float inv = __frcp_rn(s);
#pragma unroll
        for (int u = 0; u < 8; u++)
            v[u] = fmaxf(-448.0f, fminf(__fmul_rn(v[u], inv), 448.0f));
    } else {
#pragma unroll
        for (int u = 0; u < 8; u++)
            v[u] = u < ne ? qf_div(v[u], s, r) : 0.0f;
    }
    uint32_t b[8];
    if (hw & QF_HW) {
#pragma unroll
        for (int u = 0; u < 8; u += 2) {
            uint16_t two = u < ne ? qf_cvt2(v[u], v[u + 1]) : 0;
            b[u] = two & 0xffu;
            b[u + 1] = (uint32_t)two >> 8;
        }
    } else {
#pragma unroll
        for (int u = 0; u < 8; u++)
            b[u] = u < ne ? refit_mf_f32_to_e4m3_sat(v[u]) : 0;
    }
    uint2 o;
    o.x = b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24;
    o.y = b[4] | b[5] << 8 | b[6] << 16 | b[7] << 24;
    return o;
}

/* Stores of q: streaming (evict-first), nothing here reads them again. */
__device__ __forceinline__ void qf_st8(unsigned char *a, uint2 w)
{
    __stcs((uint2 *)a, w);
}

__device__ __forceinline__ void qf_st4(unsigned char *a, uint32_t w)
{
    __stcs((unsigned int *)a, (unsigned int)w);
}

/* Encoded group gg of row r, byte by byte (a ragged end, any strides). */
__device__ __noinline__ void qf_store_slow(const qf_piece &p, int64_t r, int64_t gg, uint2 b)
{
    int64_t c = gg << p.shift, ne = (int64_t)1 << p.shift;
#pragma unroll
    for (int u = 0; u < 8; u++)
        if (u < ne && c + u < p.k)
            p.q[r * p.qs0 + (c + u) * p.qs1] =
                (unsigned char)((u < 4 ? b.x >> (8 * u) : b.y >> (8 * (u - 4))) & 0xffu);
}

/* Store encoded group gg of row r: one store where q's row allows. */
__device__ __forceinline__ void qf_store(const qf_piece &p, int64_t r, int64_t gg, uint2 b)
{
    int64_t c = gg << p.shift, ne = (int64_t)1 << p.shift;
    if (p.vq && c + ne <= p.k) {
        unsigned char *a = p.q + r * p.qs0 + c;
        if (p.kind == 0)
            qf_st4(a, b.x);
        else
            qf_st8(a, b);
        return;
    }
    qf_store_slow(p, r, gg, b);
}

__device__ __forceinline__ uint32_t qf_warp_max(uint32_t m)
{
    for (int o = 16; o > 0; o >>= 1)
        m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

/* The max of m over the block, in every thread; the block may call it
 * again at once (the second barrier keeps the next call's writes after
 * this call's reads). */
__device__ __forceinline__ uint32_t qf_block_max(uint32_t m)
{
    __shared__ uint32_t part[QF_WARPS];
    m = qf_warp_max(m);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x / 32] = m;
    __syncthreads();
    m = part[0];
    for (int k = 1; k < QF_WARPS; k++)
        m = max(m, part[k]);
    __syncthreads();
    return m;
}

__device__ __forceinline__ float qf_scale(uint32_t amax_bits)
{
    float s = __fdiv_rn(__uint_as_float(amax_bits), 448.0f);
    return s > 0.0f ? s : 1.0f;
}

/* ---- the dense fast path: helpers ----
 *
 * A piece is dense (qf_dense_ok, on the host) when it is F16 or BF16, its
 * rows of x are contiguous with base and pitch 16-byte aligned, its rows of
 * q contiguous with base and pitch 8-byte aligned, and its rows hold whole
 * groups (block-128: whole 128-column tiles). Its kernels do the least work
 * an element: no per-group bounds or stride arithmetic (a 64-bit base once
 * a row, tile or chunk, 32-bit offsets from it), every lane's loads issued
 * before any is used, the amax on packed magnitude pairs, NaN/Inf found on
 * the unit's amax alone, bf16 -> f32 by a shift or a mask, and the division
 * by qf_div_recip with its test of the reciprocal hoisted out of the
 * loop. */

/* The running max of the 16-bit magnitudes of a raw group, as a pair
 * (the low and high halves kept apart until qf_pair_top). */
__device__ __forceinline__ uint32_t qf_pair_max(uint32_t acc, uint4 w)
{
    const uint32_t m = 0x7fff7fffu;
    return __vmaxu2(acc, __vmaxu2(__vmaxu2(w.x & m, w.y & m), __vmaxu2(w.z & m, w.w & m)));
}

__device__ __forceinline__ uint32_t qf_pair_top(uint32_t acc)
{
    return max(acc & 0xffffu, acc >> 16);
}

/* The smallest 16-bit magnitude that is not finite: infinity's (F16 or
 * BF16); a unit whose amax reaches it is refused. */
__device__ __forceinline__ uint32_t qf_inf16(int kind)
{
    return kind == 2 ? 0x7f80u : 0x7c00u;
}

/* Element hi (0 or 1) of a raw 16-bit pair as an f32, exactly: BF16 is the
 * high half of an f32; F16's magnitude bits moved to an f32's place are
 * the value times 2^-112 (subnormals too), scaled back by a power of two. */
template <int KIND>
__device__ __forceinline__ float qf_wide(uint32_t w, int hi)
{
    if (KIND == 2)
        return __uint_as_float(hi ? w & 0xffff0000u : w << 16);
    uint32_t h = hi ? w >> 16 : w & 0xffffu;
    return __fmul_rn(__uint_as_float((h & 0x8000u) << 16 | (h & 0x7fffu) << 13), 0x1p112f);
}

/* Two elements of a pair, divided and converted: lo in the low byte.
 * RECIP: multiplied by r instead (QF_RECIP). Its products are finite
 * (|x| <= amax, r = __frcp_rn(s) with s >= 2^-100) and at most a few ulps
 * past 448, which satfinite takes to 448 as qf_encode's clamp does. */
template <int KIND, bool RECIP>
__device__ __forceinline__ uint32_t qf_enc_pair(uint32_t w, float s, float r)
{
    if (RECIP)
        return qf_cvt2(__fmul_rn(qf_wide<KIND>(w, 0), r), __fmul_rn(qf_wide<KIND>(w, 1), r));
    return qf_cvt2(qf_div_recip(qf_wide<KIND>(w, 0), s, r),
                   qf_div_recip(qf_wide<KIND>(w, 1), s, r));
}

/* A raw 16-bit group encoded by the conversion instruction (r != 0):
 * the bytes of qf_encode(w, KIND, s, r, QF_HW | (RECIP ? QF_RECIP : 0)). */
template <int KIND, bool RECIP>
__device__ __forceinline__ uint2 qf_enc8(uint4 w, float s, float r)
{
    uint2 o;
    o.x = qf_enc_pair<KIND, RECIP>(w.x, s, r) | qf_enc_pair<KIND, RECIP>(w.y, s, r) << 16;
    o.y = qf_enc_pair<KIND, RECIP>(w.z, s, r) | qf_enc_pair<KIND, RECIP>(w.w, s, r) << 16;
    return o;
}

/* Slots 0 .. nv - 1 of a dense unit the general way (slot i: group g + i
 * dg of row r + i drow, read again from x), for the units whose scale is
 * too small for the reciprocal (qf_recip 0). Out of line, so that the
 * dense kernels keep no registers for it. */
__device__ __noinline__ void qf_slots_slow(const qf_piece &p, int64_t r, int64_t g, int drow,
                                           int dg, int nv, float s, int hw)
{
    for (int i = 0; i < nv && i < QF_DENSE_CH; i++) {
        int64_t ri = r + (int64_t)i * drow, gi = g + (int64_t)i * dg;
        qf_store(p, ri, gi, qf_encode(qf_load(p, ri, gi), p.kind, s, 0.0f, hw));
    }
}

/* The CH groups of a dense unit encoded with scale s (r = qf_recip(s)
 * != 0), each valid one (ok(i)) handed to put(i, bytes): slots past a
 * unit's end cost a branch, not an encode. Dense pieces are taken only
 * with the conversion instruction (qf_dense_ok), so this is the one
 * encoder of the fast path; r is tested once a unit by the caller. */
template <int CH, bool RECIP, class Ok, class Put>
__device__ __forceinline__ void qf_enc_dense_as(const uint4 (&raw)[CH], int kind, float s,
                                                float r, Ok ok, Put put)
{
    if (kind == 2) {
#pragma unroll
        for (int i = 0; i < CH; i++)
            if (ok(i))
                put(i, qf_enc8<2, RECIP>(raw[i], s, r));
    } else {
#pragma unroll
        for (int i = 0; i < CH; i++)
            if (ok(i))
                put(i, qf_enc8<1, RECIP>(raw[i], s, r));
    }
}

/* hw: the kernel's flags word; QF_RECIP multiplies by r (see qf_enc_pair). */
template <int CH, class Ok, class Put>
__device__ __forceinline__ void qf_enc_dense(const uint4 (&raw)[CH], int kind, float s, float r,
                                             int hw, Ok ok, Put put)
{
    if (hw & QF_RECIP)
        qf_enc_dense_as<CH, true>(raw, kind, s, r, ok, put);
    else
        qf_enc_dense_as<CH, false>(raw, kind, s, r, ok, put);
}

/* CH groups at a, a + step, ...: all of them where the unit is whole for
 * this lane (full: no predicates, no zeroing), else the valid ones (ok(i))
 * and zeros. Every load is issued before any is used. LAST: read with
 * evict-first (x read once, or for the last time). */
template <int CH, bool LAST, class Ok>
__device__ __forceinline__ void qf_load_dense(uint4 (&raw)[CH], const char *a, int64_t step,
                                              bool full, Ok ok)
{
    if (full) {
#pragma unroll
        for (int i = 0; i < CH; i++)
            raw[i] = LAST ? qf_ld16_last(a + i * step) : qf_ld16(a + i * step);
        return;
    }
#pragma unroll
    for (int i = 0; i < CH; i++)
        raw[i] = !ok(i) ? make_uint4(0, 0, 0, 0)
                 : LAST ? qf_ld16_last(a + i * step)
                        : qf_ld16(a + i * step);
}

/* A dense piece's fields in registers, read once a piece (the table is
 * read again only when a unit falls past end); 32-bit where qf_dense_ok
 * found them to fit, so that the cursor costs few registers. */
struct qf_dense_at {
    const char *x;
    unsigned char *q;
    float *s;
    int64_t first, end;         /* its units */
    uint32_t xp, qp;            /* bytes from a row of x (q) to the next */
    uint32_t ss0, ss1, n, gpr;
    int idx, kind;
};

/* Make d the piece of unit t (pi: the last one, the search's start). */
__device__ __forceinline__ void qf_dense_seek(qf_dense_at &d, const qf_piece *P, int np,
                                              int64_t t, int &pi)
{
    pi = qf_find(P, np, t, pi);
    const qf_piece &p = P[pi];
    d.x = p.x;
    d.q = p.q;
    d.s = p.s;
    d.first = p.first;
    d.end = pi + 1 < np ? P[pi + 1].first : INT64_MAX;
    d.xp = (uint32_t)(p.xs0 * 2);
    d.qp = (uint32_t)p.qs0;
    d.ss0 = (uint32_t)p.ss0;
    d.ss1 = (uint32_t)p.ss1;
    d.n = (uint32_t)p.n;
    d.gpr = (uint32_t)p.gpr;
    d.idx = p.idx;
    d.kind = p.kind;
}

/* Units [t0, t1) cut into gridDim.x runs, one a block: [*a, *b). A run
 * of consecutive units stays in one piece but at its edges, so that the
 * table is searched a few times a block, not once a unit. */
__device__ __forceinline__ void qf_block_run(int64_t t0, int64_t t1, int64_t *a, int64_t *b)
{
    int64_t per = (t1 - t0 + gridDim.x - 1) / gridDim.x;
    *a = t0 + per * blockIdx.x;
    *b = *a + per < t1 ? *a + per : t1;
}

/* ---- per-channel: a warp per row ---- */

/* Rows t0 .. t1 - 1 of the call (P: the pieces holding them). CH: groups
 * a lane keeps (the launch picks the smallest that holds its longest row,
 * at most QF_ROW_CH_MAX; longer rows read the rest twice). */
template <int CH>
__device__ __forceinline__ void
k_rows(const qf_piece *__restrict__ P, int np, int64_t t0, int64_t t1, unsigned int *status,
       int hw)
{
    int lane = threadIdx.x & 31, pi = 0;
    int64_t step = (int64_t)gridDim.x * QF_WARPS;
    for (int64_t t = t0 + (int64_t)blockIdx.x * QF_WARPS + threadIdx.x / 32; t < t1; t += step) {
        pi = qf_find(P, np, t, pi);
        const qf_piece &p = P[pi];
        int64_t r = t - p.first, G = p.gpr;
        int kind = p.kind;
        uint4 raw[CH];
#pragma unroll
        for (int i = 0; i < CH; i++) {
            int64_t gg = lane + 32 * i;
            raw[i] = make_uint4(0, 0, 0, 0);
            if (gg < G)
                raw[i] = qf_load(p, r, gg);
        }
        uint32_t m = 0;
#pragma unroll
        for (int i = 0; i < CH; i++)
            m = max(m, qf_gmax(raw[i], kind));
        for (int64_t gg = lane + 32 * CH; gg < G; gg += 32)
            m = max(m, qf_gmax(qf_load(p, r, gg), kind));
        m = qf_warp_max(qf_mag_f32(m, kind));
        if (m > QF_FINITE_MAX) {
            if (lane == 0)
                atomicMin(status, (unsigned int)p.idx);
            continue;
        }
        float s = qf_scale(m), rc = qf_recip(s, kind, true);
        if (lane == 0)
            p.s[r * p.ss0] = s;
#pragma unroll
        for (int i = 0; i < CH; i++) {
            int64_t gg = lane + 32 * i;
            if (gg < G)
                qf_store(p, r, gg, qf_encode(raw[i], kind, s, rc, hw));
        }
        for (int64_t gg = lane + 32 * CH; gg < G; gg += 32)
            qf_store(p, r, gg, qf_encode(qf_load(p, r, gg), kind, s, rc, hw));
    }
}

/* ---- block-128: a block per 128x128 tile ---- */

/* Slot i of thread t is group t + 256 i of the tile, row-major (16 groups
 * a row of a 16-bit tile, 32 of an F32 one): CH slots a thread must hold
 * the launch's largest tile (8: 16-bit pieces only, 16 with an F32 one). */
template <int CH>
__device__ __forceinline__ void
k_tiles(const qf_piece *__restrict__ P, int np, int64_t t0, int64_t t1, unsigned int *status,
        int hw)
{
    int pi = 0;
    for (int64_t t = t0 + blockIdx.x; t < t1; t += gridDim.x) {
        pi = qf_find(P, np, t, pi);
        const qf_piece &p = P[pi];
        int64_t tile = t - p.first, bk = (p.k + 127) >> 7;
        int64_t si = tile / bk, sj = tile - si * bk, r0 = si * 128;
        int64_t h = p.n - r0 < 128 ? p.n - r0 : 128, G = p.gpr;
        int kind = p.kind, gsh = 7 - p.shift, gw = 1 << gsh;
        int64_t g0 = sj << gsh, ng = h << gsh;
        uint4 raw[CH];
#pragma unroll
        for (int i = 0; i < CH; i++) {
            int gi = threadIdx.x + QF_THREADS * i;
            int64_t gg = g0 + (gi & (gw - 1));
            raw[i] = make_uint4(0, 0, 0, 0);
            if (gi < ng && gg < G)
                raw[i] = qf_load(p, r0 + (gi >> gsh), gg);
        }
        uint32_t m = 0;
#pragma unroll
        for (int i = 0; i < CH; i++)
            m = max(m, qf_gmax(raw[i], kind));
        m = qf_block_max(qf_mag_f32(m, kind));
        if (m > QF_FINITE_MAX) {
            if (threadIdx.x == 0)
                atomicMin(status, (unsigned int)p.idx);
            continue;
        }
        float s = qf_scale(m), rc = qf_recip(s, kind, true);
        if (threadIdx.x == 0)
            p.s[si * p.ss0 + sj * p.ss1] = s;
#pragma unroll
        for (int i = 0; i < CH; i++) {
            int gi = threadIdx.x + QF_THREADS * i;
            int64_t gg = g0 + (gi & (gw - 1));
            if (gi < ng && gg < G)
                qf_store(p, r0 + (gi >> gsh), gg, qf_encode(raw[i], kind, s, rc, hw));
        }
    }
}

/* ---- the dense fast path: block-128 and per-channel ---- */

/* Block-128, dense pieces: a 256-thread block per 128x128 tile, warp w on
 * its rows 16w .. 16w + 15: lane l holds group l % 16 of rows 16w + l / 16
 * + 2i (slots i < 8), so a warp's load i reads two whole 256-byte rows. The
 * tile's max through shared memory; the block walks a run of consecutive
 * tiles (qf_block_run), its piece's fields in registers, the next tile's
 * row and column stepped, not divided. 64 registers at most: 4 blocks (4
 * tiles, 128 KB of loads) in flight an SM. */
extern "C" __global__ void __launch_bounds__(QF_THREADS, 4)
qf_tiles_dense(const qf_piece *__restrict__ P, int np, int64_t t0, int64_t t1,
              unsigned int *status, int hw)
{
    int64_t ta, tb;
    qf_block_run(t0, t1, &ta, &tb);
    const int lane = threadIdx.x & 31;
    const uint32_t row = (threadIdx.x >> 5) * 16 + (lane >> 4); /* slot 0's row in the tile */
    qf_dense_at d = {};
    d.end = ta; /* seek at the first tile */
    int pi = 0;
    uint32_t si = 0, sj = 0, bk = 1; /* the tile's row and column of tiles */
    for (int64_t t = ta; t < tb; t++) {
        if (t >= d.end) {
            qf_dense_seek(d, P, np, t, pi);
            bk = d.gpr >> 4;
            si = (uint32_t)(t - d.first) / bk;
            sj = (uint32_t)(t - d.first) - si * bk;
        } else if (++sj == bk) {
            sj = 0;
            si++;
        }
        const uint32_t r0 = si * 128 + row;            /* slot 0's row in the piece */
        const int h = (int)(d.n - si * 128) - (int)row; /* slot i is a row while 2i < h */
        auto ok = [&](int i) { return 2 * i < h; };
        const char *xb = d.x + (uint64_t)r0 * d.xp + sj * 256 + (lane & 15) * 16;
        uint4 raw[QF_DENSE_CH];
        qf_load_dense<QF_DENSE_CH, true>(raw, xb, 2 * (int64_t)d.xp, h >= 2 * QF_DENSE_CH, ok);
        uint32_t m = 0;
#pragma unroll
        for (int i = 0; i < QF_DENSE_CH; i++)
            m = qf_pair_max(m, raw[i]);
        m = qf_block_max(qf_pair_top(m));
        if (m >= qf_inf16(d.kind)) {
            if (threadIdx.x == 0)
                atomicMin(status, (unsigned int)d.idx);
            continue;
        }
        float s = qf_scale(qf_mag_f32(m, d.kind)), rc = qf_recip(s, d.kind, true);
        if (threadIdx.x == 0)
            d.s[(uint64_t)si * d.ss0 + (uint64_t)sj * d.ss1] = s;
        if (rc == 0.0f) {
            qf_slots_slow(P[pi], r0, (int64_t)sj * 16 + (lane & 15), 2, 0, (h + 1) / 2, s, hw);
            continue;
        }
        unsigned char *qb = d.q + (uint64_t)r0 * d.qp + sj * 128 + (lane & 15) * 8;
        const int64_t qstep = 2 * (int64_t)d.qp;
        qf_enc_dense<QF_DENSE_CH>(raw, d.kind, s, rc, hw, ok,
                                  [&](int i, uint2 v) { qf_st8(qb + i * qstep, v); });
    }
}

/* Per-channel, dense pieces: a team of T threads a row, each lane with
 * CH groups of it (group tl + T i), all loaded before any is used; a
 * launch class CLS is a (T, CH) whose T CH groups hold its rows (qf_class:
 * 2048 BF16 elements a row are 8 groups a lane of a warp, 5632 are 6 of
 * 128 threads). 256 / T rows a block at a time, the block walking a run
 * of row batches. T > 32: the team's warps meet in shared memory (every
 * thread of the block reaches both barriers, live row or not). */
template <int CLS>
__device__ __forceinline__ void
k_rows_dense(const qf_piece *__restrict__ P, int np, int64_t t0, int64_t t1,
             unsigned int *status, int hw)
{
    constexpr int T = QF_TEAM_T(CLS), CH = QF_TEAM_CH(CLS);
    constexpr int R = QF_THREADS / T; /* rows a batch */
    __shared__ uint32_t part[QF_WARPS];
    int64_t ba, bb;
    qf_block_run(0, (t1 - t0 + R - 1) / R, &ba, &bb);
    const int team = threadIdx.x / T, tl = threadIdx.x % T;
    qf_dense_at d = {};
    d.first = INT64_MAX; /* seek at the first live row */
    int pi = 0;
    for (int64_t b = ba; b < bb; b++) {
        const int64_t t = t0 + b * R + team;
        const bool live = t < t1;
        if (live && (t >= d.end || t < d.first))
            qf_dense_seek(d, P, np, t, pi);
        const uint32_t r = (uint32_t)(t - d.first);
        /* groups of the row from this lane's first on (none: a dead row) */
        const int left = live ? (int)d.gpr - tl : 0;
        auto ok = [&](int i) { return T * i < left; };
        uint4 raw[CH];
        qf_load_dense<CH, true>(raw, d.x + (uint64_t)r * d.xp + tl * 16, T * 16,
                                left > T * (CH - 1), ok);
        uint32_t m = 0;
#pragma unroll
        for (int i = 0; i < CH; i++)
            m = qf_pair_max(m, raw[i]);
        m = qf_warp_max(qf_pair_top(m));
        if (T > 32) {
            if ((threadIdx.x & 31) == 0)
                part[threadIdx.x / 32] = m;
            __syncthreads();
#pragma unroll
            for (int k = 0; k < T / 32; k++)
                m = max(m, part[team * (T / 32) + k]);
            __syncthreads();
        }
        if (!live)
            continue;
        /* the index and the scale's place: read by one lane where used
         * (not kept in registers, which the widest teams lack) */
        if (m >= qf_inf16(d.kind)) {
            if (tl == 0)
                atomicMin(status, (unsigned int)P[pi].idx);
            continue;
        }
        float s = qf_scale(qf_mag_f32(m, d.kind)), rc = qf_recip(s, d.kind, true);
        if (tl == 0)
            P[pi].s[r * P[pi].ss0] = s;
        if (rc == 0.0f) {
            qf_slots_slow(P[pi], r, tl, 0, T, (left + T - 1) / T, s, hw);
            continue;
        }
        unsigned char *qb = d.q + (uint64_t)r * d.qp + tl * 8;
        qf_enc_dense<CH>(raw, d.kind, s, rc, hw, ok,
                         [&](int i, uint2 v) { qf_st8(qb + T * 8 * i, v); });
    }
}

/* ---- per-tensor: one persistent launch, amax then encode ---- */

/* Row and group of group gi of a piece (a flattened piece is one row). */
__device__ __forceinline__ void qf_rowgrp(const qf_piece &p, int64_t gi, int64_t *r, int64_t *gg)
{
    if (p.n == 1) {
        *r = 0;
        *gg = gi;
    } else {
        *r = gi / p.gpr;
        *gg = gi - *r * p.gpr;
    }
}

/* Chunk c of piece p into raw (QF_SLOTS groups a thread; last: the
 * encode pass). */
__device__ __forceinline__ void qf_chunk_load(const qf_piece &p, int64_t c,
                                              uint4 (&raw)[QF_SLOTS], bool last)
{
    int64_t total = p.n * p.gpr;
#pragma unroll
    for (int i = 0; i < QF_SLOTS; i++) {
        int64_t gi = c * QF_CHUNK + threadIdx.x + QF_THREADS * i, r, gg;
        raw[i] = make_uint4(0, 0, 0, 0);
        if (gi < total) {
            qf_rowgrp(p, gi, &r, &gg);
            raw[i] = qf_load(p, r, gg, last);
        }
    }
}

/* A general chunk's amax (F32 magnitude bits) in this thread, and its
 * encode: out of line, so that a per-tensor launch with dense pieces
 * keeps no registers for the general path around its dense loops. */
__device__ __noinline__ uint32_t qf_chunk_amax(const qf_piece &p, int64_t pc)
{
    uint4 raw[QF_SLOTS];
    qf_chunk_load(p, pc, raw, false);
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < QF_SLOTS; i++)
        m = max(m, qf_gmax(raw[i], p.kind));
    return qf_mag_f32(m, p.kind);
}

__device__ __noinline__ void qf_chunk_encode(const qf_piece &p, int64_t pc, float s, float rc,
                                             int hw)
{
    uint4 raw[QF_SLOTS];
    qf_chunk_load(p, pc, raw, true);
    int64_t total = p.n * p.gpr;
#pragma unroll
    for (int i = 0; i < QF_SLOTS; i++) {
        int64_t gi = pc * QF_CHUNK + threadIdx.x + QF_THREADS * i, rr, gg;
        if (gi < total) {
            qf_rowgrp(p, gi, &rr, &gg);
            qf_store(p, rr, gg, qf_encode(raw[i], p.kind, s, rc, hw));
        }
    }
}

/* Tickets t = 0, 1, ... in rounds of 2 * round: a round's first half is
 * amax chunks r * round .., its second half the encode chunks of round
 * r - lag (empty slots past either end). A block takes a ticket, and the
 * next one while it works on it. ALL_DENSE: every piece of the launch is
 * dense, the general path not compiled in (80 registers, 3 blocks an SM;
 * at 64 it spills 24 bytes, at 80 two words kept across the out-of-line
 * calls, read back once a ticket); else each chunk takes its piece's path
 * (106 registers, 2 blocks, no spill). */
template <int ALL_DENSE>
__device__ __forceinline__ void
k_tensor(const qf_piece *__restrict__ P, int np, qf_group *G, qf_head *head,
         unsigned int *status, int64_t chunks,
         int64_t round, int64_t lag, int rev, int hw)
{
    __shared__ unsigned long long next;
    __shared__ uint32_t amax;
    const unsigned long long tickets =
        (unsigned long long)((chunks + round - 1) / round + lag) * 2 * (unsigned long long)round;
    int pa = 0, pe = 0;
    if (threadIdx.x == 0)
        next = atomicAdd(&head->ticket, 1ull);
    for (;;) {
        __syncthreads();
        unsigned long long t = next;
        __syncthreads();
        if (t >= tickets)
            break;
        if (threadIdx.x == 0)
            next = atomicAdd(&head->ticket, 1ull);
        int64_t r = (int64_t)(t / (2 * (unsigned long long)round));
        int64_t j = (int64_t)t - r * 2 * round;
        bool enc = j >= round;
        int64_t c = enc ? (r - lag) * round + (j - round) : r * round + j;
        if (c < 0 || c >= chunks)
            continue;
        int pi = qf_find(P, np, c, enc ? pe : pa);
        if (enc)
            pe = pi;
        else
            pa = pi;
        if (enc && rev) {
            /* the encode pass walks each group backwards: the chunks the
             * amax pass read last are re-read first, while L2 still holds
             * them, and the group's misses fall on its first chunks only
             * (read forwards, a group larger than what L2 keeps misses on
             * every chunk). The same tickets encode the same group, so
             * what each waits on is unchanged. */
            c = P[pi].gfirst + P[pi].gend - 1 - c;
            pi = qf_find(P, np, c, P[pi].gpiece);
        }
        const qf_piece &p = P[pi];
        qf_group *g = &G[p.group];
        const int64_t pc = c - p.first;
        const int kind = p.kind;
        const bool dense = ALL_DENSE || p.dense;
        /* a dense chunk: this thread's groups pc * QF_CHUNK + tid + 256 i,
         * while i < left / 256, at xb + 4096 i (qb + 2048 i in q) */
        const int64_t left = p.gpr - pc * QF_CHUNK - threadIdx.x;
        auto ok = [&](int i) { return QF_THREADS * i < left; };
        const bool full = left > QF_THREADS * (QF_SLOTS - 1);
        const char *xb = p.x + (pc * QF_CHUNK + threadIdx.x) * 16;
        uint4 raw[QF_SLOTS];
        if (!enc) {
            uint32_t m = 0;
            if (dense) {
                qf_load_dense<QF_SLOTS, false>(raw, xb, QF_THREADS * 16, full, ok);
#pragma unroll
                for (int i = 0; i < QF_SLOTS; i++)
                    m = qf_pair_max(m, raw[i]);
                m = qf_mag_f32(qf_pair_top(m), kind);
            } else {
                m = qf_chunk_amax(p, pc);
            }
            m = qf_block_max(m);
            if (threadIdx.x == 0) {
                if (m > QF_FINITE_MAX)
                    atomicMin(status, (unsigned int)p.idx);
                atomicMax(&g->amax, m);
                __threadfence(); /* the amax before the count that publishes it */
                atomicAdd(&g->done, 1u);
            }
            continue;
        }
        if (threadIdx.x == 0) {
            /* every amax chunk of the group holds an earlier ticket */
            while (*(volatile unsigned int *)&g->done < g->need)
                __nanosleep(256);
            __threadfence();
            amax = *(volatile unsigned int *)&g->amax;
        }
        __syncthreads();
        uint32_t a = amax;
        if (a > QF_FINITE_MAX)
            continue; /* refused: the status word names a piece of the group */
        float s = qf_scale(a), rc = qf_recip(s, kind, p.onekind);
        if (p.leader && pc == 0 && threadIdx.x == 0)
            *p.s = s;
        if (!dense || rc == 0.0f) {
            qf_chunk_encode(p, pc, s, rc, hw);
            continue;
        }
        qf_load_dense<QF_SLOTS, true>(raw, xb, QF_THREADS * 16, full, ok);
        unsigned char *qb = p.q + (pc * QF_CHUNK + threadIdx.x) * 8;
        qf_enc_dense<QF_SLOTS>(raw, kind, s, rc, hw, ok,
                               [&](int i, uint2 v) { qf_st8(qb + QF_THREADS * 8 * i, v); });
    }
}

/* ---- the hardware conversion against the encoder ---- */

/* Every finite f32 x (and -x beside it, so that the byte order is checked
 * too) through qf_cvt2 and refit_mf_f32_to_e4m3_sat: count the differences, keep the
 * smallest differing input. */
extern "C" __global__ void __launch_bounds__(QF_THREADS)
qf_cvt_check(unsigned long long *count, unsigned int *first)
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
        bool bad = (two & 0xffu) != refit_mf_f32_to_e4m3_sat(f) ||
                   (two >> 8) != refit_mf_f32_to_e4m3_sat(refit_mf_bits_f32(x | 0x80000000u));
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

/* ---- the kernels fp8_launch.c looks up by name ---- */

#define QF_ARGS const qf_piece *__restrict__ P, int np, int64_t t0, int64_t t1, \
                unsigned int *status, int hw
#define QF_ROWS(CH)                                                                    \
    extern "C" __global__ void __launch_bounds__(QF_THREADS) qf_rows_##CH(QF_ARGS)      \
    {                                                                                  \
        k_rows<CH>(P, np, t0, t1, status, hw);                                         \
    }
QF_ROWS(1)
QF_ROWS(2)
QF_ROWS(4)
QF_ROWS(8)
QF_ROWS(16)
QF_ROWS(24) /* QF_ROW_CH_MAX */
#define QF_TILES(CH)                                                                   \
    extern "C" __global__ void __launch_bounds__(QF_THREADS) qf_tiles_##CH(QF_ARGS)     \
    {                                                                                  \
        k_tiles<CH>(P, np, t0, t1, status, hw);                                        \
    }
QF_TILES(8) /* QF_SLOTS */
QF_TILES(16)
#define QF_ROWS_DENSE(CLS)                                                             \
    extern "C" __global__ void __launch_bounds__(QF_THREADS, 4)                        \
        qf_rows_dense_##CLS(QF_ARGS)                                                   \
    {                                                                                  \
        k_rows_dense<CLS>(P, np, t0, t1, status, hw);                                  \
    }
QF_ROWS_DENSE(0)
QF_ROWS_DENSE(1)
QF_ROWS_DENSE(2)
QF_ROWS_DENSE(3)
QF_ROWS_DENSE(4)
#define QF_TENSOR(ALL, MIN)                                                            \
    extern "C" __global__ void __launch_bounds__(QF_THREADS, MIN)                      \
        qf_tensor_##ALL(const qf_piece *__restrict__ P, int np, qf_group *G, qf_head *head, \
                        unsigned int *status, int64_t chunks, int64_t round, int64_t lag,   \
                        int rev, int hw)                                               \
    {                                                                                  \
        k_tensor<ALL>(P, np, G, head, status, chunks, round, lag, rev, hw);            \
    }
QF_TENSOR(0, 2)
QF_TENSOR(1, 3)
