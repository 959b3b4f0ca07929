/* neoflow.c - the user's command-line tool.
 *
 *   neoflow check FILE.nf [DEF [--shape ...] [--param ...]]
 *   neoflow print FILE.nf [DEF [--shape ...] [--param ...]]
 *   neoflow hash  FILE.nf DEF [--shape ...] [--param ...]
 *   neoflow eval  FILE.nf DEF [--in NAME=x.npy ...] [--shape NAME=d1,d2,...]
 *                 [--param NAME=V ...] [--seed S] [--precision f32|f64]
 *                 [--out DIR]
 *   neoflow grad  FILE.nf DEF --wrt X[,Y...] [eval's options]
 *                 [--dout FILE.npy | --dout OUT=FILE.npy ...]
 *
 * Exit status: 0 success, 1 an error in the user's input (messages on
 * stderr, located where possible), 2 a usage error.  Later issues add
 * grad, partition, tune, status, cache and bench. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nf_autodiff.h"
#include "nf_config.h"
#include "nf_cuda_rt.h"
#include "nf_device.h"
#include "nf_lower.h"
#include "nf_nvrtc_link.h"
#include "nf_runtime.h"
#if NF_HAVE_LLVM
#include "nf_codegen.h"
#endif
#include "nf_diag.h"
#include "nf_interp.h"
#include "nf_ir.h"
#include "nf_lang.h"
#include "nf_npy.h"
#if NF_HAVE_SEARCH
#include "tune.h"
#endif
#include "daemon_cmd.h"
#include "nf_partition.h"
#include "nf_stack.h"

#define MAX_ARGS 64

static const char usage_text[] =
    "usage: neoflow COMMAND FILE.nf [DEF] [options]\n"
    "\n"
    "commands:\n"
    "  check FILE.nf [DEF]   parse and check; print each def's signature; with\n"
    "                        DEF (and shapes), also instantiate it\n"
    "  print FILE.nf [DEF]   canonical text of the file, or of DEF's instantiated\n"
    "                        graph (constant shapes, explicit ranges)\n"
    "  hash FILE.nf DEF      canonical SHA-256 of DEF's instantiated graph\n"
    "  eval FILE.nf DEF      evaluate DEF with the reference interpreter\n"
    "  lower FILE.nf DEF     print DEF's loop program (default schedule or --schedule)\n"
    "  compile FILE.nf DEF -o KERNEL.so\n"
    "                        compile DEF to a shared object (kernel ABI: nf_kernel.h);\n"
    "                        with --target cuda:sm_XX, to a cubin (-o K.cubin) or to\n"
    "                        CUDA C (-o K.cu)\n"
    "  grad FILE.nf DEF --wrt X[,Y...]\n"
    "                        print the gradient graph as .nf with a FLOP table;\n"
    "                        with --out DIR, evaluate it and write DIR/grad_<X>.npy\n"
    "  partition FILE.nf DEF [--wrt X,...] [--dot FILE]\n"
    "                        the subgraphs DEF's graph (or its gradient graph) is\n"
    "                        compiled as, with their keys; --dot: a Graphviz picture\n"
    "  tune FILE.nf DEF      search DEF's schedules (compiled and measured for real);\n"
    "                        prints the best schedule and the best-so-far curve\n"
    "  train FILE.nf DEF --data synthetic --steps N\n"
    "                        train DEF (loss first, `param` declarations) with\n"
    "                        kernels from neoflowd swapped in (neoflow train --help)\n"
    "  status                what neoflowd is doing (neoflow status --help)\n"
    "  cache SUBCOMMAND      the tuning cache: stats, list, export, import, verify,\n"
    "                        gc (neoflow cache --help)\n"
    "  version               print the version\n"
    "\n"
    "options:\n"
    "  --shape NAME=d1,d2,...  shape of an input (NAME= for a scalar)\n"
    "  --param NAME=V          integer parameter\n"
    "  --in NAME=FILE.npy      input values (eval); the shape comes from the file\n"
    "  --seed S                seed for random inputs (eval; default 1)\n"
    "  --precision f32|f64     interpreter precision (eval; default f32)\n"
    "  --out DIR               write outputs as DIR/<output>.npy and generated\n"
    "                          inputs as DIR/inputs/<input>.npy (eval, grad)\n"
    "  --wrt X[,Y...]          inputs to differentiate with respect to (grad)\n"
    "  --dout [OUT=]FILE.npy   the adjoint of an output (grad; ones when absent)\n"
    "  --schedule FILE         a schedule (docs/schedules.md) instead of the default\n"
    "  --target cpu[:CPU[:FEATURES]] | cuda:sm_XX\n"
    "                          code generation target (host CPU by default); lower:\n"
    "                          cuda prints the GPU default schedule's loop program\n"
    "  --engine interp|compiled|cuda  evaluate with the interpreter (default), a CPU\n"
    "                          kernel, or a GPU kernel (first CUDA device)\n"
    "  --threads N             threads of the compiled engine (default 1)\n"
    "  -o FILE                 output of compile; tune: the best schedule\n"
    "  --trials N              tune: measured candidates (default 200)\n"
    "  --seconds S             tune: wall-time budget\n"
    "  --wrt X[,Y...]          tune: the gradient graph instead of DEF's\n"
    "  --json                  tune: end with one JSON object\n"
    "  --csv FILE, --svg FILE  tune: the best-so-far curve as CSV / an SVG plot\n"
    "  --random                tune: random search (no cost model)\n"
    "  --compare-random        tune: also run random search and plot both curves\n"
    "  --daemon                tune through neoflowd (answered from its cache when\n"
    "                          the graph was tuned before); -o FILE: the kernel\n"
    "  --socket ADDR           tune --daemon: a socket path or tcp:HOST:PORT\n"
    "  --key FILE              tune --daemon: the key for a daemon on TCP\n"
    "  --trust-key KEY|FILE    tune --daemon: a daemon's public key (needed on TCP)\n"
    "  --trust-uid USER        tune --daemon: the user a shared daemon runs as\n";

typedef struct opts {
  const char *cmd, *file, *def;
  int n_shapes;
  nf_arg_shape shapes[MAX_ARGS];
  int n_params;
  const char *param_names[MAX_ARGS];
  int64_t param_values[MAX_ARGS];
  int n_in;
  const char *in_names[MAX_ARGS];
  const char *in_files[MAX_ARGS];
  uint64_t seed;
  nf_precision precision;
  const char *out_dir;
  const char *wrt;
  const char *schedule; /* --schedule FILE */
  const char *target;   /* --target cpu[:CPU[:FEATURES]] */
  const char *engine;   /* --engine interp|compiled */
  const char *output;   /* -o FILE */
  int threads;          /* --threads N (compiled engine, tune) */
  int trials;           /* --trials N (tune) */
  double seconds;       /* --seconds S (tune) */
  int json, random_search, compare_random; /* --json, --random, --compare-random */
  const char *csv, *svg; /* --csv FILE, --svg FILE (tune) */
  int daemon;           /* --daemon (tune) */
  const char *socket, *key; /* --socket ADDR, --key FILE (tune --daemon) */
  const char *trust_keys[16], *trust_uids[16]; /* --trust-key, --trust-uid */
  int n_trust_keys, n_trust_uids;
  const char *dot;      /* --dot FILE (partition) */
  int n_dout;
  const char *dout_names[MAX_ARGS]; /* NULL: the only output */
  const char *dout_files[MAX_ARGS];
  uint32_t given;       /* the options given (bits of opt_names) */
} opts;

/* Every option of the FILE.nf commands, and which command uses which: an
 * option the command would ignore is an error. */
static const char *const opt_names[] = {
    "--shape", "--param", "--in",     "--seed",  "--precision", "--out",     "--wrt",
    "--dout",  "--schedule", "--target", "--engine", "--threads", "--trials", "--seconds",
    "--csv",   "--svg",   "--json",   "--random", "--compare-random", "--daemon", "--socket",
    "--key",   "--trust-key", "--trust-uid", "--dot", "-o"};
enum { N_OPTS = sizeof opt_names / sizeof opt_names[0] };
#define OPT(name) (1u << opt_index(name))

static int opt_index(const char *name) {
  for (int k = 0; k < N_OPTS; k++)
    if (!strcmp(opt_names[k], name)) return k;
  return N_OPTS; /* (never: every flag parsed is in the table) */
}

static const char *const commands[] = {"check", "print",     "hash", "eval", "grad",
                                       "lower", "compile",   "tune", "partition",
                                       "train", "status",    "cache", "version", "help"};

/* The options command cmd takes. */
static uint32_t cmd_options(const char *cmd) {
  uint32_t inst = OPT("--shape") | OPT("--param");
  uint32_t code = OPT("--schedule") | OPT("--target");
  uint32_t run = OPT("--in") | OPT("--seed") | OPT("--precision") | OPT("--out") |
                 OPT("--engine") | OPT("--threads") | code;
  if (!strcmp(cmd, "eval")) return inst | run;
  if (!strcmp(cmd, "grad")) return inst | run | OPT("--wrt") | OPT("--dout");
  if (!strcmp(cmd, "lower")) return inst | code;
  if (!strcmp(cmd, "compile")) return inst | code | OPT("-o");
  if (!strcmp(cmd, "partition")) return inst | OPT("--wrt") | OPT("--dot");
  if (!strcmp(cmd, "tune"))
    return inst | OPT("--trials") | OPT("--seconds") | OPT("--csv") | OPT("--svg") |
           OPT("--json") | OPT("--random") | OPT("--compare-random") | OPT("--seed") |
           OPT("--threads") | OPT("--target") | OPT("--wrt") | OPT("--daemon") |
           OPT("--socket") | OPT("--key") | OPT("--trust-key") | OPT("--trust-uid") | OPT("-o");
  return inst; /* check, print, hash */
}

