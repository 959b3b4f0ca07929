/* schedule.c - the schedule representation: text format, printing and the
 * tier-1 default schedule.
 *
 * The text format (docs/schedules.md): a header `neoflow-schedule 1`, an
 * optional `stmts N`, then one primitive per line, `stmt S PRIM ARGS`,
 * with `#` comments.  Parsing checks the syntax only; names are resolved
 * and legality checked when lowering (lower.c), which knows the graph.
 * Printing is canonical: parse(print(s)) equals s.
 *
 * The default schedule is computed from shapes alone (no lowering), so it
 * costs microseconds; its primitives are legal by construction. */
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

/* The access of tensor t in e when e reads t exactly once, else NULL. */
typedef struct find_acc {
  uint32_t t;
  int n;
  const nf_expr *a;
} find_acc;

static void find_fn(const nf_expr *e, void *user) {
  find_acc *f = user;
  if (e->op == NF_OP_ACCESS && e->u.tensor == f->t) {
    f->n++;
    f->a = e;
  }
}

int nf__sched_inlined_by_default(const nf_graph *g, uint32_t si) {
  const nf_stmt *st = &g->stmts[si];
  return st->red == NF_RED_NONE && st->n_red == 0 && g->tensors[st->out].kind == NF_T_LOCAL &&
         nf__sched_used_once(g, st->out);
}

static int tiled_by_default(const nf_graph *g, uint32_t si) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank;
  return st->red != NF_RED_NONE && st->n_red > 0 && rank >= 2 && t->shape[rank - 2] >= 4 &&
         t->shape[rank - 1] >= 8;
}

/* Accesses whose last index uses variable v (rf_score). */
typedef struct last_use {
  uint32_t r, j;
  int check_j;
  int score;
} last_use;

static int uses_v(const nf_expr *e, uint32_t v) {
  if (e->op == NF_OP_VAR) return e->u.var == v;
  for (int i = 0; i < e->n_args; i++)
    if (uses_v(e->args[i], v)) return 1;
  return 0;
}

static void last_fn(const nf_expr *e, void *user) {
  last_use *u = user;
  if (e->op != NF_OP_ACCESS || e->n_args == 0) return;
  const nf_expr *x = e->args[e->n_args - 1];
  if (uses_v(x, u->r))
    u->score++;
  else if (u->check_j && uses_v(x, u->j))
    u->score--;
}

/* The reduction variable (index rank + k) whose partial results a
 * default schedule keeps in vector lanes (rfactor), or -1.  For a
 * reduction that is not register-tiled, over a variable of at least 8
 * iterations that the innermost index of its operands runs along (a
 * row sum, a depthwise convolution's weight gradient: 1152 outputs of
 * 12544 terms each) where the output's own last variable gives no
 * better vector (rank 0, under 8 wide, or no operand runs along it).
 * Folding those terms one by one is a chain of dependent additions. */
static int rf_var_default(const nf_graph *g, uint32_t si) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank;
  if (st->red == NF_RED_NONE || st->n_red == 0 || rank >= NF_MAX_RANK ||
      tiled_by_default(g, si))
    return -1;
  int best = -1, best_score = 0;
  for (int k = 0; k < st->n_red; k++) {
    if (st->red_ext[k] < 8) continue;
    last_use u = {.r = (uint32_t)(rank + k), .j = (uint32_t)(rank - 1),
                  .check_j = rank > 0 && t->shape[rank - 1] >= 8, .score = 0};
    if (nf_expr_visit(st->rhs, last_fn, &u) < 0) return -1;
    if (u.score > best_score) {
      best = k;
      best_score = u.score;
    }
  }
  return best;
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
    if (uses_v(e->args[d], u->v)) u->dim = d;
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

/* The rfactor schedule of statement si over reduction variable rank + k:
 *   outer... red... r.o tile... r.i
 * r split by the vector width (8 where it divides, else 4 where that
 * divides, else 8 with a guard), the output's trailing variables of at
 * most 16 elements in all the tile (held in registers: tile x width),
 * the leading ones outside, the first of them parallel; the tile (with
 * a slot per lane) is the cache_write at the last outer loop, or, when
 * every output variable is in the tile, at the first reduction loop. */
/* Occurrences of two variables in an expression: all of them, and those
 * that are the last two indices of an access (x at the next-to-last, y
 * at the last, whose extent is ey) with neither elsewhere in it. */
typedef struct pair_use {
  uint32_t x, y;
  int64_t ey;
  const nf_graph *g;
  int all, paired, bad;
} pair_use;

static void pair_fn(const nf_expr *e, void *user) {
  pair_use *u = user;
  if (e->op == NF_OP_VAR && (e->u.var == u->x || e->u.var == u->y)) u->all++;
  if (e->op != NF_OP_ACCESS) return;
  int n = e->n_args, hits = 0;
  for (int d = 0; d < n; d++)
    if (uses_v(e->args[d], u->x) || uses_v(e->args[d], u->y)) hits++;
  if (hits == 0) return;
  const nf_expr *a = n >= 2 ? e->args[n - 2] : NULL, *b = n >= 1 ? e->args[n - 1] : NULL;
  if (hits == 2 && a->op == NF_OP_VAR && a->u.var == u->x && b->op == NF_OP_VAR &&
      b->u.var == u->y && u->g->tensors[e->u.tensor].shape[n - 1] == u->ey)
    u->paired += 2;
  else
    u->bad = 1;
}

/* The reduction variable (numbered from 0) to fuse with reduction k, the
 * next one out, where k's extent is no multiple of 8 but theirs together
 * is, and every access reads them as its last two indices, whole (an
 * image's rows and columns, 28 x 28 = 49 vectors of 16): the fused loop
 * then runs over contiguous memory (the backend folds x // 28 and x % 28
 * back into x), full vectors instead of 4 lanes; else -1.  A full
 * reduction of 16x128x28x28 at one thread: 0.39 -> 0.21 ms. */
static int rf_fuse_prev(const nf_graph *g, const nf_stmt *st, int rank, int k) {
  if (k == 0) return -1;
  int64_t e = st->red_ext[k], eq = st->red_ext[k - 1];
  if (e % 8 == 0 || (e * eq) % 8 != 0 || st->red_lo[k] || st->red_lo[k - 1]) return -1;
  pair_use u = {.x = (uint32_t)(rank + k - 1), .y = (uint32_t)(rank + k), .ey = e, .g = g};
  if (nf_expr_visit(st->rhs, pair_fn, &u) < 0 || u.bad || u.paired == 0 || u.paired != u.all)
    return -1;
  return k - 1;
}

