/* sketch.c - the search space: sketches from the graph's structure,
 * random annotation, mutation, crossover, and points -> schedules
 * (nf_sketch.h has the rules).
 *
 * Limits: the register tile (the S2 level) is kept to at most 96
 * elements and 16 per non-vector variable, because the backend fully
 * unrolls it and compile time grows with it; fused parallel loops are at
 * most three; only tensors read directly by a statement are packed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_sketch.h"
#include "nf_status.h"

#define MAX_TILE 96    /* elements of the S2 (register) tile: 12 of the 16 AVX2
                          registers, the rest for operands */
#define MAX_ROW 16     /* S2 factor of a non-vector variable */
#define MAX_MID 64     /* S1 factor */
#define MAX_RED 512    /* R1 factor */
#define MAX_CANDS 96

typedef struct sk_stmt {
  uint8_t base;  /* nf_sk_role: FIXED, INLINE or NEST */
  int consumer;  /* the statement that may take it as a fused epilogue, -1 */
  int rank, n_red;
  int64_t ext[NF_MAX_VARS]; /* output shape, then reduction extents */
  char nm[NF_MAX_VARS][NF_SCHED_NAME];
  int n_reads;
  uint32_t read_t[NF_SK_MAX_READS]; /* tensor ids that may be packed */
  int read_prod[NF_SK_MAX_READS];   /* their producing statement, -1: input */
} sk_stmt;

struct nf_sk_space {
  const nf_graph *g;
  uint32_t n;
  sk_stmt *st;
  int n_tunable;
  nf_schedule *def; /* the default schedule (NF_SK_DEFAULT) */
  uint32_t p_default; /* chance in 1/1024 that a sampled statement keeps it */
};

uint64_t nf_sk_rand(uint64_t *s) {
  uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545f4914f6cdd1dull;
}

static int64_t pick(uint64_t *r, const int64_t *v, int n) { return v[nf_sk_rand(r) % (uint64_t)n]; }

/* Divisors of e up to maxv and powers of two up to min(e, maxv), sorted. */
static int cands(int64_t e, int64_t maxv, int64_t *out) {
  int n = 0;
  if (e < 1) e = 1;
  for (int64_t d = 1; d <= e && d <= maxv && n < MAX_CANDS; d++)
    if (e % d == 0 || ((d & (d - 1)) == 0)) out[n++] = d;
  return n;
}

/* ---- analysis ---- */

typedef struct reads_acc {
  int n;
  uint32_t t[16];
} reads_acc;

static void reads_fn(const nf_expr *e, void *user) {
  reads_acc *u = user;
  if (e->op != NF_OP_ACCESS || u->n == 16) return;
  for (int k = 0; k < u->n; k++)
    if (u->t[k] == e->u.tensor) return;
  u->t[u->n++] = e->u.tensor;
}

static int producer_of(const nf_graph *g, uint32_t t) {
  for (uint32_t i = 0; i < g->n_stmts; i++)
    if (g->stmts[i].out == t) return (int)i;
  return -1;
}

static int name_ok(const char *s) {
  if (!s || !*s || strlen(s) >= NF_SCHED_NAME) return 0;
  for (const char *c = s; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
          *c == '_' || *c == '.' || *c == '[' || *c == ']'))
      return 0;
  return 1;
}

