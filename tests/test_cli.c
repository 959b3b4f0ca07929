/* test_cli.c - the `neoflow` tool as a user runs it: exit statuses, the
 * located messages for bad input (source files, options, .npy files),
 * outputs written as .npy, hashes independent of names. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nf_config.h"
#include "nf_npy.h"
#include "nf_test_daemon.h"

static char tmpdir[256];

static const char *tool(void) {
  const char *t = getenv("NF_NEOFLOW");
  return t ? t : "client/neoflow";
}

static void write_file(const char *name, const void *data, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  fclose(f);
}

static void write_text(const char *name, const char *text) {
  write_file(name, text, strlen(text));
}

/* Runs `neoflow ARGS` in tmpdir; returns the exit status and the combined
 * output in *out (malloc'ed). */
static int run(char **out, const char *args) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s 2>&1", tmpdir, tool(), args);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  size_t n;
  while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
    len += n;
    if (len + 1 >= cap) {
      cap *= 2;
      buf = realloc(buf, cap);
    }
  }
  buf[len] = 0;
  int st = pclose(p);
  *out = buf;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void setup(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/nf_cli_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
  write_text("mm.nf",
             "# matmul with a relu epilogue\n"
             "def mm(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
             "  T(i, j) +=! A(i, k) * B(k, j)\n"
             "  C(i, j) = max(T(i, j), 0.0)\n"
             "}\n");
}

static void teardown(void) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  ck_assert_int_eq(system(cmd), 0);
}

static int log_has_text(const char *path, const char *text) {
  FILE *f = fopen(path, "r");
  char line[4096];
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, text) != NULL;
  if (f) fclose(f);
  return found;
}

static void expect(const char *args, int status, const char *needle) {
  char *out;
  int rc = run(&out, args);
  if (rc != status || !strstr(out, needle))
    ck_abort_msg("neoflow %s: exit %d (want %d), output:\n%s\n(wanted '%s')", args, rc,
                 status, out, needle);
  free(out);
}

START_TEST(cli_check_prints_signatures) {
  expect("check mm.nf", 0, "mm(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N])\nmm.nf: 1 def ok");
  expect("check mm.nf mm --shape A=3,4 --shape B=4,5", 0, "mm: 4 tensors, 2 statements: ok");
  /* a def whose sizes its own parameters fix is instantiated by check: a
   * shape error shows without --shape; a typo gets a suggestion */
  write_text("fixed.nf",
             "def f<n = 3>(X: f32[n, 8], W: f32[4, 8]) -> (Y: f32[n, 5]) {\n"
             "  Y(i, o) +=! X(i, k) * W(o, k)\n"
             "}\n");
  expect("check fixed.nf", 1,
         "fixed.nf:2:25: error: W(o, k) may be out of bounds: index 0 takes values in [0, 4]");
  write_text("typo.nf",
             "def f(Hidden: f32[N, 8], b: f32[8]) -> (Y: f32[N, 8]) {\n"
             "  Y = exp(Hiden) + b\n"
             "}\n");
  expect("check typo.nf", 1, "unknown tensor 'Hiden' (did you mean 'Hidden'?)");
  write_text("typo2.nf",
             "def g(X: f32[N, 8], b: f32[8]) -> (Y: f32[N, 8]) {\n"
             "  Y(row, col) = X(row, col) * b(cool)\n"
             "}\n");
  expect("check typo2.nf g --shape X=2,8 --shape b=8", 1,
         "'cool' is not an index of 'Y' (did you mean 'col'?)");
}
END_TEST

START_TEST(cli_syntax_error_is_located) {
  write_text("bad.nf", "def f(X: f32[N]) -> (Y: f32[N]) {\n  Y(i) = X(i +)\n}\n");
  char *out;
  ck_assert_int_eq(run(&out, "check bad.nf"), 1);
  ck_assert_msg(strstr(out, "bad.nf:2:15: error: "), "%s", out);
  ck_assert_msg(strstr(out, "    Y(i) = X(i +)\n                ^"), "%s", out);
  free(out);
}
END_TEST

