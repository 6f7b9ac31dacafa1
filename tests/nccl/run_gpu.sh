#!/bin/sh
# The NCCL transport on two GPUs (docs/nccl.md), in one command:
#
#   sh tests/nccl/run_gpu.sh DIST OUT
#
# DIST: a meson build folder (-Dcuda=enabled) or a flat folder (gpu-dist,
# as tests/gpu/run_all.sh documents) holding refit-bench, test-nccl-gpu,
# librefit.so, plugins/ and the shared libraries they need. Run from the
# repository root (the Python tests and the binding come from this tree).
# OUT receives, per step, a TAP log or JSON, then summary.txt:
#   env.txt               GPUs, torch, the NCCL found
#   nccl-gpu.tap          test-nccl-gpu: refit-bench nccl on a small model
#   gpu-kernels.tap       test-gpu-kernels (when staged): the device checksum
#                         (kern_fingerprint_to_cuda) against the host's, and
#                         the other kernels
#   nccl-python.tap       tests/nccl/py_nccl2.py: trainer -> CUDA-graphed
#                         Llama worker; two worker ranks voting
#   nccl-refit.json       refit-bench nccl, Llama-shaped 2.5 GB model
#   nccl-torch.json       tools/bench_nccl.py (the PyTorch peer)
#   nccl-bench.json       the two merged (ratio_to_torch_broadcast_loop)
# Without two GPUs or torch the tests print skipped plans. Step limits (s):
# T_TEST, T_PY, T_BENCH, T_TORCH. Exit status 0 when nothing failed.
#
#   sh tests/nccl/run_gpu.sh stage BUILD DIST
# copies what the run needs from a build folder into the flat folder DIST.
set -u

