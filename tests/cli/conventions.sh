#!/bin/sh
# The CLI conventions of tools/cli.h over every command of refitctl,
# refit-demo and refit-bench (TAP): --help on stdout, exit 0, each option
# explained; options after positionals; --json output and errors that
# python's json module parses (names with quotes, backslashes, control
# bytes); progress on stderr only when it is a terminal.
# Usage: conventions.sh BUILD_ROOT PYTHON
build="$1" py="$2"
ctl="$build/tools/refitctl" demo="$build/tools/refit-demo" bench="$build/tools/refit-bench"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
nok() { n=$((n + 1)); echo "not ok $n - $1"; }
json_ok() { "$py" -m json.tool "$1" >/dev/null 2>&1; }

# --help: every command and subcommand; stdout, exit 0, nothing on stderr,
# "usage:" first, every long option in the usage has a line explaining it.
help_check() {
  "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  bad=""
  [ $rc -eq 0 ] || bad="exit $rc"
  [ -s "$tmp/err" ] && bad="$bad; stderr: $(head -c 200 "$tmp/err")"
  head -1 "$tmp/out" | grep -q '^usage: ' || bad="$bad; no usage line"
  for o in $(sed -n '/^usage:/,/^$/p' "$tmp/out" | grep -o -- '--[a-z][a-z-]*' | sort -u); do
    grep -q "^  $o\b" "$tmp/out" || grep -q "^  -h, $o" "$tmp/out" || bad="$bad; $o unexplained"
  done
  [ -z "$bad" ] && ok "--help: $*" || nok "--help: $*: $bad"
}
for c in "" journal fleet safetensors snapshot formats validate manifest convert version; do
  help_check "$ctl" $c --help
done
for c in status updates "show 1" "modules 1" events verify; do
  help_check "$ctl" journal $c --help
done
help_check "$ctl" safetensors ls --help
help_check "$ctl" safetensors verify x --help
help_check "$ctl" snapshot show x --help
help_check "$ctl" manifest llama --help
help_check "$ctl" validate -h
help_check "$demo" --help
for c in "" host safetensors nccl gpu; do
  help_check "$bench" $c --help
done
"$ctl" validate help >/dev/null 2>&1; rc=$?
[ $rc -eq 1 ] && ok "'validate help' is a file named help, not a command" || nok "validate help: exit $rc"

# A checkpoint and a journal under names with a quote, a backslash, a
# newline and a tab.
odd="$tmp/a\"b\\c
d	e"
mkdir -p "$odd"
"$py" - "$odd/m.safetensors" <<'PY'
import json, struct, sys
h = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(16))
PY
st="$odd/m.safetensors"
REFIT_JOURNAL="$odd/j.db" "$demo" >/dev/null 2>&1
db="$odd/j.db"

# options after positionals, and before
"$ctl" safetensors ls --json "$st" >"$tmp/o1" 2>&1 && json_ok "$tmp/o1" &&
  ok "safetensors ls --json FILE" || nok "safetensors ls --json FILE: $(head -c 200 "$tmp/o1")"
"$ctl" safetensors ls "$st" --json >"$tmp/o2" 2>&1 && cmp -s "$tmp/o1" "$tmp/o2" &&
  ok "safetensors ls FILE --json: the same" || nok "safetensors ls FILE --json"
"$ctl" --json safetensors verify "$st" >"$tmp/o3" 2>&1 && json_ok "$tmp/o3" &&
  ok "--json before the area" || nok "--json before the area: $(head -c 200 "$tmp/o3")"
"$ctl" journal --json updates --db "$db" >"$tmp/o4" 2>&1 && json_ok "$tmp/o4" &&
  "$ctl" journal updates --db="$db" --json | cmp -s - "$tmp/o4" &&
  ok "journal: options before and after the command, --db=PATH" || nok "journal option order"
"$ctl" convert "$st" --format fp8 "$tmp/out.safetensors" >/dev/null 2>&1 &&
  ok "convert IN --format NAME OUT" || nok "convert IN --format NAME OUT"

