/* nf_bench.c - NeoFlow's side of the peer benchmark against PyTorch
 * (bench/run, bench/README.md): times the training step of one def of a
 * `.nf` file through the public API only (neoflow/neoflow.h), as any
 * program linking libneoflow-client would.
 *
 *   nf_bench FILE.nf DEF --dir D --params A,B --shape NAME=d1,d2,.. ...
 *            [--threads T] [--lr X] [--daemon ADDR|none]
 *            [--tune-trials N] [--tune-seconds S] [--compile-only]
 *            [--wait-kernels SEC] [--warmup 5] [--steps-min 20]
 *            [--seconds-min 2] [--steps-max N] [--tune-only]
 *            [--dump DIR] [--trace FILE --run-seconds S]
 *
 * Every parameter (the def's inputs named by --params, trained with SGD,
 * momentum 0) starts from D/NAME.f32 and every other input is fed from
 * D/NAME.f32 (raw little-endian f32, row-major, exactly the tensor's
 * size).  The program waits up to --wait-kernels s for the daemon's final
 * kernels, runs the warm-up steps (the kernels that arrived are swapped in
 * by the first of them, after their canary), then sets the parameters
 * back to their initial values and, with --dump, runs one step and writes
 * its loss (DIR/loss.f32) and every parameter gradient (DIR/grad_NAME.f32):
 * the numerics are those of the very kernels that are timed.  It sets the
 * parameters back again and times steps (at least --steps-min and
 * --seconds-min), then prints one JSON line: the median ms per step and
 * the session's kernel counts.  SGD without momentum keeps no state, so
 * resetting the parameters restarts training exactly.
 *
 * --tune-only stops after the warm-up (bench/run's tuning phase: the
 * kernels land in the daemon's cache and the record of verified kernels).
 * --trace FILE instead trains for --run-seconds s from the session's start
 * without waiting for kernels, writing one line per step: elapsed ms since
 * the session was opened, the step's ms, tier1, tier2, kernels (the cold
 * start plot of bench/run). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "neoflow/neoflow.h"

#define MAX_LIST 64

static const char usage[] =
    "usage: nf_bench FILE.nf DEF --dir D --params A,B,.. [--shape NAME=d1,d2,..]...\n"
    "                [--threads T] [--lr X] [--daemon ADDR|none] [--tune-trials N]\n"
    "                [--device cpu|cuda[:N]]\n"
    "                [--tune-seconds S] [--compile-only] [--wait-kernels SEC]\n"
    "                [--warmup N] [--steps-min N] [--seconds-min S] [--steps-max N]\n"
    "                [--tune-only] [--dump DIR] [--trace FILE --run-seconds S]\n"
    "Times DEF's SGD training step from the parameters and inputs in D/NAME.f32;\n"
    "prints one JSON line (bench/README.md).\n";

/* The session's messages on stderr (the library never prints itself). */
static void log_stderr(void *user, int level, const char *message) {
  (void)user;
  fprintf(stderr, "%s: %s%s\n", "nf_bench", level == NEOFLOW_LOG_WARN ? "warning: " : "", message);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
  if (n <= 0) return NAN;
  double *c = malloc(sizeof(double) * (size_t)n);
  if (!c) return NAN;
  memcpy(c, v, sizeof(double) * (size_t)n);
  qsort(c, (size_t)n, sizeof(double), cmp_double);
  double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
  free(c);
  return m;
}

static size_t elem_size(nf_elem t) {
  return t == NF_ELEM_F64 || t == NF_ELEM_I64 ? 8 : t == NF_ELEM_BOOL ? 1
         : t == NF_ELEM_F16 || t == NF_ELEM_BF16 ? 2 : 4;
}

/* Reads DIR/NAME.f32, which must hold exactly bytes bytes; malloc'd. */
static void *read_blob(const char *dir, const char *name, size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.f32", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "nf_bench: error: %s: %s\n", path, strerror(errno));
    return NULL;
  }
  void *buf = malloc(bytes ? bytes : 1);
  size_t got = buf ? fread(buf, 1, bytes, f) : 0;
  int extra = fgetc(f) != EOF;
  fclose(f);
  if (!buf || got != bytes || extra) {
    fprintf(stderr, "nf_bench: error: %s: want exactly %zu bytes\n", path, bytes);
    free(buf);
    return NULL;
  }
  return buf;
}