/* An option given that cmd does not use: said with the ones it takes. */
static int check_options(const opts *o) {
  uint32_t extra = o->given & ~cmd_options(o->cmd);
  if (!extra) return 0;
  int k = 0;
  while (!(extra & (1u << k))) k++;
  fprintf(stderr, "neoflow %s: %s is not an option of %s (it takes:", o->cmd, opt_names[k],
          o->cmd);
  uint32_t take = cmd_options(o->cmd);
  for (int j = 0; j < N_OPTS; j++)
    if (take & (1u << j)) fprintf(stderr, " %s", opt_names[j]);
  fprintf(stderr, ")\n(run 'neoflow --help' for usage)\n");
  return 2;
}

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "neoflow: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(run 'neoflow --help' for usage)\n");
  return 2;
}

/* An unknown option or command, with the nearest known one. */
static int unknown_error(const char *what, const char *word, const char *const *known, int n) {
  const char *near = nf_did_you_mean(word, known, n);
  fprintf(stderr, "neoflow: unknown %s '%s'", what, word);
  if (near) fprintf(stderr, " (did you mean '%s'?)", near);
  fprintf(stderr, "\n(run 'neoflow --help' for usage)\n");
  return 2;
}

static int parse_i64(const char *s, int64_t *v) {
  if (!*s) return 0;
  errno = 0;
  char *end;
  long long x = strtoll(s, &end, 10);
  if (errno || *end) return 0;
  *v = x;
  return 1;
}

/* Splits "NAME=REST"; returns REST or NULL. */
static const char *split_eq(char *arg) {
  char *eq = strchr(arg, '=');
  if (!eq || eq == arg) return NULL;
  *eq = 0;
  return eq + 1;
}

static int parse_args(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof *o);
  o->seed = 1;
  int pos = 0;
  for (int k = 1; k < argc; k++) {
    char *a = argv[k];
    if (a[0] == '-' && a[1] == '-' && a[2]) {
      char *val = NULL;
      char *eq = strchr(a, '=');
      /* --opt=value or --opt value */
      const char *flag = a;
      char flagbuf[32];
      if (eq && (size_t)(eq - a) < sizeof flagbuf) {
        memcpy(flagbuf, a, (size_t)(eq - a));
        flagbuf[eq - a] = 0;
        flag = flagbuf;
        val = eq + 1;
      }
      if (strcmp(a, "--json") == 0 || strcmp(a, "--random") == 0 ||
          strcmp(a, "--compare-random") == 0 || strcmp(a, "--daemon") == 0) {
        o->given |= OPT(a);
        if (a[2] == 'j') o->json = 1;
        else if (a[2] == 'd') o->daemon = 1;
        else if (a[2] == 'r') o->random_search = 1;
        else o->compare_random = 1;
        continue;
      }
      int takes = strcmp(flag, "--trials") == 0 || strcmp(flag, "--seconds") == 0 ||
                  strcmp(flag, "--csv") == 0 || strcmp(flag, "--svg") == 0 ||
                  strcmp(flag, "--shape") == 0 || strcmp(flag, "--param") == 0 ||
                  strcmp(flag, "--in") == 0 || strcmp(flag, "--seed") == 0 ||
                  strcmp(flag, "--precision") == 0 || strcmp(flag, "--out") == 0 ||
                  strcmp(flag, "--wrt") == 0 || strcmp(flag, "--dout") == 0 ||
                  strcmp(flag, "--schedule") == 0 || strcmp(flag, "--target") == 0 ||
                  strcmp(flag, "--engine") == 0 || strcmp(flag, "--threads") == 0 ||
                  strcmp(flag, "--socket") == 0 || strcmp(flag, "--key") == 0 ||
                  strcmp(flag, "--trust-key") == 0 || strcmp(flag, "--trust-uid") == 0 ||
                  strcmp(flag, "--dot") == 0;
      if (!takes) {
        if (strcmp(a, "--help") == 0) return 3;
        return unknown_error("option", flag, opt_names, N_OPTS);
      }
      o->given |= OPT(flag);
      if (!val) {
        if (k + 1 >= argc) return usage_error("option '%s' needs a value", a);
        val = argv[++k];
      }
      if (strcmp(flag, "--shape") == 0) {
        if (o->n_shapes >= MAX_ARGS) return usage_error("too many %s options", flag);
        const char *dims = split_eq(val);
        if (!dims) return usage_error("--shape wants NAME=d1,d2,..., got '%s'", val);
        nf_arg_shape *s = &o->shapes[o->n_shapes++];
        s->name = val;
        s->rank = 0;
        char *p = (char *)dims;
        while (*p) {
          char *comma = strchr(p, ',');
          if (comma) *comma = 0;
          int64_t d;
          if (!parse_i64(p, &d) || d < 0) {
            fprintf(stderr, "neoflow: --shape %s: '%s' is not a dimension (a non-negative "
                    "integer)\n(run 'neoflow --help' for usage)\n", s->name, p);
            return 2;
          }
          if (s->rank >= NF_MAX_RANK)
            return usage_error("--shape: more than 8 dimensions for '%s'", s->name);
          s->dims[s->rank++] = d;
          if (!comma) break;
          p = comma + 1;
        }
      } else if (strcmp(flag, "--param") == 0) {
        if (o->n_params >= MAX_ARGS) return usage_error("too many %s options", flag);
        const char *v = split_eq(val);
        int64_t x;
        if (!v) return usage_error("--param wants NAME=INTEGER, got '%s'", val);
        if (!parse_i64(v, &x)) {
          fprintf(stderr, "neoflow: --param %s: '%s' is not an integer (parameters are "
                  "integers)\n(run 'neoflow --help' for usage)\n", val, v);
          return 2;
        }
        o->param_names[o->n_params] = val;
        o->param_values[o->n_params++] = x;
      } else if (strcmp(flag, "--in") == 0) {
        if (o->n_in >= MAX_ARGS) return usage_error("too many %s options", flag);
        const char *f = split_eq(val);
        if (!f || !*f) return usage_error("--in wants NAME=FILE.npy, got '%s'", val);
        o->in_names[o->n_in] = val;
        o->in_files[o->n_in++] = f;
      } else if (strcmp(flag, "--seed") == 0) {
        int64_t x;
        if (!parse_i64(val, &x)) return usage_error("--seed wants an integer, got '%s'", val);
        o->seed = (uint64_t)x;
      } else if (strcmp(flag, "--precision") == 0) {
        if (strcmp(val, "f32") == 0)
          o->precision = NF_INTERP_F32;
        else if (strcmp(val, "f64") == 0)
          o->precision = NF_INTERP_F64;
        else
          return usage_error("--precision is f32 or f64, got '%s'", val);
      } else if (strcmp(flag, "--wrt") == 0) {
        o->wrt = val;
      } else if (strcmp(flag, "--schedule") == 0) {
        o->schedule = val;
      } else if (strcmp(flag, "--target") == 0) {
        if ((strncmp(val, "cpu", 3) != 0 || (val[3] != 0 && val[3] != ':')) &&
            strncmp(val, "cuda", 4) != 0)
          return usage_error("--target is cpu[:CPU[:FEATURES]] or cuda:sm_XX, got '%s'", val);
        o->target = val;
      } else if (strcmp(flag, "--engine") == 0) {
        if (strcmp(val, "interp") != 0 && strcmp(val, "compiled") != 0 && strcmp(val, "cuda") != 0)
          return usage_error("--engine is interp, compiled or cuda, got '%s'", val);
        o->engine = val;
      } else if (strcmp(flag, "--trials") == 0) {
        int64_t x;
        if (!parse_i64(val, &x) || x < 1 || x > 1000000)
          return usage_error("--trials wants 1..1000000, got '%s'", val);
        o->trials = (int)x;
      } else if (strcmp(flag, "--seconds") == 0) {
        char *end;
        errno = 0;
        double x = strtod(val, &end);
        if (errno || end == val || *end || !(x > 0) || x > 1e7)
          return usage_error("--seconds wants a positive number, got '%s'", val);
        o->seconds = x;
      } else if (strcmp(flag, "--csv") == 0) {
        o->csv = val;
      } else if (strcmp(flag, "--svg") == 0) {
        o->svg = val;
      } else if (strcmp(flag, "--threads") == 0) {
        int64_t x;
        if (!parse_i64(val, &x) || x < 1 || x > 256)
          return usage_error("--threads wants 1..256, got '%s'", val);
        o->threads = (int)x;
      } else if (strcmp(flag, "--dot") == 0) {
        o->dot = val;
      } else if (strcmp(flag, "--socket") == 0) {
        o->socket = val;
      } else if (strcmp(flag, "--key") == 0) {
        o->key = val;
      } else if (strcmp(flag, "--trust-key") == 0 || strcmp(flag, "--trust-uid") == 0) {
        int uid = flag[8] == 'u';
        int *n = uid ? &o->n_trust_uids : &o->n_trust_keys;
        if (*n >= 16) return usage_error("too many %s options", flag);
        (uid ? o->trust_uids : o->trust_keys)[(*n)++] = val;
      } else if (strcmp(flag, "--dout") == 0) {
        if (o->n_dout >= MAX_ARGS) return usage_error("too many %s options", flag);
        char *eq = strchr(val, '=');
        if (eq && eq != val) {
          *eq = 0;
          o->dout_names[o->n_dout] = val;
          o->dout_files[o->n_dout++] = eq + 1;
        } else {
          o->dout_names[o->n_dout] = NULL;
          o->dout_files[o->n_dout++] = val;
        }
      } else {
        o->out_dir = val;
      }
      continue;
    }
    if (strcmp(a, "-h") == 0) return 3;
    if (strcmp(a, "-o") == 0) {
      if (k + 1 >= argc) return usage_error("option '%s' needs a value", a);
      o->given |= OPT("-o");
      o->output = argv[++k];
      continue;
    }
    if (pos == 0)
      o->cmd = a;
    else if (pos == 1)
      o->file = a;
    else if (pos == 2)
      o->def = a;
    else
      return usage_error("unexpected argument '%s'", a);
    pos++;
  }
  return 0;
}

