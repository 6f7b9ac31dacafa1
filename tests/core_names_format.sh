#!/bin/sh
# The core names no format (TAP): no in-tree format's name, no format
# kernel or service, no checkpoint convention in core/ or
# include/refit/format.h (dtype names such as f8_e4m3 are not formats).
# Every format's kernels live in its plugin (plugins/<fmt>/, issue 16).
#   sh tests/core_names_format.sh SOURCE_ROOT [EXTRA_DIR]
# EXTRA_DIR (the test's self-check) is searched like core/.
set -u
root=$1
extra=${2:-}
cd "$root" || exit 1
n=0
# what, pattern (extended), grep flags
check() {
    what=$1 pat=$2 flags=$3
    n=$((n + 1))
    bad=$(grep -rl $flags -E "$pat" core include/refit/format.h $extra 2>/dev/null | sort |
          tr '\n' ' ')
    if [ -z "$bad" ]; then
        echo "ok $n - $what named nowhere in core/ or format.h"
    else
        echo "not ok $n - $what named in: $bad"
        grep -n $flags -E "$pat" $bad | head -5 | sed 's/^/# /'
    fi
}
# a format's name as plugins spell it (lowercase), at a word's start
fmt='(^|[^A-Za-z0-9])'
echo "1..8"
check fp8 "${fmt}fp8" ""
check int4 "${fmt}int4" ""
check int8 "${fmt}int8([^_]|$)" ""
check mxfp8 "${fmt}(mxfp8|quant_mx)" ""
check mxfp4 "${fmt}mxfp4" ""
check nvfp4 "nvfp4" "-i"
check "ModelOpt's convention" 'modelopt|refit_nvfp4_piece' "-i"
check "format kernels and services" 'svc_quant_|kern_quant_|quant_(fp8|int4|mx|nvfp4)' "-i"
