/* elab.c - the elaborator: a def plus bound sizes and parameters becomes a
 * concrete nf_graph.
 *
 * Instantiating a def binds parameters (call values, then defaults), binds
 * sizes and packs from the input shapes (a fixpoint, so a shape with two
 * packs binds once another input fixed one of them), evaluates `where`
 * sizes and `require` conditions, computes output shapes, then expands the
 * body: `for` loops unroll, calls instantiate the callee inline (its
 * outputs become the caller's result tensors), copies become identity
 * statements, and each element statement is typed, gets its variable
 * ranges (declared, explicit, or inferred from accesses where a variable
 * stands alone as an index) and has every access bounds-checked with
 * interval arithmetic refined by the conditions of enclosing selects.
 *
 * `param` declarations of the instantiated def become graph inputs right
 * after the declared inputs (their dims are evaluated once sizes and
 * `where` names are bound); each is usable from its declaration on.  A
 * called def may not declare params: its caller must pass them as inputs.
 *
 * Every user error is reported through the nf_diag with the source
 * location (and, inside calls, a note per call level); nothing here
 * asserts on user input.  Temporary state lives in a scratch arena freed at
 * the end; the graph lives in the caller's nf_ir_ctx. */
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "nf_lang_int.h"

#define MAX_CALL_DEPTH 64
#define MAX_STMTS 1000000 /* statements in one instantiated graph */
#define MAX_PACKS 8       /* packs in one element statement */
#define MAX_FACTS 64      /* nested select conditions kept for bounds */

typedef struct elab {
  nf_module *m;
  nf_ir_ctx *ctx;
  nf_graph *g;
  nf_diag *d;
  nf_arena *tmp;
  int status; /* first error */
  int depth;
} elab;

/* Compile-time names: sizes, parameters, where names, for variables and
 * packs of sizes. */
typedef struct cent {
  const char *name;
  int is_pack;
  int64_t val;
  int n;         /* pack length */
  int64_t *list; /* pack sizes */
  const char *origin; /* for messages: "input A, dimension 1" */
} cent;

typedef struct tent {
  const char *key; /* "H" or "H[3]" */
  uint32_t id;
  int defined;
  int declared_output; /* an output of this instance, not yet defined */
} tent;

typedef struct inst {
  elab *E;
  const nf_ast_def *def;
  cent *c;
  int n_c, cap_c;
  tent *t;
  int n_t, cap_t;
  const char *prefix; /* name prefix for local tensors ("" at top level) */
  struct txname *temps; /* the locals' names tensor expressions took */
} inst;

/* A name taken for a tensor expression's local (before its tensor exists:
 * `linear(gelu(linear(X, ..)))` names the outer call's result first). */
typedef struct txname {
  const char *key;
  struct txname *next;
} txname;

static int fail(elab *E, nf_loc loc, int status, const char *fmt, ...)
    NF_PRINTF(4, 5);

static int fail(elab *E, nf_loc loc, int status, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  nf_diag_error(E->d, loc, "%s", msg);
  if (!E->status) E->status = status;
  return status;
}

static int oom(elab *E) {
  if (!E->status) {
    nf_diag_error(E->d, (nf_loc){0}, "out of memory");
    E->status = NF_ENOMEM;
  }
  return NF_ENOMEM;
}

static void *talloc(elab *E, size_t n) { return nf_arena_alloc(E->tmp, n); }

static char *tprintf(elab *E, const char *fmt, ...) NF_PRINTF(2, 3);
static char *tprintf(elab *E, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return nf_arena_strdup(E->tmp, buf);
}

/* ---------------------------------------------------------------------
 * Compile-time environment
 * ------------------------------------------------------------------- */

static cent *cfind(inst *I, const char *name) {
  for (int k = I->n_c - 1; k >= 0; k--)
    if (strcmp(I->c[k].name, name) == 0) return &I->c[k];
  return NULL;
}

static cent *cpush(inst *I, const char *name) {
  if (I->n_c == I->cap_c) {
    int nc = I->cap_c ? I->cap_c * 2 : 16;
    cent *n = talloc(I->E, sizeof(cent) * (size_t)nc);
    if (!n) return NULL;
    if (I->n_c) memcpy(n, I->c, sizeof(cent) * (size_t)I->n_c);
    I->c = n;
    I->cap_c = nc;
  }
  cent *e = &I->c[I->n_c++];
  memset(e, 0, sizeof *e);
  e->name = name;
  return e;
}

static int cbind(inst *I, const char *name, int64_t v, const char *origin) {
  cent *e = cpush(I, name);
  if (!e) return oom(I->E);
  e->val = v;
  e->origin = origin;
  return NF_OK;
}

/* ---------------------------------------------------------------------
 * Tensor scope
 * ------------------------------------------------------------------- */

static tent *tfind(inst *I, const char *key) {
  for (int k = 0; k < I->n_t; k++)
    if (strcmp(I->t[k].key, key) == 0) return &I->t[k];
  return NULL;
}

static tent *tadd(inst *I, const char *key, uint32_t id) {
  if (I->n_t == I->cap_t) {
    int nc = I->cap_t ? I->cap_t * 2 : 16;
    tent *n = talloc(I->E, sizeof(tent) * (size_t)nc);
    if (!n) return NULL;
    if (I->n_t) memcpy(n, I->t, sizeof(tent) * (size_t)I->n_t);
    I->t = n;
    I->cap_t = nc;
  }
  tent *e = &I->t[I->n_t++];
  memset(e, 0, sizeof *e);
  e->key = key;
  e->id = id;
  return e;
}

/* ---------------------------------------------------------------------
 * Size expressions
 * ------------------------------------------------------------------- */

static int ceval(inst *I, const nf_ast_expr *e, int64_t *out);

static int cbinop(inst *I, const nf_ast_expr *e, int64_t a, int64_t b,
                  int64_t *out) {
  elab *E = I->E;
  int64_t r = 0;
  switch (e->op) {
    case NF_OP_ADD:
      if (__builtin_add_overflow(a, b, &r)) goto ovf;
      break;
    case NF_OP_SUB:
      if (__builtin_sub_overflow(a, b, &r)) goto ovf;
      break;
    case NF_OP_MUL:
      if (__builtin_mul_overflow(a, b, &r)) goto ovf;
      break;
    case NF_OP_FLOORDIV:
    case NF_OP_MOD:
      if (b == 0)
        return fail(E, e->loc, NF_ERANGE,
                    "division by zero in a size expression");
      if (a == INT64_MIN && b == -1) goto ovf;
      {
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {
          q -= 1;
          m += b;
        }
        r = e->op == NF_OP_FLOORDIV ? q : m;
      }
      break;
    case NF_OP_DIV:
      return fail(E, e->loc, NF_ETYPE,
                  "'/' is true division; sizes are integers: use '//'");
    case NF_OP_LT: r = a < b; break;
    case NF_OP_LE: r = a <= b; break;
    case NF_OP_GT: r = a > b; break;
    case NF_OP_GE: r = a >= b; break;
    case NF_OP_EQ: r = a == b; break;
    case NF_OP_NE: r = a != b; break;
    case NF_OP_AND: r = a && b; break;
    case NF_OP_OR: r = a || b; break;
    default:
      return fail(E, e->loc, NF_ETYPE, "operator '%s' is not allowed in a size expression",
                  nf_op_name((nf_op)e->op));
  }
  *out = r;
  return NF_OK;
ovf:
  return fail(E, e->loc, NF_EOVERFLOW,
              "overflow in size arithmetic: %" PRId64 " %s %" PRId64
              " does not fit in 64 bits",
              a, nf_op_name((nf_op)e->op), b);
}

static int ceval(inst *I, const nf_ast_expr *e, int64_t *out) {
  elab *E = I->E;
  int rc;
  switch (e->kind) {
    case NF_A_INT:
    case NF_A_BOOL:
      *out = e->ival;
      return NF_OK;
    case NF_A_FLOAT:
      return fail(E, e->loc, NF_ETYPE,
                  "size expressions are integers, found the float %s",
                  e->text ? e->text : "literal");
    case NF_A_NAME: {
      cent *c = cfind(I, e->name);
      if (!c)
        return fail(E, e->loc, NF_ENOENT,
                    "unknown size or parameter '%s'", e->name);
      if (c->is_pack)
        return fail(E, e->loc, NF_ETYPE,
                    "'%s' is a pack of sizes; write '*%s' in a shape",
                    e->name, e->name);
      *out = c->val;
      return NF_OK;
    }
    case NF_A_PACK:
      return fail(E, e->loc, NF_ETYPE,
                  "a pack '*%s' is not a single size", e->name);
    case NF_A_UNARY: {
      int64_t a;
      if ((rc = ceval(I, e->args[0], &a))) return rc;
      if (e->op == NF_OP_NOT) {
        *out = !a;
        return NF_OK;
      }
      if (a == INT64_MIN)
        return fail(E, e->loc, NF_EOVERFLOW, "overflow in size arithmetic: -(%" PRId64 ")", a);
      *out = -a;
      return NF_OK;
    }
    case NF_A_BINARY: {
      int64_t a, b;
      if ((rc = ceval(I, e->args[0], &a))) return rc;
      /* && and || short-circuit like C. */
      if (e->op == NF_OP_AND && !a) {
        *out = 0;
        return NF_OK;
      }
      if (e->op == NF_OP_OR && a) {
        *out = 1;
        return NF_OK;
      }
      if ((rc = ceval(I, e->args[1], &b))) return rc;
      if (e->op == NF_OP_AND || e->op == NF_OP_OR) {
        *out = b != 0;
        return NF_OK;
      }
      return cbinop(I, e, a, b, out);
    }
    case NF_A_SELECT: {
      int64_t c;
      if ((rc = ceval(I, e->args[0], &c))) return rc;
      return ceval(I, e->args[c ? 1 : 2], out);
    }
    case NF_A_APPLY: {
      if (!e->sub && e->n_args == 2 &&
          (strcmp(e->name, "min") == 0 || strcmp(e->name, "max") == 0)) {
        int64_t a, b;
        if ((rc = ceval(I, e->args[0], &a))) return rc;
        if ((rc = ceval(I, e->args[1], &b))) return rc;
        *out = (e->name[1] == 'i') ? (a < b ? a : b) : (a > b ? a : b);
        return NF_OK;
      }
      if (!e->sub && e->n_args == 1 && strcmp(e->name, "prod") == 0 &&
          e->args[0]->kind == NF_A_PACK) {
        cent *c = cfind(I, e->args[0]->name);
        if (!c || !c->is_pack)
          return fail(E, e->args[0]->loc, NF_ENOENT,
                      "unknown pack '*%s' (packs are bound by the inputs' shapes)",
                      e->args[0]->name);
        int64_t p = 1;
        for (int j = 0; j < c->n; j++)
          if (__builtin_mul_overflow(p, c->list[j], &p))
            return fail(E, e->loc, NF_EOVERFLOW,
                        "overflow in size arithmetic: prod(*%s) does not fit in "
                        "64 bits",
                        c->name);
        *out = p;
        return NF_OK;
      }
      if (!e->sub && e->n_args == 1 && strcmp(e->name, "abs") == 0) {
        int64_t a;
        if ((rc = ceval(I, e->args[0], &a))) return rc;
        if (a == INT64_MIN)
          return fail(E, e->loc, NF_EOVERFLOW, "overflow in size arithmetic: abs(%" PRId64 ")", a);
        *out = a < 0 ? -a : a;
        return NF_OK;
      }
      return fail(E, e->loc, NF_ETYPE,
                  "'%s(...)' is not allowed in a size expression (only "
                  "min, max, abs and prod(*pack))",
                  e->name);
    }
  }
  return fail(E, e->loc, NF_EINTERNAL, "unexpected expression");
}

/* Key of a tensor reference: "H" or "H[k]". */
static int tref_key(inst *I, const nf_ast_tref *r, const char **key) {
  if (!r->sub) {
    *key = r->name;
    return NF_OK;
  }
  int64_t k;
  int rc = ceval(I, r->sub, &k);
  if (rc) return rc;
  *key = tprintf(I->E, "%s[%" PRId64 "]", r->name, k);
  return *key ? NF_OK : oom(I->E);
}

static const char *shape_str(elab *E, int rank, const int64_t *shape) {
  nf_buf b = NF_BUF_INIT;
  nf_buf_putc(&b, '[');
  for (int k = 0; k < rank; k++)
    nf_buf_printf(&b, "%s%" PRId64, k ? ", " : "", shape[k]);
  nf_buf_putc(&b, ']');
  char *s = nf_arena_strdup(E->tmp, nf_buf_str(&b));
  nf_buf_free(&b);
  return s ? s : "[?]";
}

static const char *decl_str(elab *E, const nf_ast_tdecl *t) {
  nf_buf b = NF_BUF_INIT;
  nf_buf_printf(&b, "%s: %s[", t->name, nf_dtype_name((nf_dtype)t->dtype));
  for (int k = 0; k < t->n_dims; k++) {
    if (k) nf_buf_puts(&b, ", ");
    nf__ast_print_expr(t->dims[k], &b);
  }
  nf_buf_putc(&b, ']');
  char *s = nf_arena_strdup(E->tmp, nf_buf_str(&b));
  nf_buf_free(&b);
  return s ? s : "?";
}

/* Evaluates the dims of a declaration into a shape (packs expand). */
static int eval_dims(inst *I, const nf_ast_tdecl *t, int *rank,
                     int64_t *shape) {
  int r = 0, rc;
  for (int k = 0; k < t->n_dims; k++) {
    const nf_ast_expr *de = t->dims[k];
    if (de->kind == NF_A_PACK) {
      cent *c = cfind(I, de->name);
      if (!c || !c->is_pack)
        return fail(I->E, de->loc, NF_ENOENT,
                    "unknown pack '*%s' (packs are bound by the inputs' shapes)",
                    de->name);
      for (int j = 0; j < c->n; j++) {
        if (r >= NF_MAX_RANK) goto toolong;
        shape[r++] = c->list[j];
      }
    } else {
      if (r >= NF_MAX_RANK) goto toolong;
      if ((rc = ceval(I, de, &shape[r]))) return rc;
      if (shape[r] < 0)
        return fail(I->E, de->loc, NF_ETYPE,
                    "dimension %d of '%s' is negative (%" PRId64 ")", r,
                    t->name, shape[r]);
      r++;
    }
  }
  *rank = r;
  nf_tensor tmp = {.rank = (uint8_t)r};
  memcpy(tmp.shape, shape, sizeof(int64_t) * (size_t)r);
  if (nf_tensor_numel(&tmp) < 0)
    return fail(I->E, t->loc, NF_EOVERFLOW,
                "the shape of '%s' %s has more elements than fit in 64 bits",
                t->name, shape_str(I->E, r, shape));
  return NF_OK;
toolong:
  return fail(I->E, t->loc, NF_ELIMIT, "'%s' has more than %d dimensions",
              t->name, NF_MAX_RANK);
}

/* ---------------------------------------------------------------------
 * Binding a def's parameters and inputs
 * ------------------------------------------------------------------- */

typedef struct actual {
  int rank;
  const int64_t *shape;
  int have; /* shape known */
  nf_dtype dtype;
} actual;

/* Binds the sizes of one input declaration from an actual shape. */
static int bind_one(inst *I, const nf_ast_tdecl *t, const actual *a,
                    nf_loc use_loc, int *progress) {
  elab *E = I->E;
  int fixed = 0, known = 0, unbound = 0, rc;
  for (int k = 0; k < t->n_dims; k++) {
    const nf_ast_expr *de = t->dims[k];
    if (de->kind != NF_A_PACK) {
      fixed++;
      continue;
    }
    cent *c = cfind(I, de->name);
    if (c && c->is_pack)
      known += c->n;
    else {
      /* the same unbound pack twice in one shape counts twice */
      unbound++;
    }
  }
  if (unbound > 1) return NF_OK; /* wait for another input */
  int plen = 0;
  if (unbound == 1) {
    plen = a->rank - fixed - known;
    if (plen < 0) goto rank_err;
  } else if (fixed + known != a->rank) {
    goto rank_err;
  }
  int pos = 0;
  for (int k = 0; k < t->n_dims; k++) {
    const nf_ast_expr *de = t->dims[k];
    if (de->kind == NF_A_PACK) {
      cent *c = cfind(I, de->name);
      if (!c || !c->is_pack) {
        c = cpush(I, de->name);
        if (!c) return oom(E);
        c->is_pack = 1;
        c->n = plen;
        c->list = talloc(E, sizeof(int64_t) * (size_t)(plen ? plen : 1));
        if (!c->list) return oom(E);
        memcpy(c->list, a->shape + pos, sizeof(int64_t) * (size_t)plen);
        c->origin = tprintf(E, "input %s", t->name);
      } else {
        for (int j = 0; j < c->n; j++)
          if (c->list[j] != a->shape[pos + j])
            return fail(E, use_loc, NF_ETYPE,
                        "sizes disagree: pack *%s is %s from %s but input "
                        "'%s' has %s there",
                        de->name, shape_str(E, c->n, c->list), c->origin,
                        t->name, shape_str(E, c->n, a->shape + pos));
      }
      pos += c->n;
      continue;
    }
    int64_t got = a->shape[pos];
    if (de->kind == NF_A_NAME && !cfind(I, de->name)) {
      if ((rc = cbind(I, de->name, got,
                      tprintf(E, "input %s, dimension %d", t->name, pos))))
        return rc;
    } else if (de->kind == NF_A_NAME && !cfind(I, de->name)->is_pack) {
      cent *c = cfind(I, de->name);
      if (c->val != got)
        return fail(E, use_loc, NF_ETYPE,
                    "sizes disagree: '%s' is %" PRId64 " from %s but %" PRId64
                    " from input %s, dimension %d",
                    de->name, c->val, c->origin ? c->origin : "a parameter",
                    got, t->name, pos);
    } else {
      int64_t want;
      if ((rc = ceval(I, de, &want))) return rc;
      if (want != got) {
        nf_buf b = NF_BUF_INIT;
        nf__ast_print_expr(de, &b);
        fail(E, use_loc, NF_ETYPE,
             "sizes disagree: dimension %d of input '%s' is %" PRId64
             " but %s expects %s = %" PRId64,
             pos, t->name, got, I->def->name, nf_buf_str(&b), want);
        nf_buf_free(&b);
        return E->status;
      }
    }
    pos++;
  }
  *progress = 1;
  return NF_OK;
rank_err:
  return fail(E, use_loc, NF_ETYPE,
              "input '%s' of %s has rank %d, but the def declares %s",
              t->name, I->def->name, a->rank, decl_str(E, t));
}

