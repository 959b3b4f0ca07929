/* search.c - the tuning loop of one graph (nf_search.h): reference,
 * default baseline, evolutionary rounds ranked by the cost model, real
 * compilation and sandboxed measurement, budgets and records. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_cost_model.h"
#include "nf_flops.h"
#include "nf_interp.h"
#include "nf_nvrtc_link.h"
#include "nf_search.h"
#include "nf_sketch.h"
#include "nf_status.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t fnv(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
  return h ? h : 1;
}

/* ---- a set of schedule hashes (open addressing, 0 = empty) ---- */

typedef struct hset {
  uint64_t *v;
  size_t cap, n;
} hset;

static int hset_has(const hset *h, uint64_t k) {
  if (!h->cap) return 0;
  for (size_t i = k & (h->cap - 1);; i = (i + 1) & (h->cap - 1)) {
    if (h->v[i] == k) return 1;
    if (h->v[i] == 0) return 0;
  }
}

static int hset_add(hset *h, uint64_t k) {
  if ((h->n + 1) * 2 > h->cap) {
    size_t nc = h->cap ? h->cap * 2 : 1024;
    uint64_t *nv = calloc(nc, sizeof *nv);
    if (!nv) return NF_ENOMEM;
    for (size_t i = 0; i < h->cap; i++) {
      if (!h->v[i]) continue;
      size_t j = h->v[i] & (nc - 1);
      while (nv[j]) j = (j + 1) & (nc - 1);
      nv[j] = h->v[i];
    }
    free(h->v);
    h->v = nv;
    h->cap = nc;
  }
  size_t i = k & (h->cap - 1);
  while (h->v[i] && h->v[i] != k) i = (i + 1) & (h->cap - 1);
  if (!h->v[i]) {
    h->v[i] = k;
    h->n++;
  }
  return NF_OK;
}

/* ---- candidates ---- */

typedef struct cand {
  nf_sk_point pt;
  uint64_t hash;
  float feat[NF_FEAT_N];
  float score;
  double time_ms; /* measured points only */
} cand;

typedef struct run {
  const nf_graph *g;
  const nf_search_opts *o;
  nf_sk_space *sp;
  nf_cost_model *model;
  nf_measurer *meas;
  hset seen;
  uint64_t rng;
  double t0;
  nf_search_result *res;
  size_t cap_records;
  cand *measured; /* points measured in this run, for the population */
  size_t n_measured, cap_measured;
  int last_gain_trial;
  int measuring_default;
  int consec_failures; /* failed trials in a row */
  int corpus_kept;     /* the model still holds other subgraphs' records */
  nf_gpu_knobs *kbest; /* GPU mode: the knobs of the best so far */
  nf_buf *err;
  nf_buf tmp;
} run;

static void cand_free(cand *c) { nf_sk_point_free(&c->pt); }

/* Schedule text, hash, lowering check and features of c->pt.  Returns 1
 * when legal, 0 when not, < 0 on memory failure. */
static int cand_eval(run *R, cand *c) {
  nf_schedule *s;
  int rc = nf_sk_schedule(R->sp, &c->pt, &s);
  if (rc != NF_OK) return rc;
  nf_buf_reset(&R->tmp);
  nf_schedule_print(s, &R->tmp);
  c->hash = fnv(nf_buf_str(&R->tmp), R->tmp.len);
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  if (!ctx) {
    nf_schedule_free(s);
    return NF_ENOMEM;
  }
  nf_lprog *p;
  nf_buf e = NF_BUF_INIT;
  int lr = nf_lower(R->g, s, ctx, &p, &e);
  int legal = lr == NF_OK && nf_features(p, c->feat) == NF_OK;
  nf_buf_free(&e);
  nf_ir_ctx_free(ctx);
  nf_schedule_free(s);
  if (lr == NF_ENOMEM) return NF_ENOMEM;
  return legal;
}

static int push_record(run *R, nf_search_record *rec) {
  nf_search_result *r = R->res;
  if (r->n_records == R->cap_records) {
    size_t nc = R->cap_records ? R->cap_records * 2 : 64;
    nf_search_record *nr = realloc(r->records, nc * sizeof *nr);
    if (!nr) return NF_ENOMEM;
    r->records = nr;
    R->cap_records = nc;
  }
  if (R->o->on_record) R->o->on_record(R->o->user, rec);
  r->records[r->n_records++] = *rec;
  return NF_OK;
}

/* Lowers, compiles and measures schedule s into rec (schedule text set by
 * the caller). */
static int measure_schedule(run *R, const nf_schedule *s, nf_search_record *rec) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  if (!ctx) return NF_ENOMEM;
  nf_lprog *p;
  nf_buf e = NF_BUF_INIT;
  int rc = nf_lower(R->g, s, ctx, &p, &e);
  if (rc != NF_OK) {
    rec->status = NF_MEAS_LOAD;
    snprintf(rec->reason, sizeof rec->reason, "does not lower: %s", nf_buf_str(&e));
    nf_buf_free(&e);
    nf_ir_ctx_free(ctx);
    return rc == NF_ENOMEM ? NF_ENOMEM : NF_OK;
  }
  if (R->o->cuda_sm > 0) nf_features_gpu(p, rec->feat);
  else nf_features(p, rec->feat);
  if (R->o->measure_hook) {
    rc = R->o->measure_hook(R->o->user, s, p, rec);
  } else {
    nf_blob so = NF_BLOB_INIT;
    if (R->o->cuda_sm > 0) {
      nf_buf b = NF_BUF_INIT;
      rc = nf_cuda_compile_bundle(p, R->o->cuda_sm, &b, NULL, &e);
      so.data = (uint8_t *)b.data; /* taken over (freed with the blob) */
      so.len = b.len;
    } else {
      rc = nf_cpu_compile(p, &R->o->target, &so, NULL, &e);
    }
    if (rc != NF_OK) {
      rec->status = NF_MEAS_LOAD;
      snprintf(rec->reason, sizeof rec->reason, "does not compile: %s", nf_buf_str(&e));
      rc = rc == NF_ENOMEM ? NF_ENOMEM : NF_OK;
    } else {
      nf_measure_result mr;
      if (R->o->candidate_hook)
        R->o->candidate_hook(R->o->user, R->measuring_default ? 0 : R->res->trials + 1, &so);
      rc = nf_measure(R->meas, so.data, so.len, &mr);
      rec->status = mr.status;
      rec->time_ms = mr.status == NF_MEAS_OK ? mr.median_ms : 0;
      snprintf(rec->reason, sizeof rec->reason, "%s", mr.reason);
      if (mr.status == NF_MEAS_OK && R->o->time_hook)
        R->o->time_hook(R->o->user, R->measuring_default, rec);
      if (rc == NF_EIO) nf_buf_printf(R->err, "measurement: %s", mr.reason);
    }
    nf_blob_free(&so);
  }
  nf_buf_free(&e);
  nf_ir_ctx_free(ctx);
  if (rec->status != NF_MEAS_OK) rec->time_ms = 0;
  return rc;
}

