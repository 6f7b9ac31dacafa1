#!/bin/sh
# The NCCL transport on two GPUs (docs/nccl.md), in two steps:
#
#   tests/nccl/run_gpu.sh stage BUILD_DIR   where refit was built (CUDA build):
#       copies refit-bench, test-nccl-gpu, the .so's they link and the
#       unquantized format plugin into .nccl-gpu/ (add it to
#       .git/info/exclude; carry it to the GPU machine)
#   tests/nccl/run_gpu.sh run               on the machine with two GPUs,
#       from the repository root: the nccl-gpu test (small model), then
#       refit-bench nccl on a Llama-shaped model with PyTorch's NCCL loaded
#       first in each rank, then the PyTorch peer (tools/bench_nccl.py).
#       Results go to $OUT (when set) and bench/results/.
set -u
STAGE=${STAGE:-.nccl-gpu}

stage() {
    b=$1
    rm -rf "$STAGE" && mkdir -p "$STAGE/tools" "$STAGE/tests" "$STAGE/lib" "$STAGE/plugins"
    cp "$b/tools/refit-bench" "$STAGE/tools/"
    cp "$b/tests/nccl/test-nccl-gpu" "$STAGE/tests/"
    cp "$b/plugins/refit-fmt-unquantized.so" "$b/plugins/unquantized.yaml" "$STAGE/plugins/"
    for x in "$STAGE/tools/refit-bench" "$STAGE/tests/test-nccl-gpu"; do
        ldd "$x" | awk '/=> \// {print $3}' | grep -E 'sqlite|yaml|jansson|cmocka' |
            xargs -r -I{} cp -L {} "$STAGE/lib/"
    done
    du -sh "$STAGE"
}

run() {
    out=${OUT:-bench/results}
    res=bench/results
    mkdir -p "$out" "$res"
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    export REFIT_PLUGIN_PATH="$PWD/$STAGE/plugins" REFIT_BUILD_ROOT="$PWD/$STAGE"
    nccl=$(python3 -c 'import importlib.util as u, os; s = u.find_spec("nvidia.nccl"); print(os.path.join(list(s.submodule_search_locations)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
    export LD_LIBRARY_PATH="$PWD/$STAGE/lib:$(dirname "${nccl:-/x/x}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi -L
    echo "PyTorch's NCCL: $nccl"
    echo "== nccl-gpu test (small Llama-shaped model)"
    CMOCKA_MESSAGE_OUTPUT=TAP timeout "${T_TEST:-60}" "$STAGE/tests/test-nccl-gpu"
    echo "test-nccl-gpu exit: $?"
    echo "== refit-bench nccl"
    timeout "${T_BENCH:-100}" "$STAGE/tools/refit-bench" nccl --json --timeout 15 --preload "$nccl" \
        --journal "$out/nccl-journal.db" > "$out/nccl-refit.json"
    echo "refit-bench nccl exit: $?"
    cat "$out/nccl-refit.json"
    echo "== PyTorch peer"
    PYTHONUNBUFFERED=1 timeout "${T_TORCH:-60}" python3 tools/bench_nccl.py > "$out/nccl-torch.json"
    echo "bench_nccl.py exit: $?"
    cat "$out/nccl-torch.json"
    python3 - "$out/nccl-refit.json" "$out/nccl-torch.json" "$out/$stamp-nccl.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
try:
    t = json.load(open(sys.argv[2]))
except Exception as e:
    t = {"error": str(e)}
r["torch"] = t
best = [c["seconds"] for c in r.get("refit", []) if c["checksum"] and not c["rollback"]]
if best and "torch_per_tensor_broadcast_s" in t:
    r["ratio_to_torch_broadcast_loop"] = t["torch_per_tensor_broadcast_s"] / min(best)
json.dump(r, open(sys.argv[3], "w"), indent=1)
print("written", sys.argv[3])
PY
    [ "$out" = "$res" ] || cp "$out/$stamp-nccl.json" "$res/" 2>/dev/null
}

case "${1:-}" in
stage) stage "${2:?build dir}" ;;
run) run ;;
*) echo "usage: $0 stage BUILD_DIR | run" >&2; exit 2 ;;
esac
