#!/bin/sh
# The format SDK end to end: install this build into a temporary prefix,
# build examples/example_format from that prefix alone (pkg-config
# refit-format, through a pkg-config that moves the prefix), then run the
# CPU-reference suite (test-example-format) on the plugin it made, and the
# installed conformance kit (BINDIR/refit-format-conformance) over it with
# tests/formats/example_format/case.yaml.
#   example_format.sh BUILD_DIR SOURCE_DIR TEST_BINARY [meson setup args...]
set -eu
build=$1 src=$2 testbin=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=$(sh "$src/tests/formats/example_format/build_from_prefix.sh" "$build" "$src" "$tmp" "$@")
REFIT_TEST_EXAMPLE_DIR=$tmp/ex "$testbin" > "$tmp/suite.tap" || { cat "$tmp/suite.tap"; exit 1; }
kit=$bin/refit-format-conformance
[ -x "$kit" ] || { echo "not ok - refit-format-conformance is not installed"; exit 1; }
kit_rc=0
"$kit" "$tmp/ex/refit-fmt-scale2.so" "$src/examples/example_format/scale2.yaml" \
  "$src/tests/formats/example_format/case.yaml" > "$tmp/kit.tap" || kit_rc=$?
# one TAP stream: the suite's tests, then the kit's
python3 - "$tmp/suite.tap" "$tmp/kit.tap" <<'P'
import re, sys
n = 0
for path in sys.argv[1:]:
    for line in open(path):
        m = re.match(r'(not ok|ok)( [0-9]+)?(.*)', line)
        if m:
            n += 1
            print('%s %d%s' % (m.group(1), n, m.group(3)))
        elif line.startswith('#'):
            print(line, end='')
print('1..%d' % n)
P
exit $kit_rc
