#!/bin/sh
# docs_names.py catches a doc that names a missing file, folder, header or
# symbol (missing.md), and only those (missing.expect): what exists, an
# exempted name, placeholders, other projects' paths and fenced examples
# pass. (TAP)   catches.sh PYTHON SOURCE_DIR
py=$1 src=$2
here=$src/tests/docs_names
out=$(cd "$src" && "$py" tests/docs_names.py . tests/docs_names/missing.md)
rc=$?
echo "1..2"
[ "$rc" = 1 ] && echo "ok 1 - docs_names.py fails on missing.md" ||
    echo "not ok 1 - docs_names.py exits $rc on missing.md, not 1"
got=$(printf '%s\n' "$out" | grep '^# ' | sort)
want=$(sort "$here/missing.expect")
if [ "$got" = "$want" ]; then
    echo "ok 2 - it names exactly the missing paths and symbols of missing.expect"
else
    echo "not ok 2 - it named:"
    printf '%s\n' "$got" | sed 's/^#/#  got/'
    printf '%s\n' "$want" | sed 's/^#/# want/'
fi