int nf_sk_space_new(const nf_graph *g, const nf_sched_target *t, nf_sk_space **out) {
  nf_sk_space *sp = calloc(1, sizeof *sp);
  *out = NULL;
  if (!sp) return NF_ENOMEM;
  sp->g = g;
  sp->n = g->n_stmts;
  sp->st = calloc(g->n_stmts ? g->n_stmts : 1, sizeof *sp->st);
  if (!sp->st) {
    free(sp);
    return NF_ENOMEM;
  }
  for (uint32_t i = 0; i < g->n_stmts; i++) {
    const nf_stmt *s = &g->stmts[i];
    const nf_tensor *t = &g->tensors[s->out];
    sk_stmt *k = &sp->st[i];
    k->consumer = -1;
    k->rank = t->rank;
    k->n_red = s->n_red;
    for (int v = 0; v < t->rank; v++) k->ext[v] = t->shape[v];
    for (int v = 0; v < s->n_red; v++) k->ext[t->rank + v] = s->red_ext[v];
    for (int v = 0; v < t->rank + s->n_red; v++) nf__sched_var_name(s, v, k->nm[v]);
    if (nf__sched_inlined_by_default(g, i))
      k->base = NF_SK_INLINE;
    else if (t->rank == 0)
      k->base = NF_SK_FIXED;
    else
      k->base = NF_SK_NEST;
  }
  for (uint32_t i = 0; i < g->n_stmts; i++) {
    sk_stmt *k = &sp->st[i];
    if (k->base != NF_SK_NEST) continue;
    sp->n_tunable++;
    reads_acc u = {0};
    nf_expr_visit(g->stmts[i].rhs, reads_fn, &u);
    for (int q = 0; q < u.n && k->n_reads < NF_SK_MAX_READS; q++) {
      int pr = producer_of(g, u.t[q]);
      if (pr >= 0 && sp->st[pr].base == NF_SK_INLINE) continue;
      if (!name_ok(g->tensors[u.t[q]].name)) continue;
      k->read_t[k->n_reads] = u.t[q];
      k->read_prod[k->n_reads++] = pr;
    }
    /* a fused epilogue: a local reduction read once by a later
     * elementwise statement of the same rank that keeps its own nest */
    const nf_stmt *s = &g->stmts[i];
    if (s->n_red == 0 || g->tensors[s->out].kind != NF_T_LOCAL ||
        !nf__sched_used_once(g, s->out))
      continue;
    for (uint32_t c = i + 1; c < g->n_stmts; c++) {
      reads_acc r = {0};
      nf_expr_visit(g->stmts[c].rhs, reads_fn, &r);
      int reads = 0;
      for (int q = 0; q < r.n; q++) reads |= r.t[q] == s->out;
      if (!reads) continue;
      if (sp->st[c].base == NF_SK_NEST && g->stmts[c].n_red == 0 &&
          g->tensors[g->stmts[c].out].rank == k->rank)
        k->consumer = (int)c;
      break;
    }
  }
  if (nf_schedule_default_for(g, t, &sp->def) != NF_OK) {
    nf_sk_space_free(sp);
    return NF_ENOMEM;
  }
  /* about two statements tuned per point; one of ten single statements
   * keeps the default */
  sp->p_default = sp->n_tunable > 2 ? (uint32_t)(1024 - 2048 / sp->n_tunable) : 102;
  *out = sp;
  return NF_OK;
}

void nf_sk_space_free(nf_sk_space *sp) {
  if (!sp) return;
  nf_schedule_free(sp->def);
  free(sp->st);
  free(sp);
}

int nf_sk_space_n_tunable(const nf_sk_space *sp) { return sp->n_tunable; }

/* ---- shape ---- */

typedef struct shape_acc {
  const nf_graph *g;
  uint64_t h[2];
} shape_acc;

static void mix(shape_acc *a, uint64_t v) {
  for (int k = 0; k < 2; k++) {
    uint64_t x = a->h[k] ^ (v + (uint64_t)k * 0x9e3779b97f4a7c15ull);
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    a->h[k] = x * (k ? 0xc4ceb9fe1a85ec53ull : 0x100000001b3ull) + 0x632be59bd9b4e019ull;
  }
}

static void var_mask_fn(const nf_expr *e, void *user) {
  if (e->op == NF_OP_VAR && e->u.var < 64) *(uint64_t *)user |= 1ull << e->u.var;
}

/* A tensor by its place in the graph: the k-th input, or the output of
 * statement k. */
static uint64_t tensor_place(const nf_graph *g, uint32_t t) {
  for (uint32_t k = 0; k < g->n_inputs; k++)
    if (g->inputs[k] == t) return 0x100000000ull | k;
  int p = producer_of(g, t);
  return p >= 0 ? 0x200000000ull | (uint32_t)p : 0x300000000ull;
}

static void access_fn(const nf_expr *e, void *user) {
  shape_acc *a = user;
  if (e->op != NF_OP_ACCESS) return;
  mix(a, tensor_place(a->g, e->u.tensor));
  mix(a, e->n_args);
  for (uint16_t q = 0; q < e->n_args; q++) {
    uint64_t m = 0;
    nf_expr_visit(e->args[q], var_mask_fn, &m);
    mix(a, m);
  }
}

