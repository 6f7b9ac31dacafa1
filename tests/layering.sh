#!/bin/sh
# The core's calls go one way: txn -> plan -> model, and manifest -> model
# (issue 18). Over nm of the internal library's objects: no model.c object
# calls a symbol txn.c, plan.c or manifest.c defines, and no plan.c object
# calls one txn.c defines. There are
# no exceptions: what spans the layers (refit_model_seal, refit_model_destroy)
# lives above them, in core/model_api.c. And the leaf units every layer
# calls (util.c, ctx_base.c, names.c, errbuf.c, mod_version.c, and ctx.c,
# which may call ctx_base.c) call nothing another core unit defines; what
# wires a context at refit_open is above them, in core/ctx_open.c. The
# journal's files stand on floors (issue 34, docs/journal.md): each calls
# only files of lower floors, and every journal file has a floor (check 4).
# The transports (transports/, a floor above the core) may call the core;
# no core object calls a symbol a transports object defines (check 5)
# (TAP).
# Usage: layering.sh LIBREFIT_INTERNAL.a [core|journal|transports]  (default: all)
lib="$1"
part="${2:-all}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "1..5"
members=$(nm -A "$lib" 2>/dev/null | awk -F: '{print $2}' | sort -u)
obj() { echo "$members" | grep "core_$1\.c\.o\$" | head -1; }
core_checks() {
for u in txn plan model manifest; do
  o=$(obj "$u")
  if [ -z "$o" ]; then
    echo "not ok 1 - no object of core/$u.c in $lib"
    echo "ok 2 # skip"; echo "ok 3 # skip"
    return
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
# LEAF:OTHER names the one unit the leaf may call (ctx.c its ctx_base.c).
nm -A --defined-only "$lib" 2>/dev/null | awk -F: '$2 ~ /core_/ {split($3, f, " ");
  if (f[2] ~ /^[TDBRCV]$/) print f[3], $2}' | sort > "$tmp/defs"
bad=""
for leaf in util ctx_base names errbuf mod_version ctx:ctx_base; do
  u=${leaf%%:*}
  o=$(obj "$u")
  [ -z "$o" ] && continue
  may=""
  [ "$u" != "$leaf" ] && may=$(obj "${leaf#*:}")
  hit=$(nm -A -u "$lib" 2>/dev/null | awk -F: -v o="$o" '$2 == o {split($3, f, " "); print f[2]}' |
    sort -u | join - "$tmp/defs" | awk -v o="$o" -v m="$may" '$2 != o && $2 != m {print $1}' |
    tr '\n' ' ')
  [ -n "$hit" ] && bad="$bad
#   $u: $hit"
done
if [ -z "$bad" ]; then
  echo "ok 3 - the leaf units call no other core unit"
else
  echo "not ok 3 - leaf units calling other core units:$bad"
fi
}

# The journal's floors, lowest first: a file calls only files of a lower
# floor. 0 the handle (errors, statements) and the process probe; 1 locks;
# 2 rows inside the caller's transaction; 3 the held end; 4 the
# transaction; 5 schema, plans, reads; 6 the public writes; 7 open/close,
# which wires them.
journal_floors="journal:0 proc:0 lock:1 rows:2 held:3 tx:4 schema:5 plan:5 read:5
delta:6 progress:6 update:6 verify:6 write:6 open:7"
journal_checks() {
  # unit names of the journal's objects: journal_journal.c.o -> journal,
  # journal_journal_tx.c.o -> tx
  echo "$members" | grep 'journal_journal\(_[a-z]*\)\?\.c\.o$' > "$tmp/jobjs"
  if [ ! -s "$tmp/jobjs" ]; then
    echo "not ok 4 - no object of journal/*.c in $lib"
    return
  fi
  jname() { echo "$1" | sed 's/.*journal_journal\(_\([a-z]*\)\)\?\.c\.o$/\2/; s/^$/journal/'; }
  : > "$tmp/jdefs"
  while read -r o; do
    nm -A --defined-only "$lib" 2>/dev/null | awk -F: -v o="$o" -v u="$(jname "$o")" \
      '$2 == o {split($3, f, " "); if (f[2] ~ /^[TDBRCV]$/) print f[3], u}' >> "$tmp/jdefs"
  done < "$tmp/jobjs"
  sort -o "$tmp/jdefs" "$tmp/jdefs"
  bad=""
  while read -r o; do
    u=$(jname "$o")
    fu=$(echo "$journal_floors" | tr ' ' '\n' | awk -F: -v u="$u" '$1 == u {print $2}')
    if [ -z "$fu" ]; then
      bad="$bad
#   journal_$u.c has no floor in layering.sh"
      continue
    fi
    nm -A -u "$lib" 2>/dev/null | awk -F: -v o="$o" '$2 == o {split($3, f, " "); print f[2]}' |
      sort -u | join - "$tmp/jdefs" > "$tmp/jcalls"
    while read -r sym v; do
      [ "$v" = "$u" ] && continue
      fv=$(echo "$journal_floors" | tr ' ' '\n' | awk -F: -v u="$v" '$1 == u {print $2}')
      [ -n "$fv" ] && [ "$fv" -lt "$fu" ] && continue
      bad="$bad
#   $u (floor $fu) calls $v (floor ${fv:-none}): $sym"
    done < "$tmp/jcalls"
  done < "$tmp/jobjs"
  if [ -z "$bad" ]; then
    echo "ok 4 - the journal's files call only lower floors"
  else
    echo "not ok 4 - journal calls not going down the floors:$bad"
  fi
}

# The core under the transports: what core objects call, against what
# transports objects define.
transport_checks() {
  nm -A --defined-only "$lib" 2>/dev/null | awk -F: '$2 ~ /transports_/ {split($3, f, " ");
    if (f[2] ~ /^[TDBRCV]$/) print f[3], $2}' | sort -k1,1 > "$tmp/tdefs"
  if [ ! -s "$tmp/tdefs" ]; then
    echo "not ok 5 - no object of transports/ in $lib"
    return
  fi
  up=$(nm -A -u "$lib" 2>/dev/null | awk -F: '$2 ~ /core_/ && $2 !~ /transports_/ {
    split($3, f, " "); print f[2], $2}' | sort -k1,1 | join - "$tmp/tdefs" |
    awk '{print "#   " $2 " calls " $1 " of " $3}')
  if [ -z "$up" ]; then
    echo "ok 5 - the core calls nothing of the transports"
  else
    echo "not ok 5 - core objects calling up into the transports:"
    echo "$up"
  fi
}

case "$part" in
  core) core_checks; echo "ok 4 # skip the journal"; echo "ok 5 # skip the transports" ;;
  journal) echo "ok 1 # skip the core"; echo "ok 2 # skip"; echo "ok 3 # skip"; journal_checks
           echo "ok 5 # skip the transports" ;;
  transports) echo "ok 1 # skip the core"; echo "ok 2 # skip"; echo "ok 3 # skip"
              echo "ok 4 # skip the journal"; transport_checks ;;
  *) core_checks; journal_checks; transport_checks ;;
esac
