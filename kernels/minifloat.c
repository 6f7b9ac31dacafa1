/* Small float codecs (OCP FP8 E4M3/E5M2, OCP MX E8M0 and E2M1), bit-exact
 * with ml_dtypes' astype, which the tests check exhaustively.
 *
 * Encoding works on the magnitude bits of the f32 input: for a destination
 * normal, rebias the exponent and round the mantissa off (a carry out of
 * the mantissa correctly bumps the exponent); for a destination subnormal,
 * shift the full significand down to the subnormal unit. Both round to
 * nearest, ties to even. Special values and overflow are then mapped per
 * format, as ml_dtypes does:
 *
 *             NaN         +-Inf        overflow      saturating (_sat)
 *   E4M3      0x7f|s      0x7f|s (NaN) 0x7f|s (NaN)  +-448   (Inf too)
 *   E5M2      0x7e|s      0x7c|s       0x7c|s (Inf)  +-57344 (Inf too)
 *   E2M1      0x8 / 0x0*  +-6          +-6           (always saturates)
 *   E8M0      0xff        0xff         0xff          -
 *
 * (*) ml_dtypes' float4_e2m1fn has no NaN; a NaN input becomes the pattern
 * of its "quiet NaN" constant, which is -0 (0x8), negated for a NaN with
 * the sign bit set (0x0). We follow it so that tables agree bit for bit.
 *
 * E8M0 has no sign and no zero: negative numbers, zeros, Inf and NaN all
 * encode to 0xff (NaN). It rounds to the nearer power of two with ties
 * away from zero (x >= 1.5 * 2^e goes up), f32 subnormals included: below
 * 1.5 * 2^-127 they map to 2^-127 (0x00), from it up to 2^-126 (0x01), as
 * ml_dtypes 0.7 does (0.5 and 0.6 sent everything above 2^-127 up). Decoded NaNs are the canonical quiet NaN with the sign
 * of the input pattern. */
#include <string.h>

#include "minifloat.h"

#define F32_SIGN 0x80000000u
#define F32_INF 0x7f800000u
#define F32_QNAN 0x7fc00000u

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* m >> shift rounded to nearest, ties to even. m < 2^24 here, so any
 * shift of 25 or more leaves less than half a unit: zero. */
static uint32_t shift_rne(uint32_t m, unsigned shift)
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

/* Magnitude code (exponent field << man_bits | mantissa) of the finite,
 * non-negative f32 with bits a, in a format with man_bits mantissa bits
 * and exponent bias `bias`. Not bounded: the caller maps codes past the
 * format's largest finite to overflow. Requires 1 - bias > -126 (no
 * destination normal is an f32 subnormal), true for every format here. */
static uint32_t encode_mag(uint32_t a, unsigned man_bits, int bias)
{
    int e = (int)(a >> 23);
    uint32_t sig = a & 0x7fffffu;

    if (e - 127 >= 1 - bias) /* destination normal */
        return shift_rne(a - ((uint32_t)(127 - bias) << 23), 23 - man_bits);
    if (e == 0) /* f32 subnormal: same scale as e == 1 without the hidden bit */
        e = 1;
    else
        sig |= 0x800000u;
    /* value = sig * 2^(e-150); destination unit = 2^(1-bias-man_bits) */
    return shift_rne(sig, (unsigned)(151 - bias - (int)man_bits - e));
}

/* ---- E4M3 (float8_e4m3fn) ---- */

float kern_e4m3_to_f32(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t exp = (v >> 3) & 0xfu;
    uint32_t man = v & 0x7u;

    if ((v & 0x7fu) == 0x7fu)
        return bits_f32(sign | F32_QNAN);
    if (exp == 0) /* subnormal: man * 2^-9, exact in f32 */
        return bits_f32(sign | f32_bits((float)man * 0x1p-9f));
    return bits_f32(sign | ((exp + 120u) << 23) | (man << 20));
}