static int rf_nest(nf_schedule *s, const nf_graph *g, int st_i, int k,
                   char nm[][NF_SCHED_NAME]) {
  const nf_stmt *st = &g->stmts[st_i];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank, r = rank + k, rc;
  int64_t e = st->red_ext[k], w = e % 8 == 0 ? 8 : e % 4 == 0 ? 4 : 8;
  int fq = rf_fuse_prev(g, st, rank, k);
  char rname[NF_SCHED_NAME];
  nf__sched_cat(rname, nm[r], "");
  if (fq >= 0) {
    char tmp[NF_SCHED_NAME];
    if ((rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, nm[rank + fq], nm[r])) < 0) return rc;
    nf__sched_cat(tmp, nm[rank + fq], ".");
    nf__sched_cat(tmp, tmp, nm[r]);
    nf__sched_cat(rname, tmp, ".fused");
    e *= st->red_ext[fq];
    w = nf__sched_acc_regs(s) >= 16 && e % 16 == 0 ? 16 : 8;
  }
  int first_tile = rank;
  int64_t tile = 1;
  while (first_tile > 0 && tile * t->shape[first_tile - 1] <= 16) tile *= t->shape[--first_tile];
  /* the tile needs a loop outside it that is not r's: the first output
   * loop, else (a scalar result of one reduction variable) blocks of
   * 256 vectors of r */
  if (first_tile == 0 && rank > 0 && st->n_red == 1) first_tile = 1;
  int blocks = rank == 0 && st->n_red == 1;
  char ro[NF_SCHED_NAME], ri[NF_SCHED_NAME], roo[NF_SCHED_NAME];
  nf__sched_cat(ro, rname, ".o");
  nf__sched_cat(ri, rname, ".i");
  nf__sched_cat(roo, ro, ".o");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, rname, w)) < 0) return rc;
  if (blocks) {
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, ro, 256)) < 0) return rc;
    nf__sched_cat(ro, ro, ".i");
  }
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  for (int v = 0; v < first_tile; v++) nf__sched_cat(it.names[it.n_names++], nm[v], "");
  /* the other reduction loops in the order of the dimensions they
   * index (an image's batch before its rows): the data is walked in
   * memory order */
  int ord[NF_MAX_VARS], no = nf__sched_red_order(st, rank, k, ord);
  if (no < 0) return no;
  for (int q = 0; q < no; q++)
    if (ord[q] != fq) nf__sched_cat(it.names[it.n_names++], nm[rank + ord[q]], "");
  if (blocks) nf__sched_cat(it.names[it.n_names++], roo, "");
  nf__sched_cat(it.names[it.n_names++], ro, "");
  for (int v = first_tile; v < rank; v++) nf__sched_cat(it.names[it.n_names++], nm[v], "");
  nf__sched_cat(it.names[it.n_names++], ri, "");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  /* the tile's loop: the last outer output loop, else the first
   * reduction loop (each of its iterations continues the output's
   * partial result) */
  char cw[NF_SCHED_NAME];
  nf__sched_cat(cw, first_tile > 0 ? nm[first_tile - 1] : it.names[0], "");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, cw, 0)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_RFACTOR, ri, 0)) < 0) return rc;
  if (first_tile > 0 && (rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, nm[0], 0)) < 0) return rc;
  return nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, ri, 0);
}

/* The statement whose loops take register-tiled reduction si as its fused
 * epilogue, or -1: a local si read once, by an elementwise statement of
 * the same shape that is not inlined and reads si at its own indices. */
static int epilogue_of(const nf_graph *g, uint32_t si) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  if (!tiled_by_default(g, si) || t->kind != NF_T_LOCAL || !nf__sched_used_once(g, st->out)) return -1;
  for (uint32_t c = si + 1; c < g->n_stmts; c++) {
    const nf_stmt *cs = &g->stmts[c];
    find_acc f = {.t = st->out, .n = 0, .a = NULL};
    if (nf_expr_visit(cs->rhs, find_fn, &f) < 0 || f.n == 0) continue;
    const nf_tensor *ct = &g->tensors[cs->out];
    if (cs->red != NF_RED_NONE || cs->n_red || nf__sched_inlined_by_default(g, c) || ct->rank != t->rank)
      return -1;
    for (int d = 0; d < t->rank; d++)
      if (ct->shape[d] != t->shape[d] || f.a->args[d]->op != NF_OP_VAR ||
          f.a->args[d]->u.var != (uint32_t)d)
        return -1;
    return (int)c;
  }
  return -1;
}

/* Accumulator registers the stencil and weight-gradient tiles may fill:
 * 16 where the target has 32 vector registers (AVX-512), else 8 (of
 * AVX2's 16); 8 for a parsed schedule. */
int nf__sched_acc_regs(const nf_schedule *s) { return s && s->acc_regs >= 16 ? 16 : 8; }

nf_sched_target nf_sched_target_of(const char *features) {
  nf_sched_target t = {16};
  if (!features) return t;
  /* a whole word: "avx512f" in a description, "+avx512f" in LLVM's list
   * ("-avx512f" there says the feature is off) */
  for (const char *p = strstr(features, "avx512f"); p; p = strstr(p + 1, "avx512f")) {
    char before = p == features ? ' ' : p[-1], after = p[7];
    int word_end = after == '\0' || after == ',' || after == ' ';
    if (word_end && (before == ' ' || before == '+' || before == ',')) {
      t.vector_regs = 32;
      break;
    }
  }
  return t;
}

nf_sched_target nf_sched_target_host(void) {
  nf_sched_target t = {16};
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) t.vector_regs = 32;
#endif
  return t;
}

/* The register tile of an output of extents ei x ej: 8 x 16 where the
 * extents allow it (on this Zen 4 machine matmul 1024^3 ran at 39
 * GFLOP/s with 8 x 16 against 22 with 4 x 16 and 11 with 4 x 8), without
 * guards inside the tile when a smaller dividing size exists. */
static void reg_tile(int64_t ei, int64_t ej, int64_t *ti, int64_t *tj) {
  *ti = (ei % 8 == 0 || ei >= 64) ? 8 : 4;
  *tj = (ej % 16 == 0 || ej >= 64) ? 16 : 8;
  /* a short row that 8 does not divide (a 28-wide image) is one vector
   * of its whole width over 2 rows: no guarded lanes (the depthwise
   * convolution's forward, 16x128x28x28: 4.1 ms against 7.3 with 4 x 8
   * and a guard) */
  if (ej % 8 != 0 && ej % 4 == 0 && ej > 8 && ej <= 32) {
    *ti = 2;
    *tj = ej;
  }
}

/* Splits the last two loops of a rank-`rank` nest named nm by ti x tj and
 * orders them: batch... i.o j.o mid... i.i j.i; parallel on the outermost
 * loop, vectorize j.i. */
static int tile_nest(nf_schedule *s, int st_i, char nm[][NF_SCHED_NAME], int rank,
                     char mid[][NF_SCHED_NAME], int n_mid, int64_t ti, int64_t tj) {
  const char *i = nm[rank - 2], *j = nm[rank - 1];
  char a[NF_SCHED_NAME], b[NF_SCHED_NAME];
  nf_sched_item it;
  int rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, i, ti);
  if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, j, tj);
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  for (int k = 0; k < rank - 2; k++) nf__sched_cat(it.names[it.n_names++], nm[k], "");
  nf__sched_cat(it.names[it.n_names++], i, ".o");
  nf__sched_cat(it.names[it.n_names++], j, ".o");
  for (int k = 0; k < n_mid; k++) nf__sched_cat(it.names[it.n_names++], mid[k], "");
  nf__sched_cat(it.names[it.n_names++], i, ".i");
  nf__sched_cat(it.names[it.n_names++], j, ".i");
  if (rc == NF_OK) rc = nf_schedule_add(s, &it);
  nf__sched_cat(b, rank > 2 ? nm[0] : i, rank > 2 ? "" : ".o");
  if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, b, 0);
  nf__sched_cat(a, j, ".i");
  if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, a, 0);
  return rc;
}

/* The product of a term `[c ?] x * y [: 0.0]` (a padded convolution's,
 * *guarded set when the select is there), or NULL. */
static const nf_expr *padded_product(const nf_expr *e, int *guarded) {
  *guarded = 0;
  if (e->op == NF_OP_SELECT && e->args[2]->op == NF_OP_CONST &&
      nf_dtype_is_float((nf_dtype)e->args[2]->dtype) && e->args[2]->u.f == 0.0) {
    *guarded = 1;
    e = e->args[1];
  }
  return e->op == NF_OP_MUL ? e : NULL;
}

/* A convolution-shaped register-tiled reduction: out(..., kv, ..., i, j)
 * += [c ?] A(...) * B(...) : 0, where A (the image) reads along j and
 * some reduction variable (a stencil, w + s) and does not use the output
 * variable kv (an output channel), which B (the weights) uses, and B does
 * not use i or j.  Fills the stencil tile's choice: kv, the image's
 * access and whether its read is guarded (padding). */
typedef struct stencil {
  int kv;
  const nf_expr *img, *wt;
  int guarded;
} stencil;

static int uses_red(const nf_expr *e, int rank, int n_red) {
  for (int k = 0; k < n_red; k++)
    if (uses_v(e, (uint32_t)(rank + k))) return 1;
  return 0;
}

