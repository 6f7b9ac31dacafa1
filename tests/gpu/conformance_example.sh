#!/bin/sh
# refit-format-conformance --device=cuda (issue 32 item 2) as a format
# author runs it: this build installed into a scratch prefix,
# examples/example_format built from that prefix with its kernel
# (scale2.cu), and the installed kit run over it on CUDA device 0 (with
# the example's reference when the venv has numpy): every check runs the
# plugin's kernel, and every update's bytes must equal the plugin's CPU
# path's; and --self-test-fault=twin shows that comparison fails on a
# flipped device byte. TAP; without a device, a skipped plan ("1..0 #
# SKIP" and why) before anything is installed.
#   conformance_example.sh BUILD_DIR SOURCE_DIR CUDA_ARCHS
set -eu
build=$1 src=$2 archs=$3
# the build's own kit says whether device 0 can be used (before any file)
probe=0
why=$("$build/conformance/refit-format-conformance" --device=cuda /nonexistent.so x.yaml \
  y.yaml 2>&1 >/dev/null) || probe=$?
if [ $probe -eq 77 ]; then
  echo "1..0 # SKIP $(printf '%s\n' "$why" | head -n 1)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=$(sh "$src/tests/formats/example_format/build_from_prefix.sh" "$build" "$src" "$tmp" \
  -Dcuda=enabled "-Dcuda-arch=$archs")
py=${REFIT_VENV:-${REFIT_BUILD_ROOT:-$build}/venv}/bin/python
ref=
"$py" -c 'import numpy' 2>/dev/null &&
  ref="--reference=$py $src/examples/example_format/scale2_reference.py"
set -- "$tmp/ex/refit-fmt-scale2.so" "$src/examples/example_format/scale2.yaml" \
  "$src/tests/formats/example_format/case.yaml"
rc=0
"$bin/refit-format-conformance" --device=cuda ${ref:+"$ref"} "$@" > "$tmp/kit.tap" || rc=$?
# the comparison with the CPU path can fail: one device byte flipped after
# each update (--self-test-fault=twin) fails cold-start, naming it
frc=0
"$bin/refit-format-conformance" --device=cuda --self-test-fault=twin --only=cold-start "$@" \
  > "$tmp/fault.tap" 2>&1 || frc=$?
n=$(grep -cE '^(not )?ok ' "$tmp/kit.tap" || true)
grep -vE '^1\.\.' "$tmp/kit.tap"
if [ $frc -eq 1 ] && grep -q "the device's bytes differ from the plugin's CPU path at m/w byte 0" \
     "$tmp/fault.tap"; then
  echo "ok $((n + 1)) - --self-test-fault=twin: a flipped device byte fails cold-start, named"
else
  echo "not ok $((n + 1)) - --self-test-fault=twin: exit $frc"
  sed 's/^/#   /' "$tmp/fault.tap"
  rc=1
fi
echo "1..$((n + 1))"
exit $rc
