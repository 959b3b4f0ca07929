/* graph_wire.c - conversion between nf_graph (nf_ir.h) and its wire form
 * (neoflow.Graph): a flat list of expressions whose arguments are indices
 * of earlier entries, shared by every statement.
 *
 * nf_wire_graph_from_ir walks each statement's expression DAG with an
 * explicit stack (expressions may be deep chains) and emits each distinct
 * node (pointer: nodes are hash-consed) once, arguments first.
 *
 * nf_wire_graph_to_ir trusts nothing: it checks the whole wire graph
 * before building anything (counts, ranks, sizes and their products, the
 * inputs and outputs lists against the tensor kinds, every expression's
 * op, arity, payload, argument references and typing by the rules that
 * ir.c's constructors assert, every statement's fields), so that no
 * constructor assertion can fire; then builds the graph and runs
 * nf_graph_validate for what depends on statement order (a tensor read
 * before it is produced, produced twice or never, variables in range).
 * Expression depth is checked on the list, before anything is built
 * (every later stage may recurse over a validated graph's expressions),
 * and again on the built graph with the producers a schedule may inline
 * substituted; last come the index bounds (nf_graph_check_bounds: an
 * access certainly evaluated out of bounds is refused, naming it).
 * Arguments may only point at earlier expressions, so the list is acyclic
 * by construction and nothing here recurses.  The nodes reached per
 * statement, summed over statements, are bounded too
 * (NF_WIRE_MAX_STMT_NODES), since statements may share expressions and
 * every later stage walks each statement's DAG.
 *
 * The enum values of the wire (DType, Op, TensorKind, RedOp) are nf_ir.h's
 * one to one; the static assertions below keep them so. */
#include "nf_wire.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "nf_ptrmap.h"

_Static_assert(NEOFLOW__DTYPE__DT_F64 == (int)NF_F64 && NF_N_DTYPES == 7, "DType != nf_dtype");
_Static_assert(NEOFLOW__OP__OP_SELECT == (int)NF_OP_SELECT && NF_N_OPS == 35 &&
                   NEOFLOW__OP__OP_CAST == (int)NF_OP_CAST &&
                   NEOFLOW__OP__OP_ADD == (int)NF_OP_ADD && NEOFLOW__OP__OP_LT == (int)NF_OP_LT,
               "Op != nf_op");
_Static_assert(NEOFLOW__TENSOR_KIND__TK_OUTPUT == (int)NF_T_OUTPUT, "TensorKind != nf_tkind");
_Static_assert(NEOFLOW__RED_OP__RED_MIN == (int)NF_RED_MIN, "RedOp != nf_redop");

/* ---- IR -> wire ---- */

/* expression -> its index in the wire list: the common pointer map
 * (nf_ptrmap.h); a zeroed map is an empty one */
typedef nf_ptrmap emap;

static int emap_get(const emap *m, const nf_expr *e, uint32_t *val) {
  uint64_t v;
  if (!nf_ptrmap_get(m, e, &v)) return 0;
  *val = (uint32_t)v;
  return 1;
}

static int emap_put(emap *m, const nf_expr *e, uint32_t val) { return nf_ptrmap_put(m, e, val); }

typedef struct dfs_frame {
  const nf_expr *e;
  uint32_t next; /* next argument to visit */
} dfs_frame;

typedef struct flat {
  Neoflow__Graph *pg;
  size_t cap_exprs;
  emap map;
  dfs_frame *stack;
  size_t sp, cap_stack;
} flat;

