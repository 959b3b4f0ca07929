/* cuda_backend.c - loop IR -> CUDA C (nf_cuda.h has the mapping).
 *
 * Expressions are printed once per node and scope: every operator node
 * becomes a `const` temporary the first time it is needed in a scope
 * and is reused after that (the IR is a DAG; printing it as a tree could
 * grow exponentially).  A select opens a scope per branch, so nothing of
 * an untaken branch is ever evaluated (a guarded load stays guarded). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "nf_cuda.h"

enum { CTX_GRID1 = 0, CTX_BLOCK0, CTX_THREAD }; /* who runs serial code */

typedef struct memo {
  const nf_expr *e;
  int tmp;
} memo;

typedef struct live {
  uint32_t buf;
  uint64_t off;
} live;

typedef struct cu {
  const nf_lprog *p;
  nf_buf *o; /* the current kernel's body */
  nf_buf *err;
  nf_cuda_plan *plan;
  int rc, ind, ntmp, ctx;
  memo *m;
  int n_m, cap_m;
  live *top; /* scratch temporaries of the enclosing top-level ALLOCs */
  int n_top, cap_top;
  uint32_t block;    /* threads of the current kernel */
  uint64_t shared;   /* its static shared bytes */
  uint64_t local;    /* its local array bytes (per thread) */
  /* inside a vectorized loop (vector_loop): its variable, the loads read
   * from lane arrays (vld[i] from nv<vid[i]>[v]) and the store written
   * to one (vst_buf, -1: none) */
  uint32_t vvar;
  const nf_expr *vld[16];
  int vid[16], n_vld, vst;
  int64_t vst_buf;
  char vstart[32]; /* the first lane's value of vvar ("0", or "g_ * 4") */
  int nvec;
} cu;

static void fail(cu *c, int rc, const char *fmt, ...) {
  if (c->rc) return;
  c->rc = rc;
  va_list ap;
  va_start(ap, fmt);
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  nf_buf_puts(c->err, line);
}

static void line(cu *c, const char *fmt, ...) {
  for (int i = 0; i < c->ind; i++) nf_buf_puts(c->o, "  ");
  va_list ap;
  va_start(ap, fmt);
  char buf[2048];
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  nf_buf_puts(c->o, buf);
  nf_buf_putc(c->o, '\n');
}

/* The C type of a value, and of a buffer element. */
static const char *vtype(int dt) {
  switch (dt) {
  case NF_BOOL: return "bool";
  case NF_I32: return "int";
  case NF_I64: return "long long";
  case NF_F32: return "float";
  case NF_F64: return "double";
  default: return NULL;
  }
}

static const char *stype(int dt) { return dt == NF_BOOL ? "unsigned char" : vtype(dt); }

/* ---- expressions ---- */

static void const_text(const nf_expr *e, char *out, size_t n) {
  switch (e->dtype) {
  case NF_BOOL: snprintf(out, n, "%s", e->u.i ? "true" : "false"); break;
  case NF_I32:
    if (e->u.i == INT32_MIN)
      snprintf(out, n, "(-2147483647 - 1)");
    else
      snprintf(out, n, "%" PRId64, e->u.i);
    break;
  case NF_I64:
    if (e->u.i == INT64_MIN)
      snprintf(out, n, "(-9223372036854775807LL - 1)");
    else
      snprintf(out, n, "%" PRId64 "LL", e->u.i);
    break;
  case NF_F32: {
    float f = (float)e->u.f;
    if (isfinite(f)) {
      snprintf(out, n, "%.9ef", (double)f);
    } else {
      uint32_t bits;
      memcpy(&bits, &f, sizeof bits);
      if (isnan(f)) bits = 0x7fc00000u;
      snprintf(out, n, "__int_as_float(0x%08" PRIx32 ")", bits);
    }
    break;
  }
  default: { /* f64 */
    double f = e->u.f;
    if (isfinite(f)) {
      snprintf(out, n, "%.17e", f);
    } else {
      uint64_t bits;
      memcpy(&bits, &f, sizeof bits);
      if (isnan(f)) bits = 0x7ff8000000000000ull;
      snprintf(out, n, "__longlong_as_double(0x%016" PRIx64 "LL)", bits);
    }
    break;
  }
  }
}

/* Room for one more element in *arr (n used of *cap, doubling from
 * first); 0 and a failure recorded when out of memory. */
static int grow(cu *c, void **arr, int n, int *cap, int first, size_t elem) {
  if (n < *cap) return 1;
  int nc = *cap ? 2 * *cap : first;
  void *a = realloc(*arr, (size_t)nc * elem);
  if (!a) {
    fail(c, NF_ENOMEM, "out of memory");
    return 0;
  }
  *arr = a;
  *cap = nc;
  return 1;
}

/* A buffer whose dtype the backend cannot store: recorded, 1. */
static int bad_dtype(cu *c, const nf_lbuf *lb) {
  if (stype(lb->dtype)) return 0;
  fail(c, NF_EUNSUPPORTED, "buffer '%s': dtype %s is not supported by the CUDA backend yet",
       lb->name ? lb->name : "?", nf_dtype_name((nf_dtype)lb->dtype));
  return 1;
}

static int memo_find(cu *c, const nf_expr *e) {
  for (int i = c->n_m - 1; i >= 0; i--)
    if (c->m[i].e == e) return c->m[i].tmp;
  return -1;
}

static void memo_add(cu *c, const nf_expr *e, int tmp) {
  if (!grow(c, (void **)&c->m, c->n_m, &c->cap_m, 256, sizeof *c->m)) return;
  c->m[c->n_m].e = e;
  c->m[c->n_m++].tmp = tmp;
}

static void val(cu *c, const nf_expr *e, char *out, size_t n);

/* The row-major offset of an access or store into buffer b. */
static void offset(cu *c, uint32_t b, int n_idx, const nf_expr *const *idx, char *out, size_t n) {
  const nf_lbuf *lb = &c->p->bufs[b];
  if (n_idx != lb->rank) {
    fail(c, NF_EINVAL, "buffer '%s': %d indices for rank %d", lb->name ? lb->name : "?", n_idx,
         lb->rank);
    snprintf(out, n, "0");
    return;
  }
  if (n_idx == 0) {
    snprintf(out, n, "0");
    return;
  }
  char acc[96], a[96];
  val(c, idx[0], acc, sizeof acc);
  for (int d = 1; d < n_idx && !c->rc; d++) {
    val(c, idx[d], a, sizeof a);
    int k = c->ntmp++;
    line(c, "const long long e%d = %s * %" PRId64 "LL + %s;", k, acc, lb->shape[d], a);
    snprintf(acc, sizeof acc, "e%d", k);
  }
  snprintf(out, n, "%s", acc);
}

static const char *fsuffix(int dt) { return dt == NF_F32 ? "f" : ""; }

