#!/bin/sh
# Installs the Debian packages the build and the tests need.  Idempotent:
# when every package is present it prints nothing and touches nothing.
set -e
PACKAGES="gcc make pkg-config check libsubunit-dev valgrind libssl-dev clang-format clang libclang-rt-14-dev libcjson-dev libsqlite3-dev mlir-19-tools libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler python3-grpcio python3-protobuf python3-grpc-tools libopenblas-dev"
missing=""
for p in $PACKAGES; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "make deps: installing$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