/* Loads the module, printing diagnostics; NULL on failure. */
static nf_module *load(const char *file) {
  nf_module *m = nf_module_new();
  nf_diag *d = nf_diag_new();
  if (!m || !d) {
    fprintf(stderr, "neoflow: out of memory\n");
    nf_module_free(m);
    nf_diag_free(d);
    return NULL;
  }
  int rc = nf_module_load_file(m, file, d);
  if (rc) {
    fputs(nf_diag_text(d), stderr);
    if (nf_diag_count(d) == 0)
      fprintf(stderr, "%s: error: %s\n", file, nf_strerror(rc));
    nf_module_free(m);
    m = NULL;
  }
  nf_diag_free(d);
  return m;
}

static int instantiate(nf_module *m, const opts *o, nf_ir_ctx *ctx,
                       nf_graph **g) {
  if (!nf_module_has_def(m, o->def)) {
    fprintf(stderr, "%s: error: no def named '%s'", o->file, o->def);
    int n = nf_module_n_defs(m);
    if (n > 0) {
      fprintf(stderr, " (defined here:");
      for (int k = 0; k < n; k++) fprintf(stderr, " %s", nf_module_def_name(m, k));
      fprintf(stderr, ")");
    }
    fprintf(stderr, "\n");
    return 1;
  }
  nf_inst_opts io = {
      .n_shapes = o->n_shapes,
      .shapes = o->shapes,
      .n_params = o->n_params,
      .param_names = o->param_names,
      .param_values = o->param_values,
  };
  nf_diag *d = nf_diag_new();
  if (!d) return 1;
  int rc = nf_module_instantiate(m, o->def, &io, ctx, g, d);
  if (rc) {
    fputs(nf_diag_text(d), stderr);
    if (nf_diag_count(d) == 0)
      fprintf(stderr, "%s: error: %s\n", o->file, nf_strerror(rc));
  }
  nf_diag_free(d);
  return rc ? 1 : 0;
}

static int cmd_check(const opts *o) {
  nf_module *m = load(o->file);
  if (!m) return 1;
  nf_buf b = NF_BUF_INIT;
  int n = nf_module_n_defs(m);
  for (int k = 0; k < n; k++) {
    nf_buf_reset(&b);
    nf_module_def_signature(m, nf_module_def_name(m, k), &b);
    printf("%s\n", nf_buf_str(&b));
  }
  nf_buf_free(&b);
  int rc = 0;
  if (o->def) {
    nf_ir_ctx *ctx = nf_ir_ctx_new();
    nf_graph *g;
    rc = ctx ? instantiate(m, o, ctx, &g) : 1;
    if (!rc)
      printf("%s: %u tensors, %u statements: ok\n", o->def, g->n_tensors, g->n_stmts);
    nf_ir_ctx_free(ctx);
  }
  /* every def that needs no shapes (its sizes fixed by its own parameters
   * and constants) is instantiated too: its shape errors show here */
  int fixed = 0;
  for (int k = 0; !o->def && k < n; k++) {
    nf_ir_ctx *ctx = nf_ir_ctx_new();
    nf_diag *d = nf_diag_new();
    nf_graph *g = NULL;
    nf_inst_opts io = {.fixed_only = 1};
    int irc = ctx && d ? nf_module_instantiate(m, nf_module_def_name(m, k), &io, ctx, &g, d)
                       : NF_ENOMEM;
    if (irc == NF_OK) {
      fixed++;
    } else if (irc != NF_EUNSUPPORTED) {
      fputs(nf_diag_text(d), stderr);
      if (nf_diag_count(d) == 0)
        fprintf(stderr, "%s: error: %s: %s\n", o->file, nf_module_def_name(m, k),
                nf_strerror(irc));
      rc = 1;
    }
    nf_diag_free(d);
    nf_ir_ctx_free(ctx);
  }
  if (!rc)
    printf("%s: %d def%s ok (%d instantiated with their own sizes; the rest need shapes)\n",
           o->file, n, n == 1 ? "" : "s", fixed);
  nf_module_free(m);
  return rc;
}

static int cmd_print(const opts *o) {
  nf_module *m = load(o->file);
  if (!m) return 1;
  nf_buf b = NF_BUF_INIT;
  int rc = 0;
  if (!o->def) {
    nf_module_print(m, &b);
  } else {
    nf_ir_ctx *ctx = nf_ir_ctx_new();
    nf_graph *g;
    rc = ctx ? instantiate(m, o, ctx, &g) : 1;
    if (!rc && nf_graph_print(g, &b)) {
      fprintf(stderr, "neoflow: cannot print the graph\n");
      rc = 1;
    }
    nf_ir_ctx_free(ctx);
  }
  if (!rc) fputs(nf_buf_str(&b), stdout);
  nf_buf_free(&b);
  nf_module_free(m);
  return rc;
}

static int cmd_hash(const opts *o) {
  if (!o->def) return usage_error("%s needs a DEF", "hash");
  nf_module *m = load(o->file);
  if (!m) return 1;
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g;
  int rc = ctx ? instantiate(m, o, ctx, &g) : 1;
  if (!rc) {
    uint8_t dig[32];
    char hex[65];
    if (nf_graph_hash(g, dig)) {
      fprintf(stderr, "neoflow: cannot hash the graph\n");
      rc = 1;
    } else {
      nf_hash_hex(dig, hex);
      printf("%s\n", hex);
    }
  }
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
  return rc;
}

