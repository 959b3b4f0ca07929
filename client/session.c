/* session.c - sessions (session_int.h): opening one (options, trust,
 * the step program of build.c, the device, the daemon link), running
 * steps and evaluations over the kernel table (ktable.c on the CPU,
 * gpu_session.c on a GPU), feeding and reading tensors, statistics,
 * parameter files, closing.  Models are model.c. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nf_autodiff.h"
#include "nf_interp.h"
#include "nf_npy.h"
#include "nf_plan.h"
#include "nf_stack.h"
#include "session_int.h"
#include "nf_env.h"

#define NF_COLD_WAIT_MS 60000.0 /* maybe_wait */

/* ---- sessions ---- */

static nf_session *session_alloc(const nf_session_opts *o) {
  nf_session *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  if (o) s->opts = *o;
  s->opts.inames = NULL;
  s->opts.ivalues = NULL;
  s->opts.shape_names = NULL;
  s->opts.shape_ranks = NULL;
  s->opts.shape_dims = NULL;
  s->opts.n_iparams = s->opts.n_shapes = 0;
  nf__slog_init(&s->log, s->opts.log, s->opts.log_user, s->opts.quiet);
  s->kt.dev = &nf__cpu_device;
  s->kt.log = &s->log;
  nf_optimizer *op = &s->opts.optim;
  if (op->lr <= 0) op->lr = op->kind == NF_OPTIM_SGD ? 0.01 : 0.001;
  if (op->beta1 <= 0) op->beta1 = 0.9;
  if (op->beta2 <= 0) op->beta2 = 0.999;
  if (op->eps <= 0) op->eps = 1e-8;
  if (op->kind == NF_OPTIM_ADAMW && op->weight_decay == 0) op->weight_decay = 0.01;
  s->daemon_addr = o && o->daemon ? strdup(o->daemon) : NULL;
  s->opts.daemon = s->daemon_addr;
  s->device = o && o->device ? strdup(o->device) : NULL;
  s->opts.device = s->device;
  pthread_mutex_init(&s->kt.mu, NULL);
  pthread_cond_init(&s->kt.cv, NULL);
  s->ctx = nf_ir_ctx_new();
  s->t_start = nf_now_ms();
  s->interp_rate = 2e5; /* flops per ms before anything is measured */
  s->first_wait_left = 1000;
  s->cold_wait_left = NF_COLD_WAIT_MS;
  s->loss_slot = -1;
  s->daemon_key = o && o->daemon_key ? strdup(o->daemon_key) : NULL;
  s->opts.daemon_key = s->daemon_key;
  s->opts.trust = NULL;
  s->opts.n_trust = 0;
  if (!s->ctx || (o && o->daemon && !s->daemon_addr) || (o && o->device && !s->device) ||
      (o && o->daemon_key && !s->daemon_key)) {
    nf_session_free(s);
    return NULL;
  }
  return s;
}

/* Whom the daemon link trusts: the user's configuration, then the
 * session's own entries (opts.trust).  A bad entry of the program's is an
 * error; an unsafe configuration file only keeps the daemon away (the
 * link says why). */
static int load_trust(nf_session *s, const nf_session_opts *o, nf_buf *err) {
  nf_buf why = NF_BUF_INIT;
  if (nf_trust_load(&s->trust, &why) != NF_OK) {
    nf__slog_warn(&s->log, "%s; not using a daemon (training on fallback kernels)",
                     nf_buf_str(&why));
    memset(&s->trust, 0, sizeof s->trust);
    s->trust_bad = 1;
  }
  nf_buf_free(&why);
  for (int i = 0; o && i < o->n_trust; i++) {
    const char *e = o->trust ? o->trust[i] : NULL;
    int rc;
    if (e && !strncmp(e, "uid:", 4)) rc = nf_trust_add_uid(&s->trust, e + 4, err);
    else rc = nf_trust_add_key(&s->trust, e, err);
    if (rc != NF_OK) {
      nf_buf_printf(err, " (session option trust[%d])", i);
      return rc;
    }
  }
  return NF_OK;
}

/* OpenBLAS picked its generic kernels on a CPU it does not know: the
 * OpenBLAS tier (products, convolutions) then runs several times slower
 * than it could.  Said once per session that has such an entry. */
static void warn_blas_misfit(nf_session *s) {
  const char *suggest, *core = nf_gemm_blas_misfit(&suggest);
  int any = 0;
  for (int i = 0; i < s->kt.n_kents && !any; i++) any = s->kt.kents[i].gemm != NULL;
  if (core && any)
    nf__slog_warn(&s->log,
                     "OpenBLAS chose its generic %s kernels on this CPU (it has %s): products "
                     "at tier 0 run several times slower than they could; set "
                     "OPENBLAS_CORETYPE=%s in the environment to pick the right ones",
                     core, strcmp(suggest, "SkylakeX") ? "AVX2" : "AVX-512", suggest);
}

/* Builds the program (a training step, or a function program when fn)
 * and starts the pool, the device and the daemon link. */
