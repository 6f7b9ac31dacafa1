#!/bin/sh
# A new format from the installed template, as an author with only an
# installed refit starts one: install BUILD_DIR into a scratch prefix, run
# the installed refit-format-new, build the new format from that prefix
# alone (pkg-config refit-format through a pkg-config that moves the
# prefix; no file of SOURCE_DIR), and run the installed
# refit-format-conformance over it with the case the template ships, and
# with the reference the template ships (--reference; needs numpy in
# REFIT_VENV or BUILD_DIR/venv). Where nvcc is found, the format's device
# code builds too, with -I for the SDK headers on nvcc's line, and where a
# CUDA device is usable the kit runs it there (--device=cuda; else a skip).
# (TAP)
#   format_new.sh BUILD_DIR SOURCE_DIR
build=$1 src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "1..9"
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
notok() { n=$((n + 1)); echo "not ok $n - $*"; }
bail() { echo "Bail out! $*"; exit 1; }

DESTDIR=$tmp/root meson install -C "$build" --quiet --no-rebuild >"$tmp/install.log" 2>&1 ||
    bail "meson install: $(tail -3 "$tmp/install.log")"
pc=$(find "$tmp/root" -name refit-format.pc | head -1)
[ -n "$pc" ] || bail "no refit-format.pc installed"
prefix=$tmp/root$(sed -n 's/^prefix=//p' "$pc")
cat > "$tmp/pkg-config" <<W
#!/bin/sh
exec pkg-config --define-variable=prefix="$prefix" "\$@"
W
chmod 755 "$tmp/pkg-config"
export PKG_CONFIG="$tmp/pkg-config" PKG_CONFIG_PATH="$(dirname "$pc")" \
       PKG_CONFIG_LIBDIR="$(dirname "$pc")"
new=$prefix/bin/refit-format-new
templ=$("$tmp/pkg-config" --variable=templatedir refit-format)
missing=""
for f in meson.build meson_options.txt scale2.c scale2.cu scale2.yaml case.yaml; do
    [ -f "$templ/$f" ] || missing="$missing $f"
done
if [ -x "$new" ] && [ -z "$missing" ]; then
    ok "refit-format-new and the template (pkg-config templatedir $templ) are installed"
else
    notok "installed: refit-format-new $([ -x "$new" ] && echo yes || echo no); missing" \
          "from ${templ:-no templatedir}:$missing"
fi

# refusals write nothing
mkdir -p "$tmp/work/taken" && echo keep > "$tmp/work/taken/notes"
why=""
"$new" Int8G "$tmp/work/bad" 2>"$tmp/err1" && why="$why; Int8G accepted"
grep -q "Int8G.*lowercase identifier" "$tmp/err1" || why="$why; Int8G: $(cat "$tmp/err1")"
"$new" int8g "$tmp/work/taken" 2>"$tmp/err2" && why="$why; a non-empty DIR accepted"
grep -q "taken exists and is not an empty folder" "$tmp/err2" || why="$why; DIR: $(cat "$tmp/err2")"
"$new" scale2 "$tmp/work/s2" 2>/dev/null && why="$why; scale2 accepted"
REFIT_FORMAT_TEMPLATE=$tmp/none "$new" int8g "$tmp/work/nt" 2>"$tmp/err3" &&
    why="$why; a missing template accepted"
grep -q "no template at $tmp/none" "$tmp/err3" || why="$why; template: $(cat "$tmp/err3")"
left=$(cd "$tmp/work" && find . | sort | tr '\n' ' ')
[ "$left" = ". ./taken ./taken/notes " ] && [ "$(cat "$tmp/work/taken/notes")" = keep ] ||
    why="$why; left behind: $left"
[ -z "$why" ] && ok "a bad name, a non-empty DIR, the template's own name, a missing template" \
    "are refused, naming it, and write nothing" || notok "refusals:$why"

# a format named int8g from the template
if (cd "$tmp/work" && "$new" int8g >"$tmp/new.log" 2>&1); then
    files=$(cd "$tmp/work/int8g" && find . -type f | sort | tr '\n' ' ')
    left=$(grep -ril "scale2" "$tmp/work/int8g")
    want="./case.yaml ./int8g.c ./int8g.cu ./int8g.yaml ./meson.build ./meson_options.txt"
    lacks=""
    for f in $want; do
        case " $files" in *" $f "*) ;; *) lacks="$lacks $f" ;; esac
    done
    if [ -z "$lacks" ] && [ -z "$left" ] && [ -z "$(find "$tmp/work/int8g" -name '*scale2*')" ] && grep -q "^name: int8g" "$tmp/work/int8g/int8g.yaml" &&
       grep -q "refit-fmt-int8g" "$tmp/work/int8g/meson.build" &&
       grep -q "INT8G_HAVE_DEVICE_CODE" "$tmp/work/int8g/int8g.c"; then
        ok "refit-format-new int8g: files and identifiers named for int8g, no scale2 left"
    else
        notok "refit-format-new int8g: files $files (lacks$lacks); scale2 left in: $left"
    fi
