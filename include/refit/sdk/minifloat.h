/* refit format SDK: the small float arithmetic quantized formats share,
 * header-only, for a plugin's host code (C or C++) and its device code
 * (a .cu compiled by nvcc, where every function is __host__ __device__).
 * The in-tree formats and refit's reference kernels use exactly these, so a
 * plugin built on them rounds as refit does, bit for bit.
 *
 *   E4M3  float8_e4m3fn: bias 7, no infinities, 0x7f/0xff NaN, max 448.
 *   UE4M3 the unsigned E4M3 block scales of NVFP4: non-negative inputs,
 *         codes 0x00..0x7e (refit_mf_ue4m3_sat, refit_mf_ue4m3_to_f32: what
 *         the E4M3 functions give there, in fewer instructions).
 *   E5M2  float8_e5m2: bias 15, IEEE-like, max 57344.
 *   E8M0  float8_e8m0fnu: unsigned power of two 2^(v-127), 0xff NaN.
 *   E2M1  float4_e2m1fn: 4 bits (sign bit 3) 0, .5, 1, 1.5, 2, 3, 4, 6.
 *   F16 and BF16 to and from F32, on raw bits.
 *
 * Encoders round to nearest, ties to even (E8M0: ties away from zero) and
 * follow ml_dtypes' astype, which refit's tests check exhaustively:
 *
 *             NaN         +-Inf        overflow      saturating (_sat)
 *   E4M3      0x7f|s      0x7f|s (NaN) 0x7f|s (NaN)  +-448   (Inf too)
 *   E5M2      0x7e|s      0x7c|s       0x7c|s (Inf)  +-57344 (Inf too)
 *   E2M1      0x8 / 0x0*  +-6          +-6           (always saturates)
 *   E8M0      0xff        0xff         0xff          -
 *   F16       quiet, top payload bits kept; overflow to infinity
 *   BF16      quiet (bit 6 set), payload kept; overflow to infinity
 *
 * (*) ml_dtypes' float4_e2m1fn has no NaN; a NaN input becomes the pattern
 * of its "quiet NaN" constant, -0 (0x8), negated for a negative NaN (0x0).
 * E8M0 has no sign and no zero: negatives, zeros, Inf and NaN encode to
 * 0xff. It rounds to the nearer power of two, ties up (x >= 1.5 * 2^e goes
 * up), f32 subnormals included: below 1.5 * 2^-127 to 2^-127 (0x00), from
 * there to 2^-126 (0x01), as ml_dtypes 0.7 does.
 *
 * REFIT_HD marks a function for host and device (static inline in C), for
 * a plugin's own helpers shared the same way. */
#ifndef REFIT_SDK_MINIFLOAT_H
#define REFIT_SDK_MINIFLOAT_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define REFIT_HD static __host__ __device__ __forceinline__
#else
#define REFIT_HD static inline
#endif

/* The element kinds of a float source (refit/sdk/pgpu.h's
 * refit_pgpu_float_kind gives them for a refit_dtype). */
enum { REFIT_MF_F32 = 0, REFIT_MF_F16 = 1, REFIT_MF_BF16 = 2 };

/* ---- f32 bits ---- */

REFIT_HD uint32_t refit_mf_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

REFIT_HD float refit_mf_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* ---- rounding ---- */

/* m >> shift rounded to nearest, ties to even, for a shift of 1 to 31. */
REFIT_HD uint32_t refit_mf_round_rne(uint32_t m, unsigned shift)
{
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u)))
        r++;
    return r;
}

/* The same for any shift: m < 2^24 where the shift passes 25, so any such
 * shift leaves less than half a unit: zero. */
REFIT_HD uint32_t refit_mf_shift_rne(uint32_t m, unsigned shift)
{
    if (shift == 0)
        return m;
    if (shift > 25)
        return 0;
    return refit_mf_round_rne(m, shift);
}

/* Magnitude code (exponent field << man_bits | mantissa) of the finite,
 * non-negative f32 with bits a, in a format of man_bits mantissa bits and
 * exponent bias `bias`, rounded to nearest even: for a destination normal
 * the exponent is rebiased and the mantissa rounded off (a carry out of
 * the mantissa bumps the exponent, as it should); for a destination
 * subnormal the full significand is shifted to the subnormal unit. Not
 * bounded: the caller maps codes past its largest finite. Needs
 * 1 - bias > -126 (no destination normal is an f32 subnormal). */
REFIT_HD uint32_t refit_mf_encode_mag(uint32_t a, unsigned man_bits, int bias)
{
    int e = (int)(a >> 23);
    uint32_t code;
    if (e >= 128 - bias) { /* destination normal: e - 127 >= 1 - bias */
        code = refit_mf_shift_rne(a - ((uint32_t)(127 - bias) << 23), 23 - man_bits);
    } else {
        uint32_t sig = a & 0x7fffffu;
        if (e == 0) /* f32 subnormal: the scale of e == 1 without the hidden bit */
            e = 1;
        else
            sig |= 0x800000u;
        /* value = sig * 2^(e-150); destination unit = 2^(1-bias-man_bits) */
        code = refit_mf_shift_rne(sig, (unsigned)(151 - bias - (int)man_bits - e));
    }
    return code;
}