static int finish(nf_session *s, const nf_graph *F, int fn, int n_gin, const char *const *gin,
                  int n_extra, const char *const *extra, char **err) {
  int rc = NF_OK;
  const char *v = nf_env(NF_ENV_THREADS);
  int th = s->opts.threads > 0 ? s->opts.threads : v && atoi(v) > 0 ? atoi(v) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (th < 1) th = 1;
  if (th > 256) th = 256;
  s->threads = th;
  rc = fn ? nf__session_build_fn(s, F, &s->err)
          : nf__session_build(s, F, n_gin, gin, n_extra, extra, &s->err);
  if (rc != NF_OK) goto fail;
  for (int i = 0; i < s->n_params; i++) {
    nf__param *pr = &s->params[i];
    nf_init in = pr->init;
    if (in.fn == NF_INIT_FN_BUFFER) in.data = pr->init_data;
    if ((rc = nf__init_fill(&in, pr->rank, pr->shape, s->opts.seed, pr->name, s->P + pr->offset,
                            &s->err)))
      goto fail;
  }
  s->pool = nf_pool_new(th);
  if (!s->pool) {
    rc = NF_ENOMEM;
    goto fail;
  }
  /* OpenBLAS at one thread: nf_gemm_run splits the work over the pool */
  nf_gemm_set_threads(1);
  warn_blas_misfit(s);
  if ((rc = nf__gpu_open(s))) goto fail;
  /* (a function program trains nothing: alone under mpirun too) */
  if (!fn && ((rc = nf__dist_open(s)) || (rc = nf__dist_start(s)))) goto fail;
  nf__verified_load(s);
  nf__verdicts_load(s);
  if (!(s->daemon_addr && !strcmp(s->daemon_addr, "none")) && !s->trust_bad) {
    nf__link_cfg lc = {.daemon_addr = s->daemon_addr,
                       .daemon_key = s->daemon_key,
                       .trust = &s->trust,
                       .no_spawn = s->opts.no_spawn,
                       .compile_only = s->opts.compile_only,
                       .tune_trials = s->opts.tune_trials,
                       .tune_seconds = s->opts.tune_seconds};
    if ((rc = nf__dlink_start(&s->kt, &lc, &s->link, &s->err))) goto fail;
  }
  return NF_OK;
fail:
  if (err) *err = nf__session_err_dup("", s->err.len ? nf_buf_str(&s->err) : nf_strerror(rc));
  return rc;
}

static int init_from_decl(const nf_param_decl *d, nf_init *in) {
  static const nf_init_fn map[] = {
      [NF_INIT_ZEROS] = NF_INIT_FN_ZEROS, [NF_INIT_ONES] = NF_INIT_FN_ONES,
      [NF_INIT_CONSTANT] = NF_INIT_FN_CONSTANT, [NF_INIT_UNIFORM] = NF_INIT_FN_UNIFORM,
      [NF_INIT_NORMAL] = NF_INIT_FN_NORMAL, [NF_INIT_XAVIER_UNIFORM] = NF_INIT_FN_XAVIER_UNIFORM,
      [NF_INIT_XAVIER_NORMAL] = NF_INIT_FN_XAVIER_NORMAL,
      [NF_INIT_KAIMING_UNIFORM] = NF_INIT_FN_KAIMING_UNIFORM,
      [NF_INIT_KAIMING_NORMAL] = NF_INIT_FN_KAIMING_NORMAL};
  if ((unsigned)d->init >= sizeof map / sizeof map[0]) return NF_EINVAL;
  memset(in, 0, sizeof *in);
  in->fn = map[d->init];
  in->a = d->a;
  in->b = d->b;
  return NF_OK;
}

/* Parameters from def's `param` declarations in m. */
static int params_from_decls(nf_session *s, nf_model *m, const char *def, char **err) {
  int n = nf_module_def_param_decls(m->mod, def, NULL, 0);
  if (n < 0) {
    char msg[512];
    snprintf(msg, sizeof msg, "no def '%s' in the model", def);
    nf__session_err_set(err, "", msg);
    return NF_ENOENT;
  }
  nf_param_decl *pd = calloc((size_t)n + 1, sizeof *pd);
  s->params = calloc((size_t)n + 1, sizeof *s->params);
  if (!pd || !s->params) {
    free(pd);
    nf__session_err_set(err, "", "out of memory");
    return NF_ENOMEM;
  }
  nf_module_def_param_decls(m->mod, def, pd, n);
  for (int i = 0; i < n; i++) {
    s->params[i].name = strdup(pd[i].name);
    init_from_decl(&pd[i], &s->params[i].init);
    s->n_params++;
    if (!s->params[i].name) {
      free(pd);
      nf__session_err_set(err, "", "out of memory");
      return NF_ENOMEM;
    }
  }
  free(pd);
  return NF_OK;
}

