// refit/sdk/minifloat.h compiles as C++ (a plugin's host C++ code, and the
// CPU emulator of the device kernels, tests/gpu/emu), warnings as errors.
#include <refit/sdk/minifloat.h>

int main()
{
    return refit_mf_f32_to_e4m3_sat(1.0f) == 0x38 && refit_mf_e8m0_to_f32(127) == 1.0f ? 0 : 1;
}
