#!/bin/sh
# Installs a current PyTorch from PyPI into a virtual environment of the
# project's own ($TORCH_VENV, by default .torch-venv at the top of the
# tree), the second PyTorch build bench/train runs next to Debian's
# python3-torch (docs/bench.md, "Training steps against PyTorch").  Only
# `make bench-deps` runs this: the wheels and the CUDA runtime wheels
# they pull are about 5 GB, which the test suites do not need, so
# `make deps` (tools/deps.sh) leaves it out.  The torch wheel runs on the
# CPU without a GPU.
# Pinned, with numpy (torch warns at import without it), like the IREE
# venv of tools/deps.sh: the venv records the pins it was built from;
# the same pins and an importable torch are a no-op (no pip, no
# network), changed ones rebuild it.  Debian's python3, not a pyenv one
# first on PATH.  torch is installed with its dependencies: without them
# (pip --no-deps) it does not import (libcufile is missing).
set -e
TORCH_PINS="torch==2.15.0 numpy==2.4.6"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${TORCH_VENV:-$ROOT/.torch-venv}
if ! { [ "$(cat "$VENV/.pinned" 2>/dev/null)" = "$TORCH_PINS" ] &&
  "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; }; then
  echo "make bench-deps: installing PyTorch into $VENV ($TORCH_PINS, ~5 GB)"
  /usr/bin/python3 -m venv --clear "$VENV"
  # shellcheck disable=SC2086 # one argument per pin
  "$VENV/bin/pip" install --quiet --no-input --disable-pip-version-check $TORCH_PINS
  "$VENV/bin/python" -c "import torch, numpy" >/dev/null
  # Written last: an interrupted install is redone by the next run.
  echo "$TORCH_PINS" >"$VENV/.pinned"
fi