static void val(cu *c, const nf_expr *e, char *out, size_t n) {
  if (c->rc) {
    snprintf(out, n, "0");
    return;
  }
  if (e->op == NF_OP_CONST) {
    const_text(e, out, n);
    return;
  }
  if (e->op == NF_OP_VAR) {
    snprintf(out, n, "v%u", e->u.var);
    return;
  }
  int k = memo_find(c, e);
  if (k >= 0) {
    snprintf(out, n, "e%d", k);
    return;
  }
  const char *ty = vtype(e->dtype);
  if (!ty) {
    fail(c, NF_EUNSUPPORTED, "dtype %s is not supported by the CUDA backend yet",
         nf_dtype_name((nf_dtype)e->dtype));
    snprintf(out, n, "0");
    return;
  }
  char a[96], b[96], x[1024];
  int isf = nf_dtype_is_float((nf_dtype)e->dtype);
  const char *fs = fsuffix(e->dtype);
  if (e->op == NF_OP_SELECT) {
    val(c, e->args[0], a, sizeof a);
    k = c->ntmp++;
    line(c, "%s e%d;", ty, k);
    for (int br = 1; br <= 2; br++) {
      line(c, br == 1 ? "if (%s) {" : "} else {", a);
      c->ind++;
      int mark = c->n_m;
      val(c, e->args[br], b, sizeof b);
      line(c, "e%d = %s;", k, b);
      c->n_m = mark; /* the branch's temporaries go out of scope */
      c->ind--;
    }
    line(c, "}");
    memo_add(c, e, k);
    snprintf(out, n, "e%d", k);
    return;
  }
  if (e->op == NF_OP_ACCESS) {
    uint32_t t = e->u.tensor;
    if (t >= c->p->n_bufs) {
      fail(c, NF_EINVAL, "access to buffer %u of %u", t, c->p->n_bufs);
      snprintf(out, n, "0");
      return;
    }
    for (int q = 0; q < c->n_vld; q++)
      if (c->vld[q] == e) { /* a lane of a vector load */
        k = c->ntmp++;
        line(c, "const %s e%d = nv%d[v%u - %s];", ty, k, c->vid[q], c->vvar, c->vstart);
        memo_add(c, e, k);
        snprintf(out, n, "e%d", k);
        return;
      }
    offset(c, t, e->n_args, e->args, a, sizeof a);
    k = c->ntmp++;
    if (c->p->bufs[t].dtype == NF_BOOL)
      line(c, "const bool e%d = b%u[%s] != 0;", k, t, a);
    else
      line(c, "const %s e%d = b%u[%s];", ty, k, t, a);
    memo_add(c, e, k);
    snprintf(out, n, "e%d", k);
    return;
  }
  int ar = nf_op_arity((nf_op)e->op);
  if (ar >= 1) val(c, e->args[0], a, sizeof a);
  if (ar >= 2) val(c, e->args[1], b, sizeof b);
  int adt = ar >= 1 ? e->args[0]->dtype : e->dtype;
  int aflt = nf_dtype_is_float((nf_dtype)adt);
  /* wrapping integer arithmetic in the value's width */
  const char *ut = e->dtype == NF_I32 ? "unsigned" : "unsigned long long";
  switch (e->op) {
  case NF_OP_NEG:
    if (isf) snprintf(x, sizeof x, "-%s", a);
    else snprintf(x, sizeof x, "(%s)(0u - (%s)%s)", ty, ut, a);
    break;
  case NF_OP_NOT: snprintf(x, sizeof x, "!%s", a); break;
  case NF_OP_EXP: snprintf(x, sizeof x, "exp%s(%s)", fs, a); break;
  case NF_OP_LOG: snprintf(x, sizeof x, "log%s(%s)", fs, a); break;
  case NF_OP_SQRT: snprintf(x, sizeof x, "sqrt%s(%s)", fs, a); break;
  case NF_OP_RSQRT:
    snprintf(x, sizeof x, "%s / sqrt%s(%s)", isf && e->dtype == NF_F32 ? "1.0f" : "1.0", fs, a);
    break;
  case NF_OP_TANH: snprintf(x, sizeof x, "tanh%s(%s)", fs, a); break;
  case NF_OP_SIGMOID: snprintf(x, sizeof x, "nf_sigmoid%s(%s)", fs, a); break;
  case NF_OP_ERF: snprintf(x, sizeof x, "erf%s(%s)", fs, a); break;
  case NF_OP_ABS:
    if (isf) snprintf(x, sizeof x, "fabs%s(%s)", fs, a);
    else snprintf(x, sizeof x, "(%s < 0 ? (%s)(0u - (%s)%s) : %s)", a, ty, ut, a, a);
    break;
  case NF_OP_FLOOR:
    if (isf) snprintf(x, sizeof x, "floor%s(%s)", fs, a);
    else snprintf(x, sizeof x, "%s", a);
    break;
  case NF_OP_CEIL:
    if (isf) snprintf(x, sizeof x, "ceil%s(%s)", fs, a);
    else snprintf(x, sizeof x, "%s", a);
    break;
  case NF_OP_STOPGRAD: snprintf(x, sizeof x, "%s", a); break;
  case NF_OP_CAST:
    if (e->dtype == NF_BOOL) snprintf(x, sizeof x, "(%s != 0)", a);
    else if (e->dtype == NF_I32 && !aflt) snprintf(x, sizeof x, "(int)(unsigned)(%s)", a);
    else snprintf(x, sizeof x, "(%s)(%s)", ty, a);
    break;
  case NF_OP_ADD:
  case NF_OP_SUB:
  case NF_OP_MUL: {
    const char *o = e->op == NF_OP_ADD ? "+" : e->op == NF_OP_SUB ? "-" : "*";
    if (isf) snprintf(x, sizeof x, "%s %s %s", a, o, b);
    else snprintf(x, sizeof x, "(%s)((%s)%s %s (%s)%s)", ty, ut, a, o, ut, b);
    break;
  }
  case NF_OP_DIV: snprintf(x, sizeof x, "%s / %s", a, b); break;
  case NF_OP_FLOORDIV:
    if (isf) snprintf(x, sizeof x, "floor%s(%s / %s)", fs, a, b);
    else snprintf(x, sizeof x, "(%s)nf_floordiv(%s, %s)", ty, a, b);
    break;
  case NF_OP_MOD:
    if (isf) snprintf(x, sizeof x, "%s - %s * floor%s(%s / %s)", a, b, fs, a, b);
    else snprintf(x, sizeof x, "(%s)nf_mod(%s, %s)", ty, a, b);
    break;
  case NF_OP_POW: snprintf(x, sizeof x, "pow%s(%s, %s)", fs, a, b); break;
  case NF_OP_MIN:
    if (isf) snprintf(x, sizeof x, "(%s < %s || %s != %s) ? %s : %s", a, b, a, a, a, b);
    else snprintf(x, sizeof x, "%s < %s ? %s : %s", a, b, a, b);
    break;
  case NF_OP_MAX:
    if (isf) snprintf(x, sizeof x, "(%s > %s || %s != %s) ? %s : %s", a, b, a, a, a, b);
    else snprintf(x, sizeof x, "%s > %s ? %s : %s", a, b, a, b);
    break;
  case NF_OP_LT: snprintf(x, sizeof x, "%s < %s", a, b); break;
  case NF_OP_LE: snprintf(x, sizeof x, "%s <= %s", a, b); break;
  case NF_OP_GT: snprintf(x, sizeof x, "%s > %s", a, b); break;
  case NF_OP_GE: snprintf(x, sizeof x, "%s >= %s", a, b); break;
  case NF_OP_EQ: snprintf(x, sizeof x, "%s == %s", a, b); break;
  case NF_OP_NE: snprintf(x, sizeof x, "%s != %s", a, b); break;
  case NF_OP_AND: snprintf(x, sizeof x, "%s && %s", a, b); break;
  case NF_OP_OR: snprintf(x, sizeof x, "%s || %s", a, b); break;
  default:
    fail(c, NF_EINVAL, "operator %d is not an expression operator", e->op);
    snprintf(out, n, "0");
    return;
  }
  k = c->ntmp++;
  line(c, "const %s e%d = %s;", ty, k, x);
  memo_add(c, e, k);
  snprintf(out, n, "e%d", k);
}

