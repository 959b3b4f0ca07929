/* compile_bench.c - how long a tier-1 kernel takes to build: for every
 * case of the library table (tests/nf_test_cases.h: every def of
 * lib/nn.nf at odd shapes) and every workload of examples/workloads.nf
 * at its benchmark shapes, the default schedule is lowered and compiled
 * (opt_level 2, the tier-1 level) reps times; prints the median time per
 * subgraph split into lowering, LLVM IR generation, optimisation,
 * emission and linking, then the median and maximum over the library.
 * Run by hand (never by the tests):
 *
 *     NEOFLOW_LIB=lib build/bench/compile_bench [reps]
 *
 * NF_OPT_LEVEL=1..3 selects another pipeline. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_codegen.h"
#include "nf_diag.h"
#include "nf_lang.h"
#include "nf_lower.h"
#include "nf_test_cases.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static nf_module *load(const char *lib, const char *rel) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", lib, rel);
  nf_diag *d = nf_diag_new();
  nf_module *m = nf_module_new();
  if (!d || !m || nf_module_load_file(m, path, d) != NF_OK) {
    fprintf(stderr, "compile_bench: loading %s: %s\n", path, d ? nf_diag_text(d) : "?");
    exit(1);
  }
  nf_diag_free(d);
  return m;
}

/* Median total ms of compiling case c's default schedule reps times;
 * prints one row.  Negative when it failed. */
static double bench_case(nf_module *m, const libcase *c, int reps, int level) {
  nf_arg_shape shapes[MAX_IN];
  for (int k = 0; k < c->n_in; k++) {
    memset(&shapes[k], 0, sizeof shapes[k]);
    shapes[k].rank = c->in[k].rank;
    for (int a = 0; a < c->in[k].rank; a++) shapes[k].dims[a] = c->in[k].dims[a];
  }
  nf_inst_opts o = {.n_shapes = c->n_in, .shapes = shapes, .n_params = c->n_par,
                    .param_names = c->pn, .param_values = c->pv};
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_diag *d = nf_diag_new();
  nf_graph *g = NULL;
  if (nf_module_instantiate(m, c->def, &o, ctx, &g, d) != NF_OK) {
    printf("%-34s instantiate failed: %s\n", c->label, nf_diag_text(d));
    nf_diag_free(d);
    nf_ir_ctx_free(ctx);
    return -1;
  }
  double tot[64], low[64], irg[64], opt[64], emi[64], lnk[64];
  if (reps > 64) reps = 64;
  nf_cpu_target t = {NULL, NULL, NULL, level};
  int ok = 1;
  for (int r = 0; r < reps && ok; r++) {
    nf_ir_ctx *pc = nf_ir_ctx_new();
    nf_buf err = NF_BUF_INIT;
    nf_lprog *p = NULL;
    nf_blob so = NF_BLOB_INIT;
    nf_cpu_stats st;
    memset(&st, 0, sizeof st);
    double t0 = now_ms();
    int rc = nf_lower(g, NULL, pc, &p, &err);
    double t1 = now_ms();
    if (rc == NF_OK) rc = nf_cpu_compile(p, &t, &so, &st, &err);
    if (rc != NF_OK) {
      printf("%-34s failed: %s\n", c->label, nf_buf_str(&err));
      ok = 0;
    }
    low[r] = t1 - t0;
    tot[r] = st.total_ms + low[r];
    irg[r] = st.irgen_ms;
    opt[r] = st.opt_ms;
    emi[r] = st.emit_ms;
    lnk[r] = st.link_ms;
    nf_blob_free(&so);
    nf_buf_free(&err);
    nf_ir_ctx_free(pc);
  }
  double res = -1;
  if (ok) {
    double *all[6] = {tot, low, irg, opt, emi, lnk};
    for (int k = 0; k < 6; k++) qsort(all[k], (size_t)reps, sizeof(double), cmp_d);
    printf("%-34s %7.1f   %6.2f %6.2f %7.1f %7.1f %6.1f\n", c->label, tot[reps / 2],
           low[reps / 2], irg[reps / 2], opt[reps / 2], emi[reps / 2], lnk[reps / 2]);
    res = tot[reps / 2];
  }
  nf_diag_free(d);
  nf_ir_ctx_free(ctx);
  return res;
}

/* The workloads at their benchmark shapes (../shared/WORKLOADS.md). */
static const libcase workloads[] = {
    {"matmul_loss 1024", "matmul_loss", P0, 3,
     {NZ(1, 2, 1024, 1024), NZ(1, 2, 1024, 1024), NZ(1, 2, 1024, 1024)}, NULL, 0, 0},
    {"conv2d_relu_loss", "conv2d_relu_loss", P0, 2,
     {NZ(1, 4, 8, 64, 56, 56), NZ(1, 4, 64, 64, 3, 3)}, NULL, 0, 0},
    {"lltm_loss", "lltm_loss", P0, 5,
     {NZ(1, 3, 8, 64, 256), NZ(1, 2, 64, 512), NZ(1, 2, 64, 512), NZ(1, 2, 1536, 768),
      NZ(1, 1, 1536)},
     NULL, 0, 0},
    {"milstm_loss", "milstm_loss", P0, 9,
     {NZ(1, 3, 8, 64, 512), NZ(1, 2, 64, 512), NZ(1, 2, 64, 512), NZ(1, 2, 2048, 512),
      NZ(1, 2, 2048, 512), NZ(1, 1, 2048), NZ(1, 1, 2048), NZ(1, 1, 2048), NZ(1, 1, 2048)},
     NULL, 0, 0},
    {"capsnet_loss", "capsnet_loss", P0, 3,
     {NZ(1, 3, 32, 1152, 8), NZ(1, 4, 1152, 10, 16, 8), ONEHOT(2, 32, 10)}, NULL, 0, 0},
    {"mobilenet_dws_loss", "mobilenet_dws_loss", P0, 3,
     {NZ(1, 4, 16, 128, 28, 28), NZ(1, 4, 128, 1, 3, 3), NZ(1, 4, 128, 128, 1, 1)}, NULL, 0, 0},
};

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 5;
  if (reps < 1) reps = 1;
  const char *lib = getenv("NEOFLOW_LIB");
  if (!lib) lib = "lib";
  const char *lv = getenv("NF_OPT_LEVEL");
  int level = lv ? atoi(lv) : 2;
  nf_module *nn = load(lib, "nn.nf"), *wl = load(lib, "../examples/workloads.nf");
  int n = (int)(sizeof lib_cases / sizeof lib_cases[0]);
  double *med = malloc((size_t)n * sizeof *med);
  int m = 0;
  printf("compile time of the default schedule (ms, median of %d; opt_level %d)\n", reps, level);
  printf("%-34s %7s   %6s %6s %7s %7s %6s\n", "case", "total", "lower", "irgen", "opt", "emit",
         "link");
  for (int i = 0; i < n; i++) {
    double t = bench_case(nn, &lib_cases[i], reps, level);
    if (t >= 0) med[m++] = t;
  }
  for (size_t i = 0; i < sizeof workloads / sizeof workloads[0]; i++)
    bench_case(wl, &workloads[i], reps, level);
  if (m) {
    qsort(med, (size_t)m, sizeof *med, cmp_d);
    printf("library (%d cases): median %.1f ms, max %.1f ms\n", m, med[m / 2], med[m - 1]);
  }
  free(med);
  nf_module_free(nn);
  nf_module_free(wl);
  return 0;
}