/* ---- eval ---- */

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { /* [0, 1) */
  return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* The smallest extent of a tensor dimension that input `in` indexes, so
 * that random integer inputs used as indices stay in bounds. */
typedef struct ibound {
  uint32_t in;
  int64_t bound;
  const nf_graph *g;
} ibound;

static void find_bound(const nf_expr *e, void *user) {
  ibound *b = user;
  if (e->op != NF_OP_ACCESS) return;
  for (int k = 0; k < e->n_args; k++) {
    const nf_expr *ix = e->args[k];
    /* The index is the input's value, possibly cast. */
    while (ix->op == NF_OP_CAST) ix = ix->args[0];
    if (ix->op == NF_OP_ACCESS && ix->u.tensor == b->in) {
      int64_t ext = b->g->tensors[e->u.tensor].shape[k];
      if (b->bound < 0 || ext < b->bound) b->bound = ext;
    }
  }
}

static int64_t int_bound(const nf_graph *g, uint32_t in) {
  ibound b = {in, -1, g};
  for (uint32_t s = 0; s < g->n_stmts; s++) nf_expr_visit(g->stmts[s].rhs, find_bound, &b);
  return b.bound > 0 ? b.bound : 10;
}

static void random_fill(const nf_graph *g, uint32_t id, nf_array *a, uint64_t *rng) {
  const nf_tensor *t = &g->tensors[id];
  if (nf_dtype_is_float((nf_dtype)t->dtype)) {
    for (int64_t k = 0; k < a->numel; k++) {
      /* uniform in [-1, -0.05) U [0.05, 1): never zero or tiny */
      double u = 0.05 + 0.95 * rng_unit(rng);
      double v = (rng_next(rng) & 1) ? u : -u;
      if (a->dtype == NF_F32)
        ((float *)a->data)[k] = (float)v;
      else
        ((double *)a->data)[k] = v;
    }
  } else if (t->dtype == NF_BOOL) {
    for (int64_t k = 0; k < a->numel; k++)
      ((uint8_t *)a->data)[k] = (uint8_t)(rng_next(rng) & 1);
  } else {
    int64_t bound = int_bound(g, id);
    for (int64_t k = 0; k < a->numel; k++) {
      int64_t v = (int64_t)(rng_next(rng) % (uint64_t)bound);
      if (a->dtype == NF_I32)
        ((int32_t *)a->data)[k] = (int32_t)v;
      else
        ((int64_t *)a->data)[k] = v;
    }
  }
}

static double elem(const nf_array *a, int64_t k) {
  switch (a->dtype) {
    case NF_F32: return ((const float *)a->data)[k];
    case NF_F64: return ((const double *)a->data)[k];
    case NF_I32: return ((const int32_t *)a->data)[k];
    case NF_I64: return (double)((const int64_t *)a->data)[k];
    case NF_BOOL: return ((const uint8_t *)a->data)[k];
    default: return 0;
  }
}

static void summary(const char *name, const nf_array *a) {
  double s = 0;
  for (int64_t k = 0; k < a->numel; k++) s += elem(a, k) * elem(a, k);
  printf("%s: %s[", name, nf_dtype_name(a->dtype));
  for (int k = 0; k < a->rank; k++) printf("%s%" PRId64, k ? ", " : "", a->shape[k]);
  printf("] l2=%.9g first=[", sqrt(s));
  for (int64_t k = 0; k < a->numel && k < 6; k++) printf("%s%.9g", k ? ", " : "", elem(a, k));
  printf("%s]\n", a->numel > 6 ? ", ..." : "");
}

static int make_dir(const char *dir) {
  if (mkdir(dir, 0777) == 0 || errno == EEXIST) {
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
  }
  fprintf(stderr, "neoflow: cannot create directory '%s': %s\n", dir,
          strerror(errno == EEXIST ? ENOTDIR : errno));
  return 1;
}

static int write_npy(const char *dir, const char *name, const nf_array *a) {
  nf_buf path = NF_BUF_INIT, err = NF_BUF_INIT;
  nf_buf_printf(&path, "%s/", dir);
  /* Tensor names may hold '[' ']' '.' (families, calls): keep them
   * readable but safe as file names. */
  for (const char *p = name; *p; p++) nf_buf_putc(&path, *p == '/' ? '_' : *p);
  nf_buf_puts(&path, ".npy");
  int rc = nf_npy_write(nf_buf_str(&path), a, &err);
  if (rc) fprintf(stderr, "neoflow: %s\n", nf_buf_str(&err));
  nf_buf_free(&path);
  nf_buf_free(&err);
  return rc ? 1 : 0;
}

/* Reads the --in files; their shapes join the --shape list. */
static int read_inputs(opts *o, nf_array *files) {
  for (int k = 0; k < o->n_in; k++) {
    nf_buf err = NF_BUF_INIT;
    if (nf_npy_read(o->in_files[k], &files[k], &err)) {
      fprintf(stderr, "neoflow: error: %s\n", nf_buf_str(&err));
      nf_buf_free(&err);
      return 1;
    }
    nf_buf_free(&err);
    for (int j = 0; j < o->n_shapes; j++)
      if (strcmp(o->shapes[j].name, o->in_names[k]) == 0) {
        fprintf(stderr, "neoflow: error: input '%s' has both --in and --shape\n",
                o->in_names[k]);
        return 1;
      }
    if (o->n_shapes >= MAX_ARGS) {
      fprintf(stderr, "neoflow: too many inputs\n");
      return 1;
    }
    nf_arg_shape *s = &o->shapes[o->n_shapes++];
    s->name = o->in_names[k];
    s->rank = files[k].rank;
    memcpy(s->dims, files[k].shape, sizeof(int64_t) * (size_t)files[k].rank);
  }
  return 0;
}

/* Values for the inputs of g: the first n_data from --in files or random
 * (saved under DIR/inputs with --out), the rest (gradient seeds) from
 * --dout files or ones.  Takes the arrays out of files. */
static int make_inputs(const opts *o, const nf_graph *g, uint32_t n_data,
                       nf_array *files, nf_array *dout, const char *const *dout_for,
                       int n_dout, nf_array *ins) {
  uint64_t rng = o->seed;
  int wrote_inputs_dir = 0;
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    const nf_tensor *t = &g->tensors[g->inputs[k]];
    if (k >= n_data) {
      /* a seed: "d" + output name */
      int from = -1;
      for (int j = 0; j < n_dout; j++)
        if (!dout_for[j] || strcmp(dout_for[j], t->name + 1) == 0) from = j;
      if (from >= 0) {
        ins[k] = dout[from];
        memset(&dout[from], 0, sizeof dout[from]);
        continue;
      }
      nf_dtype at = t->dtype == NF_F64 ? NF_F64 : NF_F32;
      if (!nf_dtype_is_float((nf_dtype)t->dtype)) at = (nf_dtype)t->dtype;
      if (nf_array_alloc(&ins[k], at, t->rank, t->shape)) {
        fprintf(stderr, "neoflow: error: cannot allocate '%s'\n", t->name);
        return 1;
      }
      for (int64_t e = 0; e < ins[k].numel; e++) {
        if (at == NF_F32) ((float *)ins[k].data)[e] = 1.0f;
        if (at == NF_F64) ((double *)ins[k].data)[e] = 1.0;
      }
      continue;
    }
    int from = -1;
    for (int j = 0; j < o->n_in; j++)
      if (strcmp(o->in_names[j], t->name) == 0) from = j;
    if (from >= 0) {
      ins[k] = files[from];
      memset(&files[from], 0, sizeof files[from]);
      continue;
    }
    nf_dtype at = nf_dtype_is_float((nf_dtype)t->dtype)
                      ? (t->dtype == NF_F64 ? NF_F64 : NF_F32)
                      : (nf_dtype)t->dtype;
    if (nf_array_alloc(&ins[k], at, t->rank, t->shape)) {
      fprintf(stderr, "neoflow: error: cannot allocate input '%s'\n", t->name);
      return 1;
    }
    random_fill(g, g->inputs[k], &ins[k], &rng);
    if (o->out_dir) {
      nf_buf p = NF_BUF_INIT;
      nf_buf_printf(&p, "%s/inputs", o->out_dir);
      int bad = 0;
      if (!wrote_inputs_dir) {
        bad = make_dir(o->out_dir) || make_dir(nf_buf_str(&p));
        wrote_inputs_dir = 1;
      }
      if (!bad) bad = write_npy(nf_buf_str(&p), t->name, &ins[k]);
      nf_buf_free(&p);
      if (bad) return 1;
    }
  }
  for (int j = 0; j < o->n_in; j++) {
    int used = 0;
    for (uint32_t k = 0; k < n_data; k++)
      if (strcmp(o->in_names[j], g->tensors[g->inputs[k]].name) == 0) used = 1;
    if (!used) {
      fprintf(stderr, "neoflow: error: %s has no input named '%s'\n", o->def,
              o->in_names[j]);
      return 1;
    }
  }
  return 0;
}

/* ---- lowering and compiled kernels ---- */

/* Reads --schedule (NULL without it: the default schedule is used). */
static int read_schedule(const opts *o, nf_schedule **out) {
  *out = NULL;
  if (!o->schedule) return 0;
  char *text = NULL;
  FILE *f = fopen(o->schedule, "rb");
  if (!f) {
    fprintf(stderr, "neoflow: error: cannot open '%s': %s\n", o->schedule, strerror(errno));
    return 1;
  }
  nf_buf b = NF_BUF_INIT;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0 && b.len < (16u << 20)) nf_buf_add(&b, chunk, n);
  fclose(f);
  text = b.data ? b.data : (char *)"";
  nf_buf err = NF_BUF_INIT;
  int rc = nf_schedule_parse(text, o->schedule, out, &err);
  if (rc) fprintf(stderr, "%s\n", nf_buf_str(&err));
  nf_buf_free(&err);
  nf_buf_free(&b);
  return rc ? 1 : 0;
}

/* --target cuda[:sm_XX]: 1 and the architecture in *sm (0 when not
 * given); 0 for a CPU target; -1 (said) when malformed. */
static int cuda_target(const opts *o, int *sm) {
  *sm = 0;
  if (!o->target || strncmp(o->target, "cuda", 4) != 0) return 0;
  const char *t = o->target + 4;
  if (!*t) return 1;
  char *end;
  long v = strncmp(t, ":sm_", 4) == 0 ? strtol(t + 4, &end, 10) : -1;
  if (v < 10 || v > 1000 || *end) {
    usage_error("--target is cuda:sm_XX (e.g. cuda:sm_90), got '%s'", o->target);
    return -1;
  }
  *sm = (int)v;
  return 1;
}

/* Lowers g with --schedule, else the default of the target: the GPU's
 * with gpu set or --target cuda, the CPU's for cpu_t (NULL: this CPU). */
static int lower_graph_for(const opts *o, const nf_graph *g, nf_ir_ctx *ctx, nf_lprog **p,
                           int gpu, const nf_cpu_target *cpu_t) {
  nf_schedule *sch = NULL;
  int sm;
  if (read_schedule(o, &sch)) return 1;
  nf_buf err = NF_BUF_INIT;
  int rc = NF_OK;
  if (!sch && (gpu || cuda_target(o, &sm) == 1)) {
    rc = nf_schedule_default_gpu(g, NF_GPU_DEFAULT_THREADS, &sch);
  } else if (!sch && cpu_t) {
#if NF_HAVE_LLVM
    nf_sched_target st = nf_cpu_sched_target(cpu_t);
    rc = nf_schedule_default_for(g, &st, &sch);
#endif
  }
  if (rc == NF_OK) rc = nf_lower(g, sch, ctx, p, &err);
  if (rc) fprintf(stderr, "%s: error: cannot lower %s: %s\n", o->schedule ? o->schedule : o->file,
                  o->def, nf_buf_str(&err));
  nf_buf_free(&err);
  nf_schedule_free(sch);
  return rc ? 1 : 0;
}

