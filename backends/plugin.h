/*
 * plugin.h - backends that live in a shared object, loaded at run time.
 *
 * A backend that needs libraries a host may lack (the CUDA runtime,
 * cuBLAS) is built as a plugin, libtopos_<name>.so, and loaded with
 * dlopen by topos_backends_register_defaults() (backends.h): so toposd
 * and every program start on a host without those libraries, and say
 * which backends they have and why one is missing.  The plugin sees only
 * backend.h's types: it is not linked against the engine, and its one
 * exported symbol is the entry point below.
 *
 * The ABI is this header: a plugin built against another
 * TOPOS_PLUGIN_ABI is refused by the loader.
 */
#ifndef TOPOS_PLUGIN_H
#define TOPOS_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TOPOS_PLUGIN_ABI 1
#define TOPOS_PLUGIN_ENTRY "topos_plugin_init"
#define TOPOS_DEVICES_MAX 16

/* One accelerator as a plugin sees it, with what it has run. */
typedef struct topos_device_info {
  char backend[32]; /* the plugin: "cuda" */
  int ordinal;      /* the device's index in its runtime */
  char name[96];    /* "NVIDIA H200" */
  uint64_t memory_total, memory_free;
  int cc_major, cc_minor; /* compute capability */
  int multiprocessors;
  uint64_t tasks;                    /* tasks run on it */
  uint64_t declined;                 /* tasks it ran and handed back (NaN) */
  uint64_t bytes_up, bytes_down;     /* host <-> device traffic */
  uint64_t cache_hits, cache_misses; /* the blob cache */
  uint64_t cache_bytes;              /* resident blob bytes */
  uint64_t pool_bytes;               /* device bytes the pool holds */
} topos_device_info;

/* What the host program asks of a plugin at load time. */
typedef struct topos_plugin_options {
  int abi;  /* TOPOS_PLUGIN_ABI */
  bool off; /* load no plugin (toposd --devices none) */
  /* The devices to use, by ordinal; ndevices 0: all of them. */
  int ndevices;
  int devices[TOPOS_DEVICES_MAX];
  /* Device bytes for the buffer pool and the blob cache; 0: defaults. */
  uint64_t pool_bytes, cache_bytes;
} topos_plugin_options;

typedef struct topos_plugin {
  int abi; /* TOPOS_PLUGIN_ABI */
  const char *name;
  int nbackends;
  const topos_backend *const *backends; /* registered in this order */
  /* The devices in use (at most max written); returns how many. */
  int (*devices)(topos_device_info *out, int max);
  /* Binds the calling thread to one of the devices in use: slot modulo
   * their count (a daemon's worker i passes i).  Tasks the thread runs go
   * to that device.  Returns the ordinal. */
  int (*bind_thread)(int slot);
  /* Host memory [host, host+bytes) holds content whose SHA-256 is hash,
   * unchanged until retracted: operands inside it may use a device copy
   * cached by that hash instead of crossing the bus.  0 on success. */
  int (*announce)(const void *host, size_t bytes, const uint8_t hash[32]);
  void (*retract)(const void *host);
  /* Diagnostics (benches): times `reps` n x n x n products on device-
   * resident operands, the exact kernel or (cublas) the envelope one, on
   * the calling thread's device; *seconds is the mean per product.  NULL
   * in plugins without it.  0, or -1 with the reason in err. */
  int (*bench_gemm)(int n, bool f64, bool cublas, int reps, double *seconds,
                    char *err, size_t errlen);
} topos_plugin;

/* The entry point: fills *out (static storage) or returns non-zero with
 * a reason in err ("no CUDA device", "driver too old", ...). */
typedef int (*topos_plugin_init_fn)(const topos_plugin_options *opt,
                                    const topos_plugin **out, char *err,
                                    size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_PLUGIN_H */