# --json on every reading command: valid JSON, the odd names intact
check_json() {
  name="$1"; shift
  "$@" >"$tmp/j" 2>"$tmp/je"
  if json_ok "$tmp/j"; then ok "--json: $name"; else nok "--json: $name: $(head -c 300 "$tmp/j")"; fi
}
check_json "safetensors ls" "$ctl" safetensors ls --json "$st"
"$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["files"][0] == sys.argv[2], d' \
  "$tmp/o1" "$st" 2>/dev/null && ok "the odd path comes back exactly" || nok "odd path mangled"
check_json "safetensors verify" "$ctl" safetensors verify --json "$st"
check_json "validate" "$ctl" validate --json "$build/tools/demo.yaml"
check_json "formats" "$ctl" formats --json
check_json "version" "$ctl" version --json
for c in status updates "show 1" "modules 1" events verify; do
  check_json "journal $c" "$ctl" journal $c --json --db "$db"
done
check_json "fleet" "$ctl" fleet --json "$db"
check_json "fleet DIR" "$ctl" fleet "$odd" --json
check_json "refit-demo" "$demo" --json
check_json "refit-bench host --journal ODD" "$bench" host --tensors 200 --modules 20 --repeat 1 \
  --journal "$odd/bench.db" --json
check_json "refit-bench safetensors" "$bench" safetensors --size 1 --tensors 4 \
  --header-tensors 10 --repeat 1 --dir "$tmp"

# with --json, errors are JSON too (on stdout, with the exit status)
check_err() {
  name="$1" want="$2"; shift 2
  "$@" >"$tmp/e" 2>/dev/null
  rc=$?
  if [ $rc -eq "$want" ] && "$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["error"] and d["status"] == int(sys.argv[2])' "$tmp/e" "$want" 2>/dev/null; then
    ok "JSON error: $name"
  else
    nok "JSON error: $name: exit $rc: $(head -c 300 "$tmp/e")"
  fi
}
check_err "safetensors ls of a missing file" 1 "$ctl" safetensors ls --json "$odd/missing"
check_err "safetensors verify of a missing file" 1 "$ctl" safetensors verify --json "$odd/none"
check_err "journal of a missing db" 1 "$ctl" journal status --json --db "$odd/none/x.db"
check_err "fleet of a missing journal" 1 "$ctl" fleet --json "$odd/none.db"
check_err "fleet without a journal" 2 "$ctl" fleet --json
check_err "journal unknown command" 2 "$ctl" journal nope --json --db "$db"
check_err "snapshot show of a missing dir" 1 "$ctl" snapshot show --json "$odd/none"
check_err "snapshot verify of a missing dir" 1 "$ctl" snapshot verify --json "$odd/none"
check_err "snapshot unknown command" 2 "$ctl" snapshot nope --json "$odd"
check_err "an unknown option" 2 "$ctl" safetensors ls --json --bogus "$st"
check_err "validate without FILE" 2 "$ctl" validate --json
check_err "refit-bench host bad value" 2 "$bench" host --json --repeat 0
check_err "refit-bench host unusable journal" 1 "$bench" host --json --tensors 20 --modules 2 \
  --repeat 1 --journal "$odd/none/x.db"
check_err "refit-demo stray argument" 2 "$demo" --json stray

# progress: nothing on stderr when it is not a terminal; shown when it is
"$ctl" safetensors verify "$st" >/dev/null 2>"$tmp/p"
[ ! -s "$tmp/p" ] && ok "verify: quiet stderr off a terminal" || nok "verify wrote to stderr"
"$ctl" convert --format fp8 "$st" "$tmp/c.safetensors" >/dev/null 2>"$tmp/p"
[ ! -s "$tmp/p" ] && ok "convert: quiet stderr off a terminal" || nok "convert wrote to stderr"
if command -v script >/dev/null 2>&1; then
  cp "$st" "$tmp/plain.safetensors"
  script -qec "$ctl safetensors verify $tmp/plain.safetensors" "$tmp/tty" >/dev/null 2>&1
  grep -q "hashing file 1 of 1" "$tmp/tty" && ok "verify: progress on a terminal" ||
    nok "verify: no progress on a terminal"
else
  ok "# SKIP verify on a terminal: no script(1)"
fi
echo "1..$n"