static char *dup_str(const char *s) {
  if (!s) s = "";
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* Appends the wire form of e (whose arguments are mapped already). */
static int emit(flat *f, const nf_expr *e) {
  Neoflow__Graph *pg = f->pg;
  if (pg->n_exprs >= NF_WIRE_MAX_EXPRS) return NF_ELIMIT;
  if (pg->n_exprs == f->cap_exprs) {
    size_t ncap = f->cap_exprs ? f->cap_exprs * 2 : 64;
    Neoflow__Expr **na = realloc(pg->exprs, ncap * sizeof(*na));
    if (!na) return NF_ENOMEM;
    pg->exprs = na;
    f->cap_exprs = ncap;
  }
  Neoflow__Expr *x = malloc(sizeof(*x));
  if (!x) return NF_ENOMEM;
  neoflow__expr__init(x);
  x->op = (Neoflow__Op)e->op;
  x->dtype = (Neoflow__DType)e->dtype;
  if (e->op == NF_OP_CONST) {
    if (nf_dtype_is_float((nf_dtype)e->dtype)) {
      x->f = e->u.f;
      x->neg_zero = e->u.f == 0 && signbit(e->u.f); /* see neoflow.proto */
    } else
      x->i = e->u.i;
  } else if (e->op == NF_OP_VAR) {
    x->var = e->u.var;
  } else if (e->op == NF_OP_ACCESS) {
    x->tensor = e->u.tensor;
  }
  if (e->n_args) {
    x->args = malloc(e->n_args * sizeof(*x->args));
    if (!x->args) {
      free(x);
      return NF_ENOMEM;
    }
    x->n_args = e->n_args;
    for (uint32_t k = 0; k < e->n_args; k++)
      NF_ASSERT(emap_get(&f->map, e->args[k], &x->args[k]));
  }
  uint32_t idx = (uint32_t)pg->n_exprs;
  pg->exprs[pg->n_exprs++] = x;
  return emap_put(&f->map, e, idx);
}

static int push(flat *f, const nf_expr *e) {
  if (f->sp == f->cap_stack) {
    size_t ncap = f->cap_stack ? f->cap_stack * 2 : 256;
    dfs_frame *ns = realloc(f->stack, ncap * sizeof(*ns));
    if (!ns) return NF_ENOMEM;
    f->stack = ns;
    f->cap_stack = ncap;
  }
  f->stack[f->sp].e = e;
  f->stack[f->sp].next = 0;
  f->sp++;
  return NF_OK;
}

/* Emits root's DAG in post-order (each node once) and sets *idx. */
static int flatten(flat *f, const nf_expr *root, uint32_t *idx) {
  if (emap_get(&f->map, root, idx)) return NF_OK;
  int rc = push(f, root);
  while (!rc && f->sp) {
    dfs_frame *top = &f->stack[f->sp - 1];
    if (top->next < top->e->n_args) {
      const nf_expr *a = top->e->args[top->next++];
      uint32_t dummy;
      /* A node in the map is finished: an unfinished one is an ancestor
       * on the stack, which a DAG cannot reach again. */
      if (!emap_get(&f->map, a, &dummy)) rc = push(f, a);
      continue;
    }
    const nf_expr *e = top->e;
    f->sp--;
    rc = emit(f, e);
  }
  if (rc) return rc;
  NF_ASSERT(emap_get(&f->map, root, idx));
  return NF_OK;
}

static int copy_u32(uint32_t **dst, size_t *n_dst, const uint32_t *src, uint32_t n) {
  if (!n) return NF_OK;
  *dst = malloc(n * sizeof(**dst));
  if (!*dst) return NF_ENOMEM;
  memcpy(*dst, src, n * sizeof(**dst));
  *n_dst = n;
  return NF_OK;
}

static int from_ir(const nf_graph *g, flat *f) {
  Neoflow__Graph *pg = f->pg;
  if (!(pg->name = dup_str(g->name))) return NF_ENOMEM;
  if (g->n_tensors) {
    pg->tensors = calloc(g->n_tensors, sizeof(*pg->tensors));
    if (!pg->tensors) return NF_ENOMEM;
  }
  for (uint32_t i = 0; i < g->n_tensors; i++) {
    const nf_tensor *t = &g->tensors[i];
    Neoflow__Tensor *pt = malloc(sizeof(*pt));
    if (!pt) return NF_ENOMEM;
    neoflow__tensor__init(pt);
    pg->tensors[pg->n_tensors++] = pt;
    pt->dtype = (Neoflow__DType)t->dtype;
    pt->kind = (Neoflow__TensorKind)t->kind;
    if (!(pt->name = dup_str(t->name))) return NF_ENOMEM;
    if (t->rank) {
      pt->shape = malloc(t->rank * sizeof(*pt->shape));
      if (!pt->shape) return NF_ENOMEM;
      memcpy(pt->shape, t->shape, t->rank * sizeof(*pt->shape));
      pt->n_shape = t->rank;
    }
  }
  if (g->n_stmts) {
    pg->stmts = calloc(g->n_stmts, sizeof(*pg->stmts));
    if (!pg->stmts) return NF_ENOMEM;
  }
  for (uint32_t si = 0; si < g->n_stmts; si++) {
    const nf_stmt *s = &g->stmts[si];
    Neoflow__Stmt *ps = malloc(sizeof(*ps));
    if (!ps) return NF_ENOMEM;
    neoflow__stmt__init(ps);
    pg->stmts[pg->n_stmts++] = ps;
    ps->out = s->out;
    ps->red = (Neoflow__RedOp)s->red;
    ps->flags = s->flags;
    if (s->n_red) {
      ps->red_lo = malloc(s->n_red * sizeof(*ps->red_lo));
      ps->red_ext = malloc(s->n_red * sizeof(*ps->red_ext));
      if (!ps->red_lo || !ps->red_ext) return NF_ENOMEM;
      memcpy(ps->red_lo, s->red_lo, s->n_red * sizeof(*ps->red_lo));
      memcpy(ps->red_ext, s->red_ext, s->n_red * sizeof(*ps->red_ext));
      ps->n_red_lo = ps->n_red_ext = s->n_red;
    }
    int rc = flatten(f, s->rhs, &ps->rhs);
    if (rc) return rc;
  }
  int rc = copy_u32(&pg->inputs, &pg->n_inputs, g->inputs, g->n_inputs);
  if (!rc) rc = copy_u32(&pg->outputs, &pg->n_outputs, g->outputs, g->n_outputs);
  return rc;
}

/* See nf_wire.h. */
int nf_wire_graph_from_ir(const nf_graph *g, Neoflow__Graph **out) {
  *out = NULL;
  if (nf_graph_validate(g, NULL) != NF_OK) return NF_EINVAL;
  if (g->n_tensors > NF_WIRE_MAX_TENSORS || g->n_stmts > NF_WIRE_MAX_STMTS) return NF_ELIMIT;
  flat f = {0};
  f.pg = malloc(sizeof(*f.pg));
  if (!f.pg) return NF_ENOMEM;
  neoflow__graph__init(f.pg);
  int rc = from_ir(g, &f);
  nf_ptrmap_free(&f.map);
  free(f.stack);
  if (rc) {
    nf_wire_graph_free(f.pg);
    return rc;
  }
  *out = f.pg;
  return NF_OK;
}

/* Frees a graph from nf_wire_graph_from_ir (every part is malloc'd, as
 * protobuf-c's default allocator expects); NULL is a no-op. */
void nf_wire_graph_free(Neoflow__Graph *pg) {
  if (pg) protobuf_c_message_free_unpacked(&pg->base, NULL);
}

/* ---- wire -> IR ---- */

static int gerr(nf_buf *err, const char *fmt, ...) NF_PRINTF(2, 3);
static int gerr(nf_buf *err, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    nf_buf_vprintf(err, fmt, ap);
    va_end(ap);
  }
  return NF_EINVAL;
}

