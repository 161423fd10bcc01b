#!/bin/sh
# regen.sh - regenerates the gRPC stubs shipped in topos/_proto from
# proto/topos.proto and proto/health.proto.
#
#   client/python/regen.sh [OUTDIR]
#
# OUTDIR defaults to client/python/topos/_proto.  The stubs are made with
# Debian's grpc_tools (python3-grpc-tools, run by /usr/bin/python3) so they
# match Debian's python3-protobuf runtime, then their imports of each other
# are made relative ("from . import topos_pb2 as topos__pb2") so they work
# inside the package.  The output depends only on the .proto files and the
# grpc_tools version: tests/daemon/test_python.c regenerates into a
# temporary directory and compares byte for byte with the shipped files,
# so a proto change without a regeneration fails the suite.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
proto=$(cd "$here/../../proto" && pwd)
out=${1:-$here/topos/_proto}
case $out in /*) ;; *) out=$PWD/$out ;; esac
python=${PYTHON:-/usr/bin/python3}
mkdir -p "$out"
# Relative names (-I the proto directory) keep absolute paths out of the
# generated files, so they are the same from any checkout.
cd "$proto"
"$python" -m grpc_tools.protoc -I. --python_out="$out" \
  --grpc_python_out="$out" topos.proto health.proto
for stub in topos health; do
  f="$out/${stub}_pb2_grpc.py"
  sed "s/^import ${stub}_pb2 as ${stub}__pb2\$/from . import ${stub}_pb2 as ${stub}__pb2/" \
    "$f" >"$f.tmp"
  mv "$f.tmp" "$f"
  grep -q "^from \. import ${stub}_pb2 as ${stub}__pb2\$" "$f" || {
    echo "regen.sh: the import of ${stub}_pb2 in $f was not rewritten" >&2
    exit 1
  }
done
