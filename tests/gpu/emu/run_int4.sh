#!/bin/sh
# The CUDA INT4 quantization kernels (plugins/int4/quant_int4.cu) and the kernel
# cases of their GPU test (tests/gpu/test_gpu_int4.c, built with
# REFIT_GPU_EMU: fewer, smaller shapes, no model cases) on the CPU, through
# the emulator in this folder (emu.h says what it checks and what it
# cannot):
#   [EMU_ASAN=1] sh tests/gpu/emu/run_int4.sh BUILD_DIR [WORK_DIR]
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
  "$R/plugins/int4/quant_int4.cu" > "$W/quant_int4_emu.cc"
launches=$(grep -c 'EMU_LAUNCH(' "$W/quant_int4_emu.cc")
left=$(grep -c '<<<' "$W/quant_int4_emu.cc" || true)
raw=$(grep -cE '\*\((const )?(float4|uint4|float|uint16_t|uint32_t) \*\)' "$W/quant_int4_emu.cc" || true)
if [ "$left" != 0 ] || [ "$raw" != 0 ]; then
  echo "run_int4.sh: $left kernel launches, $raw accesses not rewritten" >&2
  exit 1
fi
# the general kernels (k_q4_groups, k_q4_rows: 7 cases) and the dense one
# (k_q4_dense: 4), each with the long and the short parameter block
if [ "$launches" != 11 ]; then
  echo "run_int4.sh: $launches launch sites rewritten, expected 11" >&2
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
# What the kernels use and emu.h may lack (each defined here only where
# emu.h has no definition of its own): __fmul_rn and __fadd_rn, the IEEE
# operations they are; __byte_perm; the indexed shuffle, the ballot and
# __syncwarp as warp barriers (so a lane reads the shared tile only after
# every lane of its warp wrote it, as on the GPU after __syncwarp)
X="$W/emu_int4_extra.h"
printf '#pragma once\n#include "emu.h"\n' > "$X"
has() { grep -qE "^inline [a-z0-9_ ]+ $1\(" "$E/emu.h"; }
has __fmul_rn || echo 'inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }' >> "$X"
has __fadd_rn || echo 'inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }' >> "$X"
has __byte_perm || cat >> "$X" <<'PERM'
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s)
{
    uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)(v >> (8 * ((s >> (4 * i)) & 7)) & 0xffu) << (8 * i);
    return r;
}
PERM
has __shfl_sync || cat >> "$X" <<'SHFL'
inline uint32_t __shfl_sync(unsigned mask, uint32_t v, int src)
{
    (void)mask;
    unsigned t = emu().cur->tid;
    emu().xbuf[t] = v;
    emu_wait(EMU_WARP_BAR);
    uint32_t r = emu().xbuf[(t & ~31u) | ((unsigned)src & 31u)];
    emu_wait(EMU_WARP_BAR);
    return r;
}
SHFL
has __ballot_sync || cat >> "$X" <<'BALLOT'
inline unsigned __ballot_sync(unsigned mask, int pred)
{
    (void)mask;
    unsigned t = emu().cur->tid, r = 0;
    emu().xbuf[t] = pred != 0;
    emu_wait(EMU_WARP_BAR);
    for (unsigned l = 0; l < 32; l++)
        r |= emu().xbuf[(t & ~31u) | l] << l;
    emu_wait(EMU_WARP_BAR);
    return r;
}
BALLOT
has __syncwarp || echo 'inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)mask; emu_wait(EMU_WARP_BAR); }' >> "$X"
extra="-include $X"
# EMU_ASAN=1: everything built with AddressSanitizer, so that a kernel's
# read or write past its allocation (the test's allocations are exact,
# plus one element) stops the run (the fibers draw a harmless warning)
san=
if [ "${EMU_ASAN:-0}" != 0 ]; then
  san="-fsanitize=address -fno-omit-frame-pointer"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_stack_use_after_return=0:detect_leaks=0}
  export ASAN_OPTIONS
fi
g++ -std=c++17 -O1 -g $san -Wall -Wno-unknown-pragmas -I"$E" -I"$R/include" -I"$R" $extra \
  -c "$W/quant_int4_emu.cc" -o "$W/quant_int4_emu.o"
g++ -std=c++17 -O1 -g $san -Wall -c "$W/stubs_int4.cc" -o "$W/stubs_int4.o"
gcc -std=c11 -D_GNU_SOURCE -DREFIT_GPU_EMU -O1 -g $san -Wall -Wextra -I"$E/c" -I"$R/include" -I"$R" \
  -c "$R/tests/gpu/test_gpu_int4.c" -o "$W/test_gpu_int4.o"
# the kernel tests' shared helpers (gpu_twin.c), over the emulator's runtime
gcc -std=c11 -D_GNU_SOURCE -O1 -g $san -Wall -Wextra -I"$E/c" -I"$R/include" -I"$R" \
  -c "$R/tests/gpu/gpu_twin.c" -o "$W/gpu_twin.o"
g++ $san -o "$W/test-gpu-int4-emu" "$W/test_gpu_int4.o" "$W/gpu_twin.o" "$W/quant_int4_emu.o" \
  "$W/stubs_int4.o" "$B/librefit_kernels.a" -lcmocka -lm
"$W/test-gpu-int4-emu"