/* ---- statements ---- */

static int64_t numel(const nf_lbuf *b) {
  int64_t n = 1;
  for (int d = 0; d < b->rank; d++) n *= b->shape[d];
  return n;
}

static uint64_t align256(uint64_t x) { return (x + 255) & ~(uint64_t)255; }

static void serial(cu *c, const nf_lstmt *s);

static void alloc_decl(cu *c, const nf_lstmt *s) {
  if (s->buf >= c->p->n_bufs) {
    fail(c, NF_EINVAL, "ALLOC of buffer %u of %u", s->buf, c->p->n_bufs);
    return;
  }
  const nf_lbuf *lb = &c->p->bufs[s->buf];
  const char *ty = stype(lb->dtype);
  if (bad_dtype(c, lb)) return;
  int64_t ne = numel(lb);
  uint64_t bytes = (uint64_t)(ne > 0 ? ne : 1) * nf_dtype_size((nf_dtype)lb->dtype);
  switch (c->ctx) {
  case CTX_GRID1: { /* the only thread of the launch: global scratch */
    uint64_t off = align256(c->plan->scratch_bytes);
    c->plan->scratch_bytes = off + bytes;
    line(c, "%s *b%u = (%s *)(scratch + %" PRIu64 "ull); /* %s */", ty, s->buf, ty, off,
         lb->name ? lb->name : "temp");
    break;
  }
  case CTX_BLOCK0:
    c->shared += align256(bytes);
    if (c->shared > NF_CUDA_MAX_SHARED)
      fail(c, NF_ELIMIT, "buffer '%s': a block's shared memory would exceed %d bytes",
           lb->name ? lb->name : "?", NF_CUDA_MAX_SHARED);
    line(c, "__shared__ __align__(16) %s b%u[%" PRId64 "]; /* %s */", ty, s->buf, ne > 0 ? ne : 1,
         lb->name ? lb->name : "temp");
    break;
  default:
    c->local += bytes;
    if (c->local > NF_CUDA_MAX_LOCAL)
      fail(c, NF_ELIMIT, "buffer '%s': a thread's local arrays would exceed %d bytes",
           lb->name ? lb->name : "?", NF_CUDA_MAX_LOCAL);
    line(c, "__align__(16) %s b%u[%" PRId64 "]; /* %s */", ty, s->buf, ne > 0 ? ne : 1,
         lb->name ? lb->name : "temp");
    break;
  }
}

static void store(cu *c, const nf_lstmt *s) {
  if (s->buf >= c->p->n_bufs) {
    fail(c, NF_EINVAL, "store to buffer %u of %u", s->buf, c->p->n_bufs);
    return;
  }
  const nf_lbuf *lb = &c->p->bufs[s->buf];
  int mark = c->n_m;
  line(c, "{");
  c->ind++;
  char o[96], v[96];
  offset(c, s->buf, s->n_idx, s->idx, o, sizeof o);
  val(c, s->value, v, sizeof v);
  int dt = lb->dtype, isf = nf_dtype_is_float((nf_dtype)dt);
  char lhs[128]; /* the element: b<buf>[<o>], or its lane nv<k>[v] */
  if (c->vst_buf == (int64_t)s->buf)
    snprintf(lhs, sizeof lhs, "nv%d[v%u - %s]", c->vst, c->vvar, c->vstart);
  else snprintf(lhs, sizeof lhs, "b%u[%s]", s->buf, o);
  const char *ty = vtype(dt), *ut = dt == NF_I32 ? "unsigned" : "unsigned long long";
  if (bad_dtype(c, lb)) {
    /* recorded */
  } else if (dt == NF_BOOL) {
    /* bool reductions: sum/max as or, prod/min as and (values are 0/1) */
    if (s->op == NF_RED_SUM || s->op == NF_RED_MAX)
      line(c, "b%u[%s] = (unsigned char)(b%u[%s] != 0 || %s);", s->buf, o, s->buf, o, v);
    else if (s->op == NF_RED_PROD || s->op == NF_RED_MIN)
      line(c, "b%u[%s] = (unsigned char)(b%u[%s] != 0 && %s);", s->buf, o, s->buf, o, v);
    else
      line(c, "b%u[%s] = (unsigned char)%s;", s->buf, o, v);
  } else {
    switch (s->op) {
    case NF_RED_SUM:
    case NF_RED_PROD: {
      const char *op = s->op == NF_RED_SUM ? "+" : "*";
      if (isf)
        line(c, "%s = %s %s %s;", lhs, lhs, op, v);
      else
        line(c, "%s = (%s)((%s)%s %s (%s)%s);", lhs, ty, ut, lhs, op, ut, v);
      break;
    }
    case NF_RED_MAX:
    case NF_RED_MIN: {
      const char *cmp = s->op == NF_RED_MAX ? ">" : "<";
      line(c, "const %s o_ = %s;", ty, lhs);
      if (isf)
        line(c, "%s = (o_ %s %s || o_ != o_) ? o_ : %s;", lhs, cmp, v, v);
      else
        line(c, "%s = o_ %s %s ? o_ : %s;", lhs, cmp, v, v);
      break;
    }
    default: line(c, "%s = %s;", lhs, v); break;
    }
  }
  c->ind--;
  line(c, "}");
  c->n_m = mark;
}

/* ---- vectorized loops ---- */

/* Whether e reads loop variable var. */
static int uses_var(const nf_expr *e, uint32_t var, int depth) {
  if (depth > 64) return 1;
  if (e->op == NF_OP_VAR) return e->u.var == var;
  for (int i = 0; i < e->n_args; i++)
    if (uses_var(e->args[i], var, depth + 1)) return 1;
  return 0;
}

