#!/bin/sh
# The tools use the public API: no object of a tool calls a symbol the
# core's own objects (core/ in the internal library, not the components
# below it) define unless librefit.so exports it (refit.h and the rest,
# refit/sys/), and every tool loads librefit.so rather than carry the core
# (issue 18, docs/abi.md). No exceptions (TAP).
# Usage: tools_public_api.sh LIBREFIT.so LIBREFIT_INTERNAL.a TOOL...
so="$1" lib="$2"
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

nm -D --defined-only "$so" | awk '{sub(/@.*/, "", $3); print $3}' | sort -u > "$tmp/exported"
# Global symbols of the core's objects (librefit_internal.a.p/core_*).
nm -A --defined-only "$lib" 2>/dev/null | awk -F: '$2 ~ /librefit_internal\.a\.p\/core_/ {
    split($3, f, " "); if (f[2] ~ /^[TDBRCV]$/) print f[3]}' | sort -u > "$tmp/core"
comm -23 "$tmp/core" "$tmp/exported" > "$tmp/private"

echo "1..$(($# + 2))"
if [ -s "$tmp/private" ] && [ -s "$tmp/exported" ]; then
  echo "ok 1 - $(wc -l < "$tmp/private" | tr -d ' ') core symbols are private, $(wc -l < "$tmp/exported" | tr -d ' ') exported"
else
  echo "not ok 1 - no core symbols found in $lib or no exports in $so"
fi
i=1
for tool in "$@"; do
  i=$((i + 1))
  name=$(basename "$tool")
  bad=""
  for o in "$tool.p"/*.o; do
    hit=$(nm -u "$o" | awk '{print $2}' | sort -u | comm -12 - "$tmp/private" | tr '\n' ' ')
    [ -n "$hit" ] && bad="$bad
#   $(basename "$o"): $hit"
  done
  if [ -z "$bad" ]; then
    echo "ok $i - $name calls no private core symbol"
  else
    echo "not ok $i - $name calls private core symbols:$bad"
  fi
done
i=$((i + 1))
miss=""
for tool in "$@"; do
  readelf -d "$tool" | grep -q 'NEEDED.*\[librefit\.so' || miss="$miss $(basename "$tool")"
done
[ -z "$miss" ] && echo "ok $i - every tool loads librefit.so" ||
  echo "not ok $i - not linked against librefit.so:$miss"