/* "ADD", "CONST", ... (the wire's names without "OP_"). */
static const char *op_str(uint32_t op) {
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&neoflow__op__descriptor,
                                                                     (int)op);
  if (!v) return "?";
  return strncmp(v->name, "OP_", 3) == 0 ? v->name + 3 : v->name;
}

static const char *dt_str(uint32_t t) {
  const char *s = t < NF_N_DTYPES ? nf_dtype_name((nf_dtype)t) : NULL;
  return s ? s : "?";
}

static const char *tname(const Neoflow__Tensor *t) {
  return t->name && t->name[0] ? t->name : "?";
}

static int is_int(uint32_t t) { return nf_dtype_is_int((nf_dtype)t); }
static int is_float(uint32_t t) { return nf_dtype_is_float((nf_dtype)t); }

/* The checks of one tensor. */
static int check_tensor(const Neoflow__Tensor *t, size_t i, nf_buf *err) {
  if (!t) return gerr(err, "tensors[%zu]: missing", i);
  if ((uint32_t)t->dtype >= NF_N_DTYPES)
    return gerr(err, "tensors[%zu]: unknown dtype %d", i, (int)t->dtype);
  if ((uint32_t)t->kind > NF_T_OUTPUT)
    return gerr(err, "tensors[%zu]: unknown kind %d", i, (int)t->kind);
  if (t->name && strlen(t->name) > NF_WIRE_NAME_MAX)
    return gerr(err, "tensors[%zu]: name longer than %d bytes", i, NF_WIRE_NAME_MAX);
  if (t->n_shape > NF_MAX_RANK)
    return gerr(err, "tensors[%zu] (%s): rank %zu exceeds %d", i, tname(t), t->n_shape,
                NF_MAX_RANK);
  if (t->n_shape && !t->shape) return gerr(err, "tensors[%zu]: shape missing", i);
  int64_t numel = 1;
  for (size_t d = 0; d < t->n_shape; d++) {
    if (t->shape[d] < 0)
      return gerr(err, "tensors[%zu] (%s): negative size %lld in dimension %zu", i, tname(t),
                  (long long)t->shape[d], d);
    if (__builtin_mul_overflow(numel, t->shape[d], &numel))
      return gerr(err, "tensors[%zu] (%s): element count overflows int64", i, tname(t));
  }
  return NF_OK;
}

