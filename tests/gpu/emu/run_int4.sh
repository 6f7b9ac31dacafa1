#!/bin/sh
# The CUDA INT4 quantization kernels (plugins/int4/quant_int4.cu), their
# launcher (int4_launch.c) and direct entry (int4_direct.c), unmodified,
# and the kernel cases of their GPU test (tests/gpu/test_gpu_int4.c, built
# with REFIT_GPU_EMU: fewer, smaller shapes, no model cases) on the CPU,
# through the emulator in this folder (emu.h says what it checks and what
# it cannot; pgpu_emu.cc is the launch table):
#   [EMU_ASAN=1] sh tests/gpu/emu/run_int4.sh BUILD_DIR [WORK_DIR]
# BUILD_DIR: any meson build of refit, CUDA or not (for librefit_kernels.a
# and plugins/librefit_quant_ref.a, the CPU references); WORK_DIR (default
# BUILD_DIR/emu-int4) receives the objects. Needs g++, gcc and cmocka.
set -eu
B=$(cd "$1" && pwd)
W=${2:-$B/emu-int4}
R=$(cd "$(dirname "$0")/../../.." && pwd)
E=$R/tests/gpu/emu
mkdir -p "$W"
# every vector and scalar access of the kernels through the alignment check
sed -E -e 's/\*\(const float4 \*\)\(a \+ 16\)/*EMU_AL(const float4, 16, a + 16)/' \
  -e 's/\*\(const float4 \*\)a/*EMU_AL(const float4, 16, a)/' \
  -e 's/\*\(const uint4 \*\)a/*EMU_AL(const uint4, 16, a)/' \
  -e 's/\*\(const float \*\)p/*EMU_AL(const float, 4, p)/' \
  -e 's/\*\(const uint16_t \*\)p/*EMU_AL(const uint16_t, 2, p)/' \
  -e 's/\*\((const )?uint32_t \*\)a/*EMU_AL(\1uint32_t, 4, a)/g' \
  -e 's/\*\((const )?uint16_t \*\)a/*EMU_AL(\1uint16_t, 2, a)/g' \
  -e 's/\*\(uint32_t \*\)\(p\.q/*EMU_AL(uint32_t, 4, p.q/' \
  "$R/plugins/int4/quant_int4.cu" > "$W/quant_int4_emu.cc"
raw=$(grep -cE '\*\((const )?(float4|uint4|float|uint16_t|uint32_t) \*\)' "$W/quant_int4_emu.cc" || true)
if [ "$raw" != 0 ]; then
  echo "run_int4.sh: $raw accesses not rewritten" >&2
  exit 1
fi
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
# EMU_ASAN=1: everything built with AddressSanitizer, so that a kernel's
# read or write past its allocation (the test's allocations are exact,
# plus one element; the launcher's scratch exact to 256 bytes) stops the
# run (the fibers draw a harmless warning)
EMU_SAN=
if [ "${EMU_ASAN:-0}" != 0 ]; then
  EMU_SAN="-fsanitize=address -fno-omit-frame-pointer"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_stack_use_after_return=0:detect_leaks=0}
  export ASAN_OPTIONS
fi
. "$E/image.sh"
# the kernels int4_launch.c looks up, each with the long and the short
# parameter block: q4_groups_* at 6 lane counts, q4_rows, q4_dense_* at 4
emu_image "$W/quant_int4_emu.cc" int4_image 22 -include "$X"
emu_pgpu
CFLAGS_EMU=-DREFIT_GPU_EMU emu_cc tests/gpu/test_gpu_int4.c
emu_cc plugins/int4/int4_launch.c plugins/int4/int4_direct.c tests/gpu/gpu_twin.c
g++ $EMU_SAN -o "$W/test-gpu-int4-emu" "$W/test_gpu_int4.o" "$W/gpu_twin.o" "$W/int4_direct.o" \
  "$W/int4_launch.o" "$W/int4_image_emu.o" "$W/pgpu_emu.o" \
  "$B/plugins/librefit_quant_ref.a" "$B/librefit_kernels.a" -lcmocka -lm
"$W/test-gpu-int4-emu"
