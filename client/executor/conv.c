/* conv.c - nf_conv.h: a statement read as one of cuDNN's convolution
 * operations.  Every index is put in affine form over the statement's
 * variables; the roles (n, k, c, y, x, r, s) are read off the bare
 * variables, the stride, dilation and padding off the shifted operand's
 * coefficients, and then everything is checked: each coefficient, each
 * extent, the guard's comparisons against the shifted operand's bounds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_conv.h"
#include "nf_stage.h"

/* c0 + sum c[v] * v over the statement's variables */
typedef struct form {
  int64_t c[NF_MAX_VARS];
  int64_t k;
} form;

#define MAX_CON 16

typedef struct ctx {
  const nf_graph *g;
  const nf_stmt *st;
  int n_vars;
  int64_t ext[NF_MAX_VARS];
  const nf_expr *f[2]; /* the factors (accesses) */
  form idx[2][4];      /* their indices */
  int n_con;
  form con[MAX_CON];   /* the guard: every con >= 0 */
} ctx;

static int to_form(const nf_expr *e, int n_vars, form *f) {
  nf_affine a;
  memset(f, 0, sizeof *f);
  if (nf_expr_affine(e, &a) != 1) return 0;
  for (int i = 0; i < a.n; i++) {
    if ((int)a.var[i] >= n_vars) return 0;
    f->c[a.var[i]] = a.coef[i];
  }
  f->k = a.c;
  return 1;
}

/* The guard's comparisons as forms >= 0; 0 for another shape. */
static int guard_forms(ctx *C, const nf_expr *g) {
  if (g->op == NF_OP_CONST && g->dtype == NF_BOOL) return g->u.i != 0;
  if (g->op == NF_OP_AND) return guard_forms(C, g->args[0]) && guard_forms(C, g->args[1]);
  if (g->op != NF_OP_LT && g->op != NF_OP_LE && g->op != NF_OP_GT && g->op != NF_OP_GE &&
      g->op != NF_OP_EQ)
    return 0;
  form x, y, d, m;
  if (!to_form(g->args[0], C->n_vars, &x) || !to_form(g->args[1], C->n_vars, &y)) return 0;
  for (int v = 0; v < NF_MAX_VARS; v++) d.c[v] = x.c[v] - y.c[v], m.c[v] = -d.c[v];
  d.k = x.k - y.k; /* x - y */
  m.k = -d.k;      /* y - x */
  if (C->n_con + 2 > MAX_CON) return 0;
  switch (g->op) {
  case NF_OP_LT: m.k -= 1; C->con[C->n_con++] = m; break;
  case NF_OP_LE: C->con[C->n_con++] = m; break;
  case NF_OP_GT: d.k -= 1; C->con[C->n_con++] = d; break;
  case NF_OP_GE: C->con[C->n_con++] = d; break;
  default: C->con[C->n_con++] = d; C->con[C->n_con++] = m; break;
  }
  return 1;
}

/* 1 when f >= 0 for every value of the variables in their ranges. */
static int always(const ctx *C, const form *f) {
  int64_t lo = f->k;
  for (int v = 0; v < C->n_vars; v++)
    if (f->c[v] < 0) lo += f->c[v] * (C->ext[v] - 1);
  return lo >= 0;
}

static int same(const form *a, const form *b) {
  return a->k == b->k && !memcmp(a->c, b->c, sizeof a->c);
}

/* The guard is exactly 0 <= e[i] <= hi[i] (i < 2), up to comparisons
 * that always hold. */
static int guard_is_bounds(const ctx *C, const form *e, const int64_t *hi) {
  form want[4];
  for (int i = 0; i < 2; i++) {
    want[2 * i] = e[i];
    for (int v = 0; v < NF_MAX_VARS; v++) want[2 * i + 1].c[v] = -e[i].c[v];
    want[2 * i + 1].k = hi[i] - e[i].k;
  }
  for (int j = 0; j < C->n_con; j++) {
    int ok = always(C, &C->con[j]);
    for (int i = 0; i < 4 && !ok; i++) ok = same(&C->con[j], &want[i]);
    if (!ok) return 0;
  }
  for (int i = 0; i < 4; i++) {
    int ok = always(C, &want[i]);
    for (int j = 0; j < C->n_con && !ok; j++) ok = same(&C->con[j], &want[i]);
    if (!ok) return 0;
  }
  return 1;
}

