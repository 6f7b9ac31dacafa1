#!/bin/sh
# The CUDA NVFP4 post-load kernel (plugins/nvfp4/quant_nvfp4.cu), its
# launcher (nvfp4_launch.c) and direct entry (nvfp4_direct.c), unmodified,
# and the kernel half of their GPU test (tests/gpu/test_gpu_nvfp4.c, built
# with REFIT_GPU_EMU) on the CPU, through the emulator in this folder
# (emu.h says what it checks and what it cannot; pgpu_emu.cc is the launch
# table):
#   sh tests/gpu/emu/run_nvfp4.sh BUILD_DIR [WORK_DIR]
# BUILD_DIR: any meson build of refit, CUDA or not (for librefit_kernels.a
# and plugins/librefit_quant_ref.a, the CPU references); WORK_DIR (default
# BUILD_DIR/emu-nvfp4) receives the objects.
# Needs g++, gcc and cmocka. Takes a few minutes: every thread is a fiber.
# The launcher's L2 set is made 20 KB here, so that calls of several pieces
# run its pipeline over many sets, and a dense piece is small below 2 CTAs
# (not 264), so both of its CTA sizings run (nvfp4_gpu.h's QN_SET_BYTES
# and QN_SMALL_CTAS, given to the kernel and the launcher alike).
set -eu
B=$(cd "$1" && pwd)
W=${2:-$B/emu-nvfp4}
R=$(cd "$(dirname "$0")/../../.." && pwd)
E=$R/tests/gpu/emu
mkdir -p "$W"
# vector and scalar accesses through the alignment check
sed -E -e 's/\*\(const uint4 \*\)a/*EMU_AL(const uint4, 16, a)/' \
  -e 's/\*\(const float \*\)p/*EMU_AL(const float, 4, p)/' \
  -e 's/\*\(const uint16_t \*\)p/*EMU_AL(const uint16_t, 2, p)/' \
  "$R/plugins/nvfp4/quant_nvfp4.cu" > "$W/quant_nvfp4_emu.cc"
vec=$(grep -c 'EMU_AL(' "$W/quant_nvfp4_emu.cc")
if [ "$vec" != 3 ]; then
  echo "run_nvfp4.sh: $vec checked accesses rewritten (want 3)" >&2
  exit 1
fi
echo "$vec plain accesses and the __ldcs/__stcs ones checked"
# what emu.h lacks for this kernel (the cache-hinted accesses, which emu.h
# has had since quant_fp8.cu uses them)
if grep -q '__ldcs' "$E/emu.h"; then
  printf '#pragma once\n' > "$W/nv_shim.h"
else
  cat > "$W/nv_shim.h" <<'EOF'
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
/* cache-hinted vector accesses: plain ones, alignment checked */
template <class T> inline const T *nv_al(const T *p)
{
    if ((uintptr_t)p % sizeof(T)) {
        fprintf(stderr, "EMU: misaligned %zu-byte hinted access at %p\n", sizeof(T), (void *)p);
        abort();
    }
    return p;
}
template <class T> inline T __ldcs(const T *p) { return *nv_al(p); }
template <class T> inline void __stcs(T *p, T v) { *(T *)nv_al(p) = v; }
EOF
fi
# __fadd_rn (qn_e2m1), where emu.h lacks it: SSE addition rounds to
# nearest even and keeps subnormals, as __fadd_rn with -ftz=false
if ! grep -q '__fadd_rn(' "$E/emu.h"; then
  echo 'inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }' \
    >> "$W/nv_shim.h"
fi
# the dense path's integer intrinsics, where emu.h lacks them
if ! grep -q '__byte_perm(' "$E/emu.h"; then
  cat >> "$W/nv_shim.h" <<'EOF'
/* byte i of the result: byte (s >> 4i) & 7 of y:x (x bytes 0-3) */
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    unsigned long long v = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++)
        r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}
EOF
fi
if ! grep -q '__umulhi(' "$E/emu.h"; then
  echo 'inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }' \
    >> "$W/nv_shim.h"
fi
QN="-DQN_SET_BYTES=20000 -DQN_SMALL_CTAS=2"
. "$E/image.sh"
# the one kernel nvfp4_launch.c looks up (nvfp4_pass: both passes, every mode)
emu_image "$W/quant_nvfp4_emu.cc" nvfp4_image 1 -include "$W/nv_shim.h" $QN
emu_pgpu
CFLAGS_EMU="-DREFIT_GPU_EMU $QN" emu_cc tests/gpu/test_gpu_nvfp4.c plugins/nvfp4/nvfp4_launch.c \
  plugins/nvfp4/nvfp4_direct.c
