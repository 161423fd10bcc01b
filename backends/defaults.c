/*
 * defaults.c - the default backend registry of programs that link the
 * backends library.
 *
 * It names every shipped backend directly, so linking this file pulls
 * each backend's object out of the archive: a weak reference would not
 * (an archive member is only loaded for a strong undefined symbol), which
 * is how toposd once ran without `blas` while believing it had it.
 */
#include "backends.h"
#include "blas.h"

void topos_backends_register_defaults(void) {
  topos_backend_register(topos_cpu_backend());
  topos_backend_register(topos_blas_backend());
}