stage() {
    b=$1 d=$2
    mkdir -p "$d/plugins" || exit 2
    cp "$b/tools/refit-bench" "$b/tests/nccl/test-nccl-gpu" "$d/" || exit 2
    [ -x "$b/tests/gpu/test-gpu-kernels" ] && cp "$b/tests/gpu/test-gpu-kernels" "$d/"
    for f in "$b"/librefit.so*; do [ -d "$f" ] || cp -P "$f" "$d/"; done
    cp "$b"/plugins/refit-fmt-*.so "$b"/plugins/*.yaml "$d/plugins/" 2>/dev/null
    for x in "$d/refit-bench" "$d/test-nccl-gpu" "$d/librefit.so"; do
        ldd "$x" | awk '/=> \// {print $3}' | grep -E 'sqlite|yaml|jansson|cmocka' |
            xargs -r -I{} cp -L {} "$d/"
    done
    du -sh "$d"
}

[ "${1:-}" = stage ] && { stage "${2:?build dir}" "${3:?dist dir}"; exit 0; }
[ $# -eq 2 ] || { echo "usage: $0 DIST OUT | stage BUILD DIST" >&2; exit 2; }
B=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" || exit 2
O=$(cd "$2" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2

pick() { for p in "$B/$1" "$B/tools/$1" "$B/tests/nccl/$1" "$B/tests/gpu/$1"; do
           [ -e "$p" ] && { echo "$p"; return 0; }; done; echo "$B/$1"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CMOCKA_MESSAGE_OUTPUT=TAP PYTHONUNBUFFERED=1 REFIT_SOURCE_ROOT="$ROOT"
export REFIT_LIB="${REFIT_LIB:-$(pick librefit.so)}" REFIT_BENCH="$(pick refit-bench)"
export REFIT_BUILD_ROOT="$O" NCCL2_OUT="$O/journals"
[ -d "$B/plugins" ] && export REFIT_PLUGIN_PATH="$B/plugins"
# PyTorch's NCCL: refit-bench preloads it privately, as an engine would
nccl=$(python3 -c 'import importlib.util as u, os; s = u.find_spec("nvidia.nccl"); print(os.path.join(list(s.submodule_search_locations)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
export LD_LIBRARY_PATH="$B:$B/lib${nccl:+:$(dirname "$nccl")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
  echo "== $(date -u +%FT%TZ) $(uname -n)"
  nvidia-smi -L 2>&1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "devices", torch.cuda.device_count())' 2>&1
  echo "PyTorch's NCCL: ${nccl:-none found}"
  ldd "$REFIT_BENCH" 2>&1 | grep -E "not found"
} > "$O/env.txt" 2>&1
cat "$O/env.txt"

tap_missing() { printf '1..1\nnot ok 1 - %s\n' "$1" > "$2"; }

echo "== test-nccl-gpu (refit-bench nccl, small model)"
t=$(pick test-nccl-gpu)
if [ -x "$t" ]; then timeout "${T_TEST:-90}" "$t" > "$O/nccl-gpu.tap" 2>&1
else tap_missing "test-nccl-gpu is not in $B (run_gpu.sh stage)" "$O/nccl-gpu.tap"; fi
cat "$O/nccl-gpu.tap"

t=$(pick test-gpu-kernels)
if [ -x "$t" ]; then
  echo "== test-gpu-kernels (the device checksum among them)"
  timeout "${T_TEST:-90}" "$t" > "$O/gpu-kernels.tap" 2>&1
  cat "$O/gpu-kernels.tap"
fi

echo "== refit-bench nccl (Llama-shaped, 2.5 GB)"
timeout "${T_BENCH:-120}" "$REFIT_BENCH" nccl --json --timeout 15 ${nccl:+--preload "$nccl"} \
    --journal "$O/nccl-journal.db" > "$O/nccl-refit.json" 2> "$O/nccl-refit.log"
echo "refit-bench nccl exit: $?"
cat "$O/nccl-refit.json" "$O/nccl-refit.log"

echo "== PyTorch peer (tools/bench_nccl.py)"
timeout "${T_TORCH:-60}" python3 tools/bench_nccl.py > "$O/nccl-torch.json" 2> "$O/nccl-torch.log"
echo "bench_nccl.py exit: $?"
cat "$O/nccl-torch.json"

echo "== two-GPU Python tests (tests/nccl/py_nccl2.py)"
NCCL2_TIMEOUT=${T_PY_SCENARIO:-110} timeout "${T_PY:-240}" python3 tests/nccl/py_nccl2.py \
    > "$O/nccl-python.tap" 2>&1
grep -q '^1\.\.' "$O/nccl-python.tap" || echo "not ok - py_nccl2.py ended without a plan" \
    >> "$O/nccl-python.tap"
cat "$O/nccl-python.tap"

python3 - "$O" <<'PY'
import json, os, sys
o = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(o, name)))
    except Exception as e:
        return {"error": "%s: %s" % (name, e)}
r, t = load("nccl-refit.json"), load("nccl-torch.json")
r["torch"] = t
main = [c for c in r.get("refit", []) if not c["rollback"]][:1]
best = [c["seconds"] for c in r.get("refit", []) if c["checksum"] and not c["rollback"]
        and c.get("direct") == (main[0].get("direct") if main else None)]
if best and "torch_per_tensor_broadcast_s" in t:
    r["ratio_to_torch_broadcast_loop"] = t["torch_per_tensor_broadcast_s"] / min(best)
json.dump(r, open(os.path.join(o, "nccl-bench.json"), "w"), indent=1)
lines = ["bench (wire version %s): ratio_to_broadcast %s (best, checksum on), at the default "
         "bucket %s (checksum off %s, DIRECT buckets %s: %s), to the torch loop %s" % (
             r.get("wire_version"), r.get("ratio_to_broadcast"), r.get("ratio_at_default_bucket"),
             r.get("ratio_at_default_bucket_checksum_off"),
             "on" if "ratio_at_default_bucket_direct_on" in r else "off",
             r.get("ratio_at_default_bucket_direct_on", r.get("ratio_at_default_bucket_direct_off")),
             r.get("ratio_to_torch_broadcast_loop"))]
for c in r.get("refit", []):
    lines.append("  bucket %5s MiB checksum %d direct %s rollback %d: %.4f s, ratio %.3f, %d "
                 "buckets (%s us each), %s bytes in place, bit_exact %s" % (
                     c["bucket_mib"], c["checksum"], c.get("direct"), c["rollback"],
                     c["seconds"], c["ratio_to_broadcast"], c["buckets"],
                     c.get("us_per_bucket"), c.get("direct_bytes"), c["bit_exact"]))
for k in ("failed_check", "killed_trainer", "error", "skipped"):
    if k in r:
        lines.append("  %s: %s" % (k, json.dumps(r[k])[:300]))
open(os.path.join(o, "bench-summary.txt"), "w").write("\n".join(lines) + "\n")
PY

{
  for f in "$O"/*.tap; do
    printf '%s: %s ok, %s not ok, %s skipped\n' "$(basename "$f" .tap)" \
      "$(grep -c '^ok' "$f")" "$(grep -c '^not ok' "$f")" "$(grep -ci '# skip' "$f")"
  done
  cat "$O/bench-summary.txt" 2>/dev/null
} | tee "$O/summary.txt"
status=0
grep -q '^not ok' "$O"/*.tap && status=1
grep -q '"bit_exact": false' "$O/nccl-refit.json" && status=1
exit $status