static int stencil_of(const nf_graph *g, uint32_t si, stencil *sc) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank;
  if (st->red != NF_RED_SUM || !tiled_by_default(g, si) || rank < 3) return 0;
  const nf_expr *e = padded_product(st->rhs, &sc->guarded);
  if (!e) return 0;
  for (int side = 0; side < 2; side++) {
    const nf_expr *a = e->args[side], *b = e->args[1 - side];
    if (a->op != NF_OP_ACCESS || b->op != NF_OP_ACCESS || a->n_args == 0) continue;
    const nf_expr *last = a->args[a->n_args - 1];
    if (!uses_v(last, (uint32_t)(rank - 1)) || !uses_red(last, rank, st->n_red)) continue;
    if (uses_v(b, (uint32_t)(rank - 1)) || uses_v(b, (uint32_t)(rank - 2))) continue;
    for (int kv = 0; kv < rank - 2; kv++)
      if (t->shape[kv] % 4 == 0 && !uses_v(a, (uint32_t)kv) && uses_v(b, (uint32_t)kv)) {
        sc->kv = kv;
        sc->img = a;
        sc->wt = b;
        return g->tensors[a->u.tensor].name != NULL;
      }
  }
  return 0;
}

/* The stencil tile of statement si (on this Zen 4 machine a 3x3
 * convolution 8x64x56x56 -> 64 channels at one thread: 22.9 ms against
 * 35.5 through im2col and OpenBLAS and 120 with the plain 8 x 8 tile):
 *   outer... i.o kv.o j.o red... kv.i i.i j.i
 * kv.i 4 (output channels: one broadcast weight each), i.i 2 rows, j.i
 * 8 lanes (the whole row where it is short and 8 does not divide it:
 * then 1 row, and 2 channels when the row is over 2 vectors),
 * the tile accumulated in registers (cache_write j.o), the reduction
 * loops in the order of the dimensions they index; a guarded image
 * read (padding) is copied zero-padded at i.o (cache_read: the rows
 * that tile reads, every channel), so that the loads need no mask; the
 * first outer loop is fused with i.o when it has under 16 iterations,
 * and is parallel. */
static int stencil_nest(nf_schedule *s, const nf_graph *g, int st_i, const stencil *sc,
                        char nm[][NF_SCHED_NAME]) {
  const nf_stmt *st = &g->stmts[st_i];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank, rc;
  int64_t ei = t->shape[rank - 2], ej = t->shape[rank - 1];
  /* at most nf__sched_acc_regs(s) vector registers hold the tile: k.i x i.i x
   * vectors per row (a 28-wide row is 4 vectors: 2 x 1 x 28; 4 x 2 x 28
   * spilled, 16x32x28x28 to 64 channels 106 ms against 10.9) */
  int64_t tj = ej % 8 == 0 ? 8 : (ej % 4 == 0 && ej <= 32) ? ej : 8;
  int64_t nvec = (tj + 7) / 8, tk = nvec <= 2 ? 4 : 2, ti = 1;
  /* more rows while the accumulators fit (AVX-512: 4 x 4 x 8 ran the
   * 8x64x56x56 forward in 24 ms against 28 with 4 x 2 x 8 on a Xeon) */
  while (ti < 4 && ei % (2 * ti) == 0 && tk * 2 * ti * nvec <= nf__sched_acc_regs(s)) ti *= 2;
  const char *kv = nm[sc->kv], *i = nm[rank - 2], *j = nm[rank - 1];
  char io[NF_SCHED_NAME], jo[NF_SCHED_NAME], par[NF_SCHED_NAME], tmp[NF_SCHED_NAME];
  nf__sched_cat(io, i, ".o");
  nf__sched_cat(jo, j, ".o");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, kv, tk)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, i, ti)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, j, tj)) < 0) return rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  int n_outer = 0, first_outer = -1;
  for (int v = 0; v < rank - 2; v++)
    if (v != sc->kv) {
      nf__sched_cat(it.names[it.n_names++], nm[v], "");
      if (n_outer++ == 0) first_outer = v;
    }
  nf__sched_cat(it.names[it.n_names++], io, "");
  nf__sched_cat(it.names[it.n_names++], kv, ".o");
  nf__sched_cat(it.names[it.n_names++], jo, "");
  /* reduction loops in the order of the dimensions they index (c r s:
   * one channel plane at a time; r s c took twice as long) */
  int ord[NF_MAX_VARS], no = nf__sched_red_order(st, rank, -1, ord);
  if (no < 0) return no;
  for (int q = 0; q < no; q++) nf__sched_cat(it.names[it.n_names++], nm[rank + ord[q]], "");
  nf__sched_cat(it.names[it.n_names++], kv, ".i");
  nf__sched_cat(it.names[it.n_names++], i, ".i");
  nf__sched_cat(it.names[it.n_names++], j, ".i");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  nf__sched_cat(par, n_outer > 0 ? it.names[0] : io, "");
  if (n_outer == 1 && t->shape[first_outer] < 16) {
    if ((rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, par, io)) < 0) return rc;
    nf__sched_cat(tmp, par, ".");
    nf__sched_cat(tmp, tmp, io);
    nf__sched_cat(par, tmp, ".fused");
    nf__sched_cat(io, par, "");
  }
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, jo, 0)) < 0) return rc;
  if (sc->guarded && (rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, io, g->tensors[sc->img->u.tensor].name)) < 0)
    return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, par, 0)) < 0) return rc;
  nf__sched_cat(tmp, j, ".i");
  return nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, tmp, 0);
}

/* The largest divisor of e in [lo, hi], or 0. */
static int64_t divisor_in(int64_t e, int64_t lo, int64_t hi) {
  for (int64_t d = hi < e ? hi : e; d >= lo; d--)
    if (e % d == 0) return d;
  return 0;
}

/* Output channels in the lanes where 512-bit vectors and 32 registers
 * are there (AVX-512) and the channel count divides by 16 (the 3x3
 * convolution 8x64x56x56 -> 64 at one thread on a Sapphire Rapids Xeon:
 * 14.3 ms against 18.7-22 with the image row in the lanes, whose loads
 * straddle the row's pad and need 3 shifted copies per weight):
 *   kv.o outer... i j.o red... j.i kv.i
 * kv.i 32 channels (2 vectors; 16 where 32 does not divide) x j.i tw
 * output columns (tw * kv.i / 16 <= 28 accumulators), each FMA a
 * broadcast image element times a vector of weights; the weights of
 * the kv.o block copied at the parallel loop (kv.o fused with the first
 * outer loop) with the channel dimension last (cache_read's layout
 * rule), a guarded image's rows copied zero-padded at i.  0 where the
 * shape does not suit it (the row-lane stencil then). */
