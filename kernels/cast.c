/* Float conversions on floats: the format SDK's (refit/sdk/minifloat.h),
 * the same code the CUDA kernels compile (kernels/copy.cu). */
#include <refit/sdk/minifloat.h>

#include "cast.h"

float kern_f16_to_f32(uint16_t h) { return refit_mf_f16_to_f32(h); }
uint16_t kern_f32_to_f16(float f) { return refit_mf_f32_to_f16(f); }
float kern_bf16_to_f32(uint16_t b) { return refit_mf_bf16_to_f32(b); }
uint16_t kern_f32_to_bf16(float f) { return refit_mf_f32_to_bf16(f); }