emu_cc tests/gpu/gpu_twin.c
g++ -o "$W/test-gpu-nvfp4-emu" "$W/test_gpu_nvfp4.o" "$W/gpu_twin.o" "$W/nvfp4_direct.o" \
  "$W/nvfp4_launch.o" "$W/nvfp4_image_emu.o" "$W/pgpu_emu.o" \
  "$B/plugins/librefit_quant_ref.a" "$B/librefit_kernels.a" -lcmocka -lm
"$W/test-gpu-nvfp4-emu"
# The E2M1 encoder alone, natively, against the CPU reference on every
# non-NaN f32 of both signs (quotients past the grid, infinity included):
# the exhaustive check the emulated kernel is too slow for.
cat > "$W/nv_e2m1.cc" <<'EOF'
#include "quant_nvfp4_emu.cc"
extern "C" uint8_t kern_f32_to_e2m1(float f);
extern "C" uint8_t kern_f32_to_e4m3_sat(float f);
int main()
{
    unsigned long long bad = 0, n = 0, bad_mag = 0, bad_e4m3 = 0;
    for (uint32_t s = 0; s < 2; s++)
        for (uint32_t a = 0; a <= 0x7f800000u; a++) {
            float f = __uint_as_float(a | s << 31);
            uint32_t got = qn_e2m1(f), want = kern_f32_to_e2m1(f);
            n++;
            if (got != want && !bad++)
                printf("  first difference: E2M1 of %08x: %02x, reference %02x\n", a | s << 31,
                       got, want);
            if (s == 0 && qn_e2m1_mag(f) != want && !bad_mag++)
                printf("  first difference: qn_e2m1_mag of %08x: %02x, reference %02x\n", a,
                       qn_e2m1_mag(f), want);
            if (s == 0 && qn_e4m3_add(a) != kern_f32_to_e4m3_sat(f) && !bad_e4m3++)
                printf("  first difference: qn_e4m3_add of %08x: %02x, reference %02x\n", a,
                       qn_e4m3_add(a), kern_f32_to_e4m3_sat(f));
        }
    printf("qn_e2m1 on every non-NaN f32: %llu of %llu differ from kern_f32_to_e2m1\n", bad, n);
    printf("qn_e2m1_mag on every non-negative non-NaN f32: %llu differ\n", bad_mag);
    printf("qn_e4m3_add on every non-negative non-NaN f32: %llu differ from "
           "kern_f32_to_e4m3_sat\n", bad_e4m3);
    return bad != 0 || bad_mag != 0 || bad_e4m3 != 0;
}
EOF
g++ -std=c++17 -O2 -Wall -Wno-unknown-pragmas -I"$E" -I"$R/include" -I"$R" -I"$W" \
  -include "$W/nv_shim.h" -DQN_SET_BYTES=20000 "$W/nv_e2m1.cc" \
  "$B/plugins/librefit_quant_ref.a" "$B/librefit_kernels.a" -o "$W/nv-e2m1"