static void report(run *R, double last_ms) {
  if (!R->o->progress) return;
  nf_search_progress pg = {.trial = R->res->trials,
                           .max_trials = R->o->max_trials > 0 ? R->o->max_trials : 200,
                           .failures = R->res->failures,
                           .best_ms = R->res->best_ms,
                           .default_ms = R->res->default_ms,
                           .last_ms = last_ms,
                           .elapsed_s = now_s() - R->t0};
  R->o->progress(R->o->user, &pg);
}

/* Counts measured rec as the next trial: its number and time, the
 * failure counts, and the best so far (*new_best 1 when it is).  NF_OK
 * or NF_ENOMEM. */
static int count_trial(run *R, nf_search_record *rec, int *new_best) {
  nf_search_result *r = R->res;
  *new_best = 0;
  rec->trial = ++r->trials;
  rec->at_s = now_s() - R->t0;
  if (rec->status != NF_MEAS_OK) {
    r->failures++;
    R->consec_failures++;
    return NF_OK;
  }
  R->consec_failures = 0;
  if (r->best_ms > 0 && rec->time_ms >= r->best_ms) return NF_OK;
  if (r->best_ms <= 0 || rec->time_ms < r->best_ms * 0.99) R->last_gain_trial = r->trials;
  r->best_ms = rec->time_ms;
  free(r->best_schedule);
  r->best_schedule = strdup(rec->schedule);
  *new_best = 1;
  return r->best_schedule ? NF_OK : NF_ENOMEM;
}

/* Records rec (taken over) and reports progress; rc passes through. */
static int finish_trial(run *R, nf_search_record *rec, int rc) {
  double last = rec->time_ms;
  if (push_record(R, rec) != NF_OK) {
    free(rec->schedule);
    return NF_ENOMEM;
  }
  report(R, last);
  return rc;
}

/* count_trial, and the record added to the cost model's data. */
static int count_learnt(run *R, nf_search_record *rec, int *best) {
  int rc = count_trial(R, rec, best);
  if (nf_cost_model_add(R->model, rec->feat, rec->status == NF_MEAS_OK ? rec->time_ms : 0) != NF_OK)
    rc = NF_ENOMEM;
  return rc;
}

/* Measures schedule s (its text in R->tmp, hash h; taken over) as the
 * next trial, counted and learnt from; *rec gets the record (its schedule
 * text owned by it).  An error other than the count's leaves no record. */
static int measure_new(run *R, nf_schedule *s, uint64_t h, nf_search_record *rec, int *best) {
  memset(rec, 0, sizeof *rec);
  rec->schedule = strdup(nf_buf_str(&R->tmp));
  int rc = rec->schedule ? hset_add(&R->seen, h) : NF_ENOMEM;
  /* a candidate over twice the best is timed once: enough to rank it */
  if (R->meas) nf_measurer_set_cutoff(R->meas, R->res->best_ms > 0 ? 2 * R->res->best_ms : 0);
  if (rc == NF_OK) rc = measure_schedule(R, s, rec);
  nf_schedule_free(s);
  if (rc != NF_OK) {
    free(rec->schedule);
    rec->schedule = NULL;
    return rc;
  }
  *best = 0;
  return count_learnt(R, rec, best);
}

/* Measures candidate c (legal, unseen) as the next trial. */
static int trial(run *R, cand *c) {
  nf_search_record rec;
  nf_schedule *s;
  int rc = nf_sk_schedule(R->sp, &c->pt, &s);
  if (rc != NF_OK) return rc;
  nf_buf_reset(&R->tmp);
  nf_schedule_print(s, &R->tmp);
  int best = 0;
  rc = measure_new(R, s, c->hash, &rec, &best);
  if (rc != NF_OK && !rec.schedule) return rc;
  if (rec.status == NF_MEAS_OK) {
    if (R->n_measured == R->cap_measured) {
      size_t nc = R->cap_measured ? R->cap_measured * 2 : 64;
      cand *nm = realloc(R->measured, nc * sizeof *nm);
      if (!nm) rc = NF_ENOMEM;
      else {
        R->measured = nm;
        R->cap_measured = nc;
      }
    }
    if (R->n_measured < R->cap_measured && nf_sk_point_init(R->sp, &R->measured[R->n_measured].pt) == NF_OK) {
      cand *m = &R->measured[R->n_measured++];
      nf_sk_point_copy(&m->pt, &c->pt);
      m->hash = c->hash;
      memcpy(m->feat, rec.feat, sizeof m->feat);
      m->time_ms = rec.time_ms;
    }
  }
  return finish_trial(R, &rec, rc);
}

static int budget_left(run *R) {
  const nf_search_opts *o = R->o;
  int max_trials = o->max_trials > 0 ? o->max_trials : 200;
  if (R->res->trials >= max_trials) return 0;
  int max_failures = o->max_failures ? o->max_failures : 150;
  if (max_failures > 0 && R->consec_failures >= max_failures) {
    R->res->gave_up = 1;
    return 0;
  }
  if (o->max_seconds > 0 && now_s() - R->t0 >= o->max_seconds) return 0;
  int patience = o->patience ? o->patience : (max_trials / 2 > 64 ? max_trials / 2 : 64);
  if (patience > 0 && R->res->best_ms > 0 && R->res->trials - R->last_gain_trial >= patience) {
    R->res->stopped_early = 1;
    return 0;
  }
  return 1;
}

