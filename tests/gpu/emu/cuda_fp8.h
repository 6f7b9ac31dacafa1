/* cuda_fp8.h for the emulator: the pair conversion as documented (x.x in
 * the low byte, x.y in the high byte), each value by the CPU reference. */
#pragma once
#include "emu.h"

extern "C" uint8_t kern_f32_to_e4m3_sat(float f);

struct float2 {
    float x, y;
};
inline float2 make_float2(float a, float b) { return float2{a, b}; }
typedef unsigned short __nv_fp8x2_storage_t;
typedef enum { __NV_NOSAT, __NV_SATFINITE } __nv_saturation_t;
typedef enum { __NV_E4M3, __NV_E5M2 } __nv_fp8_interpretation_t;

inline __nv_fp8x2_storage_t __nv_cvt_float2_to_fp8x2(float2 v, __nv_saturation_t sat,
                                                     __nv_fp8_interpretation_t fmt)
{
    if (sat != __NV_SATFINITE || fmt != __NV_E4M3) {
        fprintf(stderr, "EMU: only the saturating E4M3 conversion is emulated\n");
        abort();
    }
    return (__nv_fp8x2_storage_t)(kern_f32_to_e4m3_sat(v.x) |
                                  (unsigned)kern_f32_to_e4m3_sat(v.y) << 8);
}