/* The inputs (pass 0) or outputs (pass 1) list against the tensor kinds;
 * listed is n_tensors bytes of scratch. */
static int check_list(const Neoflow__Graph *pg, int pass, uint8_t *listed, nf_buf *err) {
  size_t n = pass ? pg->n_outputs : pg->n_inputs;
  const uint32_t *ids = pass ? pg->outputs : pg->inputs;
  const char *what = pass ? "outputs" : "inputs";
  const char *kind = pass ? "OUTPUT" : "INPUT";
  uint32_t want = pass ? NF_T_OUTPUT : NF_T_INPUT;
  memset(listed, 0, pg->n_tensors);
  for (size_t k = 0; k < n; k++) {
    uint32_t id = ids[k];
    if (id >= pg->n_tensors)
      return gerr(err, "%s[%zu]: tensor %u out of range (%zu tensors)", what, k, id,
                  pg->n_tensors);
    if ((uint32_t)pg->tensors[id]->kind != want)
      return gerr(err, "%s[%zu]: tensor %u (%s) is not an %s tensor", what, k, id,
                  tname(pg->tensors[id]), kind);
    if (listed[id])
      return gerr(err, "%s[%zu]: tensor %u (%s) listed twice", what, k, id,
                  tname(pg->tensors[id]));
    listed[id] = 1;
  }
  for (size_t i = 0; i < pg->n_tensors; i++)
    if ((uint32_t)pg->tensors[i]->kind == want && !listed[i])
      return gerr(err, "tensors[%zu] (%s): %s tensor missing from %s", i,
                  tname(pg->tensors[i]), kind, what);
  return NF_OK;
}

/* 1 when x carries a payload field other than those allowed (f covers
 * f and neg_zero). */
static int has_payload(const Neoflow__Expr *x, int i, int f, int var, int tensor) {
  uint64_t fbits;
  memcpy(&fbits, &x->f, sizeof(fbits));
  return (!i && x->i != 0) || (!f && (fbits != 0 || x->neg_zero)) || (!var && x->var != 0) ||
         (!tensor && x->tensor != 0);
}