/* Binds parameters: explicit values (names checked) then defaults. */
static int bind_params(inst *I, int n, const char *const *names,
                       const int64_t *vals, const nf_loc *locs,
                       nf_loc use_loc) {
  elab *E = I->E;
  const nf_ast_def *def = I->def;
  for (int k = 0; k < n; k++) {
    int found = 0;
    for (int p = 0; p < def->n_params; p++)
      if (strcmp(def->params[p].name, names[k]) == 0) found = 1;
    if (!found)
      return fail(E, locs ? locs[k] : use_loc, NF_ENOENT,
                  "%s has no parameter '%s'", def->name, names[k]);
    for (int j = 0; j < k; j++)
      if (strcmp(names[j], names[k]) == 0)
        return fail(E, locs ? locs[k] : use_loc, NF_EINVAL,
                    "parameter '%s' given twice", names[k]);
  }
  for (int p = 0; p < def->n_params; p++) {
    const nf_ast_param *pa = &def->params[p];
    int given = -1;
    for (int k = 0; k < n; k++)
      if (strcmp(pa->name, names[k]) == 0) given = k;
    int64_t v;
    if (given >= 0) {
      v = vals[given];
    } else if (pa->dflt) {
      int rc = ceval(I, pa->dflt, &v);
      if (rc) return rc;
    } else {
      return fail(E, use_loc, NF_EINVAL,
                  "%s needs a value for its parameter '%s'", def->name,
                  pa->name);
    }
    int rc = cbind(I, pa->name, v, tprintf(E, "parameter %s", pa->name));
    if (rc) return rc;
  }
  return NF_OK;
}

static int bind_inputs(inst *I, const actual *acts, nf_loc use_loc) {
  elab *E = I->E;
  const nf_ast_def *def = I->def;
  int n = def->n_inputs;
  char *done = talloc(E, (size_t)n + 1);
  if (!done) return oom(E);
  int left = 0;
  for (int k = 0; k < n; k++) {
    done[k] = !acts[k].have;
    left += acts[k].have;
  }
  while (left > 0) {
    int any = 0;
    for (int k = 0; k < n; k++) {
      if (done[k]) continue;
      int progress = 0;
      int rc = bind_one(I, &def->inputs[k], &acts[k], use_loc, &progress);
      if (rc) return rc;
      if (progress) {
        done[k] = 1;
        left--;
        any = 1;
      }
    }
    if (!any)
      return fail(E, use_loc, NF_ETYPE,
                  "cannot tell how the dimensions of the inputs of %s split "
                  "among their packs (each shape may have one pack not bound "
                  "by another input)",
                  def->name);
  }
  return NF_OK;
}

/* Evaluates where-sizes and require conditions. */
static int bind_wheres(inst *I, nf_loc use_loc) {
  elab *E = I->E;
  const nf_ast_def *def = I->def;
  int rc;
  for (int k = 0; k < def->n_wheres; k++) {
    int64_t v;
    if ((rc = ceval(I, def->wheres[k].value, &v))) return rc;
    if ((rc = cbind(I, def->wheres[k].name, v,
                    tprintf(E, "where %s", def->wheres[k].name))))
      return rc;
  }
  for (int k = 0; k < def->n_requires; k++) {
    int64_t v;
    const nf_ast_expr *re = def->requires[k];
    if ((rc = ceval(I, re, &v))) return rc;
    if (!v) {
      nf_buf b = NF_BUF_INIT;
      nf__ast_print_expr(re, &b);
      /* List the values of the names in the condition, in order. */
      nf_buf vals = NF_BUF_INIT;
      const char *p = nf_buf_str(&b);
      const char *seen[64];
      int n_seen = 0;
      while (*p) {
        if (*p == '_' || ((*p | 32) >= 'a' && (*p | 32) <= 'z')) {
          const char *q = p;
          while (*q == '_' || (*q >= '0' && *q <= '9') ||
                 ((*q | 32) >= 'a' && (*q | 32) <= 'z'))
            q++;
          char name[128];
          size_t ln = (size_t)(q - p) < sizeof name - 1 ? (size_t)(q - p) : sizeof name - 1;
          memcpy(name, p, ln);
          name[ln] = 0;
          cent *c = cfind(I, name);
          int dup = 0;
          for (int j = 0; j < n_seen; j++)
            if (c && seen[j] == c->name) dup = 1;
          if (c && !c->is_pack && !dup && n_seen < 64) {
            seen[n_seen++] = c->name;
            nf_buf_printf(&vals, "%s%s = %" PRId64, vals.len ? ", " : "", name,
                          c->val);
          }
          p = q;
        } else {
          p++;
        }
      }
      fail(E, use_loc, NF_ETYPE, "%s: requirement '%s' fails (%s)",
           def->name, nf_buf_str(&b), vals.len ? nf_buf_str(&vals) : "");
      nf_diag_note(E->d, re->loc, "the requirement is stated here");
      nf_buf_free(&b);
      nf_buf_free(&vals);
      return E->status;
    }
  }
  return NF_OK;
}

/* ---------------------------------------------------------------------
 * Element statements
 * ------------------------------------------------------------------- */

typedef struct svar {
  const char *name;
  nf_loc loc;
  int has_range;
  int64_t lo, ext;
  const char *range_from; /* "B (dimension 0)" */
  int explicit_range;
} svar;

typedef struct spack {
  const char *name;
  int len;   /* -1: unresolved */
  int first; /* first variable number */
  int lhs;
} spack;

typedef struct fact {
  const nf_expr *cond;
  int pos; /* 1: cond holds, 0: cond fails */
} fact;

typedef struct sacc {
  const nf_expr *e;
  const nf_ast_expr *ast;
  const char *tname;
  int n_facts;
  fact *facts;
} sacc;

typedef struct sctx {
  inst *I;
  const nf_ast_stmt *st;
  int n_out, n_vars;
  svar vars[NF_MAX_VARS];
  int n_packs;
  spack packs[MAX_PACKS];
  sacc *acc;
  int n_acc, cap_acc;
  fact facts[MAX_FACTS];
  int n_facts;
} sctx;

/* A typed value during elaboration; weak literals are built late. */
typedef struct val {
  const nf_expr *e; /* NULL while weak */
  nf_dtype t;
  int weak;   /* 0 strong, 1 weak integer, 2 weak float */
  int64_t iv; /* weak integer value */
  double fv;  /* weak float value */
} val;

static int find_var(sctx *S, const char *name) {
  for (int k = 0; k < S->n_vars; k++)
    if (S->vars[k].name && strcmp(S->vars[k].name, name) == 0) return k;
  return -1;
}

static spack *find_pack(sctx *S, const char *name) {
  for (int k = 0; k < S->n_packs; k++)
    if (strcmp(S->packs[k].name, name) == 0) return &S->packs[k];
  return NULL;
}

static int add_var(sctx *S, const char *name, nf_loc loc) {
  if (S->n_vars >= NF_MAX_VARS)
    return fail(S->I->E, loc, NF_ELIMIT,
                "a statement may use at most %d index variables", NF_MAX_VARS);
  svar *v = &S->vars[S->n_vars++];
  memset(v, 0, sizeof *v);
  v->name = name;
  v->loc = loc;
  return NF_OK;
}

static const nf_tensor *tensor_of(inst *I, uint32_t id) {
  return &I->E->g->tensors[id];
}

/* Whether a body defines a tensor (or family) of this name anywhere. */
static int defines(nf_ast_stmt *const *body, int n, const char *name) {
  for (int k = 0; k < n; k++) {
    const nf_ast_stmt *st = body[k];
    if (st->kind == NF_S_ELEM && strcmp(st->lhs.name, name) == 0) return 1;
    if (st->kind == NF_S_CALL)
      for (int j = 0; j < st->n_results; j++)
        if (strcmp(st->results[j].name, name) == 0) return 1;
    if (st->kind == NF_S_FOR && defines(st->body, st->n_body, name)) return 1;
  }
  return 0;
}

/* NF_OK when te (the entry of a tensor's name, key with its subscript)
 * is a tensor defined by now; else the error: used before its statement,
 * a def's name used as a tensor, or unknown ("<unknown> 'key'" with the
 * nearest name in scope). */
static int usable(inst *I, const tent *te, const char *name, const char *key, int sub,
                  nf_loc loc, const char *unknown) {
  elab *E = I->E;
  if (te && te->defined) return NF_OK;
  if (te || defines(I->def->body, I->def->n_body, name))
    return fail(E, loc, NF_ETYPE, "tensor '%s' is used before it is defined", key);
  if (!sub && nf__module_find(E->m, name))
    return fail(E, loc, NF_ETYPE,
                "'%s' is a def: apply it to whole tensors, in a statement ('T = %s(X)') "
                "or a tensor expression ('Y = %s(X) + 1.0'), then index the result",
                name, name, name);
  const char **keys = talloc(E, sizeof *keys * (size_t)(I->n_t + 1));
  for (int k = 0; keys && k < I->n_t; k++) keys[k] = I->t[k].key;
  const char *near = keys ? nf_did_you_mean(key, keys, I->n_t) : NULL;
  return fail(E, loc, NF_ENOENT, "%s '%s'%s%s%s", unknown, key, near ? " (did you mean '" : "",
              near ? near : "", near ? "'?)" : "");
}

static int emit_stmt(inst *I, nf_stmt *s, nf_loc loc);
static int new_local(inst *I, const char *key, nf_dtype t, int rank, const int64_t *shape,
                     nf_loc loc, uint32_t *id);

/* The defined tensor r names: a tensor or a family member; for X[k] where
 * X is a tensor and not a family, its row k (k < 0: from the end), made
 * once into a local "X[k]" (what a call or a tensor expression takes:
 * unstacking a sequence, `H[t + 1] = cell(X[t], H[t])`).  Not for element
 * statements: they read X(k, ...). */
static int tref_resolve(inst *I, const nf_ast_tref *r, tent **out) {
  elab *E = I->E;
  const char *key;
  int rc = tref_key(I, r, &key);
  if (rc) return rc;
  tent *te = tfind(I, key), *whole = r->sub && !te ? tfind(I, r->name) : NULL;
  if (whole && whole->defined && tensor_of(I, whole->id)->rank > 0) {
    const nf_tensor *t = tensor_of(I, whole->id);
    int64_t k, n = t->shape[0];
    if ((rc = ceval(I, r->sub, &k))) return rc;
    if (k < -n || k >= n)
      return fail(E, r->loc, NF_ERANGE,
                  "%s[%" PRId64 "] is out of range: '%s' is %s, %" PRId64 " entries along its first "
                  "dimension",
                  r->name, k, r->name, shape_str(E, t->rank, t->shape), n);
    if (k < 0) {
      k += n;
      if (!(key = tprintf(E, "%s[%" PRId64 "]", r->name, k))) return oom(E);
      if ((te = tfind(I, key))) goto found;
    }
    nf_dtype dt = (nf_dtype)t->dtype;
    int rank = t->rank - 1;
    int64_t shape[NF_MAX_RANK];
    memcpy(shape, t->shape + 1, sizeof(int64_t) * (size_t)rank);
    uint32_t src = whole->id, id;
    if ((rc = new_local(I, key, dt, rank, shape, r->loc, &id))) return rc;
    nf_stmt s;
    memset(&s, 0, sizeof s);
    const nf_expr *idx[NF_MAX_RANK];
    idx[0] = nf_e_const_i(E->ctx, NF_I64, k);
    for (int d = 0; d < rank; d++) {
      const char *v = tprintf(E, "i%d", d);
      idx[d + 1] = nf_e_var(E->ctx, (uint32_t)d);
      s.var_names[d] = v ? nf_arena_strdup(nf_ir_ctx_arena(E->ctx), v) : NULL;
      if (!s.var_names[d] || !idx[d + 1]) return oom(E);
    }
    if (!idx[0]) return oom(E);
    s.out = id;
    s.rhs = nf_e_access(E->ctx, src, dt, rank + 1, idx);
    if (!s.rhs) return oom(E);
    if ((rc = emit_stmt(I, &s, r->loc))) return rc;
    if (!(te = tadd(I, key, id))) return oom(E);
    te->defined = 1;
  }
found:
  if ((rc = usable(I, te, r->name, key, r->sub != NULL, r->loc, "unknown tensor"))) return rc;
  *out = te;
  return NF_OK;
}

/* Resolves a tensor reference used in an expression; sets *id or fails. */
static int lookup_tensor(inst *I, const nf_ast_expr *e, uint32_t *id,
                         const char **key_out) {
  const char *key;
  nf_ast_tref r = {e->name, e->sub, e->loc};
  int rc = tref_key(I, &r, &key);
  if (rc) return rc;
  tent *t = tfind(I, key);
  if ((rc = usable(I, t, e->name, key, e->sub != NULL, e->loc, "unknown tensor or function")))
    return rc;
  *id = t->id;
  if (key_out) *key_out = key;
  return NF_OK;
}

/* `prod(*S)`: the product of a pack of sizes, a compile-time constant. */
static int is_pack_prod(inst *I, const nf_ast_expr *e) {
  return !e->sub && e->n_args == 1 && e->args[0]->kind == NF_A_PACK &&
         strcmp(e->name, "prod") == 0 && !tfind(I, e->name);
}

static int is_tensor_name(inst *I, const nf_ast_expr *e) {
  if (e->sub) return 1; /* families are always tensors */
  if (tfind(I, e->name)) return 1;
  if (is_pack_prod(I, e)) return 0;
  nf_op op;
  int ar;
  nf_dtype dt;
  if (nf__lang_math_fn(e->name, &op, &ar)) return 0;
  if (nf_dtype_parse(e->name, strlen(e->name), &dt)) return 0;
  return 1; /* unknown: reported as an unknown tensor */
}

/* Pre-pass: resolve the lengths of packs from ranks (fixpoint). */
static int resolve_packs_walk(sctx *S, const nf_ast_expr *e, int *progress,
                              int report) {
  if (!e) return NF_OK;
  inst *I = S->I;
  int rc;
  if (e->kind == NF_A_APPLY && is_tensor_name(I, e)) {
    int plain = 0, known = 0, unres = 0;
    spack *u = NULL;
    for (int k = 0; k < e->n_args; k++) {
      if (e->args[k]->kind != NF_A_PACK) {
        plain++;
        continue;
      }
      spack *p = find_pack(S, e->args[k]->name);
      if (!p) {
        if (S->n_packs >= MAX_PACKS)
          return fail(I->E, e->args[k]->loc, NF_ELIMIT,
                      "at most %d packs per statement", MAX_PACKS);
        p = &S->packs[S->n_packs++];
        p->name = e->args[k]->name;
        p->len = -1;
        p->lhs = 0;
      }
      if (p->len < 0) {
        if (u != p) unres++;
        u = p;
      } else {
        known += p->len;
      }
    }
    if (unres > 0) {
      uint32_t id;
      nf_diag *save = I->E->d;
      (void)save;
      const char *key;
      nf_ast_tref r = {e->name, e->sub, e->loc};
      if ((rc = tref_key(I, &r, &key))) return rc;
      tent *t = tfind(I, key);
      if (t && t->defined) {
        id = t->id;
        int rank = tensor_of(I, id)->rank;
        if (unres == 1) {
          int cnt = 0;
          for (int k = 0; k < e->n_args; k++)
            if (e->args[k]->kind == NF_A_PACK &&
                strcmp(e->args[k]->name, u->name) == 0)
              cnt++;
          int rest = rank - plain - known;
          if (rest < 0 || rest % cnt)
            return fail(I->E, e->loc, NF_ETYPE,
                        "'%s' has rank %d, which its %d indices cannot match",
                        key, rank, e->n_args);
          u->len = rest / cnt;
          *progress = 1;
        } else if (report) {
          return fail(I->E, e->loc, NF_ETYPE,
                      "cannot tell how the %d dimensions of '%s' split among "
                      "its packs",
                      rank, key);
        }
      }
    }
  }
  for (int k = 0; k < e->n_args; k++)
    if ((rc = resolve_packs_walk(S, e->args[k], progress, report))) return rc;
  return NF_OK;
}

static const nf_expr *materialize(sctx *S, val *v, nf_dtype t) {
  nf_ir_ctx *ctx = S->I->E->ctx;
  if (v->weak == 1) {
    if (nf_dtype_is_float(t)) return nf_e_const_f(ctx, t, (double)v->iv);
    if (t == NF_BOOL) return nf_e_const_i(ctx, t, v->iv != 0);
    if (t == NF_I32 && (v->iv < INT32_MIN || v->iv > INT32_MAX))
      return NULL;
    return nf_e_const_i(ctx, t, v->iv);
  }
  if (v->weak == 2) return nf_e_const_f(ctx, t, v->fv);
  if (v->t == t) return v->e;
  return nf_e_cast(ctx, t, v->e);
}