/* A random legal point not seen yet (bounded tries): 1 found, 0 none. */
static int random_cand(run *R, cand *c, const hset *also) {
  for (int t = 0; t < 64; t++) {
    nf_sk_sample(R->sp, &R->rng, &c->pt);
    int lg = cand_eval(R, c);
    if (lg < 0) return lg;
    if (lg && !hset_has(&R->seen, c->hash) && !(also && hset_has(also, c->hash))) return 1;
  }
  return 0;
}

static int cmp_score(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  return x->hash < y->hash ? -1 : x->hash > y->hash;
}

static int cmp_time(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->time_ms != y->time_ms) return x->time_ms < y->time_ms ? -1 : 1;
  return x->hash < y->hash ? -1 : x->hash > y->hash;
}

static int score_all(run *R, cand *c, size_t n) {
  if (n == 0) return NF_OK;
  float *f = calloc(n * NF_FEAT_N, sizeof *f), *sc = calloc(n, sizeof *sc);
  int rc = f && sc ? NF_OK : NF_ENOMEM;
  if (rc == NF_OK) {
    for (size_t i = 0; i < n; i++) memcpy(f + i * NF_FEAT_N, c[i].feat, NF_FEAT_N * sizeof *f);
    rc = nf_cost_model_predict(R->model, f, n, sc);
    for (size_t i = 0; rc == NF_OK && i < n; i++) c[i].score = sc[i];
  }
  free(f);
  free(sc);
  return rc;
}

/* Tournament of two by score. */
static const cand *tourney(run *R, const cand *pop, size_t n) {
  const cand *a = &pop[nf_sk_rand(&R->rng) % n], *b = &pop[nf_sk_rand(&R->rng) % n];
  return a->score >= b->score ? a : b;
}

/* One round: picks up to want candidates into out (initialised points),
 * returns how many. */
static int pick_round(run *R, cand *out, int want, int *n_out) {
  const nf_search_opts *o = R->o;
  int rc = NF_OK;
  *n_out = 0;
  hset chosen = {0};
  int use_model = !o->random_search && nf_cost_model_trained(R->model);
  double eps = o->eps < 0 ? 0 : (o->eps == 0 ? 0.2 : o->eps);
  int n_rand = use_model ? (int)ceil(want * eps) : want;
  if (n_rand > want) n_rand = want;
  if (use_model) {
    size_t popn = (size_t)(o->population > 0 ? o->population : 512);
    int gens = o->generations > 0 ? o->generations : 4;
    cand *pop = calloc(2 * popn, sizeof *pop);
    size_t n = 0;
    if (!pop) return NF_ENOMEM;
    for (size_t i = 0; i < 2 * popn && rc == NF_OK; i++) rc = nf_sk_point_init(R->sp, &pop[i].pt);
    /* seeds: the best measured points, then random samples */
    if (R->n_measured) qsort(R->measured, R->n_measured, sizeof *R->measured, cmp_time);
    for (size_t i = 0; rc == NF_OK && i < R->n_measured && n < popn / 4; i++) {
      nf_sk_point_copy(&pop[n].pt, &R->measured[i].pt);
      memcpy(pop[n].feat, R->measured[i].feat, sizeof pop[n].feat);
      pop[n].hash = R->measured[i].hash;
      n++;
    }
    while (rc == NF_OK && n < popn) {
      int lg = random_cand(R, &pop[n], NULL);
      if (lg < 0) rc = lg;
      else if (lg) n++;
      else break;
    }
    if (rc == NF_OK) rc = score_all(R, pop, n);
    for (int gen = 0; rc == NF_OK && gen < gens && n > 0; gen++) {
      size_t m = n;
      for (size_t k = 0; rc == NF_OK && k < popn; k++) {
        cand *ch = &pop[m];
        const cand *a = tourney(R, pop, n);
        if (nf_sk_rand(&R->rng) % 10 < 7) {
          nf_sk_mutate(R->sp, &R->rng, &a->pt, &ch->pt);
        } else {
          const cand *b = tourney(R, pop, n);
          nf_sk_crossover(R->sp, &R->rng, &a->pt, &b->pt, &ch->pt);
          if (nf_sk_rand(&R->rng) % 2) {
            nf_sk_point tmp;
            if (nf_sk_point_init(R->sp, &tmp) != NF_OK) {
              rc = NF_ENOMEM;
              break;
            }
            nf_sk_point_copy(&tmp, &ch->pt);
            nf_sk_mutate(R->sp, &R->rng, &tmp, &ch->pt);
            nf_sk_point_free(&tmp);
          }
        }
        int lg = cand_eval(R, ch);
        if (lg < 0) rc = lg;
        else if (lg) m++;
      }
      if (rc == NF_OK) rc = score_all(R, pop + n, m - n);
      if (rc != NF_OK) break;
      /* keep the best popn distinct ones */
      qsort(pop, m, sizeof *pop, cmp_score);
      size_t w = 0;
      hset dd = {0};
      for (size_t k = 0; k < m; k++) {
        if (w < popn && !hset_has(&dd, pop[k].hash)) {
          if (hset_add(&dd, pop[k].hash) != NF_OK) rc = NF_ENOMEM;
          if (w != k) {
            cand t = pop[w];
            pop[w] = pop[k];
            pop[k] = t;
          }
          w++;
        }
      }
      free(dd.v);
      n = w;
    }
    for (size_t k = 0; rc == NF_OK && k < n && *n_out < want - n_rand; k++) {
      if (hset_has(&R->seen, pop[k].hash) || hset_has(&chosen, pop[k].hash)) continue;
      nf_sk_point_copy(&out[*n_out].pt, &pop[k].pt);
      out[*n_out].hash = pop[k].hash;
      memcpy(out[*n_out].feat, pop[k].feat, sizeof pop[k].feat);
      if (hset_add(&chosen, pop[k].hash) != NF_OK) rc = NF_ENOMEM;
      (*n_out)++;
    }
    for (size_t i = 0; i < 2 * popn; i++) cand_free(&pop[i]);
    free(pop);
  }
  while (rc == NF_OK && *n_out < want) {
    int lg = random_cand(R, &out[*n_out], &chosen);
    if (lg < 0) rc = lg;
    if (lg <= 0) break;
    if (hset_add(&chosen, out[*n_out].hash) != NF_OK) rc = NF_ENOMEM;
    (*n_out)++;
  }
  free(chosen.v);
  return rc;
}

