#!/bin/sh
# librefit.so holds no format code (issue 34): no symbol it defines, hidden
# or exported, is a format's CPU reference (kern_quant_*, kern_dequant_*,
# plugins/<fmt>/quant_*.c) or the minifloat codecs only they call
# (kernels/minifloat.c). The references live in refit_quant_ref, which the
# plugins, the tools and the tests that need them link (plugins/meson.build).
# Reads the full symbol table (nm, not nm -D); a stripped library skips (TAP).
# Usage: core_no_format_code.sh LIB
lib="$1"
echo "1..1"
syms=$(nm --defined-only "$lib" 2>/dev/null | awk 'NF >= 3 {print $3}')
if [ -z "$syms" ]; then
  echo "ok 1 # skip no symbol table in $lib (stripped?)"
  exit 0
fi
bad=$(echo "$syms" | grep -E '^kern_(quant|dequant)_|^kern_f32_to_(e4m3|e5m2|e8m0|e2m1)|^kern_(e4m3|e5m2|e8m0|e2m1)_to_' |
      sort -u | head -8 | tr '\n' ' ')
if [ -z "$bad" ]; then
  echo "ok 1 - $(basename "$lib") defines no format reference"
else
  echo "not ok 1 - $(basename "$lib") holds format code: $bad"
fi