START_TEST(cli_bad_uses_fail_cleanly) {
  expect("check nothere.nf", 1, "cannot open 'nothere.nf': No such file or directory");
  expect("hash mm.nf nope --shape A=1,2", 1, "mm.nf: error: no def named 'nope' (defined here: mm)");
  expect("hash mm.nf mm --shape A=3,4 --shape B=5,6", 1,
         "sizes disagree: 'K' is 4 from input A, dimension 1 but 5 from input B, dimension 0");
  expect("hash mm.nf mm --shape A=3,4", 1, "no shape given for input 'B' of mm");
  expect("hash mm.nf mm --shape A=3,x", 2, "--shape A: 'x' is not a dimension");
  expect("eval mm.nf mm --param 3", 2, "--param wants NAME=INTEGER");
  expect("eval mm.nf mm --param stride=0.25", 2, "--param stride: '0.25' is not an integer");
  expect("frobnicate mm.nf", 2, "unknown command 'frobnicate'");
  expect("evl mm.nf", 2, "unknown command 'evl' (did you mean 'eval'?)");
  expect("eval mm.nf mm --bogus", 2, "unknown option '--bogus'");
  expect("eval mm.nf mm --shap A=3,4", 2, "unknown option '--shap' (did you mean '--shape'?)");
  /* an option the command would ignore */
  expect("compile mm.nf mm --wrt A -o x.so", 2,
         "neoflow compile: --wrt is not an option of compile (it takes: --shape --param "
         "--schedule --target -o)");
  expect("eval mm.nf mm --dot x.dot", 2, "--dot is not an option of eval");
  expect("check mm.nf --out d", 2, "--out is not an option of check");
  /* neoflow train's messages name the option and value, once */
  expect("train mm.nf mm --data synthetic --stpes 3", 2,
         "unknown option '--stpes' (did you mean '--steps'?)");
  expect("train mm.nf mm --data synthetic --lr fast", 2, "--lr wants a non-negative number, "
         "got 'fast'");
  expect("train nothere.nf mm --data synthetic --steps 1", 1,
         "neoflow train: error: cannot open 'nothere.nf'");
  expect("eval mm.nf mm --shape A=3,4 --shape B=4,5 --shape Z=1", 1, "mm has no input named 'Z'");
  expect("eval", 2, "usage");
}
END_TEST

/* A minimal .npy writer for fixtures (independent of nf_npy_write). */
static void npy_fixture(const char *name, const char *descr, const char *shape,
                        const void *data, size_t n, size_t cut) {
  char hdr[128];
  int hl = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                    descr, shape);
  int total = 10 + hl + 1;
  int pad = (64 - total % 64) % 64;
  unsigned char buf[4096];
  size_t len = 0;
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  len = 8;
  unsigned short hlen = (unsigned short)(hl + pad + 1);
  buf[len++] = (unsigned char)(hlen & 0xff);
  buf[len++] = (unsigned char)(hlen >> 8);
  memcpy(buf + len, hdr, (size_t)hl);
  len += (size_t)hl;
  memset(buf + len, ' ', (size_t)pad);
  len += (size_t)pad;
  buf[len++] = '\n';
  memcpy(buf + len, data, n);
  len += n;
  write_file(name, buf, len - cut);
}