static int chan_stencil_nest(nf_schedule *s, const nf_graph *g, int st_i, const stencil *sc,
                             char nm[][NF_SCHED_NAME]) {
  const nf_stmt *st = &g->stmts[st_i];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank, rc;
  int64_t ek = t->shape[sc->kv], ej = t->shape[rank - 1];
  if (nf__sched_acc_regs(s) < 16 || ek % 16 != 0 || !g->tensors[sc->wt->u.tensor].name) return 0;
  int64_t kvi = ek % 32 == 0 ? 32 : 16, tw = divisor_in(ej, 4, 28 * 16 / kvi);
  if (!tw && kvi == 32) tw = divisor_in(ej, 4, 28), kvi = 16;
  if (!tw) return 0;
  /* the weights' block (kv.i x the reduction's extent) stays in L2 */
  int64_t wb = kvi;
  for (int q = 0; q < st->n_red; q++) wb *= st->red_ext[q];
  if (wb * 4 > (1 << 20)) return 0;
  const char *kv = nm[sc->kv], *i = nm[rank - 2], *j = nm[rank - 1];
  char par[NF_SCHED_NAME], jo[NF_SCHED_NAME], tmp[NF_SCHED_NAME];
  nf__sched_cat(jo, j, ".o");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, kv, kvi)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, j, tw)) < 0) return rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  nf__sched_cat(it.names[it.n_names++], kv, ".o");
  int first_outer = -1;
  for (int v = 0; v < rank - 2; v++)
    if (v != sc->kv) {
      nf__sched_cat(it.names[it.n_names++], nm[v], "");
      if (first_outer < 0) first_outer = v;
    }
  nf__sched_cat(it.names[it.n_names++], i, "");
  nf__sched_cat(it.names[it.n_names++], jo, "");
  int ord[NF_MAX_VARS], no = nf__sched_red_order(st, rank, -1, ord);
  if (no < 0) return no;
  for (int q = 0; q < no; q++) nf__sched_cat(it.names[it.n_names++], nm[rank + ord[q]], "");
  nf__sched_cat(it.names[it.n_names++], j, ".i");
  nf__sched_cat(it.names[it.n_names++], kv, ".i");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  nf__sched_cat(par, kv, ".o");
  if (first_outer >= 0) {
    if ((rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, par, nm[first_outer])) < 0) return rc;
    nf__sched_cat(tmp, par, ".");
    nf__sched_cat(tmp, tmp, nm[first_outer]);
    nf__sched_cat(par, tmp, ".fused");
  }
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, jo, 0)) < 0) return rc;
  if ((rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, par, g->tensors[sc->wt->u.tensor].name)) < 0)
    return rc;
  if (sc->guarded && (rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, i, g->tensors[sc->img->u.tensor].name)) < 0)
    return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, par, 0)) < 0) return rc;
  nf__sched_cat(tmp, kv, ".i");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, tmp, 0)) < 0) return rc;
  return 1;
}

/* A convolution's weight gradient: dW(.., k, c, .., r, s) += [c ?]
 * D(.., k, .., h, w) * A(.., c, .., h + r, w + s) [: 0], where w is the
 * variable rf_var_default keeps in vector lanes (both operands' last
 * index), the image A's last index adds an output variable (s) to it,
 * the gradient D uses an output variable kv (k) that A does not and A one
 * (cv: c) that D does not, and A's next-to-last index adds another
 * reduction variable rh (h) to an output variable. */
typedef struct wgrad {
  int kv, cv, rh, rw;
  int64_t hb;
  const nf_expr *img, *grad;
  int guarded;
} wgrad;

static int wgrad_of(const nf_graph *g, uint32_t si, wgrad *wg) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank;
  if (st->red != NF_RED_SUM || st->n_red < 2 || rank < 3 || tiled_by_default(g, si)) return 0;
  int rw = rf_var_default(g, si);
  if (rw < 0) return 0;
  const nf_expr *e = padded_product(st->rhs, &wg->guarded);
  if (!e) return 0;
  uint32_t w = (uint32_t)(rank + rw);
  for (int side = 0; side < 2; side++) {
    const nf_expr *a = e->args[side], *d = e->args[1 - side];
    if (a->op != NF_OP_ACCESS || d->op != NF_OP_ACCESS || a->n_args < 2 || d->n_args < 2 ||
        !g->tensors[a->u.tensor].name)
      continue;
    const nf_expr *al = a->args[a->n_args - 1], *an = a->args[a->n_args - 2];
    int out_in_last = 0;
    for (int v = 0; v < rank; v++) out_in_last |= uses_v(al, (uint32_t)v);
    if (!uses_v(al, w) || !out_in_last || !uses_v(d->args[d->n_args - 1], w)) continue;
    int kv = -1, cv = -1, rh = -1;
    for (int v = 0; v < rank; v++) {
      int ua = uses_v(a, (uint32_t)v), ud = uses_v(d, (uint32_t)v);
      if (kv < 0 && !ua && ud && t->shape[v] % 4 == 0) kv = v;
      if (cv < 0 && ua && !ud && t->shape[v] % 2 == 0 && !uses_v(al, (uint32_t)v) &&
          !uses_v(an, (uint32_t)v))
        cv = v;
    }
    for (int q = 0; q < st->n_red && rh < 0; q++)
      if (q != rw && uses_v(an, (uint32_t)(rank + q)) && uses_v(d, (uint32_t)(rank + q)))
        rh = q;
    if (kv < 0 || cv < 0 || rh < 0) continue;
    int64_t hb = 0;
    for (int64_t b = 16; b >= 4 && !hb; b--)
      if (st->red_ext[rh] % b == 0) hb = b;
    if (!hb) continue;
    *wg = (wgrad){.kv = kv, .cv = cv, .rh = rh, .rw = rw, .hb = hb, .img = a, .grad = d,
                  .guarded = wg->guarded};
    return 1;
  }
  return 0;
}

/* The weight-gradient tile (3x3, 8x64x56x56 images at one thread: 31 ms,
 * against 37.5 through im2col and OpenBLAS and 92 with lanes alone):
 *   cv.o red... rh.o kv.o out... rh.i rw.o kv.i cv.i rw.i
 * 4 x 2 outputs (kv x cv) with w's partial sums in 8 lanes each (rfactor
 * rw.i), accumulated over blocks of hb rows (rh.i) and the row (rw.o),
 * continued across the outer reduction loops; the image's rows of the
 * block copied (zero-padded where guarded) at rh.o; cv.o parallel. */
static int wgrad_nest(nf_schedule *s, const nf_graph *g, int st_i, const wgrad *wg,
                      char nm[][NF_SCHED_NAME]) {
  const nf_stmt *st = &g->stmts[st_i];
  int rank = g->tensors[st->out].rank, rc;
  int64_t e = st->red_ext[wg->rw], lanes = e % 8 == 0 ? 8 : e % 4 == 0 ? 4 : 8;
  const char *kv = nm[wg->kv], *cv = nm[wg->cv], *rh = nm[rank + wg->rh],
             *rw = nm[rank + wg->rw];
  char rho[NF_SCHED_NAME], rwi[NF_SCHED_NAME], cvo[NF_SCHED_NAME], cw[NF_SCHED_NAME];
  nf__sched_cat(rho, rh, ".o");
  nf__sched_cat(rwi, rw, ".i");
  nf__sched_cat(cvo, cv, ".o");
  /* 4 x 2 (k, c) outputs of one vector each; 4 x 4 where 16 accumulators
   * fit (AVX-512: 8x64x56x56 with a 3x3 kernel, 26-28.6 ms against 33.4
   * with 4 x 2 on a Xeon; 8 x 4 spilled: 49.7) */
  int64_t tc = nf__sched_acc_regs(s) >= 16 && g->tensors[st->out].shape[wg->cv] % 4 == 0 ? 4 : 2;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, kv, 4)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, cv, tc)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, rh, wg->hb)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, rw, lanes)) < 0) return rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  nf__sched_cat(it.names[it.n_names++], cvo, "");
  int ord[NF_MAX_VARS], no = nf__sched_red_order(st, rank, -1, ord);
  if (no < 0) return no;
  for (int q = 0; q < no; q++)
    if (ord[q] != wg->rh && ord[q] != wg->rw)
      nf__sched_cat(it.names[it.n_names++], nm[rank + ord[q]], "");
  nf__sched_cat(it.names[it.n_names++], rho, "");
  nf__sched_cat(it.names[it.n_names++], kv, ".o");
  nf__sched_cat(cw, kv, ".o");
  for (int v = 0; v < rank; v++)
    if (v != wg->kv && v != wg->cv) {
      nf__sched_cat(it.names[it.n_names++], nm[v], "");
      nf__sched_cat(cw, nm[v], ""); /* the tile's loop: the last of them */
    }
  nf__sched_cat(it.names[it.n_names++], rh, ".i");
  nf__sched_cat(it.names[it.n_names++], rw, ".o");
  nf__sched_cat(it.names[it.n_names++], kv, ".i");
  nf__sched_cat(it.names[it.n_names++], cv, ".i");
  nf__sched_cat(it.names[it.n_names++], rwi, "");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, cw, 0)) < 0) return rc;
  if (wg->guarded &&
      (rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, rho, g->tensors[wg->img->u.tensor].name)) < 0)
    return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_RFACTOR, rwi, 0)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, cvo, 0)) < 0) return rc;
  return nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, rwi, 0);
}

