/* kernel_bench.c - times one def compiled under a schedule, and checks
 * its outputs against the reference interpreter (f64).  Run by hand when
 * working on code generation (never by the tests):
 *
 *     build/bench/kernel_bench FILE.nf DEF --shape X=16,128,28,28 ...
 *         [--param NAME=V] [--schedule FILE] [--threads T] [--reps R]
 *         [--opt 1..3] [--check 0|1]
 *
 * Inputs are uniform in [-1, 1) (f32; integer inputs 0).  Prints the
 * median milliseconds of R runs after a warm-up, and for each output its
 * relative L2 difference to the interpreter's f64 result (`--check 0`
 * skips the check, which takes minutes for large convolutions). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_codegen.h"
#include "nf_runtime.h"
#include "nf_interp.h"
#include "nf_lang.h"
#include "nf_lower.h"

#define MAX_ARGS 32

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int usage(const char *msg) {
  fprintf(stderr,
          "kernel_bench: %s\nusage: kernel_bench FILE.nf DEF [--shape NAME=d1,d2,..]... "
          "[--param NAME=V]... [--schedule FILE] [--threads T] [--reps R] [--opt L] [--check 0|1]\n",
          msg);
  return 2;
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  static char text[1 << 16];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  return text;
}

int main(int argc, char **argv) {
  if (argc < 3) return usage("FILE.nf and DEF are required");
  const char *file = argv[1], *def = argv[2], *sched_path = NULL;
  nf_arg_shape sh[MAX_ARGS];
  const char *pn[MAX_ARGS];
  int64_t pv[MAX_ARGS];
  int nsh = 0, np = 0, threads = 1, reps = 20, opt = 2, check = 1;
  for (int i = 3; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return usage("option without a value");
    i++;
    if (strcmp(a, "--shape") == 0 && nsh < MAX_ARGS) {
      const char *eq = strchr(v, '=');
      if (!eq) return usage("--shape wants NAME=d1,d2,...");
      memset(&sh[nsh], 0, sizeof sh[nsh]);
      sh[nsh].name = strndup(v, (size_t)(eq - v));
      for (const char *p = eq + 1; *p && sh[nsh].rank < NF_MAX_RANK;) {
        char *end;
        sh[nsh].dims[sh[nsh].rank++] = strtoll(p, &end, 10);
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) return usage("bad --shape");
      }
      nsh++;
    } else if (strcmp(a, "--param") == 0 && np < MAX_ARGS) {
      const char *eq = strchr(v, '=');
      if (!eq) return usage("--param wants NAME=V");
      pn[np] = strndup(v, (size_t)(eq - v));
      pv[np++] = strtoll(eq + 1, NULL, 10);
    } else if (strcmp(a, "--schedule") == 0) {
      sched_path = v;
    } else if (strcmp(a, "--threads") == 0) {
      threads = atoi(v);
    } else if (strcmp(a, "--reps") == 0) {
      reps = atoi(v);
    } else if (strcmp(a, "--opt") == 0) {
      opt = atoi(v);
    } else if (strcmp(a, "--check") == 0) {
      check = atoi(v);
    } else {
      return usage("unknown option");
    }
  }
  if (threads < 1 || reps < 1) return usage("--threads and --reps want positive numbers");
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL;
  nf_lprog *p = NULL;
  nf_schedule *s = NULL;
  nf_buf err = NF_BUF_INIT;
  nf_blob so = NF_BLOB_INIT;
  nf_kernel *k = NULL;
  nf_cpu_stats st;
  nf_inst_opts o = {nsh, sh, np, pn, pv, 0};
  const char *lib = getenv("NEOFLOW_LIB");
  if (lib) nf_module_set_lib_dir(m, lib);
  if (nf_module_load_file(m, file, d) || nf_module_instantiate(m, def, &o, ctx, &g, d)) {
    fprintf(stderr, "%s", nf_diag_text(d));
    return 1;
  }
  if (sched_path) {
    const char *text = read_text(sched_path);
    if (!text || nf_schedule_parse(text, sched_path, &s, &err) != NF_OK) {
      fprintf(stderr, "%s: %s\n", sched_path, text ? nf_buf_str(&err) : "cannot be read");
      return 1;
    }
  }
  nf_cpu_target t = {0};
  t.opt_level = opt;
  if (nf_lower(g, s, ctx, &p, &err) || nf_cpu_compile(p, &t, &so, &st, &err) ||
      nf_kernel_load(so.data, so.len, &k, &err)) {
    fprintf(stderr, "%s: %s\n", def, nf_buf_str(&err));
    return 1;
  }
  uint32_t nin = g->n_inputs, nout = g->n_outputs, nb = nin + nout;
  void *bufs[MAX_ARGS];
  nf_array in[MAX_ARGS];
  if (nb > MAX_ARGS) return usage("too many inputs and outputs");
  srand(7);
  for (uint32_t i = 0; i < nin; i++) {
    const nf_tensor *tt = &g->tensors[g->inputs[i]];
    int float_in = nf_dtype_is_float((nf_dtype)tt->dtype);
    if (nf_array_alloc(&in[i], float_in ? NF_F32 : (nf_dtype)tt->dtype, tt->rank, tt->shape))
      return 1;
    if (float_in)
      for (int64_t e = 0; e < in[i].numel; e++)
        ((float *)in[i].data)[e] = 2.0f * (float)rand() / (float)RAND_MAX - 1.0f;
    bufs[i] = in[i].data;
  }
  nf_array out[MAX_ARGS];
  for (uint32_t i = 0; i < nout; i++) {
    const nf_tensor *tt = &g->tensors[g->outputs[i]];
    if (nf_array_alloc(&out[i], (nf_dtype)tt->dtype, tt->rank, tt->shape)) return 1;
    bufs[nin + i] = out[i].data;
  }
  nf_pool *pool = nf_pool_new(threads);
  double *ts = malloc(sizeof(double) * (size_t)reps);
  int rc = nf_kernel_run(k, bufs, nb, pool, &err);
  for (int r = 0; r < reps && rc == NF_OK; r++) {
    double t0 = now();
    rc = nf_kernel_run(k, bufs, nb, pool, &err);
    ts[r] = now() - t0;
  }
  if (rc != NF_OK) {
    fprintf(stderr, "run: %s\n", nf_buf_str(&err));
    return 1;
  }
  qsort(ts, (size_t)reps, sizeof *ts, cmp);
  printf("%s: %.3f ms (median of %d, %d thread%s; min %.3f), compile %.0f ms\n", def,
         ts[reps / 2] * 1e3, reps, threads, threads > 1 ? "s" : "", ts[0] * 1e3, st.total_ms);
  nf_array ref[MAX_ARGS];
  if (check && nf_interp_run(g, in, NF_INTERP_F64, ref, &err)) {
    fprintf(stderr, "interpreter: %s\n", nf_buf_str(&err));
    return 1;
  }
  int bad = 0;
  for (uint32_t i = 0; i < nout && check; i++) {
    if (out[i].dtype != NF_F32) continue;
    double e2 = 0, r2 = 0;
    for (int64_t e = 0; e < out[i].numel; e++) {
      double a = ((float *)out[i].data)[e], b = ((double *)ref[i].data)[e];
      e2 += (a - b) * (a - b);
      r2 += b * b;
    }
    double rel = sqrt(e2 / (r2 > 0 ? r2 : 1));
    printf("  output %s: relative L2 %.2e\n", g->tensors[g->outputs[i]].name, rel);
    bad |= !(rel < 1e-4);
    nf_array_free(&ref[i]);
  }
  free(ts);
  nf_pool_free(pool);
  for (uint32_t i = 0; i < nin; i++) nf_array_free(&in[i]);
  for (uint32_t i = 0; i < nout; i++) nf_array_free(&out[i]);
  nf_kernel_free(k);
  nf_blob_free(&so);
  nf_schedule_free(s);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
  nf_diag_free(d);
  nf_module_free(m);
  return bad;
}
