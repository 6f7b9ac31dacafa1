/* The reference kernels' small float codecs (minifloat.h): the format
 * SDK's arithmetic (include/refit/sdk/minifloat.h, which says how each
 * format rounds), compiled once for refit's host code, its tests and the
 * CPU emulator of the device kernels, which link these names. Bit-exact
 * with ml_dtypes' astype, which tests/quant checks exhaustively. */
#include <refit/sdk/minifloat.h>

#include "minifloat.h"

float kern_e4m3_to_f32(uint8_t v) { return refit_mf_e4m3_to_f32(v); }
uint8_t kern_f32_to_e4m3(float f) { return refit_mf_f32_to_e4m3(f); }
uint8_t kern_f32_to_e4m3_sat(float f) { return refit_mf_f32_to_e4m3_sat(f); }

float kern_e5m2_to_f32(uint8_t v) { return refit_mf_e5m2_to_f32(v); }
uint8_t kern_f32_to_e5m2(float f) { return refit_mf_f32_to_e5m2(f); }
uint8_t kern_f32_to_e5m2_sat(float f) { return refit_mf_f32_to_e5m2_sat(f); }

float kern_e8m0_to_f32(uint8_t v) { return refit_mf_e8m0_to_f32(v); }
uint8_t kern_f32_to_e8m0(float f) { return refit_mf_f32_to_e8m0(f); }

float kern_e2m1_to_f32(uint8_t nibble) { return refit_mf_e2m1_to_f32(nibble); }
uint8_t kern_f32_to_e2m1(float f) { return refit_mf_f32_to_e2m1(f); }
