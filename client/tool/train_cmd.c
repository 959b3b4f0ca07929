/* train_cmd.c - `neoflow train FILE.nf DEF --data synthetic --steps N ...`:
 * trains a model written wholly in `.nf` through the public API
 * (neoflow/neoflow.h), as any program would.
 *
 * Synthetic data (docs/neoflow.md): a pool of --samples samples drawn once
 * from the seed.  Every float input gets N(0, 1) values; every integer
 * input of shape [batch] gets class labels in [0, --classes): the argmax
 * of a fixed random linear "teacher" of the sample of the first float
 * input, so the task is learnable.  Step k reads samples k*batch ... of
 * the pool (wrapping around).  Inputs whose first dimension is not the
 * batch get fixed N(0, 1) values. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon_cmd.h"
#include "neoflow/neoflow.h"
#include "nf_lang.h"
#include "session_int.h"

static const char train_usage[] =
    "usage: neoflow train FILE.nf DEF --data synthetic --steps N [options]\n"
    "       neoflow train FILE.nf DEF --data fashion-mnist --epochs E [options]\n"
    "\n"
    "Trains DEF (first output: the scalar loss; `param` declarations: the\n"
    "parameters) on fallback kernels at once, with kernels from neoflowd\n"
    "swapped in as they arrive.\n"
    "\n"
    "  --data synthetic|fashion-mnist  the data source (docs/neoflow.md)\n"
    "  --data-dir DIR        where the IDX files are (default\n"
    "                        " NF_FASHION_MNIST_DIR ")\n"
    "  --epochs E            passes over the training split (fashion-mnist);\n"
    "                        the test accuracy is reported after each\n"
    "  --steps N             training steps (with --epochs: at most N)\n"
    "  --batch B             sets DEF's integer parameter `batch`\n"
    "  --param NAME=V        another integer parameter of DEF\n"
    "  --shape NAME=d1,d2,.. the shape of an input with symbolic sizes\n"
    "  --params A,B,...      inputs of DEF to train as parameters (besides its\n"
    "                        `param` declarations), PyTorch's default init\n"
    "  --optim sgd|adam|adamw  (default adam)\n"
    "  --lr X                learning rate (default 0.001 for adam, 0.01 for sgd)\n"
    "  --momentum X, --weight-decay X\n"
    "  --threads T           threads (default: the machine's cores)\n"
    "  --device cpu|cuda[:N] where steps run (default $NEOFLOW_DEVICE, else the\n"
    "                        CPU); without a usable GPU: a warning and the CPU\n"
    "  --seed S              parameter initialisation and data (default 1)\n"
    "  --classes K           synthetic labels (default 10)\n"
    "  --samples N           synthetic pool size (default 16 batches, at most\n"
    "                        2048 samples and 256 MiB)\n"
    "  --daemon ADDR|none    neoflowd's socket (default $NEOFLOW_SOCKET or the\n"
    "                        per-user socket); none: fallback kernels only\n"
    "  --no-spawn            do not start a per-user neoflowd\n"
    "  --key FILE            the shared key of a daemon on TCP (its [tcp] key_file)\n"
    "  --trust-key KEY|FILE  take kernels from the daemon with this public key\n"
    "                        (ed25519:..., from `neoflowd --public-key`); needed on TCP\n"
    "  --trust-uid USER      take kernels from a shared daemon run by USER\n"
    "                        (docs/security.md; also ~/.config/neoflow/client.conf)\n"
    "  --compile-only        default kernels only (no tuning)\n"
    "  --tune-trials N, --tune-seconds S  the daemon's budget per subgraph\n"
    "  --wait-kernels SEC    before training, wait up to SEC s for the daemon's\n"
    "                        final kernels (benchmarks)\n"
    "  --until-tuned N       stop N steps after every kernel is final (tuned, or\n"
    "                        kept on its fallback); --steps caps the run\n"
    "  --log-every N         log every N steps (default 10; --json: 1)\n"
    "  --json                one JSON object per logged step\n"
    "  --profile             at the end, the time of each kernel entry per step\n"
    "                        (over the steps since the kernels last changed)\n"
    "  --save FILE, --load FILE  parameters after / before training\n"
    "  --report DIR          write DIR/report.html: step time with the tier mix and\n"
    "                        kernel arrivals, loss and test accuracy, the partitioned\n"
    "                        graph, tuning curves, the profile (every minute and at\n"
    "                        the end; docs/report.md)\n";

/* The session's messages on stderr (the library never prints itself). */
static void log_stderr(void *user, int level, const char *message) {
  (void)user;
  fprintf(stderr, "%s: %s%s\n", "neoflow", level == NEOFLOW_LOG_WARN ? "warning: " : "", message);
}

static uint64_t rs;
static double unif(void) {
  rs += 0x9e3779b97f4a7c15ULL;
  uint64_t z = rs;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1.0p-53;
}
static double gauss(void) { /* Box-Muller, both values used */
  static int have;
  static double spare;
  if (have) {
    have = 0;
    return spare;
  }
  double u = unif(), v = unif();
  if (u < 1e-300) u = 1e-300;
  double r = sqrt(-2 * log(u));
  spare = r * sin(2 * M_PI * v);
  have = 1;
  return r * cos(2 * M_PI * v);
}

typedef struct feed {
  const char *name;
  nf_elem t;
  int batched;          /* first dim is the batch */
  int64_t per;          /* elements per sample (or all, unbatched) */
  size_t esz;
  void *pool;           /* samples x per (or per) */
  void *buf;            /* one batch */
  size_t bytes;         /* of buf */
} feed;

