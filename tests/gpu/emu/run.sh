#!/bin/sh
# The CUDA FP8 quantization kernels (plugins/fp8/quant_fp8.cu), their
# launcher (plugins/fp8/fp8_launch.c) and direct entries (fp8_direct.c),
# all unmodified, and their GPU test (tests/gpu/test_gpu_quant.c) on the
# CPU, through the emulator in this folder (emu.h says what it checks and
# what it cannot; pgpu_emu.cc is the launch table the direct entries get):
#   sh tests/gpu/emu/run.sh BUILD_DIR [WORK_DIR]
# BUILD_DIR: any meson build of refit, CUDA or not (for librefit_kernels.a
# and plugins/librefit_quant_ref.a, the CPU references); WORK_DIR (default
# BUILD_DIR/emu) receives the objects. Needs g++, gcc and cmocka. Takes a
# few minutes: every thread is a fiber.
set -eu
B=$(cd "$1" && pwd)
W=${2:-$B/emu}
R=$(cd "$(dirname "$0")/../../.." && pwd)
E=$R/tests/gpu/emu
mkdir -p "$W"
. "$E/image.sh"
emu_fp8_image
emu_pgpu
# the division shortcut's proof, through the kernel's own code
g++ -std=c++17 -O2 -Wall -Wno-unknown-pragmas -I"$E" -I"$R/include" -I"$R" -I"$W" \
  "$E/fastdiv.cc" "$B/plugins/librefit_quant_ref.a" "$B/librefit_kernels.a" -lm -o "$W/fastdiv"
"$W/fastdiv"
# the launcher, the direct entries, the test and its helpers, as C
emu_cc plugins/fp8/fp8_launch.c plugins/fp8/fp8_direct.c tests/gpu/test_gpu_quant.c \
  tests/gpu/gpu_twin.c
g++ -o "$W/test-gpu-quant-emu" "$W/test_gpu_quant.o" "$W/gpu_twin.o" "$W/fp8_direct.o" \
  "$W/fp8_launch.o" "$W/fp8_image_emu.o" "$W/pgpu_emu.o" \
  "$B/plugins/librefit_quant_ref.a" "$B/librefit_kernels.a" -lcmocka -lm
"$W/test-gpu-quant-emu"