static int lower_graph(const opts *o, const nf_graph *g, nf_ir_ctx *ctx, nf_lprog **p) {
  return lower_graph_for(o, g, ctx, p, 0, NULL);
}

static int cmd_lower(opts *o) {
  if (!o->def) return usage_error("%s needs a DEF", "lower");
  nf_module *m = load(o->file);
  if (!m) return 1;
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL;
  nf_lprog *p = NULL;
  int rc = 1;
  if (ctx && !instantiate(m, o, ctx, &g) && !lower_graph(o, g, ctx, &p)) {
    nf_buf b = NF_BUF_INIT;
    nf__loop_print(p, &b);
    fputs(nf_buf_str(&b), stdout);
    nf_buf_free(&b);
    rc = 0;
  }
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
  return rc;
}

/* compile --target cuda:sm_XX: a cubin (PTX where this NVRTC does not
 * know sm_XX), or with -o FILE.cu the CUDA C alone (no NVRTC needed). */
static int cmd_compile_cuda(opts *o, int sm) {
  size_t ol = strlen(o->output);
  int want_src = ol > 3 && strcmp(o->output + ol - 3, ".cu") == 0;
  if (!want_src && sm == 0)
    return usage_error("compile for CUDA needs an architecture: --target %s:sm_XX", "cuda");
  nf_buf why = NF_BUF_INIT;
  if (!want_src && !nf_cuda_available(&why)) {
    fprintf(stderr, "neoflow: error: %s\n", nf_buf_str(&why));
    nf_buf_free(&why);
    return 1;
  }
  nf_module *m = load(o->file);
  if (!m) return 1;
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL;
  nf_lprog *p = NULL;
  nf_blob img = {NULL, 0};
  nf_cuda_plan plan;
  nf_cuda_stats st;
  nf_buf src = NF_BUF_INIT, err = NF_BUF_INIT;
  memset(&plan, 0, sizeof plan);
  memset(&st, 0, sizeof st);
  int rc = 1;
  if (ctx && !instantiate(m, o, ctx, &g) && !lower_graph(o, g, ctx, &p)) {
    int cr = want_src ? nf_cuda_emit(p, &src, &plan, &err)
                      : nf_cuda_compile(p, sm, &img, &plan, NULL, &st, &err);
    const void *bytes = want_src ? (const void *)src.data : img.data;
    size_t len = want_src ? src.len : img.len;
    FILE *f = NULL;
    if (cr) {
      fprintf(stderr, "%s: error: cannot compile %s for CUDA: %s\n", o->file, o->def,
              nf_buf_str(&err));
    } else if (!(f = fopen(o->output, "wb")) || fwrite(bytes, 1, len, f) != len ||
               fclose(f) != 0) {
      fprintf(stderr, "neoflow: error: cannot write '%s': %s\n", o->output, strerror(errno));
    } else {
      if (want_src)
        printf("%s: %zu bytes of CUDA C, %d launch%s\n", o->output, len, plan.n_launches,
               plan.n_launches == 1 ? "" : "es");
      else
        printf("%s: %zu bytes of %s for %s_%d; %d launch%s; CUDA C %zu bytes in %.1f ms, "
               "NVRTC %.1f ms\n", o->output, len, st.ptx ? "PTX" : "cubin",
               st.ptx ? "compute" : "sm", sm, plan.n_launches, plan.n_launches == 1 ? "" : "es",
               st.source_bytes, st.emit_ms, st.nvrtc_ms);
      for (int i = 0; i < plan.n_launches; i++)
        printf("  %s<<<%u, %u>>> shared %u bytes\n", plan.launches[i].name,
               plan.launches[i].grid, plan.launches[i].block, plan.launches[i].shared_bytes);
      if (plan.scratch_bytes)
        printf("  scratch %llu bytes\n", (unsigned long long)plan.scratch_bytes);
      rc = 0;
    }
  }
  free(img.data);
  nf_cuda_plan_free(&plan);
  nf_buf_free(&src);
  nf_buf_free(&err);
  nf_buf_free(&why);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
  return rc;
}

/* Converts a (any supported dtype) into a fresh array of dtype t. */
static int convert_array(const nf_array *a, nf_dtype t, nf_array *out) {
  if (nf_array_alloc(out, t, a->rank, a->shape)) return 1;
  for (int64_t k = 0; k < a->numel; k++) {
    double v = elem(a, k);
    switch (t) {
      case NF_F32: ((float *)out->data)[k] = (float)v; break;
      case NF_F64: ((double *)out->data)[k] = v; break;
      case NF_I32: ((int32_t *)out->data)[k] = (int32_t)v; break;
      case NF_I64:
        ((int64_t *)out->data)[k] = a->dtype == NF_I64 ? ((int64_t *)a->data)[k] : (int64_t)v;
        break;
      case NF_BOOL: ((uint8_t *)out->data)[k] = v != 0; break;
      default: return 1;
    }
  }
  return 0;
}

#if NF_HAVE_LLVM
/* --target cpu[:CPU[:FEATURES]] */
static int parse_target(const opts *o, nf_cpu_target *t, char *buf, size_t cap) {
  memset(t, 0, sizeof *t);
  if (!o->target) return 0;
  snprintf(buf, cap, "%s", o->target);
  char *cpu = strchr(buf, ':');
  if (cpu) *cpu++ = 0;
  if (strcmp(buf, "cpu") != 0) {
    usage_error("--target is cpu[:CPU[:FEATURES]], got '%s'", o->target);
    return 1;
  }
  if (cpu) {
    char *feat = strchr(cpu, ':');
    if (feat) *feat++ = 0;
    t->cpu = *cpu ? cpu : NULL;
    t->features = feat && *feat ? feat : NULL;
  }
  return 0;
}

static int compile_graph(const opts *o, const nf_graph *g, nf_blob *so, nf_cpu_stats *st) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_lprog *p = NULL;
  nf_cpu_target t;
  char tbuf[512];
  int rc = 1;
  if (ctx && !parse_target(o, &t, tbuf, sizeof tbuf) && !lower_graph_for(o, g, ctx, &p, 0, &t)) {
    nf_buf err = NF_BUF_INIT;
    /* Tier-1 level (the backend's short function pipeline: about 30 ms
     * median per library op here, bench/compile_bench.c). */
    t.opt_level = 2;
    if (nf_cpu_compile(p, &t, so, st, &err))
      fprintf(stderr, "%s: error: cannot compile %s: %s\n", o->file, o->def, nf_buf_str(&err));
    else
      rc = 0;
    nf_buf_free(&err);
  }
  nf_ir_ctx_free(ctx);
  return rc;
}

static int cmd_compile(opts *o) {
  if (!o->def) return usage_error("%s needs a DEF", "compile");
  if (!o->output) return usage_error("%s needs -o FILE.so", "compile");
  nf_module *m = load(o->file);
  if (!m) return 1;
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL;
  nf_blob so = NF_BLOB_INIT;
  nf_cpu_stats st;
  memset(&st, 0, sizeof st);
  int rc = 1;
  if (ctx && !instantiate(m, o, ctx, &g) && !compile_graph(o, g, &so, &st)) {
    FILE *f = fopen(o->output, "wb");
    if (!f || fwrite(so.data, 1, so.len, f) != so.len || fclose(f) != 0) {
      fprintf(stderr, "neoflow: error: cannot write '%s': %s\n", o->output, strerror(errno));
    } else {
      printf("%s: %zu bytes; lowered and compiled in %.1f ms (LLVM IR %.1f, optimise %.1f, "
             "emit %.1f, link %.1f)\n",
             o->output, so.len, st.total_ms, st.irgen_ms, st.opt_ms, st.emit_ms, st.link_ms);
      rc = 0;
    }
  }
  nf_blob_free(&so);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
  return rc;
}

#endif

/* The compiled engines (--engine compiled, cuda): the kernel the daemon
 * would make first (the target's default schedule, or --schedule),
 * loaded and run through the device interface (nf_device.h) by one path
 * whichever the device: on the CPU with a pool of --threads (the host
 * arrays are the device's buffers), on the first GPU (NVRTC; no GPU: the
 * reason, exit 1). */
