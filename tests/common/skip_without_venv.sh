#!/bin/sh
# A suite that needs Python references, run without the venv, must report
# itself skipped (a "1..0 # SKIP" plan naming scripts/deps.sh, exit 0), not
# fail. Usage: skip_without_venv.sh SUITE_EXECUTABLE
out=$(REFIT_VENV=/nonexistent/refit-venv "$1")
rc=$?
echo "1..2"
if [ $rc -eq 0 ]; then echo "ok 1 - exit status 0"; else echo "not ok 1 - exit status $rc"; fi
case "$out" in
"1..0 # SKIP no Python venv at /nonexistent/refit-venv/bin/python: run scripts/deps.sh"*)
  echo "ok 2 - skipped plan names what to run" ;;
*) echo "not ok 2 - printed: $out" ;;
esac