static int rank_of(nf_dtype t) {
  switch (t) {
    case NF_BOOL: return 0;
    case NF_I32: return 1;
    case NF_I64: return 2;
    case NF_F16: return 3;
    case NF_BF16: return 4;
    case NF_F32: return 5;
    case NF_F64: return 6;
    default: return 0;
  }
}

/* Common type of two values under the promotion rules. */
static nf_dtype common_type(const val *a, const val *b, int *weak) {
  *weak = 0;
  if (a->weak && b->weak) {
    *weak = (a->weak == 2 || b->weak == 2) ? 2 : 1;
    return *weak == 2 ? NF_F32 : NF_I64;
  }
  if (a->weak || b->weak) {
    const val *s = a->weak ? b : a, *w = a->weak ? a : b;
    if (w->weak == 2 && !nf_dtype_is_float(s->t)) return NF_F32;
    if (w->weak == 1 && s->t == NF_BOOL) return NF_I64;
    return s->t;
  }
  return rank_of(a->t) >= rank_of(b->t) ? a->t : b->t;
}

static int coerce_pair(sctx *S, val *a, val *b, nf_dtype t, nf_loc loc) {
  const nf_expr *ea = materialize(S, a, t), *eb = materialize(S, b, t);
  if (!ea || !eb) {
    if (nf_ir_ctx_oom(S->I->E->ctx)) return oom(S->I->E);
    return fail(S->I->E, loc, NF_ERANGE,
                "an integer literal does not fit in %s", nf_dtype_name(t));
  }
  a->e = ea;
  b->e = eb;
  a->t = b->t = t;
  a->weak = b->weak = 0;
  return NF_OK;
}

static int to_index(sctx *S, val *v, nf_loc loc, const nf_expr **out) {
  if (v->weak == 2 || (!v->weak && nf_dtype_is_float(v->t)))
    return fail(S->I->E, loc, NF_ETYPE, "an index must be an integer, not %s",
                v->weak ? "a float" : nf_dtype_name(v->t));
  if (!v->weak && v->t == NF_BOOL)
    return fail(S->I->E, loc, NF_ETYPE, "an index must be an integer, not bool");
  *out = materialize(S, v, NF_I64);
  return *out ? NF_OK : oom(S->I->E);
}

static int ex(sctx *S, const nf_ast_expr *e, val *out);

static int record_access(sctx *S, const nf_expr *acc, const nf_ast_expr *ast,
                         const char *tname) {
  elab *E = S->I->E;
  if (S->n_acc == S->cap_acc) {
    int nc = S->cap_acc ? S->cap_acc * 2 : 16;
    sacc *n = talloc(E, sizeof(sacc) * (size_t)nc);
    if (!n) return oom(E);
    if (S->n_acc) memcpy(n, S->acc, sizeof(sacc) * (size_t)S->n_acc);
    S->acc = n;
    S->cap_acc = nc;
  }
  sacc *a = &S->acc[S->n_acc++];
  a->e = acc;
  a->ast = ast;
  a->tname = tname;
  a->n_facts = S->n_facts;
  a->facts = NULL;
  if (S->n_facts) {
    a->facts = talloc(E, sizeof(fact) * (size_t)S->n_facts);
    if (!a->facts) return oom(E);
    memcpy(a->facts, S->facts, sizeof(fact) * (size_t)S->n_facts);
  }
  return NF_OK;
}

static int ex_access(sctx *S, const nf_ast_expr *e, val *out) {
  inst *I = S->I;
  elab *E = I->E;
  uint32_t id = 0;
  const char *key = "?";
  int rc = lookup_tensor(I, e, &id, &key);
  if (rc) return rc;
  const nf_tensor *t = tensor_of(I, id);
  const nf_expr *idx[NF_MAX_RANK];
  int n = 0;
  for (int k = 0; k < e->n_args; k++) {
    const nf_ast_expr *a = e->args[k];
    if (a->kind == NF_A_PACK) {
      spack *p = find_pack(S, a->name);
      if (!p || p->len < 0)
        return fail(E, a->loc, NF_ETYPE,
                    "cannot tell how many dimensions the pack '*%s' stands for",
                    a->name);
      if (p->first < 0) {
        /* first use of a pack that is not on the left: reduction vars */
        p->first = S->n_vars;
        for (int j = 0; j < p->len; j++)
          if ((rc = add_var(S, tprintf(E, "%s%d", a->name, j), a->loc)))
            return rc;
      }
      for (int j = 0; j < p->len; j++) {
        if (n >= NF_MAX_RANK) goto arity;
        idx[n++] = nf_e_var(E->ctx, (uint32_t)(p->first + j));
      }
      continue;
    }
    val v;
    if ((rc = ex(S, a, &v))) return rc;
    if (n >= NF_MAX_RANK) goto arity;
    if ((rc = to_index(S, &v, a->loc, &idx[n]))) return rc;
    n++;
  }
  if (n != t->rank) goto arity;
  const nf_expr *acc = nf_e_access(E->ctx, id, (nf_dtype)t->dtype, n, idx);
  if (!acc) return oom(E);
  if ((rc = record_access(S, acc, e, key))) return rc;
  out->e = acc;
  out->t = (nf_dtype)t->dtype;
  out->weak = 0;
  return NF_OK;
arity:
  return fail(E, e->loc, NF_ETYPE,
              "'%s' has %d dimension%s %s but is indexed with %d",
              key, t->rank, t->rank == 1 ? "" : "s",
              shape_str(E, t->rank, t->shape), n);
}

static int ex_name(sctx *S, const nf_ast_expr *e, val *out) {
  inst *I = S->I;
  elab *E = I->E;
  int v = find_var(S, e->name);
  if (v < 0) {
    cent *c = cfind(I, e->name);
    if (c) {
      if (c->is_pack)
        return fail(E, e->loc, NF_ETYPE,
                    "'%s' is a pack of sizes, not a value", e->name);
      out->e = NULL;
      out->weak = 1;
      out->iv = c->val;
      out->t = NF_I64;
      return NF_OK;
    }
    if (tfind(I, e->name))
      return fail(E, e->loc, NF_ETYPE,
                  "tensor '%s' needs indices here: write %s(...)", e->name,
                  e->name);
    if (find_pack(S, e->name))
      return fail(E, e->loc, NF_ETYPE,
                  "'%s' is a pack of indices; write '*%s' as an index",
                  e->name, e->name);
    /* A new reduction variable. */
    int rc = add_var(S, e->name, e->loc);
    if (rc) return rc;
    v = S->n_vars - 1;
  }
  out->e = nf_e_var(E->ctx, (uint32_t)v);
  if (!out->e) return oom(E);
  out->t = NF_I64;
  out->weak = 0;
  return NF_OK;
}

static int ex_apply(sctx *S, const nf_ast_expr *e, val *out) {
  inst *I = S->I;
  elab *E = I->E;
  nf_op op;
  int arity, rc;
  nf_dtype ct;
  if (is_pack_prod(I, e)) {
    memset(out, 0, sizeof *out);
    out->weak = 1;
    out->t = NF_I64;
    return ceval(I, e, &out->iv);
  }
  if (!e->sub && !tfind(I, e->name) &&
      nf_dtype_parse(e->name, strlen(e->name), &ct)) {
    if (e->n_args != 1)
      return fail(E, e->loc, NF_ETYPE, "the cast %s(...) takes one argument",
                  e->name);
    val a;
    if ((rc = ex(S, e->args[0], &a))) return rc;
    if (a.weak) {
      /* A cast of a literal is a typed literal. */
      if (a.weak == 2 && !nf_dtype_is_float(ct)) {
        double f = a.fv;
        if (!(f > -9.2e18 && f < 9.2e18))
          return fail(E, e->loc, NF_ERANGE, "%s(...) of an out-of-range literal",
                      e->name);
        a.weak = 1;
        a.iv = (int64_t)f;
      }
      out->e = materialize(S, &a, ct);
      if (!out->e) return fail(E, e->loc, NF_ERANGE,
                               "the literal does not fit in %s", e->name);
    } else {
      out->e = materialize(S, &a, ct);
      if (!out->e) return oom(E);
    }
    out->t = ct;
    out->weak = 0;
    return NF_OK;
  }
  if (!e->sub && !tfind(I, e->name) && nf__lang_math_fn(e->name, &op, &arity)) {
    if (e->n_args != arity)
      return fail(E, e->loc, NF_ETYPE, "%s takes %d argument%s, got %d",
                  e->name, arity, arity == 1 ? "" : "s", e->n_args);
    if (arity == 1) {
      val a;
      if ((rc = ex(S, e->args[0], &a))) return rc;
      nf_dtype t;
      if (op == NF_OP_ABS) {
        if (a.weak) {
          if (a.weak == 1) {
            out->weak = 1;
            out->iv = a.iv < 0 ? -a.iv : a.iv;
            out->e = NULL;
            out->t = NF_I64;
            if (a.iv == INT64_MIN)
              return fail(E, e->loc, NF_EOVERFLOW, "abs overflows");
            return NF_OK;
          }
          *out = a;
          out->fv = a.fv < 0 ? -a.fv : a.fv;
          return NF_OK;
        }
        if (a.t == NF_BOOL)
          return fail(E, e->loc, NF_ETYPE, "abs of a bool");
        t = a.t;
      } else {
        t = (!a.weak && nf_dtype_is_float(a.t)) ? a.t : NF_F32;
        if (!a.weak && a.t == NF_BOOL)
          return fail(E, e->loc, NF_ETYPE, "%s of a bool", e->name);
      }
      const nf_expr *x = materialize(S, &a, t);
      if (!x) return oom(E);
      out->e = nf_e_unary(E->ctx, op, x);
      if (!out->e) return oom(E);
      out->t = t;
      out->weak = 0;
      return NF_OK;
    }
    val a, b;
    if ((rc = ex(S, e->args[0], &a))) return rc;
    if ((rc = ex(S, e->args[1], &b))) return rc;
    int weak;
    nf_dtype t = common_type(&a, &b, &weak);
    if (op == NF_OP_POW && !nf_dtype_is_float(t)) t = NF_F32;
    if (t == NF_BOOL)
      return fail(E, e->loc, NF_ETYPE, "%s of bools", e->name);
    if (weak && op != NF_OP_POW) {
      /* Fold min/max of two literals. */
      if (weak == 1) {
        out->weak = 1;
        out->iv = op == NF_OP_MIN ? (a.iv < b.iv ? a.iv : b.iv)
                                  : (a.iv > b.iv ? a.iv : b.iv);
      } else {
        double x = a.weak == 2 ? a.fv : (double)a.iv;
        double y = b.weak == 2 ? b.fv : (double)b.iv;
        out->weak = 2;
        out->fv = op == NF_OP_MIN ? (x < y ? x : y) : (x > y ? x : y);
      }
      out->e = NULL;
      out->t = weak == 1 ? NF_I64 : NF_F32;
      return NF_OK;
    }
    if ((rc = coerce_pair(S, &a, &b, t, e->loc))) return rc;
    out->e = nf_e_binary(E->ctx, op, a.e, b.e);
    if (!out->e) return oom(E);
    out->t = t;
    out->weak = 0;
    return NF_OK;
  }
  return ex_access(S, e, out);
}

static int ex_binary(sctx *S, const nf_ast_expr *e, val *out) {
  elab *E = S->I->E;
  nf_op op = (nf_op)e->op;
  val a, b;
  int rc;
  if ((rc = ex(S, e->args[0], &a))) return rc;
  if ((rc = ex(S, e->args[1], &b))) return rc;
  if (op == NF_OP_AND || op == NF_OP_OR) {
    if (!(a.weak == 0 && a.t == NF_BOOL) || !(b.weak == 0 && b.t == NF_BOOL))
      return fail(E, e->loc, NF_ETYPE,
                  "the operands of '%s' must be conditions (bool), not %s",
                  nf_op_name(op),
                  (a.weak == 0 && a.t == NF_BOOL)
                      ? (b.weak ? "a number" : nf_dtype_name(b.t))
                      : (a.weak ? "a number" : nf_dtype_name(a.t)));
    out->e = nf_e_binary(E->ctx, op, a.e, b.e);
    if (!out->e) return oom(E);
    out->t = NF_BOOL;
    out->weak = 0;
    return NF_OK;
  }
  int weak;
  nf_dtype t = common_type(&a, &b, &weak);
  int is_cmp = op >= NF_OP_LT && op <= NF_OP_NE;
  if (op == NF_OP_DIV) {
    if (!nf_dtype_is_float(t))
      return fail(E, e->loc, NF_ETYPE,
                  "'/' needs a float operand; use '//' for integer division");
  }
  if (t == NF_BOOL && !(op == NF_OP_EQ || op == NF_OP_NE))
    return fail(E, e->loc, NF_ETYPE, "'%s' on bool operands; use && || !",
                nf_op_name(op));
  if (weak && !is_cmp) {
    /* Fold arithmetic on two literals exactly when possible. */
    if (weak == 1) {
      int64_t x = a.iv, y = b.iv, r;
      int ok = 1;
      switch (op) {
        case NF_OP_ADD: ok = !__builtin_add_overflow(x, y, &r); break;
        case NF_OP_SUB: ok = !__builtin_sub_overflow(x, y, &r); break;
        case NF_OP_MUL: ok = !__builtin_mul_overflow(x, y, &r); break;
        case NF_OP_FLOORDIV:
        case NF_OP_MOD:
          if (y == 0)
            return fail(E, e->loc, NF_ERANGE, "integer division by zero");
          if (x == INT64_MIN && y == -1) {
            ok = 0;
            break;
          }
          {
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
              q -= 1;
              m += y;
            }
            r = op == NF_OP_FLOORDIV ? q : m;
          }
          break;
        default: ok = 0; r = 0; break;
      }
      if (!ok)
        return fail(E, e->loc, NF_EOVERFLOW,
                    "overflow in integer constant arithmetic");
      out->weak = 1;
      out->iv = r;
      out->e = NULL;
      out->t = NF_I64;
      return NF_OK;
    }
    /* Literal float arithmetic folds in double precision and stays
     * weak, so `1.0 / 3.0` next to an f64 tensor keeps f64 precision. */
    if (op == NF_OP_ADD || op == NF_OP_SUB || op == NF_OP_MUL ||
        op == NF_OP_DIV) {
      double x = a.weak == 2 ? a.fv : (double)a.iv;
      double y = b.weak == 2 ? b.fv : (double)b.iv;
      out->weak = 2;
      out->fv = op == NF_OP_ADD   ? x + y
                : op == NF_OP_SUB ? x - y
                : op == NF_OP_MUL ? x * y
                                  : x / y;
      out->e = NULL;
      out->t = NF_F32;
      return NF_OK;
    }
    t = NF_F32;
  }
  if ((rc = coerce_pair(S, &a, &b, t, e->loc))) return rc;
  out->e = nf_e_binary(E->ctx, op, a.e, b.e);
  if (!out->e) return oom(E);
  out->t = is_cmp ? NF_BOOL : t;
  out->weak = 0;
  return NF_OK;
}

static int ex(sctx *S, const nf_ast_expr *e, val *out) {
  elab *E = S->I->E;
  int rc;
  memset(out, 0, sizeof *out);
  switch (e->kind) {
    case NF_A_INT:
      out->weak = 1;
      out->iv = e->ival;
      out->t = NF_I64;
      return NF_OK;
    case NF_A_FLOAT:
      out->weak = 2;
      out->fv = e->fval;
      out->t = NF_F32;
      return NF_OK;
    case NF_A_BOOL:
      out->e = nf_e_const_i(E->ctx, NF_BOOL, e->ival != 0);
      out->t = NF_BOOL;
      return out->e ? NF_OK : oom(E);
    case NF_A_NAME:
      return ex_name(S, e, out);
    case NF_A_PACK:
      return fail(E, e->loc, NF_ETYPE,
                  "a pack '*%s' may only appear as a tensor index", e->name);
    case NF_A_UNARY: {
      val a;
      if ((rc = ex(S, e->args[0], &a))) return rc;
      if (e->op == NF_OP_NOT) {
        if (a.weak || a.t != NF_BOOL)
          return fail(E, e->loc, NF_ETYPE, "'!' needs a condition (bool)");
        out->e = nf_e_unary(E->ctx, NF_OP_NOT, a.e);
        out->t = NF_BOOL;
        return out->e ? NF_OK : oom(E);
      }
      if (a.weak == 1) {
        if (a.iv == INT64_MIN)
          return fail(E, e->loc, NF_EOVERFLOW, "integer negation overflows");
        *out = a;
        out->iv = -a.iv;
        return NF_OK;
      }
      if (a.weak == 2) {
        *out = a;
        out->fv = -a.fv;
        return NF_OK;
      }
      if (a.t == NF_BOOL)
        return fail(E, e->loc, NF_ETYPE, "unary '-' of a bool");
      out->e = nf_e_unary(E->ctx, NF_OP_NEG, a.e);
      out->t = a.t;
      return out->e ? NF_OK : oom(E);
    }
    case NF_A_BINARY:
      return ex_binary(S, e, out);
    case NF_A_SELECT: {
      val c, a, b;
      if ((rc = ex(S, e->args[0], &c))) return rc;
      if (c.weak || c.t != NF_BOOL)
        return fail(E, e->args[0]->loc, NF_ETYPE,
                    "the condition of '?:' must be a comparison or bool");
      if (S->n_facts < MAX_FACTS) {
        S->facts[S->n_facts++] = (fact){c.e, 1};
        rc = ex(S, e->args[1], &a);
        S->facts[S->n_facts - 1].pos = 0;
        if (!rc) rc = ex(S, e->args[2], &b);
        S->n_facts--;
      } else {
        rc = ex(S, e->args[1], &a);
        if (!rc) rc = ex(S, e->args[2], &b);
      }
      if (rc) return rc;
      int weak;
      nf_dtype t = common_type(&a, &b, &weak);
      if ((rc = coerce_pair(S, &a, &b, t, e->loc))) return rc;
      out->e = nf_e_select(E->ctx, c.e, a.e, b.e);
      out->t = t;
      return out->e ? NF_OK : oom(E);
    }
    case NF_A_APPLY:
      return ex_apply(S, e, out);
  }
  return fail(E, e->loc, NF_EINTERNAL, "unexpected expression");
}