/* ---- the problem: inputs and the reference ---- */

typedef struct problem {
  nf_measure_tensor *t;
  nf_array *in, *ref;
  void **in_ptr;
  double **exp;
  double **bnd; /* per output: the reference's rounding bounds (NULL for ints) */
  uint32_t n_in, n_out;
} problem;

static void problem_free(problem *P) {
  for (uint32_t k = 0; P->in && k < P->n_in; k++) nf_array_free(&P->in[k]);
  for (uint32_t k = 0; P->ref && k < P->n_out; k++) nf_array_free(&P->ref[k]);
  for (uint32_t k = 0; P->exp && k < P->n_out; k++) free(P->exp[k]);
  for (uint32_t k = 0; P->bnd && k < P->n_out; k++) free(P->bnd[k]);
  free(P->bnd);
  free(P->t);
  free(P->in);
  free(P->ref);
  free(P->in_ptr);
  free(P->exp);
}

static int problem_make(const nf_graph *g, uint64_t seed, problem *P, nf_buf *err) {
  memset(P, 0, sizeof *P);
  P->n_in = g->n_inputs;
  P->n_out = g->n_outputs;
  uint32_t n = g->n_inputs + g->n_outputs;
  P->t = calloc(n ? n : 1, sizeof *P->t);
  P->in = calloc(g->n_inputs ? g->n_inputs : 1, sizeof *P->in);
  P->ref = calloc(g->n_outputs ? g->n_outputs : 1, sizeof *P->ref);
  P->in_ptr = calloc(g->n_inputs ? g->n_inputs : 1, sizeof *P->in_ptr);
  P->exp = calloc(g->n_outputs ? g->n_outputs : 1, sizeof *P->exp);
  P->bnd = calloc(g->n_outputs ? g->n_outputs : 1, sizeof *P->bnd);
  if (!P->t || !P->in || !P->ref || !P->in_ptr || !P->exp || !P->bnd) return NF_ENOMEM;
  uint64_t r = seed * 0x9e3779b97f4a7c15ull + 7;
  for (uint32_t k = 0; k < n; k++) {
    const nf_tensor *t = &g->tensors[k < g->n_inputs ? g->inputs[k] : g->outputs[k - g->n_inputs]];
    if (t->dtype != NF_F32 && t->dtype != NF_F64 && t->dtype != NF_I32 && t->dtype != NF_I64 &&
        t->dtype != NF_BOOL) {
      nf_buf_printf(err, "tensor '%s' is %s: the CPU code generator takes f32, f64, i32, i64 and bool",
                    t->name ? t->name : "?", nf_dtype_name(t->dtype));
      return NF_EINVAL;
    }
    P->t[k].dtype = t->dtype;
    P->t[k].rank = t->rank;
    memcpy(P->t[k].shape, t->shape, sizeof t->shape);
    if (k >= g->n_inputs) continue;
    nf_array *a = &P->in[k];
    if (nf_array_alloc(a, t->dtype, t->rank, t->shape) != NF_OK) return NF_ENOMEM;
    for (int64_t i = 0; i < a->numel; i++) {
      double u = (double)(nf_sk_rand(&r) >> 11) / 9007199254740992.0; /* [0, 1) */
      switch (a->dtype) {
      case NF_F32: ((float *)a->data)[i] = (float)(2 * u - 1); break;
      case NF_F64: ((double *)a->data)[i] = 2 * u - 1; break;
      case NF_I32: ((int32_t *)a->data)[i] = u < 0.5 ? 0 : 1; break;
      case NF_I64: ((int64_t *)a->data)[i] = u < 0.5 ? 0 : 1; break;
      default: ((uint8_t *)a->data)[i] = u < 0.5; break;
      }
    }
    P->in_ptr[k] = a->data;
  }
  /* The reference, in f64, with each element's rounding bound: how far
   * from it a correct f32 kernel may land (nf_interp_run_bounded).  Inputs
   * drawn from [-1, 1) know nothing of a graph's domain: Adam's update,
   * P - lr M2 / (sqrt(V2) / sqrt(c2) + eps), then sees negative second
   * moments, betas and eps, its denominator passes through zero, and
   * where it nearly vanishes (4e-7 of terms of 0.3) the f32 rounding of
   * the denominator alone moves P2 by 0.4%: every f32 kernel, the default
   * included, differed from the f64 reference by 4.5e-3 in relative L2
   * (one element held nearly all of the norm), and nothing was ever
   * tuned.  With the bounds the check judges only what lies beyond the
   * rounding any correct evaluation may make, and skips the elements that
   * no f32 evaluation can determine; the rest is held to rtol as before. */
  int rc = nf_interp_run_bounded(g, P->in, P->ref, P->bnd, err);
  if (rc != NF_OK) {
    memset(P->ref, 0, g->n_outputs * sizeof *P->ref);
    memset(P->bnd, 0, g->n_outputs * sizeof *P->bnd);
    return rc;
  }
  /* a check that judges nothing proves nothing */
  for (uint32_t k = 0; k < g->n_outputs; k++) {
    const nf_array *a = &P->ref[k];
    int64_t judged = 0;
    for (int64_t i = 0; P->bnd[k] && i < a->numel; i++) judged += P->bnd[k][i] < INFINITY;
    if (P->bnd[k] && a->numel > 0 && judged == 0) {
      const nf_tensor *t = &g->tensors[g->outputs[k]];
      nf_buf_printf(err, "output '%s': no element can be checked at the check inputs (every one "
                    "is ill-conditioned there: a divisor or a square root's argument that may "
                    "vanish, an overflow)", t->name ? t->name : "?");
      return NF_EINVAL;
    }
  }
  for (uint32_t k = 0; k < g->n_outputs; k++) {
    const nf_array *a = &P->ref[k];
    P->exp[k] = malloc((a->numel ? a->numel : 1) * sizeof(double));
    if (!P->exp[k]) return NF_ENOMEM;
    for (int64_t i = 0; i < a->numel; i++) {
      double v;
      switch (a->dtype) {
      case NF_F32: v = ((const float *)a->data)[i]; break;
      case NF_F64: v = ((const double *)a->data)[i]; break;
      case NF_I32: v = ((const int32_t *)a->data)[i]; break;
      case NF_I64: v = (double)((const int64_t *)a->data)[i]; break;
      default: v = ((const uint8_t *)a->data)[i]; break;
      }
      P->exp[k][i] = v;
    }
  }
  return NF_OK;
}

