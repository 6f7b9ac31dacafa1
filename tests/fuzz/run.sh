#!/bin/sh
# Build the safetensors fuzz target with libFuzzer + ASan + UBSan and run it.
# Usage: tests/fuzz/run.sh [SECONDS]   (default 60; 0 = build only)
# The seed corpus in tests/fuzz/corpus/ is read, never written: new inputs
# go to build-fuzz/corpus/, crashes to build-fuzz/.
set -eu
secs=${1:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/build-fuzz"
mkdir -p "$out/corpus"
clang -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Werror \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$root/include" -I"$root" \
  "$root/tests/fuzz/fuzz_safetensors.c" "$root/core/safetensors.c" "$root/core/sha256.c" \
  $(pkg-config --cflags --libs jansson) -o "$out/fuzz_safetensors"
[ "$secs" -gt 0 ] || exit 0
cd "$out"
exec ./fuzz_safetensors -max_total_time="$secs" -print_final_stats=1 \
  -dict="$root/tests/fuzz/safetensors.dict" -max_len=65536 \
  corpus "$root/tests/fuzz/corpus"
