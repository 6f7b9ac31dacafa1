/* The F16/BF16 <-> F32 conversions on raw bits, shared by the host code
 * (kernels/cast.c) and the CUDA kernels (kernels/copy.cu): one algorithm,
 * so the two are bit-exact by construction. Round-to-nearest-even, NaN
 * kept quiet with its payload's top bits, overflow to infinity. */
#ifndef REFIT_KERNELS_CAST_BITS_H
#define REFIT_KERNELS_CAST_BITS_H

#include <stdint.h>

#ifdef __CUDACC__
#define KERN_HD __host__ __device__ __forceinline__
#else
#define KERN_HD static inline
#endif

KERN_HD uint32_t kern_bits_f16_to_f32(uint16_t h)
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

/* m >> shift rounded to nearest, ties to even. */
KERN_HD uint32_t kern_bits_shift_rne(uint32_t m, unsigned shift)
{
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u)))
        r++;
    return r;
}

KERN_HD uint16_t kern_bits_f32_to_f16(uint32_t x)
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
        return sign | (uint16_t)kern_bits_shift_rne(m, 126 - e);
    }
    /* normal: rebias the exponent; a carry out of the mantissa is correct */
    return sign | (uint16_t)kern_bits_shift_rne(a - (112u << 23), 13);
}

KERN_HD uint32_t kern_bits_bf16_to_f32(uint16_t b)
{
    return (uint32_t)b << 16;
}

KERN_HD uint16_t kern_bits_f32_to_bf16(uint32_t x)
{
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#endif