/* Whether e is var plus terms without it (through additions). */
static int lane_term(const nf_expr *e, uint32_t var, int depth) {
  if (e->op == NF_OP_VAR) return e->u.var == var;
  if (e->op != NF_OP_ADD || e->dtype != NF_I64 || depth > 16) return 0;
  for (int a = 0; a < 2; a++)
    if (!uses_var(e->args[1 - a], var, 0)) return lane_term(e->args[a], var, depth + 1);
  return 0;
}

/* Whether an access or store with these indices reads W consecutive
 * elements as var runs 0..W-1: var only in the last index, as `var` or
 * `x + var` (x any sum of terms without var). */
static int lane_indices(const nf_expr *const *idx, int n, uint32_t var) {
  if (n < 1) return 0;
  for (int d = 0; d < n - 1; d++)
    if (uses_var(idx[d], var, 0)) return 0;
  return lane_term(idx[n - 1], var, 0);
}

/* The vector type of W elements of dtype dt, or NULL. */
static const char *vec_type(int dt, int64_t w) {
  if (w == 4) return dt == NF_F32 ? "float4" : dt == NF_I32 ? "int4" : NULL;
  if (w == 2)
    return dt == NF_F32   ? "float2"
           : dt == NF_I32 ? "int2"
           : dt == NF_F64 ? "double2"
           : dt == NF_I64 ? "longlong2"
                          : NULL;
  return NULL;
}

static int stores_buf(const nf_lstmt *s, uint32_t b) {
  for (int i = 0; i < s->n_body; i++)
    if (s->body[i]->buf == b) return 1;
  return 0;
}

/* Collects into c->vld the loads of e that every lane makes (not under a
 * select's branch) and that read W consecutive elements of a buffer the
 * loop does not store to. */
static void vec_loads(cu *c, const nf_lstmt *s, const nf_expr *e, const nf_expr **seen,
                      int *n_seen, int depth) {
  if (depth > 64 || c->n_vld == 16) return;
  for (int i = 0; i < *n_seen; i++)
    if (seen[i] == e) return;
  if (*n_seen < 256) seen[(*n_seen)++] = e;
  if (e->op == NF_OP_ACCESS) {
    if (e->u.tensor < c->p->n_bufs && vec_type(c->p->bufs[e->u.tensor].dtype, s->extent) &&
        !stores_buf(s, e->u.tensor) &&
        lane_indices((const nf_expr *const *)e->args, e->n_args, s->var))
      c->vld[c->n_vld++] = e;
    return;
  }
  int n = e->op == NF_OP_SELECT ? 1 : e->n_args; /* (a branch may not run) */
  for (int i = 0; i < n; i++) vec_loads(c, s, e->args[i], seen, n_seen, depth + 1);
}

static int reads_buf(const nf_expr *e, uint32_t b, int depth) {
  if (depth > 64) return 1;
  if (e->op == NF_OP_ACCESS && e->u.tensor == b) return 1;
  for (int i = 0; i < e->n_args; i++)
    if (reads_buf(e->args[i], b, depth + 1)) return 1;
  return 0;
}

/* Moves W elements between buffer b at offset o and lane array nv<id>:
 * one vector access where the address is aligned to the vector (checked
 * when it runs: buffers and offsets need not be), else W scalar ones. */
static void vec_move(cu *c, uint32_t b, const char *o, int id, int64_t w, int load) {
  const nf_lbuf *lb = &c->p->bufs[b];
  const char *vt = vec_type(lb->dtype, w);
  unsigned mask = (unsigned)(w * (int64_t)nf_dtype_size((nf_dtype)lb->dtype)) - 1u;
  if (load) {
    line(c, "if ((((unsigned long long)(b%u + %s)) & %uull) == 0) NF_VMOVE(%s, nv%d, b%u + %s);",
         b, o, mask, vt, id, b, o);
    line(c, "else for (int l_ = 0; l_ < %d; l_++) nv%d[l_] = b%u[%s + l_];", (int)w, id, b, o);
  } else {
    line(c, "if ((((unsigned long long)(b%u + %s)) & %uull) == 0) NF_VMOVE(%s, b%u + %s, nv%d);",
         b, o, mask, vt, b, o, id);
    line(c, "else for (int l_ = 0; l_ < %d; l_++) b%u[%s + l_] = nv%d[l_];", (int)w, b, o, id);
  }
}

static int vector_lanes(cu *c, const nf_lstmt *s, const char *start);
static int vec_plan(cu *c, const nf_lstmt *s, const nf_lstmt **vs);
static void plain_loop(cu *c, const nf_lstmt *s);

/* Whether e is linear in var: var, terms without it, and sums,
 * differences, negations and products by terms without it of those. */
static int linear_in(const nf_expr *e, uint32_t var, int depth) {
  if (depth > 32) return 0;
  if (!uses_var(e, var, 0)) return 1;
  switch (e->op) {
  case NF_OP_VAR: return 1;
  case NF_OP_NEG: return linear_in(e->args[0], var, depth + 1);
  case NF_OP_ADD:
  case NF_OP_SUB:
    return linear_in(e->args[0], var, depth + 1) && linear_in(e->args[1], var, depth + 1);
  case NF_OP_MUL:
    return (!uses_var(e->args[0], var, 0) && linear_in(e->args[1], var, depth + 1)) ||
           (!uses_var(e->args[1], var, 0) && linear_in(e->args[0], var, depth + 1));
  default: return 0;
  }
}

/* Whether the lanes where guard g holds form one run: g is a conjunction
 * of comparisons (not !=) of terms linear in var, each true on an
 * interval of var.  Then g holds for every lane when it holds for the
 * first and the last. */
static int interval_guard(const nf_expr *g, uint32_t var, int depth) {
  if (depth > 32) return 0;
  if (g->op == NF_OP_AND)
    return interval_guard(g->args[0], var, depth + 1) && interval_guard(g->args[1], var, depth + 1);
  if (g->op != NF_OP_LT && g->op != NF_OP_LE && g->op != NF_OP_GT && g->op != NF_OP_GE &&
      g->op != NF_OP_EQ)
    return 0;
  return nf_dtype_is_int((nf_dtype)g->args[0]->dtype) && linear_in(g->args[0], var, 0) &&
         linear_in(g->args[1], var, 0);
}

/* A vector loop whose stores sit under a guard that reads the lane (a
 * tile or row that does not divide): where the guard holds at the first
 * and the last lane (interval_guard: then at every lane) the lanes run
 * vectorized without it, else one by one with it.  0 when the guard or
 * the body is of another form, or nothing would be vectorized. */