void nf_sk_shape(const nf_sk_space *sp, uint8_t sig[16], float *desc, size_t max,
                 size_t *n_desc) {
  const nf_graph *g = sp->g;
  shape_acc a = {g, {0x6e66736b65746368ull, 0x7368617065763100ull}};
  size_t n = 0;
  mix(&a, sp->n);
  mix(&a, g->n_inputs);
  mix(&a, g->n_outputs);
  for (uint32_t i = 0; i < sp->n; i++) {
    const sk_stmt *k = &sp->st[i];
    const nf_stmt *s = &g->stmts[i];
    mix(&a, k->base);
    mix(&a, (uint64_t)(k->consumer + 1));
    mix(&a, (uint64_t)k->rank);
    mix(&a, (uint64_t)k->n_red);
    mix(&a, s->red);
    mix(&a, g->tensors[s->out].kind);
    mix(&a, g->tensors[s->out].dtype);
    nf_expr_visit(s->rhs, access_fn, &a);
    if (k->base != NF_SK_NEST) continue;
    for (int v = 0; v < k->rank + k->n_red && n < max; v++)
      desc[n++] = (float)log2((double)(k->ext[v] > 1 ? k->ext[v] : 1));
  }
  for (int q = 0; q < 2; q++)
    for (int b = 0; b < 8; b++) sig[q * 8 + b] = (uint8_t)(a.h[q] >> (8 * b));
  *n_desc = n;
}

/* ---- points ---- */

int nf_sk_point_init(const nf_sk_space *sp, nf_sk_point *p) {
  p->n = sp->n;
  p->g = calloc(sp->n ? sp->n : 1, sizeof *p->g);
  if (!p->g) return NF_ENOMEM;
  for (uint32_t i = 0; i < sp->n; i++) p->g[i].role = sp->st[i].base;
  return NF_OK;
}

void nf_sk_point_free(nf_sk_point *p) {
  free(p->g);
  p->g = NULL;
  p->n = 0;
}

void nf_sk_point_copy(nf_sk_point *dst, const nf_sk_point *src) {
  memcpy(dst->g, src->g, src->n * sizeof *src->g);
}

/* powers of two: <24 x float> and <48 x float> legalise badly (a 4 x 24
 * tile ran at a sixth of 4 x 32) */
static const int64_t vec_f[] = {8, 16, 32, 64};
static const int64_t row_f[] = {1, 2, 3, 4, 6, 8, 12, 16};

static void sample_s2(const sk_stmt *k, uint64_t *r, nf_sk_gene *ge, int v) {
  int64_t e = k->ext[v], f;
  if (v == k->rank - 1) {
    /* vector widths up to the extent (a whole 56 would be a <56 x float>) */
    int nv = 0;
    while (nv < 4 && vec_f[nv] <= e) nv++;
    f = nv ? pick(r, vec_f, nv) : e;
  } else
    f = pick(r, row_f, 8);
  if (f > e) f = e;
  ge->f[v][1] = f;
}

static void sample_s1(const sk_stmt *k, uint64_t *r, nf_sk_gene *ge, int v) {
  int64_t c[MAX_CANDS], f2 = ge->f[v][1] > 0 ? ge->f[v][1] : 1;
  int n = cands((k->ext[v] + f2 - 1) / f2, MAX_MID, c);
  ge->f[v][0] = pick(r, c, n);
}

static void sample_red(const sk_stmt *k, uint64_t *r, nf_sk_gene *ge, int v) {
  int64_t c[MAX_CANDS];
  int n = cands(k->ext[k->rank + v], MAX_RED, c);
  ge->f[k->rank + v][0] = pick(r, c, n);
}

/* Shrinks the register tile to MAX_TILE elements (non-vector rows
 * first). */