START_TEST(cli_bad_npy_is_reported) {
  float a[6] = {1, 2, 3, 4, 5, 6};
  npy_fixture("trunc.npy", "<f4", "(2, 3)", a, sizeof a, 8);
  expect("eval mm.nf mm --in A=trunc.npy --shape B=3,2", 1, "trunc.npy");
  expect("eval mm.nf mm --in A=trunc.npy --shape B=3,2", 1, "truncated");
  write_text("garbage.npy", "this is not numpy");
  expect("eval mm.nf mm --in A=garbage.npy --shape B=3,2", 1, "garbage.npy");
  expect("eval mm.nf mm --in A=missing.npy --shape B=3,2", 1, "missing.npy");
  /* A float array for an integer tensor needs a cast: refused. */
  write_text("lab.nf",
             "def pick(X: f32[N, C], L: i64[N]) -> (Y: f32[N]) {\n"
             "  Y(n) = X(n, L(n))\n}\n");
  float l[2] = {0, 1};
  npy_fixture("lab.npy", "<f4", "(2,)", l, sizeof l, 0);
  expect("eval lab.nf pick --shape X=2,3 --in L=lab.npy", 1,
         "input L: cannot use a f32 array for a i64 tensor");
  float cplx[4] = {1, 0, 2, 0};
  npy_fixture("cplx.npy", "<c8", "(2,)", cplx, sizeof cplx, 0);
  expect("eval lab.nf pick --shape X=2,3 --in L=cplx.npy", 1, "cplx.npy: dtype '<c8' not supported");
  /* An index out of range in the data is a run-time error, not a crash. */
  long long bad[2] = {0, 7};
  npy_fixture("labbad.npy", "<i8", "(2,)", bad, sizeof bad, 0);
  expect("eval lab.nf pick --shape X=2,3 --in L=labbad.npy", 1, "out of bounds");
}
END_TEST

START_TEST(cli_eval_writes_outputs) {
  float a[6] = {1, -2, 3, 4, 5, -6}, b[6] = {0.5f, -1, 2, 0.25f, -0.5f, 1};
  npy_fixture("a.npy", "<f4", "(2, 3)", a, sizeof a, 0);
  npy_fixture("b.npy", "<f4", "(3, 2)", b, sizeof b, 0);
  char *out;
  ck_assert_int_eq(run(&out, "eval mm.nf mm --in A=a.npy --in B=b.npy --out res"), 0);
  ck_assert_msg(strstr(out, "C: f32[2, 2] l2="), "%s", out);
  free(out);
  char path[512];
  snprintf(path, sizeof path, "%s/res/C.npy", tmpdir);
  nf_array c;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_npy_read(path, &c, &err), 0);
  ck_assert_int_eq(c.dtype, NF_F32);
  ck_assert_int_eq(c.rank, 2);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      float s = 0;
      for (int k = 0; k < 3; k++) s += a[i * 3 + k] * b[k * 2 + j];
      if (s < 0) s = 0;
      ck_assert_float_eq_tol(((float *)c.data)[i * 2 + j], s, 1e-6);
    }
  nf_array_free(&c);
  nf_buf_free(&err);
  /* Random inputs are reproducible by seed and saved for reuse. */
  char *o1, *o2, *o3;
  ck_assert_int_eq(run(&o1, "eval mm.nf mm --shape A=5,7 --shape B=7,3 --seed 9 --out r2"), 0);
  ck_assert_int_eq(run(&o2, "eval mm.nf mm --shape A=5,7 --shape B=7,3 --seed 9"), 0);
  ck_assert_int_eq(run(&o3, "eval mm.nf mm --in A=r2/inputs/A.npy --in B=r2/inputs/B.npy"), 0);
  ck_assert_str_eq(o1, o2);
  ck_assert_str_eq(o1, o3);
  free(o1);
  free(o2);
  free(o3);
}
END_TEST