static int run_engine(const opts *o, const nf_graph *g, nf_array *ins, nf_array *outs, int cuda) {
  nf_buf err = NF_BUF_INIT;
  nf_cuda_rt *rt = NULL;
  nf_pool *pool = NULL;
  nf_device *d = NULL;
  nf_dkernel *k = NULL;
  nf_ir_ctx *ctx = NULL;
  nf_blob so = NF_BLOB_INIT; /* a CPU kernel */
  nf_buf bun = NF_BUF_INIT;  /* a CUDA bundle */
  const void *bin = NULL;
  size_t bin_len = 0;
  char done_note[256] = "";
  uint32_t nb = g->n_inputs + g->n_outputs;
  uint64_t *addr = calloc(nb + 1, sizeof *addr);
  nf_array *conv = calloc(g->n_inputs + 1, sizeof(nf_array));
  int rc = 1, own = 0;
  if (!addr || !conv) goto done;
  if (cuda) {
    nf_lprog *p = NULL;
    nf_cuda_stats st;
    if (!nf_cuda_available(&err) || nf_cuda_rt_open(0, &rt, &err)) {
      fprintf(stderr, "neoflow: error: no GPU to run on: %s\n", nf_buf_str(&err));
      goto done;
    }
    if (!(ctx = nf_ir_ctx_new()) || lower_graph_for(o, g, ctx, &p, 1, NULL)) goto done;
    /* a bundle, as the daemon sends: the emulated driver of the tests runs
     * its source */
    if (nf_cuda_compile_bundle(p, nf_cuda_rt_sm(rt), &bun, &st, &err)) {
      fprintf(stderr, "%s: error: cannot compile %s for %s (sm_%d): %s\n", o->file, o->def,
              nf_cuda_rt_name(rt), nf_cuda_rt_sm(rt), nf_buf_str(&err));
      goto done;
    }
    nf_cuda_bundle b;
    if (nf_cuda_bundle_decode(bun.data, bun.len, &b, &err) == NF_OK) {
      snprintf(done_note, sizeof done_note,
               "GPU kernel on %s (sm_%d): %d launches, %zu bytes of %s, NVRTC %.1f ms",
               nf_cuda_rt_name(rt), nf_cuda_rt_sm(rt), b.plan.n_launches, b.image_len,
               st.ptx ? "PTX" : "cubin", st.nvrtc_ms);
      nf_cuda_bundle_free(&b);
    }
    bin = bun.data;
    bin_len = bun.len;
    if (nf_device_open_cuda(rt, &d)) goto done;
  } else {
#if NF_HAVE_LLVM
    nf_cpu_stats st;
    memset(&st, 0, sizeof st);
    if (compile_graph(o, g, &so, &st)) goto done;
    snprintf(done_note, sizeof done_note, "compiled kernel: %zu bytes in %.1f ms", so.len,
             st.total_ms);
    bin = so.data;
    bin_len = so.len;
    if (!(pool = nf_pool_new(o->threads > 0 ? o->threads : 1)) ||
        nf_device_open_cpu(pool, 0, &d))
      goto done;
#else
    fprintf(stderr, "neoflow: error: this build has no code generator (LLVM was not found)\n");
    goto done;
#endif
  }
  if (nf_device_load(d, bin, bin_len, nb, &k, &err)) {
    fprintf(stderr, "neoflow: error: cannot load the kernel on %s: %s\n", nf_device_name(d),
            nf_buf_str(&err));
    goto done;
  }
  /* the buffers: the host arrays themselves on the CPU, device memory
   * holding the inputs on a GPU */
  own = !nf_device_is_host(d);
  for (uint32_t i = 0; i < nb; i++) {
    const nf_tensor *t = &g->tensors[i < g->n_inputs ? g->inputs[i] : g->outputs[i - g->n_inputs]];
    nf_array *a = i < g->n_inputs ? &conv[i] : &outs[i - g->n_inputs];
    if (i < g->n_inputs) {
      int same = ins[i].rank == t->rank;
      for (int dd = 0; same && dd < t->rank; dd++) same = ins[i].shape[dd] == t->shape[dd];
      if (!same) {
        fprintf(stderr, "neoflow: error: input %s has the wrong shape\n", t->name);
        goto done;
      }
      if (convert_array(&ins[i], (nf_dtype)t->dtype, a)) {
        fprintf(stderr, "neoflow: error: input %s: unsupported dtype for the %s engine\n",
                t->name, o->engine);
        goto done;
      }
    } else if (nf_array_alloc(a, (nf_dtype)t->dtype, t->rank, t->shape)) {
      goto done;
    }
    size_t n = (size_t)a->numel * nf_dtype_size((nf_dtype)t->dtype);
    if (!own) {
      addr[i] = (uint64_t)(uintptr_t)a->data;
    } else if (nf_device_alloc(d, n ? n : 1, &addr[i], &err) ||
               (i < g->n_inputs && nf_device_upload(d, addr[i], a->data, n, &err))) {
      fprintf(stderr, "neoflow: error: memory on %s: %s\n", nf_device_name(d), nf_buf_str(&err));
      goto done;
    }
  }
  if (nf_device_run(d, k, addr, nb, &err)) {
    fprintf(stderr, "neoflow: error: the kernel failed on %s: %s\n", nf_device_name(d),
            nf_buf_str(&err));
    goto done;
  }
  for (uint32_t i = 0; i < g->n_outputs; i++)
    if (nf_device_download(d, outs[i].data, addr[g->n_inputs + i],
                           (size_t)outs[i].numel * nf_dtype_size((nf_dtype)outs[i].dtype), &err)) {
      fprintf(stderr, "neoflow: error: memory on %s: %s\n", nf_device_name(d), nf_buf_str(&err));
      goto done;
    }
  if (*done_note) fprintf(stderr, "neoflow: %s\n", done_note);
  rc = 0;
done:
  if (rc)
    for (uint32_t i = 0; i < g->n_outputs; i++) nf_array_free(&outs[i]);
  if (conv)
    for (uint32_t i = 0; i < g->n_inputs; i++) nf_array_free(&conv[i]);
  for (uint32_t i = 0; own && addr && i < nb; i++) nf_device_free(d, addr[i]);
  if (d) nf_device_unload(d, k);
  if (d) nf_device_close(d);
  nf_cuda_rt_close(rt);
  nf_pool_free(pool);
  nf_blob_free(&so);
  nf_buf_free(&bun);
  free(addr);
  free(conv);
  nf_ir_ctx_free(ctx);
  nf_buf_free(&err);
  return rc;
}

/* Runs g and prints/writes its outputs. */
static int run_graph(const opts *o, const nf_graph *g, nf_array *ins) {
  nf_array *outs = calloc(g->n_outputs + 1, sizeof(nf_array));
  if (!outs) return 1;
  int cuda = o->engine && strcmp(o->engine, "cuda") == 0;
  if (cuda || (o->engine && strcmp(o->engine, "compiled") == 0)) {
    if (run_engine(o, g, ins, outs, cuda)) {
      free(outs);
      return 1;
    }
  } else {
    nf_buf err = NF_BUF_INIT;
    int irc = nf_interp_run(g, ins, o->precision, outs, &err);
    if (irc) {
      fprintf(stderr, "neoflow: error: evaluation failed: %s\n", nf_buf_str(&err));
      nf_buf_free(&err);
      free(outs);
      return 1;
    }
    nf_buf_free(&err);
  }
  int rc = 0;
  if (o->out_dir && make_dir(o->out_dir)) rc = 1;
  for (uint32_t k = 0; k < g->n_outputs; k++) {
    const char *name = g->tensors[g->outputs[k]].name;
    summary(name, &outs[k]);
    if (!rc && o->out_dir && write_npy(o->out_dir, name, &outs[k])) rc = 1;
    nf_array_free(&outs[k]);
  }
  free(outs);
  return rc;
}

static int cmd_eval(opts *o) {
  if (!o->def) return usage_error("%s needs a DEF", "eval");
  nf_module *m = load(o->file);
  if (!m) return 1;
  int rc = 1;
  nf_ir_ctx *ctx = NULL;
  nf_array files[MAX_ARGS];
  nf_array *ins = NULL;
  nf_graph *g = NULL;
  memset(files, 0, sizeof files);
  if (read_inputs(o, files)) goto done;
  ctx = nf_ir_ctx_new();
  if (!ctx || instantiate(m, o, ctx, &g)) goto done;
  ins = calloc(g->n_inputs + 1, sizeof(nf_array));
  if (!ins) goto done;
  if (make_inputs(o, g, g->n_inputs, files, NULL, NULL, 0, ins)) goto done;
  rc = run_graph(o, g, ins);
done:
  for (int k = 0; k < MAX_ARGS; k++) nf_array_free(&files[k]);
  if (g && ins)
    for (uint32_t k = 0; k < g->n_inputs; k++) nf_array_free(&ins[k]);
  free(ins);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
  return rc;
}

/* The FLOP table of a gradient, as '#' comments. */
static void flop_table(const nf_graph *fwd, const nf_graph *gg, const nf_grad_report *rep,
                       const opts *o) {
  printf("# gradient of %s with respect to %s\n", o->def, o->wrt);
  printf("# FLOPs of each gradient statement next to the forward statement it\n"
         "# differentiates (statement numbers count the lines of the def below):\n");
  printf("#   %-5s %-24s %14s %14s %7s\n", "stmt", "tensor", "FLOPs", "forward", "ratio");
  int64_t tot = 0, ftot = 0;
  for (uint32_t k = 0; k < fwd->n_stmts; k++) ftot += nf_stmt_flops(fwd, k);
  for (int i = 0; i < rep->n_items; i++) {
    const nf_grad_item *it = &rep->items[i];
    tot += it->flops;
    const char *name = gg->tensors[gg->stmts[it->stmt].out].name;
    if (it->fwd_stmt >= 0 && it->fwd_flops > 0)
      printf("#   %-5u %-24s %14" PRId64 " %14" PRId64 " %7.2f%s\n", it->stmt, name, it->flops,
             it->fwd_flops, (double)it->flops / (double)it->fwd_flops,
             it->scatter ? "  scatter" : "");
    else
      printf("#   %-5u %-24s %14" PRId64 " %14s %7s%s\n", it->stmt, name, it->flops, "-", "-",
             it->scatter ? "  scatter" : "");
    if (it->scatter)
      printf("#         scatter-accumulate (flagged): no inversion: %s\n", it->why ? it->why : "");
  }
  printf("# total: forward %" PRId64 " FLOPs, gradient statements %" PRId64 " FLOPs\n", ftot, tot);
  for (int i = 0; i < rep->n_notes; i++) printf("# note: %s\n", rep->notes[i]);
}

