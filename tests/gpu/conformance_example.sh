#!/bin/sh
# refit-format-conformance --device=cuda (issue 32 item 2) as a format
# author runs it: this build installed into a scratch prefix,
# examples/example_format built from that prefix with its kernel
# (scale2.cu), and the installed kit run over it on CUDA device 0 (with
# the example's reference when the venv has numpy): every check runs the
# plugin's kernel, and every update's bytes must equal the plugin's CPU
# path's. The kit's TAP; without a device, a skipped plan ("1..0 # SKIP"
# and why) before anything is installed.
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
rc=0
"$bin/refit-format-conformance" --device=cuda ${ref:+"$ref"} "$tmp/ex/refit-fmt-scale2.so" \
  "$src/examples/example_format/scale2.yaml" "$src/tests/formats/example_format/case.yaml" ||
  rc=$?
exit $rc
