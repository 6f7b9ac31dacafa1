/* OCP MX quantization on the GPU (MXFP8: E4M3 elements; MXFP4: E2M1
 * elements packed two per byte), bit-exact with kern_quant_mxfp8
 * (plugins/mxfp8/quant_mx.c) and kern_quant_mxfp4 (plugins/mxfp4/quant_mxfp4.c); the
 * arithmetic is defined in plugins/mxfp8/quant_mx.h:
 *
 *   amax = max |x| over a block of 32 of a row   (the max of the magnitude
 *                                                  bits: their order is the
 *                                                  value order)
 *   s    = clamp(floor(log2 amax) - emax, -127, 127) + 127, 0 when amax == 0
 *   q    = encode_sat(x / 2^(s - 127))
 *
 * x / 2^(s-127) is computed as x * 2^(127-s): the power of two and its
 * inverse are exact in f32, so the product is the exact quotient rounded
 * once, as the CPU's division rounds it (__fmul_rn: never contracted into
 * an FMA). The encoders round with one f32 addition: adding M = 2^(23 + e)
 * (e the exponent of the format's spacing in the value's binade) leaves
 * x rounded to that spacing, to nearest even, in the low bits of the sum;
 * the code is those bits plus a per-binade offset. Both are checked on the
 * CPU reference's every reachable input (tests/gpu/test_gpu_mx.c). E4M3
 * may instead use the hardware's cvt.rn.satfinite.e4m3x2.f32, where the
 * backend found it equal to the reference on every finite f32
 * (backend_cuda_fp8_encoder). nvcc's defaults keep subnormals (-ftz=false).
 *
 * Layout of the work: a 32-element block belongs to 4 lanes of a warp, 8
 * consecutive elements each (one 16-byte load for 16-bit input, two for
 * F32, where the row is contiguous and aligned; element by element
 * otherwise), so a warp covers 8 blocks, a "task". The amax is reduced
 * over the 4 lanes with two shuffles; lane 0 of the 4 writes the scale.
 * Each piece's blocks, row-major over [matrices, rows, blocks of a row],
 * are numbered from 0; a task never straddles pieces (a piece's tasks are
 * rounded up), so the piece lookup is uniform in a warp. One launch takes
 * up to MX_BATCH pieces in its parameters (a __grid_constant__ struct of
 * ~30 KB: no upload), grid-stride over pairs of adjacent tasks in flight per
 * warp. Consecutive pieces of one shape spaced evenly (stacked experts)
 * merge into one piece with a matrix stride. A block holding a NaN or
 * infinity is left unwritten (scale and elements) and its piece's call
 * index atomicMin'd into a status word, which the call copies back,
 * waiting for the stream once, at the end. That is the general path
 * (k_mx); BF16 pieces whose rows are contiguous, aligned and a multiple of
 * 32 long take the dense path (k_mxd, below), in the same call. */
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>
#include <refit/sdk/minifloat.h>

#include "plugins/mxfp8/mx_gpu.h"

#define MX_D __device__ __forceinline__

/* ---- encoders: finite inputs below the format's range limit 2^(emax+1)
 * (what x / X can be); the sign comes back in the code ---- */

/* E4M3, saturating: binades below 2^-6 share the subnormal spacing 2^-9
 * (refit_mf_encode_mag_add's addition, written out: this form compiles to
 * fewer instructions here). */
MX_D uint32_t mx_e4m3_code(uint32_t a, float mag)
{
    uint32_t e = a >> 23, E = e > 121u ? e : 121u;
    float m = __uint_as_float((E + 20u) << 23); /* spacing 2^(E-130) in its lsb */
    uint32_t code = __float_as_uint(__fadd_rn(mag, m)) - ((E + 20u) << 23) + 8u * (E - 121u);
    return code < 0x7eu ? code : 0x7eu;
}

/* E2M1, saturating to 6: binades below 1 share the subnormal spacing 0.5. */
MX_D uint32_t mx_e2m1_code(uint32_t a, float mag)
{
    uint32_t e = a >> 23, E = e > 127u ? e : 127u;
    float m = __uint_as_float((E + 22u) << 23); /* spacing 2^(E-128) */
    uint32_t code = __float_as_uint(__fadd_rn(mag, m)) - ((E + 22u) << 23) + 2u * (E - 127u);
    return code < 7u ? code : 7u;
}

