#!/bin/sh
# Installs (or uninstalls) a built tree: `make install` / `make uninstall`
# run it with BUILD, PREFIX, LIBDIR, DESTDIR, VERSION and MAJOR set, and
# tests/engine/test_install.c runs it the same way into a scratch prefix.
#
#   $PREFIX/include/topos/   topos.h backend.h backends.h plugin.h
#                            topos_client.h (#include <topos/topos.h>)
#   $LIBDIR/                 libtopos, libtopos_backends, libtoposclient:
#                            .so.$VERSION, the .so.$MAJOR (SONAME) and
#                            .so links, and the static .a archives
#   $LIBDIR/pkgconfig/       topos.pc topos-backends.pc topos-client.pc
#   $LIBDIR/topos/           libtopos_cuda.so, where the backends look for
#                            it from bin/ and sbin/ (../lib/topos)
#   $PREFIX/bin/topos, $PREFIX/sbin/toposd
#   $PREFIX/share/man/man1/topos.1, man8/toposd.8 (when written)
#
# DESTDIR stages everything under another root (packaging); the .pc files
# still name PREFIX, as the installed tree will be found there.
# Uninstall removes exactly the files install writes, then the
# include/topos and lib/topos directories when empty.
set -e
: "${BUILD:?}" "${PREFIX:?}" "${VERSION:?}" "${MAJOR:?}"
LIBDIR=${LIBDIR:-$PREFIX/lib}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
D=${DESTDIR:-}
INC=$D$PREFIX/include/topos
LIB=$D$LIBDIR
PC=$LIB/pkgconfig
HEADERS="engine/topos.h engine/backend.h backends/backends.h backends/plugin.h client/topos_client.h"
LIBS="libtopos libtopos_backends libtoposclient"
PCS="topos topos-backends topos-client"

pc() { # name description requires libs libs.private requires.private
  cat <<EOF
prefix=$PREFIX
exec_prefix=\${prefix}
libdir=$LIBDIR
includedir=\${prefix}/include

Name: $1
Description: $2
Version: $VERSION
Requires: $3
Requires.private: $6
Libs: -L\${libdir} $4
Libs.private: $5
Cflags: -I\${includedir}
EOF
}

case "$1" in
install)
  for f in $HEADERS; do
    install -D -m 644 "$ROOT/$f" "$INC/$(basename "$f")"
  done
  mkdir -p "$LIB" "$PC"
  for l in $LIBS; do
    [ -f "$BUILD/lib/$l.so.$VERSION" ] || {
      echo "install: $BUILD/lib/$l.so.$VERSION is not built (make first)" >&2
      exit 1
    }
    install -m 755 "$BUILD/lib/$l.so.$VERSION" "$LIB/"
    ln -sf "$l.so.$VERSION" "$LIB/$l.so.$MAJOR"
    ln -sf "$l.so.$MAJOR" "$LIB/$l.so"
  done
  install -m 644 "$BUILD/lib/libtopos.a" "$BUILD/lib/libtopos_backends.a" \
    "$BUILD/lib/libtoposclient.a" "$LIB/"
  pc topos "topos engine: record, differentiate, run and emit tensor programs" \
    "" "-ltopos" "-lm -pthread" "libcjson libcrypto" >"$PC/topos.pc"
  pc topos-backends "topos execution backends (cpu, OpenBLAS, CUDA plugin loader)" \
    "topos" "-ltopos_backends" "-ldl" "openblas" >"$PC/topos-backends.pc"
  pc topos-client "topos client library for toposd (gRPC)" \
    "topos" "-ltoposclient" "-pthread" "grpc libprotobuf-c" >"$PC/topos-client.pc"
  [ -f "$BUILD/bin/topos" ] && install -D -m 755 "$BUILD/bin/topos" "$D$PREFIX/bin/topos"
  [ -f "$BUILD/bin/toposd" ] && install -D -m 755 "$BUILD/bin/toposd" "$D$PREFIX/sbin/toposd"
  [ -f "$BUILD/lib/libtopos_cuda.so" ] &&
    install -D -m 755 "$BUILD/lib/libtopos_cuda.so" "$LIB/topos/libtopos_cuda.so"
  [ -f "$ROOT/docs/man/topos.1" ] &&
    install -D -m 644 "$ROOT/docs/man/topos.1" "$D$PREFIX/share/man/man1/topos.1"
  [ -f "$ROOT/docs/man/toposd.8" ] &&
    install -D -m 644 "$ROOT/docs/man/toposd.8" "$D$PREFIX/share/man/man8/toposd.8"
  echo "installed topos $VERSION under $D$PREFIX"
  ;;
uninstall)
  for f in $HEADERS; do rm -f "$INC/$(basename "$f")"; done
  rmdir "$INC" 2>/dev/null || true
  for l in $LIBS; do
    rm -f "$LIB/$l.so.$VERSION" "$LIB/$l.so.$MAJOR" "$LIB/$l.so" "$LIB/$l.a"
  done
  for p in $PCS; do rm -f "$PC/$p.pc"; done
  rm -f "$D$PREFIX/bin/topos" "$D$PREFIX/sbin/toposd" "$LIB/topos/libtopos_cuda.so" \
    "$D$PREFIX/share/man/man1/topos.1" "$D$PREFIX/share/man/man8/toposd.8"
  rmdir "$LIB/topos" 2>/dev/null || true
  echo "uninstalled topos $VERSION from $D$PREFIX"
  ;;
*)
  echo "usage: install.sh install|uninstall (see the Makefile)" >&2
  exit 2
  ;;
esac