/* Splits --wrt X[,Y...] into wrt[] (at most MAX_ARGS names, empty ones
 * skipped); returns the copy the names point into (free it), NULL when
 * out of memory. */
static char *split_wrt(const char *arg, const char **wrt, int *n_wrt) {
  char *copy = strdup(arg);
  *n_wrt = 0;
  for (char *p = copy; p && *p && *n_wrt < MAX_ARGS;) {
    char *comma = strchr(p, ',');
    if (comma) *comma = 0;
    if (*p) wrt[(*n_wrt)++] = p;
    p = comma ? comma + 1 : NULL;
  }
  return copy;
}

static int cmd_grad(opts *o) {
  if (!o->def) return usage_error("%s needs a DEF", "grad");
  if (!o->wrt) return usage_error("%s needs --wrt X[,Y...]", "grad");
  nf_module *m = load(o->file);
  if (!m) return 1;
  int rc = 1;
  nf_ir_ctx *ctx = NULL;
  nf_array files[MAX_ARGS], dout[MAX_ARGS];
  const char *dout_for[MAX_ARGS];
  nf_array *ins = NULL;
  nf_graph *g = NULL, *gg = NULL;
  const char *wrt[MAX_ARGS];
  int n_wrt = 0;
  char *wrt_copy = split_wrt(o->wrt, wrt, &n_wrt);
  memset(files, 0, sizeof files);
  memset(dout, 0, sizeof dout);
  if (!wrt_copy) goto done;
  if (n_wrt == 0) {
    rc = usage_error("--wrt wants X[,Y...], got '%s'", o->wrt);
    goto done;
  }
  for (int k = 0; k < o->n_dout; k++) {
    nf_buf err = NF_BUF_INIT;
    if (nf_npy_read(o->dout_files[k], &dout[k], &err)) {
      fprintf(stderr, "neoflow: error: %s\n", nf_buf_str(&err));
      nf_buf_free(&err);
      goto done;
    }
    nf_buf_free(&err);
    dout_for[k] = o->dout_names[k];
  }
  if (read_inputs(o, files)) goto done;
  ctx = nf_ir_ctx_new();
  if (!ctx || instantiate(m, o, ctx, &g)) goto done;
  if (o->n_dout == 1 && !o->dout_names[0] && g->n_outputs != 1) {
    fprintf(stderr, "neoflow: error: %s has %u outputs: name the one --dout is for (--dout OUT=FILE.npy)\n",
            o->def, g->n_outputs);
    goto done;
  }
  for (int k = 0; k < o->n_dout; k++) {
    if (!o->dout_names[k]) continue;
    int found = 0;
    for (uint32_t j = 0; j < g->n_outputs; j++)
      if (strcmp(g->tensors[g->outputs[j]].name, o->dout_names[k]) == 0) found = 1;
    if (!found) {
      fprintf(stderr, "neoflow: error: --dout: %s has no output named '%s'\n", o->def,
              o->dout_names[k]);
      goto done;
    }
  }
  nf_grad_opts go = {.n_wrt = n_wrt, .wrt = wrt};
  nf_grad_report rep;
  nf_buf err = NF_BUF_INIT;
  if (nf_grad_graph(g, &go, ctx, &gg, &rep, &err)) {
    fprintf(stderr, "%s: error: cannot differentiate %s: %s\n", o->file, o->def,
            nf_buf_str(&err));
    nf_buf_free(&err);
    goto done;
  }
  nf_buf_free(&err);
  if (!o->out_dir) {
    nf_buf text = NF_BUF_INIT;
    if (nf_graph_print(gg, &text)) {
      fprintf(stderr, "neoflow: cannot print the gradient graph\n");
      nf_buf_free(&text);
      goto done;
    }
    flop_table(g, gg, &rep, o);
    fputs(nf_buf_str(&text), stdout);
    nf_buf_free(&text);
    rc = 0;
    goto done;
  }
  ins = calloc(gg->n_inputs + 1, sizeof(nf_array));
  if (!ins) goto done;
  if (make_inputs(o, gg, g->n_inputs, files, dout, dout_for, o->n_dout, ins)) goto done;
  rc = run_graph(o, gg, ins);
  for (int i = 0; i < rep.n_notes; i++) fprintf(stderr, "neoflow: note: %s\n", rep.notes[i]);
done:
  for (int k = 0; k < MAX_ARGS; k++) {
    nf_array_free(&files[k]);
    nf_array_free(&dout[k]);
  }
  if (gg && ins)
    for (uint32_t k = 0; k < gg->n_inputs; k++) nf_array_free(&ins[k]);
  free(ins);
  free(wrt_copy);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
  return rc;
}

/* Prints p (and writes the Graphviz picture to dot when non-NULL). */
static int print_partition(const char *def, const nf_graph *g, const nf_partition *p,
                           const char *dot) {
  uint32_t distinct = 0;
  for (uint32_t i = 0; i < p->n; i++) {
    int seen = 0;
    for (uint32_t j = 0; j < i && !seen; j++) seen = !memcmp(p->sub[i].key, p->sub[j].key, 32);
    distinct += !seen;
  }
  printf("%s: %u statements -> %u subgraphs, %u distinct keys\n", def, g->n_stmts, p->n, distinct);
  static const char *red[] = {"=", "+=!", "*=!", "max=!", "min=!"};
  for (uint32_t i = 0; i < p->n; i++) {
    const nf_subgraph *sg = &p->sub[i];
    char hex[65];
    nf_hash_hex(sg->key, hex);
    printf("  #%-3u key %.16s  ", i, hex);
    if (sg->anchor >= 0)
      printf("anchor %s %s", g->tensors[g->stmts[sg->anchor].out].name,
             red[g->stmts[sg->anchor].red]);
    else
      printf("light");
    printf("\n       stmts:");
    for (uint32_t k = 0; k < sg->n_stmts; k++) printf(" %s", g->tensors[g->stmts[sg->stmts[k]].out].name);
    printf("\n       in:");
    for (uint32_t k = 0; k < sg->n_in; k++) printf("%s %s", k ? "," : "", g->tensors[sg->in[k]].name);
    printf("\n       out:");
    for (uint32_t k = 0; k < sg->n_out; k++) printf("%s %s", k ? "," : "", g->tensors[sg->out[k]].name);
    printf("\n");
  }
  if (!dot) return 0;
  FILE *f = fopen(dot, "w");
  if (!f) {
    fprintf(stderr, "neoflow: error: cannot write '%s': %s\n", dot, strerror(errno));
    return 1;
  }
  fprintf(f, "digraph partition {\n  rankdir=LR;\n  node [shape=box, fontsize=10];\n");
  for (uint32_t k = 0; k < g->n_inputs; k++)
    fprintf(f, "  t%u [shape=ellipse, label=\"%s\"];\n", g->inputs[k], g->tensors[g->inputs[k]].name);
  for (uint32_t i = 0; i < p->n; i++) {
    const nf_subgraph *sg = &p->sub[i];
    char hex[65];
    nf_hash_hex(sg->key, hex);
    fprintf(f, "  subgraph cluster_%u {\n    label=\"#%u %.8s\";\n    style=rounded;\n", i, i, hex);
    for (uint32_t k = 0; k < sg->n_stmts; k++) {
      const nf_stmt *st = &g->stmts[sg->stmts[k]];
      fprintf(f, "    s%u [label=\"%s %s\"%s];\n", sg->stmts[k], g->tensors[st->out].name, red[st->red],
              (int)sg->stmts[k] == sg->anchor ? ", style=bold" : "");
    }
    fprintf(f, "  }\n");
  }
  /* edges: producer statement (or input) -> consumer statement */
  int *prod = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *prod);
  for (uint32_t t = 0; prod && t < g->n_tensors; t++) prod[t] = -1;
  for (uint32_t s = 0; prod && s < g->n_stmts; s++) prod[g->stmts[s].out] = (int)s;
  uint8_t *row = calloc(g->n_tensors ? g->n_tensors : 1, 1);
  for (uint32_t s = 0; prod && row && s < g->n_stmts; s++) {
    memset(row, 0, g->n_tensors);
    if (nf_stmt_reads(g, s, row) != NF_OK) continue;
    for (uint32_t t = 0; t < g->n_tensors; t++) {
      if (!row[t]) continue;
      if (prod[t] >= 0)
        fprintf(f, "  s%d -> s%u [label=\"%s\", fontsize=8];\n", prod[t], s, g->tensors[t].name);
      else
        fprintf(f, "  t%u -> s%u;\n", t, s);
    }
  }
  free(row);
  free(prod);
  fprintf(f, "}\n");
  if (fclose(f) != 0) {
    fprintf(stderr, "neoflow: error: cannot write '%s': %s\n", dot, strerror(errno));
    return 1;
  }
  return 0;
}

