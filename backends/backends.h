/*
 * backends.h - the execution backends shipped with topos (backends/), and
 * the one call a program makes to put them on the engine's chain.
 */
#ifndef TOPOS_BACKENDS_H
#define TOPOS_BACKENDS_H

#include "backend.h"
#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registers the default chain: the plugins' backends where they load
 * (`cuda` exact, `cublas` envelope: defaults.c says where they are
 * looked for), then `cpu` (exact), then `blas` (envelope, fast posture
 * only) where it is built.  Idempotent and thread-safe: the first call
 * decides. */
TOPOS_API void topos_backends_register_defaults(void);
/* The same with options for the plugins (the devices to use, device
 * memory budgets); NULL is the defaults. */
TOPOS_API void topos_backends_register_with(const topos_plugin_options *opt);
/* One line per plugin tried, "; "-separated: "cuda: 1 device (NVIDIA
 * H200)", "cuda: not loaded: no CUDA device (...)", "cuda: not built
 * (...)", "cuda: off (TOPOS_CUDA=off)". */
TOPOS_API void topos_backends_plugin_report(char *buf, size_t len);
/* Loads one plugin from path and registers its backends (tests and
 * tools; the defaults find theirs).  0, or -1 with the reason in err. */
TOPOS_API int topos_plugin_load(const char *path,
                                const topos_plugin_options *opt,
                                const topos_plugin **out, char *err,
                                size_t errlen);

/* The accelerators the loaded plugins use, with their counters: how many
 * there are (at most max written). */
TOPOS_API int topos_devices_list(topos_device_info *out, int max);
/* Whether a run's tasks may go to a device: for NULL, "" or "auto", a
 * loaded plugin reports a device; for a backend's name, a plugin with a
 * device registered that backend. */
TOPOS_API bool topos_backend_uses_device(const char *backend);
/* Binds the calling thread to device slot % count (a daemon worker's
 * index): returns the device's ordinal, -1 when there is none. */
TOPOS_API int topos_devices_bind_thread(int slot);
/* Host bytes [host, host+bytes) hold content with this SHA-256 until
 * retracted: device backends may keep a copy keyed by the hash, so
 * unchanged parameters are not sent to the device again (plugin.h). */
TOPOS_API int topos_blob_announce(const void *host, size_t bytes,
                                  const uint8_t hash[32]);
/* Whether any loaded plugin keeps such copies (else announcing is moot). */
TOPOS_API bool topos_blob_announce_wanted(void);
TOPOS_API void topos_blob_retract(const void *host);

/* The `cpu` backend (cpu.c): exact, packed and register-blocked GEMM with
 * AVX-512 / AVX2+FMA microkernels chosen at run time. */
TOPOS_API const topos_backend *topos_cpu_backend(void);
/* Which microkernels the cpu backend runs: "avx512", "avx2" or "c". */
TOPOS_API const char *topos_cpu_isa(void);
/* Tests: forces an ISA ("avx512", "avx2", "c"; NULL = the best this CPU
 * has).  Returns 0, or -1 when the CPU lacks it. */
TOPOS_API int topos_cpu_force_isa(const char *isa);
/* Tests: how many tasks the cpu backend has run in this process. */
TOPOS_API unsigned long long topos_cpu_tasks_run(void);
/* For tests: caps the cpu GEMM's shared packed-A block at `bytes` (0
 * restores the default, 8 MiB), so that small products cross row-block
 * edges.  The bits never depend on it. */
TOPOS_API void topos_cpu_test_ablock_bytes(size_t bytes);
/* Tests: how many of them were attention tasks (cpu_attention.c). */
TOPOS_API unsigned long long topos_cpu_attention_tasks_run(void);

/* `flip-test` (testflip.c): claims exact fidelity, computes every f32/f64
 * GEMM exactly and flips the lowest bit of one output, so conformance can
 * be seen to fail.  Test only: never registered by default. */
TOPOS_API const topos_backend *topos_flip_test_backend(void);

#ifdef __cplusplus
}
#endif

#endif /* TOPOS_BACKENDS_H */