START_TEST(cli_hash_ignores_names) {
  write_text("mm2.nf",
             "def other(P: f32[R, Q], Z: f32[Q, S]) -> (Out: f32[R, S]) {\n"
             "  acc(a, b) +=! P(a, r) * Z(r, b)\n"
             "  Out(a, b) = max(acc(a, b), 0.0)\n"
             "}\n");
  char *h1, *h2, *h3;
  ck_assert_int_eq(run(&h1, "hash mm.nf mm --shape A=3,4 --shape B=4,5"), 0);
  ck_assert_int_eq(run(&h2, "hash mm2.nf other --shape P=3,4 --shape Z=4,5"), 0);
  ck_assert_int_eq(run(&h3, "hash mm.nf mm --shape A=3,4 --shape B=4,6"), 0);
  ck_assert_uint_eq(strlen(h1), 65);
  ck_assert_str_eq(h1, h2);
  ck_assert_str_ne(h1, h3);
  free(h1);
  free(h2);
  free(h3);
}
END_TEST

START_TEST(cli_print_reparses) {
  char *out, *again;
  ck_assert_int_eq(run(&out, "print mm.nf"), 0);
  write_text("printed.nf", out);
  ck_assert_int_eq(run(&again, "print printed.nf"), 0);
  ck_assert_str_eq(out, again);
  free(out);
  free(again);
  char *g, *h1, *h2;
  ck_assert_int_eq(run(&g, "print mm.nf mm --shape A=3,4 --shape B=4,5"), 0);
  write_text("flat.nf", g);
  ck_assert_int_eq(run(&h1, "hash flat.nf mm"), 0);
  ck_assert_int_eq(run(&h2, "hash mm.nf mm --shape A=3,4 --shape B=4,5"), 0);
  ck_assert_str_eq(h1, h2);
  free(g);
  free(h1);
  free(h2);
}
END_TEST

START_TEST(cli_grad_prints_checkable_nf) {
  char *out;
  ck_assert_int_eq(run(&out, "grad mm.nf mm --wrt A,B --shape A=3,4 --shape B=4,5"), 0);
  ck_assert_msg(strstr(out, "# gradient of mm with respect to A,B\n"), "%s", out);
  ck_assert_msg(strstr(out, "# total: forward "), "%s", out);
  ck_assert_msg(strstr(out, "def mm_grad(A: f32[3, 4], B: f32[4, 5], dC: f32[3, 5]) -> "
                            "(grad_A: f32[3, 4], grad_B: f32[4, 5]) {"),
                "%s", out);
  write_text("g.nf", out);
  free(out);
  expect("check g.nf mm_grad", 0, "mm_grad: ");
}
END_TEST

START_TEST(cli_grad_evaluates) {
  float a[6] = {1, -2, 3, 4, 5, -6}, b[6] = {0.5f, -1, 2, 0.25f, -0.5f, 1};
  float dc[4] = {1, 2, -1, 0.5f};
  npy_fixture("a.npy", "<f4", "(2, 3)", a, sizeof a, 0);
  npy_fixture("b.npy", "<f4", "(3, 2)", b, sizeof b, 0);
  npy_fixture("dc.npy", "<f4", "(2, 2)", dc, sizeof dc, 0);
  char *out;
  ck_assert_int_eq(run(&out, "grad mm.nf mm --wrt A --in A=a.npy --in B=b.npy "
                             "--dout dc.npy --out g"), 0);
  ck_assert_msg(strstr(out, "grad_A: f32[2, 3] l2="), "%s", out);
  free(out);
  char path[512];
  snprintf(path, sizeof path, "%s/g/grad_A.npy", tmpdir);
  nf_array ga;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_npy_read(path, &ga, &err), 0);
  /* C = relu(A B): dA(i,k) = sum_j [T(i,j) > 0] dC(i,j) B(k,j) */
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 3; k++) {
      float want = 0;
      for (int j = 0; j < 2; j++) {
        float t = 0;
        for (int q = 0; q < 3; q++) t += a[i * 3 + q] * b[q * 2 + j];
        if (t > 0) want += dc[i * 2 + j] * b[k * 2 + j];
      }
      ck_assert_float_eq_tol(((float *)ga.data)[i * 3 + k], want, 1e-5);
    }
  nf_array_free(&ga);
  nf_buf_free(&err);
}
END_TEST