/* Inputs of F trained as parameters (opts.trainable). */
static int add_trainable(nf_session *s, const nf_graph *F, int n, const char *const *names,
                         char **err) {
  if (n <= 0) return NF_OK;
  nf__param *np = realloc(s->params, sizeof *np * (size_t)(s->n_params + n + 1));
  if (!np) return NF_ENOMEM;
  s->params = np;
  for (int i = 0; i < n; i++) {
    char msg[600];
    if (!names || !names[i] || !nf__session_is_input(F, names[i]) || nf__session_find_param(s, names[i]) >= 0) {
      snprintf(msg, sizeof msg, "cannot train '%s': %s", names && names[i] ? names[i] : "(null)",
               names && names[i] && nf__session_find_param(s, names[i]) >= 0 ? "it is a parameter already"
                                                                : "not an input of the def");
      nf__session_err_set(err, "", msg);
      return NF_EINVAL;
    }
    nf__param *p = &s->params[s->n_params];
    memset(p, 0, sizeof *p);
    p->name = strdup(names[i]);
    if (!p->name) return NF_ENOMEM;
    p->init.fn = NF_INIT_FN_KAIMING_UNIFORM;
    p->init.a = sqrt(5.0);
    s->n_params++;
  }
  return NF_OK;
}

/* A session on ctx (taken over, freed on failure) with its options and
 * trust; NULL with *err set. */
static nf_session *session_open(nf_ir_ctx *ctx, const nf_session_opts *o, char **err) {
  if (err) *err = NULL;
  nf_session *s = session_alloc(o);
  if (!s) {
    nf_ir_ctx_free(ctx);
    nf__session_err_set(err, "", "out of memory");
    return NULL;
  }
  nf_ir_ctx_free(s->ctx);
  s->ctx = ctx;
  if (load_trust(s, o, &s->err) != NF_OK) {
    nf__session_err_set(err, "", nf_buf_str(&s->err));
    nf_session_free(s);
    return NULL;
  }
  return s;
}

nf_session *nf__session_new_graph(nf_model *m, nf_graph *F, nf_ir_ctx *ctx,
                                  const nf_session_opts *o, int n_gin, const char *const *gin,
                                  int n_extra, const char *const *extra, char **err) {
  nf_session *s = session_open(ctx, o, err);
  if (s && (params_from_decls(s, m, F->name, err) != NF_OK ||
            (o && add_trainable(s, F, o->n_trainable, o->trainable, err) != NF_OK) ||
            finish(s, F, 0, n_gin, gin, n_extra, extra, err) != NF_OK)) {
    nf_session_free(s);
    return NULL;
  }
  return s;
}

nf_session *nf__session_new_fn(nf_graph *F, nf_ir_ctx *ctx, const nf_session_opts *o,
                               char **err) {
  nf_session *s = session_open(ctx, o, err);
  if (s && finish(s, F, 1, 0, NULL, 0, NULL, err) != NF_OK) {
    nf_session_free(s);
    return NULL;
  }
  return s;
}

/* F with its outputs after the first (the loss) kept readable but out of
 * the gradient: each becomes a local, and a new output of the same name
 * reads it through stop_gradient, so training computes its value and no
 * adjoint for it.  The new outputs' names go to extra (n of them). */
static nf_graph *stop_extra_outputs(const nf_graph *F, nf_ir_ctx *ctx, const char ***extra,
                                    int *n) {
  *extra = NULL;
  *n = 0;
  if (F->n_outputs <= 1) return (nf_graph *)F;
  nf_graph *g = nf_graph_new(ctx, F->name);
  const char **names = calloc(F->n_outputs, sizeof *names);
  if (!g || !names) {
    free(names);
    return NULL;
  }
  for (uint32_t t = 0; t < F->n_tensors; t++) {
    const nf_tensor *tn = &F->tensors[t];
    int kind = tn->kind;
    if (kind == NF_T_OUTPUT && t != F->outputs[0]) kind = NF_T_LOCAL;
    if (nf_graph_add_tensor(g, tn->name, (nf_dtype)tn->dtype, (nf_tkind)kind, tn->rank,
                            tn->shape) != (int)t) {
      free(names);
      return NULL;
    }
  }
  for (uint32_t i = 0; i < F->n_stmts; i++)
    if (nf_graph_add_stmt(g, &F->stmts[i]) != NF_OK) {
      free(names);
      return NULL;
    }
  for (uint32_t k = 1; k < F->n_outputs; k++) {
    uint32_t o = F->outputs[k];
    const nf_tensor *tn = &F->tensors[o];
    int id = nf_graph_add_tensor(g, tn->name, (nf_dtype)tn->dtype, NF_T_OUTPUT, tn->rank, tn->shape);
    const nf_expr *idx[NF_MAX_RANK];
    for (int r = 0; r < tn->rank; r++) idx[r] = nf_e_var(ctx, (uint32_t)r);
    const nf_expr *rhs = nf_e_unary(ctx, NF_OP_STOPGRAD,
                                    nf_e_access(ctx, o, (nf_dtype)tn->dtype, tn->rank, idx));
    nf_stmt st;
    memset(&st, 0, sizeof st);
    st.out = (uint32_t)id;
    st.red = NF_RED_NONE;
    st.rhs = rhs;
    if (id < 0 || !rhs || nf_graph_add_stmt(g, &st) != NF_OK) {
      free(names);
      return NULL;
    }
    names[(*n)++] = tn->name;
  }
  *extra = names;
  return g;
}