static int guarded_lanes(cu *c, const nf_lstmt *s) {
  const nf_lstmt *g = s->body[0], *vs;
  if (!interval_guard(g->cond, s->var, 0)) return 0;
  nf_lstmt in = *s; /* the loop without its guard */
  in.body = g->body;
  in.n_body = g->n_body;
  int ok = vec_plan(c, &in, &vs);
  c->n_vld = 0;
  if (!ok) return 0;
  int mark = c->n_m;
  line(c, "{ /* %s: every lane in the guard? */", s->var_name ? s->var_name : "");
  c->ind++;
  line(c, "bool all%u_ = true;", s->var);
  for (int end = 0; end < 2; end++) {
    line(c, "{");
    c->ind++;
    line(c, "const long long v%u = %" PRId64 "LL;", s->var, end ? s->extent - 1 : 0);
    char a[96];
    val(c, g->cond, a, sizeof a);
    line(c, "all%u_ = all%u_ && (%s);", s->var, s->var, a);
    c->ind--;
    line(c, "}");
    c->n_m = mark;
  }
  line(c, "if (all%u_) {", s->var);
  c->ind++;
  vector_lanes(c, &in, "0");
  c->ind--;
  line(c, "} else {");
  c->ind++;
  plain_loop(c, s);
  c->ind--;
  line(c, "}");
  c->ind--;
  line(c, "}");
  c->n_m = mark;
  return 1;
}

/* A VECTOR loop of 2 or 4 iterations whose body is stores only: the
 * loads that read consecutive elements become one vector load each
 * before the loop (into a lane array), and a single store of
 * consecutive elements (its value not reading its buffer) one vector
 * store after it; the loop, unrolled, works on the lanes.  0 when the
 * loop has nothing to vectorize (it is then printed as usual). */
static int vector_loop(cu *c, const nf_lstmt *s) {
  if (s->extent != 2 && s->extent != 4) return 0;
  if (s->n_body == 1 && s->body[0]->kind == NF_LS_IF && uses_var(s->body[0]->cond, s->var, 0))
    return guarded_lanes(c, s);
  if (s->n_body == 1 && s->body[0]->kind == NF_LS_IF && !uses_var(s->body[0]->cond, s->var, 0)) {
    /* a guard the same for every lane (a reduction split that does not
     * divide): outside the loop, which then holds what it guards */
    nf_lstmt in = *s, guard = *s->body[0];
    nf_lstmt *inner[1] = {&in};
    in.body = guard.body;
    in.n_body = guard.n_body;
    guard.body = inner;
    guard.n_body = 1;
    serial(c, &guard);
    return 1;
  }
  return vector_lanes(c, s, "0");
}

/* The lanes of vector loop s (its extent: 2 or 4), from var = start:
 * vector_loop's work, also for the copies a block shares (block_stmt).
 * 0 when there is nothing to vectorize (nothing printed). */
/* What vector loop s (stores only) can vectorize: its vector loads into
 * c->vld (c->n_vld), its vector store into *vs (NULL: none).  0 when
 * nothing (c->n_vld is then 0). */
static int vec_plan(cu *c, const nf_lstmt *s, const nf_lstmt **vs) {
  c->n_vld = 0;
  *vs = NULL;
  for (int i = 0; i < s->n_body; i++)
    if (s->body[i]->kind != NF_LS_STORE || s->body[i]->buf >= c->p->n_bufs) return 0;
  const nf_expr *seen[256];
  int n_seen = 0;
  for (int i = 0; i < s->n_body; i++) {
    const nf_lstmt *st = s->body[i];
    vec_loads(c, s, st->value, seen, &n_seen, 0);
    for (int d = 0; d < st->n_idx; d++) vec_loads(c, s, st->idx[d], seen, &n_seen, 0);
  }
  const nf_lstmt *st = s->n_body == 1 ? s->body[0] : NULL;
  if (st && vec_type(c->p->bufs[st->buf].dtype, s->extent) &&
      lane_indices((const nf_expr *const *)st->idx, st->n_idx, s->var) &&
      !reads_buf(st->value, st->buf, 0))
    *vs = st;
  return c->n_vld > 0 || *vs;
}

static int vector_lanes(cu *c, const nf_lstmt *s, const char *start) {
  const nf_lstmt *vs;
  if (!vec_plan(c, s, &vs)) return 0;
  int64_t w = s->extent;
  int mark = c->n_m;
  line(c, "{ /* %s, vectorized */", s->var_name ? s->var_name : "");
  c->ind++;
  for (int q = 0; q < c->n_vld; q++) {
    c->vid[q] = c->nvec++;
    line(c, "__align__(16) %s nv%d[%d];", stype(c->p->bufs[c->vld[q]->u.tensor].dtype), c->vid[q],
         (int)w);
  }
  int sid = -1;
  if (vs) {
    sid = c->nvec++;
    line(c, "__align__(16) %s nv%d[%d];", stype(c->p->bufs[vs->buf].dtype), sid, (int)w);
    line(c, "long long nb%d;", sid);
  }
  /* the first lane's offsets (v = 0), the loads */
  line(c, "{");
  c->ind++;
  line(c, "const long long v%u = %s;", s->var, start);
  char o[96];
  for (int q = 0; q < c->n_vld && !c->rc; q++) {
    const nf_expr *e = c->vld[q];
    offset(c, e->u.tensor, e->n_args, e->args, o, sizeof o);
    vec_move(c, e->u.tensor, o, c->vid[q], w, 1);
  }
  if (vs && !c->rc) {
    offset(c, vs->buf, vs->n_idx, vs->idx, o, sizeof o);
    line(c, "nb%d = %s;", sid, o);
    if (vs->op != NF_RED_NONE) vec_move(c, vs->buf, o, sid, w, 1);
  }
  c->ind--;
  line(c, "}");
  c->n_m = mark;
  c->vvar = s->var;
  c->vst = sid;
  c->vst_buf = vs ? (int64_t)vs->buf : -1;
  snprintf(c->vstart, sizeof c->vstart, "%s", start);
  line(c, "#pragma unroll");
  line(c, "for (long long v%u = %s; v%u < %s + %" PRId64 "LL; v%u++) {", s->var, start, s->var,
       start, w, s->var);
  c->ind++;
  for (int i = 0; i < s->n_body; i++) serial(c, s->body[i]);
  c->ind--;
  line(c, "}");
  c->n_m = mark;
  c->n_vld = 0;
  c->vst_buf = -1;
  if (vs) {
    char nb[32];
    snprintf(nb, sizeof nb, "nb%d", sid);
    vec_move(c, vs->buf, nb, sid, w, 0);
  }
  c->ind--;
  line(c, "}");
  return 1;
}

/* Loop s as a for loop (unrolled where it is an unroll or vector loop). */
static void plain_loop(cu *c, const nf_lstmt *s) {
  if (s->loop_kind == NF_LOOP_UNROLL || s->loop_kind == NF_LOOP_VECTOR) line(c, "#pragma unroll");
  line(c, "for (long long v%u = 0; v%u < %" PRId64 "LL; v%u++) { /* %s */", s->var, s->var,
       s->extent, s->var, s->var_name ? s->var_name : "");
  c->ind++;
  int mark = c->n_m;
  for (int i = 0; i < s->n_body; i++) serial(c, s->body[i]);
  c->n_m = mark;
  c->ind--;
  line(c, "}");
}