/* Issue 31 item 9: the daemon options of the tool say what happened.
 * `neoflow train` takes --key (it read it as "expected an integer"),
 * --trust-key and --trust-uid, and names a bad one; a TCP address written
 * without its tcp: prefix is pointed out; a located error is not
 * prefixed twice. */
START_TEST(cli_daemon_messages) {
  write_text("t.nf", "import nn\n"
                     "def t<batch = 4>(X: f32[batch, 3], W: f32[3, 2]) -> (L: f32[]) {\n"
                     "  Y = matmul(X, W)\n"
                     "  L() +=! Y(i, j) * Y(i, j)\n"
                     "}\n");
  char *out = NULL;
  /* --key is an option of train now; the key file is checked when used */
  int st = run(&out, "train t.nf t --params W --data synthetic --steps 1 --daemon none "
                     "--key /nonexistent/key --trust-uid root");
  ck_assert_msg(st == 0, "%s", out);
  ck_assert_msg(!strstr(out, "expected an integer"), "%s", out);
  free(out);
  st = run(&out, "train t.nf t --params W --data synthetic --steps 1 --daemon none "
                 "--trust-key ed25519:1234");
  ck_assert_int_ne(st, 0);
  ck_assert_msg(strstr(out, "trust_key: expected ed25519:<64 hex digits>"), "%s", out);
  free(out);
  st = run(&out, "train t.nf t --params W --data synthetic --steps 1 --daemon none "
                 "--trust-uid no_such_user_here");
  ck_assert_int_ne(st, 0);
  ck_assert_msg(strstr(out, "no user named 'no_such_user_here'"), "%s", out);
  free(out);
  /* status at HOST:PORT without tcp: */
  st = run(&out, "status --socket 127.0.0.1:17117");
  ck_assert_int_eq(st, 1);
  ck_assert_msg(strstr(out, "write tcp:127.0.0.1:17117"), "%s", out);
  free(out);
  /* NEOFLOW_SOCKET in a directory others may enter: neoflowd would refuse
   * it, so no daemon is started, and the user is told why (the run went on
   * silently on fallback kernels) */
  char cmd[700];
  snprintf(cmd, sizeof cmd, "mkdir -m 0755 '%s/open'", tmpdir);
  ck_assert_int_eq(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "env NEOFLOW_SOCKET='%s/open/s.sock' '%s' train t.nf t --params W "
           "--data synthetic --steps 2 --wait-kernels 1", tmpdir, tool());
  {
    char full[1200];
    snprintf(full, sizeof full, "cd '%s' && %s 2>&1", tmpdir, cmd);
    FILE *p = popen(full, "r");
    ck_assert_ptr_nonnull(p);
    char buf[8192];
    size_t got = fread(buf, 1, sizeof buf - 1, p);
    buf[got] = 0;
    pclose(p);
    ck_assert_msg(strstr(buf, "not starting neoflowd") && strstr(buf, "mode 0755"), "%s", buf);
  }
  /* a located error once */
  st = run(&out, "train t.nf t --params W --data synthetic --steps 1 --daemon none "
                 "--shape X=2");
  ck_assert_int_ne(st, 0);
  ck_assert_msg(!strstr(out, "error: t.nf"), "%s", out);
  ck_assert_msg(strstr(out, "neoflow train: t.nf:"), "%s", out);
  free(out);
}
END_TEST

/* `train --until-tuned N` runs until every kernel is final, then N steps
 * (a daemon of the test's own); with no daemon there is nothing to wait
 * for: N steps after the first.  --steps caps it. */