else
    notok "refit-format-new int8g failed: $(cat "$tmp/new.log")"
fi

# built from the prefix alone
if meson setup "$tmp/work/int8g/build" "$tmp/work/int8g" -Dcuda=disabled >"$tmp/setup.log" 2>&1 &&
   ninja -C "$tmp/work/int8g/build" >"$tmp/build.log" 2>&1 &&
   [ -f "$tmp/work/int8g/build/refit-fmt-int8g.so" ]; then
    ok "int8g builds from the prefix (pkg-config refit-format)"
else
    notok "int8g does not build: $(tail -5 "$tmp/setup.log" "$tmp/build.log" 2>/dev/null)"
fi
if grep -rq "$src" "$tmp/work/int8g/build/build.ninja" "$tmp/work/int8g/build/compile_commands.json" \
       2>/dev/null; then
    notok "the build names the source tree $src"
elif ! grep -q -- "-I$prefix/include" "$tmp/work/int8g/build/build.ninja"; then
    notok "the build does not take the prefix's headers ($prefix/include)"
else
    ok "the build takes the prefix's headers and names no file of the source tree"
fi

# the installed kit over it
chmod 755 "$tmp/work/int8g/build" # the loader refuses a folder others may write
kit=$prefix/bin/refit-format-conformance
if "$kit" "$tmp/work/int8g/build/refit-fmt-int8g.so" "$tmp/work/int8g/int8g.yaml" \
       "$tmp/work/int8g/case.yaml" >"$tmp/kit.tap" 2>&1; then
    ok "the installed refit-format-conformance passes int8g ($(grep -c '^ok' "$tmp/kit.tap") checks)"
else
    notok "refit-format-conformance over int8g:"
    sed 's/^/# /' "$tmp/kit.tap"
fi

# its device code, with the SDK's headers on nvcc's line
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -z "$nvcc" ]; then
    ok "# SKIP no nvcc: no device code built"
elif meson setup "$tmp/work/int8g/cuda" "$tmp/work/int8g" -Dcuda=enabled -Dcuda-arch=sm_90 \
       >"$tmp/cuda.log" 2>&1 && ninja -C "$tmp/work/int8g/cuda" >>"$tmp/cuda.log" 2>&1 &&
     grep -q -- "-I$prefix/include" "$tmp/work/int8g/cuda/build.ninja" &&
     grep -q "INT8G_HAVE_DEVICE_CODE" "$tmp/work/int8g/cuda/build.ninja"; then
    ok "int8g's device code builds from the prefix (nvcc -I$prefix/include for refit/sdk/)"
    built_cuda=1
else
    notok "int8g's device code: $(tail -5 "$tmp/cuda.log")"
fi

# the author's reference, as the template ships it, renamed
py=${REFIT_VENV:-$build/venv}/bin/python
ref=$tmp/work/int8g/int8g_reference.py
if [ ! -f "$ref" ]; then
    notok "the template ships no reference (int8g_reference.py)"
elif ! "$py" -c 'import numpy' 2>/dev/null; then
    ok "# SKIP no Python with numpy at $py (scripts/deps.sh BUILD_DIR)"
elif "$kit" --reference="$py $ref" "$tmp/work/int8g/build/refit-fmt-int8g.so" \
         "$tmp/work/int8g/int8g.yaml" "$tmp/work/int8g/case.yaml" >"$tmp/ref.tap" 2>&1 &&
     grep -q '^ok [0-9]* - reference' "$tmp/ref.tap"; then
    ok "the kit passes int8g with its own reference (--reference)"
else
    notok "the kit with --reference over int8g:"
    sed 's/^/# /' "$tmp/ref.tap"
fi

# on a GPU through the format's own kernel
if [ -z "${built_cuda:-}" ]; then
    ok "# SKIP no device code built"
else
    chmod 755 "$tmp/work/int8g/cuda"
    rc=0
    "$kit" --device=cuda "$tmp/work/int8g/cuda/refit-fmt-int8g.so" "$tmp/work/int8g/int8g.yaml" \
        "$tmp/work/int8g/case.yaml" >"$tmp/dev.tap" 2>&1 || rc=$?
    if [ $rc -eq 77 ]; then
        ok "# SKIP --device=cuda: $(tail -1 "$tmp/dev.tap")"
    elif [ $rc -eq 0 ]; then
        ok "the kit passes int8g on the GPU (--device=cuda: its kernel equals its CPU path)"
    else
        notok "the kit with --device=cuda over int8g: exit $rc"
        sed 's/^/# /' "$tmp/dev.tap"
    fi
fi