static int write_blob(const char *dir, const char *name, const void *data, size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.f32", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) {
    fprintf(stderr, "nf_bench: error: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

typedef struct blob {
  const char *name;
  void *data;
  size_t bytes;
} blob;

static int set_params(nf_session *s, const blob *p, int n) {
  for (int i = 0; i < n; i++)
    if (nf_session_set_param(s, p[i].name, p[i].data, p[i].bytes / sizeof(float)) != NEOFLOW_OK) {
      fprintf(stderr, "nf_bench: error: %s\n", nf_session_error(s));
      return -1;
    }
  return 0;
}

static int step(nf_session *s, double *ms, double *loss) {
  double t0 = now_ms();
  int rc = nf_session_step(s, loss);
  if (ms) *ms = now_ms() - t0;
  if (rc != NEOFLOW_OK) fprintf(stderr, "nf_bench: error: %s\n", nf_session_error(s));
  return rc;
}

static int bad(const char *what, const char *arg) {
  fprintf(stderr, "nf_bench: %s '%s'\n%s", what, arg, usage);
  return 2;
}

int main(int argc, char **argv) {
  const char *file = NULL, *def = NULL, *dir = NULL, *daemon = NULL, *dump = NULL;
  const char *trace = NULL, *device = NULL;
  int threads = 0, tune_trials = 0, tune_seconds = 0, compile_only = 0, tune_only = 0;
  long warmup = 5, steps_min = 20, steps_max = 100000;
  double lr = 1e-4, wait_s = 0, seconds_min = 2, run_seconds = 30;
  char *plist = NULL;
  const char *pnames[MAX_LIST];
  int n_p = 0;
  const char *shn[MAX_LIST];
  int shr[MAX_LIST];
  int64_t shd[MAX_LIST][8];
  const int64_t *shp[MAX_LIST];
  int n_sh = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    }
    if (a[0] != '-' || a[1] != '-') {
      if (!file) file = a;
      else if (!def) def = a;
      else return bad("unexpected argument", a);
      continue;
    }
    if (!strcmp(a, "--compile-only")) { compile_only = 1; continue; }
    if (!strcmp(a, "--tune-only")) { tune_only = 1; continue; }
    if (i + 1 >= argc) return bad("option needs a value:", a);
    const char *v = argv[++i];
    char *end = NULL;
    errno = 0;
    if (!strcmp(a, "--dir")) dir = v;
    else if (!strcmp(a, "--daemon")) daemon = v;
    else if (!strcmp(a, "--device")) device = v;
    else if (!strcmp(a, "--dump")) dump = v;
    else if (!strcmp(a, "--trace")) trace = v;
    else if (!strcmp(a, "--params")) {
      free(plist);
      plist = strdup(v);
      if (!plist) return 1;
      n_p = 0;
      for (char *t = strtok(plist, ","); t; t = strtok(NULL, ",")) {
        if (n_p >= MAX_LIST) return bad("too many parameters in", v);
        pnames[n_p++] = t;
      }
    } else if (!strcmp(a, "--shape")) {
      const char *eq = strchr(v, '=');
      if (!eq || eq == v || n_sh >= MAX_LIST) return bad("--shape wants NAME=d1,d2,.., got", v);
      shr[n_sh] = 0;
      for (const char *p = eq + 1; *p;) {
        long long x = strtoll(p, &end, 10);
        if (end == p || x <= 0 || shr[n_sh] >= 8 || (*end && *end != ','))
          return bad("--shape: bad dimensions in", v);
        shd[n_sh][shr[n_sh]++] = x;
        p = *end == ',' ? end + 1 : end;
      }
      shn[n_sh] = strndup(v, (size_t)(eq - v));
      if (!shn[n_sh]) return 1;
      shp[n_sh] = shd[n_sh];
      n_sh++;
    } else if (!strcmp(a, "--lr") || !strcmp(a, "--wait-kernels") ||
               !strcmp(a, "--seconds-min") || !strcmp(a, "--run-seconds")) {
      double x = strtod(v, &end);
      if (errno || end == v || *end || !isfinite(x) || x < 0)
        return bad("expected a non-negative number, got", v);
      if (!strcmp(a, "--lr")) lr = x;
      else if (!strcmp(a, "--wait-kernels")) wait_s = x;
      else if (!strcmp(a, "--seconds-min")) seconds_min = x;
      else run_seconds = x;
    } else {
      long long x = strtoll(v, &end, 10);
      if (errno || end == v || *end) return bad("expected an integer, got", v);
      if (!strcmp(a, "--threads") && x >= 1 && x <= 256) threads = (int)x;
      else if (!strcmp(a, "--tune-trials") && x >= 1 && x <= 1000000) tune_trials = (int)x;
      else if (!strcmp(a, "--tune-seconds") && x >= 1 && x <= 604800) tune_seconds = (int)x;
      else if (!strcmp(a, "--warmup") && x >= 0) warmup = (long)x;
      else if (!strcmp(a, "--steps-min") && x >= 1) steps_min = (long)x;
      else if (!strcmp(a, "--steps-max") && x >= 1) steps_max = (long)x;
      else return bad("unknown option or value out of range:", a);
    }
  }
  if (!file || !def) return bad("needs FILE.nf and DEF; got", file ? file : "");
  if (!dir) return bad("needs --dir with the initial values; got", "");
  if (steps_max < steps_min) steps_max = steps_min;

  int status = 1;
  nf_model *m = NULL;
  nf_session *s = NULL;
  blob *params = NULL;
  double *times = NULL;
  FILE *tf = NULL;
  char *err = NULL;
  double t_open = now_ms();
  m = nf_model_load(file, &err);
  if (!m) {
    fprintf(stderr, "%s", err ? err : "nf_bench: out of memory\n");
    goto out;
  }
  nf_session_opts so = {0};
  so.optim.kind = NF_OPTIM_SGD;
  so.optim.lr = lr;
  so.threads = threads;
  so.seed = 1;
  so.log = log_stderr;
  so.daemon = daemon;
  so.device = device;
  so.no_spawn = 1; /* bench/run starts the daemon it means */
  so.compile_only = compile_only;
  so.tune_trials = tune_trials;
  so.tune_seconds = tune_seconds;
  so.n_shapes = n_sh;
  so.shape_names = shn;
  so.shape_ranks = shr;
  so.shape_dims = shp;
  so.n_trainable = n_p;
  so.trainable = pnames;
  s = nf_session_new_def(m, def, &so, &err);
  if (!s) {
    fprintf(stderr, "nf_bench: error: %s\n", err ? err : "out of memory");
    goto out;
  }
  double session_ms = now_ms() - t_open;

  /* the initial parameters and the inputs */
  int np = nf_session_n_params(s), ni = nf_session_n_inputs(s);
  params = calloc((size_t)np + 1, sizeof *params);
  if (!params) goto out;
  for (int i = 0; i < np; i++) {
    nf_elem t;
    int rank;
    int64_t dims[8], n = 1;
    nf_session_param_info(s, i, &params[i].name, &t, &rank, dims);
    for (int r = 0; r < rank; r++) n *= dims[r];
    params[i].bytes = (size_t)n * sizeof(float);
    if (!(params[i].data = read_blob(dir, params[i].name, params[i].bytes))) goto out;
  }
  if (set_params(s, params, np)) goto out;
  for (int i = 0; i < ni; i++) {
    const char *name;
    nf_elem t;
    int rank;
    int64_t dims[8], n = 1;
    nf_session_input_info(s, i, &name, &t, &rank, dims);
    for (int r = 0; r < rank; r++) n *= dims[r];
    size_t bytes = (size_t)n * elem_size(t);
    void *data = read_blob(dir, name, bytes);
    if (!data) goto out;
    int rc = nf_session_feed(s, name, data, bytes);
    free(data);
    if (rc != NEOFLOW_OK) {
      fprintf(stderr, "nf_bench: error: %s\n", nf_session_error(s));
      goto out;
    }
  }

  nf_session_stats st;
  if (trace) {
    /* the cold start: train from the session's start, kernels swapped in
     * as they come */
    tf = fopen(trace, "w");
    if (!tf) {
      fprintf(stderr, "nf_bench: error: cannot write %s: %s\n", trace, strerror(errno));
      goto out;
    }
    fprintf(tf, "# elapsed_ms step_ms tier1 tier2 kernels loss\n");
    long n = 0;
    double last = 0;
    while (now_ms() - t_open < run_seconds * 1e3 && n < steps_max) {
      double ms, loss;
      if (step(s, &ms, &loss)) goto out;
      nf_session_stats_get(s, &st);
      fprintf(tf, "%.1f %.3f %d %d %d %.9g\n", now_ms() - t_open, ms, st.tier1, st.tier2,
              st.kernels, loss);
      fflush(tf);
      last = ms;
      n++;
    }
    nf_session_stats_get(s, &st);
    printf("{\"steps\":%ld,\"last_ms\":%.4f,\"kernels\":%d,\"tier1\":%d,\"tier2\":%d,"
           "\"swaps\":%lld,\"rejected\":%lld,\"first_step_ms\":%.1f}\n",
           n, last, st.kernels, st.tier1, st.tier2, (long long)st.swaps,
           (long long)st.rejected, st.first_step_ms);
    status = 0;
    goto out;
  }

  double t_wait = now_ms();
  int waited_ok = 1;
  if (wait_s > 0 && nf_session_wait_kernels(s, (int)(wait_s * 1000), compile_only ? 1 : 2) !=
                        NEOFLOW_OK) {
    waited_ok = 0;
    fprintf(stderr, "nf_bench: warning: not every kernel final after %.0f s\n", wait_s);
  }
  double wait_ms = now_ms() - t_wait;
  double t_warm = now_ms();
  for (long i = 0; i < warmup; i++)
    if (step(s, NULL, NULL)) goto out;
  double warm_ms = now_ms() - t_warm;
  if (tune_only) {
    nf_session_stats_get(s, &st);
    printf("{\"session_ms\":%.1f,\"wait_ms\":%.1f,\"warmup_ms\":%.1f,\"waited_ok\":%s,"
           "\"kernels\":%d,\"tier1\":%d,\"tier2\":%d,\"blas\":%d,\"swaps\":%lld,"
           "\"trusted\":%lld,\"rejected\":%lld}\n",
           session_ms, wait_ms, warm_ms, waited_ok ? "true" : "false", st.kernels, st.tier1,
           st.tier2, st.blas, (long long)st.swaps, (long long)st.trusted,
           (long long)st.rejected);
    status = 0;
    goto out;
  }

  /* one step from the initial values with the kernels that are timed */
  double loss0 = NAN;
  if (dump) {
    if (set_params(s, params, np) || step(s, NULL, &loss0)) goto out;
    float l;
    if (nf_session_read(s, "loss", &l, sizeof l) != NEOFLOW_OK) {
      fprintf(stderr, "nf_bench: error: %s\n", nf_session_error(s));
      goto out;
    }
    if (write_blob(dump, "loss", &l, sizeof l)) goto out;
    for (int i = 0; i < np; i++) {
      char gname[512];
      snprintf(gname, sizeof gname, "grad_%s", params[i].name);
      void *g = malloc(params[i].bytes);
      if (!g) goto out;
      int rc = nf_session_read(s, gname, g, params[i].bytes);
      if (rc != NEOFLOW_OK) fprintf(stderr, "nf_bench: error: %s\n", nf_session_error(s));
      else rc = write_blob(dump, gname, g, params[i].bytes);
      free(g);
      if (rc) goto out;
    }
  }

  /* the timed steps */
  if (set_params(s, params, np)) goto out;
  times = malloc(sizeof(double) * (size_t)steps_max);
  if (!times) goto out;
  long n = 0;
  double t_run = now_ms();
  while (n < steps_max && (n < steps_min || now_ms() - t_run < seconds_min * 1e3)) {
    if (step(s, &times[n], NULL)) goto out;
    n++;
  }
  double total_ms = now_ms() - t_run;
  nf_session_stats_get(s, &st);
  double mn = times[0], sum = 0;
  for (long i = 0; i < n; i++) {
    sum += times[i];
    if (times[i] < mn) mn = times[i];
  }
  char l0[64] = "null"; /* JSON has no NaN */
  if (isfinite(loss0)) snprintf(l0, sizeof l0, "%.9g", loss0);
  printf("{\"median_ms\":%.4f,\"mean_ms\":%.4f,\"min_ms\":%.4f,\"steps\":%ld,\"total_ms\":%.1f,"
         "\"loss0\":%s,\"session_ms\":%.1f,\"wait_ms\":%.1f,\"warmup_ms\":%.1f,"
         "\"waited_ok\":%s,\"kernels\":%d,\"tier1\":%d,\"tier2\":%d,\"blas\":%d,"
         "\"swaps\":%lld,\"trusted\":%lld,\"rejected\":%lld,\"connected\":%s}\n",
         median(times, (int)n), sum / (double)n, mn, n, total_ms, l0, session_ms, wait_ms,
         warm_ms, waited_ok ? "true" : "false", st.kernels, st.tier1, st.tier2, st.blas,
         (long long)st.swaps, (long long)st.trusted, (long long)st.rejected,
         st.connected ? "true" : "false");
  status = 0;
out:
  if (tf) fclose(tf);
  free(times);
  for (int i = 0; params && params[i].name; i++) free(params[i].data);
  free(params);
  nf_session_free(s);
  nf_model_free(m);
  free(err);
  free(plist);
  for (int i = 0; i < n_sh; i++) free((char *)shn[i]);
  return status;
}