#if NF_HAVE_SEARCH
START_TEST(cli_train_until_tuned) {
  write_text("t.nf", "import nn\n"
                     "def t<batch = 16>(X: f32[batch, 24], W: f32[24, 20]) -> (L: f32[]) {\n"
                     "  Y = matmul(X, W)\n"
                     "  L() +=! Y(i, j) * Y(i, j)\n"
                     "}\n");
  char *out = NULL;
  int st = run(&out, "train t.nf t --params W --data synthetic --steps 1000 --until-tuned 3 "
                     "--daemon none --json");
  ck_assert_msg(st == 0, "%s", out);
  ck_assert_msg(strstr(out, "{\"step\":4,") && !strstr(out, "{\"step\":5,"), "%s", out);
  free(out);
  dm d;
  dm_init(&d);
  d.env = "NF_JOB_FAKE_TIMES=1";
  dm_config(&d, NULL);
  dm_start(&d);
  char args[1024];
  /* a cap no run reaches before its kernels are final (the test's
   * timeout comes first); a JSON line per 1000 steps and the last */
  snprintf(args, sizeof args,
           "train t.nf t --params W --data synthetic --steps 1000000000 --until-tuned 5 "
           "--tune-trials 3 --tune-seconds 20 --daemon '%s' --no-spawn --threads 1 --json "
           "--log-every 1000",
           d.sock);
  st = run(&out, args);
  ck_assert_msg(st == 0, "%s", out);
  /* the last step: nothing tuning, every kernel final (tier 2, or tier 1
   * when no candidate beat the default, or kept on its fallback) */
  const char *last = NULL;
  for (const char *p = strstr(out, "{\"step\":"); p; p = strstr(p + 1, "{\"step\":")) last = p;
  ck_assert_ptr_nonnull(last);
  long steps = strtol(last + 8, NULL, 10);
  ck_assert_msg(steps > 5 && steps < 1000000000, "%ld steps: %s", steps, out);
  ck_assert_msg(strstr(last, "\"tuning\":0,"), "%s", last);
  ck_assert_int_eq(dm_stop(&d, SIGTERM), 0);
  ck_assert_msg(log_has_text(d.log, "tuning started"), "the daemon tuned nothing: %s", d.log);
  dm_done(&d);
  free(out);
}
END_TEST
#endif

START_TEST(cli_grad_bad_uses) {
  expect("grad mm.nf mm --shape A=3,4 --shape B=4,5", 2, "grad needs --wrt");
  expect("grad mm.nf mm --wrt Z --shape A=3,4 --shape B=4,5", 1,
         "cannot differentiate mm: 'Z' is not an input of mm");
  write_text("two.nf",
             "def two(X: f32[N]) -> (P: f32[N], Q: f32[N]) {\n"
             "  P(i) = X(i) * 2.0\n  Q(i) = X(i) * X(i)\n}\n"
             "def idx(X: f32[N], L: i64[N]) -> (Y: f32[N]) {\n"
             "  Y(i) = X(i) * f32(L(i))\n}\n"
             "def cast(X: f32[N]) -> (Y: f32[N]) {\n"
             "  Y(i) = f32(i32(X(i) * 4.0))\n}\n");
  float d[3] = {1, 1, 1};
  npy_fixture("d.npy", "<f4", "(3,)", d, sizeof d, 0);
  expect("grad two.nf two --wrt X --shape X=3 --dout d.npy --out o", 1,
         "two has 2 outputs: name the one --dout is for");
  expect("grad two.nf two --wrt X --shape X=3 --dout R=d.npy --out o", 1,
         "--dout: two has no output named 'R'");
  expect("grad two.nf two --wrt X --shape X=3 --dout Q=d.npy --out o", 0, "grad_X: f32[3]");
  expect("grad two.nf idx --wrt L --shape X=3 --shape L=3", 1,
         "cannot differentiate with respect to 'L': it is i64, not a float tensor");
  expect("grad two.nf cast --wrt X --shape X=3", 1,
         "statement 0 (Y): cannot differentiate through the conversion of a float value to i32");
}
END_TEST

