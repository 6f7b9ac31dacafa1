#!/bin/sh
# The CUDA MX quantization kernels (plugins/mxfp8/quant_mx.cu), their
# launcher (mx_launch.c) and direct entry (mx_direct.c), unmodified, with
# FP8's (quant_fp8.cu, fp8_launch.c, fp8_direct.c: the conversion check
# behind kern_fp8_encoder), and their GPU test (tests/gpu/test_gpu_mx.c,
# kernel cases only: REFIT_GPU_MX_EMU) on the CPU, through the emulator in
# this folder (emu.h says what it checks and what it cannot; pgpu_emu.cc
# is the launch table):
#   sh tests/gpu/emu/run_mx.sh BUILD_DIR [WORK_DIR]
# BUILD_DIR: any meson build of refit, CUDA or not (for librefit_kernels.a
# and plugins/librefit_quant_ref.a, the CPU references); WORK_DIR (default
# BUILD_DIR/emu-mx) receives the objects. Needs g++, gcc and cmocka; a
# few minutes. First the encoders alone on
# every input they can meet, natively; then the test, whose encoder sweep
# takes every REFIT_GPU_MX_STRIDE-th input (default here 211) plus the
# neighbourhoods of every code and rounding boundary (on a GPU: every
# input).
set -eu
B=$(cd "$1" && pwd)
W=${2:-$B/emu-mx}
R=$(cd "$(dirname "$0")/../../.." && pwd)
E=$R/tests/gpu/emu
mkdir -p "$W"
# vector accesses through the alignment check
sed -E -e 's/\*\(const float4 \*\)\(at \+ 16\)/*EMU_AL(const float4, 16, at + 16)/' \
  -e 's/\*\(const float4 \*\)at/*EMU_AL(const float4, 16, at)/' \
  -e 's/\*\(const uint4 \*\)at/*EMU_AL(const uint4, 16, at)/' \
  -e 's/\*\(uint2 \*\)\(/*EMU_AL(uint2, 8, /' \
  -e 's/\*\(uint32_t \*\)\(/*EMU_AL(uint32_t, 4, /' \
  -e 's/\*\(const float \*\)p/*EMU_AL(const float, 4, p)/' \
  -e 's/\*\(const uint16_t \*\)p/*EMU_AL(const uint16_t, 2, p)/' \
  "$R/plugins/mxfp8/quant_mx.cu" > "$W/quant_mx_emu.cc"
# (the dense path's loads are __ldcs, which the emulator checks itself)
aligned=$(grep -o 'EMU_AL(\|__ldcs(' "$W/quant_mx_emu.cc" | wc -l)
raw=$(grep -cE '\*\((const )?(float4|uint4|uint2|float|uint16_t|uint32_t) \*\)' "$W/quant_mx_emu.cc" || true)
if [ "$aligned" -lt 10 ] || [ "$raw" != 0 ]; then
  echo "run_mx.sh: $aligned accesses checked (want 10), $raw not rewritten" >&2
  exit 1
