#!/bin/sh
# The CUDA FP8 quantization kernels (plugins/fp8/quant_fp8.cu) and their GPU
# test (tests/gpu/test_gpu_quant.c) on the CPU, through the emulator in
# this folder (emu.h says what it checks and what it cannot):
#   sh tests/gpu/emu/run.sh BUILD_DIR [WORK_DIR]
# BUILD_DIR: any meson build of refit (for librefit_kernels.a, the CPU
# references); WORK_DIR (default BUILD_DIR/emu) receives the objects. Needs
# g++, gcc and cmocka. Takes a few minutes: every thread is a fiber.
set -eu
B=$(cd "$1" && pwd)
W=${2:-$B/emu}
R=$(cd "$(dirname "$0")/../../.." && pwd)
E=$R/tests/gpu/emu
mkdir -p "$W"
# kernel<<<grid, QF_THREADS, 0, st>>>(args) -> EMU_LAUNCH(...); every
# plain vector and scalar load of x (the qf_ld* helpers) through the
# alignment check (the cache-hinted __ldcs/__stcs check it in emu.h)
sed -E -e 's/(k_[a-z0-9_]+(<[A-Z0-9_]+>)?)<<<([^,]+), QF_THREADS, 0, st>>>\((.*)\);/EMU_LAUNCH(\3, QF_THREADS, \1, \4);/' \
  -e 's/\*\(const uint4 \*\)a/*EMU_AL(const uint4, 16, a)/' \
  -e 's/\*\(const uint32_t \*\)a/*EMU_AL(const uint32_t, 4, a)/' \
  -e 's/\*\(const uint16_t \*\)a/*EMU_AL(const uint16_t, 2, a)/' \
  "$R/plugins/fp8/quant_fp8.cu" > "$W/quant_fp8_emu.cc"
launches=$(grep -c 'EMU_LAUNCH(' "$W/quant_fp8_emu.cc")
left=$(grep -c '<<<' "$W/quant_fp8_emu.cc" || true)
raw=$(grep -Ec '\*\((const )?(uint4|uint2|uint32_t|uint16_t|float4|float) \*\)' "$W/quant_fp8_emu.cc" || true)
# every launch site of the source: the general kernels (k_rows at 6 depths,
# k_tiles at 2, k_tensor (mixed or all dense), k_cvt_check) and the dense ones (k_tiles_dense,
# k_rows_dense in 5 team shapes)
if [ "$launches" != 17 ]; then
  echo "run.sh: $launches launch sites rewritten, 17 expected" >&2
  exit 1
fi
if [ "$left" != 0 ] || [ "$raw" != 0 ]; then
  echo "run.sh: $raw vector or scalar accesses not rewritten" >&2
  echo "run.sh: $left kernel launches not rewritten" >&2
  exit 1
fi
echo "emulating $launches launch sites"
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -I"$E" -I"$R/include" -I"$R" \
  -c "$W/quant_fp8_emu.cc" -o "$W/quant_fp8_emu.o"
g++ -std=c++17 -O1 -g -Wall -c "$E/stubs.cc" -o "$W/stubs.o"
# the division shortcut's proof, through the kernel's own code
g++ -std=c++17 -O2 -Wall -Wno-unknown-pragmas -I"$E" -I"$R/include" -I"$R" -I"$W" \
  "$E/fastdiv.cc" "$W/stubs.o" "$B/librefit_kernels.a" -lm -o "$W/fastdiv"
"$W/fastdiv"
gcc -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -I"$E/c" -I"$R/include" -I"$R" \
  -c "$R/tests/gpu/test_gpu_quant.c" -o "$W/test_gpu_quant.o"
# the kernel tests' shared helpers (gpu_twin.c), over the emulator's runtime
gcc -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -I"$E/c" -I"$R/include" -I"$R" \
  -c "$R/tests/gpu/gpu_twin.c" -o "$W/gpu_twin.o"
g++ -o "$W/test-gpu-quant-emu" "$W/test_gpu_quant.o" "$W/gpu_twin.o" "$W/quant_fp8_emu.o" "$W/stubs.o" \
  "$B/librefit_kernels.a" -lcmocka -lm
"$W/test-gpu-quant-emu"
