/* fashion_train.c - a training program for Fashion-MNIST written against
 * libneoflow-client's public API only: it loads a model written in .nf
 * (default examples/fashion_cnn.nf, def cnn), the IDX files of Debian's
 * dataset-fashion-mnist, and trains with Adam and a cosine learning-rate
 * schedule, evaluating the test split after each epoch (forward only,
 * nf_session_eval).  Exits 0 when the final test accuracy reaches the
 * goal (default 0: any).
 *
 *   cc fashion_train.c $(pkg-config --cflags --libs neoflow-client) -lm
 *   ./a.out [--model FILE.nf] [--def NAME] [--epochs E] [--steps N]
 *           [--lr X] [--daemon ADDR|none] [--data-dir DIR] [--goal ACC] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <neoflow/neoflow.h>

/* A small generator for the shuffles (splitmix64). */
/* The session's messages on stderr (the library never prints itself). */
static void log_stderr(void *user, int level, const char *message) {
  (void)user;
  fprintf(stderr, "%s: %s%s\n", "fashion_train", level == NEOFLOW_LOG_WARN ? "warning: " : "", message);
}

static uint64_t rng = 12345;
static uint64_t next(void) {
  uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* The first forward output after the loss of shape [batch, classes]. */
static const char *logits_output(nf_session *s, int64_t batch, int64_t *classes) {
  for (int i = 1; i < nf_session_n_outputs(s); i++) {
    const char *name;
    nf_elem t;
    int rank;
    int64_t d[8];
    nf_session_output_info(s, i, &name, &t, &rank, d);
    if (t == NF_ELEM_F32 && rank == 2 && d[0] == batch) {
      *classes = d[1];
      return name;
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  const char *model = "examples/fashion_cnn.nf", *def = "cnn", *daemon = NULL, *dir = NULL;
  int epochs = 1;
  long max_steps = -1;
  double lr0 = 1e-3, goal = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *a = argv[i], *v = argv[i + 1];
    if (!strcmp(a, "--model")) model = v;
    else if (!strcmp(a, "--def")) def = v;
    else if (!strcmp(a, "--epochs")) epochs = atoi(v);
    else if (!strcmp(a, "--steps")) max_steps = atol(v);
    else if (!strcmp(a, "--lr")) lr0 = atof(v);
    else if (!strcmp(a, "--daemon")) daemon = v;
    else if (!strcmp(a, "--data-dir")) dir = v;
    else if (!strcmp(a, "--goal")) goal = atof(v);
    else {
      fprintf(stderr, "fashion_train: unknown option %s\n", a);
      return 2;
    }
  }
  if (argc % 2 == 0 || epochs < 1 || !(lr0 > 0)) {
    fprintf(stderr, "fashion_train: options come in pairs; --epochs >= 1, --lr > 0\n");
    return 2;
  }
  char *err = NULL;
  nf_dataset train, test;
  if (nf_dataset_mnist_load(dir, "train", &train, &err) ||
      nf_dataset_mnist_load(dir, "test", &test, &err)) {
    fprintf(stderr, "fashion_train: %s\n", err);
    free(err);
    return 1;
  }
  nf_model *m = nf_model_load(model, &err);
  if (!m) {
    fprintf(stderr, "%s", err);
    return 1;
  }
  nf_session_opts o = {.optim = {.kind = NF_OPTIM_ADAM, .lr = lr0}, .seed = 1, .daemon = daemon,
                       .log = log_stderr};
  nf_session *s = nf_session_new_def(m, def, &o, &err);
  if (!s) {
    fprintf(stderr, "fashion_train: %s\n", err);
    return 1;
  }
  /* the inputs: images (f32, rows x cols per sample) and labels (i64) */
  const char *xin = NULL, *yin = NULL;
  int64_t batch = 0, per = train.rows * train.cols;
  for (int i = 0; i < nf_session_n_inputs(s); i++) {
    const char *name;
    nf_elem t;
    int rank;
    int64_t d[8];
    nf_session_input_info(s, i, &name, &t, &rank, d);
    int64_t all = 1;
    for (int r = 0; r < rank; r++) all *= d[r];
    if (t == NF_ELEM_F32 && rank > 0 && all / d[0] == per) xin = name, batch = d[0];
    else if (t == NF_ELEM_I64 && rank == 1) yin = name;
  }
  int64_t classes = 0;
  const char *lname = logits_output(s, batch, &classes);
  if (!xin || !yin || !lname) {
    fprintf(stderr, "fashion_train: %s needs an image input, an i64 label input and a logits "
                    "output after the loss\n", def);
    return 1;
  }
  float *xb = malloc(sizeof(float) * (size_t)(batch * per));
  float *lb = malloc(sizeof(float) * (size_t)(batch * classes));
  int64_t *yb = malloc(sizeof(int64_t) * (size_t)batch);
  int64_t *perm = malloc(sizeof(int64_t) * (size_t)train.n);
  if (!xb || !lb || !yb || !perm) return 1;
  for (int64_t i = 0; i < train.n; i++) perm[i] = i;
  long spe = (long)(train.n / batch), total = spe * epochs, step = 0;
  if (max_steps > 0 && max_steps < total) total = max_steps;
  double acc = 0;
  for (int e = 0; e < epochs && step < total; e++) {
    for (int64_t i = train.n - 1; i > 0; i--) { /* shuffle */
      int64_t j = (int64_t)(next() % (uint64_t)(i + 1)), t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
    double lsum = 0;
    long n = 0;
    for (long k = 0; k < spe && step < total; k++, step++) {
      for (int64_t b = 0; b < batch; b++) {
        int64_t idx = perm[k * batch + b];
        memcpy(xb + b * per, train.images + idx * per, sizeof(float) * (size_t)per);
        yb[b] = train.labels[idx];
      }
      /* cosine decay from lr0 to lr0 / 20 over the run */
      double lr = lr0 * (0.05 + 0.95 * 0.5 * (1 + cos(M_PI * (double)step / (double)total)));
      double loss;
      if (nf_session_set_lr(s, lr) || nf_session_feed(s, xin, xb, sizeof(float) * (size_t)(batch * per)) ||
          nf_session_feed(s, yin, yb, sizeof(int64_t) * (size_t)batch) || nf_session_step(s, &loss)) {
        fprintf(stderr, "fashion_train: %s\n", nf_session_error(s));
        return 1;
      }
      lsum += loss;
      n++;
    }
    /* the test split, forward only; the last batch padded with sample 0 */
    int64_t correct = 0;
    for (int64_t start = 0; start < test.n; start += batch) {
      for (int64_t b = 0; b < batch; b++) {
        int64_t idx = start + b < test.n ? start + b : 0;
        memcpy(xb + b * per, test.images + idx * per, sizeof(float) * (size_t)per);
        yb[b] = test.labels[idx];
      }
      if (nf_session_feed(s, xin, xb, sizeof(float) * (size_t)(batch * per)) ||
          nf_session_feed(s, yin, yb, sizeof(int64_t) * (size_t)batch) || nf_session_eval(s, NULL) ||
          nf_session_read(s, lname, lb, sizeof(float) * (size_t)(batch * classes))) {
        fprintf(stderr, "fashion_train: %s\n", nf_session_error(s));
        return 1;
      }
      for (int64_t b = 0; b < batch && start + b < test.n; b++) {
        int64_t best = 0;
        for (int64_t c = 1; c < classes; c++)
          if (lb[b * classes + c] > lb[b * classes + best]) best = c;
        correct += best == test.labels[start + b];
      }
    }
    acc = (double)correct / (double)test.n;
    nf_session_stats st;
    nf_session_stats_get(s, &st);
    printf("epoch %d: %ld steps, mean loss %.4f, test accuracy %.2f%%, %.1f ms/step "
           "(kernels: %d, tier 1 %d, tier 2 %d, OpenBLAS %d)\n",
           e + 1, n, n ? lsum / (double)n : NAN, 100 * acc, st.ms_avg, st.kernels, st.tier1,
           st.tier2, st.blas);
  }
  free(xb);
  free(lb);
  free(yb);
  free(perm);
  nf_session_free(s);
  nf_model_free(m);
  nf_dataset_free(&train);
  nf_dataset_free(&test);
  return acc >= goal ? 0 : 1;
}
