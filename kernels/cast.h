/* Float conversions between F32, F16 and BF16, round-to-nearest-even. */
#ifndef REFIT_KERNELS_CAST_H
#define REFIT_KERNELS_CAST_H

#include <stdint.h>

float kern_f16_to_f32(uint16_t h);
uint16_t kern_f32_to_f16(float f);
float kern_bf16_to_f32(uint16_t b);
uint16_t kern_f32_to_bf16(float f);

#endif