/* The variable an index is, where it is bare (coefficient 1, no
 * constant): its number; -1 for the constant 0 (a dimension of extent
 * 1); -2 for anything else. */
static int bare(const form *f) {
  int v = -1;
  if (f->k != 0) return -2;
  for (int i = 0; i < NF_MAX_VARS; i++) {
    if (!f->c[i]) continue;
    if (f->c[i] != 1 || v >= 0) return -2;
    v = i;
  }
  return v;
}

/* The variable of role slot, -1 (absent) only where extent is 1. */
static int role(const form *f, int64_t extent, int *v) {
  *v = bare(f);
  return *v >= 0 || (*v == -1 && extent == 1);
}

static int64_t ext_of(const ctx *C, int v) { return v < 0 ? 1 : C->ext[v]; }

/* A shifted index a * o + b * q + k0 (o, q variables or -1): fills a, b
 * (b 0 where q is absent) and k0; 0 when other variables appear. */
static int shifted(const form *f, int o, int q, int64_t *a, int64_t *b, int64_t *k0) {
  for (int v = 0; v < NF_MAX_VARS; v++)
    if (f->c[v] && v != o && v != q) return 0;
  *a = o >= 0 ? f->c[o] : 0;
  *b = q >= 0 ? f->c[q] : 0;
  *k0 = f->k;
  return 1;
}

static const nf_tensor *T(const ctx *C, int i) { return &C->g->tensors[C->f[i]->u.tensor]; }

/* The reduction variables are exactly the roles in used[] (each once). */
static int reductions_are(const ctx *C, const int *used, int n) {
  int seen = 0;
  for (int i = 0; i < n; i++) {
    if (used[i] < 0) continue;
    if (used[i] < 4) return 0;
    for (int j = 0; j < i; j++)
      if (used[j] == used[i]) return 0;
    seen++;
  }
  return seen == C->st->n_red;
}

/* The spatial part shared by the three kinds: stride, dilation, padding
 * of the two spatial dimensions (i = 0, 1) from the shifted operand's
 * indices e[i] = str * o[i] + dil * q[i] - pad. */
static int spatial(const ctx *C, nf_conv_desc *d, const form *e, const int *o, const int *q,
                   int64_t R, int64_t S) {
  for (int i = 0; i < 2; i++) {
    int64_t a, b, k0;
    if (!shifted(&e[i], o[i], q[i], &a, &b, &k0)) return 0;
    /* a variable of extent 1 may have been simplified away: any stride
     * (dilation) reads the same there */
    if (a == 0 && ext_of(C, o[i]) == 1) a = 1;
    if (b == 0 && (i ? S : R) == 1) b = 1;
    if (a < 1 || b < 1 || k0 > 0) return 0;
    if (i) d->str_w = a, d->dil_w = b, d->pad_w = -k0;
    else d->str_h = a, d->dil_h = b, d->pad_h = -k0;
  }
  return 1;
}

static int sizes_ok(const nf_conv_desc *d) {
  if (d->groups != 1 && (d->groups != d->c || d->groups != d->k)) return 0;
  return d->n > 0 && d->c > 0 && d->h > 0 && d->w > 0 && d->k > 0 && d->r > 0 && d->s > 0 &&
         d->oh == nf__conv_out_size(d->h, d->pad_h, d->dil_h, d->r, d->str_h) &&
         d->ow == nf__conv_out_size(d->w, d->pad_w, d->dil_w, d->s, d->str_w);
}

static void shape_x(nf_conv_desc *d, const nf_tensor *t) {
  d->n = t->shape[0], d->c = t->shape[1], d->h = t->shape[2], d->w = t->shape[3];
}
static void shape_f(nf_conv_desc *d, const nf_tensor *t) {
  d->k = t->shape[0], d->r = t->shape[2], d->s = t->shape[3];
}
static void shape_y(nf_conv_desc *d, const nf_tensor *t) { d->oh = t->shape[2], d->ow = t->shape[3]; }

/* Whether the tensors have a depthwise convolution's shapes: C = K > 1
 * image and result channels, filters of one channel, and the output
 * variable that stands for the channel of that extent. */
