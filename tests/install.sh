#!/bin/sh
# `meson install` into a scratch DESTDIR puts the three public headers,
# librefit.so.0 and refit.pc in place, and a program built against the
# installed headers alone (refit.h, transport.h) links and runs (TAP).
# Usage: install.sh BUILD_ROOT PREFIX INCLUDEDIR LIBDIR CC [CFLAGS...]
build="$1" prefix="$2" incdir="$3" libdir="$4" cc="$5"
shift 5
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
echo "1..4"
case "$incdir" in /*) ;; *) incdir="$prefix/$incdir" ;; esac
case "$libdir" in /*) ;; *) libdir="$prefix/$libdir" ;; esac
if meson install -C "$build" --destdir "$dest" --no-rebuild --quiet >"$dest/log" 2>&1; then
  echo "ok 1 - meson install"
else
  echo "not ok 1 - meson install: $(tail -3 "$dest/log")"
fi
miss=""
for h in refit.h format.h transport.h ipc.h sys/stats.h; do
  [ -f "$dest$incdir/refit/$h" ] || miss="$miss $h"
done
[ -z "$miss" ] && echo "ok 2 - refit.h, format.h, transport.h, ipc.h, sys/stats.h installed" ||
  echo "not ok 2 - not installed:$miss"
so=$(readelf -d "$dest$libdir/librefit.so" 2>/dev/null | sed -n 's/.*soname: \[\(.*\)\]/\1/p')
[ "$so" = librefit.so.0 ] && [ -f "$dest$libdir/pkgconfig/refit.pc" ] &&
  echo "ok 3 - librefit.so (soname $so) and refit.pc" || echo "not ok 3 - soname '$so' or refit.pc missing"
cat > "$dest/use.c" <<'C'
#include <refit/refit.h>
#include <refit/transport.h>
#include <refit/ipc.h>
#include <refit/sys/stats.h>
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
    refit_close(ctx);
    printf("%s\n", (probe == REFIT_OK || probe < 0) && js == 0 ? "linked" : "?");
    return 0;
}
C
if "$cc" "$@" -I"$dest$incdir" "$dest/use.c" -L"$dest$libdir" -lrefit -o "$dest/use" 2>"$dest/cc.log" &&
   [ "$(LD_LIBRARY_PATH="$dest$libdir" "$dest/use")" = linked ]; then
  echo "ok 4 - a program on the installed refit.h, transport.h and sys/stats.h builds and runs"
else
  echo "not ok 4 - $(head -5 "$dest/cc.log")"
fi
