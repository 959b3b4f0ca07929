/* schedule.c - the schedule representation: text format, printing, and
 * the helpers the default policies (sched_cpu.c, sched_gpu.c,
 * sched_gemm.c) and the search's sketches build schedules with.
 *
 * The text format (docs/schedules.md): a header `neoflow-schedule 1`, an
 * optional `stmts N`, then one primitive per line, `stmt S PRIM ARGS`,
 * with `#` comments.  Parsing checks the syntax only; names are resolved
 * and legality checked when lowering (lower.c), which knows the graph.
 * Printing is canonical: parse(print(s)) equals s.
 *
 * The default schedules are sched_cpu.c and sched_gpu.c. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "nf_lower.h"

static const char *const kind_names[NF_SCH_N_KINDS] = {
    "split", "reorder", "fuse", "parallel", "vectorize", "unroll",
    "compute_inline", "compute_at", "cache_write", "cache_read", "rfactor", "bind_block",
    "bind_thread"};

nf_schedule *nf_schedule_new(void) {
  nf_schedule *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->version = NF_SCHEDULE_VERSION;
  s->n_stmts = -1;
  return s;
}

int nf_schedule_add(nf_schedule *s, const nf_sched_item *it) {
  if (s->n_items == s->cap_items) {
    int nc = s->cap_items ? 2 * s->cap_items : 8;
    nf_sched_item *ni = realloc(s->items, (size_t)nc * sizeof *ni);
    if (!ni) return NF_ENOMEM;
    s->items = ni;
    s->cap_items = nc;
  }
  s->items[s->n_items++] = *it;
  return NF_OK;
}

void nf_schedule_free(nf_schedule *s) {
  if (!s) return;
  free(s->items);
  free(s);
}

void nf__sched_var_name(const nf_stmt *s, int k, char out[NF_SCHED_NAME]) {
  const char *n = s->var_names[k];
  int ok = n && n[0] && strlen(n) < NF_SCHED_NAME - 16;
  for (int q = 0; ok && n[q]; q++)
    if (!(isalnum((unsigned char)n[q]) || n[q] == '_')) ok = 0;
  for (int j = 0; ok && j < NF_MAX_VARS; j++)
    if (j != k && s->var_names[j] && strcmp(s->var_names[j], n) == 0) ok = 0;
  if (ok && n[0] == 'v' && isdigit((unsigned char)n[1])) ok = 0;
  if (ok)
    snprintf(out, NF_SCHED_NAME, "%s", n);
  else
    snprintf(out, NF_SCHED_NAME, "v%d", k);
}

/* ---- parsing ---- */

typedef struct lexer {
  const char *p, *line_start;
  int line;
  const char *name;
  nf_buf *err;
} lexer;