static int depthwise(const nf_tensor *tx, const nf_tensor *tf, const nf_tensor *ty, int64_t ext) {
  return tx->shape[1] > 1 && tx->shape[1] == ty->shape[1] && tf->shape[0] == ty->shape[1] &&
         tf->shape[1] == 1 && ext == tx->shape[1];
}

/* Y(n, k, y, x) = X(n, c, ..) * F(k, c, r, s): output variables 0..3. */
static int match_fwd(const ctx *C, nf_conv_desc *d) {
  for (int fi = 0; fi < 2; fi++) {
    const form *F = C->idx[fi], *X = C->idx[1 - fi];
    const nf_tensor *tf = T(C, fi), *tx = T(C, 1 - fi), *ty = &C->g->tensors[C->st->out];
    int c, r, s, vk, vn;
    if (!role(&F[0], ty->shape[1], &vk) || vk != (vk < 0 ? -1 : 1) ||
        !role(&X[0], ty->shape[0], &vn) || vn != (vn < 0 ? -1 : 0) ||
        !role(&F[1], tf->shape[1], &c) || !role(&F[2], tf->shape[2], &r) ||
        !role(&F[3], tf->shape[3], &s))
      continue;
    /* depthwise: the image's channel is the output channel's */
    int dw = depthwise(tx, tf, ty, C->ext[1]) && vk == 1 && bare(&X[1]) == 1;
    if (!dw && bare(&X[1]) != c) continue;
    if (vk < 0 && C->ext[1] != 1) continue;
    if (vn < 0 && C->ext[0] != 1) continue;
    int used[3] = {c, r, s};
    if (!reductions_are(C, used, 3)) continue;
    d->groups = dw ? tx->shape[1] : 1;
    int o[2] = {2, 3}, q[2] = {r, s};
    if (!spatial(C, d, &X[2], o, q, tf->shape[2], tf->shape[3])) continue;
    shape_x(d, tx);
    shape_f(d, tf);
    shape_y(d, ty);
    if (ty->shape[0] != d->n || tf->shape[1] * d->groups != d->c || ty->shape[1] != d->k ||
        ext_of(C, c) != tf->shape[1] || ext_of(C, r) != d->r || ext_of(C, s) != d->s ||
        !sizes_ok(d))
      continue;
    int64_t hi[2] = {d->h - 1, d->w - 1};
    if (!guard_is_bounds(C, &X[2], hi)) continue;
    d->kind = NF_CONV_FWD;
    d->t_x = C->f[1 - fi]->u.tensor;
    d->t_f = C->f[fi]->u.tensor;
    d->t_y = C->st->out;
    return 1;
  }
  return 0;
}

/* F(k, c, r, s) = Y(n, k, y, x) * X(n, c, ..): output variables 0..3. */
static int match_bwd_filter(const ctx *C, nf_conv_desc *d) {
  for (int yi = 0; yi < 2; yi++) {
    const form *Y = C->idx[yi], *X = C->idx[1 - yi];
    const nf_tensor *ty = T(C, yi), *tx = T(C, 1 - yi), *tf = &C->g->tensors[C->st->out];
    int n, vk, vc = -1, y, x;
    if (!role(&Y[0], ty->shape[0], &n) || bare(&X[0]) != n || !role(&Y[1], tf->shape[0], &vk) ||
        vk != (vk < 0 ? -1 : 0) || !role(&Y[2], ty->shape[2], &y) ||
        !role(&Y[3], ty->shape[3], &x))
      continue;
    /* depthwise: the image's channel is the filter's output channel */
    int dw = depthwise(tx, tf, ty, tf->shape[0]) && vk == 0 && bare(&X[1]) == 0;
    if (!dw && (!role(&X[1], tf->shape[1], &vc) || vc != (vc < 0 ? -1 : 1))) continue;
    if ((vk < 0 && C->ext[0] != 1) || (!dw && vc < 0 && C->ext[1] != 1)) continue;
    d->groups = dw ? tx->shape[1] : 1;
    int used[3] = {n, y, x};
    if (!reductions_are(C, used, 3)) continue;
    int o[2] = {y, x}, q[2] = {2, 3};
    if (!spatial(C, d, &X[2], o, q, tf->shape[2], tf->shape[3])) continue;
    shape_x(d, tx);
    shape_f(d, tf);
    shape_y(d, ty);
    if (ty->shape[0] != d->n || ty->shape[1] != d->k || tf->shape[1] * d->groups != d->c ||
        ext_of(C, n) != d->n || ext_of(C, y) != d->oh || ext_of(C, x) != d->ow || !sizes_ok(d))
      continue;
    int64_t hi[2] = {d->h - 1, d->w - 1};
    if (!guard_is_bounds(C, &X[2], hi)) continue;
    d->kind = NF_CONV_BWD_FILTER;
    d->t_x = C->f[1 - yi]->u.tensor;
    d->t_f = C->st->out;
    d->t_y = C->f[yi]->u.tensor;
    return 1;
  }
  return 0;
}