static size_t esize(nf_elem t) {
  return t == NF_ELEM_F64 || t == NF_ELEM_I64 ? 8 : t == NF_ELEM_BOOL ? 1 : 4;
}

static int bad(const char *fmt, const char *a) {
  fprintf(stderr, "neoflow train: ");
  fprintf(stderr, fmt, a);
  fprintf(stderr, "\n(run 'neoflow train --help' for usage)\n");
  return 2;
}

/* Prints a library error: a located diagnostic ("file:line:col: error:
 * ...") as it is, after the command's name; anything else with "error: ". */
static void train_err(const char *msg) {
  const char *m = msg ? msg : "out of memory";
  size_t n = strlen(m);
  while (n && m[n - 1] == '\n') n--; /* (a diagnostic's text ends its lines) */
  int has = strstr(m, ": error: ") || !strncmp(m, "error: ", 7);
  fprintf(stderr, "neoflow train: %s%.*s\n", has ? "" : "error: ", (int)n, m);
}

/* ---- MNIST-style datasets (--data fashion-mnist) ---- */

typedef struct dsrun {
  nf_dataset train, test;
  int img, lab;          /* the inputs fed with images and labels */
  const char *logits;    /* the output the accuracy reads, or NULL */
  int64_t classes;
  int64_t *perm;         /* this epoch's order of the training split */
  float *logit_buf;
} dsrun;

/* Copies samples idx[0..bdim) of d into the image and label buffers
 * (sample indices < 0: padding, a copy of sample 0). */
static int ds_feed(nf_session *s, feed *f, const dsrun *r, const nf_dataset *d,
                   const int64_t *idx, int64_t bdim) {
  feed *fi = &f[r->img], *fl = &f[r->lab];
  for (int64_t b = 0; b < bdim; b++) {
    int64_t k = idx[b] < 0 ? 0 : idx[b];
    memcpy((float *)fi->buf + b * fi->per, d->images + k * fi->per, sizeof(float) * (size_t)fi->per);
    if (fl->t == NF_ELEM_I64) ((int64_t *)fl->buf)[b] = d->labels[k];
    else ((int32_t *)fl->buf)[b] = (int32_t)d->labels[k];
  }
  if (nf_session_feed(s, fi->name, fi->buf, fi->bytes) != NF_OK ||
      nf_session_feed(s, fl->name, fl->buf, fl->bytes) != NF_OK)
    return -1;
  return 0;
}

/* Correct predictions among the rows of the logits whose idx >= 0. */
static int64_t ds_correct(nf_session *s, dsrun *r, const nf_dataset *d, const int64_t *idx,
                          int64_t bdim) {
  if (!r->logits) return 0;
  if (nf_session_read(s, r->logits, r->logit_buf, sizeof(float) * (size_t)(bdim * r->classes)))
    return 0;
  int64_t ok = 0;
  for (int64_t b = 0; b < bdim; b++) {
    if (idx[b] < 0) continue;
    const float *row = r->logit_buf + b * r->classes;
    int64_t best = 0;
    for (int64_t c = 1; c < r->classes; c++)
      if (row[c] > row[best]) best = c;
    ok += best == d->labels[idx[b]];
  }
  return ok;
}

/* The whole test split through nf_session_eval: accuracy and mean loss. */
static int ds_evaluate(nf_session *s, feed *f, dsrun *r, int64_t bdim, double *acc, double *loss) {
  int64_t *idx = malloc(sizeof(int64_t) * (size_t)bdim), correct = 0, n = r->test.n;
  if (!idx) return -1;
  double lsum = 0, lw = 0;
  for (int64_t start = 0; start < n; start += bdim) {
    int64_t valid = n - start < bdim ? n - start : bdim;
    for (int64_t b = 0; b < bdim; b++) idx[b] = b < valid ? start + b : -1;
    double l;
    if (ds_feed(s, f, r, &r->test, idx, bdim) || nf_session_eval(s, &l) != NF_OK) {
      free(idx);
      return -1;
    }
    /* the loss is a mean over the batch; padded rows repeat sample 0 */
    if (valid == bdim) {
      lsum += l * (double)valid;
      lw += (double)valid;
    }
    correct += ds_correct(s, r, &r->test, idx, bdim);
  }
  free(idx);
  *acc = (double)correct / (double)n;
  *loss = lw > 0 ? lsum / lw : NAN;
  return 0;
}

/* Loads the splits, matches the def's inputs (the images: the first
 * batched f32 input of rows x cols per sample; the labels: a batched
 * integer input of one per sample) and finds the logits output (the first
 * output after the loss of shape [batch, classes]).  Sets the step count
 * from the epochs. */
