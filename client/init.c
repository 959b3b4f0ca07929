/* init.c - parameter initialisers (docs/language.md "Parameters").
 *
 * The generator is documented so that a parameter's initial values depend
 * only on the session's seed and the parameter's name (not on the order
 * of declarations): SplitMix64 seeded with seed ^ FNV-1a(name), uniform
 * doubles from the top 53 bits, normals by Box-Muller (both values used).
 * Fans follow PyTorch: for rank >= 2, fan_in = dims[1] * prod(dims[2:]),
 * fan_out = dims[0] * prod(dims[2:]); rank 1: both dims[0]; rank 0: 1. */
#include <math.h>
#include <string.h>

#include "session_int.h"

typedef struct rng {
  uint64_t s;
  int have;
  double spare;
} rng;

static uint64_t next64(rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static double unif(rng *r) { return (double)(next64(r) >> 11) * 0x1.0p-53; }

static double normal(rng *r) {
  if (r->have) {
    r->have = 0;
    return r->spare;
  }
  double u1 = unif(r), u2 = unif(r);
  if (u1 < 1e-300) u1 = 1e-300;
  double m = sqrt(-2.0 * log(u1));
  r->spare = m * sin(2 * M_PI * u2);
  r->have = 1;
  return m * cos(2 * M_PI * u2);
}

static void fans(int rank, const int64_t *shape, double *fin, double *fout) {
  if (rank == 0) {
    *fin = *fout = 1;
    return;
  }
  if (rank == 1) {
    *fin = *fout = (double)shape[0];
    return;
  }
  double rf = 1;
  for (int i = 2; i < rank; i++) rf *= (double)shape[i];
  *fin = (double)shape[1] * rf;
  *fout = (double)shape[0] * rf;
}

int nf__init_fill(const nf_init *in, int rank, const int64_t *shape, uint64_t seed,
                  const char *name, float *out, nf_buf *err) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= shape[i];
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
  rng r = {seed ^ h, 0, 0};
  double fin, fout;
  fans(rank, shape, &fin, &fout);
  if (fin < 1) fin = 1;
  if (fout < 1) fout = 1;
  double lo = 0, hi = 0, mean = 0, std = 0;
  int kind = 0; /* 0 constant, 1 uniform, 2 normal */
  switch (in->fn) {
    case NF_INIT_FN_ZEROS: lo = 0; break;
    case NF_INIT_FN_ONES: lo = 1; break;
    case NF_INIT_FN_CONSTANT: lo = in->a; break;
    case NF_INIT_FN_UNIFORM:
      kind = 1, lo = in->a, hi = in->b;
      break;
    case NF_INIT_FN_NORMAL:
      kind = 2, mean = in->a, std = in->b;
      break;
    case NF_INIT_FN_XAVIER_UNIFORM: {
      double g = in->a > 0 ? in->a : 1, b = g * sqrt(6.0 / (fin + fout));
      kind = 1, lo = -b, hi = b;
      break;
    }
    case NF_INIT_FN_XAVIER_NORMAL:
      kind = 2, std = (in->a > 0 ? in->a : 1) * sqrt(2.0 / (fin + fout));
      break;
    case NF_INIT_FN_KAIMING_UNIFORM: {
      double g = sqrt(2.0 / (1 + in->a * in->a)), b = g * sqrt(3.0 / fin);
      kind = 1, lo = -b, hi = b;
      break;
    }
    case NF_INIT_FN_KAIMING_NORMAL:
      kind = 2, std = sqrt(2.0 / (1 + in->a * in->a)) / sqrt(fin);
      break;
    case NF_INIT_FN_BUFFER:
      if (!in->data) {
        nf_buf_printf(err, "parameter '%s': initialiser 'buffer' without data", name);
        return NF_EINVAL;
      }
      memcpy(out, in->data, (size_t)n * sizeof(float));
      return NF_OK;
    default:
      nf_buf_printf(err, "parameter '%s': unknown initialiser %d", name, (int)in->fn);
      return NF_EINVAL;
  }
  if (!isfinite(lo) || !isfinite(hi) || !isfinite(mean) || !isfinite(std) ||
      (kind == 1 && hi < lo) || std < 0) {
    nf_buf_printf(err, "parameter '%s': initialiser arguments out of range", name);
    return NF_EINVAL;
  }
  for (int64_t i = 0; i < n; i++) {
    double v = kind == 0 ? lo : kind == 1 ? lo + (hi - lo) * unif(&r) : mean + std * normal(&r);
    out[i] = (float)v;
  }
  return NF_OK;
}