/* X(n, c, h, w) = Y(n, k, h + ph - dh r, ..) * F(k, c, r, s), stride 1:
 * output variables 0..3. */
static int match_bwd_data(const ctx *C, nf_conv_desc *d) {
  for (int fi = 0; fi < 2; fi++) {
    const form *F = C->idx[fi], *Y = C->idx[1 - fi];
    const nf_tensor *tf = T(C, fi), *ty = T(C, 1 - fi), *tx = &C->g->tensors[C->st->out];
    int k, vc, vn, r, s;
    if (!role(&F[0], tf->shape[0], &k) || bare(&Y[1]) != k || !role(&Y[0], tx->shape[0], &vn) ||
        vn != (vn < 0 ? -1 : 0) || !role(&F[2], tf->shape[2], &r) ||
        !role(&F[3], tf->shape[3], &s))
      continue;
    /* depthwise: the filter's (and the gradient's) channel is the image's;
     * F's second index a constant 0 or a variable of extent 1 */
    int dw = depthwise(tx, tf, ty, C->ext[1]) && k == 1;
    if (dw && !role(&F[1], 1, &vc)) continue;
    if (!dw && (!role(&F[1], tx->shape[1], &vc) || vc != (vc < 0 ? -1 : 1))) continue;
    if (!dw && vc < 0 && C->ext[1] != 1) continue;
    if (vn < 0 && C->ext[0] != 1) continue;
    int used[3] = {dw ? vc : k, r, s};
    if (!reductions_are(C, used, 3)) continue;
    d->groups = dw ? tx->shape[1] : 1;
    /* Y's spatial index h + ph - dh r: stride 1 */
    int ok = 1;
    for (int i = 0; i < 2 && ok; i++) {
      int64_t a = 0, b = 0, k0 = 0;
      int q = i ? s : r;
      ok = shifted(&Y[2 + i], 2 + i, q, &a, &b, &k0) && (a == 1 || C->ext[2 + i] == 1) &&
           k0 >= 0;
      if (b == 0 && tf->shape[2 + i] == 1) b = -1;
      ok = ok && b <= -1;
      if (i) d->pad_w = k0, d->dil_w = -b;
      else d->pad_h = k0, d->dil_h = -b;
    }
    if (!ok) continue;
    d->str_h = d->str_w = 1;
    shape_x(d, tx);
    shape_f(d, tf);
    shape_y(d, ty);
    if (ty->shape[0] != d->n || ty->shape[1] != d->k || tf->shape[1] * d->groups != d->c ||
        (!dw && ext_of(C, k) != d->k) || ext_of(C, r) != d->r || ext_of(C, s) != d->s ||
        !sizes_ok(d))
      continue;
    int64_t hi[2] = {d->oh - 1, d->ow - 1};
    if (!guard_is_bounds(C, &Y[2], hi)) continue;
    d->kind = NF_CONV_BWD_DATA;
    d->t_x = C->st->out;
    d->t_f = C->f[fi]->u.tensor;
    d->t_y = C->f[1 - fi]->u.tensor;
    return 1;
  }
  return 0;
}