/* neoflow partition FILE.nf DEF [--wrt X,...] [--dot FILE]: the subgraphs
 * of DEF's graph (or, with --wrt, of its gradient graph). */
static int cmd_partition(opts *o) {
  if (!o->def) return usage_error("%s needs a DEF", "partition");
  nf_module *m = load(o->file);
  if (!m) return 1;
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL, *gg = NULL;
  char *wrt_copy = NULL;
  int rc = 1;
  nf_partition *p = NULL;
  nf_buf err = NF_BUF_INIT;
  if (!ctx || instantiate(m, o, ctx, &g)) goto done;
  /* a def with `param` declarations: its training graph (the loss and the
   * gradients of every parameter) unless --wrt says otherwise */
  nf_param_decl pd[MAX_ARGS];
  int n_pd = o->wrt ? 0 : nf_module_def_param_decls(m, o->def, pd, MAX_ARGS);
  if (o->wrt || n_pd > 0) {
    const char *wrt[MAX_ARGS];
    int n_wrt = 0;
    if (o->wrt) {
      wrt_copy = split_wrt(o->wrt, wrt, &n_wrt);
      if (!wrt_copy) goto done;
    } else {
      for (int i = 0; i < n_pd && i < MAX_ARGS; i++) wrt[n_wrt++] = pd[i].name;
    }
    nf_grad_opts go = {.n_wrt = n_wrt, .wrt = wrt, .keep_outputs = !o->wrt};
    nf_grad_report rep;
    if (n_wrt == 0 || nf_grad_graph(g, &go, ctx, &gg, &rep, &err)) {
      fprintf(stderr, "%s: error: cannot differentiate %s: %s\n", o->file, o->def,
              n_wrt ? nf_buf_str(&err) : "--wrt names no input");
      goto done;
    }
    g = gg;
    /* as sessions do: per-step products summed, one product (nf_stack.h) */
    if (nf_rewrite_grad(g, &g) != NF_OK) {
      fprintf(stderr, "%s: error: out of memory\n", o->file);
      goto done;
    }
  }
  if (nf_partition_graph(g, &p, &err) != NF_OK) {
    fprintf(stderr, "%s: error: cannot partition %s: %s\n", o->file, o->def, nf_buf_str(&err));
    goto done;
  }
  rc = print_partition(o->def, g, p, o->dot);
done:
  nf_partition_free(p);
  nf_buf_free(&err);
  free(wrt_copy);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
  return rc;
}

#if NF_HAVE_SEARCH
/* neoflow tune FILE.nf DEF [--wrt X,...]: the search on DEF's graph (or its
 * gradient graph), reported by tune.c. */
static int cmd_tune(opts *o) {
  if (!o->def) return usage_error("%s needs a DEF", "tune");
  nf_module *m = load(o->file);
  if (!m) return 1;
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL, *gg = NULL;
  char tbuf[256], *wrt_copy = NULL;
  int rc = 1;
  nf_tune_cli t = {.def = o->def,
                   .trials = o->trials,
                   .seconds = o->seconds,
                   .threads = o->threads,
                   .json = o->json,
                   .random_search = o->random_search,
                   .compare_random = o->compare_random,
                   .seed = o->seed,
                   .csv = o->csv,
                   .svg = o->svg,
                   .out = o->output};
  int gpu = cuda_target(o, &t.cuda_sm);
  if (gpu < 0) {
    rc = 2;
    goto done;
  }
  if (gpu == 1 && t.cuda_sm == 0) {
    rc = usage_error("tune on a GPU needs an architecture: --target %s:sm_XX", "cuda");
    goto done;
  }
  if (!ctx || instantiate(m, o, ctx, &g) || (!gpu && parse_target(o, &t.target, tbuf, sizeof tbuf)))
    goto done;
  if (gpu && (o->daemon || o->random_search || o->compare_random)) {
    rc = usage_error("%s", "tune --target cuda: not with --daemon, --random or --compare-random");
    goto done;
  }
  if (!o->daemon && (o->socket || o->key || o->n_trust_keys || o->n_trust_uids)) {
    rc = usage_error("%s: --socket, --key and --trust-* go with --daemon", "tune");
    goto done;
  }
  if (o->wrt) {
    const char *wrt[MAX_ARGS];
    int n_wrt = 0;
    wrt_copy = split_wrt(o->wrt, wrt, &n_wrt);
    if (!wrt_copy) goto done;
    nf_grad_opts go = {.n_wrt = n_wrt, .wrt = wrt};
    nf_grad_report rep;
    nf_buf err = NF_BUF_INIT;
    if (n_wrt == 0 || nf_grad_graph(g, &go, ctx, &gg, &rep, &err)) {
      fprintf(stderr, "%s: error: cannot differentiate %s: %s\n", o->file, o->def,
              n_wrt ? nf_buf_str(&err) : "--wrt names no input");
      nf_buf_free(&err);
      goto done;
    }
    nf_buf_free(&err);
    g = gg;
    if (nf_rewrite_grad(g, &g) != NF_OK) {
      fprintf(stderr, "%s: error: out of memory\n", o->file);
      goto done;
    }
  }
  if (o->daemon) {
    nf_tune_daemon_cli d = {.def = o->def,
                            .address = o->socket,
                            .key_file = o->key,
                            .trust_keys = o->trust_keys,
                            .n_trust_keys = o->n_trust_keys,
                            .trust_uids = o->trust_uids,
                            .n_trust_uids = o->n_trust_uids,
                            .trials = o->trials,
                            .seconds = o->seconds,
                            .json = o->json,
                            .out = o->output};
    rc = nf__cli_tune_daemon(g, &d);
    goto done;
  }
  rc = nf_tune_main(g, &t);
done:
  free(wrt_copy);
  nf_ir_ctx_free(ctx);
  nf_module_free(m);
  return rc;
}
#endif

int main(int argc, char **argv) {
  /* the commands without a FILE.nf have their own options */
  if (argc >= 2 && strcmp(argv[1], "status") == 0) return nf__cli_status(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "cache") == 0) return nf__cli_cache(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "train") == 0) return nf__cli_train(argc - 1, argv + 1);
  opts o;
  int rc = parse_args(argc, argv, &o);
  if (rc == 3 || (rc == 0 && !o.cmd)) {
    fputs(usage_text, rc == 3 ? stdout : stderr);
    return rc == 3 ? 0 : 2;
  }
  if (rc) return rc;
  if (strcmp(o.cmd, "version") == 0) {
    printf("neoflow %s\n", NF_VERSION);
    return 0;
  }
  if (strcmp(o.cmd, "help") == 0) {
    fputs(usage_text, stdout);
    return 0;
  }
  int known = strcmp(o.cmd, "check") == 0 || strcmp(o.cmd, "print") == 0 ||
              strcmp(o.cmd, "hash") == 0 || strcmp(o.cmd, "eval") == 0 ||
              strcmp(o.cmd, "grad") == 0 || strcmp(o.cmd, "lower") == 0 ||
              strcmp(o.cmd, "compile") == 0 || strcmp(o.cmd, "tune") == 0 ||
              strcmp(o.cmd, "partition") == 0;
  if (!known)
    return unknown_error("command", o.cmd, commands, sizeof commands / sizeof commands[0]);
  if (!o.file) return usage_error("%s needs a FILE.nf", o.cmd);
  if ((rc = check_options(&o))) return rc;
  if (strcmp(o.cmd, "check") == 0) return cmd_check(&o);
  if (strcmp(o.cmd, "print") == 0) return cmd_print(&o);
  if (strcmp(o.cmd, "hash") == 0) return cmd_hash(&o);
  if (strcmp(o.cmd, "grad") == 0) return cmd_grad(&o);
  if (strcmp(o.cmd, "lower") == 0) return cmd_lower(&o);
  if (strcmp(o.cmd, "partition") == 0) return cmd_partition(&o);
  if (strcmp(o.cmd, "tune") == 0) {
#if NF_HAVE_SEARCH
    return cmd_tune(&o);
#else
    fprintf(stderr, "neoflow: error: this build has no schedule search (it needs LLVM and XGBoost)\n");
    return 1;
#endif
  }
  if (strcmp(o.cmd, "compile") == 0) {
    int sm, ct = cuda_target(&o, &sm);
    if (ct < 0) return 2;
    if (ct) {
      if (!o.def) return usage_error("%s needs a DEF", "compile");
      if (!o.output) return usage_error("%s needs -o FILE.cubin or FILE.cu", "compile");
      return cmd_compile_cuda(&o, sm);
    }
#if NF_HAVE_LLVM
    return cmd_compile(&o);
#else
    fprintf(stderr, "neoflow: error: this build has no code generator (LLVM was not found)\n");
    return 1;
#endif
  }
  return cmd_eval(&o);
}