"$W/nv-e2m1"
# The dense path's arithmetic, natively, through the kernel's own code:
# qn_div6 against the division on every F16 and BF16 magnitude; the E2M1
# codes of qn_quot against those of the full division on every F16 and
# BF16 magnitude, for random divisors over qn_quot's range [2^-100,
# 2^100) and divisors that put quotients within a few ulps of each E2M1
# midpoint; qn_swz against kern_swizzle_offset (row division included).
cat > "$W/nv_dense.cc" <<'EOF'
#include "quant_nvfp4_emu.cc"
extern "C" uint8_t kern_f32_to_e2m1(float f);
extern "C" int64_t kern_swizzle_offset(int64_t r, int64_t c, int64_t cols_p);
static uint64_t rs = 0x2545f4914f6cdd1dull;
static uint32_t rnd()
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 16);
}
static uint32_t f32_of(int kind, uint32_t h)
{
    return kind == 2 ? qn_f32_of<2>(h) : qn_f32_of<1>(h);
}
static unsigned long long quot_bad, quot_n;
static void quot_check(float d)
{
    uint32_t db = __float_as_uint(d);
    if (db < QN_SAFE_LO || db >= QN_SAFE_HI)
        return;
    float y = __frcp_rn(d);
    for (int kind = 1; kind <= 2; kind++)
        for (uint32_t h = 0; h <= (kind == 2 ? 0x7f7fu : 0x7bffu); h++) {
            float a = __uint_as_float(f32_of(kind, h));
            uint32_t want = kern_f32_to_e2m1(__fdiv_rn(a, d)), got = qn_e2m1_mag(qn_quot(a, d, y));
            quot_n++;
            if (got != want && !quot_bad++)
                printf("  first difference: %08x / %08x: code %u, reference %u\n",
                       __float_as_uint(a), db, got, want);
        }
}
int main()
{
    unsigned long long div6_bad = 0, swz_bad = 0;
    for (int kind = 1; kind <= 2; kind++)
        for (uint32_t h = 0; h <= (kind == 2 ? 0x7f7fu : 0x7bffu); h++) {
            float b = __uint_as_float(f32_of(kind, h));
            if (__float_as_uint(qn_div6(b)) != __float_as_uint(__fdiv_rn(b, 6.0f)) && !div6_bad++)
                printf("  first difference: qn_div6 of %08x\n", __float_as_uint(b));
        }
    printf("qn_div6 on every F16 and BF16 magnitude: %llu differ from the division\n", div6_bad);
    unsigned long long f16_bad = 0;
    for (uint32_t h = 0; h <= 0x7bffu; h++) /* the encode pass's F16 unpacking, both halves */
        if ((__float_as_uint(qn_lo<1>(h | (0x5a5a0000u & QN_MAG2))) != refit_mf_bits_f16_to_f32((uint16_t)h) ||
             __float_as_uint(qn_hi<1>(h << 16 | 0x2a5au)) != refit_mf_bits_f16_to_f32((uint16_t)h)) &&
            !f16_bad++)
            printf("  first difference: F16 %04x unpacked\n", h);
    printf("qn_lo/qn_hi on every finite F16 magnitude: %llu differ from refit_mf_bits_f16_to_f32\n",
           f16_bad);
    for (int i = 0; i < 2000; i++) /* random divisors over the range */
        quot_check(__uint_as_float(((13u + rnd() % 200u) << 23) | (rnd() & 0x7fffffu)));
    static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (int i = 0; i < 700; i++) { /* a / d within 3 ulps of a midpoint */
        uint32_t h = 0x3c00u + rnd() % 0x3000u; /* BF16 near 2^-7 .. 2^89 */
        float d = __fdiv_rn(__uint_as_float(h << 16), mid[i % 7]);
        for (int k = -3; k <= 3; k++)
            quot_check(__uint_as_float(__float_as_uint(d) + (uint32_t)k));
    }
    printf("qn_quot's E2M1 codes: %llu of %llu differ from those of the division\n", quot_bad,
           quot_n);
    for (int i = 0; i < 200000; i++) {
        uint32_t cb = i < 100000 ? 1u + rnd() % 3000u : 1u + rnd() % (1u << 22);
        uint32_t g = i % 4 == 0 ? (1u << 30) - 1u - rnd() % 1000u : rnd() % (1u << 30);
        uint32_t l = 0;
        while (((uint64_t)1 << l) < cb)
            l++;
        uint32_t mul = cb > 1 ? (uint32_t)((((uint64_t)1 << (31 + l)) + cb - 1) / cb) : 0;
        uint32_t cp = (cb + 3) / 4 * 4, r = g / cb;
        if ((uint64_t)(r / 128 + 1) * 128 * cp >= (1ull << 31))
            continue; /* not dense: the swizzled array reaches 2^31 bytes */
        uint32_t got = qn_swz(g, cb, mul, cb > 1 ? l - 1 : 0, cp / 4);
        if (got != (uint64_t)kern_swizzle_offset(r, g % cb, cp) && !swz_bad++)
            printf("  first difference: qn_swz of block %u, cb %u\n", g, cb);
    }
    printf("qn_swz on 200000 blocks and row lengths: %llu differ\n", swz_bad);
    return div6_bad || f16_bad || quot_bad || swz_bad;
}
EOF
g++ -std=c++17 -O2 -Wall -Wno-unknown-pragmas -I"$E" -I"$R/include" -I"$R" -I"$W" \
  -include "$W/nv_shim.h" -DQN_SET_BYTES=20000 "$W/nv_dense.cc" \
  "$B/plugins/librefit_quant_ref.a" "$B/librefit_kernels.a" -lm -o "$W/nv-dense"
"$W/nv-dense"