/* The weight gradient with output channels in the lanes (AVX-512, the
 * kv extent a multiple of 16; 3x3, 8x64x56x56 at one thread on a
 * Sapphire Rapids Xeon: 15.0 ms against 26.3 with w's partial sums in
 * the lanes):
 *   kv.o red... rh.o cv rh.i rw out... kv.i
 * the tile is every other output (the kernel's r x s) times kv.i 32
 * channels (2 vectors, or 16), at most 24 accumulators, each FMA a
 * broadcast image element times a vector of the gradient D; D's block
 * (kv.i x hb rows x the row) copied at rh.o with the channel last, a
 * guarded image's rows copied zero-padded there too; kv.o parallel.
 * (Splitting cv and fusing cv.o with kv.o, for more parallel iterations,
 * was slower at 1 and 2 threads: 38.6 and 21.9 ms against 26.9 and
 * 19.3 on a Skylake Xeon.) */
static int chan_wgrad_nest(nf_schedule *s, const nf_graph *g, int st_i, const wgrad *wg,
                           const nf_expr *d, char nm[][NF_SCHED_NAME]) {
  const nf_stmt *st = &g->stmts[st_i];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank, rc;
  int64_t ek = t->shape[wg->kv], other = 1;
  if (nf__sched_acc_regs(s) < 16 || ek % 16 != 0 || !g->tensors[d->u.tensor].name) return 0;
  for (int v = 0; v < rank; v++)
    if (v != wg->kv && v != wg->cv) other *= t->shape[v];
  int64_t kvi = ek % 32 == 0 && other * 2 <= 24 ? 32 : 16;
  if (other * (kvi / 16) > 24) return 0;
  int64_t hb = divisor_in(st->red_ext[wg->rh], 4, 28);
  if (!hb) return 0;
  const char *kv = nm[wg->kv], *cv = nm[wg->cv], *rh = nm[rank + wg->rh],
             *rw = nm[rank + wg->rw];
  char par[NF_SCHED_NAME], rho[NF_SCHED_NAME], tmp[NF_SCHED_NAME];
  nf__sched_cat(rho, rh, ".o");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, kv, kvi)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, rh, hb)) < 0) return rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  nf__sched_cat(it.names[it.n_names++], kv, ".o");
  int ord[NF_MAX_VARS], no = nf__sched_red_order(st, rank, -1, ord);
  if (no < 0) return no;
  for (int q = 0; q < no; q++)
    if (ord[q] != wg->rh && ord[q] != wg->rw)
      nf__sched_cat(it.names[it.n_names++], nm[rank + ord[q]], "");
  nf__sched_cat(it.names[it.n_names++], rho, "");
  nf__sched_cat(it.names[it.n_names++], cv, "");
  nf__sched_cat(it.names[it.n_names++], rh, ".i");
  nf__sched_cat(it.names[it.n_names++], rw, "");
  for (int v = 0; v < rank; v++)
    if (v != wg->kv && v != wg->cv) nf__sched_cat(it.names[it.n_names++], nm[v], "");
  nf__sched_cat(it.names[it.n_names++], kv, ".i");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  nf__sched_cat(par, kv, ".o");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, cv, 0)) < 0) return rc;
  if ((rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, rho, g->tensors[d->u.tensor].name)) < 0) return rc;
  if (wg->guarded &&
      (rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, rho, g->tensors[wg->img->u.tensor].name)) < 0)
    return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, par, 0)) < 0) return rc;
  nf__sched_cat(tmp, kv, ".i");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, tmp, 0)) < 0) return rc;
  return 1;
}

/* For a register-tiled sum of rank >= 3 whose term is a padded product
 * `c ? A(..) * B(..) : 0` where the image A reads along the last output
 * variable and a reduction variable (w + s) and no reduction variable
 * indexes A before its last two dimensions (one plane of A per iteration
 * of the loop outside the tile's rows: a depthwise convolution), A's
 * access: the default copies that plane zero-padded at that loop
 * (cache_read), so that the tile's loads need no mask (the depthwise
 * forward 16x128x28x28 at one thread: 5.3 -> 2.9 ms).  Else NULL. */
static const nf_expr *padded_plane(const nf_graph *g, uint32_t si) {
  const nf_stmt *st = &g->stmts[si];
  int rank = g->tensors[st->out].rank;
  int guarded;
  const nf_expr *e = padded_product(st->rhs, &guarded);
  if (st->red != NF_RED_SUM || rank < 3 || !e || !guarded) return NULL;
  for (int side = 0; side < 2; side++) {
    const nf_expr *a = e->args[side];
    if (a->op != NF_OP_ACCESS || a->n_args < 2 || !g->tensors[a->u.tensor].name) continue;
    const nf_expr *last = a->args[a->n_args - 1];
    if (!uses_v(last, (uint32_t)(rank - 1)) || !uses_red(last, rank, st->n_red)) continue;
    int ok = 1;
    for (int d = 0; d + 2 < a->n_args && ok; d++) ok = !uses_red(a->args[d], rank, st->n_red);
    if (ok) return a;
  }
  return NULL;
}

