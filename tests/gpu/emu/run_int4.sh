#!/bin/sh
# The CUDA INT4 quantization kernels (kernels/quant_int4.cu) and the kernel
# cases of their GPU test (tests/gpu/test_gpu_int4.c, built with
# REFIT_GPU_EMU: fewer, smaller shapes, no model cases) on the CPU, through
# the emulator in this folder (emu.h says what it checks and what it
# cannot):
#   sh tests/gpu/emu/run_int4.sh BUILD_DIR [WORK_DIR]
# BUILD_DIR: any meson build of refit (for librefit_kernels.a, the CPU
# reference); WORK_DIR (default BUILD_DIR/emu-int4) receives the objects.
# Needs g++, gcc and cmocka.
set -eu
B=$(cd "$1" && pwd)
W=${2:-$B/emu-int4}
R=$(cd "$(dirname "$0")/../../.." && pwd)
E=$R/tests/gpu/emu
mkdir -p "$W"
# kernel<<<grid, Q4_THREADS, 0, st>>>(args) -> EMU_LAUNCH(...); every
# vector and scalar access of the kernels through the alignment check
sed -E -e 's/(k_[a-z0-9_]+(<[0-9A-Z_ |]+>)?)<<<([^,]+), Q4_THREADS, 0, st>>>\((.*)\);/EMU_LAUNCH(\3, Q4_THREADS, \1, \4);/' \
  -e 's/\*\(const float4 \*\)\(a \+ 16\)/*EMU_AL(const float4, 16, a + 16)/' \
  -e 's/\*\(const float4 \*\)a/*EMU_AL(const float4, 16, a)/' \
  -e 's/\*\(const uint4 \*\)a/*EMU_AL(const uint4, 16, a)/' \
  -e 's/\*\(const float \*\)p/*EMU_AL(const float, 4, p)/' \
  -e 's/\*\(const uint16_t \*\)p/*EMU_AL(const uint16_t, 2, p)/' \
  -e 's/\*\((const )?uint32_t \*\)a/*EMU_AL(\1uint32_t, 4, a)/g' \
  -e 's/\*\((const )?uint16_t \*\)a/*EMU_AL(\1uint16_t, 2, a)/g' \
  -e 's/\*\(uint32_t \*\)\(p\.q/*EMU_AL(uint32_t, 4, p.q/' \
  "$R/kernels/quant_int4.cu" > "$W/quant_int4_emu.cc"
launches=$(grep -c 'EMU_LAUNCH(' "$W/quant_int4_emu.cc")
left=$(grep -c '<<<' "$W/quant_int4_emu.cc" || true)
raw=$(grep -cE '\*\((const )?(float4|uint4|float|uint16_t|uint32_t) \*\)' "$W/quant_int4_emu.cc" || true)
if [ "$left" != 0 ] || [ "$raw" != 0 ]; then
  echo "run_int4.sh: $left kernel launches, $raw accesses not rewritten" >&2
  exit 1
fi
echo "emulating $launches launch sites"
cat > "$W/stubs_int4.cc" <<'STUBS'
// What the emulated test links in place of the CUDA backend: one device.
#include <stdio.h>
static char err[256];
extern "C" const char *kern_cuda_last_error(void) { return err; }
extern "C" void kern_cuda_set_error(const char *m) { snprintf(err, sizeof err, "%s", m); }
extern "C" int backend_cuda_device_count(void) { return 1; }
extern "C" const char *backend_cuda_unavailable(void) { return ""; }
STUBS
# __fmul_rn, where emu.h lacks it: the IEEE multiply it is
extra=
if ! grep -q '__fmul_rn' "$E/emu.h"; then
  echo 'inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }' \
    > "$W/emu_int4_extra.h"
  extra="-include $W/emu_int4_extra.h"
fi
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -I"$E" -I"$R/include" -I"$R" $extra \
  -c "$W/quant_int4_emu.cc" -o "$W/quant_int4_emu.o"
g++ -std=c++17 -O1 -g -Wall -c "$W/stubs_int4.cc" -o "$W/stubs_int4.o"
gcc -std=c11 -D_GNU_SOURCE -DREFIT_GPU_EMU -O1 -g -Wall -Wextra -I"$E/c" -I"$R/include" -I"$R" \
  -c "$R/tests/gpu/test_gpu_int4.c" -o "$W/test_gpu_int4.o"
# the kernel tests' shared helpers (gpu_twin.c), over the emulator's runtime
gcc -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -I"$E/c" -I"$R/include" -I"$R" \
  -c "$R/tests/gpu/gpu_twin.c" -o "$W/gpu_twin.o"
g++ -o "$W/test-gpu-int4-emu" "$W/test_gpu_int4.o" "$W/gpu_twin.o" "$W/quant_int4_emu.o" "$W/stubs_int4.o" \
  "$B/librefit_kernels.a" -lcmocka -lm
"$W/test-gpu-int4-emu"