/* ---- the run ---- */

void nf_search_record_free(nf_search_record *r) {
  free(r->schedule);
  r->schedule = NULL;
}

void nf_search_result_free(nf_search_result *r) {
  for (size_t i = 0; i < r->n_records; i++) nf_search_record_free(&r->records[i]);
  free(r->records);
  free(r->best_schedule);
  memset(r, 0, sizeof *r);
}

int nf_search_record_feat(const void *data, size_t len, int gpu, float *out) {
  if (!data || (len != NF_FEAT_N * sizeof(float) && (gpu || len != NF_FEAT_N_CPU * sizeof(float))))
    return 0;
  memset(out, 0, NF_FEAT_N * sizeof *out);
  memcpy(out, data, len);
  return 1;
}

static int add_prior(run *R) {
  const nf_search_opts *o = R->o;
  for (size_t i = 0; i < o->n_prior; i++) {
    const nf_search_record *p = &o->prior[i];
    if (!p->schedule) continue;
    if (hset_add(&R->seen, fnv(p->schedule, strlen(p->schedule))) != NF_OK) return NF_ENOMEM;
    int ok = p->status == NF_MEAS_OK && p->time_ms > 0;
    if (nf_cost_model_add(R->model, p->feat, ok ? p->time_ms : 0) != NF_OK) return NF_ENOMEM;
    if (ok && (R->res->best_ms <= 0 || p->time_ms < R->res->best_ms)) {
      R->res->best_ms = p->time_ms;
      free(R->res->best_schedule);
      R->res->best_schedule = strdup(p->schedule);
      if (!R->res->best_schedule) return NF_ENOMEM;
    }
  }
  return NF_OK;
}

/* Other subgraphs' records, for the cost model only (group 0 is this
 * run; theirs follow). */
static int add_corpus(run *R) {
  const nf_search_opts *o = R->o;
  float w = o->corpus_weight > 0 ? (float)o->corpus_weight : 0.5f;
  for (size_t i = 0; i < o->n_corpus; i++) {
    const nf_search_sample *c = &o->corpus[i];
    if (!(c->time_ms > 0) || c->group >= UINT32_MAX - 1) continue;
    int rc = nf_cost_model_add_sample(R->model, c->feat, c->time_ms, c->group + 1, w);
    if (rc != NF_OK) return rc;
    R->res->corpus++;
  }
  R->corpus_kept = R->res->corpus > 0;
  return NF_OK;
}

/* Other subgraphs' records help while this run has few of its own; past
 * CORPUS_UNTIL they only make every retraining slower (4096 of them took
 * 1.8 s, against 0.3 s for 200 of the run's own), so the model forgets
 * them before training. */
#define CORPUS_UNTIL 64

static void maybe_forget_corpus(run *R) {
  if (!R->corpus_kept) return;
  if (nf_cost_model_n_records(R->model) < R->res->corpus + CORPUS_UNTIL) return;
  nf_cost_model_forget_others(R->model);
  R->corpus_kept = 0;
}

/* The best schedules of similar subgraphs, adapted to this graph, as the
 * first trials after the default (a schedule already seen, or that does
 * not apply here, is skipped). */
static int transfer_trials(run *R) {
  const nf_search_opts *o = R->o;
  for (size_t i = 0; i < o->n_transfer && budget_left(R); i++) {
    nf_schedule *s = NULL;
    nf_buf e = NF_BUF_INIT;
    int rc = o->transfer[i] ? nf_search_adapt(R->g, o->transfer[i], &s, &e) : NF_EINVAL;
    nf_buf_free(&e);
    if (rc == NF_ENOMEM) return rc;
    if (rc != NF_OK) {
      R->res->transfer_dropped++;
      continue;
    }
    nf_buf_reset(&R->tmp);
    nf_schedule_print(s, &R->tmp);
    uint64_t h = fnv(nf_buf_str(&R->tmp), R->tmp.len);
    if (hset_has(&R->seen, h)) {
      nf_schedule_free(s);
      continue;
    }
    nf_search_record rec;
    int best = 0;
    rc = measure_new(R, s, h, &rec, &best);
    if (rc != NF_OK && !rec.schedule) return rc;
    R->res->transferred++;
    rc = finish_trial(R, &rec, rc);
    if (rc != NF_OK) return rc;
  }
  return NF_OK;
}

/* The winner's curse: the best of many noisy medians is flattering.  The
 * default, the best few of this run and a resumed run's prior best are
 * measured once more, in turn, and the best and default times become
 * those second measurements. */
#define N_CONFIRM 5

static int confirm(run *R) {
  nf_search_result *r = R->res;
  size_t pick[N_CONFIRM + 1];
  int n = 0;
  if (r->n_records && r->records[0].trial == 0 && r->records[0].status == NF_MEAS_OK)
    pick[n++] = 0;
  for (int k = 0; k < N_CONFIRM; k++) {
    size_t best = (size_t)-1;
    for (size_t i = 1; i < r->n_records; i++) {
      const nf_search_record *x = &r->records[i];
      int taken = 0;
      for (int q = 0; q < n; q++) taken |= pick[q] == i;
      if (x->status != NF_MEAS_OK || taken) continue;
      if (best == (size_t)-1 || x->time_ms < r->records[best].time_ms) best = i;
    }
    if (best == (size_t)-1) break;
    pick[n++] = best;
  }
  double best_ms = 0;
  if (R->meas) nf_measurer_set_cutoff(R->meas, 0);
  /* a resumed run's prior best competes too (pick n: measured, not kept
   * in a record) */
  const nf_search_record *prior = NULL;
  for (size_t i = 0; i < R->o->n_prior; i++) {
    const nf_search_record *p = &R->o->prior[i];
    if (p->schedule && p->status == NF_MEAS_OK && p->time_ms > 0 &&
        (!prior || p->time_ms < prior->time_ms))
      prior = p;
  }
  for (int q = 0; q < n + (prior != NULL); q++) {
    nf_search_record scratch, *x = q < n ? &r->records[pick[q]] : &scratch, again;
    if (q == n) {
      memset(&scratch, 0, sizeof scratch);
      scratch.schedule = prior->schedule;
    }
    nf_schedule *s;
    nf_buf e = NF_BUF_INIT;
    memset(&again, 0, sizeof again);
    int rc = nf_schedule_parse(x->schedule, "record", &s, &e);
    nf_buf_free(&e);
    if (rc == NF_ENOMEM) return rc;
    if (rc != NF_OK) continue;
    R->measuring_default = q < n && pick[q] == 0;
    rc = measure_schedule(R, s, &again);
    R->measuring_default = 0;
    nf_schedule_free(s);
    if (rc != NF_OK) return rc;
    /* a candidate that fails now (it passed before: flaky) is not kept */
    double t = again.status == NF_MEAS_OK ? again.time_ms : 0;
    if (q < n && pick[q] == 0) r->default_ms = t;
    x->confirmed_ms = t;
    if (t > 0 && (best_ms <= 0 || t < best_ms)) {
      best_ms = t;
      char *bs = strdup(x->schedule);
      if (!bs) return NF_ENOMEM;
      free(r->best_schedule);
      r->best_schedule = bs;
    }
  }
  if (best_ms > 0) r->best_ms = best_ms;
  return NF_OK;
}