int nf__sched_default_plain(const nf_graph *g, const nf_sched_target *t, int use_stencil,
                            int *n_stencil, nf_schedule **out) {
  nf_schedule *s = nf_schedule_new();
  int rc = NF_OK;
  *out = NULL;
  if (!s) return NF_ENOMEM;
  s->n_stmts = g->n_stmts;
  s->acc_regs = t && t->vector_regs == 32 ? 16 : 8;
  int32_t *epi_prod = malloc((g->n_stmts ? g->n_stmts : 1) * sizeof *epi_prod);
  if (!epi_prod) {
    nf_schedule_free(s);
    return NF_ENOMEM;
  }
  for (uint32_t si = 0; si < g->n_stmts; si++) epi_prod[si] = -1;
  for (uint32_t si = 0; si < g->n_stmts; si++) {
    int c = epilogue_of(g, si);
    if (c >= 0) epi_prod[c] = (int32_t)si;
  }
  for (uint32_t si = 0; si < g->n_stmts && rc == NF_OK; si++) {
    const nf_stmt *st = &g->stmts[si];
    const nf_tensor *t = &g->tensors[st->out];
    int rank = t->rank, st_i = (int)si;
    if (nf__sched_inlined_by_default(g, si)) {
      rc = nf__sched_add1(s, st_i, NF_SCH_INLINE, NULL, 0);
      continue;
    }
    char nm[NF_MAX_VARS][NF_SCHED_NAME], a[NF_SCHED_NAME], b[NF_SCHED_NAME];
    for (int k = 0; k < rank + st->n_red; k++) nf__sched_var_name(st, k, nm[k]);
    int64_t ei = rank >= 2 ? t->shape[rank - 2] : 0, ej = rank >= 1 ? t->shape[rank - 1] : 0;
    int ec = epilogue_of(g, si);
    if (ec >= 0 && use_stencil) {
      /* a product tile computed panel by panel at its epilogue's loop */
      rc = nf__sched_gemm_fused(s, g, (int)si, ec, 0);
      if (rc != 0) {
        if (rc > 0) (*n_stencil)++;
        rc = rc > 0 ? NF_OK : rc;
        continue;
      }
    }
    if (ec >= 0) {
      /* the reduction is computed tile by tile inside its epilogue's
       * register tile (the epilogue's j.o loop), reduction loops outside
       * the tile's: batch... red... i j, j vectorized */
      const nf_stmt *cs = &g->stmts[ec];
      char cj[NF_SCHED_NAME], jo[NF_SCHED_NAME];
      nf__sched_var_name(cs, rank - 1, cj);
      nf__sched_cat(jo, cj, ".o");
      nf_sched_item it;
      memset(&it, 0, sizeof it);
      it.kind = NF_SCH_COMPUTE_AT;
      it.stmt = st_i;
      it.stmt2 = ec;
      it.n_names = 1;
      nf__sched_cat(it.names[0], jo, "");
      rc = nf_schedule_add(s, &it);
      memset(&it, 0, sizeof it);
      it.kind = NF_SCH_REORDER;
      it.stmt = st_i;
      for (int k = 0; k < rank - 2; k++) nf__sched_cat(it.names[it.n_names++], nm[k], "");
      for (int k = 0; k < st->n_red; k++) nf__sched_cat(it.names[it.n_names++], nm[rank + k], "");
      nf__sched_cat(it.names[it.n_names++], nm[rank - 2], "");
      nf__sched_cat(it.names[it.n_names++], nm[rank - 1], "");
      if (rc == NF_OK) rc = nf_schedule_add(s, &it);
      if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, nm[rank - 1], 0);
      continue;
    }
    if (epi_prod[si] >= 0 && use_stencil) {
      rc = nf__sched_gemm_fused(s, g, epi_prod[si], (int)si, 1);
      if (rc != 0) {
        rc = rc > 0 ? NF_OK : rc;
        continue;
      }
    }
    if (epi_prod[si] >= 0) {
      /* the fused epilogue: the producer's register tile */
      int64_t ti, tj;
      reg_tile(ei, ej, &ti, &tj);
      rc = tile_nest(s, st_i, nm, rank, NULL, 0, ti, tj);
      continue;
    }
    if (use_stencil) {
      /* a product of two plain accesses: the product tile */
      rc = nf__sched_gemm(s, g, st_i, nm);
      if (rc != 0) {
        if (rc > 0) (*n_stencil)++;
        rc = rc > 0 ? NF_OK : rc;
        continue;
      }
    }
    stencil sc;
    if (use_stencil && stencil_of(g, si, &sc)) {
      rc = chan_stencil_nest(s, g, st_i, &sc, nm);
      if (rc == 0) rc = stencil_nest(s, g, st_i, &sc, nm);
      else if (rc > 0) rc = NF_OK;
      (*n_stencil)++;
      continue;
    }
    if (tiled_by_default(g, si)) {
      /* register tile: ... i.o j.o red... i.i j.i, accumulate in a tile */
      int64_t ti, tj;
      reg_tile(ei, ej, &ti, &tj);
      rc = tile_nest(s, st_i, nm, rank, &nm[rank], st->n_red, ti, tj);
      nf__sched_cat(a, nm[rank - 1], ".o");
      if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, a, 0);
      const nf_expr *pl;
      if (rc == NF_OK && use_stencil && (pl = padded_plane(g, si)) != NULL) {
        rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, nm[rank - 3], g->tensors[pl->u.tensor].name);
        (*n_stencil)++;
      }
      continue;
    }
    wgrad wg;
    if (use_stencil && wgrad_of(g, si, &wg)) {
      rc = chan_wgrad_nest(s, g, st_i, &wg, wg.grad, nm);
      if (rc == 0) rc = wgrad_nest(s, g, st_i, &wg, nm);
      else if (rc > 0) rc = NF_OK;
      (*n_stencil)++;
      continue;
    }
    int rfk = rf_var_default(g, si);
    if (rfk >= 0) {
      rc = rf_nest(s, g, st_i, rfk, nm);
      continue;
    }
    if (rank == 0) continue;
    int vec = st->n_red == 0 && ej >= 8;
    const char *j = nm[rank - 1];
    if (vec) {
      rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, j, 8);
      nf__sched_cat(b, j, ".i");
      if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, b, 0);
    }
    /* parallel outer loop: the first output variable, fused with the
     * second when it is small */
    char outer[NF_SCHED_NAME];
    nf__sched_cat(outer, nm[0], rank == 1 && vec ? ".o" : "");
    if (rank >= 2 && t->shape[0] < 16) {
      char second[NF_SCHED_NAME];
      nf__sched_cat(second, nm[1], rank == 2 && vec ? ".o" : "");
      if (rc == NF_OK) rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, outer, second);
      nf__sched_cat(a, outer, ".");
      nf__sched_cat(b, a, second);
      nf__sched_cat(outer, b, ".fused");
    }
    if (rc == NF_OK) rc = nf__sched_add1(s, st_i, NF_SCH_PARALLEL, outer, 0);
  }
  free(epi_prod);
  if (rc < 0) {
    nf_schedule_free(s);
    return rc;
  }
  *out = s;
  return NF_OK;
}

/* ---- the GPU default ---- */

/* One thread per output element: a statement's output loops are fused
 * (as far as the fused name fits), split by the block size, the outer
 * part bound to blocks and the inner to threads; its reduction loops run
 * in order inside the thread (the summation order of the interpreter),
 * accumulating in a register (cache_write at the thread loop).
 * Elementwise producers read once are inlined as on CPUs.  A statement
 * with a scalar output runs on one thread (the executor's tier 0 has no
 * cross-thread reduction yet).  This is the tier-1 GPU kernel: simple,
 * coalesced along the innermost output dimension, and correct for every
 * graph lowering accepts; the search's GPU sketches go further. */
/* a * b for extents, saturating at 2^62 */
static int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) || r > (INT64_C(1) << 62) ? INT64_C(1) << 62 : r;
}

/* The tensors statement si reads that have buffers (graph inputs, outputs
 * of statements not inlined), each once, into ids (at most cap). */
static int stored_reads(const nf_graph *g, uint32_t si, uint32_t *ids, int cap) {
  const nf_expr *stack[512];
  int sp = 0, n = 0;
  stack[sp++] = g->stmts[si].rhs;
  while (sp > 0) {
    const nf_expr *e = stack[--sp];
    if (e->op == NF_OP_ACCESS) {
      uint32_t t = e->u.tensor;
      int seen = 0, inlined = 0;
      for (int k = 0; k < n; k++) seen |= ids[k] == t;
      for (uint32_t q = 0; q < g->n_stmts; q++)
        if (g->stmts[q].out == t) inlined = nf__sched_inlined_by_default(g, q);
      if (!seen && !inlined && n < cap) ids[n++] = t;
    }
    for (int i = e->n_args - 1; i >= 0; i--) { /* left operands first */
      if (sp == 512) return -1;
      stack[sp++] = e->args[i];
    }
  }
  return n;
}

/* The virtual threads along one axis of a shared-memory tile of b
 * outputs, t per thread: the largest of vt, vt / 2, vt / 4, ... (at least
 * 1) that divides t and b, where t divides b (the thread's outputs are
 * then vt chunks of t / vt, one in each b / vt part of the tile). */
static int64_t gpu_vthreads(int64_t vt, int64_t b, int64_t t) {
  if (vt < 1 || t < 1 || b % t != 0) return 1;
  while (vt > 1 && (t % vt != 0 || b % vt != 0)) vt /= 2;
  return vt;
}

/* A reduction over a 2-d (or batched) output of at least 16 x 16: blocks
 * of 32 x 32 outputs (or 16 where the extent is under 32), 16 x 16
 * threads of 2 x 2 outputs each, accumulated in registers; the first
 * reduction loop split by 16, its outer part at the block level, where
 * the block stages the operands it reads in shared memory (cache_read,
 * the copies shared by the block's threads).  Loops keep the IR's order
 * of summation.
 *
 * With virtual threads (kn->vthread = v > 1 along an axis, see
 * gpu_vthreads) the block's b outputs along the axis are dealt in v
 * interleaved chunks: split i.i by b / v (i.i.o, the v loop, and i.i.i),
 * i.i.i by t / v (i.i.i.o, the thread loop, and i.i.i.i), so that thread
 * u computes i = w * (b / v) + u * (t / v) + e for w < v, e < t / v:
 * neighbouring threads read neighbouring rows of the staged tile.  The v
 * loops go inside the reduction loops, just outside the thread's own
 * outputs; its register tile (cache_write at the thread loop) is compact,
 * thr_i x thr_j cells, not the bounding box of the chunks (lower.c,
 * tile_dim). */