static void serial(cu *c, const nf_lstmt *s) {
  if (c->rc) return;
  if (!s) {
    fail(c, NF_EINVAL, "NULL statement");
    return;
  }
  switch (s->kind) {
  case NF_LS_LOOP: {
    if (s->extent <= 0) return;
    if (s->loop_kind == NF_LOOP_VECTOR && c->n_vld == 0 && c->vst_buf < 0 && vector_loop(c, s))
      break;
    plain_loop(c, s);
    break;
  }
  case NF_LS_STORE: store(c, s); break;
  case NF_LS_IF: {
    int mark = c->n_m;
    line(c, "{");
    c->ind++;
    char a[96];
    val(c, s->cond, a, sizeof a);
    line(c, "if (%s) {", a);
    c->ind++;
    for (int i = 0; i < s->n_body; i++) serial(c, s->body[i]);
    c->ind--;
    line(c, "}");
    c->ind--;
    line(c, "}");
    c->n_m = mark;
    break;
  }
  case NF_LS_SEQ:
    for (int i = 0; i < s->n_body; i++) serial(c, s->body[i]);
    break;
  case NF_LS_ALLOC: {
    line(c, "{");
    c->ind++;
    alloc_decl(c, s);
    for (int i = 0; i < s->n_body; i++) serial(c, s->body[i]);
    c->ind--;
    line(c, "}");
    break;
  }
  default: fail(c, NF_EINVAL, "statement kind %d", s->kind); break;
  }
}

/* ---- kernels ---- */

static int is_bound(const nf_lstmt *s, int kind) {
  return s && s->kind == NF_LS_LOOP && s->loop_kind == kind;
}

/* Collects the chain of directly nested loops of one kind from s; returns
 * its length, the product of extents in *count (saturating at 2^62) and
 * the innermost loop in *in. */
static int chain(const nf_lstmt *s, int kind, const nf_lstmt **loops, int cap, int64_t *count,
                 const nf_lstmt **in) {
  int n = 0;
  *count = 1;
  *in = NULL;
  while (is_bound(s, kind) && n < cap) {
    loops[n++] = s;
    *count = *count > (INT64_C(1) << 62) / (s->extent > 0 ? s->extent : 1) ? INT64_C(1) << 62
                                                                           : *count * s->extent;
    *in = s;
    s = s->n_body == 1 ? s->body[0] : NULL;
  }
  return n;
}

/* Declares the loop variables of a chain from a flat index. */
static void unflatten(cu *c, const nf_lstmt *const *loops, int n, const char *flat) {
  if (n == 1) {
    line(c, "const long long v%u = %s; /* %s */", loops[0]->var, flat,
         loops[0]->var_name ? loops[0]->var_name : "");
    return;
  }
  line(c, "long long r_ = %s;", flat);
  for (int i = n - 1; i >= 0; i--) {
    line(c, "const long long v%u = r_ %% %" PRId64 "LL; /* %s */", loops[i]->var, loops[i]->extent,
         loops[i]->var_name ? loops[i]->var_name : "");
    if (i > 0) line(c, "r_ /= %" PRId64 "LL;", loops[i]->extent);
  }
}

static void block_list(cu *c, nf_lstmt *const *list, int n, int *first);

/* Whether s holds a loop bound to threads. */
static int has_thread(const nf_lstmt *s) {
  if (!s) return 0;
  if (is_bound(s, NF_LOOP_THREAD)) return 1;
  for (int i = 0; i < s->n_body; i++)
    if (has_thread(s->body[i])) return 1;
  return 0;
}

/* Whether expression e reads buffer b. */
static int reads(const nf_expr *e, uint32_t b) {
  if (e->op == NF_OP_ACCESS && e->u.tensor == b) return 1;
  for (int i = 0; i < e->n_args; i++)
    if (reads(e->args[i], b)) return 1;
  return 0;
}

/* Whether every store under s writes element `var` of some dimension d
 * (*dim: the same d for all), plainly (no accumulation), into a buffer no
 * expression under `root` reads. */
static int stores_split_by(const nf_lstmt *root, const nf_lstmt *s, uint32_t var, int *dim) {
  if (s->kind == NF_LS_STORE) {
    if (s->op != NF_RED_NONE) return 0;
    int d = -1;
    for (int k = 0; k < s->n_idx && d < 0; k++)
      if (s->idx[k]->op == NF_OP_VAR && s->idx[k]->u.var == var) d = k;
    if (d < 0 || (*dim >= 0 && *dim != d)) return 0;
    *dim = d;
    /* no expression under root reads what is stored */
    const nf_lstmt *stack[256];
    int sp = 0;
    stack[sp++] = root;
    while (sp > 0) {
      const nf_lstmt *x = stack[--sp];
      if (x->kind == NF_LS_STORE) {
        if (reads(x->value, s->buf)) return 0;
        for (int k = 0; k < x->n_idx; k++)
          if (reads(x->idx[k], s->buf)) return 0;
      }
      if (x->kind == NF_LS_IF && reads(x->cond, s->buf)) return 0;
      for (int i = 0; i < x->n_body; i++) {
        if (sp == 256) return 0;
        stack[sp++] = x->body[i];
      }
    }
    return 1;
  }
  if (s->kind == NF_LS_ALLOC) return 0;
  for (int i = 0; i < s->n_body; i++)
    if (!stores_split_by(root, s->body[i], var, dim)) return 0;
  return 1;
}

/* A block-level statement that the block's threads can share: the
 * longest chain of directly nested loops from s whose variables each
 * index the same dimension of every store under s (plain stores into
 * buffers nothing under s reads: a copy, a region computed at a block
 * loop), so that two iterations never write the same element.  Returns
 * the chain's length (0: run it on thread 0). */
static int shareable(const nf_lstmt *s, const nf_lstmt **loops, int cap) {
  int n = 0;
  const nf_lstmt *x = s;
  while (x && x->kind == NF_LS_LOOP && n < cap && x->loop_kind != NF_LOOP_BLOCK &&
         x->loop_kind != NF_LOOP_THREAD) {
    int dim = -1;
    if (!stores_split_by(s, x, x->var, &dim)) break;
    loops[n++] = x;
    x = x->n_body == 1 ? x->body[0] : NULL;
  }
  return n;
}

/* A copy the block's threads share (loops[0..n), cnt iterations) whose
 * innermost loop runs along consecutive elements in fours (or twos):
 * each thread takes groups of 4 (2) iterations of it as vector lanes
 * (vector_lanes), so a staging copy reads and writes with vector
 * accesses.  0 when it does not apply (nothing printed). */