/* The affine reading (the header's forms). */
static int match_affine(const nf_graph *g, uint32_t si, nf_conv_desc *d) {
  memset(d, 0, sizeof *d);
  if (si >= g->n_stmts) return 0;
  ctx C;
  memset(&C, 0, sizeof C);
  C.g = g;
  C.st = &g->stmts[si];
  const nf_tensor *out = &g->tensors[C.st->out];
  if (C.st->red != NF_RED_SUM || out->rank != 4 || out->dtype != NF_F32 || C.st->n_red > 3 ||
      C.st->n_red < 1)
    return 0;
  C.n_vars = 4 + C.st->n_red;
  for (int v = 0; v < 4; v++) C.ext[v] = out->shape[v];
  for (int r = 0; r < C.st->n_red; r++) {
    if (C.st->red_lo[r] != 0) return 0;
    C.ext[4 + r] = C.st->red_ext[r];
  }
  for (int v = 0; v < C.n_vars; v++)
    if (C.ext[v] < 1) return 0;
  const nf_expr *e = C.st->rhs, *guard = NULL;
  if (e->op == NF_OP_SELECT && nf__conv_is_zero(e->args[2])) {
    guard = e->args[0];
    e = e->args[1];
  }
  if (e->op != NF_OP_MUL || e->n_args != 2) return 0;
  for (int i = 0; i < 2; i++) {
    const nf_expr *f = e->args[i];
    if (f->op == NF_OP_SELECT && nf__conv_is_zero(f->args[2])) {
      if (guard) return 0;
      guard = f->args[0];
      f = f->args[1];
    }
    const nf_tensor *t = f->op == NF_OP_ACCESS ? &g->tensors[f->u.tensor] : NULL;
    if (!t || f->dtype != NF_F32 || t->dtype != NF_F32 || t->rank != 4 || f->n_args != 4 ||
        f->u.tensor == C.st->out)
      return 0;
    C.f[i] = f;
    for (int j = 0; j < 4; j++)
      if (!to_form(f->args[j], C.n_vars, &C.idx[i][j])) return 0;
  }
  if (guard && !guard_forms(&C, guard)) return 0;
  return match_fwd(&C, d) || match_bwd_filter(&C, d) || match_bwd_data(&C, d);
}

int nf_conv_match(const nf_graph *g, uint32_t si, nf_conv_desc *d) {
  return match_affine(g, si, d) || nf__conv_match_enum(g, si, d);
}

const char *nf_conv_kind_name(nf_conv_kind k) {
  switch (k) {
  case NF_CONV_FWD: return "forward";
  case NF_CONV_BWD_DATA: return "data gradient";
  case NF_CONV_BWD_FILTER: return "filter gradient";
  }
  return "?";
}

/* ---- a subgraph: the convolution then an epilogue ---- */

struct nf_conv_sub {
  const nf_graph *sub;
  nf_conv_desc d;
  uint32_t t_res;     /* the convolution's result */
  int buf[3];         /* roles x, f, y: buffer indices (-1: a local) */
  nf_stage epi;
  uint8_t *epi_reads; /* per buffer index */
  void **ptr;         /* subgraph tensor -> storage during the epilogue */
  char desc[160];
};

void nf_conv_free(nf_conv_sub *s) {
  if (!s) return;
  nf_stage_clear(&s->epi);
  free(s->epi_reads);
  free(s->ptr);
  free(s);
}