/* Facts from select conditions: constraints "D in [lo, hi]" on affine D. */
typedef struct cons {
  nf_affine d;
  int64_t lo, hi;
} cons;

static int cons_from_cmp(const nf_expr *c, int pos, cons *out) {
  nf_op op = (nf_op)c->op;
  if (op < NF_OP_LT || op > NF_OP_NE || c->n_args != 2) return 0;
  if (c->args[0]->dtype != NF_I64 && c->args[0]->dtype != NF_I32) return 0;
  if (!pos) {
    static const nf_op neg[] = {NF_OP_GE, NF_OP_GT, NF_OP_LE, NF_OP_LT,
                                NF_OP_NE, NF_OP_EQ};
    op = neg[op - NF_OP_LT];
  }
  nf_affine a, b;
  if (nf_expr_affine(c->args[0], &a) != 1 || nf_expr_affine(c->args[1], &b) != 1)
    return 0;
  /* d = a - b */
  nf_affine d = {0};
  int i = 0, j = 0;
  while (i < a.n || j < b.n) {
    if (d.n >= NF_MAX_VARS) return 0;
    if (j >= b.n || (i < a.n && a.var[i] < b.var[j])) {
      d.var[d.n] = a.var[i];
      d.coef[d.n++] = a.coef[i++];
    } else if (i >= a.n || b.var[j] < a.var[i]) {
      if (b.coef[j] == INT64_MIN) return 0;
      d.var[d.n] = b.var[j];
      d.coef[d.n++] = -b.coef[j++];
    } else {
      int64_t v;
      if (__builtin_sub_overflow(a.coef[i], b.coef[j], &v)) return 0;
      if (v) {
        d.var[d.n] = a.var[i];
        d.coef[d.n++] = v;
      }
      i++;
      j++;
    }
  }
  if (__builtin_sub_overflow(a.c, b.c, &d.c)) return 0;
  out->d = d;
  out->lo = INT64_MIN;
  out->hi = INT64_MAX;
  switch (op) {
    case NF_OP_LT: out->hi = -1; break;
    case NF_OP_LE: out->hi = 0; break;
    case NF_OP_GT: out->lo = 1; break;
    case NF_OP_GE: out->lo = 0; break;
    case NF_OP_EQ: out->lo = out->hi = 0; break;
    default: return 0;
  }
  return 1;
}

static int collect_cons(const nf_expr *c, int pos, cons *out, int n, int max) {
  if (n >= max) return n;
  if (c->op == NF_OP_NOT) return collect_cons(c->args[0], !pos, out, n, max);
  if ((pos && c->op == NF_OP_AND) || (!pos && c->op == NF_OP_OR)) {
    n = collect_cons(c->args[0], pos, out, n, max);
    return collect_cons(c->args[1], pos, out, n, max);
  }
  if (cons_from_cmp(c, pos, &out[n])) n++;
  return n;
}

static int64_t fdiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
  return q;
}

static int64_t cdiv(int64_t a, int64_t b) { return -fdiv(-a, b); }

/* Bounds-checks one recorded access. */
static int check_access(sctx *S, const sacc *A, const nf_range *base) {
  elab *E = S->I->E;
  nf_range r[NF_MAX_VARS];
  memcpy(r, base, sizeof(nf_range) * (size_t)S->n_vars);
  cons cs[MAX_FACTS * 2];
  int nc = 0;
  for (int k = 0; k < A->n_facts; k++)
    nc = collect_cons(A->facts[k].cond, A->facts[k].pos, cs, nc, MAX_FACTS * 2);
  /* Tighten variable ranges from single-variable facts (twice, so one
   * tightening can feed another through nothing else: they are
   * independent here). */
  for (int k = 0; k < nc; k++) {
    const cons *c = &cs[k];
    if (c->d.n != 1 || c->d.var[0] >= (uint32_t)S->n_vars) continue;
    int64_t a = c->d.coef[0], lo = c->lo, hi = c->hi, t;
    nf_range *v = &r[c->d.var[0]];
    /* a*v + c in [lo, hi] */
    if (lo != INT64_MIN) {
      if (__builtin_sub_overflow(lo, c->d.c, &t)) continue;
      if (a > 0) {
        int64_t m = cdiv(t, a);
        if (m > v->lo) v->lo = m;
      } else {
        int64_t m = fdiv(t, a);
        if (m < v->hi) v->hi = m;
      }
    }
    if (hi != INT64_MAX) {
      if (__builtin_sub_overflow(hi, c->d.c, &t)) continue;
      if (a > 0) {
        int64_t m = fdiv(t, a);
        if (m < v->hi) v->hi = m;
      } else {
        int64_t m = cdiv(t, a);
        if (m > v->lo) v->lo = m;
      }
    }
  }
  for (int k = 0; k < S->n_vars; k++)
    if (r[k].lo > r[k].hi) return NF_OK; /* never executed */
  const nf_expr *acc = A->e;
  const nf_tensor *t = tensor_of(S->I, acc->u.tensor);
  for (int k = 0; k < acc->n_args; k++) {
    nf_range b;
    if (!nf_expr_bounds(acc->args[k], r, S->n_vars, &b)) continue;
    nf_affine ia;
    if (nf_expr_affine(acc->args[k], &ia) == 1) {
      for (int j = 0; j < nc; j++) {
        const cons *c = &cs[j];
        if (c->d.n != ia.n) continue;
        int same = 1;
        for (int q = 0; q < ia.n && same; q++)
          same = c->d.var[q] == ia.var[q] && c->d.coef[q] == ia.coef[q];
        if (!same) continue;
        int64_t off, lo, hi;
        if (__builtin_sub_overflow(ia.c, c->d.c, &off)) continue;
        if (c->lo != INT64_MIN && !__builtin_add_overflow(c->lo, off, &lo) &&
            lo > b.lo)
          b.lo = lo;
        if (c->hi != INT64_MAX && !__builtin_add_overflow(c->hi, off, &hi) &&
            hi < b.hi)
          b.hi = hi;
      }
    }
    if (b.lo > b.hi) continue;
    if (b.lo < 0 || b.hi >= t->shape[k]) {
      nf_buf p = NF_BUF_INIT;
      nf__ast_print_expr(A->ast, &p);
      fail(E, A->ast->loc, NF_EBOUNDS,
           "%s may be out of bounds: index %d takes values in [%" PRId64
           ", %" PRId64 "] but '%s' has size %" PRId64 " in dimension %d",
           nf_buf_str(&p), k, b.lo, b.hi, A->tname, t->shape[k], k);
      nf_buf_free(&p);
      return E->status;
    }
  }
  return NF_OK;
}

static const char *var_desc(sctx *S, int v) {
  return S->vars[v].name ? S->vars[v].name : "?";
}

static int new_local(inst *I, const char *key, nf_dtype t, int rank,
                     const int64_t *shape, nf_loc loc, uint32_t *id) {
  elab *E = I->E;
  const char *name = I->prefix[0] ? tprintf(E, "%s%s", I->prefix, key) : key;
  if (!name) return oom(E);
  const char *gname = nf_arena_strdup(nf_ir_ctx_arena(E->ctx), name);
  if (!gname) return oom(E);
  nf_tensor tmp = {.rank = (uint8_t)rank};
  memcpy(tmp.shape, shape, sizeof(int64_t) * (size_t)rank);
  if (nf_tensor_numel(&tmp) < 0)
    return fail(E, loc, NF_EOVERFLOW,
                "'%s' would have more elements than fit in 64 bits", key);
  int rc = nf_graph_add_tensor(E->g, gname, t, NF_T_LOCAL, rank, shape);
  if (rc < 0) return rc == NF_ENOMEM ? oom(E) : fail(E, loc, rc, "cannot add tensor '%s'", key);
  *id = (uint32_t)rc;
  return NF_OK;
}

static int emit_stmt(inst *I, nf_stmt *s, nf_loc loc) {
  elab *E = I->E;
  if (E->g->n_stmts >= MAX_STMTS)
    return fail(E, loc, NF_ELIMIT,
                "the instantiated graph has more than %d statements", MAX_STMTS);
  int rc = nf_graph_add_stmt(E->g, s);
  if (rc) return rc == NF_ENOMEM ? oom(E) : fail(E, loc, rc, "cannot add statement");
  return NF_OK;
}

static void mark_vars(const nf_expr *e, void *user) {
  if (e->op == NF_OP_VAR && e->u.var < NF_MAX_VARS) ((char *)user)[e->u.var] = 1;
}

static const nf_expr *renumber(nf_ir_ctx *ctx, const nf_expr *e,
                               const int *map) {
  if (e->op == NF_OP_VAR) return nf_e_var(ctx, (uint32_t)map[e->u.var]);
  if (e->n_args == 0) return e;
  const nf_expr *args[NF_MAX_RANK > 3 ? NF_MAX_RANK : 3];
  for (int k = 0; k < e->n_args; k++) {
    args[k] = renumber(ctx, e->args[k], map);
    if (!args[k]) return NULL;
  }
  return nf_e_rebuild(ctx, e, args);
}

/* A reduction variable with a one-element range that the simplifier
 * substituted away is dropped (folding one element from the identity is
 * what a statement without it computes), so the statement prints as text
 * that reads back: the language rejects a range for an unused variable. */
static int drop_unit_vars(elab *E, nf_stmt *s, int n_out) {
  char used[NF_MAX_VARS] = {0};
  nf_expr_visit(s->rhs, mark_vars, used);
  int map[NF_MAX_VARS], n = n_out, dropped = 0;
  for (int v = 0; v < n_out; v++) map[v] = v;
  for (int r = 0; r < s->n_red; r++) {
    int v = n_out + r;
    if (!used[v] && s->red_ext[r] == 1) {
      map[v] = -1;
      dropped = 1;
      continue;
    }
    map[v] = n;
    s->red_lo[n - n_out] = s->red_lo[r];
    s->red_ext[n - n_out] = s->red_ext[r];
    s->var_names[n] = s->var_names[v];
    n++;
  }
  if (!dropped) return NF_OK;
  for (int v = n; v < n_out + s->n_red; v++) s->var_names[v] = NULL;
  s->n_red = (uint8_t)(n - n_out);
  s->rhs = renumber(E->ctx, s->rhs, map);
  return s->rhs ? NF_OK : oom(E);
}

static int do_elem(inst *I, const nf_ast_stmt *st) {
  elab *E = I->E;
  int rc;
  sctx *S = talloc(E, sizeof(sctx));
  if (!S) return oom(E);
  S->I = I;
  S->st = st;

  /* Left side: the tensor. */
  const char *key;
  if ((rc = tref_key(I, &st->lhs, &key))) return rc;
  tent *te = tfind(I, key);
  if (te && te->defined)
    return fail(E, st->lhs.loc, NF_ETYPE,
                "tensor '%s' is already defined (each tensor is defined once)",
                key);
  const nf_tensor *out_t = te ? tensor_of(I, te->id) : NULL;

  /* Left side: packs and variables. */
  for (int k = 0; k < st->n_idx; k++) {
    const nf_ast_expr *ix = st->idx[k];
    if (ix->kind == NF_A_PACK) {
      if (find_pack(S, ix->name))
        return fail(E, ix->loc, NF_ETYPE, "pack '*%s' appears twice on the left",
                    ix->name);
      if (S->n_packs >= MAX_PACKS)
        return fail(E, ix->loc, NF_ELIMIT, "at most %d packs per statement",
                    MAX_PACKS);
      spack *p = &S->packs[S->n_packs++];
      p->name = ix->name;
      p->len = -1;
      p->first = -1;
      p->lhs = 1;
    }
  }
  if (out_t) {
    int plain = 0, np = 0;
    spack *u = NULL;
    for (int k = 0; k < st->n_idx; k++) {
      if (st->idx[k]->kind == NF_A_PACK) {
        np++;
        u = find_pack(S, st->idx[k]->name);
      } else {
        plain++;
      }
    }
    if (np == 1) {
      if (out_t->rank < plain) goto lhs_rank;
      u->len = out_t->rank - plain;
    } else if (np == 0 && plain != out_t->rank) {
      goto lhs_rank;
    }
  }
  /* Fixpoint over the accesses on the right. */
  for (;;) {
    int progress = 0;
    if ((rc = resolve_packs_walk(S, st->rhs, &progress, 0))) return rc;
    if (!progress) break;
  }
  for (int k = 0; k < S->n_packs; k++) S->packs[k].first = -1;
  for (int k = 0; k < st->n_idx; k++) {
    const nf_ast_expr *ix = st->idx[k];
    if (ix->kind == NF_A_PACK) {
      spack *p = find_pack(S, ix->name);
      if (p->len < 0)
        return fail(E, ix->loc, NF_ETYPE,
                    "cannot tell how many dimensions the pack '*%s' stands for",
                    ix->name);
      p->first = S->n_vars;
      for (int j = 0; j < p->len; j++)
        if ((rc = add_var(S, tprintf(E, "%s%d", ix->name, j), ix->loc)))
          return rc;
      continue;
    }
    if (find_var(S, ix->name) >= 0)
      return fail(E, ix->loc, NF_ETYPE, "index '%s' appears twice on the left",
                  ix->name);
    if (cfind(I, ix->name))
      return fail(E, ix->loc, NF_ETYPE,
                  "index '%s' has the name of a size or parameter", ix->name);
    if (tfind(I, ix->name))
      return fail(E, ix->loc, NF_ETYPE, "index '%s' has the name of a tensor",
                  ix->name);
    if ((rc = add_var(S, ix->name, ix->loc))) return rc;
  }
  S->n_out = S->n_vars;
  if (S->n_out > NF_MAX_RANK)
    return fail(E, st->loc, NF_ELIMIT, "'%s' would have more than %d dimensions",
                key, NF_MAX_RANK);
  if (out_t && out_t->rank != S->n_out) goto lhs_rank;
  if (out_t)
    for (int k = 0; k < S->n_out; k++) {
      S->vars[k].has_range = 1;
      S->vars[k].lo = 0;
      S->vars[k].ext = out_t->shape[k];
    }
  /* Explicit ranges.  Names not yet known become reduction variables in
   * the order of the where clause only if they are used (checked below). */
  int64_t rlo[NF_MAX_VARS], rhi[NF_MAX_VARS];
  const char *rname[NF_MAX_VARS];
  nf_loc rloc[NF_MAX_VARS];
  int n_r = st->n_ranges;
  if (n_r > NF_MAX_VARS)
    return fail(E, st->loc, NF_ELIMIT, "too many ranges");
  for (int k = 0; k < n_r; k++) {
    const nf_ast_range *ra = &st->ranges[k];
    if ((rc = ceval(I, ra->lo, &rlo[k]))) return rc;
    if ((rc = ceval(I, ra->hi, &rhi[k]))) return rc;
    rname[k] = ra->name;
    rloc[k] = ra->loc;
    for (int j = 0; j < k; j++)
      if (strcmp(rname[j], ra->name) == 0)
        return fail(E, ra->loc, NF_ETYPE, "range of '%s' given twice", ra->name);
    if (cfind(I, ra->name))
      return fail(E, ra->loc, NF_ETYPE,
                  "'%s' is a size or parameter, not an index variable", ra->name);
    if (rhi[k] < rlo[k])
      return fail(E, ra->loc, NF_ETYPE,
                  "empty or reversed range %" PRId64 ":%" PRId64 " for '%s'",
                  rlo[k], rhi[k], ra->name);
  }

  /* Right side. */
  val rv;
  if ((rc = ex(S, st->rhs, &rv))) return rc;
  int n_red = S->n_vars - S->n_out;

  for (int k = 0; k < n_r; k++) {
    int v = find_var(S, rname[k]);
    if (v < 0)
      return fail(E, rloc[k], NF_ETYPE,
                  "unused reduction variable '%s': it does not appear in the "
                  "statement",
                  rname[k]);
    svar *sv = &S->vars[v];
    if (v < S->n_out) {
      if (out_t)
        return fail(E, rloc[k], NF_ETYPE,
                    "'%s' indexes the output '%s'; its range is the declared "
                    "dimension",
                    rname[k], key);
      if (rlo[k] != 0)
        return fail(E, rloc[k], NF_ETYPE,
                    "the range of the index '%s' of a new tensor must start at 0",
                    rname[k]);
    }
    sv->has_range = 1;
    sv->explicit_range = 1;
    sv->lo = rlo[k];
    if (__builtin_sub_overflow(rhi[k], rlo[k], &sv->ext))
      return fail(E, rloc[k], NF_EOVERFLOW, "range of '%s' overflows", rname[k]);
  }

  /* Inferred ranges: from accesses where a variable stands alone. */
  for (int a = 0; a < S->n_acc; a++) {
    const nf_expr *acc = S->acc[a].e;
    const nf_tensor *t = tensor_of(I, acc->u.tensor);
    for (int k = 0; k < acc->n_args; k++) {
      const nf_expr *ix = acc->args[k];
      if (ix->op != NF_OP_VAR) continue;
      int v = (int)ix->u.var;
      svar *sv = &S->vars[v];
      if (sv->explicit_range || (v < S->n_out && out_t)) continue;
      if (!sv->has_range) {
        sv->has_range = 1;
        sv->lo = 0;
        sv->ext = t->shape[k];
        sv->range_from = tprintf(E, "%s (dimension %d)", S->acc[a].tname, k);
      } else if (sv->lo != 0 || sv->ext != t->shape[k]) {
        return fail(E, S->acc[a].ast->loc, NF_ETYPE,
                    "the range of '%s' is inferred as 0:%" PRId64
                    " from %s but %s has size %" PRId64
                    " in dimension %d; give the range with 'where %s in LO:HI'",
                    var_desc(S, v), sv->ext, sv->range_from, S->acc[a].tname,
                    t->shape[k], k, var_desc(S, v));
      }
    }
  }
  for (int v = 0; v < S->n_vars; v++)
    if (!S->vars[v].has_range)
      return fail(E, S->vars[v].loc, NF_ETYPE,
                  "cannot infer the range of '%s': it never appears alone as "
                  "an index; give it with 'where %s in LO:HI'",
                  var_desc(S, v), var_desc(S, v));

  /* Reduction operator vs reduction variables. */
  if (n_red > 0 && st->red == NF_RED_NONE) {
    /* a typo of an index is the likelier mistake: say which */
    const char *outs[NF_MAX_VARS];
    for (int v = 0; v < S->n_out; v++) outs[v] = S->vars[v].name;
    const char *near = nf_did_you_mean(var_desc(S, S->n_out), outs, S->n_out);
    if (near)
      return fail(E, S->vars[S->n_out].loc, NF_ETYPE,
                  "'%s' is not an index of '%s' (did you mean '%s'?); to reduce "
                  "over it use a reduction operator such as '+=!'",
                  var_desc(S, S->n_out), key, near);
    return fail(E, S->vars[S->n_out].loc, NF_ETYPE,
                "'%s' is not an index of '%s'; to reduce over it use a "
                "reduction operator such as '+=!'",
                var_desc(S, S->n_out), key);
  }

  /* Types. */
  nf_dtype dt;
  const nf_expr *rhs;
  if (out_t) {
    dt = (nf_dtype)out_t->dtype;
    int ok;
    if (rv.weak == 1)
      ok = 1;
    else if (rv.weak == 2)
      ok = nf_dtype_is_float(dt);
    else if (nf_dtype_is_float(dt))
      ok = 1;
    else if (nf_dtype_is_int(dt))
      ok = nf_dtype_is_int(rv.t) || rv.t == NF_BOOL;
    else
      ok = rv.t == NF_BOOL;
    if (!ok)
      return fail(E, st->rhs->loc, NF_ETYPE,
                  "cannot store %s in '%s' of type %s without a cast (write "
                  "%s(...))",
                  rv.weak == 2 ? "a float" : nf_dtype_name(rv.t), key,
                  nf_dtype_name(dt), nf_dtype_name(dt));
  } else {
    dt = rv.weak == 1 ? NF_I64 : rv.weak == 2 ? NF_F32 : rv.t;
  }
  rhs = materialize(S, &rv, dt);
  if (!rhs) {
    if (nf_ir_ctx_oom(E->ctx)) return oom(E);
    return fail(E, st->rhs->loc, NF_ERANGE, "the literal does not fit in %s",
                nf_dtype_name(dt));
  }
  if (st->red != NF_RED_NONE && dt == NF_BOOL)
    return fail(E, st->loc, NF_ETYPE, "cannot reduce bool values; cast them");

  /* Bounds. */
  nf_range base[NF_MAX_VARS];
  for (int v = 0; v < S->n_vars; v++) {
    base[v].lo = S->vars[v].lo;
    if (__builtin_add_overflow(S->vars[v].lo, S->vars[v].ext - 1, &base[v].hi))
      return fail(E, S->vars[v].loc, NF_EOVERFLOW, "range of '%s' overflows",
                  var_desc(S, v));
  }
  int empty = 0;
  for (int v = 0; v < S->n_vars; v++)
    if (S->vars[v].ext == 0) empty = 1;
  if (!empty)
    for (int a = 0; a < S->n_acc; a++)
      if ((rc = check_access(S, &S->acc[a], base))) return rc;

  /* The tensor. */
  uint32_t id;
  if (out_t) {
    id = te->id;
  } else {
    int64_t shape[NF_MAX_RANK];
    for (int k = 0; k < S->n_out; k++) shape[k] = S->vars[k].ext;
    if ((rc = new_local(I, key, dt, S->n_out, shape, st->lhs.loc, &id))) return rc;
    te = tadd(I, key, id);
    if (!te) return oom(E);
  }

  nf_stmt s;
  memset(&s, 0, sizeof s);
  s.out = id;
  s.red = st->red;
  s.n_red = (uint8_t)n_red;
  for (int r = 0; r < n_red; r++) {
    s.red_lo[r] = S->vars[S->n_out + r].lo;
    s.red_ext[r] = S->vars[S->n_out + r].ext;
  }
  for (int v = 0; v < S->n_vars; v++)
    s.var_names[v] = nf_arena_strdup(nf_ir_ctx_arena(E->ctx), var_desc(S, v));
  s.rhs = nf_simplify(E->ctx, rhs, empty ? NULL : base, empty ? 0 : S->n_vars);
  if (!s.rhs) return oom(E);
  if ((rc = drop_unit_vars(E, &s, S->n_out))) return rc;
  if ((rc = emit_stmt(I, &s, st->loc))) return rc;
  te->defined = 1;
  return NF_OK;
lhs_rank:
  return fail(E, st->lhs.loc, NF_ETYPE,
              "'%s' has %d dimension%s %s but the left side has %d index%s",
              key, out_t->rank, out_t->rank == 1 ? "" : "s",
              shape_str(E, out_t->rank, out_t->shape), st->n_idx,
              st->n_idx == 1 ? "" : "es");
}