static void fit_tile(const sk_stmt *k, nf_sk_gene *ge) {
  for (;;) {
    int64_t prod = ge->rf ? ge->f[k->rank + ge->rf - 1][1] : 1;
    int big = -1;
    for (int v = 0; v < k->rank; v++) {
      prod *= ge->f[v][1] > 0 ? ge->f[v][1] : 1;
      if (v < k->rank - 1 && ge->f[v][1] > 1 && (big < 0 || ge->f[v][1] > ge->f[big][1])) big = v;
    }
    if (prod <= MAX_TILE) return;
    if (big < 0) big = k->rank - 1;
    if (big < 0 || ge->f[big][1] <= 1) return; /* the lanes alone */
    ge->f[big][1] = ge->f[big][1] / 2 > 0 ? ge->f[big][1] / 2 : 1;
  }
}

/* rfactor: a reduction variable of at least 8 iterations and its lane
 * count, or none; the register tile shrunk to fit the lanes. */
static void sample_rf(const sk_stmt *k, uint64_t *r, nf_sk_gene *ge) {
  static const int64_t lanes[] = {4, 8, 16};
  int cand[NF_MAX_VARS], nc = 0;
  ge->rf = 0;
  for (int v = 0; v < k->n_red; v++)
    if (k->ext[k->rank + v] >= 8) cand[nc++] = v;
  if (nc == 0 || k->rank >= NF_MAX_RANK) return;
  int v = cand[nf_sk_rand(r) % (uint64_t)nc];
  int64_t w = pick(r, lanes, k->ext[k->rank + v] >= 16 ? 3 : 2);
  ge->rf = (uint8_t)(1 + v);
  ge->f[k->rank + v][1] = w;
  /* tile x lanes within MAX_TILE */
  for (int guard = 0; guard < 64; guard++) {
    int64_t prod = w;
    int big = -1;
    for (int q = 0; q < k->rank; q++) {
      prod *= ge->f[q][1] > 0 ? ge->f[q][1] : 1;
      if (ge->f[q][1] > 1 && (big < 0 || ge->f[q][1] > ge->f[big][1])) big = q;
    }
    if (prod <= MAX_TILE || big < 0) return;
    ge->f[big][1] /= 2;
  }
}

static void sample_gene(const nf_sk_space *sp, uint32_t i, uint64_t *r, nf_sk_gene *ge) {
  const sk_stmt *k = &sp->st[i];
  memset(ge, 0, sizeof *ge);
  ge->role = k->base;
  if (k->base != NF_SK_NEST) return;
  int keep_default = nf_sk_rand(r) % 1024 < sp->p_default;
  if (k->consumer >= 0 && nf_sk_rand(r) % 2) {
    ge->role = NF_SK_AT;
    ge->at_level = (uint8_t)(nf_sk_rand(r) % 2);
  }
  ge->tmpl = k->n_red ? (uint8_t)(nf_sk_rand(r) % 2) : 0;
  for (int v = 0; v < k->rank; v++) {
    sample_s2(k, r, ge, v);
    sample_s1(k, r, ge, v);
  }
  fit_tile(k, ge);
  for (int v = 0; v < k->n_red; v++) sample_red(k, r, ge, v);
  if (k->n_red && nf_sk_rand(r) % 3 == 0) sample_rf(k, r, ge);
  ge->n_par = (uint8_t)(nf_sk_rand(r) % 8 == 0 ? 0 : 1 + nf_sk_rand(r) % 3);
  ge->vec = nf_sk_rand(r) % 10 != 0;
  for (int q = 0; q < k->n_reads; q++)
    ge->pack[q] = (uint8_t)(nf_sk_rand(r) % 2 ? 0 : 1 + nf_sk_rand(r) % 3);
  /* the genes are drawn either way (a later mutation may switch to them) */
  if (keep_default) ge->role = NF_SK_DEFAULT;
}

void nf_sk_sample(const nf_sk_space *sp, uint64_t *rng, nf_sk_point *out) {
  for (uint32_t i = 0; i < sp->n; i++) sample_gene(sp, i, rng, &out->g[i]);
}

static int pick_tunable(const nf_sk_space *sp, uint64_t *r) {
  if (sp->n_tunable == 0) return -1;
  int want = (int)(nf_sk_rand(r) % (uint64_t)sp->n_tunable);
  for (uint32_t i = 0; i < sp->n; i++)
    if (sp->st[i].base == NF_SK_NEST && want-- == 0) return (int)i;
  return -1;
}

