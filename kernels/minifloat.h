/* Small float formats used by quantized checkpoints (OCP FP8 and MX specs):
 *   E4M3 (float8_e4m3fn: bias 7, no infinities, 0x7f/0xff NaN, max 448)
 *   E5M2 (float8_e5m2: bias 15, IEEE-like, max 57344)
 *   E8M0 (float8_e8m0fnu: unsigned power of two 2^(b-127), 0xff NaN)
 *   E2M1 (float4_e2m1fn: 4 bits, values 0, 0.5, 1, 1.5, 2, 3, 4, 6, signed)
 * Encoders round to nearest, ties to even. The *_sat encoders saturate
 * finite values beyond the largest, and +-inf, to +-max (quantization, as
 * clamp-then-cast and PTX cvt.satfinite do); the plain ones
 * follow ml_dtypes' astype semantics (overflow to NaN for E4M3, inf for
 * E5M2). NaN stays NaN. Bit-exact with ml_dtypes; the CUDA versions keep
 * these names with a _cuda suffix. */
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