/* ---- pieces ---- */

__device__ __forceinline__ uint32_t mx_divide(const mx_div &v, uint32_t x)
{
    return v.d == 1 ? x : __umulhi(x, v.mul) >> v.shift;
}

/* Where a lane's 8 elements are. */
struct mx_at {
    int64_t col;                /* first column of the lane's 8 */
    int64_t xo, qo, so;         /* element offset of the row in x; bytes in q; scale */
    int32_t idx;                /* call index of the matrix */
    bool live;                  /* the block exists (dead lanes still shuffle) */
};

__device__ __forceinline__ mx_at mx_locate(const mx_piece &p, int64_t task, unsigned g,
                                           unsigned sub)
{
    mx_at a;
    uint32_t blk = (uint32_t)((task - p.first) * MX_TASK + g);
    a.live = blk < p.blocks;
    if (!a.live)
        blk = 0;
    uint32_t r = mx_divide(p.div_nb, blk), bc = blk - r * p.nb;
    uint32_t mi = mx_divide(p.div_n, r), row = r - mi * p.n;
    a.col = (int64_t)bc * 32 + sub * 8;
    a.xo = mi * p.xsm + row * p.xs0;
    a.qo = mi * p.qsm + row * p.qs0;
    a.so = mi * p.ssm + row * p.ss0 + bc * p.ss1;
    a.idx = p.idx + (int32_t)mi;
    return a;
}

/* The lane's place one task on (task + 1, same piece): the next 8 blocks
 * of its row where the row has them (no division, no offsets to
 * multiply), else located afresh. */
__device__ __forceinline__ mx_at mx_next(const mx_piece &p, const mx_at &a, int64_t task,
                                         unsigned g, unsigned sub)
{
    if (a.live && (uint32_t)(a.col >> 5) + MX_TASK < p.nb) {
        mx_at b = a;
        b.col += MX_TASK * 32;
        b.so += MX_TASK * p.ss1;
        return b;
    }
    return mx_locate(p, task, g, sub);
}

__device__ __forceinline__ float mx_decode(const char *p, int kind)
{
    if (kind == 0)
        return *(const float *)p;
    return refit_mf_half_to_f32(*(const uint16_t *)p, kind);
}