nf_session *nf_session_new_def(nf_model *m, const char *def, const nf_session_opts *o,
                               char **err) {
  if (err) *err = NULL;
  if (!m || !def) {
    nf__session_err_set(err, "", "no model or def given");
    return NULL;
  }
  if (nf_module_def_param_decls(m->mod, def, NULL, 0) < 0) {
    char msg[512];
    snprintf(msg, sizeof msg, "no def '%s' in the model", def);
    nf__session_err_set(err, "", msg);
    return NULL;
  }
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  if (!ctx) {
    nf__session_err_set(err, "", "out of memory");
    return NULL;
  }
  nf_arg_shape *sh = o && o->n_shapes > 0 ? calloc((size_t)o->n_shapes, sizeof *sh) : NULL;
  for (int i = 0; sh && i < o->n_shapes; i++) {
    sh[i].name = o->shape_names[i];
    sh[i].rank = o->shape_ranks[i] > 8 ? 8 : o->shape_ranks[i] < 0 ? 0 : o->shape_ranks[i];
    for (int r = 0; r < sh[i].rank; r++) sh[i].dims[r] = o->shape_dims[i][r];
  }
  nf_inst_opts io = {.n_shapes = sh ? o->n_shapes : 0, .shapes = sh,
                     .n_params = o ? o->n_iparams : 0, .param_names = o ? o->inames : NULL,
                     .param_values = o ? o->ivalues : NULL};
  nf_diag *d = nf_diag_new();
  nf_graph *F = NULL;
  int rc = d ? nf_module_instantiate(m->mod, def, &io, ctx, &F, d) : NF_ENOMEM;
  free(sh);
  if (rc != NF_OK) {
    nf__session_err_set(err, "", d && nf_diag_count(d) ? nf_diag_text(d) : nf_strerror(rc));
    nf_diag_free(d);
    nf_ir_ctx_free(ctx);
    return NULL;
  }
  nf_diag_free(d);
  const char **extra = NULL;
  int n_extra = 0;
  nf_graph *G = stop_extra_outputs(F, ctx, &extra, &n_extra);
  if (!G) {
    nf__session_err_set(err, "", "out of memory");
    nf_ir_ctx_free(ctx);
    return NULL;
  }
  nf_session *s = nf__session_new_graph(m, G, ctx, o, 0, NULL, n_extra, extra, err);
  free(extra);
  return s;
}

void nf_session_free(nf_session *s) {
  if (!s) return;
  if (nf__report_has_path(s) && nf_session_report(s, NULL) != NF_OK) /* its last state */
    nf__slog_warn(&s->log, "the training report: %s", nf_buf_str(&s->err));
  nf__report_free(s);
  nf__dist_close(s);
  nf__dlink_stop(s->link);
  s->link = NULL;
  if (s->kt.dev && s->kt.dev->close) s->kt.dev->close(s);
  for (int i = 0; i < s->kt.n_kents; i++) {
    nf__kent *k = &s->kt.kents[i];
    if (s->kt.dev) {
      s->kt.dev->drop(k->in_obj);
      if (s->kt.dev->unload) {
        s->kt.dev->unload(k->cur);
        s->kt.dev->unload(k->cand);
      }
    }
    nf_gemm_free(k->gemm);
  }
  free(s->kt.kents);
  for (int i = 0; i < s->n_ops; i++) {
    free(s->ops[i].slots);
    free(s->ops[i].bufs);
  }
  free(s->ops);
  free(s->fwd_slots);
  free(s->eval_op);
  free(s->fn_in);
  free(s->fn_out);
  free(s->fn_seed);
  free(s->fn_grad);
  free(s->fn_saved_out);
  free(s->fn_nograd);
  for (int i = 0; i < s->n_slots; i++)
    if (s->slots[i].shape[7] == -1) free(s->slots[i].ptr);
  free(s->slots);
  for (int i = 0; i < s->n_inputs; i++) free(s->inputs[i].name);
  free(s->inputs);
  for (int i = 0; i < s->n_named; i++) free(s->named[i].name);
  free(s->named);
  for (int i = 0; i < s->n_params; i++) {
    free(s->params[i].name);
    free(s->params[i].init_data);
  }
  free(s->params);
  free(s->P);
  free(s->G);
  free(s->M);
  free(s->V);
  free(s->arena);
  nf_partition_free(s->part_step);
  nf_partition_free(s->part_upd);
  if (s->pool) nf_pool_free(s->pool);
  nf_ir_ctx_free(s->ctx);
  nf_buf_free(&s->err);
  nf__slog_destroy(&s->log);
  free(s->daemon_addr);
  free(s->daemon_key);
  free(s->device);
  free(s->verified_path);
  free(s->verified);
  free(s->verdicts);
  pthread_mutex_destroy(&s->kt.mu);
  pthread_cond_destroy(&s->kt.cv);
  free(s);
}

const char *nf_session_error(const nf_session *s) {
  return s && s->err.len ? s->err.data : "";
}

/* ---- running ---- */

static void update_hp(nf_session *s) {
  const nf_optimizer *o = &s->opts.optim;
  double t = (double)(s->step + 1);
  if (o->kind == NF_OPTIM_SGD) {
    s->hp[0] = (float)o->lr;
    s->hp[1] = (float)o->momentum;
    s->hp[2] = (float)o->weight_decay;
  } else {
    double c1 = 1 - pow(o->beta1, t), c2 = 1 - pow(o->beta2, t);
    s->hp[0] = (float)(o->lr / c1);
    s->hp[1] = (float)(1 / sqrt(c2));
    s->hp[2] = (float)o->beta1;
    s->hp[3] = (float)o->beta2;
    s->hp[4] = (float)o->eps;
    s->hp[5] = (float)(o->kind == NF_OPTIM_ADAMW ? o->lr * o->weight_decay : o->weight_decay);
  }
}

