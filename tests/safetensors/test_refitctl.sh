#!/bin/sh
# refitctl safetensors end to end, TAP output. Usage: test_refitctl.sh REFITCTL
# Exit statuses, stdout formats, and the one-line error contract.
set -u
ctl=$1
root=${REFIT_SOURCE_ROOT:-.}
fix="$root/tests/data/hf-tiny-llama-sharded"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/refit-st-ctl-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
n=0
fail=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
no() { n=$((n + 1)); fail=1; echo "not ok $n - $1"; }
check() { if eval "$2"; then ok "$1"; else no "$1"; fi; }

echo "1..17"
"$ctl" safetensors ls "$fix" >"$tmp/ls" 2>"$tmp/err"; rc=$?
check "ls exits 0" '[ $rc -eq 0 ] && [ ! -s "$tmp/err" ]'
check "ls lists 21 tensors" '[ $(grep -c " BF16 " "$tmp/ls") -eq 21 ]'
check "ls shows shape and bytes" \
  'grep -q "^model.embed_tokens.weight  *BF16  *\[256, 64\]  *32768  *model-00001-of-00007.safetensors$" "$tmp/ls"'

"$ctl" safetensors ls "$fix" --json >"$tmp/json"; rc=$?
check "ls --json exits 0" '[ $rc -eq 0 ]'
python3 - "$tmp/json" <<'PY' && ok "ls --json has files and tensors as specified" || no "ls --json has files and tensors as specified"
import json, sys
d = json.load(open(sys.argv[1]))
assert sorted(d) == ["files", "tensors"] and len(d["files"]) == 7
t = {x["name"]: x for x in d["tensors"]}
assert len(t) == 21
e = t["model.embed_tokens.weight"]
assert sorted(e) == ["bytes", "dtype", "file", "name", "shape"]
assert e["dtype"] == "BF16" and e["shape"] == [256, 64] and e["bytes"] == 32768
assert e["file"] in d["files"] and e["file"].endswith("model-00001-of-00007.safetensors")
assert sum(x["bytes"] for x in d["tensors"]) == 213632
PY

"$ctl" safetensors verify "$fix" >"$tmp/verify"; rc=$?
check "verify exits 0" '[ $rc -eq 0 ]'
(cd "$fix" && sha256sum *.safetensors) | sed "s|  |  $fix/|" >"$tmp/want"
grep -v '^ok:' "$tmp/verify" >"$tmp/got"
check "verify prints sha256sum's digests" 'cmp -s "$tmp/want" "$tmp/got"'
check "verify summary" 'grep -q "^ok: 7 files, 21 tensors, 213632 bytes" "$tmp/verify"'

# A shard whose tensor span is one byte short: exit 1, one line naming the
# file, the tensor and the rule.
mkdir "$tmp/bad"
cp "$fix"/* "$tmp/bad/"
bad="$tmp/bad/model-00002-of-00007.safetensors"
python3 - "$bad" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["model.layers.0.self_attn.q_proj.weight"]["shape"] = [64, 63]
t = json.dumps(h).encode()
open(p, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
"$ctl" safetensors verify "$tmp/bad" >/dev/null 2>"$tmp/err"; rc=$?
check "invalid checkpoint exits 1" '[ $rc -eq 1 ]'
check "exactly one stderr line" '[ $(wc -l <"$tmp/err") -eq 1 ]'
check "it names file, tensor and rule" \
  'grep -q "$bad: tensor .model.layers.0.self_attn.q_proj.weight.: .*\[size-mismatch\]" "$tmp/err"'
"$ctl" safetensors ls "$tmp/nope" >/dev/null 2>"$tmp/err"; rc=$?
check "missing path exits 1 with one line" '[ $rc -eq 1 ] && [ $(wc -l <"$tmp/err") -eq 1 ]'
# a name with control bytes (ESC [2J clears a terminal; a newline fakes a line)
python3 - "$tmp/ctrl.safetensors" <<'PY'
import json, struct, sys
h = json.dumps({"evil\x1b[2J\nname\\x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})
h += " " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h.encode() + b"\0")
PY
"$ctl" safetensors ls "$tmp/ctrl.safetensors" >"$tmp/ctrl" 2>"$tmp/err"; rc=$?
check "ls of a name with control bytes exits 0" '[ $rc -eq 0 ]'
check "control bytes are printed escaped" \
  'grep -qF "evil\x1b[2J\x0aname\\\\x " "$tmp/ctrl" && [ $(wc -l <"$tmp/ctrl") -eq 3 ]'
check "no raw control byte reaches the terminal" \
  '! LC_ALL=C grep -q "$(printf "\033")" "$tmp/ctrl"'
"$ctl" safetensors frobnicate "$fix" >/dev/null 2>&1; rc=$?
check "unknown command exits 2" '[ $rc -eq 2 ]'
"$ctl" safetensors ls >/dev/null 2>&1; rc=$?
check "missing PATH exits 2" '[ $rc -eq 2 ]'
exit $fail