fi
echo "$aligned checked accesses"
# What the MX kernel needs beyond the shared shims (emu.h, cuda_runtime.h,
# which grow as other kernels need more): each definition only where the
# shims lack it. SSE arithmetic rounds to nearest even and keeps
# subnormals, as __fmul_rn/__fadd_rn with -ftz=false.
{
  echo '#pragma once'
  echo '#include "cuda_runtime.h"'
  echo '#include "cuda_fp8.h"'
  have() { grep -q "$1" "$E"/*.h; }
  have 'cudaDevAttrMultiProcessorCount' ||
    echo 'enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };'
  have 'cudaGetDevice(' ||
    echo 'inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }'
  have 'cudaDeviceGetAttribute(' ||
    echo 'inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) { *v = 2; return cudaSuccess; }'
  have '__fmul_rn(' ||
    echo 'inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }'
  have '__fadd_rn(' ||
    echo 'inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }'
  have '__umulhi(' ||
    echo 'inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }'
  have '__byte_perm(' ||
    echo 'inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) { unsigned long long v = (unsigned long long)y << 32 | x; unsigned r = 0; for (int n = 0; n < 4; n++) r |= (unsigned)(v >> (8 * ((s >> (4 * n)) & 7)) & 0xff) << (8 * n); return r; }'
  have '__clz(' ||
    echo 'inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }'
} > "$W/mx_extra.h"
. "$E/image.sh"
# the kernels mx_launch.c looks up: mx_0 .. mx_3 (MXFP8 and MXFP4, long and
# short parameter blocks) and the dense mxd_* in 6 modes
emu_image "$W/quant_mx_emu.cc" mx_image 10 -include "$W/mx_extra.h"
emu_fp8_image
emu_pgpu
CFLAGS_EMU=-DREFIT_GPU_MX_EMU emu_cc tests/gpu/test_gpu_mx.c
emu_cc plugins/mxfp8/mx_launch.c plugins/mxfp8/mx_direct.c plugins/fp8/fp8_launch.c \
  plugins/fp8/fp8_direct.c tests/gpu/gpu_twin.c
g++ -o "$W/test-gpu-mx-emu" "$W/test_gpu_mx.o" "$W/gpu_twin.o" "$W/mx_direct.o" "$W/mx_launch.o" \
  "$W/fp8_direct.o" "$W/fp8_launch.o" "$W/mx_image_emu.o" "$W/fp8_image_emu.o" "$W/pgpu_emu.o" \
  "$B/plugins/librefit_quant_ref.a" "$B/librefit_kernels.a" -lcmocka -lm
# The encoders alone, natively, on every input they can meet (every f32 of
# magnitude below 2^9 for E4M3, 2^3 for E2M1, both signs) against the CPU
# references: the exhaustive check the emulated kernel is too slow for.
cat > "$W/mx_encoders.cc" <<'EOF'
#include "quant_mx_emu.cc"
extern "C" uint8_t kern_f32_to_e2m1(float f);
static unsigned long long sweep(int fp4, uint32_t limit)
{
    unsigned long long bad = 0;
    for (uint32_t b = 0; b < limit; b++) {
        float f = __uint_as_float(b), g = __uint_as_float(b | 0x80000000u);
        uint32_t c = fp4 ? mx_e2m1_code(b, f) : mx_e4m3_code(b, f);
        uint32_t want = fp4 ? kern_f32_to_e2m1(f) : kern_f32_to_e4m3_sat(f);
        uint32_t wneg = fp4 ? kern_f32_to_e2m1(g) : kern_f32_to_e4m3_sat(g);
        if (c != want || (c | (fp4 ? 8u : 0x80u)) != wneg) {
            if (!bad)
                printf("  first difference: %s of %08x: %02x, reference %02x / %02x\n",
                       fp4 ? "E2M1" : "E4M3", b, c, want, wneg);
            bad++;
        }
    }
    return bad;
}
int main()
{
    unsigned long long a = sweep(0, 0x44000000u), b = sweep(1, 0x41000000u);
    printf("encoders on every reachable input: E4M3 %llu of 2 x %u differ, E2M1 %llu of 2 x %u\n",
           a, 0x44000000u, b, 0x41000000u);
    return a || b;
}
EOF
g++ -std=c++17 -O2 -Wall -Wno-unknown-pragmas -I"$E" -I"$R/include" -I"$R" -I"$W" \
  -include "$W/mx_extra.h" "$W/mx_encoders.cc" "$B/plugins/librefit_quant_ref.a" \
  "$B/librefit_kernels.a" \
  -o "$W/mx-encoders"
"$W/mx-encoders"
REFIT_GPU_MX_STRIDE=${REFIT_GPU_MX_STRIDE:-211} "$W/test-gpu-mx-emu"
