#!/bin/sh
# The core's calls go one way: txn -> plan -> model, and manifest -> model
# (issue 18). Over nm of the internal library's objects: no model.c object
# calls a symbol txn.c, plan.c or manifest.c defines, and no plan.c object
# calls one txn.c defines. There are
# no exceptions: what spans the layers (refit_model_seal, refit_model_destroy)
# lives above them, in core/model_api.c. And the leaf units every layer
# calls (util.c, ctx_base.c, names.c, errbuf.c, mod_version.c) call
# nothing another core unit defines (TAP).
# Usage: layering.sh LIBREFIT_INTERNAL.a
lib="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "1..3"
members=$(nm -A "$lib" 2>/dev/null | awk -F: '{print $2}' | sort -u)
obj() { echo "$members" | grep "core_$1\.c\.o\$" | head -1; }
for u in txn plan model manifest; do
  o=$(obj "$u")
  if [ -z "$o" ]; then
    echo "not ok 1 - no object of core/$u.c in $lib"
    echo "ok 2 # skip"; echo "ok 3 # skip"
    exit 0
  fi
  nm -A --defined-only "$lib" 2>/dev/null | awk -F: -v o="$o" '$2 == o {split($3, f, " ");
    if (f[2] ~ /^[TDBRCV]$/) print f[3]}' | sort -u > "$tmp/def_$u"
  nm -A -u "$lib" 2>/dev/null | awk -F: -v o="$o" '$2 == o {split($3, f, " "); print f[2]}' |
    sort -u > "$tmp/und_$u"
done
echo "ok 1 - objects of core/txn.c, core/plan.c, core/model.c, core/manifest.c found"

# calls CALLER CALLEE: "caller callee symbol" for each call that goes up.
calls() { comm -12 "$tmp/und_$1" "$tmp/def_$2" | sed "s/^/$1 $2 /"; }
up=$({ calls model txn; calls model plan; calls model manifest; calls plan txn; } | sort)
if [ -z "$up" ]; then
  echo "ok 2 - no call goes up the layers txn -> plan -> model, manifest -> model"
else
  echo "not ok 2 - calls going up (caller callee symbol):"
  echo "$up" | sed 's/^/#   /'
fi

# Leaves: what a leaf's object calls, against what every other core_ object
# defines. A leaf absent from the library (the fixture) is skipped.
nm -A --defined-only "$lib" 2>/dev/null | awk -F: '$2 ~ /core_/ {split($3, f, " ");
  if (f[2] ~ /^[TDBRCV]$/) print f[3], $2}' | sort > "$tmp/defs"
bad=""
for u in util ctx_base names errbuf mod_version; do
  o=$(obj "$u")
  [ -z "$o" ] && continue
  hit=$(nm -A -u "$lib" 2>/dev/null | awk -F: -v o="$o" '$2 == o {split($3, f, " "); print f[2]}' |
    sort -u | join - "$tmp/defs" | awk -v o="$o" '$2 != o {print $1}' | tr '\n' ' ')
  [ -n "$hit" ] && bad="$bad
#   $u: $hit"
done
if [ -z "$bad" ]; then
  echo "ok 3 - the leaf units call no other core unit"
else
  echo "not ok 3 - leaf units calling other core units:$bad"
fi