/* ---- E4M3 (float8_e4m3fn) ---- */

REFIT_HD float refit_mf_e4m3_to_f32(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t exp = (v >> 3) & 0xfu;
    uint32_t man = v & 0x7u;

    if ((v & 0x7fu) == 0x7fu)
        return refit_mf_bits_f32(sign | 0x7fc00000u);
    if (exp == 0) /* subnormal: man * 2^-9, exact in f32 */
        return refit_mf_bits_f32(sign | refit_mf_f32_bits((float)man * 0x1p-9f));
    return refit_mf_bits_f32(sign | ((exp + 120u) << 23) | (man << 20));
}

/* E4M3 of f; saturate: past 448 and +-Inf to +-448, else to NaN. */
REFIT_HD uint8_t refit_mf_e4m3_encode(float f, int saturate)
{
    uint32_t x = refit_mf_f32_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t a = x & 0x7fffffffu;

    if (a > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    if (a == 0x7f800000u)
        return (uint8_t)(sign | (saturate ? 0x7eu : 0x7fu));
    uint32_t code = refit_mf_encode_mag(a, 3, 7);
    if (code > 0x7eu) /* past 448: no infinity in this format */
        return (uint8_t)(sign | (saturate ? 0x7eu : 0x7fu));
    return (uint8_t)(sign | code);
}

REFIT_HD uint8_t refit_mf_f32_to_e4m3(float f)
{
    return refit_mf_e4m3_encode(f, 0);
}

REFIT_HD uint8_t refit_mf_f32_to_e4m3_sat(float f)
{
    return refit_mf_e4m3_encode(f, 1);
}

/* UE4M3, an unsigned E4M3 block scale (NVFP4's): the code of a
 * non-negative, non-NaN f32 with bits a, saturating (infinity too) at 448;
 * refit_mf_f32_to_e4m3_sat on those inputs, in fewer instructions. */
REFIT_HD uint8_t refit_mf_ue4m3_sat(uint32_t a)
{
    if (a >= 0x7f800000u)
        return 0x7eu;
    uint32_t code = refit_mf_encode_mag(a, 3, 7);
    return (uint8_t)(code > 0x7eu ? 0x7eu : code);
}

/* The value of a UE4M3 code without NaN (0..0x7e). */
REFIT_HD float refit_mf_ue4m3_to_f32(uint32_t c)
{
    uint32_t exp = c >> 3, man = c & 7u;
    if (exp == 0)
        return (float)man * 0x1p-9f;
    return refit_mf_bits_f32(((exp + 120u) << 23) | (man << 20));
}

/* ---- E5M2 (float8_e5m2) ---- */

REFIT_HD float refit_mf_e5m2_to_f32(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t exp = (v >> 2) & 0x1fu;
    uint32_t man = v & 0x3u;

    if (exp == 0x1f)
        return refit_mf_bits_f32(sign | (man ? 0x7fc00000u : 0x7f800000u));
    if (exp == 0) /* subnormal: man * 2^-16 */
        return refit_mf_bits_f32(sign | refit_mf_f32_bits((float)man * 0x1p-16f));
    return refit_mf_bits_f32(sign | ((exp + 112u) << 23) | (man << 21));
}

/* E5M2 of f; saturate: past 57344 and +-Inf to +-57344, else to +-Inf. */
REFIT_HD uint8_t refit_mf_e5m2_encode(float f, int saturate)
{
    uint32_t x = refit_mf_f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    uint32_t a = x & 0x7fffffffu;

    if (a > 0x7f800000u)
        return sign | 0x7eu;
    if (a == 0x7f800000u)
        return sign | (saturate ? 0x7bu : 0x7cu);
    uint32_t code = refit_mf_encode_mag(a, 2, 15);
    if (code > 0x7bu) /* past 57344 */
        return sign | (saturate ? 0x7bu : 0x7cu);
    return sign | (uint8_t)code;
}

REFIT_HD uint8_t refit_mf_f32_to_e5m2(float f)
{
    return refit_mf_e5m2_encode(f, 0);
}

REFIT_HD uint8_t refit_mf_f32_to_e5m2_sat(float f)
{
    return refit_mf_e5m2_encode(f, 1);
}

/* ---- E8M0 (float8_e8m0fnu) ---- */

REFIT_HD float refit_mf_e8m0_to_f32(uint8_t v)
{
    if (v == 0xffu)
        return refit_mf_bits_f32(0x7fc00000u);
    if (v == 0) /* 2^-127 is an f32 subnormal */
        return refit_mf_bits_f32(0x00400000u);
    return refit_mf_bits_f32((uint32_t)v << 23);
}

REFIT_HD uint8_t refit_mf_f32_to_e8m0(float f)
{
    uint32_t x = refit_mf_f32_bits(f);

    if ((x & 0x80000000u) || x == 0 || x >= 0x7f800000u)
        return 0xffu;
    /* below 2^-126 (code 0x01): the midpoint 1.5 * 2^-127 = 0x00600000
     * goes up, everything below 2^-127 (no smaller code) to 0x00 */
    if (x < 0x00800000u)
        return x < 0x00600000u ? 0x00u : 0x01u;
    /* half a unit added to the exponent field: ties go up */
    uint32_t code = (x + 0x00400000u) >> 23;
    return code >= 0xffu ? 0xffu : (uint8_t)code;
}

/* ---- E2M1 (float4_e2m1fn), in the low nibble ---- */

REFIT_HD float refit_mf_e2m1_to_f32(uint8_t nibble)
{
    uint32_t m = nibble & 0x7u, sign = (uint32_t)(nibble & 0x8u) << 28;
    /* 0 and 0.5 are subnormal; the rest 2^(e-1) * (1 + m/2) */
    uint32_t mag = m < 2 ? m * 0x3f000000u : ((m >> 1) + 126u) << 23 | (m & 1u) << 22;
    return refit_mf_bits_f32(sign | mag);
}

REFIT_HD uint8_t refit_mf_f32_to_e2m1(float f)
{
    uint32_t x = refit_mf_f32_bits(f);
    uint8_t sign = (x & 0x80000000u) ? 0x8u : 0x0u;
    uint32_t a = x & 0x7fffffffu;

    if (a > 0x7f800000u) /* ml_dtypes: NaN becomes -0, a negative NaN +0 */
        return sign ^ 0x8u;
    if (a == 0x7f800000u)
        return sign | 0x7u;
    uint32_t code = refit_mf_encode_mag(a, 1, 1);
    return sign | (uint8_t)(code > 0x7u ? 0x7u : code);
}

/* ---- F16 and BF16 <-> F32, on raw bits ---- */

REFIT_HD uint32_t refit_mf_bits_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* inf / nan: keep the payload */
        return sign | 0x7f800000u | (man << 13);
    if (exp != 0)
        return sign | ((exp + 112) << 23) | (man << 13);
    if (man == 0)
        return sign;
    int e = -1; /* subnormal: normalise the mantissa */
    do {
        man <<= 1;
        e++;
    } while ((man & 0x400u) == 0);
    return sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
}

