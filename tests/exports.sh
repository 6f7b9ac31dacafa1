#!/bin/sh
# librefit.so exports refit_* functions and nothing else, each under the
# version node REFIT_0 (core/librefit.map, docs/abi.md), and exactly the
# functions the installed headers declare REFIT_API (TAP).
# Usage: exports.sh LIB HEADER...
lib="$1"
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "1..6"
nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^REFIT_0$' | grep -v '^$' > "$tmp/versioned"
sed 's/@.*//' "$tmp/versioned" | sort -u > "$tmp/syms"
n=$(grep -c '^refit_' "$tmp/syms")
other=$(grep -v '^refit_' "$tmp/syms" | head -5 | tr '\n' ' ')
[ -z "$other" ] && echo "ok 1 - only refit_ symbols" || echo "not ok 1 - foreign symbols: $other"
[ "$n" -ge 40 ] && echo "ok 2 - $n refit_ symbols exported" || echo "not ok 2 - only $n refit_ symbols"
miss=""
for s in refit_open refit_begin refit_load refit_finalize refit_abort refit_replay \
         refit_model_load_manifest refit_nccl_probe \
         refit_load_many refit_source_set_create refit_source_set_repoint refit_load_set \
         refit_source_set_count refit_source_set_destroy; do
  grep -qx "$s" "$tmp/syms" || miss="$miss $s"
done
[ -z "$miss" ] && echo "ok 3 - the public entry points are there" || echo "not ok 3 - missing:$miss"
unversioned=$(grep -v '@@REFIT_0$' "$tmp/versioned" | head -5 | tr '\n' ' ')
[ -z "$unversioned" ] && echo "ok 4 - every export is under version node REFIT_0" ||
  echo "not ok 4 - not under REFIT_0: $unversioned"
perl -0777 -ne 's{/\*.*?\*/}{}gs; print "$1\n" while /\bREFIT_API\b[^;{}#]*?\b(refit_\w+)\s*\(/gs' "$@" |
  sort -u > "$tmp/declared"
undeclared=$(comm -23 "$tmp/syms" "$tmp/declared" | head -5 | tr '\n' ' ')
[ -z "$undeclared" ] && echo "ok 5 - every export is declared REFIT_API in an installed header" ||
  echo "not ok 5 - exported, in no installed header: $undeclared"
unexported=$(comm -13 "$tmp/syms" "$tmp/declared" | head -5 | tr '\n' ' ')
[ -z "$unexported" ] && echo "ok 6 - every REFIT_API function of the installed headers is exported" ||
  echo "not ok 6 - declared, not exported: $unexported"
