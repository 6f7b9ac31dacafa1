#!/bin/sh
# Every GPU test and the GPU benchmark, in one go, on a machine with a GPU:
#   tests/gpu/run_all.sh BUILD_DIR OUT_DIR [bench options...]
# BUILD_DIR: a meson build folder (-Dcuda=enabled), or a flat folder holding
# test-gpu-kernels, test-gpu-backend, test-gpu-quant, test-gpu-fp8,
# refit-bench, librefit.so, plugins/ (refit-fmt-*.so and *.yaml) and the
# shared libraries they need. OUT_DIR receives the TAP logs, bench.json and a
# summary. The Python suites (tests/gpu/py_*.py) run from this source tree.
# Extra arguments go to refit-bench gpu. Exit status: 0 when nothing failed.
set -u
B=$(cd "$1" && pwd) || exit 2
O=$2
shift 2
mkdir -p "$O" || exit 2
O=$(cd "$O" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2

pick() { for p in "$B/$1" "$B/tests/gpu/$1" "$B/tools/$1"; do
           [ -e "$p" ] && { echo "$p"; return 0; }; done; echo "$B/$1"; }
export CMOCKA_MESSAGE_OUTPUT=TAP REFIT_SOURCE_ROOT="$ROOT" PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH="$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export REFIT_LIB="${REFIT_LIB:-$(pick librefit.so)}"
[ -d "$B/plugins" ] && export REFIT_PLUGIN_PATH="$B/plugins${REFIT_PLUGIN_PATH:+:$REFIT_PLUGIN_PATH}"

{
  echo "== $(date -u +%FT%TZ) $(uname -n)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  python3 -c 'import torch, transformers, safetensors; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "safetensors", safetensors.__version__)' 2>&1
  ldd "$(pick refit-bench)" 2>&1 | grep -E "not found|sqlite|yaml|jansson|cmocka|cuda"
  nm -D --defined-only "$REFIT_LIB" 2>/dev/null | awk '{print $3}' | grep -vc '^refit_' | sed 's/^/non-refit exports of librefit.so: /'
} > "$O/env.txt" 2>&1
cat "$O/env.txt"

status=0
# the four first, then any other test-gpu-* the build holds (one per format)
more=$(for f in "$B"/test-gpu-* "$B"/tests/gpu/test-gpu-*; do
         [ -x "$f" ] && [ -f "$f" ] && basename "$f"; done 2>/dev/null |
       grep -vxE 'test-gpu-(kernels|backend|quant|fp8)' | sort -u)
# suite TEST TAP [VAR=VALUE ...]: run TEST of the build with the given
# environment into TAP (a not-ok point when the build lacks it)
suite() {
  t=$1 f=$2
  shift 2
  if [ -x "$(pick $t)" ]; then
    env "$@" "$(pick $t)" > "$f" 2>&1 || status=1
  else
    printf '1..1\nnot ok 1 - %s is not in %s\n' "$t" "$B" > "$f"
  fi
  cat "$f"
}
for t in test-gpu-kernels test-gpu-backend test-gpu-quant test-gpu-fp8 $more; do
  echo "== $t"
  suite $t "$O/$t.tap"
done
# the backend's other device paths: every D2D piece and device undo save
# through cudaMemcpyAsync (by default only those of 128 MB or more)
for t in test-gpu-backend test-gpu-undo; do
  echo "== $t, memcpy paths"
  suite $t "$O/$t-memcpy.tap" REFIT_CUDA_D2D_MEMCPY_MIN_KB=1 REFIT_CUDA_SAVE_DEV_MEMCPY_MIN_KB=1
done
echo "== python"
python3 tests/gpu/run_py.py > "$O/python.tap" 2>&1 || status=1
cat "$O/python.tap"
echo "== refit-bench gpu $*"
"$(pick refit-bench)" gpu --out "$O/bench.json" "$@" > "$O/bench.log" 2>&1 || status=1
cat "$O/bench.log"

{
  for f in "$O"/*.tap; do
    printf '%s: %s ok, %s not ok, %s skipped\n' "$(basename "$f" .tap)" \
      "$(grep -c '^ok' "$f")" "$(grep -c '^not ok' "$f")" "$(grep -ci '# skip' "$f")"
  done
} | tee "$O/summary.txt"
grep -q '^not ok' "$O"/*.tap && status=1
exit $status