static int shared_vector(cu *c, const nf_lstmt *const *loops, int n, int64_t cnt) {
  const nf_lstmt *in = loops[n - 1];
  int64_t e = in->extent, w = e % 4 == 0 ? 4 : e % 2 == 0 ? 2 : 0;
  if (!w || c->n_vld || c->vst_buf >= 0) return 0;
  nf_lstmt lanes = *in;
  lanes.extent = w;
  const nf_lstmt *vs;
  int ok = vec_plan(c, &lanes, &vs);
  c->n_vld = 0;
  if (!ok) return 0;
  int mark = c->n_m;
  line(c, "for (long long f_ = threadIdx.x; f_ < %" PRId64 "LL; f_ += blockDim.x) {", cnt / w);
  c->ind++;
  int ctx = c->ctx;
  line(c, "long long r_ = f_;");
  line(c, "const long long g_ = r_ %% %" PRId64 "LL; /* %s, by %d */", e / w,
       in->var_name ? in->var_name : "", (int)w);
  for (int i = n - 2; i >= 0; i--) {
    line(c, "r_ /= %" PRId64 "LL;", i == n - 2 ? e / w : loops[i + 1]->extent);
    line(c, "const long long v%u = r_ %% %" PRId64 "LL; /* %s */", loops[i]->var,
         loops[i]->extent, loops[i]->var_name ? loops[i]->var_name : "");
  }
  c->ctx = CTX_THREAD;
  char start[32];
  snprintf(start, sizeof start, "g_ * %d", (int)w);
  vector_lanes(c, &lanes, start);
  c->ctx = ctx;
  c->n_m = mark;
  c->ind--;
  line(c, "}");
  return 1;
}

static void block_stmt(cu *c, const nf_lstmt *s, int *first) {
  if (c->rc) return;
  if (s->kind == NF_LS_SEQ) {
    block_list(c, s->body, s->n_body, first);
    return;
  }
  if (s->kind != NF_LS_ALLOC) {
    if (!*first) line(c, "__syncthreads();");
    *first = 0;
  }
  const nf_lstmt *loops[NF_MAX_VARS], *in;
  int n;
  if (is_bound(s, NF_LOOP_THREAD)) {
    int64_t cnt;
    n = chain(s, NF_LOOP_THREAD, loops, NF_MAX_VARS, &cnt, &in);
    if (cnt == 0) return;
    if (cnt > NF_CUDA_MAX_THREADS) {
      fail(c, NF_ELIMIT, "loop '%s': %" PRId64 " threads in a block (at most %d)",
           s->var_name ? s->var_name : "?", cnt, NF_CUDA_MAX_THREADS);
      return;
    }
    if ((uint32_t)cnt > c->block) c->block = (uint32_t)cnt;
    line(c, "if (threadIdx.x < %" PRId64 "u) {", cnt);
    c->ind++;
    int mark = c->n_m, ctx = c->ctx;
    unflatten(c, loops, n, "(long long)threadIdx.x");
    c->ctx = CTX_THREAD;
    for (int i = 0; i < in->n_body; i++) serial(c, in->body[i]);
    c->ctx = ctx;
    c->n_m = mark;
    c->ind--;
    line(c, "}");
  } else if (s->kind == NF_LS_ALLOC) {
    int ctx = c->ctx;
    c->ctx = CTX_BLOCK0; /* shared by the block's threads */
    alloc_decl(c, s);
    c->ctx = ctx;
    block_list(c, s->body, s->n_body, first);
  } else if (s->kind == NF_LS_LOOP && has_thread(s)) {
    /* a loop every thread of the block runs alike (its bounds are
     * constant): its body's statements separated by barriers, and one at
     * the end of each iteration, before the next overwrites what this one
     * staged */
    if (s->extent <= 0) return;
    line(c, "for (long long v%u = 0; v%u < %" PRId64 "LL; v%u++) { /* %s */", s->var, s->var,
         s->extent, s->var, s->var_name ? s->var_name : "");
    c->ind++;
    int mark = c->n_m, f = 1;
    block_list(c, s->body, s->n_body, &f);
    line(c, "__syncthreads();");
    c->n_m = mark;
    c->ind--;
    line(c, "}");
  } else if (s->kind == NF_LS_IF && has_thread(s)) {
    /* its condition uses block and block-level loop variables only: the
     * same for every thread, so barriers inside are reached by all */
    int mark = c->n_m, f = 1;
    char a[96];
    line(c, "{");
    c->ind++;
    val(c, s->cond, a, sizeof a);
    line(c, "if (%s) {", a);
    c->ind++;
    block_list(c, s->body, s->n_body, &f);
    c->ind--;
    line(c, "}");
    c->ind--;
    line(c, "}");
    c->n_m = mark;
  } else if ((n = shareable(s, loops, NF_MAX_VARS)) > 0) {
    /* shared by the block's threads, iterations strided by the block */
    int64_t cnt = 1;
    for (int i = 0; i < n; i++) cnt *= loops[i]->extent;
    if (cnt <= 0) return;
    if (shared_vector(c, loops, n, cnt)) return;
    line(c, "for (long long f_ = threadIdx.x; f_ < %" PRId64 "LL; f_ += blockDim.x) {", cnt);
    c->ind++;
    int mark = c->n_m, ctx = c->ctx;
    unflatten(c, loops, n, "f_");
    c->ctx = CTX_THREAD;
    for (int i = 0; i < loops[n - 1]->n_body; i++) serial(c, loops[n - 1]->body[i]);
    c->ctx = ctx;
    c->n_m = mark;
    c->ind--;
    line(c, "}");
  } else {
    line(c, "if (threadIdx.x == 0) {");
    c->ind++;
    int mark = c->n_m, ctx = c->ctx;
    c->ctx = CTX_BLOCK0;
    serial(c, s);
    c->ctx = ctx;
    c->n_m = mark;
    c->ind--;
    line(c, "}");
  }
}

static void block_list(cu *c, nf_lstmt *const *list, int n, int *first) {
  for (int i = 0; i < n && !c->rc; i++) block_stmt(c, list[i], first);
}

