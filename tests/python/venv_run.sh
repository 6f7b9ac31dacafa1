#!/bin/sh
# Run a Python test with the venv's python (scripts/deps.sh), or print a
# skipped TAP plan naming what to run when there is none.
# Usage: venv_run.sh SCRIPT [ARGS...]
venv=${REFIT_VENV:-$REFIT_BUILD_ROOT/venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "1..0 # SKIP no Python venv at $venv/bin/python: run scripts/deps.sh BUILD_DIR"
  exit 0
fi
exec "$venv/bin/python" "$@"