/* A step's or an evaluation's run of the program (the ops mask marks,
 * NULL: all) on the session's device: the kernels that arrived taken, the
 * device's start, the one step loop (kt_run.c), the loss on the host. */
static int run_program(nf_session *s, const uint8_t *mask) {
  const nf__device *d = s->kt.dev;
  /* (a training session's whole program is a step; a mask, an evaluation) */
  nf__kt_boundary(s, mask == NULL);
  s->run_seq++;
  int rc = d->begin ? d->begin(s) : NF_OK;
  if (rc == NF_OK) rc = d->run_ops ? d->run_ops(s, mask) : nf__kt_run_ops(s, mask);
  if (rc == NF_OK && s->dist && !mask) rc = nf__dist_step_end(s);
  if (rc == NF_OK && s->loss_slot >= 0)
    rc = nf__dev_pull(s, s->slots[s->loss_slot].ptr, sizeof(float));
  return rc;
}

int nf__session_run_fn(nf_session *s, const uint8_t *mask) {
  nf_buf_reset(&s->err);
  double t0 = nf_now_ms();
  for (int i = 0; i < s->kt.n_kents; i++) s->kt.kents[i].run_ms = 0;
  int rc = run_program(s, mask);
  if (rc != NF_OK) {
    if (!s->err.len) nf_buf_printf(&s->err, "run %lld failed: %s", (long long)s->step + 1,
                                   nf_strerror(rc));
    return rc;
  }
  s->step++;
  double now = nf_now_ms();
  s->last_ms = now - t0;
  s->ms_hist[(s->step - 1) % 10] = s->last_ms;
  if (s->step == 1) s->first_step_ms = now - s->t_start;
  pthread_mutex_lock(&s->kt.mu);
  /* (each entry's share of the time, for the daemon's tuning budgets:
   * of the last run that ran it) */
  for (int i = 0; i < s->kt.n_kents; i++)
    if (s->kt.kents[i].run_ms > 0) s->kt.kents[i].share_ms = s->kt.kents[i].run_ms;
  for (int i = 0; i < s->kt.n_kents; i++) s->kt.kents[i].prof_ms += s->kt.kents[i].run_ms;
  s->prof_steps++;
  pthread_mutex_unlock(&s->kt.mu);
  return NF_OK;
}

int nf_session_step(nf_session *s, double *loss) {
  if (!s) return NF_EINVAL;
  nf_buf_reset(&s->err);
  double t0 = nf_now_ms();
  update_hp(s);
  for (int i = 0; i < s->kt.n_kents; i++) s->kt.kents[i].run_ms = 0;
  nf__dist_step_begin(s);
  int rc = run_program(s, NULL);
  if (rc != NF_OK) {
    if (!s->err.len) nf_buf_printf(&s->err, "step %lld failed: %s", (long long)s->step + 1,
                                   nf_strerror(rc));
    /* (data-parallel: the other ranks would wait in this step's exchanges) */
    if (s->dist) nf__dist_abort(s, "a step failed");
    return rc;
  }
  s->step++;
  s->last_loss = *(const float *)s->slots[s->loss_slot].ptr;
  if (s->dist) nf__dist_mean(s, &s->last_loss, 1); /* the job's loss */
  if (loss) *loss = s->last_loss;
  double now = nf_now_ms();
  s->last_ms = now - t0;
  s->ms_hist[(s->step - 1) % 10] = s->last_ms;
  if (s->step == 1) s->first_step_ms = now - s->t_start;
  pthread_mutex_lock(&s->kt.mu);
  if (!s->kt.dev->timed || s->kt.dev->timed(s)) {
    for (int i = 0; i < s->kt.n_kents; i++) s->kt.kents[i].share_ms = s->kt.kents[i].run_ms;
    for (int i = 0; i < s->kt.n_kents; i++) s->kt.kents[i].prof_ms += s->kt.kents[i].run_ms;
    s->prof_steps++;
  }
  pthread_mutex_unlock(&s->kt.mu);
  if (!s->fn_n_in) { /* (a training step: the report's history; its page by the period) */
    nf__report_step(s);
    const char *due = nf__report_due(s);
    if (due) {
      nf_session_stats st;
      nf_session_stats_get(s, &st);
      nf_buf err = NF_BUF_INIT;
      if (nf__report_write(s, due, &st, &err) != NF_OK && nf__report_warn_once(s))
        nf__slog_warn(&s->log, "the training report %s: %s (training goes on)", due,
                      nf_buf_str(&err));
      nf_buf_free(&err);
    }
  }
  return NF_OK;
}

int nf_session_report(nf_session *s, const char *path) {
  if (!s) return NF_EINVAL;
  nf_buf_reset(&s->err);
  if (!path || !*path) path = nf__report_path(s);
  if (!path) {
    nf_buf_printf(&s->err, "nf_session_report: no path (and none set by nf_session_report_to)");
    return NF_EINVAL;
  }
  nf_session_stats st;
  nf_session_stats_get(s, &st);
  return nf__report_write(s, path, &st, &s->err);
}

