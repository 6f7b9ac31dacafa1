#!/bin/sh
# Usage: check_symbols.sh LIBREFIT_INTERNAL.a PLUGIN.so...
# A plugin links no core symbol and exports exactly one: for each plugin,
# no undefined symbol may be one the core library defines, and the only
# defined dynamic symbol must be refit_format_plugin_v2 (sanitizer builds
# add their own __asan/__odr_asan/__ubsan bookkeeping, which is allowed).
set -eu
archive=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm --defined-only -g --format=posix "$archive" 2>/dev/null |
  awk 'NF >= 2 && $2 != "U" { print $1 }' | sort -u >"$tmp/core"
[ -s "$tmp/core" ] || { echo "no symbols read from $archive"; exit 1; }
status=0
for so in "$@"; do
  nm -D --undefined-only --format=posix "$so" | awk '{ print $1 }' | sed 's/@.*//' |
    sort -u >"$tmp/undef"
  common=$(comm -12 "$tmp/core" "$tmp/undef")
  if [ -n "$common" ]; then
    echo "FAIL $so links core symbols:" $common
    status=1
  fi
  exported=$(nm -D --defined-only --format=posix "$so" | awk '{ print $1 }' |
    grep -v -e '^__asan' -e '^__odr_asan' -e '^__ubsan' -e '^__sanitizer' \
            -e '^_init$' -e '^_fini$' -e '^_edata$' -e '^_end$' -e '^__bss_start$' || true)
  if [ "$exported" != "refit_format_plugin_v2" ]; then
    echo "FAIL $so exports:" $exported "(want refit_format_plugin_v2 alone)"
    status=1
  else
    echo "ok $so: exports refit_format_plugin_v2 alone, links no core symbol"
  fi
done
exit $status