/* The checks of expression i, whose arguments (earlier entries) passed. */
static int check_expr(const Neoflow__Graph *pg, size_t i, nf_buf *err) {
  const Neoflow__Expr *x = pg->exprs[i];
  if (!x) return gerr(err, "exprs[%zu]: missing", i);
  uint32_t op = (uint32_t)x->op, t = (uint32_t)x->dtype;
  if (op >= NF_N_OPS) return gerr(err, "exprs[%zu]: unknown op %d", i, (int)x->op);
  if (t >= NF_N_DTYPES) return gerr(err, "exprs[%zu]: unknown dtype %d", i, (int)x->dtype);
  if (x->n_args && !x->args) return gerr(err, "exprs[%zu]: args missing", i);
  int arity = nf_op_arity((nf_op)op);
  if (op == NF_OP_ACCESS) {
    if (x->tensor >= pg->n_tensors)
      return gerr(err, "exprs[%zu]: ACCESS of tensor %u, out of range (%zu tensors)", i,
                  x->tensor, pg->n_tensors);
    arity = (int)pg->tensors[x->tensor]->n_shape;
  }
  if (x->n_args != (size_t)arity)
    return gerr(err, "exprs[%zu]: %s with %zu arguments, expected %d", i, op_str(op),
                x->n_args, arity);
  uint32_t a[3] = {0, 0, 0};
  for (size_t k = 0; k < x->n_args; k++) {
    if (x->args[k] >= i)
      return gerr(err, "exprs[%zu].args[%zu]: refers to exprs[%u], not an earlier expression",
                  i, k, x->args[k]);
    uint32_t at = (uint32_t)pg->exprs[x->args[k]]->dtype;
    if (k < 3) a[k] = at;
    if (op == NF_OP_ACCESS && at != NF_I64)
      return gerr(err, "exprs[%zu]: ACCESS index %zu is %s, not i64", i, k, dt_str(at));
  }
  uint32_t res = t; /* the dtype the rules give */
  const char *why = NULL;
  switch ((nf_op)op) {
  case NF_OP_CONST:
    if (has_payload(x, !is_float(t), is_float(t), 0, 0))
      return gerr(err, "exprs[%zu]: CONST of %s carries another payload", i, dt_str(t));
    if (x->neg_zero && x->f != 0)
      return gerr(err, "exprs[%zu]: CONST with neg_zero and f = %g", i, x->f);
    if (t == NF_BOOL && x->i != 0 && x->i != 1)
      return gerr(err, "exprs[%zu]: bool constant %lld is not 0 or 1", i, (long long)x->i);
    if (t == NF_I32 && (x->i < INT32_MIN || x->i > INT32_MAX))
      return gerr(err, "exprs[%zu]: i32 constant %lld out of range", i, (long long)x->i);
    break;
  case NF_OP_VAR:
    if (has_payload(x, 0, 0, 1, 0)) return gerr(err, "exprs[%zu]: VAR carries a payload", i);
    if (x->var >= NF_MAX_VARS)
      return gerr(err, "exprs[%zu]: variable %u out of range (at most %d)", i, x->var,
                  NF_MAX_VARS);
    res = NF_I64;
    break;
  case NF_OP_ACCESS:
    if (has_payload(x, 0, 0, 0, 1))
      return gerr(err, "exprs[%zu]: ACCESS carries a payload", i);
    res = (uint32_t)pg->tensors[x->tensor]->dtype;
    break;
  case NF_OP_CAST: break;
  case NF_OP_NEG:
  case NF_OP_ABS:
  case NF_OP_STOPGRAD:
    if (!is_int(a[0]) && !is_float(a[0])) why = "needs a numeric operand";
    res = a[0];
    break;
  case NF_OP_NOT:
    if (a[0] != NF_BOOL) why = "needs a bool operand";
    res = NF_BOOL;
    break;
  case NF_OP_ADD:
  case NF_OP_SUB:
  case NF_OP_MUL:
  case NF_OP_FLOORDIV:
  case NF_OP_MOD:
  case NF_OP_MIN:
  case NF_OP_MAX:
  case NF_OP_DIV:
  case NF_OP_POW:
    if (a[0] != a[1])
      return gerr(err, "exprs[%zu]: %s of %s and %s", i, op_str(op), dt_str(a[0]),
                  dt_str(a[1]));
    if (op == NF_OP_DIV || op == NF_OP_POW ? !is_float(a[0])
                                           : !is_int(a[0]) && !is_float(a[0]))
      return gerr(err, "exprs[%zu]: %s of %s", i, op_str(op), dt_str(a[0]));
    res = a[0];
    break;
  case NF_OP_LT:
  case NF_OP_LE:
  case NF_OP_GT:
  case NF_OP_GE:
  case NF_OP_EQ:
  case NF_OP_NE:
    if (a[0] != a[1])
      return gerr(err, "exprs[%zu]: %s of %s and %s", i, op_str(op), dt_str(a[0]),
                  dt_str(a[1]));
    res = NF_BOOL;
    break;
  case NF_OP_AND:
  case NF_OP_OR:
    if (a[0] != NF_BOOL || a[1] != NF_BOOL)
      return gerr(err, "exprs[%zu]: %s of %s and %s (needs bool)", i, op_str(op),
                  dt_str(a[0]), dt_str(a[1]));
    res = NF_BOOL;
    break;
  case NF_OP_SELECT:
    if (a[0] != NF_BOOL)
      return gerr(err, "exprs[%zu]: SELECT condition is %s, not bool", i, dt_str(a[0]));
    if (a[1] != a[2])
      return gerr(err, "exprs[%zu]: SELECT branches are %s and %s", i, dt_str(a[1]),
                  dt_str(a[2]));
    res = a[1];
    break;
  default: /* EXP .. CEIL: floats */
    if (!is_float(a[0])) why = "needs a float operand";
    res = a[0];
    break;
  }
  if (why) return gerr(err, "exprs[%zu]: %s of %s %s", i, op_str(op), dt_str(a[0]), why);
  if (op > NF_OP_ACCESS && has_payload(x, 0, 0, 0, 0))
    return gerr(err, "exprs[%zu]: %s carries a payload", i, op_str(op));
  if (res != t)
    return gerr(err, "exprs[%zu]: %s has dtype %s, its operands give %s", i, op_str(op),
                dt_str(t), dt_str(res));
  return NF_OK;
}

