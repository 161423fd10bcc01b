#!/bin/sh
# Installs the Debian packages the build and the tests need, then IREE's
# compiler and runtime from PyPI into a virtual environment of the
# project's own ($IREE_VENV, by default .iree-venv at the top of the tree)
# for the IREE suite (tests/engine/test_iree.c, docs/emission.md).
# Idempotent: when everything is present it prints nothing and touches
# nothing (no apt, no pip, no network).
set -e
PACKAGES="gcc make pkg-config check libsubunit-dev valgrind libssl-dev clang-format clang libclang-rt-14-dev libcjson-dev libsqlite3-dev mlir-19-tools libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler python3-grpcio python3-protobuf python3-grpc-tools libopenblas-dev python3-venv zlib1g-dev dataset-fashion-mnist gnuplot-nox libuv1-dev libhttp-parser-dev libgraphviz-dev prometheus chromium wrk"
missing=""
for p in $PACKAGES; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "make deps: installing$missing"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

# IREE (and safetensors, for the checkpoint interop test in
# tests/engine/test_safetensors.c), pinned to the versions the suite was
# verified with (their own dependencies too, so a fresh clone gets the
# same environment).  The venv records the pins it was built from: the
# same pins are a no-op, changed ones rebuild it.  Debian's python3 (not
# a pyenv one first on PATH), so that CI, as root, builds what a
# developer builds.
IREE_PINS="iree-base-compiler==3.13.0 iree-base-runtime==3.13.0 numpy==2.4.6 ml_dtypes==0.7.0 sympy==1.14.0 mpmath==1.3.0 safetensors==0.7.0"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${IREE_VENV:-$ROOT/.iree-venv}
if [ -x "$VENV/bin/iree-compile" ] && [ -x "$VENV/bin/iree-run-module" ] &&
  [ -x "$VENV/bin/iree-opt" ] &&
  [ "$(cat "$VENV/.pinned" 2>/dev/null)" = "$IREE_PINS" ]; then
  exit 0
fi
echo "make deps: installing IREE into $VENV ($IREE_PINS)"
/usr/bin/python3 -m venv --clear "$VENV"
# shellcheck disable=SC2086 # one argument per pin
"$VENV/bin/pip" install --quiet --no-input --disable-pip-version-check $IREE_PINS
"$VENV/bin/iree-compile" --version >/dev/null
"$VENV/bin/iree-run-module" --help >/dev/null
# Written last: an interrupted install is redone by the next `make deps`.
echo "$IREE_PINS" >"$VENV/.pinned"