/* The ops the forward outputs (the loss and the def's other outputs) need:
 * a backward walk over the program from their slots.  The update never is
 * one of them.  Running a subset of the ops in program order is safe with
 * the planned arena: skipping an op only removes writes. */
void nf__session_ops_for(const nf_session *s, const int *want, int n, int lo, int hi,
                         uint8_t *mask) {
  memset(mask, 0, (size_t)s->n_ops);
  /* a slot is needed from the op that wants it back to its producer */
  uint8_t small[256], *need = s->n_slots <= 256 ? small : calloc((size_t)s->n_slots, 1);
  if (!need) { /* (no memory for the walk: every op of the range runs) */
    for (int i = lo; i < hi; i++) mask[i] = !s->ops[i].alias;
    return;
  }
  memset(need, 0, (size_t)s->n_slots);
  /* (a temporary copied to a bound buffer is that buffer: build.c's
   * add_ops; its producer writes the wanted slot's memory) */
  for (int i = 0; i < n; i++)
    for (int j = 0; want[i] >= 0 && j < s->n_slots; j++)
      if (j == want[i] || (s->slots[j].ptr && s->slots[j].ptr == s->slots[want[i]].ptr))
        need[j] = 1;
  for (int i = hi - 1; i >= lo; i--) {
    const nf__op *op = &s->ops[i];
    if (op->alias) continue;
    int used = 0;
    for (uint32_t j = 0; j < op->n_out; j++) used |= need[op->slots[op->n_in + j]];
    if (!used) continue;
    mask[i] = 1;
    for (uint32_t j = 0; j < op->n_in; j++) need[op->slots[j]] = 1;
  }
  if (need != small) free(need);
}

static int eval_mask(nf_session *s) {
  s->eval_op = calloc((size_t)s->n_ops + 1, 1);
  if (!s->eval_op) return NF_ENOMEM;
  nf__session_ops_for(s, s->fwd_slots, s->n_fwd, 0, s->n_ops, s->eval_op);
  return NF_OK;
}

int nf_session_eval(nf_session *s, double *loss) {
  if (!s) return NF_EINVAL;
  nf_buf_reset(&s->err);
  if (!s->eval_op) {
    int rc = eval_mask(s);
    if (rc != NF_OK) return rc;
  }
  int rc = run_program(s, s->eval_op);
  if (rc != NF_OK) {
    if (!s->err.len) nf_buf_printf(&s->err, "evaluation failed: %s", nf_strerror(rc));
    return rc;
  }
  if (loss) *loss = *(const float *)s->slots[s->loss_slot].ptr;
  return NF_OK;
}

/* ---- data in and out ---- */

static int named_slot(const nf_session *s, const char *name) {
  int sl = nf__session_find_named(s->named, s->n_named, name);
  if (sl < 0) sl = nf__session_find_named(s->inputs, s->n_inputs, name);
  return sl;
}

/* The start of a call that names a tensor and passes a buffer: clears the
 * last error; NF_EINVAL with a message when either is missing. */
static int begin_io(nf_session *s, const char *call, const char *name, const void *data) {
  nf_buf_reset(&s->err);
  if (name && data) return NF_OK;
  nf_buf_printf(&s->err, "%s: no name or no buffer", call);
  return NF_EINVAL;
}

int nf_session_feed(nf_session *s, const char *input, const void *data, size_t bytes) {
  if (!s) return NF_EINVAL;
  int rc = begin_io(s, "nf_session_feed", input, data);
  if (rc != NF_OK) return rc;
  int sl = nf__session_find_named(s->inputs, s->n_inputs, input);
  if (sl < 0) {
    nf_buf_printf(&s->err, "no input '%s' (inputs the loss does not read are not fed)", input);
    return NF_ENOENT;
  }
  if ((int64_t)bytes != s->slots[sl].bytes) {
    nf_buf_printf(&s->err, "input '%s' takes %lld bytes, not %zu", input,
                  (long long)s->slots[sl].bytes, bytes);
    return NF_EINVAL;
  }
  memcpy(s->slots[sl].ptr, data, bytes);
  return nf__dev_push(s, s->slots[sl].ptr, bytes);
}

int nf_session_read(nf_session *s, const char *name, void *data, size_t bytes) {
  if (!s) return NF_EINVAL;
  int rc = begin_io(s, "nf_session_read", name, data);
  if (rc != NF_OK) return rc;
  int pi = nf__session_find_param(s, name);
  const void *src;
  int64_t want;
  if (pi >= 0) {
    src = s->P + s->params[pi].offset;
    want = s->params[pi].numel * 4;
  } else if (!strncmp(name, "grad_", 5) && nf__session_find_param(s, name + 5) >= 0) {
    pi = nf__session_find_param(s, name + 5);
    src = s->G + s->params[pi].offset;
    want = s->params[pi].numel * 4;
  } else {
    int sl = named_slot(s, name);
    if (sl < 0) {
      nf_buf_printf(&s->err, "nothing named '%s' to read", name);
      return NF_ENOENT;
    }
    src = s->slots[sl].ptr;
    want = s->slots[sl].bytes;
  }
  if ((int64_t)bytes != want) {
    nf_buf_printf(&s->err, "'%s' has %lld bytes, not %zu", name, (long long)want, bytes);
    return NF_EINVAL;
  }
  if ((rc = nf__dev_pull(s, src, bytes)) != NF_OK) return rc;
  memcpy(data, src, bytes);
  return NF_OK;
}

