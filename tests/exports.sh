#!/bin/sh
# librefit.so exports refit_* functions and nothing else (TAP).
lib="$1"
echo "1..3"
syms=$(nm -D --defined-only "$lib" | awk '{print $3}')
n=$(printf '%s\n' "$syms" | grep -c '^refit_')
other=$(printf '%s\n' "$syms" | grep -v '^refit_' | grep -v '^$' | head -5)
[ -z "$other" ] && echo "ok 1 - only refit_ symbols" || echo "not ok 1 - foreign symbols: $other"
[ "$n" -ge 40 ] && echo "ok 2 - $n refit_ symbols exported" || echo "not ok 2 - only $n refit_ symbols"
for s in refit_open refit_begin refit_load refit_finalize refit_abort refit_replay refit_model_load_manifest \
         refit_load_many refit_source_set_create refit_source_set_repoint refit_load_set \
         refit_source_set_count refit_source_set_destroy; do
  printf '%s\n' "$syms" | grep -qx "$s" || { echo "not ok 3 - $s missing"; exit 0; }
done
echo "ok 3 - the public entry points are there"