static int ds_setup(nf_session *s, feed *f, int nf, int64_t bdim, int nranks, const char *dir,
                    uint64_t seed, dsrun *r, long *epochs, long *steps) {
  char *err = NULL;
  if (nf_dataset_mnist_load(dir, "train", &r->train, &err) != NF_OK ||
      nf_dataset_mnist_load(dir, "test", &r->test, &err) != NF_OK) {
    train_err(err);
    if (!dir && err && strstr(err, "No such file"))
      fprintf(stderr, "(install Debian's dataset-fashion-mnist package, or give --data-dir)\n");
    free(err);
    return -1;
  }
  int64_t per = r->train.rows * r->train.cols;
  for (int i = 0; i < nf; i++) {
    if (!f[i].batched) {
      fprintf(stderr, "neoflow train: error: input '%s' is not batched (its first dimension is "
                      "not the batch %lld): --data fashion-mnist feeds only the images and the "
                      "labels\n", f[i].name, (long long)bdim);
      return -1;
    }
    if (r->img < 0 && f[i].t == NF_ELEM_F32 && f[i].per == per) r->img = i;
    else if (r->lab < 0 && (f[i].t == NF_ELEM_I64 || f[i].t == NF_ELEM_I32) && f[i].per == 1)
      r->lab = i;
    else {
      fprintf(stderr, "neoflow train: error: input '%s' is neither the images (f32, %lld values "
                      "per sample, e.g. [batch, 1, %lld, %lld] or [batch, %lld]) nor the labels "
                      "(i64 [batch])\n", f[i].name, (long long)per, (long long)r->train.rows,
              (long long)r->train.cols, (long long)per);
      return -1;
    }
  }
  if (r->img < 0 || r->lab < 0) {
    fprintf(stderr, "neoflow train: error: --data fashion-mnist needs an image input (f32, %lld "
                    "values per sample) and a label input (i64 [batch])\n", (long long)per);
    return -1;
  }
  if (bdim * nranks > r->train.n) {
    fprintf(stderr, "neoflow train: error: the batch (%lld on each of the ranks) is larger than "
                    "the training split\n",
            (long long)bdim);
    return -1;
  }
  for (int i = 1; i < nf_session_n_outputs(s); i++) {
    const char *nm;
    nf_elem t;
    int rank;
    int64_t dims[8];
    nf_session_output_info(s, i, &nm, &t, &rank, dims);
    if (t == NF_ELEM_F32 && rank == 2 && dims[0] == bdim && dims[1] >= r->train.classes) {
      r->logits = nm;
      r->classes = dims[1];
      break;
    }
  }
  if (!r->logits)
    fprintf(stderr, "neoflow train: warning: the def has no output [batch, %lld] after the loss "
                    "(the logits): no accuracy is reported\n", (long long)r->train.classes);
  r->perm = malloc(sizeof(int64_t) * (size_t)r->train.n);
  r->logit_buf = malloc(sizeof(float) * (size_t)(bdim * (r->classes ? r->classes : 1)));
  if (!r->perm || !r->logit_buf) return -1;
  for (int64_t i = 0; i < r->train.n; i++) r->perm[i] = i;
  rs = seed * 0x9e3779b97f4a7c15ULL + 3;
  int64_t spe = r->train.n / (bdim * nranks); /* (a step takes a batch on every rank) */
  long want = *epochs > 0 ? (long)(*epochs * spe) : *steps;
  if (*steps < 0 || want < *steps) *steps = want;
  return 0;
}

/* For the fault tests (tests/dist_check.py): $NEOFLOW_FAULT = "R:S:hang"
 * or "R:S:kill" makes rank R hang (sleep for good) or die (SIGKILL)
 * before its step S (from 0). */
static void fault_here(int rank, long st) {
  const char *v = getenv("NEOFLOW_FAULT");
  int r;
  long at;
  char what[8];
  if (!v || sscanf(v, "%d:%ld:%7s", &r, &at, what) != 3 || r != rank || at != st) return;
  fprintf(stderr, "neoflow train: rank %d: %s before step %ld ($NEOFLOW_FAULT)\n", rank,
          strcmp(what, "kill") ? "hanging" : "dying", st);
  if (!strcmp(what, "kill")) raise(SIGKILL);
  for (;;) pause();
}

/* Whether every rank holds the same parameters (a digest of the flat
 * vector compared across the job): 1 alone. */
static int params_agree(nf_session *s) {
  uint64_t h = 1469598103934665603ULL;
  const unsigned char *p = (const unsigned char *)s->P;
  for (size_t i = 0; i < (size_t)s->n_flat * sizeof(float); i++) h = (h ^ p[i]) * 1099511628211ULL;
  h |= 1;
  nf__dist_same(s, &h, 1);
  return h != 0;
}

/* Fisher-Yates with the tool's generator. */
static void shuffle(int64_t *p, int64_t n) {
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(unif() * (double)(i + 1));
    if (j > i) j = i;
    int64_t t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
}

/* ---- ms/step by tier ---- */

enum { PH_T0, PH_MIXED, PH_T1, PH_T2, PH_N };
static const char *const ph_name[PH_N] = {
    "fallback kernels only (tier 0)", "fallback + daemon kernels", "all daemon kernels (tier 1)",
    "all daemon kernels, some tuned (tier 2)"};
/* (an entry whose daemon kernel lost the race against OpenBLAS counts as
 * having its daemon kernel: it is final) */

