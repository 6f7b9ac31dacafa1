#!/bin/sh
# kernels/fingerprint.cu (the NCCL transport's payload checksum on the
# device) on the CPU through the emulator in tests/gpu/emu, checked against
# the host fingerprint by tests/nccl/emu_fingerprint.cc:
#   sh tests/nccl/emu_fingerprint.sh BUILD_DIR [WORK_DIR]
# BUILD_DIR: any meson build of refit (for librefit_kernels.a); WORK_DIR
# (default BUILD_DIR/emu-fingerprint) receives the objects. Needs g++.
set -eu
B=$(cd "$1" && pwd)
W=${2:-$B/emu-fingerprint}
R=$(cd "$(dirname "$0")/../.." && pwd)
E=$R/tests/gpu/emu
mkdir -p "$W"
# kernel<<<grid, threads, 0, st>>>(args) -> EMU_LAUNCH(...); the kernel's
# word and element loads through the emulator's alignment check
sed -E -e 's/(k_[a-z0-9_]+)<<<([^,]+), ([^,]+), 0, st>>>\((.*)\);/EMU_LAUNCH(\2, \3, \1, \4);/' \
  -e 's/\*\(const (uint64_t|uint32_t|uint16_t|uint4) \*\)p/*EMU_AL(const \1, sizeof(\1), p)/g' \
  "$R/kernels/fingerprint.cu" > "$W/fingerprint_emu.cc"
left=$(grep -c '<<<' "$W/fingerprint_emu.cc" || true)
raw=$(grep -Ec '\*\(const (uint64_t|uint32_t|uint16_t|uint4) \*\)' "$W/fingerprint_emu.cc" || true)
if [ "$left" != 0 ] || [ "$raw" != 0 ]; then
  echo "emu_fingerprint.sh: $left launches, $raw loads not rewritten" >&2
  exit 1
fi
echo "emulating $(grep -c 'EMU_LAUNCH(' "$W/fingerprint_emu.cc") launch sites"
g++ -std=c++17 -O1 -g -Wall -Wno-unknown-pragmas -I"$E" -I"$R/include" -I"$R" \
  -include "$R/tests/nccl/emu_shfl.h" -c "$W/fingerprint_emu.cc" -o "$W/fingerprint_emu.o"
g++ -std=c++17 -O1 -g -Wall -I"$R/include" -I"$R" -c "$R/tests/nccl/emu_fingerprint.cc" \
  -o "$W/emu_fingerprint.o"
g++ -o "$W/emu-fingerprint" "$W/emu_fingerprint.o" "$W/fingerprint_emu.o" \
  "$B/librefit_kernels.a" -lm
"$W/emu-fingerprint"