START_TEST(cli_lower_and_schedules) {
  expect("lower mm.nf mm --shape A=16,16 --shape B=16,32", 0, "kernel mm(in f32 A[16][16], in f32 B[16][32], out f32 C[16][32]) {");
  write_text("bad.sched", "neoflow-schedule 1\nstmt 0 split nothere 4\n");
  expect("lower mm.nf mm --shape A=16,16 --shape B=16,32 --schedule bad.sched", 1, "nothere");
  write_text("syntax.sched", "neoflow-schedule 1\nstmt 0 frobnicate i\n");
  expect("lower mm.nf mm --shape A=16,16 --shape B=16,32 --schedule syntax.sched", 1,
         "syntax.sched:2:");
}
END_TEST

#if NF_HAVE_LLVM
static double l2_of(const char *out, const char *name) {
  char key[64];
  snprintf(key, sizeof key, "%s: ", name);
  const char *p = strstr(out, key);
  if (!p) return -1;
  p = strstr(p, "l2=");
  return p ? strtod(p + 3, NULL) : -1;
}

START_TEST(cli_compile_and_run_compiled) {
  char *out;
  ck_assert_int_eq(run(&out, "compile mm.nf mm --shape A=33,17 --shape B=17,29 -o k.so"), 0);
  ck_assert_msg(strstr(out, "k.so: "), "%s", out);
  free(out);
  char path[512];
  snprintf(path, sizeof path, "%s/k.so", tmpdir);
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  unsigned char magic[4];
  ck_assert_uint_eq(fread(magic, 1, 4, f), 4);
  fclose(f);
  ck_assert(magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' && magic[3] == 'F');
  char *a, *b;
  ck_assert_int_eq(run(&a, "eval mm.nf mm --shape A=33,17 --shape B=17,29 --seed 5"), 0);
  ck_assert_int_eq(run(&b, "eval mm.nf mm --shape A=33,17 --shape B=17,29 --seed 5 "
                           "--engine compiled --threads 2"), 0);
  double x = l2_of(a, "C"), y = l2_of(b, "C");
  ck_assert_msg(x > 0 && y > 0 && fabs(x - y) <= 1e-5 * x, "%s\n%s", a, b);
  free(b);
  /* the same path on a GPU (nf_device.h): the emulated driver runs the
   * CUDA C (skipped where this build has no NVRTC) */
  const char *drv = getenv("NF_TEST_CUDA_DRIVER");
  if (drv && getenv("NF_TEST_CUDA_EMU")) {
    char args[1024];
    snprintf(args, sizeof args,
             "eval mm.nf mm --shape A=33,17 --shape B=17,29 --seed 5 --engine cuda");
    setenv("NEOFLOW_LIBCUDA", drv, 1);
    int st = run(&b, args);
    unsetenv("NEOFLOW_LIBCUDA");
    if (st != 0 && strstr(b, "no GPU to run on") && strstr(b, "NVRTC")) {
      fprintf(stderr, "cli_compile_and_run_compiled: --engine cuda skipped: %s", b);
    } else {
      ck_assert_msg(st == 0 && strstr(b, "neoflow: GPU kernel on "), "%s", b);
      double z = l2_of(b, "C");
      ck_assert_msg(fabs(x - z) <= 1e-5 * x, "%s\n%s", a, b);
    }
    free(b);
  }
  free(a);
  expect("compile mm.nf mm --shape A=3,4 --shape B=4,5", 2, "compile needs -o FILE.so");
  expect("compile mm.nf mm --shape A=3,4 --shape B=4,5 --target gpu -o x.so", 2,
         "--target is cpu[:CPU[:FEATURES]]");
}
END_TEST
#endif

#if NF_HAVE_SEARCH
static int count_lines(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  int n = 0, c;
  while ((c = fgetc(f)) != EOF) n += c == '\n';
  fclose(f);
  return n;
}

static double json_num(const char *out, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *p = strstr(out, k);
  return p ? strtod(p + strlen(k), NULL) : -1;
}

START_TEST(cli_tune) {
  char *out;
  ck_assert_int_eq(run(&out, "tune mm.nf mm --shape A=16,24 --shape B=24,32 --trials 6 --json "
                             "--csv c.csv --svg c.svg -o best.sched"),
                   0);
  ck_assert_msg(strstr(out, "{\"def\":\"mm\"") != NULL, "%s", out);
  ck_assert_msg(json_num(out, "trials") == 6 && json_num(out, "failures") == 0, "%s", out);
  double best = json_num(out, "best_ms"), def = json_num(out, "default_ms");
  ck_assert_msg(best > 0 && def > 0 && best <= def && json_num(out, "gflops") > 0, "%s", out);
  free(out);
  ck_assert_int_eq(count_lines("c.csv"), 1 + 7); /* header, the default, 6 trials */
  char path[512];
  snprintf(path, sizeof path, "%s/c.svg", tmpdir);
  FILE *f = fopen(path, "r");
  char head[8] = {0};
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fread(head, 1, 4, f), 4);
  fclose(f);
  ck_assert_str_eq(head, "<svg");
  /* the best schedule compiles the same function */
  expect("lower mm.nf mm --shape A=16,24 --shape B=24,32 --schedule best.sched", 0, "kernel mm(");
  /* the gradient graph, and the comparison with random search */
  ck_assert_int_eq(run(&out, "tune mm.nf mm --shape A=16,24 --shape B=24,32 --wrt A,B "
                             "--trials 3 --json --compare-random"),
                   0);
  ck_assert_msg(strstr(out, "\"random\":{") != NULL && json_num(out, "trials") == 3, "%s", out);
  free(out);
  /* text report */
  expect("tune mm.nf mm --shape A=8,8 --shape B=8,8 --trials 2", 0, "best-so-far");
  expect("tune mm.nf mm --shape A=8,8 --shape B=8,8 --trials 0", 2, "--trials wants");
  expect("tune mm.nf mm --shape A=8,8 --shape B=8,8 --seconds -1", 2, "--seconds wants");
  expect("tune mm.nf", 2, "tune needs a DEF");
  expect("tune mm.nf mm --shape A=8,8 --shape B=8,8 --wrt Q", 1, "cannot differentiate");
  expect("tune mm.nf mm --shape A=8,8 --shape B=8,8 --trials 2 --csv /nonexistent/x.csv", 1,
         "cannot write");
}
END_TEST
#endif