static int phase_of(const nf_session_stats *st) {
  int c = st->tier1 + st->tier2 + st->tier0_kept; /* entries with their daemon kernel */
  if (c == 0) return PH_T0;
  if (c < st->kernels) return PH_MIXED;
  return st->tier2 ? PH_T2 : PH_T1;
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void print_phases(const double *ms, const unsigned char *ph, long n, int64_t bdim) {
  printf("\nms/step by kernel tier (median over the steps in each state):\n");
  printf("  %-42s %7s %12s %12s\n", "kernels in use", "steps", "ms/step", "samples/s");
  double *v = malloc(sizeof(double) * (size_t)(n + 1));
  if (!v) return;
  for (int p = 0; p < PH_N; p++) {
    long k = 0;
    for (long i = 1; i < n; i++) /* step 1 holds the start-up; leave it out */
      if (ph[i] == p) v[k++] = ms[i];
    if (!k) continue;
    qsort(v, (size_t)k, sizeof *v, cmp_dbl);
    double med = k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
    printf("  %-42s %7ld %12.2f %12.0f\n", ph_name[p], k, med,
           med > 0 ? (double)bdim * 1000.0 / med : 0.0);
  }
  free(v);
}

int nf__cli_train(int argc, char **argv) {
  const char *file = NULL, *def = NULL, *data = NULL, *daemon = NULL, *save = NULL, *load = NULL,
             *report_dir = NULL;
  char *report_path = NULL;
  const char *data_dir = NULL, *device = NULL;
  long epochs = -1;
  long steps = -1, batch = -1, classes = 10, samples = 2048, log_every = -1, until_tuned = -1;
  int threads = 0, json = 0, no_spawn = 0, compile_only = 0, tune_trials = 0, tune_seconds = 0;
  int samples_given = 0, profile = 0;
  int64_t prof_swaps = -1;
  double lr = 0, momentum = 0, wd = 0, wait_s = 0;
  uint64_t seed = 1;
  nf_optim_kind ok = NF_OPTIM_ADAM;
  const char *inames[40];
  int64_t ivals[40];
  int n_ip = 0;
  const char *shn[40];
  int shr[40];
  int64_t shd[40][8];
  const int64_t *shp[40];
  int n_sh = 0;
  char *trainable_buf = NULL;
  const char *trainable[64];
  int n_tr = 0;
  const char *key_file = NULL;
  char *trust[16];
  int n_trust = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(train_usage, stdout);
      return 0;
    }
    if (a[0] != '-' || a[1] != '-') {
      if (!file) file = a;
      else if (!def) def = a;
      else return bad("unexpected argument '%s'", a);
      continue;
    }
    if (!strcmp(a, "--json")) { json = 1; continue; }
    if (!strcmp(a, "--profile")) { profile = 1; continue; }
    if (!strcmp(a, "--no-spawn")) { no_spawn = 1; continue; }
    if (!strcmp(a, "--compile-only")) { compile_only = 1; continue; }
    static const char *const known[] = {
        "--json", "--profile", "--no-spawn", "--compile-only", "--data", "--daemon", "--key",
        "--trust-key", "--trust-uid", "--device", "--data-dir", "--save", "--load", "--optim",
        "--param", "--shape", "--params", "--lr", "--momentum", "--weight-decay",
        "--wait-kernels", "--steps", "--epochs", "--batch", "--threads", "--seed", "--classes",
        "--samples", "--tune-trials", "--tune-seconds", "--log-every", "--until-tuned",
        "--report"};
    int is_known = 0;
    for (size_t j = 0; j < sizeof known / sizeof known[0]; j++) is_known |= !strcmp(known[j], a);
    if (!is_known) {
      const char *near = nf_did_you_mean(a, known, (int)(sizeof known / sizeof known[0]));
      fprintf(stderr, "neoflow train: unknown option '%s'", a);
      if (near) fprintf(stderr, " (did you mean '%s'?)", near);
      fprintf(stderr, "\n(run 'neoflow train --help' for usage)\n");
      return 2;
    }
    if (i + 1 >= argc) return bad("option '%s' needs a value", a);
    const char *v = argv[++i];
    char *end = NULL;
    errno = 0;
    if (!strcmp(a, "--data")) data = v;
    else if (!strcmp(a, "--daemon")) daemon = v;
    else if (!strcmp(a, "--key")) key_file = v;
    else if (!strcmp(a, "--trust-key") || !strcmp(a, "--trust-uid")) {
      if (n_trust >= 16) return bad("at most 16 --trust-key and --trust-uid options, got more (%s)", a);
      char *t = malloc(strlen(v) + 5);
      if (!t) return 1;
      snprintf(t, strlen(v) + 5, "%s%s", a[8] == 'u' ? "uid:" : "", v);
      trust[n_trust++] = t;
    }
    else if (!strcmp(a, "--device")) device = v;
    else if (!strcmp(a, "--data-dir")) data_dir = v;
    else if (!strcmp(a, "--save")) save = v;
    else if (!strcmp(a, "--report")) report_dir = v;
    else if (!strcmp(a, "--load")) load = v;
    else if (!strcmp(a, "--optim")) {
      if (!strcmp(v, "sgd")) ok = NF_OPTIM_SGD;
      else if (!strcmp(v, "adam")) ok = NF_OPTIM_ADAM;
      else if (!strcmp(v, "adamw")) ok = NF_OPTIM_ADAMW;
      else return bad("--optim is sgd, adam or adamw, got '%s'", v);
    } else if (!strcmp(a, "--param")) {
      const char *eq = strchr(v, '=');
      if (!eq || eq == v || n_ip >= 40) return bad("--param wants NAME=INTEGER, got '%s'", v);
      long long x = strtoll(eq + 1, &end, 10);
      if (errno || !*(eq + 1) || *end)
        return bad("--param %s: not an integer (parameters are integers)", v);
      char *nm = strndup(v, (size_t)(eq - v));
      if (!nm) return 1;
      inames[n_ip] = nm;
      ivals[n_ip++] = x;
    } else if (!strcmp(a, "--shape")) {
      const char *eq = strchr(v, '=');
      if (!eq || eq == v || n_sh >= 40) return bad("--shape wants NAME=d1,d2,..., got '%s'", v);
      shn[n_sh] = strndup(v, (size_t)(eq - v));
      shr[n_sh] = 0;
      for (const char *p = eq + 1; *p;) {
        long long x = strtoll(p, &end, 10);
        if (end == p || x <= 0 || shr[n_sh] >= 8)
          return bad("--shape %s: the dimensions are 1 to 8 positive integers", v);
        shd[n_sh][shr[n_sh]++] = x;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
          return bad("--shape %s: the dimensions are 1 to 8 positive integers", v);
      }
      shp[n_sh] = shd[n_sh];
      n_sh++;
    } else if (!strcmp(a, "--params")) {
      free(trainable_buf);
      trainable_buf = strdup(v);
      n_tr = 0;
      for (char *t = strtok(trainable_buf, ","); t && n_tr < 64; t = strtok(NULL, ","))
        trainable[n_tr++] = t;
    } else if (!strcmp(a, "--lr") || !strcmp(a, "--momentum") || !strcmp(a, "--weight-decay") ||
               !strcmp(a, "--wait-kernels")) {
      double x = strtod(v, &end);
      if (errno || end == v || *end || !isfinite(x) || x < 0) {
        fprintf(stderr, "neoflow train: %s wants a non-negative number, got '%s'\n"
                        "(run 'neoflow train --help' for usage)\n", a, v);
        return 2;
      }
      if (!strcmp(a, "--lr")) lr = x;
      else if (!strcmp(a, "--momentum")) momentum = x;
      else if (!strcmp(a, "--weight-decay")) wd = x;
      else wait_s = x;
    } else {
      long long x = strtoll(v, &end, 10);
      if (errno || end == v || *end) {
        fprintf(stderr, "neoflow train: %s wants an integer, got '%s'\n"
                        "(run 'neoflow train --help' for usage)\n", a, v);
        return 2;
      }
      if (!strcmp(a, "--steps") && x >= 0) steps = x;
      else if (!strcmp(a, "--epochs") && x >= 1 && x <= 100000) epochs = x;
      else if (!strcmp(a, "--batch") && x > 0) batch = x;
      else if (!strcmp(a, "--threads") && x >= 1 && x <= 256) threads = (int)x;
      else if (!strcmp(a, "--seed") && x >= 0) seed = (uint64_t)x;
      else if (!strcmp(a, "--classes") && x >= 1 && x <= 1000000) classes = x;
      else if (!strcmp(a, "--samples") && x >= 1 && x <= 100000000) samples = x, samples_given = 1;
      else if (!strcmp(a, "--tune-trials") && x >= 1 && x <= 1000000) tune_trials = (int)x;
      else if (!strcmp(a, "--tune-seconds") && x >= 1 && x <= 604800) tune_seconds = (int)x;
      else if (!strcmp(a, "--log-every") && x >= 1) log_every = x;
      else if (!strcmp(a, "--until-tuned") && x >= 0) until_tuned = x;
      else {
        fprintf(stderr, "neoflow train: %s %s is out of range\n(run 'neoflow train --help' "
                        "for usage)\n", a, v);
        return 2;
      }
    }
  }
  if (!file || !def) return bad("%s", "needs FILE.nf and DEF");
  if (!data) return bad("%s", "needs --data (synthetic or fashion-mnist)");
  int fashion = !strcmp(data, "fashion-mnist");
  if (!fashion && strcmp(data, "synthetic"))
    return bad("unknown --data '%s' (synthetic or fashion-mnist)", data);
  if (!fashion && epochs > 0) return bad("%s", "--epochs needs --data fashion-mnist");
  if (!fashion && data_dir) return bad("%s", "--data-dir needs --data fashion-mnist");
  if (fashion && epochs < 0 && steps < 0) epochs = 1;
  if (!fashion && steps < 0) return bad("%s", "needs --steps N");
  if (log_every < 0) log_every = json ? 1 : 10;

  setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines reach a pipe or file at once */
  double t_start = nf_now_ms();
  char *err = NULL;
  nf_model *m = nf_model_load(file, &err);
  if (!m) {
    train_err(err);
    free(err);
    return 1;
  }
  if (batch > 0) {
    const char *pn[64];
    int np = nf_module_def_params(m->mod, def, pn, 64), has = 0;
    for (int i = 0; i < np && i < 64; i++) has |= !strcmp(pn[i], "batch");
    if (np >= 0 && !has) {
      fprintf(stderr, "neoflow train: error: --batch: %s has no integer parameter 'batch' "
                      "(declare it: def %s<batch = 32>(X: f32[batch, ...], ...))\n", def, def);
      nf_model_free(m);
      return 1;
    }
    if (n_ip < 40) {
      inames[n_ip] = strdup("batch");
      ivals[n_ip++] = batch;
    }
  }
  nf_session_opts so = {0};
  so.daemon_key = key_file;
  so.n_trust = n_trust;
  so.trust = (const char *const *)trust;
  so.optim.kind = ok;
  so.optim.lr = lr;
  so.optim.momentum = momentum;
  so.optim.weight_decay = wd;
  so.threads = threads;
  so.seed = seed;
  so.daemon = daemon;
  so.device = device;
  so.no_spawn = no_spawn;
  so.compile_only = compile_only;
  so.tune_trials = tune_trials;
  so.tune_seconds = tune_seconds;
  so.n_iparams = n_ip;
  so.inames = inames;
  so.ivalues = ivals;
  so.quiet = json;
  so.log = log_stderr;
  so.n_shapes = n_sh;
  so.shape_names = shn;
  so.shape_ranks = shr;
  so.shape_dims = shp;
  so.n_trainable = n_tr;
  so.trainable = trainable;
  nf_session *s = nf_session_new_def(m, def, &so, &err);
  for (int i = 0; i < n_ip; i++) free((char *)inames[i]);
  for (int i = 0; i < n_sh; i++) free((char *)shn[i]);
  free(trainable_buf);
  for (int i = 0; i < n_trust; i++) free(trust[i]);
  int status = 1;
  feed *f = NULL;
  int nf = 0;
  dsrun ds;
  memset(&ds, 0, sizeof ds);
  ds.img = ds.lab = -1;
  double *step_ms = NULL;
  unsigned char *step_ph = NULL;
  if (!s) {
    train_err(err);
    free(err);
    goto out;
  }
  /* under mpirun: this rank's shard of each global batch (rank r takes
   * the r-th of the job's per-rank batches); rank 0 alone loads, reports,
   * evaluates and saves (every rank holds the same parameters) */
  int rank = nf__dist_rank(s), nranks = nf__dist_size(s);
  if (load && rank == 0 && nf_session_load(s, load) != NF_OK) {
    train_err(nf_session_error(s));
    goto out;
  }
  if (load && nranks > 1) nf__dist_bcast_params(s);
  if (rank != 0) json = 0, profile = 0;
  int says = rank == 0;
  /* the training report (rank 0's) */
  if (report_dir && says) {
    if (mkdir(report_dir, 0777) != 0 && errno != EEXIST) {
      fprintf(stderr, "neoflow train: error: --report %s: cannot make the directory: %s\n",
              report_dir, strerror(errno));
      goto out;
    }
    size_t pl = strlen(report_dir) + 16;
    report_path = malloc(pl);
    if (!report_path) goto out;
    snprintf(report_path, pl, "%s/report.html", report_dir);
    if (nf_session_report_to(s, report_path, 60) != NF_OK ||
        nf_session_report(s, NULL) != NF_OK) { /* (a directory we cannot write: said now) */
      fprintf(stderr, "neoflow train: error: --report: %s\n", nf_session_error(s));
      goto out;
    }
  }
  /* the synthetic pool */
  nf = nf_session_n_inputs(s);
  f = calloc((size_t)nf + 1, sizeof *f);
  if (!f) goto out;
  rs = seed * 0x2545f4914f6cdd1dULL + 17;
  int64_t bdim = -1;
  int first_float = -1;
  for (int i = 0; i < nf; i++) {
    int rank;
    int64_t dims[8];
    nf_session_input_info(s, i, &f[i].name, &f[i].t, &rank, dims);
    if (i == 0 && rank > 0) bdim = dims[0];
    f[i].batched = rank > 0 && dims[0] == bdim;
    int64_t all = 1;
    for (int r = 0; r < rank; r++) all *= dims[r];
    f[i].per = f[i].batched ? all / bdim : all;
    f[i].esz = esize(f[i].t);
    f[i].bytes = (size_t)all * f[i].esz;
    f[i].buf = malloc(f[i].bytes ? f[i].bytes : 1);
    if (!f[i].buf) goto out;
    if (first_float < 0 && (f[i].t == NF_ELEM_F32) && f[i].batched) first_float = i;
  }
  if (fashion) {
    if (ds_setup(s, f, nf, bdim, nranks, data_dir, seed, &ds, &epochs, &steps) != 0) goto out;
    goto train;
  }
  {
    /* the default pool holds at most 256 MiB (and at least one batch) */
    int64_t per_sample = 0;
    for (int i = 0; i < nf; i++)
      if (f[i].batched) per_sample += f[i].per * (int64_t)f[i].esz;
    if (!samples_given && bdim > 0 && samples > 16 * bdim * nranks) samples = 16 * bdim * nranks;
    if (!samples_given && per_sample > 0 && samples * per_sample > (256LL << 20))
      samples = (256LL << 20) / per_sample > bdim * nranks ? (256LL << 20) / per_sample
                                                          : bdim * nranks;
  }
  for (int i = 0; i < nf; i++) {
    int64_t cnt = f[i].batched ? samples : 1, n = f[i].per * cnt;
    if (!f[i].pool) {
      f[i].pool = malloc((size_t)n * f[i].esz + 1);
      if (!f[i].pool) goto out;
    }
    if (f[i].t == NF_ELEM_F32)
      for (int64_t k = 0; k < n; k++) ((float *)f[i].pool)[k] = (float)gauss();
  }
  for (int i = 0; i < nf; i++) {
    if (f[i].t != NF_ELEM_I32 && f[i].t != NF_ELEM_I64) continue;
    int64_t cnt = f[i].batched ? samples : 1;
    if (!f[i].batched || f[i].per != 1 || first_float < 0) {
      for (int64_t k = 0; k < f[i].per * cnt; k++) {
        if (f[i].t == NF_ELEM_I32) ((int32_t *)f[i].pool)[k] = 0;
        else ((int64_t *)f[i].pool)[k] = 0;
      }
      continue;
    }
    const feed *x = &f[first_float];
    float *teacher = malloc(sizeof(float) * (size_t)(x->per * classes));
    if (!teacher) goto out;
    for (int64_t k = 0; k < x->per * classes; k++) teacher[k] = (float)gauss();
    for (int64_t smp = 0; smp < samples; smp++) {
      const float *xs = (const float *)x->pool + smp * x->per;
      int64_t best = 0;
      double bv = -INFINITY;
      for (int64_t c = 0; c < classes; c++) {
        double acc = 0;
        for (int64_t d = 0; d < x->per; d++) acc += (double)teacher[c * x->per + d] * xs[d];
        if (acc > bv) bv = acc, best = c;
      }
      if (f[i].t == NF_ELEM_I32) ((int32_t *)f[i].pool)[smp] = (int32_t)best;
      else ((int64_t *)f[i].pool)[smp] = best;
    }
    free(teacher);
  }