/* The correctness tolerance: 1e-4 relative L2, widened for long f32
 * sums, whose rounding error against the f64 reference grows with the
 * number of terms N (16 u sqrt(N), u = 2^-24: a loss summed over 1.6 M
 * elements differs by 4e-4 in any f32 order, the default's included). */
static double check_rtol(const nf_graph *g) {
  double n_max = 1;
  for (uint32_t i = 0; i < g->n_stmts; i++) {
    double n = 1;
    for (int v = 0; v < g->stmts[i].n_red; v++) n *= (double)g->stmts[i].red_ext[v];
    if (n > n_max) n_max = n;
  }
  double t = 16 * 0x1p-24 * sqrt(n_max);
  return t > 1e-4 ? t : 1e-4;
}

/* ---- GPU mode ---- */

static int pick(run *R, const int *v, int n) { return v[nf_sk_rand(&R->rng) % (uint64_t)n]; }

/* Draws one statement's knobs (all of them: random; one of them: mutate). */
static void gpu_knob(run *R, uint32_t si, nf_gpu_knobs *k, int all) {
  static const int blocks[] = {64, 128, 256, 512, 1024}, tiles[] = {16, 32, 64, 128},
                   thr[] = {1, 2, 4, 8}, kts[] = {4, 8, 16, 32}, vts[] = {1, 2, 4};
  int form = nf_schedule_gpu_tileable(R->g, si);
  const nf_stmt *st = &R->g->stmts[si];
  int reduces = st->red != NF_RED_NONE && st->n_red > 0 && R->g->tensors[st->out].rank >= 1 &&
                !nf__sched_inlined_by_default(R->g, si);
  int which = all ? -1 : (int)(nf_sk_rand(&R->rng) % (form == 1 ? 9u : reduces ? 2u : 1u));
  if (which < 0 || which == 0) k->block = pick(R, blocks, 5);
  if (form != 1) {
    /* a reduction with outputs: one thread per output, or across threads */
    if (reduces && (which < 0 || which == 1)) {
      static const int forms[] = {-1, 2};
      k->tiled = form == 3 ? forms[nf_sk_rand(&R->rng) % 2] : (nf_sk_rand(&R->rng) % 2 ? 2 : 0);
    }
    return;
  }
  if (which < 0 || which == 1) {
    static const int forms[] = {1, 1, -1, 2};
    k->tiled = pick(R, forms, 4);
  }
  if (which < 0 || which == 2) k->tile_i = pick(R, tiles, 4);
  if (which < 0 || which == 3) k->tile_j = pick(R, tiles, 4);
  if (which < 0 || which == 4) k->thr_i = pick(R, thr, 4);
  if (which < 0 || which == 5) k->thr_j = pick(R, thr, 4);
  if (which < 0 || which == 6) {
    k->kt = pick(R, kts, 4);
    k->stage = nf_sk_rand(&R->rng) % 5 == 0 ? -1 : 0;
  }
  if (which < 0 || which == 7) k->vthread = pick(R, vts, 3);
  /* vector accesses over a thread's outputs along j (where 2 or 4) */
  if (which < 0 || which == 8) k->vec = nf_sk_rand(&R->rng) % 3 == 0 ? -1 : 0;
  /* a tile smaller than a thread's share is the thread's share */
  if (k->tile_i && k->thr_i > k->tile_i) k->thr_i = k->tile_i;
  if (k->tile_j && k->thr_j > k->tile_j) k->thr_j = k->tile_j;
  /* virtual threads divide the thread's outputs along both dimensions
   * (the tiles, powers of two no smaller than the thread's share, are
   * then divided too): 4 with 2 outputs per thread is 2 */
  int ti = k->thr_i > 0 ? k->thr_i : 2, tj = k->thr_j > 0 ? k->thr_j : 2;
  while (k->vthread > 1 && (ti % k->vthread != 0 || tj % k->vthread != 0)) k->vthread /= 2;
}

/* Whether the GPU schedule s lowers and its CUDA C is within the limits;
 * its features into feat.  1 legal, 0 not, < 0 out of memory. */
static int gpu_legal(run *R, const nf_schedule *s, float *feat) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  if (!ctx) return NF_ENOMEM;
  nf_lprog *p;
  nf_buf e = NF_BUF_INIT, src = NF_BUF_INIT;
  int lr = nf_lower(R->g, s, ctx, &p, &e);
  int legal = lr == NF_OK;
  if (legal) {
    nf_cuda_plan plan;
    memset(&plan, 0, sizeof plan);
    legal = nf_cuda_emit(p, &src, &plan, &e) == NF_OK;
    nf_cuda_plan_free(&plan);
    if (legal) nf_features_gpu(p, feat);
  }
  nf_buf_free(&e);
  nf_buf_free(&src);
  nf_ir_ctx_free(ctx);
  return lr == NF_ENOMEM ? NF_ENOMEM : legal;
}

/* A drawn GPU candidate: its knobs, schedule, text and features. */
typedef struct gcand {
  nf_gpu_knobs *k;
  nf_schedule *s;
  char *text;
  uint64_t hash;
  float feat[NF_FEAT_N];
} gcand;

