#!/bin/sh
# tests/cuda/device-check.sh - the prepared CUDA check for a GPU machine.
#
# Builds the CUDA plugin and the standalone cases (tests/cuda/
# check_main.c) with nothing but a C compiler and the CUDA toolkit - the
# GPU machine has neither network nor topos's other dependencies - then
# runs every case (bit identity with the reference loops, cuBLAS's
# envelope, the blob cache, threads) and the exact-GEMM-vs-cuBLAS bench,
# and prints one summary line.  Under 8 minutes on an H200 (the build is
# about one, the cases about two).
#
#   sh tests/cuda/device-check.sh [OUTDIR]     (OUTDIR: a copy of the log)
#
# Exit status: the cases' (0: every case held).
set -eu
cd "$(dirname "$0")/../.."
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")}
CC=${CC:-cc}
B=build/device
mkdir -p "$B"
LOG="$B/device-check.log"
# The GPU's own architecture when nvidia-smi says it, else Ampere+Hopper.
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .' || true)
if [ -n "$CAP" ]; then
  ARCH="-gencode arch=compute_$CAP,code=sm_$CAP"
else
  ARCH="-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90"
fi
CFLAGS="-std=c17 -O2 -g -Wall -Wextra -ffp-contract=off -fno-fast-math -fPIC -D_GNU_SOURCE -pthread"
{
  echo "== device-check $(date -u +%FT%TZ)"
  nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
  "$NVCC" --version | tail -n1
  "$CC" --version | head -n1
  t0=$(date +%s)
  "$NVCC" -std=c++17 -O3 -fmad=false $ARCH -Ibackends/cuda \
    -Xcompiler -fPIC,-fvisibility=hidden -c backends/cuda/kernels.cu -o "$B/kernels.o"
  for f in plugin devpool blobcache span; do
    "$CC" $CFLAGS -Iengine -Ibackends -Ibackends/cuda -I"$CUDA_HOME/include" \
      -fvisibility=hidden -c "backends/cuda/$f.c" -o "$B/$f.o"
  done
  "$CC" -shared -o "$B/libtopos_cuda.so" "$B/plugin.o" "$B/devpool.o" \
    "$B/blobcache.o" "$B/span.o" "$B/kernels.o" -L"$CUDA_HOME/lib64" \
    -Wl,-rpath,"$CUDA_HOME/lib64" -lcudart_static -ldl -lrt -lpthread -lstdc++ -lm
  "$CC" $CFLAGS -Iengine -Ibackends -Itests/cuda tests/cuda/check_main.c \
    tests/cuda/cases.c tests/cuda/ref.c -o "$B/cuda_check" -ldl -lm -lpthread
  echo "== built in $(($(date +%s) - t0)) s"
} >"$LOG" 2>&1 || { cat "$LOG"; echo "device-check: build failed"; exit 2; }
cat "$LOG"
set +e
"$B/cuda_check" --plugin "$B/libtopos_cuda.so" --bench >"$B/cases.log" 2>&1
status=$?
cat "$B/cases.log" | tee -a "$LOG"
if [ "${1:-}" != "" ]; then mkdir -p "$1" && cp "$LOG" "$1/"; fi
exit $status