/* ---------------------------------------------------------------------
 * Calls, copies, loops
 * ------------------------------------------------------------------- */

static int run_body(inst *I, int n, nf_ast_stmt *const *body);
static int run_def(elab *E, inst *I, const actual *acts, nf_loc use_loc,
                   int n_params, const char *const *pnames, const int64_t *pvals,
                   const nf_loc *plocs, int64_t (*oshape)[NF_MAX_RANK],
                   int *orank);

/* Resolves the result slot of a call or copy: an existing undefined output
 * of the caller, or a new local.  Checks shapes. */
static int result_slot(inst *I, const nf_ast_tref *r, nf_dtype dt, int rank,
                       const int64_t *shape, uint32_t *id, int *te_out) {
  elab *E = I->E;
  const char *key;
  int rc = tref_key(I, r, &key);
  if (rc) return rc;
  tent *te = tfind(I, key);
  if (te && te->defined)
    return fail(E, r->loc, NF_ETYPE,
                "tensor '%s' is already defined (each tensor is defined once)",
                key);
  if (te) {
    const nf_tensor *t = tensor_of(I, te->id);
    int same = t->rank == rank && t->dtype == dt;
    for (int k = 0; same && k < rank; k++) same = t->shape[k] == shape[k];
    if (!same)
      return fail(E, r->loc, NF_ETYPE,
                  "'%s' is declared %s%s but receives %s%s", key,
                  nf_dtype_name((nf_dtype)t->dtype),
                  shape_str(E, t->rank, t->shape), nf_dtype_name(dt),
                  shape_str(E, rank, shape));
    *id = te->id;
  } else {
    if ((rc = new_local(I, key, dt, rank, shape, r->loc, id))) return rc;
    te = tadd(I, key, *id);
    if (!te) return oom(E);
  }
  *te_out = (int)(te - I->t);
  return NF_OK;
}

static int do_copy(inst *I, const nf_ast_stmt *st) {
  elab *E = I->E;
  tent *src;
  int rc = tref_resolve(I, &st->args[0], &src);
  if (rc) return rc;
  if (st->n_results != 1)
    return fail(E, st->loc, NF_ETYPE, "a copy has one result");
  const nf_tensor *t = tensor_of(I, src->id);
  int rank = t->rank;
  int64_t shape[NF_MAX_RANK];
  memcpy(shape, t->shape, sizeof shape);
  nf_dtype dt = (nf_dtype)t->dtype;
  uint32_t sid = src->id, id;
  int te;
  if ((rc = result_slot(I, &st->results[0], dt, rank, shape, &id, &te))) return rc;
  nf_stmt s;
  memset(&s, 0, sizeof s);
  const nf_expr *idx[NF_MAX_RANK];
  for (int k = 0; k < rank; k++) {
    idx[k] = nf_e_var(E->ctx, (uint32_t)k);
    s.var_names[k] = tprintf(E, "i%d", k);
    if (s.var_names[k])
      s.var_names[k] = nf_arena_strdup(nf_ir_ctx_arena(E->ctx), s.var_names[k]);
  }
  s.out = id;
  s.rhs = nf_e_access(E->ctx, sid, dt, rank, idx);
  if (!s.rhs) return oom(E);
  if ((rc = emit_stmt(I, &s, st->loc))) return rc;
  I->t[te].defined = 1;
  return NF_OK;
}

static int do_value(inst *I, const nf_ast_stmt *st);
static nf_ast_expr *tx_node(elab *E, int kind, nf_loc loc, int n_args);

static int do_call(inst *I, const nf_ast_stmt *st) {
  elab *E = I->E;
  int rc;
  if (st->value) return do_value(I, st);
  if (!st->callee) return do_copy(I, st);
  const nf_ast_def *cd = nf__module_find(E->m, st->callee);
  if (!cd && nf__lang_call_is_expr(st->callee)) {
    /* `Y = exp(X)`, `Y = sum(X)`: a tensor expression of the call */
    nf_ast_expr *v = tx_node(E, NF_A_CALL, st->callee_loc, st->n_args);
    if (!v) return oom(E);
    v->name = st->callee;
    v->n_params = st->n_params;
    v->params = st->params;
    for (int k = 0; k < st->n_args; k++) {
      if (!(v->args[k] = tx_node(E, NF_A_NAME, st->args[k].loc, 0))) return oom(E);
      v->args[k]->name = st->args[k].name;
      v->args[k]->sub = st->args[k].sub;
    }
    nf_ast_stmt *vs = talloc(E, sizeof *vs);
    if (!vs) return oom(E);
    *vs = *st;
    vs->value = v;
    vs->callee = NULL;
    vs->n_args = 0;
    return do_value(I, vs);
  }
  if (!cd)
    return fail(E, st->callee_loc, NF_ENOENT, "unknown def '%s'", st->callee);
  for (int k = 0; k < cd->n_body; k++) {
    const nf_ast_stmt *ps = cd->body[k];
    if (ps->kind != NF_S_PARAM) continue;
    fail(E, st->callee_loc, NF_ETYPE,
         "%s calls %s, which declares param '%s': param declarations are "
         "allowed only in the def being trained; pass '%s' to %s as an "
         "input instead",
         I->def->name, cd->name, ps->decl.name, ps->decl.name, cd->name);
    nf_diag_note(E->d, ps->loc, "param '%s' is declared here",
                 ps->decl.name);
    return E->status;
  }
  if (st->n_args != cd->n_inputs)
    return fail(E, st->callee_loc, NF_ETYPE, "%s takes %d input%s, got %d",
                cd->name, cd->n_inputs, cd->n_inputs == 1 ? "" : "s",
                st->n_args);
  if (st->n_results != cd->n_outputs)
    return fail(E, st->loc, NF_ETYPE, "%s returns %d output%s, but %d %s named",
                cd->name, cd->n_outputs, cd->n_outputs == 1 ? "" : "s",
                st->n_results, st->n_results == 1 ? "is" : "are");
  if (E->depth >= MAX_CALL_DEPTH)
    return fail(E, st->loc, NF_ELIMIT, "calls nested more than %d deep",
                MAX_CALL_DEPTH);
  /* Arguments. */
  actual *acts = talloc(E, sizeof(actual) * (size_t)(cd->n_inputs + 1));
  uint32_t *aid = talloc(E, sizeof(uint32_t) * (size_t)(cd->n_inputs + 1));
  if (!acts || !aid) return oom(E);
  /* (first every argument resolved, which may add tensors: the shapes
   * taken below point into the graph's tensors) */
  for (int k = 0; k < st->n_args; k++) {
    tent *te;
    if ((rc = tref_resolve(I, &st->args[k], &te))) return rc;
    aid[k] = te->id;
  }
  for (int k = 0; k < st->n_args; k++) {
    const char *key;
    if ((rc = tref_key(I, &st->args[k], &key))) return rc;
    const nf_tensor *t = tensor_of(I, aid[k]);
    if (t->dtype != cd->inputs[k].dtype)
      return fail(E, st->args[k].loc, NF_ETYPE,
                  "input '%s' of %s is %s but '%s' is %s", cd->inputs[k].name,
                  cd->name, nf_dtype_name((nf_dtype)cd->inputs[k].dtype), key,
                  nf_dtype_name((nf_dtype)t->dtype));
    acts[k].rank = t->rank;
    acts[k].shape = t->shape;
    acts[k].have = 1;
    acts[k].dtype = (nf_dtype)t->dtype;
  }
  /* Parameters, evaluated in the caller. */
  const char **pn = talloc(E, sizeof(char *) * (size_t)(st->n_params + 1));
  int64_t *pv = talloc(E, sizeof(int64_t) * (size_t)(st->n_params + 1));
  nf_loc *pl = talloc(E, sizeof(nf_loc) * (size_t)(st->n_params + 1));
  if (!pn || !pv || !pl) return oom(E);
  for (int k = 0; k < st->n_params; k++) {
    pn[k] = st->params[k].name;
    pl[k] = st->params[k].loc;
    if ((rc = ceval(I, st->params[k].value, &pv[k]))) return rc;
  }
  inst *C = talloc(E, sizeof(inst));
  if (!C) return oom(E);
  C->E = E;
  C->def = cd;
  const char *rkey;
  if ((rc = tref_key(I, &st->results[0], &rkey))) return rc;
  C->prefix = tprintf(E, "%s%s.", I->prefix, rkey);
  if (!C->prefix) return oom(E);
  /* Bind the callee, then create the result tensors. */
  int64_t(*oshape)[NF_MAX_RANK] =
      talloc(E, sizeof(int64_t) * NF_MAX_RANK * (size_t)(cd->n_outputs + 1));
  int *orank = talloc(E, sizeof(int) * (size_t)(cd->n_outputs + 1));
  if (!oshape || !orank) return oom(E);
  E->depth++;
  rc = run_def(E, C, acts, st->callee_loc, st->n_params, pn, pv, pl, oshape, orank);
  if (rc) goto noted;
  for (int k = 0; k < cd->n_inputs; k++) {
    tent *te = tadd(C, cd->inputs[k].name, aid[k]);
    if (!te) {
      rc = oom(E);
      goto noted;
    }
    te->defined = 1;
  }
  int *rte = talloc(E, sizeof(int) * (size_t)(cd->n_outputs + 1));
  if (!rte) {
    rc = oom(E);
    goto noted;
  }
  for (int k = 0; k < cd->n_outputs; k++) {
    uint32_t id;
    if ((rc = result_slot(I, &st->results[k], (nf_dtype)cd->outputs[k].dtype,
                          orank[k], oshape[k], &id, &rte[k])))
      goto out;
    for (int j = 0; j < k; j++)
      if (rte[j] == rte[k]) {
        rc = fail(E, st->results[k].loc, NF_ETYPE,
                  "'%s' is named twice among the results", I->t[rte[k]].key);
        goto out;
      }
    tent *ce = tadd(C, cd->outputs[k].name, id);
    if (!ce) {
      rc = oom(E);
      goto out;
    }
    ce->declared_output = 1;
  }
  rc = run_body(C, cd->n_body, cd->body);
  if (rc) goto noted;
  for (int k = 0; k < cd->n_outputs; k++) {
    tent *ce = tfind(C, cd->outputs[k].name);
    if (!ce || !ce->defined) {
      rc = fail(E, cd->outputs[k].loc, NF_ETYPE,
                "output '%s' of %s is never defined", cd->outputs[k].name,
                cd->name);
      goto noted;
    }
  }
  for (int k = 0; k < cd->n_outputs; k++) I->t[rte[k]].defined = 1;
  E->depth--;
  return NF_OK;
noted:
  nf_diag_note(E->d, st->callee_loc, "in the call to %s here", cd->name);
out:
  E->depth--;
  return rc;
}

/* ---- tensor expressions (`T = sigmoid(linear(X, W, b)) * 2.0 + B`) ----
 *
 * The right side of a call statement may be a tensor expression
 * (st->value).  It is elaborated as the statements one would write by
 * hand: each call of a def or a built-in shape operator inside it becomes
 * statements into a local named after the statement's first result and
 * the callee ("T.linear"), and the elementwise rest (+ - * /, a
 * comparison, unary minus, literals, sizes, math functions, casts, where
 * and clamp) becomes one element statement over the broadcast shape, with
 * NumPy's rules: shapes aligned at their last dimension, a dimension of
 * size 1 read at 0 against a larger one. */

static nf_ast_expr *tx_node(elab *E, int kind, nf_loc loc, int n_args) {
  nf_ast_expr *e = talloc(E, sizeof *e);
  if (!e) return NULL;
  memset(e, 0, sizeof *e);
  e->kind = (uint8_t)kind;
  e->loc = loc;
  e->n_args = n_args;
  if (n_args && !(e->args = talloc(E, sizeof *e->args * (size_t)n_args))) return NULL;
  return e;
}

