/* client_example.c - the complete example of docs/client.md: a small
 * classifier built in C from the standard library's defs, trained with
 * Adam on a learnable synthetic task, its outputs read and its parameters
 * saved.  Exits 0 when the loss fell to under half its start.
 *
 *   cc client_example.c $(pkg-config --cflags --libs neoflow-client)
 *   ./a.out [none]        # "none": no daemon (fallback kernels only) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <neoflow/neoflow.h>

enum { B = 32, D = 20, H = 16, C = 4 };

/* The session's messages on stderr (the library never prints itself). */
static void log_stderr(void *user, int level, const char *message) {
  (void)user;
  fprintf(stderr, "%s: %s%s\n", "client_example", level == NEOFLOW_LOG_WARN ? "warning: " : "", message);
}

int main(int argc, char **argv) {
  char *err = NULL;
  nf_model *m = nf_model_load_source("example", "import nn\n", &err);
  if (!m) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  /* the net: logits = W2 relu(W1 x + b1) + b2, loss = cross-entropy */
  nf_net *net = nf_net_new(m);
  int64_t xd[] = {B, D}, yd[] = {B}, w1d[] = {H, D}, b1d[] = {H}, w2d[] = {C, H}, b2d[] = {C};
  int x = nf_net_input(net, "X", NF_ELEM_F32, 2, xd);
  int y = nf_net_input(net, "labels", NF_ELEM_I64, 1, yd);
  int w1 = nf_net_param(net, "W1", NF_ELEM_F32, 2, w1d, (nf_init){.fn = NF_INIT_FN_KAIMING_UNIFORM});
  int b1 = nf_net_param(net, "b1", NF_ELEM_F32, 1, b1d, (nf_init){.fn = NF_INIT_FN_ZEROS});
  int w2 = nf_net_param(net, "W2", NF_ELEM_F32, 2, w2d, (nf_init){.fn = NF_INIT_FN_XAVIER_UNIFORM});
  int b2 = nf_net_param(net, "b2", NF_ELEM_F32, 1, b2d, (nf_init){.fn = NF_INIT_FN_ZEROS});
  int h, a, logits, loss;
  if (nf_net_apply(net, "linear", 0, NULL, NULL, 3, (int[]){x, w1, b1}, 1, &h) ||
      nf_net_apply(net, "relu", 0, NULL, NULL, 1, &h, 1, &a) ||
      nf_net_apply(net, "linear", 0, NULL, NULL, 3, (int[]){a, w2, b2}, 1, &logits) ||
      nf_net_apply(net, "cross_entropy", 0, NULL, NULL, 2, (int[]){logits, y}, 1, &loss) ||
      nf_net_loss(net, loss) || nf_net_output(net, "scores", logits) || nf_grad(net, x)) {
    fprintf(stderr, "net: %s\n", nf_net_error(net));
    return 1;
  }
  nf_session_opts o = {.optim = {.kind = NF_OPTIM_ADAM, .lr = 0.01}, .seed = 7,
                       .daemon = argc > 1 ? argv[1] : NULL, .log = log_stderr};
  nf_session *s = nf_session_new_net(net, &o, &err);
  if (!s) {
    fprintf(stderr, "session: %s\n", err);
    return 1;
  }
  /* data: labels = argmax of a fixed linear teacher of X */
  static float X[4][B * D], T[C * D];
  static int64_t Y[4][B];
  srand(1);
  for (int i = 0; i < C * D; i++) T[i] = (float)rand() / RAND_MAX - 0.5f;
  for (int k = 0; k < 4; k++)
    for (int n = 0; n < B; n++) {
      for (int d = 0; d < D; d++) X[k][n * D + d] = (float)rand() / RAND_MAX * 2 - 1;
      float best = -INFINITY;
      for (int c = 0; c < C; c++) {
        float v = 0;
        for (int d = 0; d < D; d++) v += T[c * D + d] * X[k][n * D + d];
        if (v > best) best = v, Y[k][n] = c;
      }
    }
  double first = 0, l = 0;
  for (int step = 0; step < 200; step++) {
    if (nf_session_feed(s, "X", X[step % 4], sizeof X[0]) ||
        nf_session_feed(s, "labels", Y[step % 4], sizeof Y[0]) || nf_session_step(s, &l)) {
      fprintf(stderr, "step: %s\n", nf_session_error(s));
      return 1;
    }
    if (step == 0) first = l;
  }
  float scores[B * C], gx[B * D];
  nf_session_stats st;
  nf_session_stats_get(s, &st);
  if (nf_session_read(s, "scores", scores, sizeof scores) ||
      nf_session_read(s, "grad_X", gx, sizeof gx) || nf_session_save(s, "example.params")) {
    fprintf(stderr, "read/save: %s\n", nf_session_error(s));
    return 1;
  }
  printf("loss %.4f -> %.4f in %lld steps; %.2f ms/step; kernels %d (tier 1: %d, tier 2: %d)\n",
         first, l, (long long)st.step, st.ms_avg, st.kernels, st.tier1, st.tier2);
  nf_session_free(s);
  nf_net_free(net);
  nf_model_free(m);
  return l < 0.5 * first ? 0 : 1;
}
