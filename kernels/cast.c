/* Float conversions on floats; the algorithms are in cast_bits.h. */
#include <string.h>

#include "cast.h"
#include "cast_bits.h"

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

float kern_f16_to_f32(uint16_t h)
{
    return bits_f32(kern_bits_f16_to_f32(h));
}

uint16_t kern_f32_to_f16(float f)
{
    return kern_bits_f32_to_f16(f32_bits(f));
}

float kern_bf16_to_f32(uint16_t b)
{
    return bits_f32(kern_bits_bf16_to_f32(b));
}

uint16_t kern_f32_to_bf16(float f)
{
    return kern_bits_f32_to_bf16(f32_bits(f));
}
