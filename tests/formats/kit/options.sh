#!/bin/sh
# The kit's options (issue 32 item 4): --help lists every check the kit
# runs (the ids of a full run's TAP lines), --only with a misspelt or
# unknown check name fails before running anything and lists the valid
# ones, and a valid --only runs just those checks; --device=cuda where it
# cannot run exits 77 saying why, a --device it does not know is a usage
# error. TAP on stdout.
#   options.sh KIT PLUGIN.so DECL.yaml CASE.yaml
set -u
kit=$1
shift
n=0
bad=0
say() { n=$((n + 1)); echo "$1 $n - $2"; [ "$1" = ok ] || bad=1; }
ids=$("$kit" "$@" 2>/dev/null | sed -n -E 's/^(not )?ok [0-9]+ - ([a-z-]+):.*/\2/p')
[ -n "$ids" ] && say ok "a full run names its checks: $(echo $ids)" ||
  say "not ok" "a full run printed no check"
help=$("$kit" --help 2>&1)
missing=""
for id in $ids; do
  printf '%s\n' "$help" | grep -qE "(^|[^a-z-])$id([^a-z-]|\$)" || missing="$missing $id"
done
[ -z "$missing" ] && say ok "--help lists every check" ||
  say "not ok" "--help leaves out:$missing"
for only in cold_start reload,colds-tart twice,; do
  out=$("$kit" --only=$only "$@" 2>&1)
  rc=$?
  listed=1
  for id in $ids; do
    printf '%s\n' "$out" | grep -qE "(^|[^a-z-])$id([^a-z-]|\$)" || listed=0
  done
  if [ "$rc" -eq 0 ]; then
    say "not ok" "--only=$only exits 0"
    printf '%s\n' "$out" | sed 's/^/#   /'
  elif printf '%s\n' "$out" | grep -qE '^(not )?ok '; then
    say "not ok" "--only=$only ran checks before refusing"
  elif [ "$listed" -ne 1 ]; then
    say "not ok" "--only=$only (exit $rc) does not list every check"
    printf '%s\n' "$out" | sed 's/^/#   /'
  else
    say ok "--only=$only refused (exit $rc), naming the valid checks"
  fi
done
out=$("$kit" --only=twice,reload "$@" 2>&1)
rc=$?
ran=$(printf '%s\n' "$out" | sed -n -E 's/^(not )?ok [0-9]+ - ([a-z-]+):.*/\2/p' | tr '\n' ' ')
[ "$rc" -eq 0 ] && [ "$ran" = "loads reload twice " ] &&
  say ok "--only=twice,reload runs loads, reload, twice" ||
  say "not ok" "--only=twice,reload: exit $rc, ran: $ran"
out=$("$kit" --device=cuda --only=loads "$@" 2>/dev/null)
rc=$?
case "$rc:$out" in
  "77:1..0 # SKIP --device=cuda:0: "*"built without CUDA"*|"77:1..0 # SKIP --device=cuda:0: no CUDA device"*)
    why=$(printf '%s\n' "$out" | head -n 1)
    say ok "--device=cuda where it cannot run: exit 77, a skipped plan saying why:${why#*SKIP}" ;;
  0:*) say ok "--device=cuda --only=loads ran on the device" ;;
  *) say "not ok" "--device=cuda: exit $rc"; printf '%s\n' "$out" | sed 's/^/#   /' ;;
esac
for dev in gpu cuda: cuda:x; do
  "$kit" --device=$dev "$@" >/dev/null 2>&1
  rc=$?
  [ $rc -eq 2 ] && say ok "--device=$dev refused as usage (exit 2)" ||
    say "not ok" "--device=$dev: exit $rc"
done
echo "1..$n"
exit $bad