/* One launch for top-level statement s. */
static void kernel(cu *c, const nf_lstmt *s, nf_buf *src) {
  nf_buf body = NF_BUF_INIT;
  nf_buf *saved = c->o;
  c->o = &body;
  c->ind = 1;
  c->n_m = 0;
  c->block = 1;
  c->shared = 0;
  c->local = 0;
  int64_t grid = 1;
  const nf_lstmt *share[NF_MAX_VARS];
  int n_share;
  if (is_bound(s, NF_LOOP_BLOCK) || has_thread(s)) {
    const nf_lstmt *loops[NF_MAX_VARS], *in = NULL;
    int n = chain(s, NF_LOOP_BLOCK, loops, NF_MAX_VARS, &grid, &in);
    if (grid == 0) goto done; /* no iterations: no launch */
    if (grid > INT32_MAX) {
      fail(c, NF_ELIMIT, "loop '%s': %" PRId64 " blocks (at most 2^31 - 1)",
           s->var_name ? s->var_name : "?", grid);
      goto done;
    }
    c->ctx = CTX_BLOCK0;
    int first = 1;
    if (n) {
      unflatten(c, loops, n, "(long long)blockIdx.x");
      block_list(c, in->body, in->n_body, &first);
    } else {
      block_stmt(c, s, &first);
    }
  } else if ((n_share = shareable(s, share, NF_MAX_VARS)) > 0) {
    /* an unbound nest whose iterations write distinct elements (an
     * identity fill, an elementwise pass): spread over the grid */
    int64_t cnt = 1;
    for (int i = 0; i < n_share; i++) cnt *= share[i]->extent;
    if (cnt <= 0) goto done;
    c->block = cnt < 256 ? (uint32_t)cnt : 256;
    int64_t blocks = (cnt + c->block - 1) / c->block;
    grid = blocks < 65535 ? blocks : 65535;
    c->ctx = CTX_THREAD;
    line(c, "for (long long f_ = (long long)blockIdx.x * blockDim.x + threadIdx.x; f_ < %" PRId64
            "LL; f_ += (long long)gridDim.x * blockDim.x) {", cnt);
    c->ind++;
    unflatten(c, share, n_share, "f_");
    for (int i = 0; i < share[n_share - 1]->n_body; i++) serial(c, share[n_share - 1]->body[i]);
    c->ind--;
    line(c, "}");
  } else {
    c->ctx = CTX_GRID1;
    serial(c, s);
  }
  if (!c->rc) {
    nf_cuda_plan *pl = c->plan;
    nf_cuda_launch *L = realloc(pl->launches, (size_t)(pl->n_launches + 1) * sizeof *L);
    if (!L) {
      fail(c, NF_ENOMEM, "out of memory");
      goto done;
    }
    pl->launches = L;
    nf_cuda_launch *l = &L[pl->n_launches];
    memset(l, 0, sizeof *l);
    snprintf(l->name, sizeof l->name, "nf_k%d", pl->n_launches);
    l->grid = (uint32_t)grid;
    l->block = c->block;
    l->shared_bytes = (uint32_t)c->shared;
    pl->n_launches++;
    nf_buf_printf(src, "extern \"C\" __global__ void __launch_bounds__(%u) %s(", l->block, l->name);
    for (uint32_t a = 0; a < c->p->n_args; a++) nf_buf_printf(src, "void *a%u, ", a);
    nf_buf_puts(src, "unsigned char *scratch) {\n");
    for (uint32_t b = 0; b < c->p->n_bufs; b++) {
      const nf_lbuf *lb = &c->p->bufs[b];
      if (lb->kind == NF_BUF_TEMP) continue;
      nf_buf_printf(src, "  %s%s *b%u = (%s%s *)a%d; /* %s */\n",
                    lb->kind == NF_BUF_INPUT ? "const " : "", stype(lb->dtype), b,
                    lb->kind == NF_BUF_INPUT ? "const " : "", stype(lb->dtype), lb->arg,
                    lb->name ? lb->name : "");
    }
    for (int t = 0; t < c->n_top; t++) {
      const nf_lbuf *lb = &c->p->bufs[c->top[t].buf];
      nf_buf_printf(src, "  %s *b%u = (%s *)(scratch + %" PRIu64 "ull); /* %s */\n",
                    stype(lb->dtype), c->top[t].buf, stype(lb->dtype), c->top[t].off,
                    lb->name ? lb->name : "temp");
    }
    nf_buf_printf(src, "  (void)scratch;\n%s}\n\n", nf_buf_str(&body));
  }
done:
  nf_buf_free(&body);
  c->o = saved;
}

static void top(cu *c, const nf_lstmt *s, nf_buf *src) {
  if (c->rc) return;
  if (!s) {
    fail(c, NF_EINVAL, "NULL statement");
    return;
  }
  if (s->kind == NF_LS_SEQ) {
    for (int i = 0; i < s->n_body; i++) top(c, s->body[i], src);
  } else if (s->kind == NF_LS_ALLOC) {
    if (s->buf >= c->p->n_bufs) {
      fail(c, NF_EINVAL, "ALLOC of buffer %u of %u", s->buf, c->p->n_bufs);
      return;
    }
    const nf_lbuf *lb = &c->p->bufs[s->buf];
    if (bad_dtype(c, lb) || !grow(c, (void **)&c->top, c->n_top, &c->cap_top, 16, sizeof *c->top))
      return;
    int64_t ne = numel(lb);
    uint64_t off = align256(c->plan->scratch_bytes);
    c->plan->scratch_bytes = off + (uint64_t)(ne > 0 ? ne : 1) * nf_dtype_size((nf_dtype)lb->dtype);
    c->top[c->n_top].buf = s->buf;
    c->top[c->n_top++].off = off;
    for (int i = 0; i < s->n_body; i++) top(c, s->body[i], src);
    c->n_top--;
  } else {
    kernel(c, s, src);
  }
}

static const char prelude[] =
    "/* generated by neoflow (common/lower/cuda_backend.c) */\n"
    "#ifndef NF_VMOVE\n"
    "#define NF_VMOVE(VT, dst, src) (*(VT *)(dst) = *(const VT *)(src))\n"
    "#endif\n"
    "static __device__ __forceinline__ long long nf_floordiv(long long a, long long b) {\n"
    "  long long q = a / b;\n"
    "  if (a % b != 0 && ((a < 0) != (b < 0))) q--;\n"
    "  return q;\n"
    "}\n"
    "static __device__ __forceinline__ long long nf_mod(long long a, long long b) {\n"
    "  long long m = a % b;\n"
    "  if (m != 0 && ((m < 0) != (b < 0))) m += b;\n"
    "  return m;\n"
    "}\n"
    "static __device__ __forceinline__ float nf_sigmoidf(float x) {\n"
    "  if (x >= 0) return 1.0f / (1.0f + expf(-x));\n"
    "  const float e = expf(x);\n"
    "  return e / (1.0f + e);\n"
    "}\n"
    "static __device__ __forceinline__ double nf_sigmoid(double x) {\n"
    "  if (x >= 0) return 1.0 / (1.0 + exp(-x));\n"
    "  const double e = exp(x);\n"
    "  return e / (1.0 + e);\n"
    "}\n\n";

int nf_cuda_emit(const nf_lprog *p, nf_buf *src, nf_cuda_plan *plan, nf_buf *err) {
  nf_cuda_plan_free(plan);
  if (!p || !p->root || (!p->bufs && p->n_bufs)) {
    nf_buf_puts(err, "empty program");
    return NF_EINVAL;
  }
  int rc = nf__loop_validate(p, err);
  if (rc) return rc;
  cu c;
  memset(&c, 0, sizeof c);
  c.vst_buf = -1;
  c.p = p;
  c.err = err;
  for (uint32_t b = 0; b < p->n_bufs; b++)
    if (bad_dtype(&c, &p->bufs[b])) return c.rc;
  c.plan = plan;
  plan->n_args = p->n_args;
  nf_buf out = NF_BUF_INIT;
  nf_buf_puts(&out, prelude);
  top(&c, p->root, &out);
  free(c.m);
  free(c.top);
  if (c.rc) {
    nf_buf_free(&out);
    nf_cuda_plan_free(plan);
    return c.rc;
  }
  nf_buf_add(src, out.data, out.len);
  nf_buf_free(&out);
  return NF_OK;
}
