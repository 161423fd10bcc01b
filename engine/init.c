/*
 * init.c - seeded parameter initializers.
 *
 * Each call runs its own splitmix64 generator seeded by its `seed`
 * argument; there is no global generator, so the same arguments give the
 * same bits in any order, on any thread.  Values are computed in double
 * and rounded once to the dtype (store_rounded; bf16 straight from the
 * double), so they depend only on the arguments and the
 * C library's log, cos and sin (Box-Muller).
 *
 *  - uniform: u = (next() >> 11) * 2^-53 in [0, 1), x = low + (high-low)*u.
 *    After rounding to f32 or bf16 a value can equal `high`.
 *  - normal:  Box-Muller on two draws, u1 = ((next() >> 11) + 1) * 2^-53 in
 *    (0, 1] (so log(u1) is finite) and u2 as above; r = sqrt(-2 log u1),
 *    the pair r cos(2 pi u2), r sin(2 pi u2) fills two consecutive
 *    elements (the second is dropped after an odd last element);
 *    x = mean + std * z.
 *  - xavier:  uniform on [-a, a), a = sqrt(6 / (fan_in + fan_out)).
 *  - kaiming: normal with mean 0 and std sqrt(2 / fan_in).
 */
#include <math.h>

#include "internal.h"

typedef struct splitmix64 {
  uint64_t state;
} splitmix64;

static uint64_t splitmix64_next(splitmix64 *g) {
  uint64_t z = (g->state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* 53 random bits as a double in [0, 1). */
static double unit_draw(splitmix64 *g) {
  return (double)(splitmix64_next(g) >> 11) * 0x1p-53;
}

typedef enum init_kind { INIT_UNIFORM, INIT_NORMAL } init_kind;

/* Checks dtype and shape and returns a new contiguous tensor to fill. */
static topos_tensor *init_target(const char *fn, topos_dtype dtype, int rank,
                                 const int64_t *shape, topos_error *err) {
  if (!dtype_is_float(dtype)) {
    error_set(err, TOPOS_ERR_DTYPE, "%s: dtype %s is not f32, f64 or bf16", fn,
              topos_dtype_name(dtype));
    return NULL;
  }
  if (rank < 0 || rank > TOPOS_MAX_RANK) {
    error_set(err, TOPOS_ERR_SHAPE, "%s: rank %d is not in [0,%d]", fn, rank,
              TOPOS_MAX_RANK);
    return NULL;
  }
  if (rank > 0 && shape == NULL) {
    error_set(err, TOPOS_ERR_ARGUMENT, "%s: shape is NULL for rank %d", fn,
              rank);
    return NULL;
  }
  if (shape_count(rank, shape) < 0) {
    char buf[SHAPE_TEXT];
    error_set(err, TOPOS_ERR_SHAPE, "%s: bad shape %s", fn,
              shape_text(buf, rank, shape));
    return NULL;
  }
  return tensor_new(dtype, rank, shape, err);
}

/* Fills a new tensor: uniform on [a, a+b), or normal with mean a, std b. */
static topos_tensor *init_fill(const char *fn, init_kind kind,
                               topos_dtype dtype, int rank,
                               const int64_t *shape, double a, double b,
                               uint64_t seed, topos_error *err) {
  topos_tensor *t = init_target(fn, dtype, rank, shape, err);
  if (t == NULL) return NULL;
  splitmix64 g = {seed};
  int64_t n = shape_count(rank, shape);
  void *dst = tensor_data(t);
  const double two_pi = 6.283185307179586476925286766559;
  for (int64_t i = 0; i < n; i++) {
    if (kind == INIT_UNIFORM) {
      store_rounded(dst, dtype, i, a + b * unit_draw(&g));
      continue;
    }
    double u1 = (double)((splitmix64_next(&g) >> 11) + 1) * 0x1p-53;
    double u2 = unit_draw(&g);
    double r = sqrt(-2.0 * log(u1));
    store_rounded(dst, dtype, i, a + b * (r * cos(two_pi * u2)));
    if (++i < n) store_rounded(dst, dtype, i, a + b * (r * sin(two_pi * u2)));
  }
  return t;
}

topos_tensor *topos_init_uniform(topos_dtype dtype, int rank,
                                 const int64_t *shape, double low, double high,
                                 uint64_t seed, topos_error *err) {
  if (!isfinite(low) || !isfinite(high) || !(low < high) ||
      !isfinite(high - low)) {
    error_set(err, TOPOS_ERR_ARGUMENT,
              "init_uniform: bounds [%g, %g) must be finite with low < high",
              low, high);
    return NULL;
  }
  return init_fill("init_uniform", INIT_UNIFORM, dtype, rank, shape, low,
                   high - low, seed, err);
}

topos_tensor *topos_init_normal(topos_dtype dtype, int rank,
                                const int64_t *shape, double mean, double std,
                                uint64_t seed, topos_error *err) {
  if (!isfinite(mean) || !isfinite(std) || std < 0) {
    error_set(err, TOPOS_ERR_ARGUMENT,
              "init_normal: mean %g and std %g must be finite, std >= 0", mean,
              std);
    return NULL;
  }
  return init_fill("init_normal", INIT_NORMAL, dtype, rank, shape, mean, std,
                   seed, err);
}

topos_tensor *topos_init_xavier(topos_dtype dtype, int rank,
                                const int64_t *shape, int64_t fan_in,
                                int64_t fan_out, uint64_t seed,
                                topos_error *err) {
  if (fan_in <= 0 || fan_out <= 0) {
    error_set(err, TOPOS_ERR_ARGUMENT,
              "init_xavier: fan_in %lld and fan_out %lld must be > 0",
              (long long)fan_in, (long long)fan_out);
    return NULL;
  }
  double a = sqrt(6.0 / ((double)fan_in + (double)fan_out));
  return init_fill("init_xavier", INIT_UNIFORM, dtype, rank, shape, -a, 2 * a,
                   seed, err);
}

topos_tensor *topos_init_kaiming(topos_dtype dtype, int rank,
                                 const int64_t *shape, int64_t fan_in,
                                 uint64_t seed, topos_error *err) {
  if (fan_in <= 0) {
    error_set(err, TOPOS_ERR_ARGUMENT, "init_kaiming: fan_in %lld must be > 0",
              (long long)fan_in);
    return NULL;
  }
  return init_fill("init_kaiming", INIT_NORMAL, dtype, rank, shape, 0,
                   sqrt(2.0 / (double)fan_in), seed, err);
}