static int gpu_tiled(nf_schedule *s, const nf_graph *g, uint32_t si, const nf_gpu_knobs *kn) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int rank = t->rank, st_i = (int)si, rc;
  int64_t ei = t->shape[rank - 2], ej = t->shape[rank - 1];
  char nm[NF_MAX_VARS][NF_SCHED_NAME];
  for (int k = 0; k < rank + st->n_red; k++) nf__sched_var_name(st, k, nm[k]);
  const char *r = nm[rank];
  int64_t bi = kn->tile_i > 0 ? kn->tile_i : ei >= 32 ? 32 : 16;
  int64_t bj = kn->tile_j > 0 ? kn->tile_j : ej >= 32 ? 32 : 16;
  int64_t ti = kn->thr_i > 0 ? kn->thr_i : 2, tj = kn->thr_j > 0 ? kn->thr_j : 2;
  int64_t kt0 = kn->kt > 0 ? kn->kt : 16;
  int64_t kt = st->red_ext[0] < kt0 ? st->red_ext[0] : kt0;
  int64_t b[2] = {bi, bj}, th[2] = {ti, tj}, v[2];
  for (int a = 0; a < 2; a++) v[a] = gpu_vthreads(kn->vthread, b[a], th[a]);
  /* the reorder names every loop: keep within a primitive's names */
  if (rank + st->n_red + 5 + (v[0] > 1) + (v[1] > 1) > NF_SCHED_MAX_NAMES) v[0] = v[1] = 1;
  /* per axis: the block loop, the thread loop, the v loop (or ""), the
   * thread's own outputs */
  char blk[2][NF_SCHED_NAME], thr[2][NF_SCHED_NAME], vl[2][NF_SCHED_NAME], own[2][NF_SCHED_NAME];
  for (int a = 0; a < 2; a++) {
    const char *x = nm[rank - 2 + a];
    char in[NF_SCHED_NAME], rest[NF_SCHED_NAME];
    nf__sched_cat(blk[a], x, ".o");
    nf__sched_cat(in, x, ".i");
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, x, b[a])) < 0) return rc;
    vl[a][0] = '\0';
    if (v[a] > 1) {
      nf__sched_cat(vl[a], in, ".o");
      nf__sched_cat(rest, in, ".i");
      if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, in, b[a] / v[a])) < 0) return rc;
    } else {
      memcpy(rest, in, NF_SCHED_NAME);
    }
    nf__sched_cat(thr[a], rest, ".o");
    nf__sched_cat(own[a], rest, ".i");
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, rest, th[a] / v[a])) < 0) return rc;
  }
  char ro[NF_SCHED_NAME], ri[NF_SCHED_NAME];
  nf__sched_cat(ro, r, ".o");
  nf__sched_cat(ri, r, ".i");
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, r, kt)) < 0) return rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  for (int k = 0; k < rank - 2; k++) nf__sched_cat(it.names[it.n_names++], nm[k], "");
  nf__sched_cat(it.names[it.n_names++], blk[0], "");
  nf__sched_cat(it.names[it.n_names++], blk[1], "");
  nf__sched_cat(it.names[it.n_names++], ro, "");
  nf__sched_cat(it.names[it.n_names++], thr[0], "");
  nf__sched_cat(it.names[it.n_names++], thr[1], "");
  nf__sched_cat(it.names[it.n_names++], ri, "");
  for (int q = 1; q < st->n_red; q++) nf__sched_cat(it.names[it.n_names++], nm[rank + q], "");
  for (int a = 0; a < 2; a++)
    if (v[a] > 1) nf__sched_cat(it.names[it.n_names++], vl[a], "");
  nf__sched_cat(it.names[it.n_names++], own[0], "");
  nf__sched_cat(it.names[it.n_names++], own[1], "");
  if ((rc = nf_schedule_add(s, &it)) < 0) return rc;
  for (int k = 0; k < rank - 2; k++)
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_BIND_BLOCK, nm[k], 0)) < 0) return rc;
  if ((rc = nf__sched_add1(s, st_i, NF_SCH_BIND_BLOCK, blk[0], 0)) < 0 ||
      (rc = nf__sched_add1(s, st_i, NF_SCH_BIND_BLOCK, blk[1], 0)) < 0 ||
      (rc = nf__sched_add1(s, st_i, NF_SCH_BIND_THREAD, thr[0], 0)) < 0 ||
      (rc = nf__sched_add1(s, st_i, NF_SCH_BIND_THREAD, thr[1], 0)) < 0)
    return rc;
  uint32_t ids[8];
  int n = kn->stage < 0 ? 0 : stored_reads(g, si, ids, 8);
  for (int k = 0; k < n; k++)
    if ((rc = nf__sched_add2(s, st_i, NF_SCH_CACHE_READ, ro, g->tensors[ids[k]].name)) < 0) return rc;
  /* the thread's outputs along j, 2 or 4 of them: one vector access of
   * each operand row they read (the backend's vector loads) */
  int64_t oj = th[1] / v[1];
  if (kn->vec >= 0 && (oj == 2 || oj == 4) &&
      (rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, own[1], 0)) < 0)
    return rc;
  return nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, thr[1], 0);
}

/* nf__sched_gpu_plain: nf_lower.h */

/* A reduction to a scalar over at least 512 terms: its reduction loops
 * fused and dealt to one block of 256 threads (thread t takes terms t,
 * t + 256, ...), each thread's partial sum in a slot of a shared tile
 * (rfactor of the thread loop, the tile at an outer loop of one
 * iteration), the slots folded in order at the end. */
static int gpu_block_reduce(nf_schedule *s, const nf_graph *g, uint32_t si, int threads) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  int st_i = (int)si, rc = NF_OK, rank = t->rank;
  char cur[NF_SCHED_NAME], nm[NF_SCHED_NAME], a[NF_SCHED_NAME], b[NF_SCHED_NAME];
  char out[NF_SCHED_NAME] = "";
  /* outputs (rank > 0: a reduction across threads per output): fused,
   * one block each */
  for (int k = 0; k < rank && rc >= 0; k++) {
    nf__sched_var_name(st, k, nm);
    if (k == 0) {
      memcpy(out, nm, sizeof nm);
      continue;
    }
    char fn[3 * NF_SCHED_NAME];
    snprintf(fn, sizeof fn, "%s.%s.fused", out, nm);
    if (strlen(fn) >= NF_SCHED_NAME) return NF_ELIMIT;
    rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, out, nm);
    memcpy(out, fn, strlen(fn) + 1);
  }
  nf__sched_var_name(st, rank, cur);
  int64_t ext = st->red_ext[0];
  for (int k = 1; k < st->n_red && rc >= 0; k++) {
    nf__sched_var_name(st, rank + k, nm);
    char fn[3 * NF_SCHED_NAME];
    snprintf(fn, sizeof fn, "%s.%s.fused", cur, nm);
    if (strlen(fn) >= NF_SCHED_NAME) return NF_ELIMIT;
    rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, cur, nm);
    memcpy(cur, fn, strlen(fn) + 1);
    ext = sat_mul(ext, st->red_ext[k]);
  }
  int64_t per = (ext + threads - 1) / threads; /* terms per thread */
  char o[NF_SCHED_NAME], i[NF_SCHED_NAME];
  nf__sched_cat(o, cur, ".o");
  nf__sched_cat(i, cur, ".i");
  nf__sched_cat(a, o, ".o"); /* one iteration: holds the tile */
  nf__sched_cat(b, o, ".i");
  if (rc < 0 || (rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, cur, threads)) < 0 ||
      (rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, o, per)) < 0)
    return rc;
  nf_sched_item it;
  memset(&it, 0, sizeof it);
  it.kind = NF_SCH_REORDER;
  it.stmt = st_i;
  if (rank > 0) nf__sched_cat(it.names[it.n_names++], out, "");
  nf__sched_cat(it.names[it.n_names++], a, "");
  nf__sched_cat(it.names[it.n_names++], i, "");
  nf__sched_cat(it.names[it.n_names++], b, "");
  if ((rc = nf_schedule_add(s, &it)) < 0 || (rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, a, 0)) < 0 ||
      (rc = nf__sched_add1(s, st_i, NF_SCH_RFACTOR, i, 0)) < 0)
    return rc;
  if (rank > 0 && (rc = nf__sched_add1(s, st_i, NF_SCH_BIND_BLOCK, out, 0)) < 0) return rc;
  return nf__sched_add1(s, st_i, NF_SCH_BIND_THREAD, i, 0);
}

