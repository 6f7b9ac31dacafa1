/* Small float formats used by quantized checkpoints (OCP FP8 and MX specs),
 * as functions for refit's host code and tests: E4M3 (float8_e4m3fn),
 * E5M2 (float8_e5m2), E8M0 (float8_e8m0fnu), E2M1 (float4_e2m1fn). The
 * arithmetic, and how each rounds, saturates and maps NaN, is the format
 * SDK's (include/refit/sdk/minifloat.h: refit_mf_*), which device code and
 * plugins include directly. Bit-exact with ml_dtypes. */
#ifndef REFIT_KERNELS_MINIFLOAT_H
#define REFIT_KERNELS_MINIFLOAT_H

#include <stdint.h>

float kern_e4m3_to_f32(uint8_t v);
uint8_t kern_f32_to_e4m3(float f);
uint8_t kern_f32_to_e4m3_sat(float f);

float kern_e5m2_to_f32(uint8_t v);
uint8_t kern_f32_to_e5m2(float f);
uint8_t kern_f32_to_e5m2_sat(float f);

/* E8M0 holds exponents only: 2^(v - 127); v == 0xff is NaN. */
float kern_e8m0_to_f32(uint8_t v);
/* Round to the nearest power of two as ml_dtypes does. */
uint8_t kern_f32_to_e8m0(float f);

/* E2M1 in the low nibble (sign bit 3). */
float kern_e2m1_to_f32(uint8_t nibble);
uint8_t kern_f32_to_e2m1(float f); /* saturates to +-6: the format has no NaN/inf;
                                      * NaN gives 0x8 (-0), -NaN 0x0, as ml_dtypes */

#endif