/* Candidates the model ranks per GPU trial (when it is trained). */
#define GPU_POOL 16

/* Draws one legal GPU candidate not seen before (and not in pool[0..n))
 * into *c (its knobs array: n_stmts entries, owned by the caller).
 * 1 found, 0 none in 64 draws, < 0 out of memory. */
static int gpu_draw(run *R, gcand *c, const gcand *pool, int n) {
  uint32_t ns = R->g->n_stmts;
  for (int tries = 0; tries < 64; tries++) {
    int fresh = !R->kbest || R->res->best_ms <= 0 || nf_sk_rand(&R->rng) % 2 == 0;
    if (fresh) {
      memset(c->k, 0, ns * sizeof *c->k);
      for (uint32_t si = 0; si < ns; si++) gpu_knob(R, si, &c->k[si], 1);
    } else {
      memcpy(c->k, R->kbest, ns * sizeof *c->k);
      uint32_t si = (uint32_t)(nf_sk_rand(&R->rng) % ns);
      gpu_knob(R, si, &c->k[si], 0);
    }
    nf_schedule *s = NULL;
    int rc = nf_schedule_gpu(R->g, c->k, &s);
    if (rc == NF_ENOMEM) return rc;
    if (rc != NF_OK) continue;
    nf_buf_reset(&R->tmp);
    nf_schedule_print(s, &R->tmp);
    uint64_t h = fnv(nf_buf_str(&R->tmp), R->tmp.len);
    int dup = hset_has(&R->seen, h);
    for (int i = 0; i < n && !dup; i++) dup = pool[i].hash == h;
    int lg = dup ? 0 : gpu_legal(R, s, c->feat);
    if (lg <= 0) {
      nf_schedule_free(s);
      if (lg < 0) return lg;
      if (!dup && hset_add(&R->seen, h) != NF_OK) return NF_ENOMEM; /* illegal: never again */
      continue;
    }
    if (!(c->text = strdup(nf_buf_str(&R->tmp)))) {
      nf_schedule_free(s);
      return NF_ENOMEM;
    }
    c->s = s;
    c->hash = h;
    return 1;
  }
  return 0;
}

/* One GPU candidate measured as the next trial (or none found: *found
 * 0).  Once the cost model is trained (on this run's measurements and
 * the prior records), 4 trials in 5 measure the best-scored of up to
 * GPU_POOL fresh candidates, the fifth a random one (exploration); the
 * candidates not measured stay unseen. */
static int gpu_trial(run *R, nf_gpu_knobs *k, int *found) {
  uint32_t n = R->g->n_stmts ? R->g->n_stmts : 1;
  *found = 0;
  int use_model = !R->o->random_search && nf_cost_model_trained(R->model);
  int want = use_model && nf_sk_rand(&R->rng) % 5 != 0 ? GPU_POOL : 1;
  gcand pool[GPU_POOL];
  memset(pool, 0, sizeof pool);
  nf_gpu_knobs *kn = calloc((size_t)want * n, sizeof *kn);
  int rc = kn ? NF_OK : NF_ENOMEM, got = 0;
  for (int i = 0; rc == NF_OK && i < want; i++) {
    pool[got].k = kn + (size_t)got * n;
    int r = gpu_draw(R, &pool[got], pool, got);
    if (r < 0) rc = r;
    else if (r == 0) break;
    else got++;
  }
  int pick = 0;
  if (rc == NF_OK && got > 1) {
    float *f = calloc((size_t)got * NF_FEAT_N, sizeof *f), *sc = calloc((size_t)got, sizeof *sc);
    rc = f && sc ? NF_OK : NF_ENOMEM;
    for (int i = 0; rc == NF_OK && i < got; i++)
      memcpy(f + (size_t)i * NF_FEAT_N, pool[i].feat, NF_FEAT_N * sizeof *f);
    if (rc == NF_OK && nf_cost_model_predict(R->model, f, (size_t)got, sc) == NF_OK)
      for (int i = 1; i < got; i++)
        if (sc[i] > sc[pick]) pick = i;
    free(f);
    free(sc);
  }
  nf_search_record rec;
  memset(&rec, 0, sizeof rec);
  if (rc == NF_OK && got > 0) {
    gcand *c = &pool[pick];
    memcpy(k, c->k, n * sizeof *k);
    rec.schedule = c->text;
    c->text = NULL;
    memcpy(rec.feat, c->feat, sizeof rec.feat);
    rc = hset_add(&R->seen, c->hash);
    if (R->meas) nf_measurer_set_cutoff(R->meas, R->res->best_ms > 0 ? 2 * R->res->best_ms : 0);
    if (rc == NF_OK) rc = measure_schedule(R, c->s, &rec);
  }
  for (int i = 0; i < got; i++) {
    nf_schedule_free(pool[i].s);
    free(pool[i].text);
  }
  free(kn);
  if (rc != NF_OK || got == 0) {
    free(rec.schedule);
    return rc;
  }
  *found = 1;
  int best = 0;
  rc = count_learnt(R, &rec, &best);
  if (best) memcpy(R->kbest, k, n * sizeof *k);
  return finish_trial(R, &rec, rc);
}

/* Whether a worker can open the GPU, before the reference (which can take
 * a minute on a large subgraph) is computed for nothing: a measurer on a
 * one-element problem.  NF_OK, or NF_EIO with the worker's reason. */
static int gpu_probe(const nf_measure_opts *mo, nf_buf *err) {
  static const float one = 1;
  static const double ref = 1;
  const void *in[1] = {&one};
  const double *ex[1] = {&ref};
  nf_measure_tensor t[2] = {{NF_F32, 1, {1}}, {NF_F32, 1, {1}}};
  nf_measure_problem pb = {.n_inputs = 1, .n_outputs = 1, .tensors = t, .check_inputs = in,
                           .expected = ex};
  nf_measurer *m = NULL;
  int rc = nf_measurer_new(mo, &pb, &m, err);
  nf_measurer_free(m);
  return rc;
}

