#!/bin/sh
# Run the conformance kit and hold it to a verdict per check: the checks
# named in FAILING must report "not ok", every other one "ok" (a bail-out
# after a failed declaration check counts for the rest), and the kit's exit
# status must say so (1 when any is named, else 0). TAP on stdout.
#   expect.sh "FAILING IDS" KIT [KIT ARGS...]
set -u
failing=$1
shift
out=$("$@" 2>&1)
rc=$?
n=0
bad=0
say() { n=$((n + 1)); echo "$1 $n - $2"; }
for id in loads declaration cold-start reload twice many tp nan refusal; do
  line=$(printf '%s\n' "$out" | grep -E "^(not )?ok [0-9]+ - $id:" | head -n 1)
  want=ok
  case " $failing " in *" $id "*) want="not ok" ;; esac
  if [ -z "$line" ]; then
    if printf '%s\n' "$out" | grep -q '^Bail out!' && [ "$want" = "not ok" ]; then
      say ok "$id: not run after the bail-out, as expected"
    elif printf '%s\n' "$out" | grep -q '^Bail out!' ; then
      say "not ok" "$id: not run (bail-out), but it was expected to pass"; bad=1
    else
      say "not ok" "$id: the kit printed no verdict"; bad=1
    fi
    continue
  fi
  case "$line" in
    "not ok"*) got="not ok" ;;
    *) got=ok ;;
  esac
  if [ "$got" = "$want" ]; then say ok "$id: $got as expected"; else say "not ok" "$id: $got, expected $want"; bad=1; fi
done
wantrc=0
[ -n "$failing" ] && wantrc=1
if [ "$rc" -eq "$wantrc" ]; then say ok "exit status $rc"; else say "not ok" "exit status $rc, expected $wantrc"; bad=1; fi
if [ "$bad" -ne 0 ]; then printf '%s\n' "$out" | sed 's/^/# /'; fi
echo "1..$n"