void nf_sk_mutate(const nf_sk_space *sp, uint64_t *rng, const nf_sk_point *src,
                  nf_sk_point *out) {
  nf_sk_point_copy(out, src);
  int n_changes = 1 + (int)(nf_sk_rand(rng) % 3);
  for (int c = 0; c < n_changes; c++) {
    int i = pick_tunable(sp, rng);
    if (i < 0) return;
    const sk_stmt *k = &sp->st[i];
    nf_sk_gene *ge = &out->g[i];
    int v = (int)(nf_sk_rand(rng) % (uint64_t)k->rank);
    if (ge->role == NF_SK_DEFAULT || nf_sk_rand(rng) % 10 == 0) {
      /* switch between the default's primitives and a tiled nest */
      if (ge->role == NF_SK_DEFAULT)
        ge->role = NF_SK_NEST;
      else
        ge->role = NF_SK_DEFAULT;
      continue;
    }
    switch (nf_sk_rand(rng) % 9) {
    case 0: case 1: /* register tile of one variable */
      sample_s2(k, rng, ge, v);
      fit_tile(k, ge);
      break;
    case 2: case 3: /* middle tile */
      sample_s1(k, rng, ge, v);
      break;
    case 4: /* reduction block */
      if (k->n_red) sample_red(k, rng, ge, (int)(nf_sk_rand(rng) % (uint64_t)k->n_red));
      else sample_s1(k, rng, ge, v);
      break;
    case 5:
      if (k->n_red && nf_sk_rand(rng) % 2)
        ge->tmpl ^= 1;
      else if (k->n_red && ge->rf)
        ge->rf = 0;
      else if (k->n_red)
        sample_rf(k, rng, ge);
      break;
    case 6:
      ge->n_par = (uint8_t)(nf_sk_rand(rng) % 4);
      ge->vec ^= nf_sk_rand(rng) % 4 == 0;
      break;
    case 7:
      if (k->n_reads) {
        int q = (int)(nf_sk_rand(rng) % (uint64_t)k->n_reads);
        ge->pack[q] = (uint8_t)(nf_sk_rand(rng) % 4);
      }
      break;
    default:
      if (k->consumer >= 0) {
        if (ge->role == NF_SK_AT && nf_sk_rand(rng) % 2)
          ge->role = NF_SK_NEST;
        else {
          ge->role = NF_SK_AT;
          ge->at_level = (uint8_t)(nf_sk_rand(rng) % 2);
        }
      }
      break;
    }
  }
}

void nf_sk_crossover(const nf_sk_space *sp, uint64_t *rng, const nf_sk_point *a,
                     const nf_sk_point *b, nf_sk_point *out) {
  for (uint32_t i = 0; i < sp->n; i++) out->g[i] = nf_sk_rand(rng) % 2 ? a->g[i] : b->g[i];
}

/* ---- point -> schedule ---- */

typedef struct loopref {
  char name[NF_SCHED_NAME];
  int64_t ext;
  int spatial;
} loopref;

/* The loops of one tiled statement: S0 S1 S2 per spatial variable, R0
 * R1 per reduction variable ("" when absent), and the splits that make
 * them. */
typedef struct nest_plan {
  loopref s[3][NF_MAX_VARS], r[2][NF_MAX_VARS];
  int n_split;
  struct {
    char name[NF_SCHED_NAME];
    int64_t f;
  } split[2 * NF_MAX_VARS];
  loopref lanes; /* rfactor: the lane loop, innermost ("" none) */
  loopref order[3 * NF_MAX_VARS + 1];
  int n_order;
  char fused[NF_SCHED_NAME]; /* the parallel loop ("" none) */
  int n_fused;               /* leading loops fused into it */
} nest_plan;

static void set_ref(loopref *l, const char *base, const char *suffix, int64_t ext, int spatial) {
  nf__sched_cat(l->name, base, suffix);
  l->ext = ext;
  l->spatial = spatial;
}

static void add_split(nest_plan *pl, const char *name, int64_t f) {
  snprintf(pl->split[pl->n_split].name, NF_SCHED_NAME, "%s", name);
  pl->split[pl->n_split++].f = f;
}