int nf_conv_prepare(const nf_graph *sub, nf_conv_sub **out, nf_buf *err) {
  *out = NULL;
  nf_conv_desc d;
  if (sub->n_stmts == 0 || !nf_conv_match(sub, 0, &d)) return NF_OK;
  for (uint32_t i = 1; i < sub->n_stmts; i++)
    if (sub->stmts[i].red != NF_RED_NONE) return NF_OK;
  uint32_t t_res = sub->stmts[0].out;
  uint32_t role_t[3] = {d.t_x, d.t_f, d.t_y};
  nf_conv_sub *s = calloc(1, sizeof *s);
  if (!s) goto oom;
  s->sub = sub;
  s->d = d;
  s->t_res = t_res;
  for (int r = 0; r < 3; r++) {
    s->buf[r] = nf_stage_buffer(sub, role_t[r]);
    /* the operands are the subgraph's inputs; the result an output or a
     * local */
    if (role_t[r] != t_res && (s->buf[r] < 0 || s->buf[r] >= (int)sub->n_inputs)) {
      nf_conv_free(s);
      return NF_OK;
    }
    if (role_t[r] == t_res && sub->tensors[t_res].kind != NF_T_LOCAL && s->buf[r] < 0) {
      nf_conv_free(s);
      return NF_OK;
    }
  }
  uint32_t nb = sub->n_inputs + sub->n_outputs, n_epi = sub->n_stmts - 1;
  s->epi_reads = calloc(nb + 1, 1);
  s->ptr = calloc(sub->n_tensors + 1, sizeof *s->ptr);
  uint32_t *order = malloc((n_epi + 1) * sizeof *order);
  uint8_t *is_out = calloc(sub->n_tensors + 1, 1);
  int rc = s->epi_reads && s->ptr && order && is_out ? NF_OK : NF_ENOMEM;
  for (uint32_t i = 0; i < n_epi; i++) order[i] = i + 1;
  for (uint32_t k = 0; rc == NF_OK && k < sub->n_outputs; k++) is_out[sub->outputs[k]] = 1;
  if (rc == NF_OK) rc = nf_stage_init(&s->epi, sub, order, n_epi, is_out);
  for (uint32_t k = 0; rc == NF_OK && s->epi.present && k < s->epi.sg.n_in; k++) {
    int b = nf_stage_buffer(sub, s->epi.sg.in[k]);
    if (b >= 0) s->epi_reads[b] = 1;
  }
  free(order);
  free(is_out);
  if (rc != NF_OK) {
    nf_conv_free(s);
    if (rc == NF_ENOMEM) goto oom;
    return NF_OK; /* an epilogue the extraction refuses: not this form */
  }
  uint32_t ne = s->epi.present ? s->epi.sg.n_stmts : 0;
  char grp[32] = "";
  if (d.groups > 1) snprintf(grp, sizeof grp, " groups %lld", (long long)d.groups);
  snprintf(s->desc, sizeof s->desc,
           "cuDNN %s %lldx%lldx%lldx%lld * %lldx%lldx%lldx%lld pad %lld,%lld stride %lld,%lld "
           "dilation %lld,%lld%s, epilogue %u stmt%s",
           nf_conv_kind_name(d.kind), (long long)d.n, (long long)d.c, (long long)d.h,
           (long long)d.w, (long long)d.k, (long long)(d.c / d.groups), (long long)d.r,
           (long long)d.s, (long long)d.pad_h, (long long)d.pad_w, (long long)d.str_h,
           (long long)d.str_w, (long long)d.dil_h, (long long)d.dil_w, grp, ne,
           ne == 1 ? "" : "s");
  *out = s;
  return NF_OK;
oom:
  nf_buf_printf(err, "conv: out of memory");
  return NF_ENOMEM;
}

const nf_conv_desc *nf_conv_sub_desc(const nf_conv_sub *s) { return &s->d; }

int nf_conv_sub_buffer(const nf_conv_sub *s, int role) {
  return role >= 0 && role < 3 ? s->buf[role] : -1;
}

int64_t nf_conv_sub_result_bytes(const nf_conv_sub *s) {
  return nf_tensor_numel(&s->sub->tensors[s->t_res]) * (int64_t)sizeof(float);
}

int nf_conv_sub_has_epilogue(const nf_conv_sub *s) { return s->epi.present; }

int nf_conv_sub_epilogue_reads(const nf_conv_sub *s, uint32_t i) {
  return i < s->sub->n_inputs + s->sub->n_outputs && s->epi_reads[i];
}

int nf_conv_sub_epilogue(nf_conv_sub *s, void *const *buffers, void *result, nf_buf *err) {
  if (!s->epi.present) return NF_OK;
  const nf_graph *sub = s->sub;
  for (uint32_t k = 0; k < sub->n_inputs; k++) s->ptr[sub->inputs[k]] = buffers[k];
  for (uint32_t k = 0; k < sub->n_outputs; k++)
    s->ptr[sub->outputs[k]] = buffers[sub->n_inputs + k];
  s->ptr[s->t_res] = result;
  return nf_stage_run(&s->epi, sub, s->ptr, "epilogue of a cuDNN subgraph", err);
}

const char *nf_conv_sub_describe(const nf_conv_sub *s) { return s->desc; }
