#!/bin/sh
# Copy what the GPU runs need from a CUDA build folder into one flat folder,
# to carry to a GPU machine that has no SQLite/libyaml/CMocka:
#
#   sh tests/gpu/stage.sh BUILD DIST
#
# DIST then holds every test-gpu-* and test-nccl-gpu, refit-bench,
# refitctl, librefit.so*, plugins/ (refit-fmt-*.so and *.yaml), example/
# (the example format built from an install prefix, with CUDA) and the
# shared libraries of those that the GPU machine lacks. Both
# `sh tests/gpu/run_all.sh DIST OUT` and `sh tests/nccl/run_gpu.sh DIST OUT`
# take it.
set -eu
B=${1:?build dir}
D=${2:?dist dir}
rm -rf "$D"
mkdir -p "$D/plugins"
for f in "$B"/tests/gpu/test-gpu-* "$B"/tests/nccl/test-nccl-gpu "$B"/tools/refit-bench \
         "$B"/tools/refitctl; do
    [ -f "$f" ] && [ -x "$f" ] && cp "$f" "$D/"
done
for f in "$B"/librefit.so*; do [ -d "$f" ] || cp -P "$f" "$D/"; done
cp "$B"/plugins/refit-fmt-*.so "$B"/plugins/*.yaml "$D/plugins/" 2>/dev/null || true
for x in "$D"/test-* "$D"/refit-bench "$D"/refitctl "$D"/librefit.so; do
    ldd "$x" | awk '/=> \// {print $3}' | grep -E 'sqlite|yaml|jansson|cmocka|crypto' || true
done | sort -u | xargs -r -I{} cp -L {} "$D/"
# the out-of-tree example format with its CUDA kernel, built from an
# install prefix of B as its author would (tests/gpu/py_example_format.py)
arch=$(meson introspect "$B" --buildoptions 2>/dev/null | python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
print(",".join(o.get("cuda-arch", [])) if o.get("cuda") != "disabled" else "")' || true)
have_nvcc=0
{ command -v nvcc || [ -x /usr/local/cuda/bin/nvcc ]; } >/dev/null 2>&1 && have_nvcc=1
if [ -n "$arch" ] && [ "$have_nvcc" = 1 ]; then
    ex=$(mktemp -d)
    if sh "$(dirname "$0")/../formats/example_format/build_from_prefix.sh" "$B" \
          "$(cd "$(dirname "$0")/../.." && pwd)" "$ex" -Dcuda=enabled "-Dcuda-arch=$arch" \
          >/dev/null; then
        mkdir -p "$D/example"
        cp "$ex/ex/refit-fmt-scale2.so" "$ex/ex/scale2.yaml" "$D/example/"
    else
        echo "stage.sh: the example format did not build (see above); staged without it" >&2
    fi
    rm -rf "$ex"
fi
# debug info stays here: the carry to the GPU machine is size-limited
for f in "$D"/test-* "$D"/refit-bench "$D"/refitctl "$D"/librefit.so.*.* "$D"/plugins/*.so \
         "$D"/example/*.so; do
    [ -f "$f" ] && strip --strip-debug "$f"
done
chmod -R go-w "$D"
ls "$D" | tr '\n' ' '
echo
du -sh "$D"