static int check_stmt(const Neoflow__Graph *pg, size_t si, nf_buf *err) {
  const Neoflow__Stmt *s = pg->stmts[si];
  if (!s) return gerr(err, "stmts[%zu]: missing", si);
  if (s->out >= pg->n_tensors)
    return gerr(err, "stmts[%zu]: output tensor %u out of range (%zu tensors)", si, s->out,
                pg->n_tensors);
  const Neoflow__Tensor *t = pg->tensors[s->out];
  if ((uint32_t)t->kind == NF_T_INPUT)
    return gerr(err, "stmts[%zu]: writes INPUT tensor %u (%s)", si, s->out, tname(t));
  if ((uint32_t)s->red > NF_RED_MIN)
    return gerr(err, "stmts[%zu]: unknown reduction %d", si, (int)s->red);
  if (s->n_red_lo != s->n_red_ext)
    return gerr(err, "stmts[%zu]: %zu red_lo but %zu red_ext", si, s->n_red_lo, s->n_red_ext);
  if ((s->n_red_lo && !s->red_lo) || (s->n_red_ext && !s->red_ext))
    return gerr(err, "stmts[%zu]: reduction ranges missing", si);
  if (s->n_red_lo > NF_MAX_VARS - t->n_shape)
    return gerr(err, "stmts[%zu]: %zu reduction variables with rank %zu exceed %d variables",
                si, s->n_red_lo, t->n_shape, NF_MAX_VARS);
  if (s->red == NEOFLOW__RED_OP__RED_NONE && s->n_red_lo)
    return gerr(err, "stmts[%zu]: reduction variables without a reduction", si);
  for (size_t r = 0; r < s->n_red_lo; r++) {
    int64_t end;
    if (s->red_ext[r] < 0)
      return gerr(err, "stmts[%zu]: red_ext[%zu] is negative (%lld)", si, r,
                  (long long)s->red_ext[r]);
    if (__builtin_add_overflow(s->red_lo[r], s->red_ext[r], &end))
      return gerr(err, "stmts[%zu]: reduction range %zu overflows", si, r);
  }
  if (s->flags & ~(uint32_t)NF_STMT_SCATTER)
    return gerr(err, "stmts[%zu]: unknown flags 0x%x", si, s->flags);
  if (s->rhs >= pg->n_exprs)
    return gerr(err, "stmts[%zu]: rhs %u out of range (%zu exprs)", si, s->rhs, pg->n_exprs);
  if (pg->exprs[s->rhs]->dtype != t->dtype)
    return gerr(err, "stmts[%zu]: right side is %s, tensor %u (%s) is %s", si,
                dt_str((uint32_t)pg->exprs[s->rhs]->dtype), s->out, tname(t),
                dt_str((uint32_t)t->dtype));
  return NF_OK;
}

/* Counts the nodes each statement's right side reaches, summed over the
 * statements, and refuses a total over NF_WIRE_MAX_STMT_NODES (thousands
 * of statements sharing one huge expression would make every
 * per-statement walk downstream quadratic).  stamp and stack have n_exprs
 * entries; the walk stops at the limit, so its own cost is bounded. */
static int check_work(const Neoflow__Graph *pg, uint32_t *stamp, uint32_t *stack,
                      nf_buf *err) {
  size_t total = 0;
  memset(stamp, 0, pg->n_exprs * sizeof(*stamp));
  for (size_t si = 0; si < pg->n_stmts; si++) {
    uint32_t gen = (uint32_t)si + 1;
    size_t sp = 0;
    stack[sp++] = pg->stmts[si]->rhs;
    stamp[pg->stmts[si]->rhs] = gen;
    while (sp) {
      const Neoflow__Expr *x = pg->exprs[stack[--sp]];
      if (++total > NF_WIRE_MAX_STMT_NODES)
        return gerr(err, "stmts[%zu]: the statements reach more than %u expression nodes in all",
                    si, NF_WIRE_MAX_STMT_NODES);
      for (size_t k = 0; k < x->n_args; k++) {
        uint32_t a = x->args[k];
        if (stamp[a] == gen) continue;
        stamp[a] = gen;
        stack[sp++] = a; /* each node once per statement: sp <= n_exprs */
      }
    }
  }
  return NF_OK;
}

/* Refuses a statement whose right side is taller than NF_MAX_EXPR_DEPTH
 * (nodes on its longest path down to a leaf), before anything is built:
 * every later stage may then walk expressions recursively.  Arguments
 * point at earlier entries, so one pass in list order computes every
 * height (into h, n_exprs entries). */
