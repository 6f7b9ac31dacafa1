#!/bin/sh
# Build a fuzz target with libFuzzer + ASan + UBSan and run it.
# Usage: tests/fuzz/run.sh [SECONDS] [TARGET]   (default 60; 0 = build only)
# TARGET: safetensors (default; the header parser and the index reader),
# manifest (model manifests: YAML, schema, expansion), bucket (the NCCL
# bucket announce and index), ipc (the colocated transport's control
# messages: transports/ipc/msg.c, transports/ipc/keeper_msg.c). The seed corpus in
# tests/fuzz/corpus/ (and tests/fuzz/corpus-TARGET/ where there is one) is
# read, never written: new inputs go to build-fuzz/corpus-TARGET/, crashes
# to build-fuzz/.
set -eu
secs=${1:-60}
target=${2:-safetensors}
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/build-fuzz"
cflags="-std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Werror \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I$root/include -I$root"
seeds=""
case "$target" in
safetensors)
  srcs="core/safetensors.c core/sha256.c"
  libs=$(pkg-config --cflags --libs jansson)
  seeds="$root/tests/fuzz/corpus"
  extra="-dict=$root/tests/fuzz/safetensors.dict -max_len=65536"
  ;;
manifest)
  mkdir -p "$out"
  python3 "$root/schemas/embed.py" "$out/schema_data.c" \
    "format=$root/schemas/format.schema.yaml" "model=$root/schemas/model.schema.yaml"
  srcs="schemas/ydoc.c schemas/schema.c schemas/model_doc.c core/names.c core/status.c $out/schema_data.c"
  libs=$(pkg-config --cflags --libs yaml-0.1)
  seeds="$root/tests/fuzz/corpus-manifest"
  extra="-dict=$root/tests/fuzz/manifest.dict -max_len=16384 -rss_limit_mb=1024 -timeout=10"
  ;;
bucket)
  srcs="transports/nccl/bucket.c core/errbuf.c core/status.c kernels/fingerprint.c kernels/copy.c kernels/cast.c"
  libs=""
  extra="-max_len=16384"
  ;;
ipc)
  srcs="transports/ipc/msg.c transports/ipc/keeper_msg.c transports/ipc/chan.c transports/nccl/bucket.c core/errbuf.c \
    core/status.c kernels/fingerprint.c kernels/copy.c kernels/cast.c"
  libs=""
  seeds="$root/tests/fuzz/corpus-ipc"
  extra="-max_len=4096"
  ;;
*)
  echo "run.sh: unknown target $target (safetensors, manifest, bucket, ipc)" >&2
  exit 2
  ;;
esac
mkdir -p "$out/corpus-$target"
# shellcheck disable=SC2086
(cd "$root" && clang $cflags "tests/fuzz/fuzz_$target.c" $srcs $libs -o "$out/fuzz_$target")
[ "$secs" -gt 0 ] || exit 0
cd "$out"
# shellcheck disable=SC2086
exec ./fuzz_$target -max_total_time="$secs" -print_final_stats=1 $extra \
  "corpus-$target" $seeds