static void skip_space(lexer *lx) {
  while (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\r') lx->p++;
  if (*lx->p == '#')
    while (*lx->p && *lx->p != '\n') lx->p++;
}

static int col_of(const lexer *lx, const char *at) { return (int)(at - lx->line_start) + 1; }

static int perr(lexer *lx, const char *at, const char *msg, const char *tok, int ntok) {
  nf_buf_printf(lx->err, "%s:%d:%d: %s", lx->name ? lx->name : "schedule", lx->line,
                col_of(lx, at), msg);
  if (tok) nf_buf_printf(lx->err, " '%.*s'", ntok, tok);
  nf_buf_putc(lx->err, '\n');
  return NF_ESYNTAX;
}

/* The next token of the line (no newline): sets *t and *n; 0 at the end. */
static int token(lexer *lx, const char **t, int *n) {
  skip_space(lx);
  const char *s = lx->p;
  while (*lx->p && *lx->p != '\n' && *lx->p != ' ' && *lx->p != '\t' && *lx->p != '\r' &&
         *lx->p != '#')
    lx->p++;
  *t = s;
  *n = (int)(lx->p - s);
  return *n > 0;
}

static int parse_int(const char *t, int n, int64_t *v) {
  int64_t x = 0;
  int i = 0, neg = 0;
  if (n > 0 && t[0] == '-') {
    neg = 1;
    i = 1;
  }
  if (i >= n) return 0;
  for (; i < n; i++) {
    if (!isdigit((unsigned char)t[i])) return 0;
    if (x > (INT64_MAX - (t[i] - '0')) / 10) return 0;
    x = x * 10 + (t[i] - '0');
  }
  *v = neg ? -x : x;
  return 1;
}

static int valid_name(const char *t, int n) {
  if (n <= 0 || n >= NF_SCHED_NAME) return 0;
  for (int i = 0; i < n; i++)
    if (!(isalnum((unsigned char)t[i]) || t[i] == '_' || t[i] == '.' || t[i] == '[' ||
          t[i] == ']'))
      return 0;
  return 1;
}

/* A statement reference: an index or a tensor name. */
static int parse_stmt_ref(lexer *lx, const char *t, int n, int32_t *idx, char *name) {
  int64_t v;
  if (parse_int(t, n, &v)) {
    if (v < 0 || v > INT32_MAX) return perr(lx, t, "bad statement index", t, n);
    *idx = (int32_t)v;
    name[0] = 0;
    return NF_OK;
  }
  if (!valid_name(t, n)) return perr(lx, t, "bad statement name", t, n);
  *idx = -1;
  memcpy(name, t, (size_t)n);
  name[n] = 0;
  return NF_OK;
}

static int parse_line(lexer *lx, nf_schedule *s) {
  const char *t;
  int n, rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.line = lx->line;
  it.col = col_of(lx, lx->p);
  if (!token(lx, &t, &n)) return NF_OK; /* blank */
  if (n == 5 && memcmp(t, "stmts", 5) == 0) {
    int64_t v;
    if (!token(lx, &t, &n)) return perr(lx, lx->p, "expected a statement count", NULL, 0);
    if (!parse_int(t, n, &v) || v < 0) return perr(lx, t, "bad statement count", t, n);
    s->n_stmts = v;
  } else if (n == 4 && memcmp(t, "stmt", 4) == 0) {
    if (!token(lx, &t, &n)) return perr(lx, lx->p, "expected a statement", NULL, 0);
    if ((rc = parse_stmt_ref(lx, t, n, &it.stmt, it.stmt_name)) < 0) return rc;
    if (!token(lx, &t, &n)) return perr(lx, lx->p, "expected a primitive", NULL, 0);
    int k;
    for (k = 0; k < NF_SCH_N_KINDS; k++)
      if ((int)strlen(kind_names[k]) == n && memcmp(kind_names[k], t, (size_t)n) == 0) break;
    if (k == NF_SCH_N_KINDS && n == 4 && memcmp(t, "pack", 4) == 0) k = NF_SCH_CACHE_READ;
    if (k == NF_SCH_N_KINDS) return perr(lx, t, "unknown primitive", t, n);
    it.kind = (uint8_t)k;
    /* arguments */
    const char *argt[NF_SCHED_MAX_NAMES + 2];
    int argn[NF_SCHED_MAX_NAMES + 2], na = 0;
    while (token(lx, &t, &n)) {
      if (na == NF_SCHED_MAX_NAMES + 2) return perr(lx, t, "too many arguments", NULL, 0);
      argt[na] = t;
      argn[na++] = n;
    }
    int want_min, want_max;
    switch (k) {
    case NF_SCH_SPLIT: want_min = want_max = 2; break;
    case NF_SCH_REORDER: want_min = 1; want_max = NF_SCHED_MAX_NAMES; break;
    case NF_SCH_FUSE: want_min = want_max = 2; break;
    case NF_SCH_INLINE: want_min = want_max = 0; break;
    case NF_SCH_COMPUTE_AT: case NF_SCH_CACHE_READ: want_min = want_max = 2; break;
    default: want_min = want_max = 1; break;
    }
    if (na < want_min || na > want_max) {
      nf_buf_printf(lx->err, "%s:%d:%d: %s takes %d%s argument%s, got %d\n",
                    lx->name ? lx->name : "schedule", lx->line, it.col, kind_names[k],
                    want_min, want_max > want_min ? " or more" : "",
                    want_max == 1 ? "" : "s", na);
      return NF_ESYNTAX;
    }
    int first = 0;
    if (k == NF_SCH_COMPUTE_AT) {
      if ((rc = parse_stmt_ref(lx, argt[0], argn[0], &it.stmt2, it.stmt2_name)) < 0) return rc;
      first = 1;
    }
    if (k == NF_SCH_SPLIT) {
      if (!parse_int(argt[1], argn[1], &it.factor))
        return perr(lx, argt[1], "split factor is not an integer", argt[1], argn[1]);
      na = 1;
    }
    for (int a = first; a < na; a++) {
      if (!valid_name(argt[a], argn[a])) return perr(lx, argt[a], "bad name", argt[a], argn[a]);
      int slot = it.n_names++;
      memcpy(it.names[slot], argt[a], (size_t)argn[a]);
      it.names[slot][argn[a]] = 0;
    }
    if (k == NF_SCH_CACHE_READ) { /* text: cache_read INPUT LOOP; stored: loop, input */
      char tmp[NF_SCHED_NAME];
      memcpy(tmp, it.names[0], NF_SCHED_NAME);
      memcpy(it.names[0], it.names[1], NF_SCHED_NAME);
      memcpy(it.names[1], tmp, NF_SCHED_NAME);
    }
    if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  } else {
    return perr(lx, t, "expected 'stmt' or 'stmts', got", t, n);
  }
  skip_space(lx);
  if (*lx->p && *lx->p != '\n') return perr(lx, lx->p, "unexpected text", lx->p, 1);
  return NF_OK;
}

int nf_schedule_parse(const char *text, const char *name, nf_schedule **out, nf_buf *err) {
  lexer lx = {.p = text, .line_start = text, .line = 1, .name = name, .err = err};
  const char *t;
  int n, rc = NF_OK;
  *out = NULL;
  nf_schedule *s = nf_schedule_new();
  if (!s) return NF_ENOMEM;
  /* header, after blank and comment lines */
  for (;;) {
    if (token(&lx, &t, &n)) break;
    if (*lx.p != '\n') {
      perr(&lx, lx.p, "expected the header 'neoflow-schedule 1'", NULL, 0);
      nf_schedule_free(s);
      return NF_ESYNTAX;
    }
    lx.p++;
    lx.line++;
    lx.line_start = lx.p;
  }
  int64_t ver;
  if (n != 16 || memcmp(t, "neoflow-schedule", 16) != 0) {
    rc = perr(&lx, t, "expected the header 'neoflow-schedule 1', got", t, n);
  } else if (!token(&lx, &t, &n) || !parse_int(t, n, &ver)) {
    rc = perr(&lx, t, "expected a version number", NULL, 0);
  } else if (ver != NF_SCHEDULE_VERSION) {
    rc = perr(&lx, t, "unsupported schedule version", t, n);
  } else {
    skip_space(&lx);
    if (*lx.p && *lx.p != '\n') rc = perr(&lx, lx.p, "unexpected text", lx.p, 1);
  }
  while (rc == NF_OK && *lx.p) {
    if (*lx.p == '\n') {
      lx.p++;
      lx.line++;
      lx.line_start = lx.p;
      rc = parse_line(&lx, s);
    } else {
      rc = perr(&lx, lx.p, "unexpected text", lx.p, 1);
    }
  }
  if (rc < 0) {
    nf_schedule_free(s);
    return rc;
  }
  *out = s;
  return NF_OK;
}

/* ---- printing ---- */

static void print_stmt_ref(nf_buf *out, int32_t idx, const char *name) {
  if (idx >= 0)
    nf_buf_printf(out, "%d", idx);
  else
    nf_buf_puts(out, name);
}

void nf_schedule_print(const nf_schedule *s, nf_buf *out) {
  nf_buf_printf(out, "neoflow-schedule %d\n", NF_SCHEDULE_VERSION);
  if (s->n_stmts >= 0) nf_buf_printf(out, "stmts %lld\n", (long long)s->n_stmts);
  for (int i = 0; i < s->n_items; i++) {
    const nf_sched_item *it = &s->items[i];
    nf_buf_puts(out, "stmt ");
    print_stmt_ref(out, it->stmt, it->stmt_name);
    nf_buf_printf(out, " %s", it->kind < NF_SCH_N_KINDS ? kind_names[it->kind] : "?");
    switch (it->kind) {
    case NF_SCH_SPLIT:
      nf_buf_printf(out, " %s %lld", it->names[0], (long long)it->factor);
      break;
    case NF_SCH_COMPUTE_AT:
      nf_buf_putc(out, ' ');
      print_stmt_ref(out, it->stmt2, it->stmt2_name);
      nf_buf_printf(out, " %s", it->names[0]);
      break;
    case NF_SCH_CACHE_READ:
      nf_buf_printf(out, " %s %s", it->names[1], it->names[0]);
      break;
    default:
      for (int k = 0; k < it->n_names; k++) nf_buf_printf(out, " %s", it->names[k]);
      break;
    }
    nf_buf_putc(out, '\n');
  }
}

/* ---- the default schedule ---- */

int nf__sched_add1(nf_schedule *s, int st, int kind, const char *a, int64_t f) {
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = (uint8_t)kind;
  it.stmt = st;
  if (a) {
    nf__sched_cat(it.names[0], a, "");
    it.n_names = 1;
  }
  it.factor = f;
  return nf_schedule_add(s, &it);
}

/* An item of two names: fuse a b; cache_read (stored: loop a, tensor b). */
int nf__sched_add2(nf_schedule *s, int st, int kind, const char *a, const char *b) {
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = (uint8_t)kind;
  it.stmt = st;
  it.n_names = 2;
  nf__sched_cat(it.names[0], a, "");
  nf__sched_cat(it.names[1], b, "");
  return nf_schedule_add(s, &it);
}

/* dst = a suffix, truncated to a name (names from nf__sched_var_name are
 * short enough that nothing is cut in practice). */
void nf__sched_cat(char *dst, const char *a, const char *suffix) {
  size_t na = strlen(a), ns = strlen(suffix);
  if (na > NF_SCHED_NAME - 1) na = NF_SCHED_NAME - 1;
  if (na + ns > NF_SCHED_NAME - 1) ns = NF_SCHED_NAME - 1 - na;
  memmove(dst, a, na);
  memcpy(dst + na, suffix, ns);
  dst[na + ns] = 0;
}

/* Whether tensor t is read exactly once in the whole graph (one access
 * node in one statement). */
typedef struct use_count {
  uint32_t t;
  int n;
} use_count;

static void count_fn(const nf_expr *e, void *user) {
  use_count *u = user;
  if (e->op == NF_OP_ACCESS && e->u.tensor == u->t) u->n++;
}

int nf__sched_used_once(const nf_graph *g, uint32_t t) {
  use_count u = {.t = t, .n = 0};
  for (uint32_t i = 0; i < g->n_stmts; i++)
    if (nf_expr_visit(g->stmts[i].rhs, count_fn, &u) < 0) return 0;
  return u.n == 1;
}

int nf__sched_inlined_by_default(const nf_graph *g, uint32_t si) {
  const nf_stmt *st = &g->stmts[si];
  return st->red == NF_RED_NONE && st->n_red == 0 && g->tensors[st->out].kind == NF_T_LOCAL &&
         nf__sched_used_once(g, st->out);
}

int nf__sched_uses_var(const nf_expr *e, uint32_t v) {
  if (e->op == NF_OP_VAR) return e->u.var == v;
  for (int i = 0; i < e->n_args; i++)
    if (nf__sched_uses_var(e->args[i], v)) return 1;
  return 0;
}

/* The outermost dimension that variable v indexes in any access. */
typedef struct dim_use {
  uint32_t v;
  int dim;
} dim_use;

static void dim_fn(const nf_expr *e, void *user) {
  dim_use *u = user;
  if (e->op != NF_OP_ACCESS) return;
  for (int d = 0; d < e->n_args && d < u->dim; d++)
    if (nf__sched_uses_var(e->args[d], u->v)) u->dim = d;
}

/* The reduction variables of st (numbered from 0) but skip, in the
 * order of the outermost dimension each indexes (ties: IR order): ord[],
 * their count or NF_ENOMEM. */
int nf__sched_red_order(const nf_stmt *st, int rank, int skip, int *ord) {
  int key[NF_MAX_VARS], no = 0;
  for (int q = 0; q < st->n_red; q++) {
    dim_use u = {.v = (uint32_t)(rank + q), .dim = NF_MAX_RANK};
    if (nf_expr_visit(st->rhs, dim_fn, &u) < 0) return NF_ENOMEM;
    key[q] = u.dim;
    if (q == skip) continue;
    int at = no++;
    while (at > 0 && key[ord[at - 1]] > key[q]) {
      ord[at] = ord[at - 1];
      at--;
    }
    ord[at] = q;
  }
  return no;
}