static int check_depth(const Neoflow__Graph *pg, uint32_t *h, nf_buf *err) {
  for (size_t i = 0; i < pg->n_exprs; i++) {
    const Neoflow__Expr *x = pg->exprs[i];
    uint32_t m = 0;
    for (size_t k = 0; k < x->n_args; k++)
      if (h[x->args[k]] > m) m = h[x->args[k]];
    h[i] = m + 1; /* at most n_exprs: no overflow */
  }
  for (size_t si = 0; si < pg->n_stmts; si++) {
    const Neoflow__Stmt *s = pg->stmts[si];
    if (h[s->rhs] > NF_MAX_EXPR_DEPTH)
      return gerr(err, "stmts[%zu] (%s): right side nested %u levels deep, more than %d",
                  si, tname(pg->tensors[s->out]), h[s->rhs], NF_MAX_EXPR_DEPTH);
  }
  return NF_OK;
}

/* Everything that must hold before a constructor is called; scratch has
 * max(n_tensors, 8 * n_exprs) bytes. */
static int check_graph(const Neoflow__Graph *pg, uint8_t *scratch, nf_buf *err) {
  int rc;
  for (size_t i = 0; i < pg->n_tensors; i++)
    if ((rc = check_tensor(pg->tensors[i], i, err))) return rc;
  if ((rc = check_list(pg, 0, scratch, err)) || (rc = check_list(pg, 1, scratch, err)))
    return rc;
  for (size_t i = 0; i < pg->n_exprs; i++)
    if ((rc = check_expr(pg, i, err))) return rc;
  for (size_t si = 0; si < pg->n_stmts; si++)
    if ((rc = check_stmt(pg, si, err))) return rc;
  uint32_t *stamp = (uint32_t *)(void *)scratch;
  if ((rc = check_depth(pg, stamp, err))) return rc;
  return check_work(pg, stamp, stamp + pg->n_exprs, err);
}

/* The checks on the built (and validated) graph: the expression depth
 * once inlinable producers are substituted (what the code generator may
 * see) and the index bounds (nf_graph_check_bounds). */
static int check_built(const nf_graph *g, nf_buf *err) {
  nf_graph_cost cost;
  int rc = nf_graph_measure(g, &cost);
  if (rc) return rc;
  if (cost.depth > NF_MAX_EXPR_DEPTH) {
    const nf_stmt *s = &g->stmts[cost.depth_stmt];
    const char *n = g->tensors[s->out].name;
    return gerr(err,
                "statement %u (%s): right side nested %u levels deep once the producers a "
                "schedule may inline (local tensors without a reduction) are substituted, "
                "more than %d",
                cost.depth_stmt, n ? n : "?", cost.depth, NF_MAX_EXPR_DEPTH);
  }
  return nf_graph_check_bounds(g, err);
}

static const nf_expr *build_expr(nf_ir_ctx *ctx, const Neoflow__Expr *x,
                                 const nf_expr *const *built) {
  const nf_expr *a[NF_MAX_RANK];
  for (size_t k = 0; k < x->n_args; k++) a[k] = built[x->args[k]];
  nf_op op = (nf_op)x->op;
  nf_dtype t = (nf_dtype)x->dtype;
  switch (op) {
  case NF_OP_CONST:
    if (!is_float(t)) return nf_e_const_i(ctx, t, x->i);
    return nf_e_const_f(ctx, t, x->neg_zero ? -0.0 : x->f);
  case NF_OP_VAR: return nf_e_var(ctx, x->var);
  case NF_OP_ACCESS: return nf_e_access(ctx, x->tensor, t, (int)x->n_args, a);
  case NF_OP_CAST: return nf_e_cast(ctx, t, a[0]);
  case NF_OP_SELECT: return nf_e_select(ctx, a[0], a[1], a[2]);
  default:
    if (nf_op_arity(op) == 1) return nf_e_unary(ctx, op, a[0]);
    return nf_e_binary(ctx, op, a[0], a[1]);
  }
}