REFIT_HD uint16_t refit_mf_bits_f32_to_f16(uint32_t x)
{
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf, or nan made quiet */
        return sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0);
    if (a >= 0x477ff000u) /* >= 65520 rounds past the largest finite */
        return sign | 0x7c00u;
    if (a < 0x38800000u) { /* below 2^-14: an f16 subnormal or zero */
        uint32_t e = a >> 23;
        if (e < 102)
            return sign;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        return sign | (uint16_t)refit_mf_round_rne(m, 126 - e);
    }
    /* normal: rebias the exponent; a carry out of the mantissa is correct */
    return sign | (uint16_t)refit_mf_round_rne(a - (112u << 23), 13);
}

REFIT_HD uint32_t refit_mf_bits_bf16_to_f32(uint16_t b)
{
    return (uint32_t)b << 16;
}

REFIT_HD uint16_t refit_mf_bits_f32_to_bf16(uint32_t x)
{
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

REFIT_HD float refit_mf_f16_to_f32(uint16_t h)
{
    return refit_mf_bits_f32(refit_mf_bits_f16_to_f32(h));
}

REFIT_HD uint16_t refit_mf_f32_to_f16(float f)
{
    return refit_mf_bits_f32_to_f16(refit_mf_f32_bits(f));
}

REFIT_HD float refit_mf_bf16_to_f32(uint16_t b)
{
    return refit_mf_bits_f32(refit_mf_bits_bf16_to_f32(b));
}

REFIT_HD uint16_t refit_mf_f32_to_bf16(float f)
{
    return refit_mf_bits_f32_to_bf16(refit_mf_f32_bits(f));
}

/* A 16-bit element of kind REFIT_MF_F16 (else BF16) as f32, exactly. */
REFIT_HD float refit_mf_half_to_f32(uint16_t h, int kind)
{
    return refit_mf_bits_f32(kind == REFIT_MF_F16 ? refit_mf_bits_f16_to_f32(h)
                                                  : refit_mf_bits_bf16_to_f32(h));
}

/* Element hi (0: the low half, 1: the high) of a 32-bit word of two
 * 16-bit elements of kind REFIT_MF_F16 or BF16 (a vector load's lane). */
REFIT_HD float refit_mf_pair_to_f32(uint32_t w, int hi, int kind)
{
    return refit_mf_half_to_f32((uint16_t)(hi ? w >> 16 : w & 0xffffu), kind);
}

#endif