int nf_session_set_param(nf_session *s, const char *name, const float *data, size_t n) {
  if (!s) return NF_EINVAL;
  int rc = begin_io(s, "nf_session_set_param", name, data);
  if (rc != NF_OK) return rc;
  int pi = nf__session_find_param(s, name);
  if (pi < 0) {
    nf_buf_printf(&s->err, "no parameter '%s'", name);
    return NF_ENOENT;
  }
  if ((int64_t)n != s->params[pi].numel) {
    nf_buf_printf(&s->err, "parameter '%s' has %lld elements, not %zu", name,
                  (long long)s->params[pi].numel, n);
    return NF_EINVAL;
  }
  memcpy(s->P + s->params[pi].offset, data, n * sizeof(float));
  return nf__dev_push(s, s->P + s->params[pi].offset, n * sizeof(float));
}

int nf_session_set_lr(nf_session *s, double lr) {
  if (!s) return NF_EINVAL;
  nf_buf_reset(&s->err);
  if (!(lr > 0) || !isfinite(lr)) {
    nf_buf_printf(&s->err, "the learning rate must be positive and finite, got %g", lr);
    return NF_EINVAL;
  }
  s->opts.optim.lr = lr;
  return NF_OK;
}

int nf_session_n_inputs(const nf_session *s) { return s ? s->n_inputs : 0; }
int nf_session_n_params(const nf_session *s) { return s ? s->n_params : 0; }

static int info(const nf__slot *sl, nf_elem *t, int *rank, int64_t dims[8]) {
  if (t) *t = (nf_elem)sl->dtype;
  if (rank) *rank = sl->rank;
  if (dims) memcpy(dims, sl->shape, sizeof(int64_t) * sl->rank);
  return NF_OK;
}

int nf_session_input_info(const nf_session *s, int i, const char **name, nf_elem *t, int *rank,
                          int64_t dims[8]) {
  if (!s || i < 0 || i >= s->n_inputs) return NF_EINVAL;
  if (name) *name = s->inputs[i].name;
  return info(&s->slots[s->inputs[i].slot], t, rank, dims);
}

int nf_session_param_info(const nf_session *s, int i, const char **name, nf_elem *t, int *rank,
                          int64_t dims[8]) {
  if (!s || i < 0 || i >= s->n_params) return NF_EINVAL;
  const nf__param *p = &s->params[i];
  if (name) *name = p->name;
  if (t) *t = (nf_elem)p->dtype;
  if (rank) *rank = p->rank;
  if (dims) memcpy(dims, p->shape, sizeof(int64_t) * p->rank);
  return NF_OK;
}

static int cmp_prof(const void *a, const void *b, void *arg) {
  const nf__kent *k = arg;
  double x = k[*(const int *)a].prof_ms, y = k[*(const int *)b].prof_ms;
  return x > y ? -1 : x < y;
}

void nf__session_profile(nf_session *s, FILE *f, int reset) {
  if (!reset) {
    int *ord = malloc(sizeof(int) * (size_t)(s->kt.n_kents + 1));
    double total = 0;
    if (!ord) return;
    for (int i = 0; i < s->kt.n_kents; i++) {
      ord[i] = i;
      total += s->kt.kents[i].prof_ms;
    }
    qsort_r(ord, (size_t)s->kt.n_kents, sizeof *ord, cmp_prof, s->kt.kents);
    int64_t n = s->prof_steps ? s->prof_steps : 1;
    fprintf(f, "time per kernel entry over %lld steps (%.2f ms/step in kernels):\n",
            (long long)s->prof_steps, total / (double)n);
    fprintf(f, "  %-16s %-24s %4s %-9s %10s %6s %9s %9s %7s\n", "key", "first output", "ops",
            "runs on", "ms/step", "share", "MFLOP", "GFLOP/s", "k/tier0");
    for (int q = 0; q < s->kt.n_kents; q++) {
      const nf__kent *k = &s->kt.kents[ord[q]];
      char hex[65];
      nf_hash_hex(k->key, hex);
      hex[16] = 0;
      const char *first = k->g && k->g->n_outputs ? k->g->tensors[k->g->outputs[0]].name : "?";
      const char *on = nf__kent_runs_on(&s->kt, s, k);
      if (!strcmp(on, "the interpreter")) on = "interp";
      double ms = k->prof_ms / (double)n;
      double fl = (double)k->flops * k->n_ops;
      char vs[16] = "-";
      if (k->kn_ms > 0 && k->t0_ms > 0) snprintf(vs, sizeof vs, "%.3g", k->kn_ms / k->t0_ms);
      fprintf(f, "  %-16s %-24.24s %4d %-9s %10.3f %5.1f%% %9.1f %9.2f %7s\n", hex, first,
              k->n_ops, on, ms, total > 0 ? 100 * k->prof_ms / total : 0.0, fl / 1e6,
              ms > 0 ? fl / ms / 1e6 : 0.0, vs);
      if (k->gemm && !strcmp(on, "OpenBLAS")) fprintf(f, "  %16s %s\n", "", nf_gemm_describe(k->gemm));
    }
    free(ord);
  }
  for (int i = 0; i < s->kt.n_kents; i++) s->kt.kents[i].prof_ms = 0;
  s->prof_steps = 0;
}