static int build(const Neoflow__Graph *pg, nf_ir_ctx *ctx, const nf_expr **built,
                 nf_graph **out) {
  nf_graph *g = nf_graph_new(ctx, pg->name && pg->name[0] ? pg->name : NULL);
  if (!g) return NF_ENOMEM;
  for (size_t i = 0; i < pg->n_tensors; i++) {
    const Neoflow__Tensor *t = pg->tensors[i];
    int rc = nf_graph_add_tensor(g, t->name && t->name[0] ? t->name : NULL,
                                 (nf_dtype)t->dtype, (nf_tkind)t->kind, (int)t->n_shape,
                                 t->shape);
    if (rc < 0) return rc;
  }
  /* The builder listed inputs and outputs in tensor order; the wire's
   * order is the graph's (check_list made them the same sets). */
  NF_ASSERT(g->n_inputs == pg->n_inputs && g->n_outputs == pg->n_outputs);
  for (size_t k = 0; k < pg->n_inputs; k++) g->inputs[k] = pg->inputs[k];
  for (size_t k = 0; k < pg->n_outputs; k++) g->outputs[k] = pg->outputs[k];
  for (size_t i = 0; i < pg->n_exprs; i++) {
    built[i] = build_expr(ctx, pg->exprs[i], built);
    if (!built[i]) return NF_ENOMEM;
  }
  for (size_t si = 0; si < pg->n_stmts; si++) {
    const Neoflow__Stmt *ps = pg->stmts[si];
    nf_stmt s;
    memset(&s, 0, sizeof(s));
    s.out = ps->out;
    s.red = (uint8_t)ps->red;
    s.n_red = (uint8_t)ps->n_red_lo;
    s.flags = ps->flags;
    for (size_t r = 0; r < ps->n_red_lo; r++) {
      s.red_lo[r] = ps->red_lo[r];
      s.red_ext[r] = ps->red_ext[r];
    }
    s.rhs = built[ps->rhs];
    int rc = nf_graph_add_stmt(g, &s);
    if (rc) return rc;
  }
  *out = g;
  return NF_OK;
}

/* See nf_wire.h.  err (may be NULL) gets the message; the graph, when
 * built, lives in ctx. */
int nf_wire_graph_to_ir(const Neoflow__Graph *pg, nf_ir_ctx *ctx, nf_graph **out,
                        nf_buf *err) {
  *out = NULL;
  if (!pg) return gerr(err, "no graph");
  if (pg->n_tensors > NF_WIRE_MAX_TENSORS)
    return gerr(err, "tensors: %zu entries, at most %d allowed", pg->n_tensors,
                NF_WIRE_MAX_TENSORS);
  if (pg->n_exprs > NF_WIRE_MAX_EXPRS)
    return gerr(err, "exprs: %zu entries, at most %u allowed", pg->n_exprs,
                NF_WIRE_MAX_EXPRS);
  if (pg->n_stmts > NF_WIRE_MAX_STMTS)
    return gerr(err, "stmts: %zu entries, at most %d allowed", pg->n_stmts,
                NF_WIRE_MAX_STMTS);
  if (pg->n_inputs > pg->n_tensors || pg->n_outputs > pg->n_tensors)
    return gerr(err, "%s: %zu entries for %zu tensors",
                pg->n_inputs > pg->n_tensors ? "inputs" : "outputs",
                pg->n_inputs > pg->n_tensors ? pg->n_inputs : pg->n_outputs, pg->n_tensors);
  if ((pg->n_tensors && !pg->tensors) || (pg->n_exprs && !pg->exprs) ||
      (pg->n_stmts && !pg->stmts) || (pg->n_inputs && !pg->inputs) ||
      (pg->n_outputs && !pg->outputs))
    return gerr(err, "a count without its array");
  if (pg->name && strlen(pg->name) > NF_WIRE_NAME_MAX)
    return gerr(err, "name: longer than %d bytes", NF_WIRE_NAME_MAX);
  size_t n_scratch = pg->n_exprs * 2 * sizeof(uint32_t);
  if (n_scratch < pg->n_tensors) n_scratch = pg->n_tensors;
  uint8_t *scratch = malloc(n_scratch ? n_scratch : 1);
  const nf_expr **built = malloc((pg->n_exprs ? pg->n_exprs : 1) * sizeof(*built));
  int rc = scratch && built ? check_graph(pg, scratch, err) : NF_ENOMEM;
  nf_graph *g = NULL;
  if (!rc) rc = build(pg, ctx, built, &g);
  if (rc == NF_ENOMEM) gerr(err, "out of memory");
  if (!rc) rc = nf_graph_validate(g, err);
  if (!rc) rc = check_built(g, err);
  free(scratch);
  free(built);
  if (rc == NF_OK) *out = g;
  return rc;
}