static uint8_t e4m3_encode(float f, int saturate)
{
    uint32_t x = f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    uint32_t a = x & ~F32_SIGN;

    if (a > F32_INF)
        return sign | 0x7fu;
    if (a == F32_INF)
        return sign | (saturate ? 0x7eu : 0x7fu);
    uint32_t code = encode_mag(a, 3, 7);
    if (code > 0x7eu) /* past 448: no infinity in this format */
        return sign | (saturate ? 0x7eu : 0x7fu);
    return sign | (uint8_t)code;
}

uint8_t kern_f32_to_e4m3(float f)
{
    return e4m3_encode(f, 0);
}

uint8_t kern_f32_to_e4m3_sat(float f)
{
    return e4m3_encode(f, 1);
}

/* ---- E5M2 (float8_e5m2) ---- */

float kern_e5m2_to_f32(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t exp = (v >> 2) & 0x1fu;
    uint32_t man = v & 0x3u;

    if (exp == 0x1f)
        return bits_f32(sign | (man ? F32_QNAN : F32_INF));
    if (exp == 0) /* subnormal: man * 2^-16 */
        return bits_f32(sign | f32_bits((float)man * 0x1p-16f));
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 21));
}

static uint8_t e5m2_encode(float f, int saturate)
{
    uint32_t x = f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    uint32_t a = x & ~F32_SIGN;

    if (a > F32_INF)
        return sign | 0x7eu;
    if (a == F32_INF)
        return sign | (saturate ? 0x7bu : 0x7cu);
    uint32_t code = encode_mag(a, 2, 15);
    if (code > 0x7bu) /* past 57344 */
        return sign | (saturate ? 0x7bu : 0x7cu);
    return sign | (uint8_t)code;
}

uint8_t kern_f32_to_e5m2(float f)
{
    return e5m2_encode(f, 0);
}

uint8_t kern_f32_to_e5m2_sat(float f)
{
    return e5m2_encode(f, 1);
}

/* ---- E8M0 (float8_e8m0fnu) ---- */

float kern_e8m0_to_f32(uint8_t v)
{
    if (v == 0xffu)
        return bits_f32(F32_QNAN);
    if (v == 0) /* 2^-127 is an f32 subnormal */
        return bits_f32(0x00400000u);
    return bits_f32((uint32_t)v << 23);
}

uint8_t kern_f32_to_e8m0(float f)
{
    uint32_t x = f32_bits(f);

    if ((x & F32_SIGN) || x == 0 || x >= F32_INF)
        return 0xffu;
    /* An f32 subnormal lies below 2^-126 (code 0x01); the smallest code,
     * 0x00, is 2^-127 = 0x00400000. Nearest in value, ties up, as for the
     * normals: the midpoint 1.5 * 2^-127 = 0x00600000 goes to 0x01, and
     * everything below 2^-127 (no code is smaller) to 0x00. */
    if (x < 0x00800000u)
        return x < 0x00600000u ? 0x00u : 0x01u;
    /* half a unit added to the exponent field: ties go up */
    uint32_t code = (x + 0x00400000u) >> 23;
    return code >= 0xffu ? 0xffu : (uint8_t)code;
}

/* ---- E2M1 (float4_e2m1fn) ---- */

float kern_e2m1_to_f32(uint8_t nibble)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[nibble & 0x7u];
    return (nibble & 0x8u) ? -v : v;
}

uint8_t kern_f32_to_e2m1(float f)
{
    uint32_t x = f32_bits(f);
    uint8_t sign = (x & F32_SIGN) ? 0x8u : 0x0u;
    uint32_t a = x & ~F32_SIGN;

    if (a > F32_INF) /* ml_dtypes: NaN becomes -0, a negative NaN +0 */
        return sign ^ 0x8u;
    if (a == F32_INF)
        return sign | 0x7u;
    uint32_t code = encode_mag(a, 1, 1);
    return sign | (uint8_t)(code > 0x7u ? 0x7u : code);
}