int nf_session_n_outputs(const nf_session *s) { return s ? s->n_fwd : 0; }

int nf_session_output_info(const nf_session *s, int i, const char **name, nf_elem *t, int *rank,
                           int64_t dims[8]) {
  if (!s || i < 0 || i >= s->n_fwd) return NF_EINVAL;
  int sl = s->fwd_slots[i];
  if (name) {
    *name = NULL;
    for (int k = 0; k < s->n_named; k++)
      if (s->named[k].slot == sl && strcmp(s->named[k].name, "loss")) *name = s->named[k].name;
    if (!*name) *name = "loss";
  }
  return info(&s->slots[sl], t, rank, dims);
}

size_t nf_session_abi_size(const char *what) {
  if (!what) return 0;
  if (!strcmp(what, "opts")) return sizeof(nf_session_opts);
  if (!strcmp(what, "stats")) return sizeof(nf_session_stats);
  if (!strcmp(what, "optimizer")) return sizeof(nf_optimizer);
  if (!strcmp(what, "view")) return sizeof(nf_view);
  return 0;
}

int nf_session_stats_get(const nf_session *s, nf_session_stats *st) {
  if (!s || !st) return NF_EINVAL;
  memset(st, 0, sizeof *st);
  st->step = s->step;
  st->loss = s->last_loss;
  st->ms = s->last_ms;
  int n = s->step < 10 ? (int)s->step : 10;
  for (int i = 0; i < n; i++) st->ms_avg += s->ms_hist[i] / n;
  st->kernels = s->kt.n_kents;
  nf_session *ms = (nf_session *)s;
  pthread_mutex_lock(&ms->kt.mu);
  for (int i = 0; i < s->kt.n_kents; i++) {
    const nf__kent *k = &s->kt.kents[i];
    int cur = k->cur != NULL;
    if (cur && k->prefer_t0) {
      st->tier0_kept++;
      if (k->gemm || s->gpu) st->blas++, st->blas_kept++;
    } else {
      if (cur && k->cur_tier == 1) st->tier1++;
      if (cur && k->cur_tier == 2) st->tier2++;
      if (cur && k->cur_tier == 0) st->generated++;
      if (!cur && k->gemm) st->blas++;
    }
    if (k->dstate == DK_SUBMITTED || k->dstate == DK_ACCEPTED) {
      st->tuning++;
      st->trials += k->trial;
      st->trials_max += k->max_trials;
    }
  }
  st->connected = s->kt.connected;
  st->reconnects = s->kt.connects > 1 ? s->kt.connects - 1 : 0;
  st->rejected = s->rejected + s->kt.link_rejected;
  pthread_mutex_unlock(&ms->kt.mu);
  st->swaps = s->swaps;
  st->trusted = s->trusted;
  st->remembered = s->remembered;
  st->first_step_ms = s->first_step_ms;
  st->graph_runs = nf__gpu_graph_runs(s, NULL);
  return NF_OK;
}

int nf_session_wait_kernels(nf_session *s, int timeout_ms, int want_tier) {
  if (!s) return NF_EINVAL;
  double until = nf_now_ms() + (timeout_ms > 0 ? timeout_ms : 1e12);
  pthread_mutex_lock(&s->kt.mu);
  for (;;) {
    int done = 1;
    for (int i = 0; i < s->kt.n_kents && done; i++) {
      const nf__kent *k = &s->kt.kents[i];
      if (k->dstate == DK_FAILED) continue;
      /* (a kernel generated here, tier 0, does not count) */
      if (want_tier <= 1)
        done = (k->cur && k->cur_tier > 0) || (k->cand && k->cand_tier > 0) ||
               (k->in_obj && k->in_tier > 0);
      else done = k->dstate == DK_FINAL;
    }
    if (!s->link) done = 1;
    if (done) break;
    double now = nf_now_ms();
    if (now >= until) {
      pthread_mutex_unlock(&s->kt.mu);
      return NF_ERANGE;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double w = until - now > 200 ? 200 : until - now;
    ts.tv_nsec += (long)(w * 1e6);
    while (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->kt.cv, &s->kt.mu, &ts);
  }
  pthread_mutex_unlock(&s->kt.mu);
  return NF_OK;
}

int nf_session_save(nf_session *s, const char *path) {
  if (!s || !path) return NF_EINVAL;
  nf_buf_reset(&s->err);
  int rc = nf__dev_pull(s, s->P, (size_t)s->n_flat * sizeof(float));
  return rc == NF_OK ? nf__params_save(s, path) : rc;
}

int nf_session_load(nf_session *s, const char *path) {
  if (!s || !path) return NF_EINVAL;
  nf_buf_reset(&s->err);
  int rc = nf__params_load(s, path);
  return rc == NF_OK ? nf__dev_push(s, s->P, (size_t)s->n_flat * sizeof(float)) : rc;
}
