#!/bin/sh
# The core names no format (TAP): no format's name in core/ or
# include/refit/format.h, outside the files still listed as TRANSITIONAL
# below for a format whose kernels have not yet moved into its plugin
# (issue 16, step 2). A format with no list here must be absent from
# core/ and format.h altogether; take its list away when it moves.
#   sh tests/core_names_format.sh SOURCE_ROOT [EXTRA_DIR]
# EXTRA_DIR (the test's self-check) is searched like core/.
set -u
root=$1
extra=${2:-}
cd "$root" || exit 1
# format: pattern (extended, case-insensitive) and the files that may still
# name it (space-separated; empty: none)
n=0
check() {
    fmt=$1 pat=$2 allowed=$3
    n=$((n + 1))
    hits=$(grep -rilE "$pat" core include/refit/format.h $extra 2>/dev/null | sort)
    bad=""
    for f in $hits; do
        case " $allowed " in *" $f "*) ;; *) bad="$bad $f";; esac
    done
    if [ -z "$bad" ]; then
        echo "ok $n - $fmt named nowhere in core/ or format.h${allowed:+ but its transitional files}"
    else
        echo "not ok $n - $fmt named in:$bad"
        grep -niE "$pat" $bad | head -5 | sed 's/^/# /'
    fi
}
echo "1..3"
check nvfp4 'nvfp4' ""
check "ModelOpt's convention" 'modelopt|refit_nvfp4_piece' ""
# TRANSITIONAL: fp8, int4 and mx keep their services in core until their
# kernels move into plugins/fp8, plugins/int4, plugins/mxfp8.
check "fp8/int4/mx services" 'svc_quant_|kern_quant_' \
  "core/ctx.c core/cuda/backend_cuda.c core/cuda/backend_cuda.h core/cuda/kern_cuda.h include/refit/format.h core/cuda/meson.build core/meson.build core/svc_quant.h core/svc_quant_fp8.c core/svc_quant_int4.c core/svc_quant_mx.c"