static nf_ast_expr *tx_int(elab *E, nf_loc loc, int64_t v) {
  nf_ast_expr *e = tx_node(E, NF_A_INT, loc, 0);
  if (e) e->ival = v;
  return e;
}

static nf_ast_expr *tx_bin(elab *E, int op, nf_ast_expr *a, nf_ast_expr *b) {
  if (!a || !b) return NULL;
  nf_ast_expr *e = tx_node(E, NF_A_BINARY, a->loc, 2);
  if (!e) return NULL;
  e->op = (uint8_t)op;
  e->args[0] = a;
  e->args[1] = b;
  return e;
}

/* A fresh local's key "BASE.WHAT" (then "BASE.WHAT2", ...), taken. */
static const char *tx_temp(inst *I, const char *base, const char *what) {
  for (int n = 1;; n++) {
    const char *k = n == 1 ? tprintf(I->E, "%s.%s", base, what)
                           : tprintf(I->E, "%s.%s%d", base, what, n);
    if (!k) return NULL;
    int taken = tfind(I, k) != NULL;
    for (const txname *t = I->temps; t && !taken; t = t->next) taken = !strcmp(t->key, k);
    if (taken) continue;
    txname *t = talloc(I->E, sizeof *t);
    if (!t) return NULL;
    t->key = k;
    t->next = I->temps;
    I->temps = t;
    return k;
  }
}

/* What a tensor expression's operand is, copied out of the graph (whose
 * tensor array moves as tensors are added). */
typedef struct tinfo {
  nf_ast_tref ref;
  uint32_t id;
  nf_dtype dt;
  int rank;
  int64_t shape[NF_MAX_RANK];
} tinfo;

static int tx_lookup(inst *I, const nf_ast_tref *r, tinfo *ti) {
  tent *te;
  int rc = tref_resolve(I, r, &te);
  if (rc) return rc;
  const nf_tensor *t = tensor_of(I, te->id);
  ti->ref = *r;
  ti->id = te->id;
  ti->dt = (nf_dtype)t->dtype;
  ti->rank = t->rank;
  memcpy(ti->shape, t->shape, sizeof(int64_t) * t->rank);
  return NF_OK;
}

static int tx_tensor(inst *I, const nf_ast_expr *e, const char *base, const nf_ast_stmt *top,
                     nf_ast_tref *out);

/* Whether e is a name that is not a tensor but a size, parameter or loop
 * variable (a scalar of an elementwise expression). */
static int tx_is_size(inst *I, const nf_ast_expr *e) {
  return e->kind == NF_A_NAME && !e->sub && !tfind(I, e->name) && cfind(I, e->name);
}

/* Whether e is a call that becomes statements of its own (a def or a
 * built-in shape operator) rather than part of an element expression. */
/* max(X) and min(X) of one tensor: amax and amin over all (X.max() in
 * PyTorch); of two operands they are elementwise. */
static int tx_max_all(const nf_ast_expr *e) {
  return e->kind == NF_A_CALL && e->n_args == 1 && !e->n_params &&
         (!strcmp(e->name, "max") || !strcmp(e->name, "min"));
}

static int tx_hoisted(inst *I, const nf_ast_expr *e) {
  if (e->kind != NF_A_CALL) return 0;
  int bi = nf__lang_builtin(e->name);
  return bi == NF__BI_SHAPE || bi == NF__BI_MULTI || tx_max_all(e) ||
         nf__module_find(I->E->m, e->name);
}

/* Calls of defs and shape operators inside e made into locals: a copy of
 * e in which each is a plain tensor (NF_A_NAME). */
static int tx_hoist(inst *I, const nf_ast_expr *e, const char *base, nf_ast_expr **out) {
  elab *E = I->E;
  if (e->kind == NF_A_NAME && e->sub_hi)
    return fail(E, e->loc, NF_ETYPE,
                "the family range %s[...:...] is a list of tensors: only cat and stack "
                "take one",
                e->name);
  if (tx_hoisted(I, e)) {
    nf_ast_tref r;
    int rc = tx_tensor(I, e, base, NULL, &r);
    if (rc) return rc;
    nf_ast_expr *n = tx_node(E, NF_A_NAME, e->loc, 0);
    if (!n) return oom(E);
    n->name = r.name;
    n->sub = r.sub;
    *out = n;
    return NF_OK;
  }
  nf_ast_expr *c = talloc(E, sizeof *c);
  if (!c) return oom(E);
  *c = *e;
  if (e->n_args && !(c->args = talloc(E, sizeof *c->args * (size_t)e->n_args))) return oom(E);
  for (int k = 0; k < e->n_args; k++) {
    int rc = tx_hoist(I, e->args[k], base, &c->args[k]);
    if (rc) return rc;
  }
  *out = c;
  return NF_OK;
}

/* The broadcast of the shapes of the tensors in e (after tx_hoist) into
 * rank/shape. */
static int tx_shape(inst *I, const nf_ast_expr *e, int *rank, int64_t *shape) {
  elab *E = I->E;
  if (tx_is_size(I, e)) return NF_OK;
  if (e->kind == NF_A_NAME) {
    nf_ast_tref r = {.name = e->name, .sub = e->sub, .loc = e->loc};
    tinfo t;
    int rc = tx_lookup(I, &r, &t);
    if (rc) return rc;
    int R = t.rank > *rank ? t.rank : *rank;
    int64_t res[NF_MAX_RANK];
    for (int d = 0; d < R; d++) {
      int a = d - (R - *rank), b = d - (R - t.rank);
      int64_t x = a >= 0 ? shape[a] : 1, y = b >= 0 ? t.shape[b] : 1;
      if (x != y && x != 1 && y != 1)
        return fail(E, e->loc, NF_ETYPE,
                    "'%s' is %s, which does not broadcast with %s (dimension %d "
                    "from the end: %" PRId64 " against %" PRId64 ")",
                    e->name, shape_str(E, t.rank, t.shape), shape_str(E, *rank, shape),
                    R - d, y, x);
      res[d] = x == 1 ? y : x;
    }
    *rank = R;
    memcpy(shape, res, sizeof(int64_t) * (size_t)R);
    return NF_OK;
  }
  for (int k = 0; k < e->n_args; k++) {
    int rc = tx_shape(I, e->args[k], rank, shape);
    if (rc) return rc;
  }
  return NF_OK;
}

/* Tensor t read at the variables vars of a result of rank/shape (aligned
 * at the last dimension; at 0 where t has size 1 against a larger
 * result). */
static nf_ast_expr *tx_read(elab *E, const tinfo *t, nf_loc loc, int rank, const int64_t *shape,
                            nf_ast_expr *const *vars) {
  nf_ast_expr *a = tx_node(E, NF_A_APPLY, loc, t->rank);
  if (!a) return NULL;
  a->name = t->ref.name;
  a->sub = t->ref.sub;
  for (int d = 0; d < t->rank; d++) {
    int rd = d + rank - t->rank;
    a->args[d] = t->shape[d] == 1 && shape[rd] != 1 ? tx_int(E, loc, 0) : vars[rd];
    if (!a->args[d]) return NULL;
  }
  return a;
}

/* e (after tx_hoist) as an element expression over the variables vars of
 * the result's rank/shape. */
static int tx_elem(inst *I, const nf_ast_expr *e, int rank, const int64_t *shape,
                   nf_ast_expr *const *vars, nf_ast_expr **out) {
  elab *E = I->E;
  if (tx_is_size(I, e)) {
    *out = (nf_ast_expr *)e; /* the element statement reads the size */
    return NF_OK;
  }
  if (e->kind == NF_A_NAME) {
    nf_ast_tref r = {.name = e->name, .sub = e->sub, .loc = e->loc};
    tinfo t;
    int rc = tx_lookup(I, &r, &t);
    if (rc) return rc;
    if (!(*out = tx_read(E, &t, e->loc, rank, shape, vars))) return oom(E);
    return NF_OK;
  }
  nf_ast_expr *c = talloc(E, sizeof *c);
  if (!c) return oom(E);
  *c = *e;
  if (e->n_args && !(c->args = talloc(E, sizeof *c->args * (size_t)e->n_args))) return oom(E);
  for (int k = 0; k < e->n_args; k++) {
    int rc = tx_elem(I, e->args[k], rank, shape, vars, &c->args[k]);
    if (rc) return rc;
  }
  if (e->kind == NF_A_CALL) {
    nf_op op;
    int ar = 1;
    nf_dtype dt;
    if (e->n_params)
      return fail(E, e->params[0].loc, NF_ETYPE, "%s takes no parameters", e->name);
    int where = !strcmp(e->name, "where"), clamp = !strcmp(e->name, "clamp");
    if (where || clamp) {
      if (e->n_args != 3)
        return fail(E, e->loc, NF_ETYPE, "%s takes 3 arguments (%s), got %d", e->name,
                    where ? "C, A, B" : "X, LO, HI", e->n_args);
      if (where) {
        c->kind = NF_A_SELECT;
      } else { /* min(max(X, LO), HI) */
        nf_ast_expr *mx = tx_node(E, NF_A_APPLY, e->loc, 2), *mn = tx_node(E, NF_A_APPLY, e->loc, 2);
        if (!mx || !mn) return oom(E);
        mx->name = "max";
        mx->args[0] = c->args[0];
        mx->args[1] = c->args[1];
        mn->name = "min";
        mn->args[0] = mx;
        mn->args[1] = c->args[2];
        c = mn;
      }
    } else if (!nf__lang_math_fn(e->name, &op, &ar) &&
               !nf_dtype_parse(e->name, strlen(e->name), &dt)) {
      return fail(E, e->loc, NF_ENOENT, "unknown def or function '%s'", e->name);
    } else {
      c->kind = NF_A_APPLY;
    }
  }
  *out = c;
  return NF_OK;
}

/* Variable names for an element statement's dimensions: "i0", "i1", ...
 * (with '_' appended while one names a size or tensor). */
static int tx_vars(inst *I, nf_loc loc, int n, const char *stem, nf_ast_expr **vars) {
  for (int d = 0; d < n; d++) {
    const char *v = tprintf(I->E, "%s%d", stem, d);
    while (v && (cfind(I, v) || tfind(I, v))) v = tprintf(I->E, "%s_", v);
    if (!v || !(vars[d] = tx_node(I->E, NF_A_NAME, loc, 0))) return oom(I->E);
    vars[d]->name = v;
  }
  return NF_OK;
}

/* Emits `dest(vars) RED= rhs` for a result of rank/shape, with the
 * reduction variables rvars over 0:rext: the ranges are given for every
 * variable of a new local and for the reduction variables (a declared
 * output's are its dimensions, checked here against shape). */
static int tx_emit(inst *I, const nf_ast_tref *dest, nf_loc loc, int rank, const int64_t *shape,
                   nf_ast_expr *const *vars, nf_ast_expr *rhs, int red, int n_red,
                   nf_ast_expr *const *rvars, const int64_t *rext) {
  elab *E = I->E;
  const char *key;
  int rc = tref_key(I, dest, &key);
  if (rc) return rc;
  tent *dst = tfind(I, key);
  int declared = dst && !dst->defined;
  if (declared) {
    const nf_tensor *t = tensor_of(I, dst->id);
    int same = t->rank == rank;
    for (int d = 0; same && d < rank; d++) same = t->shape[d] == shape[d];
    if (!same)
      return fail(E, dest->loc, NF_ETYPE, "'%s' is declared %s%s but receives %s", key,
                  nf_dtype_name((nf_dtype)t->dtype), shape_str(E, t->rank, t->shape),
                  shape_str(E, rank, shape));
  }
  nf_ast_stmt *s = talloc(E, sizeof *s);
  if (!s) return oom(E);
  memset(s, 0, sizeof *s);
  s->kind = NF_S_ELEM;
  s->loc = loc;
  s->lhs = *dest;
  s->n_idx = rank;
  if (rank && !(s->idx = talloc(E, sizeof *s->idx * (size_t)rank))) return oom(E);
  for (int d = 0; d < rank; d++) s->idx[d] = vars[d];
  s->red = (uint8_t)red;
  s->rhs = rhs;
  int nr = (declared ? 0 : rank) + n_red;
  if (nr && !(s->ranges = talloc(E, sizeof *s->ranges * (size_t)nr))) return oom(E);
  for (int d = 0; d < nr; d++) {
    int lhs = d < nr - n_red;
    nf_ast_range *r = &s->ranges[d];
    r->name = lhs ? vars[d]->name : rvars[d - (nr - n_red)]->name;
    r->loc = loc;
    r->lo = tx_int(E, loc, 0);
    r->hi = tx_int(E, loc, lhs ? shape[d] : rext[d - (nr - n_red)]);
    if (!r->lo || !r->hi) return oom(E);
  }
  s->n_ranges = nr;
  return do_elem(I, s);
}

/* ---- the built-in shape operators ---- */

/* Argument k of call e made a tensor (a plain tensor, or the statements
 * of the expression into a local). */
static int bi_tensor(inst *I, const nf_ast_expr *e, int k, const char *base, tinfo *t) {
  const nf_ast_expr *a = e->args[k];
  if (a->kind == NF_A_INT || a->kind == NF_A_FLOAT || tx_is_size(I, a))
    return fail(I->E, a->loc, NF_ETYPE, "argument %d of %s must be a tensor", k + 1, e->name);
  nf_ast_tref r;
  int rc = tx_tensor(I, a, base, NULL, &r);
  return rc ? rc : tx_lookup(I, &r, t);
}

/* Parameter `name` of call e (dflt when absent); the names it may have are
 * known (NULL-terminated), others are errors. */
static int bi_param(inst *I, const nf_ast_expr *e, const char *name, int64_t dflt, int64_t *v,
                    const char *const *known) {
  *v = dflt;
  for (int k = 0; k < e->n_params; k++) {
    int ok = 0;
    for (int j = 0; known[j]; j++) ok |= !strcmp(known[j], e->params[k].name);
    if (!ok)
      return fail(I->E, e->params[k].loc, NF_ETYPE, "%s has no parameter '%s'", e->name,
                  e->params[k].name);
    if (!strcmp(e->params[k].name, name)) {
      int rc = ceval(I, e->params[k].value, v);
      if (rc) return rc;
    }
  }
  return NF_OK;
}

/* An axis of a tensor of rank n (negative: from the end) in [0, n). */
static int bi_axis(inst *I, const nf_ast_expr *e, nf_loc loc, int64_t a, int n, int *out) {
  if (a < -n || a >= n)
    return fail(I->E, loc, NF_ERANGE, "%s: axis %" PRId64 " is out of range for rank %d", e->name,
                a, n);
  *out = (int)(a < 0 ? a + n : a);
  return NF_OK;
}

/* dest(vars) = X at the same row-major position, for a result of
 * rank/shape with as many elements as X. */
static int bi_reshape_to(inst *I, const nf_ast_expr *e, const tinfo *X, const nf_ast_tref *dest,
                         int rank, const int64_t *shape) {
  elab *E = I->E;
  nf_ast_expr *vars[NF_MAX_RANK];
  int rc = tx_vars(I, e->loc, rank, "i", vars);
  if (rc) return rc;
  nf_ast_expr *flat = tx_int(E, e->loc, 0);
  for (int d = 0; d < rank && flat; d++)
    flat = d ? tx_bin(E, NF_OP_ADD, tx_bin(E, NF_OP_MUL, flat, tx_int(E, e->loc, shape[d])),
                      vars[d])
             : vars[0];
  nf_ast_expr *a = tx_node(E, NF_A_APPLY, e->loc, X->rank);
  if (!flat || !a) return oom(E);
  a->name = X->ref.name;
  a->sub = X->ref.sub;
  int64_t stride = 1;
  for (int j = X->rank - 1; j >= 0; j--) {
    nf_ast_expr *ix = stride == 1 ? flat : tx_bin(E, NF_OP_FLOORDIV, flat, tx_int(E, e->loc, stride));
    if (j > 0 && ix) ix = tx_bin(E, NF_OP_MOD, ix, tx_int(E, e->loc, X->shape[j]));
    if (!(a->args[j] = ix)) return oom(E);
    stride *= X->shape[j];
  }
  return tx_emit(I, dest, e->loc, rank, shape, vars, a, NF_RED_NONE, 0, NULL, NULL);
}

/* reshape(X, d0, d1, ...) and view: one size may be -1 (inferred);
 * reshape<r0 = .., r1 = ..>(X) as the old library def took them. */
