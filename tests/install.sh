#!/bin/sh
# `meson install` into a scratch DESTDIR puts the public headers,
# librefit.so.0 and refit.pc in place, and a program built against the
# installed headers alone (refit.h, transport.h) links and runs; the format
# SDK's headers (refit/sdk/) are installed, and a plugin's code on them
# alone builds (-Wall -Wextra -Werror) and computes as refit does; where
# nvcc is found, examples/example_format builds from that prefix with its
# device code, whose launch goes through refit/sdk/pgpu_host.h (TAP).
# Usage: install.sh BUILD_ROOT PREFIX INCLUDEDIR LIBDIR CC [CFLAGS...]
build="$1" prefix="$2" incdir="$3" libdir="$4" cc="$5"
shift 5
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
echo "1..7"
case "$incdir" in /*) ;; *) incdir="$prefix/$incdir" ;; esac
case "$libdir" in /*) ;; *) libdir="$prefix/$libdir" ;; esac
if meson install -C "$build" --destdir "$dest" --no-rebuild --quiet >"$dest/log" 2>&1; then
  echo "ok 1 - meson install"
else
  echo "not ok 1 - meson install: $(tail -3 "$dest/log")"
fi
miss=""
for h in refit.h format.h transport.h ipc.h sys/stats.h sys/cuda.h sys/transport.h; do
  [ -f "$dest$incdir/refit/$h" ] || miss="$miss $h"
done
[ -z "$miss" ] && echo "ok 2 - refit.h, format.h, transport.h, ipc.h, sys/stats.h, sys/cuda.h, sys/transport.h installed" ||
  echo "not ok 2 - not installed:$miss"
so=$(readelf -d "$dest$libdir/librefit.so" 2>/dev/null | sed -n 's/.*soname: \[\(.*\)\]/\1/p')
[ "$so" = librefit.so.0 ] && [ -f "$dest$libdir/pkgconfig/refit.pc" ] &&
  echo "ok 3 - librefit.so (soname $so) and refit.pc" || echo "not ok 3 - soname '$so' or refit.pc missing"
cat > "$dest/use.c" <<'C'
#include <refit/refit.h>
#include <refit/transport.h>
#include <refit/ipc.h>
#include <refit/sys/stats.h>
#include <refit/sys/cuda.h>
#include <refit/sys/transport.h>
#include <stdio.h>
int main(void)
{
    refit_ctx *ctx = NULL;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    if (refit_open(&ctx, &o) != REFIT_OK)
        return 1;
    int probe = refit_nccl_probe(ctx); /* transport.h: any status, it links */
    double js = refit_sys_journal_seconds(ctx); /* sys/stats.h: no journal, 0 */
    refit_sys_cuda_stats cs; /* sys/cuda.h: no copy yet, zeros */
    refit_sys_cuda_stats_get(&cs);
    int quiet = cs.memcpy_calls == 0 && cs.batch_launches == 0 && refit_sys_cuda_last_error();
    uint64_t db = refit_sys_receiver_direct_bytes(NULL); /* sys/transport.h: 0 */
    refit_close(ctx);
    printf("%s\n", (probe == REFIT_OK || probe < 0) && js == 0 && quiet && db == 0 ? "linked" : "?");
    return 0;
}
C
if "$cc" "$@" -I"$dest$incdir" "$dest/use.c" -L"$dest$libdir" -lrefit -o "$dest/use" 2>"$dest/cc.log" &&
   [ "$(LD_LIBRARY_PATH="$dest$libdir" "$dest/use")" = linked ]; then
  echo "ok 4 - a program on the installed refit.h, transport.h and refit/sys/ builds and runs"
else
  echo "not ok 4 - $(head -5 "$dest/cc.log")"
fi
miss=""
for h in group.h minifloat.h pgpu.h pgpu_host.h; do
  [ -f "$dest$incdir/refit/sdk/$h" ] || miss="$miss $h"
done
[ -z "$miss" ] && echo "ok 5 - refit/sdk/group.h, minifloat.h, pgpu.h, pgpu_host.h installed" ||
  echo "not ok 5 - not installed:$miss"
# a format's post-load on the SDK alone: the launch table over the host's
# GPU service, a kind from a dtype, block scales in E8M0 and UE4M3
cat > "$dest/plugin.c" <<'C'
#include <refit/format.h>
#include <refit/sdk/group.h>
#include <refit/sdk/minifloat.h>
#include <refit/sdk/pgpu_host.h>
#include <stdio.h>
int post_load(const refit_host_v2 *h, const refit_fmt_module *m, refit_device dev, void *stream,
              const void *image, size_t size);
int post_load(const refit_host_v2 *h, const refit_fmt_module *m, refit_device dev, void *stream,
              const void *image, size_t size)
{
    static const char *const names[] = {"w"};
    refit_pgpu_host g;
    int rc = refit_pgpu_host_init(&g, h, m, dev, stream, image, size, 1, names, "weight");
    void *k = NULL;
    if (!rc)
        rc = g.g.kernel(&g.g, "my_kernel", &k);
    return rc ? rc : refit_pgpu_fail(&g.g, REFIT_OK, "%s", "done");
}
int main(void)
{
    refit_dtype bf16 = {REFIT_DTYPE_BFLOAT, 16, 1};
    int ok = refit_pgpu_float_kind(bf16) == REFIT_MF_BF16 && refit_mf_f32_to_e8m0(3.0f) == 0x81 &&
             refit_mf_f32_to_e4m3_sat(1000.0f) == 0x7e && refit_mf_e2m1_to_f32(0xf) == -6.0f &&
             refit_mf_bf16_to_f32(refit_mf_f32_to_bf16(1.0f)) == 1.0f;
    printf("%s\n", ok ? "sdk" : "wrong");
    return 0;
}
C
if "$cc" "$@" -std=c11 -Wall -Wextra -Werror -I"$dest$incdir" "$dest/plugin.c" -o "$dest/plugin" \
     2>"$dest/cc.log" && [ "$("$dest/plugin")" = sdk ]; then
  echo "ok 6 - a plugin on the installed refit/sdk/ headers builds warning-free and computes"
else
  echo "not ok 6 - $(head -5 "$dest/cc.log")"
fi
# examples/example_format with its device code, from the prefix alone
src=$(cd "$(dirname "$0")/.." && pwd)
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -z "$nvcc" ]; then
  echo "ok 7 # SKIP no nvcc: examples/example_format's device code not built"
elif PKG_CONFIG_PATH="$dest$libdir/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$dest" \
     meson setup "$dest/ex" "$src/examples/example_format" -Dcuda=enabled -Dcuda-arch=sm_90 \
       >"$dest/ex.log" 2>&1 && ninja -C "$dest/ex" >>"$dest/ex.log" 2>&1 &&
     grep -q "SCALE2_HAVE_DEVICE_CODE" "$dest/ex/build.ninja"; then
  echo "ok 7 - examples/example_format builds from the prefix with its device code (refit/sdk/pgpu_host.h)"
else
  echo "not ok 7 - $(tail -5 "$dest/ex.log")"
fi
