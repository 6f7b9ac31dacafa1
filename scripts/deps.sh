#!/bin/sh
# Install what refit needs on a Debian 12 machine, once. Quiet when all is
# there. Usage: scripts/deps.sh [BUILD_DIR]  (the venv goes in BUILD_DIR/venv)
set -e
build=${1:-build}

missing=""
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing="$missing $2"; }
need_pc() { pkg-config --exists "$1" 2>/dev/null || missing="$missing $2"; }

need_cmd meson meson
need_cmd ninja ninja-build
need_cmd pkg-config pkg-config
need_cmd cc gcc
need_cmd clang clang
need_cmd python3 python3
need_cmd sqlite3 sqlite3
if command -v pkg-config >/dev/null 2>&1; then
  need_pc cmocka libcmocka-dev
  need_pc yaml-0.1 libyaml-dev
  need_pc sqlite3 libsqlite3-dev
  need_pc jansson libjansson-dev
  need_pc libcrypto libssl-dev
else
  missing="$missing libcmocka-dev libyaml-dev libsqlite3-dev libjansson-dev libssl-dev"
fi
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$missing python3-venv"
# clang's sanitizer and fuzzer runtimes
[ -n "$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null)" ] ||
  missing="$missing libclang-rt-dev"

if [ -n "$missing" ]; then
  echo "refit: installing$missing"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq $missing >/dev/null
fi

# Python packages used only by tests and tools, in a venv under the build,
# at the exact versions of scripts/requirements.txt. The stamp names the
# file's digest, so a changed file (a version taken on purpose) rebuilds the
# venv of an existing build folder.
venv="$build/venv"
req="$(dirname "$0")/requirements.txt"
digest=$(sha256sum "$req" | cut -c1-16)
stamp="$venv/.refit-deps-$digest"
if [ ! -f "$stamp" ]; then
  echo "refit: creating $venv from $req"
  rm -rf "$venv"
  mkdir -p "$build"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-input -r "$req"
  touch "$stamp"
fi

# promtool alone, for tests/python/test_metrics.py's `promtool check
# metrics`: unpacked from Debian's prometheus package at a pinned version
# into the venv, not installed (the package is a server with a service).
promtool_deb=prometheus=2.42.0+ds-5+deb12u1
if [ ! -x "$venv/bin/promtool" ]; then
  tmp=$(mktemp -d)
  get() { (cd "$tmp" && apt-get download -qq "$promtool_deb") >/dev/null 2>&1; }
  if ! get; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq >/dev/null 2>&1 || true
    get || true
  fi
  deb=$(ls "$tmp"/prometheus_*.deb 2>/dev/null | head -n 1)
  if [ -n "$deb" ] && dpkg-deb -x "$deb" "$tmp/x" && [ -x "$tmp/x/usr/bin/promtool" ]; then
    cp "$tmp/x/usr/bin/promtool" "$venv/bin/promtool"
  else
    echo "refit: could not fetch $promtool_deb; python-metrics skips its promtool check"
  fi
  rm -rf "$tmp"
fi