static int bi_reshape(inst *I, const nf_ast_expr *e, const char *base, const nf_ast_tref *res) {
  elab *E = I->E;
  if (e->n_args < 1)
    return fail(E, e->loc, NF_ETYPE, "%s takes a tensor and its new sizes", e->name);
  tinfo X;
  int rc = bi_tensor(I, e, 0, base, &X);
  if (rc) return rc;
  int64_t dims[NF_MAX_RANK];
  int rank = e->n_params ? e->n_params : e->n_args - 1;
  if (e->n_params && e->n_args != 1)
    return fail(E, e->loc, NF_ETYPE, "%s takes its sizes as arguments or as <r0 = .., r1 = ..>, "
                "not both", e->name);
  if (rank > NF_MAX_RANK)
    return fail(E, e->loc, NF_ELIMIT, "%s to %d dimensions (at most %d)", e->name, rank,
                NF_MAX_RANK);
  for (int d = 0; d < rank; d++) {
    if (e->n_params) {
      char want[8];
      snprintf(want, sizeof want, "r%d", d);
      if (strcmp(e->params[d].name, want))
        return fail(E, e->params[d].loc, NF_ETYPE, "%s's parameters are r0, r1, ... in order",
                    e->name);
    }
    if ((rc = ceval(I, e->n_params ? e->params[d].value : e->args[d + 1], &dims[d]))) return rc;
  }
  int64_t numel = 1, known = 1;
  for (int j = 0; j < X.rank; j++) numel *= X.shape[j];
  int infer = -1;
  for (int d = 0; d < rank; d++) {
    if (dims[d] == -1 && infer < 0) {
      infer = d;
      continue;
    }
    if (dims[d] < 0)
      return fail(E, e->loc, NF_ERANGE, "%s: size %" PRId64 " (only one size may be -1)",
                  e->name, dims[d]);
    if (__builtin_mul_overflow(known, dims[d], &known))
      return fail(E, e->loc, NF_EOVERFLOW, "%s: the sizes overflow", e->name);
  }
  if (infer >= 0) {
    if (known == 0 || numel % known)
      return fail(E, e->loc, NF_ETYPE,
                  "%s of '%s' %s (%" PRId64 " elements): %" PRId64 " is not a multiple of %" PRId64,
                  e->name, X.ref.name, shape_str(E, X.rank, X.shape), numel, numel, known);
    dims[infer] = numel / known;
  } else if (known != numel) {
    return fail(E, e->loc, NF_ETYPE, "%s of '%s' %s (%" PRId64 " elements) to %s (%" PRId64
                " elements)", e->name, X.ref.name, shape_str(E, X.rank, X.shape), numel,
                shape_str(E, rank, dims), known);
  }
  return bi_reshape_to(I, e, &X, res, rank, dims);
}

/* flatten(X[, start[, end]]): dimensions start..end (default 1..-1, as
 * torch.nn.Flatten) made one. */
static int bi_flatten(inst *I, const nf_ast_expr *e, const char *base, const nf_ast_tref *res) {
  elab *E = I->E;
  if (e->n_args < 1 || e->n_args > 3)
    return fail(E, e->loc, NF_ETYPE, "flatten takes a tensor and optionally start and end");
  tinfo X;
  int rc = bi_tensor(I, e, 0, base, &X);
  if (rc) return rc;
  int64_t a = 1, b = -1;
  if (e->n_args > 1 && (rc = ceval(I, e->args[1], &a))) return rc;
  if (e->n_args > 2 && (rc = ceval(I, e->args[2], &b))) return rc;
  int s = 0, t = 0;
  if ((rc = bi_axis(I, e, e->loc, a, X.rank, &s)) || (rc = bi_axis(I, e, e->loc, b, X.rank, &t)))
    return rc;
  if (s > t) return fail(E, e->loc, NF_ERANGE, "flatten: start %d is after end %d", s, t);
  int64_t dims[NF_MAX_RANK];
  int rank = 0;
  for (int j = 0; j < X.rank; j++) {
    if (j > s && j <= t) {
      dims[rank - 1] *= X.shape[j];
      continue;
    }
    dims[rank++] = X.shape[j];
  }
  return bi_reshape_to(I, e, &X, res, rank, dims);
}

/* transpose(X[, a, b]) (default the last two) and permute(X, d0, d1, ...)
 * (or permute<p0 = .., ...>(X)): result dimension d is X's perm[d]. */
static int bi_permute(inst *I, const nf_ast_expr *e, const char *base, const nf_ast_tref *res) {
  elab *E = I->E;
  int tr = !strcmp(e->name, "transpose");
  if (e->n_args < 1)
    return fail(E, e->loc, NF_ETYPE, "%s takes a tensor and its dimensions", e->name);
  tinfo X;
  int rc = bi_tensor(I, e, 0, base, &X);
  if (rc) return rc;
  int perm[NF_MAX_RANK];
  for (int d = 0; d < X.rank; d++) perm[d] = d;
  if (tr) {
    if (e->n_params || (e->n_args != 1 && e->n_args != 3))
      return fail(E, e->loc, NF_ETYPE, "transpose takes a tensor and two dimensions (default "
                  "the last two)");
    int64_t a = -2, b = -1;
    if (e->n_args == 3 && ((rc = ceval(I, e->args[1], &a)) || (rc = ceval(I, e->args[2], &b))))
      return rc;
    int x = 0, y = 0;
    if ((rc = bi_axis(I, e, e->loc, a, X.rank, &x)) || (rc = bi_axis(I, e, e->loc, b, X.rank, &y)))
      return rc;
    perm[x] = y;
    perm[y] = x;
  } else {
    int n = e->n_params ? e->n_params : e->n_args - 1;
    if (n != X.rank || (e->n_params && e->n_args != 1))
      return fail(E, e->loc, NF_ETYPE, "permute of '%s' (rank %d) takes %d dimensions, got %d",
                  X.ref.name, X.rank, X.rank, n);
    int seen[NF_MAX_RANK] = {0};
    for (int d = 0; d < n; d++) {
      int64_t v;
      if ((rc = ceval(I, e->n_params ? e->params[d].value : e->args[d + 1], &v))) return rc;
      if ((rc = bi_axis(I, e, e->loc, v, X.rank, &perm[d]))) return rc;
      if (seen[perm[d]]++)
        return fail(E, e->loc, NF_ETYPE, "permute: dimension %d is given twice", perm[d]);
    }
  }
  nf_ast_expr *vars[NF_MAX_RANK];
  int64_t shape[NF_MAX_RANK];
  for (int d = 0; d < X.rank; d++) shape[d] = X.shape[perm[d]];
  if ((rc = tx_vars(I, e->loc, X.rank, "i", vars))) return rc;
  nf_ast_expr *a = tx_node(E, NF_A_APPLY, e->loc, X.rank);
  if (!a) return oom(E);
  a->name = X.ref.name;
  a->sub = X.ref.sub;
  for (int d = 0; d < X.rank; d++) a->args[perm[d]] = vars[d];
  return tx_emit(I, res, e->loc, X.rank, shape, vars, a, NF_RED_NONE, 0, NULL, NULL);
}

/* sum, mean, amax, amin (X[, axes...]) <keepdim = 0>: over the axes given,
 * else all. */
static int bi_reduce(inst *I, const nf_ast_expr *e, const char *base, const nf_ast_tref *res) {
  elab *E = I->E;
  static const char *const known[] = {"keepdim", NULL};
  if (e->n_args < 1)
    return fail(E, e->loc, NF_ETYPE, "%s takes a tensor and optionally axes", e->name);
  tinfo X;
  int rc = bi_tensor(I, e, 0, base, &X);
  if (rc) return rc;
  int64_t keep;
  if ((rc = bi_param(I, e, "keepdim", 0, &keep, known))) return rc;
  int red[NF_MAX_RANK] = {0}, n_red = 0;
  for (int k = 1; k < e->n_args; k++) {
    int64_t a;
    int ax = 0;
    if ((rc = ceval(I, e->args[k], &a)) || (rc = bi_axis(I, e, e->args[k]->loc, a, X.rank, &ax)))
      return rc;
    if (red[ax]++)
      return fail(E, e->args[k]->loc, NF_ETYPE, "%s: axis %d is given twice", e->name, ax);
  }
  for (int j = 0; j < X.rank; j++) {
    if (e->n_args == 1) red[j] = 1;
    n_red += red[j];
  }
  int op = !strcmp(e->name, "amax") || !strcmp(e->name, "max") ? NF_RED_MAX
           : !strcmp(e->name, "amin") || !strcmp(e->name, "min") ? NF_RED_MIN
                                                                            : NF_RED_SUM;
  int mean = !strcmp(e->name, "mean");
  int64_t count = 1, shape[NF_MAX_RANK], rext[NF_MAX_RANK];
  int rank = 0;
  nf_ast_expr *vars[NF_MAX_RANK], *rvars[NF_MAX_RANK], *idx[NF_MAX_RANK];
  if ((rc = tx_vars(I, e->loc, X.rank, "i", vars)) || (rc = tx_vars(I, e->loc, X.rank, "r", rvars)))
    return rc;
  int nr = 0;
  for (int j = 0; j < X.rank; j++) {
    if (red[j]) {
      count *= X.shape[j];
      rext[nr] = X.shape[j];
      idx[j] = rvars[nr++];
      if (!keep) continue;
      shape[rank] = 1;
      vars[rank++] = vars[j];
      continue;
    }
    shape[rank] = X.shape[j];
    idx[j] = vars[j];
    vars[rank++] = vars[j];
  }
  nf_ast_expr *a = tx_node(E, NF_A_APPLY, e->loc, X.rank);
  if (!a) return oom(E);
  a->name = X.ref.name;
  a->sub = X.ref.sub;
  for (int j = 0; j < X.rank; j++) a->args[j] = idx[j];
  if (!mean) return tx_emit(I, res, e->loc, rank, shape, vars, a, op, n_red, rvars, rext);
  /* the mean: the sum, then divided by the count (as PyTorch does) */
  nf_ast_tref sum = {.name = tx_temp(I, base, "sum"), .loc = e->loc};
  if (!sum.name) return oom(E);
  if ((rc = tx_emit(I, &sum, e->loc, rank, shape, vars, a, NF_RED_SUM, n_red, rvars, rext)))
    return rc;
  tinfo S;
  if ((rc = tx_lookup(I, &sum, &S))) return rc;
  nf_ast_expr *cnt = tx_node(E, NF_A_FLOAT, e->loc, 0);
  if (!cnt) return oom(E);
  cnt->fval = (double)count;
  nf_ast_expr *div = tx_bin(E, NF_OP_DIV, tx_read(E, &S, e->loc, rank, shape, vars), cnt);
  if (!div) return oom(E);
  return tx_emit(I, res, e->loc, rank, shape, vars, div, NF_RED_NONE, 0, NULL, NULL);
}

/* The select tree over members lo..hi-1 of a cat or stack: member k is
 * read at its own variables, on the axis v - off[k] (cat) or without the
 * new axis (stack). */
static nf_ast_expr *bi_tree(inst *I, nf_loc loc, const tinfo *m, const int64_t *off, int lo, int hi,
                            int stack, int axis, int rank, const int64_t *shape,
                            nf_ast_expr *const *vars) {
  elab *E = I->E;
  if (hi - lo == 1) {
    const tinfo *t = &m[lo];
    nf_ast_expr *a = tx_node(E, NF_A_APPLY, loc, t->rank);
    if (!a) return NULL;
    a->name = t->ref.name;
    a->sub = t->ref.sub;
    for (int d = 0, j = 0; d < rank; d++) {
      if (stack && d == axis) continue;
      nf_ast_expr *ix = vars[d];
      if (!stack && d == axis && off[lo]) ix = tx_bin(E, NF_OP_SUB, ix, tx_int(E, loc, off[lo]));
      if (!(a->args[j++] = ix)) return NULL;
    }
    (void)shape;
    return a;
  }
  int mid = (lo + hi) / 2;
  nf_ast_expr *c = tx_bin(E, NF_OP_LT, vars[axis], tx_int(E, loc, off[mid]));
  nf_ast_expr *s = tx_node(E, NF_A_SELECT, loc, 3);
  if (!c || !s) return NULL;
  s->args[0] = c;
  s->args[1] = bi_tree(I, loc, m, off, lo, mid, stack, axis, rank, shape, vars);
  s->args[2] = bi_tree(I, loc, m, off, mid, hi, stack, axis, rank, shape, vars);
  return s->args[1] && s->args[2] ? s : NULL;
}

#define MAX_MEMBERS 65536

/* cat<axis = 0>(A, B, ...) along an axis they have, stack<axis = 0>(A, B,
 * ...) along a new one; an argument H[lo:hi] stands for the members
 * H[lo], ..., H[hi - 1] of a family. */
static int bi_cat(inst *I, const nf_ast_expr *e, const char *base, const nf_ast_tref *res) {
  elab *E = I->E;
  static const char *const known[] = {"axis", NULL};
  int stack = !strcmp(e->name, "stack");
  int64_t a;
  int rc = bi_param(I, e, "axis", 0, &a, known);
  if (rc) return rc;
  int n = 0, cap = 0;
  tinfo *m = NULL;
  for (int k = 0; k < e->n_args; k++) {
    const nf_ast_expr *x = e->args[k];
    int64_t lo = 0, hi = 1;
    if (x->kind == NF_A_NAME && x->sub_hi &&
        ((rc = ceval(I, x->sub, &lo)) || (rc = ceval(I, x->sub_hi, &hi))))
      return rc;
    if (x->kind == NF_A_NAME && x->sub_hi && hi <= lo)
      return fail(E, x->loc, NF_ERANGE, "%s[%" PRId64 ":%" PRId64 "] has no members", x->name, lo,
                  hi);
    for (int64_t j = lo; j < hi; j++) {
      if (n >= MAX_MEMBERS)
        return fail(E, x->loc, NF_ELIMIT, "%s of more than %d tensors", e->name, MAX_MEMBERS);
      if (n == cap) {
        int nc = cap ? 2 * cap : 16;
        tinfo *g = talloc(E, sizeof *g * (size_t)nc);
        if (!g) return oom(E);
        if (n) memcpy(g, m, sizeof *m * (size_t)n);
        m = g;
        cap = nc;
      }
      if (x->kind == NF_A_NAME && x->sub_hi) {
        nf_ast_tref r = {.name = x->name, .sub = tx_int(E, x->loc, j), .loc = x->loc};
        if (!r.sub) return oom(E);
        rc = tx_lookup(I, &r, &m[n]);
      } else {
        rc = bi_tensor(I, e, k, base, &m[n]);
      }
      if (rc) return rc;
      n++;
    }
  }
  if (!n) return fail(E, e->loc, NF_ETYPE, "%s of no tensors", e->name);
  int rank = m[0].rank + stack, axis = 0;
  if ((rc = bi_axis(I, e, e->loc, a, rank, &axis))) return rc;
  if (!stack && m[0].rank == 0) return fail(E, e->loc, NF_ETYPE, "cat of scalars: use stack");
  if (rank > NF_MAX_RANK)
    return fail(E, e->loc, NF_ELIMIT, "stack to more than %d dimensions", NF_MAX_RANK);
  int64_t *off = talloc(E, sizeof *off * (size_t)(n + 1)), shape[NF_MAX_RANK];
  if (!off) return oom(E);
  off[0] = 0;
  for (int k = 0; k < n; k++) {
    int same = m[k].rank == m[0].rank && m[k].dt == m[0].dt;
    for (int d = 0; same && d < m[0].rank; d++)
      same = m[k].shape[d] == m[0].shape[d] || (!stack && d == axis);
    if (!same)
      return fail(E, m[k].ref.loc, NF_ETYPE, "%s: '%s' is %s%s but '%s' is %s%s%s", e->name,
                  m[k].ref.name, nf_dtype_name(m[k].dt), shape_str(E, m[k].rank, m[k].shape),
                  m[0].ref.name, nf_dtype_name(m[0].dt), shape_str(E, m[0].rank, m[0].shape),
                  stack ? "" : " (they may differ only along the axis)");
    off[k + 1] = off[k] + (stack ? 1 : m[k].shape[axis]);
  }
  if (!stack)
    for (int d = 0; d < rank; d++) shape[d] = d == axis ? off[n] : m[0].shape[d];
  else
    for (int d = 0, j = 0; d < rank; d++) shape[d] = d == axis ? n : m[0].shape[j++];
  nf_ast_expr *vars[NF_MAX_RANK];
  if ((rc = tx_vars(I, e->loc, rank, "i", vars))) return rc;
  nf_ast_expr *t = bi_tree(I, e->loc, m, off, 0, n, stack, axis, rank, shape, vars);
  if (!t) return oom(E);
  return tx_emit(I, res, e->loc, rank, shape, vars, t, NF_RED_NONE, 0, NULL, NULL);
}

/* A, B, ... = chunk<axis = 0>(X): equal parts along the axis;
 * A, B, ... = unbind<axis = 0>(X): one result per index of the axis. */
static int bi_parts(inst *I, const nf_ast_expr *e, const char *base, const nf_ast_tref *res,
                    int n_res) {
  elab *E = I->E;
  static const char *const known[] = {"axis", NULL};
  int unbind = !strcmp(e->name, "unbind");
  if (e->n_args != 1) return fail(E, e->loc, NF_ETYPE, "%s takes one tensor", e->name);
  int64_t a;
  int rc = bi_param(I, e, "axis", 0, &a, known);
  if (rc) return rc;
  tinfo X;
  if ((rc = bi_tensor(I, e, 0, base, &X))) return rc;
  int axis = 0;
  if ((rc = bi_axis(I, e, e->loc, a, X.rank, &axis))) return rc;
  int64_t len = X.shape[axis];
  if (unbind ? len != n_res : len % n_res)
    return fail(E, e->loc, NF_ETYPE,
                unbind ? "unbind: '%s' has %" PRId64 " entries along axis %d, but %d results are "
                         "named"
                       : "chunk: '%s' has %" PRId64 " entries along axis %d, not a multiple of the "
                         "%d results named",
                X.ref.name, len, axis, n_res);
  int64_t part = unbind ? 1 : len / n_res, shape[NF_MAX_RANK];
  int rank = 0;
  for (int d = 0; d < X.rank; d++)
    if (!unbind || d != axis) shape[rank++] = d == axis ? part : X.shape[d];
  for (int k = 0; k < n_res; k++) {
    nf_ast_expr *vars[NF_MAX_RANK];
    if ((rc = tx_vars(I, e->loc, rank, "i", vars))) return rc;
    nf_ast_expr *acc = tx_node(E, NF_A_APPLY, e->loc, X.rank);
    if (!acc) return oom(E);
    acc->name = X.ref.name;
    acc->sub = X.ref.sub;
    for (int d = 0, j = 0; d < X.rank; d++) {
      if (d == axis) {
        acc->args[d] = unbind ? tx_int(E, e->loc, k)
                       : k ? tx_bin(E, NF_OP_ADD, vars[j++], tx_int(E, e->loc, k * part))
                           : vars[j++];
      } else {
        acc->args[d] = vars[j++];
      }
      if (!acc->args[d]) return oom(E);
    }
    if ((rc = tx_emit(I, &res[k], e->loc, rank, shape, vars, acc, NF_RED_NONE, 0, NULL, NULL)))
      return rc;
  }
  return NF_OK;
}