train:
  if (wait_s > 0) nf_session_wait_kernels(s, (int)(wait_s * 1000), 2);
  step_ms = malloc(sizeof(double) * (size_t)(steps + 1));
  step_ph = malloc((size_t)steps + 1);
  if (!step_ms || !step_ph) goto out;
  int tty = isatty(2) && !json && says;
  double loss0 = NAN, loss = NAN;
  int64_t spe = fashion ? ds.train.n / (bdim * nranks) : 0, seen = 0, correct = 0;
  double until_look = 0;
  for (long st = 0; st < steps; st++) {
    const int64_t *idx = NULL;
    if (fashion) {
      if (st % spe == 0) shuffle(ds.perm, ds.train.n);
      idx = ds.perm + ((st % spe) * nranks + rank) * bdim;
      if (ds_feed(s, f, &ds, &ds.train, idx, bdim)) {
        train_err(nf_session_error(s));
        goto out;
      }
    }
    for (int i = 0; !fashion && i < nf; i++) {
      if (!f[i].batched) {
        memcpy(f[i].buf, f[i].pool, f[i].bytes);
      } else {
        size_t one = (size_t)f[i].per * f[i].esz;
        for (int64_t b = 0; b < bdim; b++) {
          int64_t smp = ((st * nranks + rank) * bdim + b) % samples;
          memcpy((char *)f[i].buf + (size_t)b * one, (char *)f[i].pool + (size_t)smp * one, one);
        }
      }
      if (nf_session_feed(s, f[i].name, f[i].buf, f[i].bytes) != NF_OK) {
        train_err(nf_session_error(s));
        goto out;
      }
    }
    fault_here(rank, st);
    if (nf_session_step(s, &loss) != NF_OK) {
      train_err(nf_session_error(s));
      goto out;
    }
    if (st == 0) loss0 = loss;
    /* --until-tuned: every kernel final (looked at twice a second: the
     * look may wait a millisecond) ends the run N steps later */
    /* (data-parallel: looked at every 10 steps, and final only when it
     * is on every rank, so that every rank runs the same steps) */
    if (until_tuned >= 0 && (nranks > 1 ? (st + 1) % 10 == 0 : nf_now_ms() - until_look >= 500)) {
      until_look = nf_now_ms();
      int fin = nf_session_wait_kernels(s, 1, 2) == NF_OK;
      if (nranks > 1) fin = nf__dist_all(s, fin);
      if (fin) {
        if (until_tuned < steps - st - 1) steps = st + 1 + until_tuned;
        until_tuned = -1;
      }
    }
    nf_session_stats stt;
    nf_session_stats_get(s, &stt);
    step_ms[st] = stt.ms;
    if (profile && stt.swaps + stt.tier0_kept != prof_swaps) {
      /* the profile covers the steps since the kernels last changed */
      nf__session_profile(s, stderr, 1);
      prof_swaps = stt.swaps + stt.tier0_kept;
    }
    step_ph[st] = (unsigned char)phase_of(&stt);
    if (fashion && ds.logits) {
      correct += ds_correct(s, &ds, &ds.train, idx, bdim);
      seen += bdim;
    }
    int last = st + 1 == steps;
    if (json && ((st + 1) % log_every == 0 || last)) {
      printf("{\"step\":%lld,\"loss\":%.9g,\"ms\":%.4f,\"tier1\":%d,\"tier2\":%d,\"kernels\":%d,"
             "\"blas\":%d,\"tuning\":%d,\"trials\":%lld,\"trials_max\":%lld,\"connected\":%s,"
             "\"swaps\":%lld,\"trusted\":%lld,\"rejected\":%lld,\"reconnects\":%lld,\"first_step_ms\":%.1f,"
             "\"generated\":%d,\"graph_runs\":%lld,\"tier0_kept\":%d,\"remembered\":%lld,"
             "\"elapsed_ms\":%.1f}\n",
             (long long)stt.step, loss, stt.ms, stt.tier1, stt.tier2, stt.kernels, stt.blas,
             stt.tuning, (long long)stt.trials, (long long)stt.trials_max,
             stt.connected ? "true" : "false", (long long)stt.swaps, (long long)stt.trusted,
             (long long)stt.rejected, (long long)stt.reconnects, stt.first_step_ms,
             stt.generated, (long long)stt.graph_runs, stt.tier0_kept, (long long)stt.remembered,
             nf_now_ms() - t_start);
      fflush(stdout);
    } else if (tty) {
      fprintf(stderr, "\rstep %lld/%ld  loss %.5g  %.2f ms/step  tier1 %d/%d  tier2 %d/%d",
              (long long)stt.step, steps, loss, stt.ms_avg, stt.tier1, stt.kernels, stt.tier2,
              stt.kernels);
      if (stt.tuning) fprintf(stderr, "  tuning %d (trials %lld/%lld)", stt.tuning,
                              (long long)stt.trials, (long long)stt.trials_max);
      fprintf(stderr, "%s      ", stt.connected ? "" : "  (no daemon)");
      if (last) fputc('\n', stderr);
    } else if (!json && says && ((st + 1) % log_every == 0 || last || st == 0)) {
      printf("step %lld  loss %.6g  %.2f ms  tier1 %d/%d  tier2 %d/%d%s\n", (long long)stt.step,
             loss, stt.ms, stt.tier1, stt.kernels, stt.tier2, stt.kernels,
             stt.connected ? "" : "  (no daemon)");
    }
    if (fashion && says && ((st + 1) % spe == 0 || last)) {
      double acc = 0, tl = 0, t0 = nf_now_ms();
      if (ds_evaluate(s, f, &ds, bdim, &acc, &tl)) {
        fprintf(stderr, "neoflow train: error: evaluation: %s\n", nf_session_error(s));
        goto out;
      }
      double ev_ms = nf_now_ms() - t0;
      double tr_acc = seen ? (double)correct / (double)seen : NAN;
      if (ds.logits) nf_session_note(s, "test accuracy", acc);
      nf_session_note(s, "test loss", tl);
      if (json && ds.logits)
        printf("{\"epoch\":%.4g,\"step\":%ld,\"train_accuracy\":%.6f,\"test_accuracy\":%.6f,"
               "\"test_loss\":%.6g,\"eval_ms\":%.1f}\n",
               (double)(st + 1) / (double)spe, st + 1, tr_acc, acc, tl, ev_ms);
      else if (json)
        printf("{\"epoch\":%.4g,\"step\":%ld,\"test_loss\":%.6g,\"eval_ms\":%.1f}\n",
               (double)(st + 1) / (double)spe, st + 1, tl, ev_ms);
      else if (!ds.logits)
        printf("epoch %.4g (step %ld): test loss %.4f (%lld images, %.1f s; no logits output: "
               "no accuracy)\n", (double)(st + 1) / (double)spe, st + 1, tl,
               (long long)ds.test.n, ev_ms / 1000);
      else
        printf("epoch %.4g (step %ld): train accuracy %.2f%% (running%s), test accuracy %.2f%% "
               "(loss %.4f, %lld images, %.1f s)\n",
               (double)(st + 1) / (double)spe, st + 1, 100 * tr_acc,
               nranks > 1 ? ", rank 0's shard" : "", 100 * acc, tl,
               (long long)ds.test.n, ev_ms / 1000);
      fflush(stdout);
      seen = correct = 0;
    }
  }
  if (nranks > 1) {
    int same = params_agree(s);
    nf_session_stats sx;
    nf_session_stats_get(s, &sx);
    double t_steps = 0;
    for (long q = 0; q < steps; q++) t_steps += step_ms[q];
    double per = sx.step ? nf__dist_wait_ms(s) / (double)sx.step : 0;
    if (says)
      printf("data-parallel: %d ranks; their parameters are %s; rank 0 waited %.3f ms per step "
             "for the exchanges (%.1f%% of its steps)\n", nranks,
             same ? "identical" : "NOT identical (a defect: please report it)", per,
             t_steps > 0 ? 100 * nf__dist_wait_ms(s) / t_steps : 0);
    if (!same) goto out;
  }
  if (save && says && nf_session_save(s, save) != NF_OK) {
    train_err(nf_session_error(s));
    goto out;
  }
  if (!json && says) {
    nf_session_stats stt;
    nf_session_stats_get(s, &stt);
    char gen[96] = "";
    int gl = stt.generated ? snprintf(gen, sizeof gen, ", generated here %d", stt.generated) : 0;
    if (stt.graph_runs)
      snprintf(gen + gl, sizeof gen - (size_t)gl, ", %lld runs as CUDA graphs",
               (long long)stt.graph_runs);
    printf("trained %lld steps: loss %.6g -> %.6g; first step done %.0f ms after start; "
           "%.2f ms/step (last 10); kernels %d: tier1 %d, tier2 %d, blas %d%s; swaps %lld, "
           "rejected %lld\n",
           (long long)stt.step, loss0, loss, stt.first_step_ms, stt.ms_avg, stt.kernels, stt.tier1,
           stt.tier2, stt.blas, gen, (long long)stt.swaps, (long long)stt.rejected);
    if (steps > 1) print_phases(step_ms, step_ph, steps, bdim * nranks);
  }
  if (profile) nf__session_profile(s, stdout, 0);
  if (report_path) {
    int rrc = nf_session_report(s, NULL);
    if (rrc != NF_OK) fprintf(stderr, "neoflow train: error: --report: %s\n", nf_session_error(s));
    nf_session_report_to(s, NULL, 0); /* (written, or said: not again when the session ends) */
    if (rrc != NF_OK) goto out;
    printf("report: %s\n", report_path);
  }
  status = isfinite(loss) || steps == 0 ? 0 : 1;
  if (status) fprintf(stderr, "neoflow train: error: the loss is not finite (%g)\n", loss);
out:
  /* (a rank that fails ends the job: the others would wait for it) */
  if (status && s && nf__dist_size(s) > 1) nf__dist_abort(s, "neoflow train failed on this rank");
  free(step_ms);
  free(step_ph);
  free(report_path);
  nf_dataset_free(&ds.train);
  nf_dataset_free(&ds.test);
  free(ds.perm);
  free(ds.logit_buf);
  for (int i = 0; f && i < nf; i++) {
    free(f[i].buf);
    free(f[i].pool);
  }
  free(f);
  nf_session_free(s);
  nf_model_free(m);
  return status;
}