static Suite *suite(void) {
  Suite *s = suite_create("cli");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, cli_check_prints_signatures);
  tcase_add_test(tc, cli_syntax_error_is_located);
  tcase_add_test(tc, cli_bad_uses_fail_cleanly);
  tcase_add_test(tc, cli_bad_npy_is_reported);
  tcase_add_test(tc, cli_eval_writes_outputs);
  tcase_add_test(tc, cli_hash_ignores_names);
  tcase_add_test(tc, cli_print_reparses);
  tcase_add_test(tc, cli_grad_prints_checkable_nf);
  tcase_add_test(tc, cli_grad_evaluates);
  tcase_add_test(tc, cli_grad_bad_uses);
  tcase_add_test(tc, cli_daemon_messages);
  tcase_add_test(tc, cli_lower_and_schedules);
#if NF_HAVE_LLVM
  tcase_add_test(tc, cli_compile_and_run_compiled);
#endif
#if NF_HAVE_SEARCH
  tcase_add_test(tc, cli_tune);
#endif
  suite_add_tcase(s, tc);
#if NF_HAVE_SEARCH
  /* a daemon compiles and tunes beside the training: on a loaded machine
   * (the test command runs suites side by side) it takes longer */
  TCase *td = tcase_create("daemon");
  tcase_add_checked_fixture(td, setup, teardown);
  tcase_set_timeout(td, 300);
  tcase_add_test(td, cli_train_until_tuned);
  suite_add_tcase(s, td);
#endif
  return s;
}

int main(void) {
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
