#!/bin/sh
# Build examples/example_format as its author would: install BUILD_DIR
# into a fresh prefix under WORK, then build the example from that prefix
# alone (pkg-config refit-format, through a pkg-config that moves the
# prefix) into WORK/ex. Prints the prefix's bin folder on its last line.
#   build_from_prefix.sh BUILD_DIR SOURCE_DIR WORK [meson setup args...]
set -eu
build=$1 src=$2 work=$3
shift 3
mkdir -p "$work"
DESTDIR=$work/root meson install -C "$build" --quiet --no-rebuild >/dev/null
pc=$(find "$work/root" -name refit-format.pc | head -1)
[ -n "$pc" ] || { echo "not ok - no refit-format.pc installed by $build" >&2; exit 1; }
prefix=$work/root$(sed -n 's/^prefix=//p' "$pc")
pcdir=$(dirname "$pc")
cat > "$work/pkg-config" <<W
#!/bin/sh
exec pkg-config --define-variable=prefix="$prefix" "\$@"
W
chmod 755 "$work/pkg-config"
export PKG_CONFIG="$work/pkg-config" PKG_CONFIG_PATH="$pcdir" PKG_CONFIG_LIBDIR="$pcdir"
echo "# prefix $prefix: $("$work/pkg-config" --cflags refit-format)" >&2
rm -rf "$work/src" "$work/ex"
cp -r "$src/examples/example_format" "$work/src"
meson setup "$work/ex" "$work/src" "$@" >"$work/setup.log" 2>&1 ||
    { cat "$work/setup.log" >&2; exit 1; }
ninja -C "$work/ex" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
chmod 755 "$work/ex"
echo "$prefix/bin"
