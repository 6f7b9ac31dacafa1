# Sourced by run*.sh (after R, E, W are set; EMU_SAN: extra compiler
# flags, e.g. AddressSanitizer): a format's device code as an emulated
# image, and the C objects of its launcher, direct entries and test.
#
# emu_image SRC IMAGE WANT [g++ flags]: SRC (the .cu, its vector accesses
# already rewritten through EMU_AL) becomes $W/IMAGE_emu.o, which defines
# the image symbol IMAGE (e.g. fp8_image, what the direct entries pass to
# pgpu_cudart_begin) and registers SRC's extern "C" kernels under it for
# pgpu_emu.cc to find by name. The kernels are listed from SRC
# preprocessed (emu.h leaves __global__ there as a mark), so that those a
# macro defines are found too; WANT of them expected (the names are
# printed, and a different count stops the script).
#
# emu_cc FILE... : each repository-relative C file to $W/<its name>.o,
# built against the emulator's runtime API (c/cuda_runtime_api.h); CFLAGS_EMU
# adds flags (e.g. a test's -DREFIT_GPU_EMU).
EMU_SAN=${EMU_SAN:-}
CXX_EMU="g++ -std=c++17 -O1 -g $EMU_SAN -Wall -Wno-unknown-pragmas -I$E -I$R/include -I$R"
CC_EMU="gcc -std=c11 -D_GNU_SOURCE -O1 -g $EMU_SAN -Wall -Wextra -I$E/c -I$R/include -I$R"

emu_image() {
  src=$1 image=$2 want=$3
  shift 3
  kernels=$($CXX_EMU "$@" -DEMU_LIST_KERNELS -E -P "$src" | tr -s ' \t\n' '   ' |
    grep -oE 'extern "C" emu_global void [A-Za-z_][A-Za-z0-9_]* ?\(' |
    sed -E 's/.* ([A-Za-z_][A-Za-z0-9_]*) ?\($/\1/')
  n=$(echo "$kernels" | grep -c . || true)
  if [ "$n" != "$want" ]; then
    echo "$(basename "$0"): $n kernels found in $(basename "$src"), $want expected:" $kernels >&2
    exit 1
  fi
  {
    echo "#include \"$src\""
    echo "EMU_IMAGE($image"
    for k in $kernels; do echo "  , EMU_KERNEL($k)"; done
    echo ')'
  } > "$W/${image}_emu.cc"
  echo "$image: emulating $n kernels:" $kernels
  $CXX_EMU "$@" -c "$W/${image}_emu.cc" -o "$W/${image}_emu.o"
}

emu_cc() {
  for f in "$@"; do
    $CC_EMU ${CFLAGS_EMU:-} -c "$R/$f" -o "$W/$(basename "$f" .c).o"
  done
}

# emu_fp8_image: plugins/fp8/quant_fp8.cu as fp8_image (run.sh; run_mx.sh
# too, as mxfp8 links it for the conversion check): every plain vector and
# scalar load of x (the qf_ld* helpers) through the alignment check (the
# cache-hinted __ldcs/__stcs check it in emu.h); the 17 kernels
# fp8_launch.c looks up: the general ones (qf_rows_* at 6 depths,
# qf_tiles_* at 2, qf_tensor_0/1 (mixed or all dense), qf_cvt_check) and
# the dense ones (qf_tiles_dense, qf_rows_dense_* in 5 team shapes)
emu_fp8_image() {
  sed -E -e 's/\*\(const uint4 \*\)a/*EMU_AL(const uint4, 16, a)/' \
    -e 's/\*\(const uint32_t \*\)a/*EMU_AL(const uint32_t, 4, a)/' \
    -e 's/\*\(const uint16_t \*\)a/*EMU_AL(const uint16_t, 2, a)/' \
    "$R/plugins/fp8/quant_fp8.cu" > "$W/quant_fp8_emu.cc"
  raw=$(grep -Ec '\*\((const )?(uint4|uint2|uint32_t|uint16_t|float4|float) \*\)' "$W/quant_fp8_emu.cc" || true)
  if [ "$raw" != 0 ]; then
    echo "$(basename "$0"): $raw vector or scalar accesses of quant_fp8.cu not rewritten" >&2
    exit 1
  fi
  emu_image "$W/quant_fp8_emu.cc" fp8_image 17
}

# the emulated launch table (sdk/pgpu_cudart.h's entry points)
emu_pgpu() {
  $CXX_EMU -c "$E/pgpu_emu.cc" -o "$W/pgpu_emu.o"
}