/* The lane's 8 elements (0 past the row's end, or for a dead lane). */
__device__ __forceinline__ void mx_load(const mx_piece &p, const mx_at &a, float v[8])
{
    int64_t es = p.kind == 0 ? 4 : 2;
    if (a.live && p.vx && a.col + 8 <= p.k) {
        const char *at = p.x + (a.xo + a.col) * es;
        if (p.kind == 0) {
            float4 lo = *(const float4 *)at, hi = *(const float4 *)(at + 16);
            v[0] = lo.x; v[1] = lo.y; v[2] = lo.z; v[3] = lo.w;
            v[4] = hi.x; v[5] = hi.y; v[6] = hi.z; v[7] = hi.w;
        } else {
            uint4 w = *(const uint4 *)at;
            v[0] = refit_mf_pair_to_f32(w.x, 0, p.kind);
            v[1] = refit_mf_pair_to_f32(w.x, 1, p.kind);
            v[2] = refit_mf_pair_to_f32(w.y, 0, p.kind);
            v[3] = refit_mf_pair_to_f32(w.y, 1, p.kind);
            v[4] = refit_mf_pair_to_f32(w.z, 0, p.kind);
            v[5] = refit_mf_pair_to_f32(w.z, 1, p.kind);
            v[6] = refit_mf_pair_to_f32(w.w, 0, p.kind);
            v[7] = refit_mf_pair_to_f32(w.w, 1, p.kind);
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < 8; u++) {
        v[u] = 0.0f;
        if (a.live && a.col + u < p.k)
            v[u] = mx_decode(p.x + (a.xo + (a.col + u) * p.xs1) * es, p.kind);
    }
}

/* The block's amax bits, in its 4 lanes (lanes 4j .. 4j+3 of a warp). */
__device__ __forceinline__ uint32_t mx_amax4(const float v[8])
{
    uint32_t m = 0;
#pragma unroll
    for (int u = 0; u < 8; u++)
        m = max(m, __float_as_uint(v[u]) & 0x7fffffffu);
    m = max(m, (uint32_t)__shfl_xor_sync(0xffffffffu, m, 1));
    return max(m, (uint32_t)__shfl_xor_sync(0xffffffffu, m, 2));
}

/* The E8M0 scale of a finite amax (kern_mx_scale_e8m0). A zero or
 * subnormal amax has floor(log2) < -126, so the low clamp gives code 0 for
 * every element format (emax >= 1). */
__device__ __forceinline__ uint32_t mx_scale(uint32_t amax, int emax)
{
    if (amax < 0x00800000u)
        return 0;
    int e = (int)(amax >> 23) - 127 - emax;
    e = e < -127 ? -127 : e > 127 ? 127 : e;
    return (uint32_t)(e + 127);
}

/* The hardware conversion of two finite floats: lo in the low byte. */
__device__ __forceinline__ uint32_t mx_cvt2(float lo, float hi)
{
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

/* Encode and store the lane's 8 elements with scale s; lane 0 of the 4
 * stores s. fp4: E2M1 codes, two a byte, low nibble first. */
template <int FP4>
__device__ __forceinline__ void mx_store(const mx_piece &p, const mx_at &a, const float v[8],
                                         uint32_t s, unsigned sub, int hw)
{
    /* 1 / X = 2^(127 - s), exact (2^-127 is an f32 subnormal) */
    float inv = __uint_as_float(s < 254u ? (254u - s) << 23 : 0x00400000u);
    uint32_t lo = 0, hi = 0;
    if (!FP4 && hw) {
#pragma unroll
        for (int u = 0; u < 8; u += 2) {
            uint32_t two = mx_cvt2(__fmul_rn(v[u], inv), __fmul_rn(v[u + 1], inv));
            if (u < 4)
                lo |= two << (8 * u);
            else
                hi |= two << (8 * (u - 4));
        }
    } else {
#pragma unroll
        for (int u = 0; u < 8; u++) {
            float w = __fmul_rn(v[u], inv);
            uint32_t b = __float_as_uint(w), m = b & 0x7fffffffu;
            uint32_t code = FP4 ? (mx_e2m1_code(m, __uint_as_float(m)) | (b >> 28 & 8u))
                                : (mx_e4m3_code(m, __uint_as_float(m)) | (b >> 24 & 0x80u));
            if (FP4)
                lo |= code << (4 * u);
            else if (u < 4)
                lo |= code << (8 * u);
            else
                hi |= code << (8 * (u - 4));
        }
    }
    if (sub == 0)
        p.s[a.so] = (unsigned char)s;
    if (FP4) {
        /* the lane's bytes: (col/2) .. +3 of the row's ceil(k/2); elements
         * past k were zeros, so a trailing high nibble is 0 */
        int64_t b0 = a.col / 2, nbytes = (p.k + 1) / 2;
        if (p.vq && b0 + 4 <= nbytes) {
            *(uint32_t *)(p.q + a.qo + b0) = lo;
            return;
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (b0 + j < nbytes)
                p.q[a.qo + b0 + j] = (unsigned char)(lo >> (8 * j));
        return;
    }
    if (p.vq && a.col + 8 <= p.k) {
        uint2 w;
        w.x = lo;
        w.y = hi;
        *(uint2 *)(p.q + a.qo + a.col) = w;
        return;
    }
#pragma unroll
    for (int u = 0; u < 8; u++)
        if (a.col + u < p.k)
            p.q[a.qo + (a.col + u) * p.qs1] = (unsigned char)((u < 4 ? lo : hi) >> (8 * (u & 3)));
}

/* Scale and elements of one lane's share of a block, from its values. */
template <int FP4>
__device__ __forceinline__ void mx_finish(const mx_piece &p, const mx_at &a, const float v[8],
                                          unsigned sub, int hw, unsigned int *status)
{
    uint32_t m = mx_amax4(v);
    if (!a.live)
        return;
    if (m > MX_FINITE_MAX) {
        if (sub == 0)
            atomicMin(status, (unsigned int)a.idx);
        return;
    }
    mx_store<FP4>(p, a, v, mx_scale(m, FP4 ? 2 : 8), sub, hw);
}

/* The piece holding task t, from a guess at or below it. */
template <class BATCH>
__device__ __forceinline__ int mx_find(const BATCH &B, int i, int64_t t)
{
    while (i + 1 < B.np && t >= B.p[i + 1].first)
        i++;
    return i;
}

/* Grid-stride over pairs of adjacent tasks, a pair per warp at once (their
 * loads in flight together; the second mostly found from the first by
 * mx_next). Every lane of a warp runs every shuffle: the task and its
 * piece are the warp's; only `live` differs between lanes. MODE: bit 0
 * MXFP4, bit 1 the short parameter block (one template argument: the
 * emulator's launch macro takes the kernel as one macro argument). */
template <int MODE>
__device__ __forceinline__ void
k_mx(const MX_PARAMS(MODE) &B,
     unsigned int *status)
{
    constexpr int FP4 = MODE & 1;
    unsigned lane = threadIdx.x & 31u, g = lane >> 2, sub = lane & 3u;
    int64_t nw = (int64_t)gridDim.x * MX_WARPS;
    int i = 0;
    for (int64_t t = ((int64_t)blockIdx.x * MX_WARPS + threadIdx.x / 32) * 2; t < B.end;
         t += 2 * nw) {
        int64_t t2 = t + 1;
        bool two = t2 < B.end;
        i = mx_find(B, i, t);
        int i2 = two ? mx_find(B, i, t2) : i;
        mx_at a = mx_locate(B.p[i], t, g, sub), a2;
        float v[8], v2[8];
        mx_load(B.p[i], a, v);
        if (two) {
            a2 = i2 == i ? mx_next(B.p[i], a, t2, g, sub) : mx_locate(B.p[i2], t2, g, sub);
            mx_load(B.p[i2], a2, v2);
        }
        mx_finish<FP4>(B.p[i], a, v, sub, B.hw, status);
        if (two)
            mx_finish<FP4>(B.p[i2], a2, v2, sub, B.hw, status);
        i = i2;
    }
}

/* ---- the dense path ----
 *
 * For a BF16 piece whose blocks lie in "lines" of contiguous memory: rows
 * contiguous (or whole matrices, or a whole stack, where rows follow one
 * another), 16-byte aligned x, 8-byte (MXFP8) or 4-byte (MXFP4) aligned
 * q, contiguous scales, k a multiple of 32. A warp takes "units", up to
 * MXD_SEGS consecutive 512-byte segments of a line (8 blocks each): lane
 * l loads the 16 bytes at 16 l of every segment, all before any is used
 * (64 bytes a lane in flight), so lane l holds elements 8(l & 3) .. +7
 * of block l / 4 of each segment. Each warp takes a contiguous run of a
 * launch's units (`chunk` of them): its place is found (the piece, one
 * multiply-shift division for the line) where the run starts and where it
 * crosses into another line or piece; from one unit to the next its
 * pointers step by constants. The amax is taken on the raw magnitude
 * bits, two elements at a time, the NaN/infinity test is one compare of
 * the block's amax, the scale comes from its exponent bits, and BF16 ->
 * f32 is a shift or a mask. A line's last unit may be short: its blocks
 * past the line's end are dead (no load, no store). Refusal is the
 * general path's: a non-finite block is left unwritten and its matrix's
 * call index atomicMin'd into the status word. */

/* The block's BF16 amax magnitude bits, in its 4 lanes. */
__device__ __forceinline__ uint32_t mxd_amax(uint4 w)
{
    uint32_t m = __vmaxu2(__vmaxu2(w.x & 0x7fff7fffu, w.y & 0x7fff7fffu),
                          __vmaxu2(w.z & 0x7fff7fffu, w.w & 0x7fff7fffu));
    m = max(m & 0xffffu, m >> 16);
    m = max(m, (uint32_t)__shfl_xor_sync(0xffffffffu, m, 1));
    return max(m, (uint32_t)__shfl_xor_sync(0xffffffffu, m, 2));
}

/* The codes of a word's two BF16 elements times inv (the low element's
 * code in the low byte (MXFP8) or nibble (MXFP4)). */
template <int FP4, int HW>
__device__ __forceinline__ uint32_t mxd_code2(uint32_t w, float inv)
{
    float lo = __fmul_rn(__uint_as_float(w << 16), inv);
    float hi = __fmul_rn(__uint_as_float(w & 0xffff0000u), inv);
    if (!FP4 && HW)
        return mx_cvt2(lo, hi);
    uint32_t bl = __float_as_uint(lo), bh = __float_as_uint(hi);
    uint32_t ml = bl & 0x7fffffffu, mh = bh & 0x7fffffffu;
    if (FP4)
        return (mx_e2m1_code(ml, __uint_as_float(ml)) | (bl >> 28 & 8u)) |
               (mx_e2m1_code(mh, __uint_as_float(mh)) | (bh >> 28 & 8u)) << 4;
    return (mx_e4m3_code(ml, __uint_as_float(ml)) | (bl >> 24 & 0x80u)) |
           (mx_e4m3_code(mh, __uint_as_float(mh)) | (bh >> 24 & 0x80u)) << 8;
}

/* MXFP4 by table. Where a block's scale s is 3 or more (amax >= 2^-122),
 * x * 2^(127-s) needs no multiply: its BF16 bits are x's magnitude bits
 * plus (127 - s) << 7 wherever the product is 0.25 or more (x normal, the
 * product normal; a subnormal x then gives less than 0.25, as the product
 * is), and every E2M1 code of a product below 8 is a function of those
 * bits from 0.25 (0x3e80) on: MXD_LUT entries, made by the encoder above
 * (mx_e2m1_code), and one more, 0, for anything below 0.25 (its index
 * wraps past the table's end and is clamped there). The table is kept
 * twice, the second copy shifted to the high nibble. */
#define MXD_LUT 640
#define MXD_HI (MXD_LUT + 1)      /* the high-nibble copy */

/* The byte of a word's two BF16 magnitudes, d = ((127 - s) << 7) - 0x3e80:
 * the low element's code in the low nibble; sign bits clear. */
__device__ __forceinline__ uint32_t mxd_e2m1_2(const unsigned char *lut, uint32_t w, int32_t d)
{
    uint32_t lo = min((uint32_t)((int32_t)(w & 0x7fffu) + d), (uint32_t)MXD_LUT);
    uint32_t hi = min((uint32_t)((int32_t)((w >> 16) & 0x7fffu) + d), (uint32_t)MXD_LUT);
    return lut[lo] | lut[MXD_HI + hi];
}

/* The sign bits of a lane's 8 BF16 elements where its MXFP4 bytes want
 * them (bit 3 of element e's nibble): element 2b+1's sign is the top bit
 * of byte 3 of word b, element 2b's of byte 1; gather those bytes into
 * byte b. */
__device__ __forceinline__ uint32_t mxd_e2m1_signs(uint4 w)
{
    uint32_t p = __byte_perm(w.x, w.y, 0x7531), q = __byte_perm(w.z, w.w, 0x7531);
    uint32_t odd = __byte_perm(p, q, 0x7531), even = __byte_perm(p, q, 0x6420);
    return (odd & 0x80808080u) | (even & 0x80808080u) >> 4;
}

template <class BATCH>
__device__ __forceinline__ int mxd_find(const BATCH &B, int i, int64_t u)
{
    while (i + 1 < B.np && u >= B.p[i + 1].first)
        i++;
    return i;
}

/* Where unit u of piece p is: its line and first block. */
template <int SEGS>
__device__ __forceinline__ void mxd_place(const mxd_piece &p, int64_t u, uint32_t *line,
                                          uint32_t *b0)
{
    uint32_t pu = (uint32_t)(u - p.first);
    *line = mx_divide(p.div_upl, pu);
    *b0 = (pu - *line * p.upl) * (SEGS * 8);
}

/* Ask L2 for the n bytes at p (16-byte aligned, n a multiple of 16) with
 * one instruction and no register waiting: the next unit's loads then
 * meet L2, and a warp has twice its registers' worth of x in flight. */
__device__ __forceinline__ void mxd_prefetch(const char *p, unsigned n)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
#else
    (void)p; /* the emulator: nothing to warm */
    (void)n;
#endif
}

/* The call index of the matrix holding block 8 j + g of unit u of piece i:
 * what a non-finite block reports. */
template <int SEGS, class BATCH>
__device__ __noinline__ void mxd_refuse(const BATCH &B, int i, int64_t u, uint32_t blk,
                                        unsigned int *status)
{
    const mxd_piece &p = B.p[i];
    uint32_t line, b0;
    mxd_place<SEGS>(p, u, &line, &b0);
    atomicMin(status, (unsigned int)(p.idx + (int32_t)((line * p.len + b0 + blk) / p.bpm)));
}

/* Scales and elements of one unit from its loaded words w; FULL: every
 * block of the unit is in the line (no test a block). */
template <int FP4, int HW, int SEGS, bool FULL, class BATCH>
__device__ __forceinline__ void mxd_unit(const BATCH &B, int i, int64_t u, const uint4 *w,
                                         uint32_t left, unsigned char *ql, unsigned char *sl,
                                         const unsigned char *lut, unsigned int *status)
{
    constexpr int QB = FP4 ? 16 : 32; /* q bytes of a block */
    constexpr int EMAX = FP4 ? 2 : 8; /* the element format's largest exponent */
    unsigned lane = threadIdx.x & 31u, g = lane >> 2, sub = lane & 3u;
#pragma unroll
    for (int j = 0; j < SEGS; j++) {
        uint32_t m = mxd_amax(w[j]);
        if (!FULL && 8u * j + g >= left)
            continue;
        if (m >= 0x7f80u) { /* NaN or infinity: the block stays unwritten */
            if (sub == 0)
                mxd_refuse<SEGS>(B, i, u, 8u * j + g, status);
            continue;
        }
        /* kern_mx_scale_e8m0 on a finite BF16 amax: its exponent less
         * emax, 0 at least (a zero or subnormal amax: 0) */
        int32_t s = (int32_t)(m >> 7) - EMAX;
        s = s > 0 ? s : 0;
        if (sub == 0)
            sl[8 * j] = (unsigned char)s;
        if (FP4 && s >= 3) {
            int32_t d = (127 - s) * 128 - 0x3e80;
            uint32_t c0 = mxd_e2m1_2(lut, w[j].x, d), c1 = mxd_e2m1_2(lut, w[j].y, d);
            uint32_t c2 = mxd_e2m1_2(lut, w[j].z, d), c3 = mxd_e2m1_2(lut, w[j].w, d);
            uint32_t c = __byte_perm(__byte_perm(c0, c1, 0x0040), __byte_perm(c2, c3, 0x0040),
                                     0x5410);
            *(uint32_t *)(ql + 8 * QB * j) = c | mxd_e2m1_signs(w[j]);
            continue;
        }
        float inv = __uint_as_float((uint32_t)(254 - s) << 23); /* 2^(127 - s) */
        uint32_t c0 = mxd_code2<FP4, HW>(w[j].x, inv), c1 = mxd_code2<FP4, HW>(w[j].y, inv);
        uint32_t c2 = mxd_code2<FP4, HW>(w[j].z, inv), c3 = mxd_code2<FP4, HW>(w[j].w, inv);
        if (FP4) {
            *(uint32_t *)(ql + 8 * QB * j) = c0 | c1 << 8 | c2 << 16 | c3 << 24;
        } else {
            uint2 o;
            o.x = c0 | c1 << 16;
            o.y = c2 | c3 << 16;
            *(uint2 *)(ql + 8 * QB * j) = o;
        }
    }
}

/* MODE: bit 0 MXFP4, bit 1 the short parameter block, bit 2 E4M3 by the
 * conversion instruction. */
template <int MODE>
__device__ __forceinline__ void
k_mxd(const MXD_PARAMS(MODE) &B,
      unsigned int *status)
{
    constexpr int FP4 = MODE & 1, HW = (MODE >> 2) & 1;
    constexpr int QB = FP4 ? 16 : 32; /* q bytes of a block */
    constexpr int SEGS = MXD_SEGS(MODE), UNIT = SEGS * 8;
    unsigned lane = threadIdx.x & 31u, g = lane >> 2;
    __shared__ unsigned char lut[2 * MXD_HI];
    if (FP4) {
        for (unsigned t = threadIdx.x; t <= MXD_LUT; t += MX_THREADS) {
            uint32_t a = (0x3e80u + t) << 16;
            uint32_t c = t < MXD_LUT ? mx_e2m1_code(a, __uint_as_float(a)) : 0;
            lut[t] = (unsigned char)c;
            lut[MXD_HI + t] = (unsigned char)(c << 4);
        }
        __syncthreads();
    }
    int64_t u = ((int64_t)blockIdx.x * MX_WARPS + threadIdx.x / 32) * B.chunk;
    int64_t uend = u + B.chunk < B.end ? u + B.chunk : B.end, stop = u;
    int i = 0;
    const char *xl = NULL;
    unsigned char *ql = NULL, *sl = NULL;
    uint32_t left = 0; /* blocks of the line from the unit's first */
    for (; u < uend; u++) {
        if (u == stop) { /* a new line or piece: find its place */
            i = mxd_find(B, i, u);
            const mxd_piece &p = B.p[i];
            uint32_t line, b0;
            mxd_place<SEGS>(p, u, &line, &b0);
            stop = u + (p.upl - b0 / UNIT);
            left = p.len - b0;
            xl = p.x + line * p.xp + (int64_t)b0 * 64 + lane * 16;
            ql = p.q + line * p.qp + (int64_t)b0 * QB + lane * (QB / 4);
            sl = p.s + line * p.sp + b0 + g;
        }
        uint4 w[SEGS];
        if (left >= UNIT) {
            /* the next unit, if this warp takes it and it is whole */
            if (lane == 0 && u + 1 < stop && u + 1 < uend && left >= 2 * UNIT)
                mxd_prefetch(xl + UNIT * 64, UNIT * 64);
#pragma unroll
            for (int j = 0; j < SEGS; j++)
                w[j] = __ldcs((const uint4 *)(xl + 512 * j));
            mxd_unit<FP4, HW, SEGS, true>(B, i, u, w, left, ql, sl, lut, status);
        } else {
#pragma unroll
            for (int j = 0; j < SEGS; j++)
                w[j] = 8u * j + g < left ? __ldcs((const uint4 *)(xl + 512 * j))
                                         : make_uint4(0, 0, 0, 0);
            mxd_unit<FP4, HW, SEGS, false>(B, i, u, w, left, ql, sl, lut, status);
        }
        xl += UNIT * 64;
        ql += UNIT * QB;
        sl += UNIT;
        left -= UNIT;
    }
}

/* ---- the kernels mx_launch.c looks up by name ---- */

#define MX_KERNEL(MODE)                                                                \
    extern "C" __global__ void __launch_bounds__(MX_THREADS, MX_CTAS_PER_SM)           \
        mx_##MODE(const __grid_constant__ MX_PARAMS(MODE) B, unsigned int *status)     \
    {                                                                                  \
        k_mx<MODE>(B, status);                                                         \
    }
#define MXD_KERNEL(MODE)                                                               \
    extern "C" __global__ void __launch_bounds__(MX_THREADS, MX_CTAS_PER_SM)           \
        mxd_##MODE(const __grid_constant__ MXD_PARAMS(MODE) B, unsigned int *status)   \
    {                                                                                  \
        k_mxd<MODE>(B, status);                                                        \
    }
MX_KERNEL(0)
MX_KERNEL(1)
MX_KERNEL(2)
MX_KERNEL(3)
MXD_KERNEL(0)
MXD_KERNEL(1)
MXD_KERNEL(4)
MXD_KERNEL(2)
MXD_KERNEL(3)
MXD_KERNEL(6)