static void plan_nest(const sk_stmt *k, const nf_sk_gene *ge, const int64_t *ext, nest_plan *pl) {
  memset(pl, 0, sizeof *pl);
  for (int v = 0; v < k->rank; v++) {
    int64_t e = ext[v], f2 = ge->f[v][1], f1 = ge->f[v][0];
    char rest[NF_SCHED_NAME];
    int64_t erest;
    if (f2 < 1) f2 = 1;
    if (f1 < 1) f1 = 1;
    if (f2 >= e) {
      set_ref(&pl->s[2][v], k->nm[v], "", e, 1);
      continue;
    }
    if (f2 > 1) {
      add_split(pl, k->nm[v], f2);
      set_ref(&pl->s[2][v], k->nm[v], ".i", f2, 1);
      nf__sched_cat(rest, k->nm[v], ".o");
      erest = (e + f2 - 1) / f2;
    } else {
      nf__sched_cat(rest, k->nm[v], "");
      erest = e;
    }
    if (f1 >= erest) {
      set_ref(&pl->s[1][v], rest, "", erest, 1);
    } else if (f1 > 1) {
      add_split(pl, rest, f1);
      set_ref(&pl->s[0][v], rest, ".o", (erest + f1 - 1) / f1, 1);
      set_ref(&pl->s[1][v], rest, ".i", f1, 1);
    } else {
      set_ref(&pl->s[0][v], rest, "", erest, 1);
    }
  }
  for (int v = 0; v < k->n_red; v++) {
    const char *nm = k->nm[k->rank + v];
    int64_t e = ext[k->rank + v], f = ge->f[k->rank + v][0];
    char rest[NF_SCHED_NAME];
    if (ge->rf == v + 1) {
      /* the lanes: nm.i innermost (after S2); nm.o takes nm's place */
      int64_t w = ge->f[k->rank + v][1] > 1 ? ge->f[k->rank + v][1] : 8;
      add_split(pl, nm, w);
      set_ref(&pl->lanes, nm, ".i", w, 0);
      nf__sched_cat(rest, nm, ".o");
      nm = rest;
      e = (e + w - 1) / w;
      if (f > e) f = e;
    }
    if (ge->tmpl == 0 || f >= e) {
      set_ref(&pl->r[ge->tmpl == 0 ? 0 : 1][v], nm, "", e, 0);
    } else if (f > 1) {
      add_split(pl, nm, f);
      set_ref(&pl->r[0][v], nm, ".o", (e + f - 1) / f, 0);
      set_ref(&pl->r[1][v], nm, ".i", f, 0);
    } else {
      set_ref(&pl->r[0][v], nm, "", e, 0);
    }
  }
  /* tmpl 0: S0 S1 R S2; tmpl 1: S0 R0 S1 R1 S2 */
  static const int seq0[][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 2}};
  static const int seq1[][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}};
  const int(*seq)[2] = ge->tmpl ? seq1 : seq0;
  for (int q = 0; q < 5; q++) {
    int is_red = seq[q][0], lv = seq[q][1];
    int nv = is_red ? k->n_red : k->rank;
    for (int v = 0; v < nv; v++) {
      const loopref *l = is_red ? &pl->r[lv][v] : &pl->s[lv][v];
      if (l->name[0]) pl->order[pl->n_order++] = *l;
    }
  }
  if (pl->lanes.name[0]) pl->order[pl->n_order++] = pl->lanes;
}

/* The last present loop of spatial level lv (or R0 when red), or NULL. */
static const loopref *last_of(const nest_plan *pl, const sk_stmt *k, int red, int lv) {
  const loopref *l = NULL;
  int nv = red ? k->n_red : k->rank;
  for (int v = 0; v < nv; v++) {
    const loopref *c = red ? &pl->r[lv][v] : &pl->s[lv][v];
    if (c->name[0]) l = c;
  }
  return l;
}

/* Fuses the first n_par leading spatial loops (names at most 63 bytes). */
static void plan_parallel(nest_plan *pl, int n_par) {
  int lead = 0;
  while (lead < pl->n_order && pl->order[lead].spatial) lead++;
  if (n_par > lead) n_par = lead;
  if (n_par > 3) n_par = 3;
  pl->fused[0] = 0;
  pl->n_fused = 0;
  if (n_par < 1) return;
  char name[NF_SCHED_NAME];
  snprintf(name, sizeof name, "%s", pl->order[0].name);
  int used = 1;
  for (int q = 1; q < n_par; q++) {
    char nx[2 * NF_SCHED_NAME + 16];
    snprintf(nx, sizeof nx, "%s.%s.fused", name, pl->order[q].name);
    if (strlen(nx) >= NF_SCHED_NAME) break;
    memcpy(name, nx, strlen(nx) + 1);
    used++;
  }
  memcpy(pl->fused, name, sizeof name);
  pl->n_fused = used;
}