/* Built-in operator e into the results res[0..n_res). */
static int bi_call(inst *I, const nf_ast_expr *e, const char *base, const nf_ast_tref *res,
                   int n_res) {
  elab *E = I->E;
  const char *n = e->name;
  int multi = nf__lang_builtin(n) == NF__BI_MULTI;
  if (!multi && n_res != 1)
    return fail(E, e->loc, NF_ETYPE, "%s has one result, but %d are named", n, n_res);
  if (!multi && e->n_params && strcmp(n, "reshape") && strcmp(n, "permute") &&
      strcmp(n, "sum") && strcmp(n, "mean") && strcmp(n, "amax") && strcmp(n, "amin") &&
      strcmp(n, "cat") && strcmp(n, "stack"))
    return fail(E, e->params[0].loc, NF_ETYPE, "%s takes no parameters", n);
  if (!strcmp(n, "reshape") || !strcmp(n, "view")) return bi_reshape(I, e, base, res);
  if (!strcmp(n, "flatten")) return bi_flatten(I, e, base, res);
  if (!strcmp(n, "transpose") || !strcmp(n, "permute")) return bi_permute(I, e, base, res);
  if (!strcmp(n, "cat") || !strcmp(n, "stack")) return bi_cat(I, e, base, res);
  if (multi) return bi_parts(I, e, base, res, n_res);
  return bi_reduce(I, e, base, res);
}

/* Makes the tensor of expression e: into the results of statement top
 * when given (e is its whole right side), else into a new local named
 * after base.  *out names it. */
static int tx_tensor(inst *I, const nf_ast_expr *e, const char *base, const nf_ast_stmt *top,
                     nf_ast_tref *out) {
  elab *E = I->E;
  int rc;
  if (e->kind == NF_A_NAME && !e->sub_hi && !top) {
    out->name = e->name;
    out->sub = e->sub;
    out->loc = e->loc;
    return NF_OK;
  }
  nf_ast_tref one, *res = &one;
  int n_res = 1;
  memset(&one, 0, sizeof one);
  if (top) {
    res = top->results;
    n_res = top->n_results;
  } else {
    int bi = e->kind == NF_A_CALL ? nf__lang_builtin(e->name) : 0;
    if (bi == NF__BI_MULTI)
      return fail(E, e->loc, NF_ETYPE,
                  "%s has one result per part: name them in a statement of its own "
                  "('A, B = %s(X)')",
                  e->name, e->name);
    one.name = tx_temp(I, base, e->kind == NF_A_CALL ? e->name : "expr");
    one.loc = e->loc;
    if (!one.name) return oom(E);
  }
  *out = res[0];
  if (e->kind == NF_A_CALL && (nf__lang_builtin(e->name) == NF__BI_SHAPE ||
                               nf__lang_builtin(e->name) == NF__BI_MULTI || tx_max_all(e)))
    return bi_call(I, e, base, res, n_res);
  if (e->kind == NF_A_CALL && nf__module_find(E->m, e->name)) {
    nf_ast_stmt *s = talloc(E, sizeof *s);
    if (!s) return oom(E);
    memset(s, 0, sizeof *s);
    s->kind = NF_S_CALL;
    s->loc = top ? top->loc : e->loc;
    s->n_results = n_res;
    s->results = res;
    s->callee = e->name;
    s->callee_loc = e->loc;
    s->n_params = e->n_params;
    s->params = e->params;
    s->n_args = e->n_args;
    if (e->n_args && !(s->args = talloc(E, sizeof *s->args * (size_t)e->n_args)))
      return oom(E);
    for (int k = 0; k < e->n_args; k++) {
      const nf_ast_expr *a = e->args[k];
      if (a->kind == NF_A_INT || a->kind == NF_A_FLOAT || tx_is_size(I, a))
        return fail(E, a->loc, NF_ETYPE,
                    "argument %d of %s is a number; a def takes whole tensors", k + 1,
                    e->name);
      if ((rc = tx_tensor(I, a, base, NULL, &s->args[k]))) return rc;
    }
    return do_call(I, s);
  }
  if (n_res != 1)
    return fail(E, top->loc, NF_ETYPE, "an expression has one result, not %d", n_res);
  /* elementwise: the calls inside first, then one element statement */
  nf_ast_expr *h;
  if ((rc = tx_hoist(I, e, base, &h))) return rc;
  int rank = 0;
  int64_t shape[NF_MAX_RANK];
  if ((rc = tx_shape(I, h, &rank, shape))) return rc;
  nf_ast_expr *vars[NF_MAX_RANK], *rhs;
  if ((rc = tx_vars(I, e->loc, rank, "i", vars))) return rc;
  if ((rc = tx_elem(I, h, rank, shape, vars, &rhs))) return rc;
  return tx_emit(I, &res[0], top ? top->loc : e->loc, rank, shape, vars, rhs, NF_RED_NONE, 0,
                 NULL, NULL);
}

/* `results = tensor expression` (st->value). */
static int do_value(inst *I, const nf_ast_stmt *st) {
  const char *base;
  int rc = tref_key(I, &st->results[0], &base);
  if (rc) return rc;
  nf_ast_tref r;
  return tx_tensor(I, st->value, base, st, &r);
}

static int do_for(inst *I, const nf_ast_stmt *st) {
  elab *E = I->E;
  int64_t lo, hi;
  int rc;
  if ((rc = ceval(I, st->lo, &lo))) return rc;
  if ((rc = ceval(I, st->hi, &hi))) return rc;
  if (cfind(I, st->var))
    return fail(E, st->loc, NF_ETYPE,
                "loop variable '%s' hides a size or parameter of the same name",
                st->var);
  if (hi > lo && hi - lo > MAX_STMTS)
    return fail(E, st->loc, NF_ELIMIT, "for loop of %" PRId64 " iterations",
                hi - lo);
  for (int64_t v = lo; v < hi; v++) {
    int mark = I->n_c;
    if ((rc = cbind(I, st->var, v, "for loop"))) return rc;
    rc = run_body(I, st->n_body, st->body);
    I->n_c = mark;
    if (rc) return rc;
  }
  return NF_OK;
}

static int run_body(inst *I, int n, nf_ast_stmt *const *body) {
  for (int k = 0; k < n; k++) {
    const nf_ast_stmt *st = body[k];
    int rc;
    switch (st->kind) {
      case NF_S_ELEM: rc = do_elem(I, st); break;
      case NF_S_CALL: rc = do_call(I, st); break;
      case NF_S_FOR: rc = do_for(I, st); break;
      case NF_S_PARAM: {
        /* The input was created before the body (nf__elab_instantiate);
         * from here on it may be read. */
        tent *te = tfind(I, st->decl.name);
        rc = te ? NF_OK
                : fail(I->E, st->loc, NF_EINTERNAL,
                       "param '%s' declared outside the instantiated def",
                       st->decl.name);
        if (te) te->defined = 1;
        break;
      }
      default: rc = fail(I->E, st->loc, NF_EINTERNAL, "unknown statement");
    }
    if (rc) return rc;
  }
  return NF_OK;
}

/* Binds a def's parameters, inputs and wheres, checks requires and
 * computes the output shapes. */
static int run_def(elab *E, inst *I, const actual *acts, nf_loc use_loc,
                   int n_params, const char *const *pnames, const int64_t *pvals,
                   const nf_loc *plocs, int64_t (*oshape)[NF_MAX_RANK],
                   int *orank) {
  int rc;
  if ((rc = bind_params(I, n_params, pnames, pvals, plocs, use_loc))) return rc;
  if ((rc = bind_inputs(I, acts, use_loc))) return rc;
  const nf_ast_def *def = I->def;
  for (int k = 0; k < def->n_inputs; k++) {
    if (acts[k].have) continue;
    return fail(E, use_loc, NF_EINVAL, "no shape given for input '%s' of %s",
                def->inputs[k].name, def->name);
  }
  if ((rc = bind_wheres(I, use_loc))) return rc;
  for (int k = 0; k < def->n_outputs; k++)
    if ((rc = eval_dims(I, &def->outputs[k], &orank[k], oshape[k]))) return rc;
  return NF_OK;
}

int nf__elab_instantiate(nf_module *m, const nf_ast_def *def,
                         const nf_inst_opts *opts, nf_ir_ctx *ctx,
                         nf_graph **out, nf_diag *d) {
  static const nf_inst_opts none = {0};
  if (!opts) opts = &none;
  elab E = {.m = m, .ctx = ctx, .d = d};
  E.tmp = nf_arena_new();
  if (!E.tmp) {
    nf_diag_error(d, (nf_loc){0}, "out of memory");
    return NF_ENOMEM;
  }
  int rc = NF_OK;
  nf_loc use = def->loc;
  inst *I = talloc(&E, sizeof(inst));
  actual *acts = talloc(&E, sizeof(actual) * (size_t)(def->n_inputs + 1));
  int64_t(*ishape)[NF_MAX_RANK] =
      talloc(&E, sizeof(int64_t) * NF_MAX_RANK * (size_t)(def->n_inputs + 1));
  int64_t(*oshape)[NF_MAX_RANK] =
      talloc(&E, sizeof(int64_t) * NF_MAX_RANK * (size_t)(def->n_outputs + 1));
  int *orank = talloc(&E, sizeof(int) * (size_t)(def->n_outputs + 1));
  if (!I || !acts || !ishape || !oshape || !orank) {
    rc = oom(&E);
    goto done;
  }
  I->E = &E;
  I->def = def;
  I->prefix = "";
  /* Shapes by name or position. */
  for (int k = 0; k < opts->n_shapes; k++) {
    const nf_arg_shape *s = &opts->shapes[k];
    int slot = -1;
    if (s->name) {
      for (int j = 0; j < def->n_inputs; j++)
        if (strcmp(def->inputs[j].name, s->name) == 0) slot = j;
      int param = 0;
      for (int j = 0; slot < 0 && j < def->n_body; j++)
        param |= def->body[j]->kind == NF_S_PARAM && !strcmp(def->body[j]->decl.name, s->name);
      if (param) continue; /* a param's shape is its declaration's (checked below) */
      if (slot < 0) {
        rc = fail(&E, use, NF_ENOENT, "%s has no input named '%s'", def->name,
                  s->name);
        goto done;
      }
    } else {
      slot = k;
      if (slot >= def->n_inputs) {
        rc = fail(&E, use, NF_EINVAL, "%s has %d inputs, but %d shapes were given",
                  def->name, def->n_inputs, opts->n_shapes);
        goto done;
      }
    }
    if (s->rank < 0 || s->rank > NF_MAX_RANK) {
      rc = fail(&E, use, NF_ELIMIT, "shape of '%s' has rank %d (at most %d)",
                def->inputs[slot].name, s->rank, NF_MAX_RANK);
      goto done;
    }
    for (int j = 0; j < s->rank; j++)
      if (s->dims[j] < 0) {
        rc = fail(&E, use, NF_EINVAL, "shape of '%s' has a negative dimension",
                  def->inputs[slot].name);
        goto done;
      }
    if (acts[slot].have) {
      rc = fail(&E, use, NF_EINVAL, "two shapes given for input '%s'",
                def->inputs[slot].name);
      goto done;
    }
    memcpy(ishape[slot], s->dims, sizeof(int64_t) * (size_t)s->rank);
    acts[slot].rank = s->rank;
    acts[slot].shape = ishape[slot];
    acts[slot].have = 1;
    acts[slot].dtype = (nf_dtype)def->inputs[slot].dtype;
  }
  /* Inputs without a shape: all dims must be constant after binding the
   * parameters (evaluated in a throwaway pass below). */
  for (int k = 0; opts->fixed_only && k < def->n_params; k++) {
    int given = 0;
    for (int j = 0; j < opts->n_params; j++) given |= !strcmp(opts->param_names[j], def->params[k].name);
    if (!given && !def->params[k].dflt) {
      rc = NF_EUNSUPPORTED; /* (fixed_only: no message) */
      goto done;
    }
  }
  if ((rc = bind_params(I, opts->n_params, opts->param_names, opts->param_values,
                        NULL, use)))
    goto done;
  if ((rc = bind_inputs(I, acts, use))) goto done;
  for (int k = 0; k < def->n_inputs; k++) {
    if (acts[k].have) continue;
    int r;
    nf_diag *real = E.d;
    nf_diag *scratch = nf_diag_new();
    if (!scratch) {
      rc = oom(&E);
      goto done;
    }
    E.d = scratch;
    int save = E.status;
    int erc = eval_dims(I, &def->inputs[k], &r, ishape[k]);
    E.d = real;
    E.status = save;
    nf_diag_free(scratch);
    if (erc && opts->fixed_only) {
      rc = NF_EUNSUPPORTED;
      goto done;
    }
    if (erc) {
      rc = fail(&E, def->inputs[k].loc, NF_EINVAL,
                "no shape given for input '%s' of %s (declared %s); give one "
                "(e.g. --shape %s=d1,d2,...)",
                def->inputs[k].name, def->name, decl_str(&E, &def->inputs[k]),
                def->inputs[k].name);
      goto done;
    }
    acts[k].rank = r;
    acts[k].shape = ishape[k];
    acts[k].have = 1;
    acts[k].dtype = (nf_dtype)def->inputs[k].dtype;
  }
  if ((rc = bind_wheres(I, use))) goto done;
  for (int k = 0; k < def->n_outputs; k++)
    if ((rc = eval_dims(I, &def->outputs[k], &orank[k], oshape[k]))) goto done;

  E.g = nf_graph_new(ctx, def->name);
  if (!E.g) {
    rc = oom(&E);
    goto done;
  }
  for (int k = 0; k < def->n_inputs; k++) {
    int id = nf_graph_add_tensor(E.g, def->inputs[k].name,
                                 (nf_dtype)def->inputs[k].dtype, NF_T_INPUT,
                                 acts[k].rank, acts[k].shape);
    if (id < 0) {
      rc = id == NF_ENOMEM ? oom(&E) : fail(&E, def->inputs[k].loc, id, "bad input");
      goto done;
    }
    tent *te = tadd(I, def->inputs[k].name, (uint32_t)id);
    if (!te) {
      rc = oom(&E);
      goto done;
    }
    te->defined = 1;
  }
  /* Params: more inputs, in statement order, defined at their statement. */
  for (int k = 0; k < def->n_body; k++) {
    const nf_ast_stmt *st = def->body[k];
    if (st->kind != NF_S_PARAM) continue;
    int r;
    int64_t shape[NF_MAX_RANK];
    if ((rc = eval_dims(I, &st->decl, &r, shape))) goto done;
    /* a shape given for it (a tool feeding its values) must be this one */
    for (int j = 0; j < opts->n_shapes; j++) {
      const nf_arg_shape *g = &opts->shapes[j];
      if (!g->name || strcmp(g->name, st->decl.name)) continue;
      int same = g->rank == r;
      for (int d = 0; same && d < r; d++) same = g->dims[d] == shape[d];
      if (!same) {
        rc = fail(&E, st->decl.loc, NF_ETYPE, "param '%s' is declared %s but was given %s",
                  st->decl.name, shape_str(&E, r, shape),
                  shape_str(&E, g->rank, g->dims));
        goto done;
      }
    }
    int id = nf_graph_add_tensor(E.g, st->decl.name, (nf_dtype)st->decl.dtype,
                                 NF_T_INPUT, r, shape);
    if (id < 0) {
      rc = id == NF_ENOMEM ? oom(&E)
                           : fail(&E, st->decl.loc, id, "bad param '%s'",
                                  st->decl.name);
      goto done;
    }
    if (!tadd(I, st->decl.name, (uint32_t)id)) {
      rc = oom(&E);
      goto done;
    }
  }
  for (int k = 0; k < def->n_outputs; k++) {
    int id = nf_graph_add_tensor(E.g, def->outputs[k].name,
                                 (nf_dtype)def->outputs[k].dtype, NF_T_OUTPUT,
                                 orank[k], oshape[k]);
    if (id < 0) {
      rc = id == NF_ENOMEM ? oom(&E) : fail(&E, def->outputs[k].loc, id, "bad output");
      goto done;
    }
    tent *te = tadd(I, def->outputs[k].name, (uint32_t)id);
    if (!te) {
      rc = oom(&E);
      goto done;
    }
    te->declared_output = 1;
  }
  if ((rc = run_body(I, def->n_body, def->body))) goto done;
  for (int k = 0; k < def->n_outputs; k++) {
    tent *te = tfind(I, def->outputs[k].name);
    if (!te || !te->defined) {
      rc = fail(&E, def->outputs[k].loc, NF_ETYPE,
                "output '%s' of %s is never defined", def->outputs[k].name,
                def->name);
      goto done;
    }
  }
  {
    nf_buf err = NF_BUF_INIT;
    int vrc = nf_graph_validate(E.g, &err);
    if (vrc) {
      rc = fail(&E, use, NF_EINTERNAL,
                "internal error: the elaborated graph is invalid: %s",
                nf_buf_str(&err));
    }
    nf_buf_free(&err);
  }
done:
  if (rc && !E.status) E.status = rc;
  if (!rc && E.status) rc = E.status;
  nf_arena_free(E.tmp);
  if (rc) return rc;
  *out = E.g;
  return NF_OK;
}