int nf_schedule_gpu(const nf_graph *g, const nf_gpu_knobs *kn, nf_schedule **out) {
  int n_tiled = 0;
  return nf__sched_gpu_plain(g, NF_GPU_DEFAULT_THREADS, 1, kn, &n_tiled, out);
}

int nf_schedule_gpu_tileable(const nf_graph *g, uint32_t si) {
  const nf_stmt *st = &g->stmts[si];
  const nf_tensor *t = &g->tensors[st->out];
  if (nf__sched_inlined_by_default(g, si)) return 0;
  if (st->red == NF_RED_NONE || st->n_red == 0) return 0;
  int64_t terms = 1, outs = 1;
  for (int k = 0; k < st->n_red; k++) terms = sat_mul(terms, st->red_ext[k]);
  for (int k = 0; k < t->rank; k++) outs = sat_mul(outs, t->shape[k]);
  if (t->rank >= 2 && t->shape[t->rank - 2] >= 16 && t->shape[t->rank - 1] >= 16) return 1;
  if (t->rank == 0 && terms >= 512) return 2;
  /* few outputs, each a long sum: one block per output, its threads
   * sharing the terms (else a handful of threads would do all the work) */
  if (t->rank >= 1 && terms >= 512 && outs <= 65536 && outs * 8 <= terms) return 3;
  return 0;
}

int nf__sched_gpu_plain(const nf_graph *g, int block0, int tiled, const nf_gpu_knobs *kns,
                        int *n_tiled, nf_schedule **out) {
  nf_schedule *s = nf_schedule_new();
  int rc = NF_OK;
  *out = NULL;
  *n_tiled = 0;
  if (!s) return NF_ENOMEM;
  if (block0 < 32 || block0 > 1024) block0 = 256;
  s->n_stmts = g->n_stmts;
  static const nf_gpu_knobs none;
  for (uint32_t si = 0; si < g->n_stmts && rc >= 0; si++) {
    const nf_stmt *st = &g->stmts[si];
    const nf_tensor *t = &g->tensors[st->out];
    int rank = t->rank, st_i = (int)si;
    const nf_gpu_knobs *kn = kns ? &kns[si] : &none;
    int block = kn->block >= 32 && kn->block <= 1024 ? kn->block : block0;
    if (nf__sched_inlined_by_default(g, si)) {
      rc = nf__sched_add1(s, st_i, NF_SCH_INLINE, NULL, 0);
      continue;
    }
    int form = tiled && kn->tiled >= 0 ? nf_schedule_gpu_tileable(g, si) : 0;
    /* the search may ask for a reduction across threads (tiled 2) for any
     * reduction with outputs */
    if (tiled && kn->tiled == 2 && st->red != NF_RED_NONE && st->n_red > 0 && rank >= 1) form = 3;
    if (form == 3) {
      rc = gpu_block_reduce(s, g, si, kn->block >= 32 && kn->block <= 1024 ? kn->block : 256);
      ++*n_tiled;
      continue;
    }
    if (form == 1) {
      rc = gpu_tiled(s, g, si, kn);
      ++*n_tiled;
      continue;
    }
    if (form == 2) {
      rc = gpu_block_reduce(s, g, si, kn->block >= 32 && kn->block <= 1024 ? kn->block : 256);
      ++*n_tiled;
      continue;
    }
    if (rank == 0) continue;
    char cur[NF_SCHED_NAME], nm[NF_SCHED_NAME], tmp[NF_SCHED_NAME];
    /* an elementwise statement whose rows split into fours (or twos):
     * each thread takes 4 (2) neighbouring outputs, a vector loop (the
     * backend's vector loads and stores); the loops below are then the
     * outer ones and the last one's outer part (last.o, ext / w) */
    int64_t w = 0, last = t->shape[rank - 1];
    char lastn[NF_SCHED_NAME];
    nf__sched_var_name(st, rank - 1, lastn);
    if (kn->vec >= 0 && (st->red == NF_RED_NONE || st->n_red == 0) && strlen(lastn) + 2 < NF_SCHED_NAME)
      w = last % 4 == 0 ? 4 : last % 2 == 0 ? 2 : 0;
    if (w) {
      if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, lastn, w)) < 0) break;
      nf__sched_cat(tmp, lastn, ".i");
      if ((rc = nf__sched_add1(s, st_i, NF_SCH_VECTORIZE, tmp, 0)) < 0) break;
      last /= w;
    }
    int64_t all = 1;
    for (int k = 0; k < rank - 1; k++) all = sat_mul(all, t->shape[k]);
    all = sat_mul(all, last);
    if (all <= 0) continue;
    /* blocks of tb threads that divide the outputs exactly (no guard),
     * the largest such size up to `block`, at least 32 */
    int64_t tb = all <= block ? all : 0;
    for (int64_t c = block; !tb && c >= 32; c--)
      if (all % c == 0) tb = c;
    int fuse_to = tb ? rank : rank - 1; /* without: the last loop split alone */
    if (rank == 1 && w) nf__sched_cat(cur, lastn, ".o");
    else nf__sched_var_name(st, 0, cur);
    int fused = 1;
    for (int k = 1; k < fuse_to && rc >= 0; k++) {
      if (k == rank - 1 && w) nf__sched_cat(nm, lastn, ".o");
      else nf__sched_var_name(st, k, nm);
      char fn[3 * NF_SCHED_NAME];
      snprintf(fn, sizeof fn, "%s.%s.fused", cur, nm);
      if (strlen(fn) >= NF_SCHED_NAME) break; /* the rest stay serial in the thread */
      rc = nf__sched_add2(s, st_i, NF_SCH_FUSE, cur, nm);
      memcpy(cur, fn, strlen(fn) + 1);
      fused = k + 1;
    }
    if (rc < 0) break;
    if (!tb && fused == rank - 1 && rank > 1) {
      /* the outer loops' iterations are blocks; the last loop is split
       * into blocks of threads with one guard on it */
      if ((rc = nf__sched_add1(s, st_i, NF_SCH_BIND_BLOCK, cur, 0)) < 0) break;
      if (w) nf__sched_cat(cur, lastn, ".o");
      else nf__sched_var_name(st, rank - 1, cur);
      tb = last < block ? last : block;
    } else {
      int64_t ext = 1;
      for (int k = 0; k < fused; k++) ext = sat_mul(ext, k == rank - 1 ? last : t->shape[k]);
      if (!tb || ext % tb != 0) tb = ext < block ? ext : block; /* one guard */
    }
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_SPLIT, cur, tb)) < 0) break;
    nf__sched_cat(tmp, cur, ".o");
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_BIND_BLOCK, tmp, 0)) < 0) break;
    nf__sched_cat(tmp, cur, ".i");
    if ((rc = nf__sched_add1(s, st_i, NF_SCH_BIND_THREAD, tmp, 0)) < 0) break;
    /* a reduction accumulates in a register of its thread and stores once
     * (no separate pass that fills the output with the identity) */
    if (rc >= 0 && st->red != NF_RED_NONE) rc = nf__sched_add1(s, st_i, NF_SCH_CACHE_WRITE, tmp, 0);
  }
  if (rc < 0) {
    nf_schedule_free(s);
    return rc;
  }
  *out = s;
  return NF_OK;
}