/* The loop's name after fusion. */
static const char *renamed(const nest_plan *pl, const loopref *l) {
  for (int q = 0; q < pl->n_fused; q++)
    if (strcmp(pl->order[q].name, l->name) == 0) return pl->fused;
  return l->name;
}

static int add_item(nf_schedule *s, int kind, int st, int st2, const char *a, const char *b,
                    int64_t f) {
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = (uint8_t)kind;
  it.stmt = st;
  it.stmt2 = st2;
  if (a) {
    snprintf(it.names[0], NF_SCHED_NAME, "%s", a);
    it.n_names = 1;
  }
  if (b) {
    snprintf(it.names[1], NF_SCHED_NAME, "%s", b);
    it.n_names = 2;
  }
  it.factor = f;
  return nf_schedule_add(s, &it);
}

/* The consumer's loop a fused epilogue producer is computed at, and the
 * producer's region extents (identity access assumed; other accesses
 * only make the estimate loose, lowering infers the real region). */
static int at_target(const nf_sk_space *sp, const nf_sk_point *p, uint32_t i, char *loop,
                     int64_t *ext) {
  const sk_stmt *k = &sp->st[i];
  int c = k->consumer;
  const sk_stmt *kc = &sp->st[c];
  const nf_sk_gene *gc = &p->g[c];
  if (gc->role != NF_SK_NEST) return 0;
  nest_plan pc;
  plan_nest(kc, gc, kc->ext, &pc);
  plan_parallel(&pc, gc->n_par);
  int lv = p->g[i].at_level ? 1 : 0;
  const loopref *l = last_of(&pc, kc, 0, lv);
  if (!l) l = last_of(&pc, kc, 0, 1 - lv), lv = 1 - lv;
  if (!l) return 0;
  snprintf(loop, NF_SCHED_NAME, "%s", renamed(&pc, l));
  for (int v = 0; v < k->rank + k->n_red; v++) ext[v] = k->ext[v];
  for (int v = 0; v < k->rank && v < kc->rank; v++) {
    int64_t e = pc.s[2][v].name[0] ? pc.s[2][v].ext : 1;
    if (lv == 0 && pc.s[1][v].name[0]) e *= pc.s[1][v].ext;
    ext[v] = e < k->ext[v] ? e : k->ext[v];
  }
  return 1;
}

