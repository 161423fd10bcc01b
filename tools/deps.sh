#!/bin/sh
# Installs the Debian packages the build and the tests need, then IREE's
# compiler and runtime from PyPI into a virtual environment of the
# project's own ($IREE_VENV, by default .iree-venv at the top of the tree)
# for the IREE suite (tests/engine/test_iree.c, docs/emission.md), and
# schemathesis into another (.schemathesis-venv) for the HTTP suite.
# openssl (the command) makes the TLS suite's CA and certificates at test
# time (tests/daemon/test_tls.c).
# libsystemd-dev: toposd's sd_notify readiness and watchdog (Type=notify).
# python3-yaml checks deploy/'s manifests; python3-pytest, -numpy and
# -setuptools build and test the Python client (client/python).
# python3-torch is Debian's PyTorch, run by /usr/bin/python3: the GPT-2
# and Llama suites' reference models (tests/python/gpt2_torch.py,
# llama_torch.py) and bench/train's peer.
# Idempotent: when everything is present it prints nothing and touches
# nothing (no apt, no pip, no network).
set -e
PACKAGES="gcc g++ make pkg-config check libsubunit-dev valgrind libssl-dev clang-format clang libclang-rt-14-dev libcjson-dev libsqlite3-dev mlir-19-tools libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler python3-grpcio python3-protobuf python3-grpc-tools libopenblas-dev python3-venv zlib1g-dev dataset-fashion-mnist gnuplot-nox libuv1-dev libhttp-parser-dev libgraphviz-dev prometheus chromium wrk python3-torch openssl python3-yaml python3-pytest python3-numpy python3-setuptools python3-wheel libsystemd-dev"
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
if ! { [ -x "$VENV/bin/iree-compile" ] && [ -x "$VENV/bin/iree-run-module" ] &&
  [ -x "$VENV/bin/iree-opt" ] &&
  [ "$(cat "$VENV/.pinned" 2>/dev/null)" = "$IREE_PINS" ]; }; then
  echo "make deps: installing IREE into $VENV ($IREE_PINS)"
  /usr/bin/python3 -m venv --clear "$VENV"
  # shellcheck disable=SC2086 # one argument per pin
  "$VENV/bin/pip" install --quiet --no-input --disable-pip-version-check $IREE_PINS
  "$VENV/bin/iree-compile" --version >/dev/null
  "$VENV/bin/iree-run-module" --help >/dev/null
  # Written last: an interrupted install is redone by the next `make deps`.
  echo "$IREE_PINS" >"$VENV/.pinned"
fi

# schemathesis, which the HTTP gateway's suite runs against a live toposd
# (tests/daemon/test_http.c), in a venv of its own ($SCHEMATHESIS_VENV,
# by default .schemathesis-venv), pinned with its dependencies the same
# way.
ST_PINS="schemathesis==4.32.5 anyio==4.16.0 certifi==2026.10.19.post1 charset-normalizer==3.5.3 click==8.5.1 graphql-core==3.3.2 harfile==0.6.0 hypothesis==6.170.17 hypothesis-graphql==0.13.5 idna==3.20 iniconfig==2.3.1 jsonschema_rs==0.60.3 markdown-it-py==4.3.0 MarkupSafe==3.0.4 mdurl==0.1.2 packaging==26.4 pluggy==1.7.0 Pygments==2.21.0 pyrate-limiter==4.5.1 pytest==9.2.0 PyYAML==6.0.4 requests==2.34.2 rich==15.0.0 sortedcontainers==2.4.0 typing_extensions==4.16.0 urllib3==2.8.0 Werkzeug==3.1.9"
ST_VENV=${SCHEMATHESIS_VENV:-$ROOT/.schemathesis-venv}
if ! { [ -x "$ST_VENV/bin/st" ] &&
  [ "$(cat "$ST_VENV/.pinned" 2>/dev/null)" = "$ST_PINS" ]; }; then
  echo "make deps: installing schemathesis into $ST_VENV"
  /usr/bin/python3 -m venv --clear "$ST_VENV"
  # shellcheck disable=SC2086 # one argument per pin
  "$ST_VENV/bin/pip" install --quiet --no-input --disable-pip-version-check $ST_PINS
  "$ST_VENV/bin/st" --version >/dev/null
  echo "$ST_PINS" >"$ST_VENV/.pinned"
fi
