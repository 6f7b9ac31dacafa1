#!/bin/sh
# The conformance kit's --reference (issue 32 item 3) over
# examples/example_format, built from an install prefix as its author
# builds it: the example passes with its reference (scale2_reference.py);
# a wrong build of it (scale2.c's factor 2 made a division by 0.49999,
# built here) passes every other check, but fails the kit with
# --reference, naming the tensor and the byte; a reference that fails,
# or answers without a runtime tensor, fails the check. TAP on stdout.
#   reference.sh BUILD_DIR SOURCE_DIR [meson setup args...]
set -eu
build=$1 src=$2
shift 2
venv=${REFIT_VENV:-${REFIT_BUILD_ROOT:-$build}/venv}
py=$venv/bin/python
if ! "$py" -c 'import numpy' 2>/dev/null; then
  echo "1..0 # SKIP no Python with numpy at $py: run scripts/deps.sh BUILD_DIR"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ex=$src/examples/example_format
bin=$(sh "$src/tests/formats/example_format/build_from_prefix.sh" "$build" "$src" "$tmp/good" "$@")
mkdir -p "$tmp/wrongsrc/examples"
cp -r "$ex" "$tmp/wrongsrc/examples/"
sed -i 's|out\[e\] = 2.0f \* in\[e\];|out[e] = in[e] / 0.49999f;|' \
  "$tmp/wrongsrc/examples/example_format/scale2.c"
n=0
bad=0
say() { n=$((n + 1)); echo "$1 $n - $2"; [ "$1" = ok ] || bad=1; }
if grep -q 'in\[e\] / 0.49999f' "$tmp/wrongsrc/examples/example_format/scale2.c"; then
  say ok "the wrong build's edit applies to scale2.c"
else
  say "not ok" "scale2.c no longer has 'out[e] = 2.0f * in[e];' for the wrong build to edit"
  echo "1..$n"
  exit 1
fi
sh "$src/tests/formats/example_format/build_from_prefix.sh" "$build" "$tmp/wrongsrc" \
  "$tmp/wrong" "$@" >/dev/null
kit=$bin/refit-format-conformance
ref="$py $ex/scale2_reference.py"
set -- "$ex/scale2.yaml" "$src/tests/formats/example_format/case.yaml"
# run NAME KIT-ARGS...: the kit's TAP in $tmp/NAME.tap, its status in rc
run() {
  name=$1
  shift
  rc=0
  "$kit" "$@" > "$tmp/$name.tap" 2> "$tmp/$name.err" || rc=$?
}
show() { sed 's/^/#   /' "$tmp/$1.tap" "$tmp/$1.err"; }
run good --reference="$ref" "$tmp/good/ex/refit-fmt-scale2.so" "$@"
if [ $rc -eq 0 ] && grep -qE '^ok [0-9]+ - reference: .*[^P]$' "$tmp/good.tap" &&
   grep -q 'every runtime byte equals the reference' "$tmp/good.tap"; then
  say ok "the example passes the kit with its reference"
else
  say "not ok" "the example with its reference: exit $rc"; show good
fi
run wrong_alone "$tmp/wrong/ex/refit-fmt-scale2.so" "$@"
if [ $rc -eq 0 ] && ! grep -q '^not ok' "$tmp/wrong_alone.tap"; then
  say ok "the wrong build passes every check without --reference"
else
  say "not ok" "the wrong build without --reference: exit $rc"; show wrong_alone
fi
run wrong --reference="$ref" "$tmp/wrong/ex/refit-fmt-scale2.so" "$@"
line=$(grep -A1 '^not ok [0-9]* - reference:' "$tmp/wrong.tap" | tail -n 1)
case "$rc:$line" in
  "1:#   rank 0 of 2, version A: runtime tensor m/"*" differs from the reference at byte "*)
    say ok "the wrong build fails the kit with --reference:${line#\#  }" ;;
  *) say "not ok" "the wrong build with --reference: exit $rc"; show wrong ;;
esac
if [ "$(grep -c '^not ok' "$tmp/wrong.tap")" = 1 ]; then
  say ok "only the reference check fails on the wrong build"
else
  say "not ok" "other checks fail on the wrong build too"; show wrong
fi
run failing --only=reference --reference="false" "$tmp/good/ex/refit-fmt-scale2.so" "$@"
if [ $rc -eq 1 ] && grep -q 'the reference `false .*request.json` exited with status 1' \
     "$tmp/failing.tap"; then
  say ok "a reference that exits 1 fails the check, naming it"
else
  say "not ok" "a failing reference: exit $rc"; show failing
fi
# an answer without the runtime tensors: the check names the first missing
cat > "$tmp/empty_ref.py" <<'P'
import json, struct, sys
with open(json.load(open(sys.argv[1]))["runtime"], "wb") as f:
    f.write(struct.pack("<Q", 8) + b"{}      ")
P
run empty --only=reference --reference="python3 $tmp/empty_ref.py" \
  "$tmp/good/ex/refit-fmt-scale2.so" "$@"
if [ $rc -eq 1 ] && grep -q "runtime.safetensors has no tensor m/w (runtime tensor w of module m)" \
     "$tmp/empty.tap"; then
  say ok "an answer without m/w fails the check, naming it"
else
  say "not ok" "an answer without tensors: exit $rc"; show empty
fi
echo "1..$n"
exit $bad