static int emit_stmt(const nf_sk_space *sp, const nf_sk_point *p, uint32_t i, nf_schedule *s) {
  const sk_stmt *k = &sp->st[i];
  const nf_sk_gene *ge = &p->g[i];
  int st = (int)i, rc = NF_OK;
  if (ge->role == NF_SK_FIXED) return NF_OK;
  if (ge->role == NF_SK_INLINE) return add_item(s, NF_SCH_INLINE, st, 0, NULL, NULL, 0);
  if (ge->role == NF_SK_DEFAULT) {
    for (int q = 0; q < sp->def->n_items && rc == NF_OK; q++)
      if (sp->def->items[q].stmt == st) rc = nf_schedule_add(s, &sp->def->items[q]);
    return rc;
  }
  int64_t ext[NF_MAX_VARS];
  char at_loop[NF_SCHED_NAME];
  int at = ge->role == NF_SK_AT && k->consumer >= 0 && at_target(sp, p, i, at_loop, ext);
  if (!at) memcpy(ext, k->ext, sizeof ext);
  nest_plan pl;
  plan_nest(k, ge, ext, &pl);
  plan_parallel(&pl, at ? 0 : ge->n_par);
  if (at) rc = add_item(s, NF_SCH_COMPUTE_AT, st, k->consumer, at_loop, NULL, 0);
  for (int q = 0; q < pl.n_split && rc == NF_OK; q++)
    rc = add_item(s, NF_SCH_SPLIT, st, 0, pl.split[q].name, NULL, pl.split[q].f);
  if (rc == NF_OK && pl.n_order > 1) {
    nf_sched_item it;
    memset(&it, 0, sizeof it);
    it.kind = NF_SCH_REORDER;
    it.stmt = st;
    for (int q = 0; q < pl.n_order && q < NF_SCHED_MAX_NAMES; q++)
      memcpy(it.names[it.n_names++], pl.order[q].name, NF_SCHED_NAME);
    rc = nf_schedule_add(s, &it);
  }
  /* fuse the parallel loops first: later primitives name the result */
  for (int q = 1; q < pl.n_fused && rc == NF_OK; q++) {
    char acc[NF_SCHED_NAME];
    snprintf(acc, sizeof acc, "%s", pl.order[0].name);
    for (int u = 1; u < q; u++) {
      char nx[2 * NF_SCHED_NAME + 16];
      snprintf(nx, sizeof nx, "%s.%s.fused", acc, pl.order[u].name);
      nf__sched_cat(acc, nx, "");
    }
    rc = add_item(s, NF_SCH_FUSE, st, 0, acc, pl.order[q].name, 0);
  }
  if (k->n_red && rc == NF_OK) {
    /* the accumulator: the tile inside the loop directly outside the
     * innermost reduction group (R in tmpl 0, R1 in tmpl 1): the register
     * tile S2, continuing partial sums when R0 is outside */
    int first = -1;
    for (int q = 0; q < pl.n_order && first < 0; q++)
      for (int v = 0; v < k->n_red; v++) {
        const loopref *inner = pl.r[1][v].name[0] ? &pl.r[1][v] : &pl.r[0][v];
        if (ge->tmpl == 0) inner = &pl.r[0][v];
        if (inner->name[0] && strcmp(pl.order[q].name, inner->name) == 0) first = q;
      }
    if (first > 0) rc = add_item(s, NF_SCH_CACHE_WRITE, st, 0, renamed(&pl, &pl.order[first - 1]), NULL, 0);
  }
  for (int q = 0; q < k->n_reads && rc == NF_OK; q++) {
    if (!ge->pack[q]) continue;
    int pr = k->read_prod[q];
    if (pr >= 0 && p->g[pr].role == NF_SK_AT) continue;
    const loopref *x = ge->pack[q] == 1   ? last_of(&pl, k, 0, 0)
                       : ge->pack[q] == 2 ? last_of(&pl, k, 1, 0)
                                          : last_of(&pl, k, 0, 1);
    if (!x) continue;
    rc = add_item(s, NF_SCH_CACHE_READ, st, 0, renamed(&pl, x),
                  sp->g->tensors[k->read_t[q]].name, 0);
  }
  if (pl.n_fused && rc == NF_OK) rc = add_item(s, NF_SCH_PARALLEL, st, 0, pl.fused, NULL, 0);
  if (pl.lanes.name[0] && rc == NF_OK) {
    rc = add_item(s, NF_SCH_RFACTOR, st, 0, pl.lanes.name, NULL, 0);
    if (rc == NF_OK && ge->vec) rc = add_item(s, NF_SCH_VECTORIZE, st, 0, pl.lanes.name, NULL, 0);
  } else if (ge->vec && pl.n_order > pl.n_fused && rc == NF_OK) {
    const loopref *last = &pl.order[pl.n_order - 1];
    /* powers of two only: a <56 x float> or <24 x float> vector
     * legalises into slow code */
    if (last->spatial && last->ext >= 2 && last->ext <= 64 && (last->ext & (last->ext - 1)) == 0)
      rc = add_item(s, NF_SCH_VECTORIZE, st, 0, last->name, NULL, 0);
  }
  return rc;
}

int nf_sk_schedule(const nf_sk_space *sp, const nf_sk_point *p, nf_schedule **out) {
  nf_schedule *s = nf_schedule_new();
  int rc = s ? NF_OK : NF_ENOMEM;
  *out = NULL;
  if (s) s->n_stmts = sp->n;
  for (uint32_t i = 0; i < sp->n && rc == NF_OK; i++) rc = emit_stmt(sp, p, i, s);
  if (rc != NF_OK) {
    nf_schedule_free(s);
    return rc;
  }
  *out = s;
  return NF_OK;
}