static int gpu_rounds(run *R) {
  uint32_t n = R->g->n_stmts ? R->g->n_stmts : 1;
  nf_gpu_knobs *k = calloc(n, sizeof *k);
  R->kbest = calloc(n, sizeof *R->kbest); /* the default's knobs: all 0 */
  int rc = k && R->kbest ? NF_OK : NF_ENOMEM;
  while (rc == NF_OK && budget_left(R)) {
    int found = 0;
    rc = gpu_trial(R, k, &found);
    if (!found) break; /* 64 draws in a row seen or illegal: the space is exhausted */
    /* the model learns from every 8 measurements */
    if (rc == NF_OK && !R->o->random_search && R->res->trials % 8 == 0) {
      maybe_forget_corpus(R);
      nf_buf e = NF_BUF_INIT;
      nf_cost_model_train(R->model, &e); /* too few successes is fine: random */
      nf_buf_free(&e);
    }
  }
  free(k);
  free(R->kbest);
  R->kbest = NULL;
  return rc;
}

int nf_search_run(const nf_graph *g, const nf_search_opts *o, nf_search_result *res,
                  nf_buf *err) {
  run R;
  problem P;
  int rc;
  memset(&R, 0, sizeof R);
  memset(res, 0, sizeof *res);
  R.g = g;
  R.o = o;
  R.res = res;
  R.err = err;
  R.t0 = now_s();
  R.rng = (o->seed ? o->seed : 1) * 0x2545f4914f6cdd1dull | 1;
  R.tmp = (nf_buf)NF_BUF_INIT;
  for (uint32_t i = 0; i < g->n_stmts; i++) res->flops += (double)nf_stmt_flops(g, i);
  nf_measure_opts mo = o->measure;
  if (o->cuda_sm > 0) mo.gpu = 1;
  memset(&P, 0, sizeof P);
  rc = o->cuda_sm > 0 && !o->measure_hook ? gpu_probe(&mo, err) : NF_OK;
  if (rc == NF_OK) rc = problem_make(g, o->seed ? o->seed : 1, &P, err);
  nf_sched_target starget = nf_cpu_sched_target(&o->target);
  if (rc == NF_OK) rc = nf_sk_space_new(g, &starget, &R.sp);
  if (rc == NF_OK) {
    R.model = nf_cost_model_new(o->seed ? o->seed : 1, 1);
    if (!R.model) rc = NF_ENOMEM;
  }
  if (rc == NF_OK && !o->measure_hook) {
    nf_measure_problem mp = {.n_inputs = P.n_in,
                             .n_outputs = P.n_out,
                             .tensors = P.t,
                             .check_inputs = (const void *const *)P.in_ptr,
                             .expected = (const double *const *)P.exp,
                             .bound = (const double *const *)P.bnd,
                             .rtol = check_rtol(g)};
    rc = nf_measurer_new(&mo, &mp, &R.meas, err);
  }
  /* the default schedule, measured first */
  if (rc == NF_OK) {
    nf_schedule *s;
    rc = o->cuda_sm > 0 ? nf_schedule_default_gpu(g, NF_GPU_DEFAULT_THREADS, &s)
                        : nf_schedule_default_for(g, &starget, &s);
    if (rc == NF_OK) {
      nf_search_record rec;
      memset(&rec, 0, sizeof rec);
      nf_buf_reset(&R.tmp);
      nf_schedule_print(s, &R.tmp);
      rec.schedule = strdup(nf_buf_str(&R.tmp));
      rc = rec.schedule ? hset_add(&R.seen, fnv(rec.schedule, R.tmp.len)) : NF_ENOMEM;
      R.measuring_default = 1;
      if (rc == NF_OK) rc = measure_schedule(&R, s, &rec);
      R.measuring_default = 0;
      nf_schedule_free(s);
      if (rc == NF_OK) {
        rec.at_s = now_s() - R.t0;
        if (rec.status == NF_MEAS_OK) {
          res->default_ms = res->best_ms = rec.time_ms;
          res->best_schedule = strdup(rec.schedule);
          if (!res->best_schedule) rc = NF_ENOMEM;
        }
        if (nf_cost_model_add(R.model, rec.feat, rec.status == NF_MEAS_OK ? rec.time_ms : 0))
          rc = NF_ENOMEM;
      }
      if (rc == NF_OK) rc = push_record(&R, &rec);
      if (rc != NF_OK) free(rec.schedule);
    }
  }
  if (rc == NF_OK) rc = add_prior(&R);
  if (rc == NF_OK) rc = add_corpus(&R);
  if (rc == NF_OK && o->cuda_sm <= 0) rc = transfer_trials(&R);
  if (rc == NF_OK && nf_cost_model_n_records(R.model) >= 2 && !o->random_search) {
    nf_buf e = NF_BUF_INIT;
    nf_cost_model_train(R.model, &e); /* too few successes is fine: random */
    nf_buf_free(&e);
  }
  if (rc == NF_OK && o->cuda_sm > 0) rc = gpu_rounds(&R);
  int batch = o->cuda_sm > 0 ? 0 : o->batch > 0 ? o->batch : 16;
  cand *round = batch ? calloc((size_t)batch, sizeof *round) : NULL;
  if (batch && !round) rc = NF_ENOMEM;
  for (int i = 0; rc == NF_OK && i < batch; i++) rc = nf_sk_point_init(R.sp, &round[i].pt);
  while (rc == NF_OK && batch && nf_sk_space_n_tunable(R.sp) > 0 && budget_left(&R)) {
    int n = 0;
    rc = pick_round(&R, round, batch, &n);
    if (rc != NF_OK || n == 0) break; /* the space is exhausted */
    for (int i = 0; rc == NF_OK && i < n && budget_left(&R); i++) rc = trial(&R, &round[i]);
    if (rc == NF_OK && !o->random_search) {
      maybe_forget_corpus(&R);
      nf_buf e = NF_BUF_INIT;
      nf_cost_model_train(R.model, &e);
      nf_buf_free(&e);
    }
  }
  for (int i = 0; round && i < batch; i++) cand_free(&round[i]);
  free(round);
  if (rc == NF_OK && res->trials > 0) rc = confirm(&R);
  res->seconds = now_s() - R.t0;
  for (size_t i = 0; i < R.n_measured; i++) cand_free(&R.measured[i]);
  free(R.measured);
  free(R.seen.v);
  nf_measurer_free(R.meas);
  nf_cost_model_free(R.model);
  nf_sk_space_free(R.sp);
  problem_free(&P);
  nf_buf_free(&R.tmp);
  if (rc != NF_OK) nf_search_result_free(res);
  return rc;
}
