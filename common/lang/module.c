/* module.c - loading `.nf` files with their imports, and the static checks
 * that need no sizes: unique def names, known callees with the right
 * arity and parameter names, no recursion among defs, known tensors,
 * outputs that are defined, `param` declarations with a float dtype, no
 * packs and a name of their own.  Everything else (sizes, ranges, types,
 * bounds) is checked when a def is instantiated (elab.c).
 *
 * A module owns its file texts, ASTs and names in one arena. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nf_config.h"
#include "nf_env.h"
#include "nf_lang_int.h"

#define MAX_FILE_BYTES (64u << 20)
#define MAX_IMPORT_DEPTH 32

static const struct {
  const char *name;
  nf_op op;
  int arity;
} math_fns[] = {
    {"exp", NF_OP_EXP, 1},     {"log", NF_OP_LOG, 1},
    {"sqrt", NF_OP_SQRT, 1},   {"rsqrt", NF_OP_RSQRT, 1},
    {"tanh", NF_OP_TANH, 1},   {"sigmoid", NF_OP_SIGMOID, 1},
    {"erf", NF_OP_ERF, 1},     {"abs", NF_OP_ABS, 1},
    {"floor", NF_OP_FLOOR, 1}, {"ceil", NF_OP_CEIL, 1},
    {"pow", NF_OP_POW, 2},     {"min", NF_OP_MIN, 2},
    {"max", NF_OP_MAX, 2},     {"stop_gradient", NF_OP_STOPGRAD, 1},
};

static const struct {
  const char *name;
  int kind; /* NF__BI_* */
} builtins[] = {
    {"reshape", NF__BI_SHAPE},   {"view", NF__BI_SHAPE},     {"flatten", NF__BI_SHAPE},
    {"transpose", NF__BI_SHAPE}, {"permute", NF__BI_SHAPE},  {"sum", NF__BI_SHAPE},
    {"mean", NF__BI_SHAPE},      {"amax", NF__BI_SHAPE},     {"amin", NF__BI_SHAPE},
    {"cat", NF__BI_SHAPE},       {"stack", NF__BI_SHAPE},    {"chunk", NF__BI_MULTI},
    {"unbind", NF__BI_MULTI},    {"where", NF__BI_ELEM},     {"clamp", NF__BI_ELEM},
};

int nf__lang_builtin(const char *name) {
  for (size_t k = 0; k < sizeof builtins / sizeof builtins[0]; k++)
    if (strcmp(builtins[k].name, name) == 0) return builtins[k].kind;
  return 0;
}

int nf__lang_call_is_expr(const char *name) {
  nf_op op;
  int ar;
  nf_dtype dt;
  return nf__lang_builtin(name) || nf__lang_math_fn(name, &op, &ar) ||
         nf_dtype_parse(name, strlen(name), &dt);
}

const char *nf__lang_builtin_list(void) {
  return "reshape, view, flatten, transpose, permute, sum, mean, amax, amin, cat, stack, "
         "chunk, unbind, where, clamp";
}

int nf__lang_math_fn(const char *name, nf_op *op, int *arity) {
  for (size_t k = 0; k < sizeof math_fns / sizeof math_fns[0]; k++)
    if (strcmp(math_fns[k].name, name) == 0) {
      *op = math_fns[k].op;
      *arity = math_fns[k].arity;
      return 1;
    }
  return 0;
}

nf_module *nf_module_new(void) {
  nf_module *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->arena = nf_arena_new();
  if (!m->arena) {
    free(m);
    return NULL;
  }
  return m;
}

void nf_module_free(nf_module *m) {
  if (!m) return;
  for (int k = 0; k < m->n_files; k++) {
    free(m->files[k]->path);
    free(m->files[k]->real);
    free((char *)m->files[k]->src.text);
    free(m->files[k]);
  }
  free(m->files);
  free(m->defs);
  free(m->lib_dir);
  nf_arena_free(m->arena);
  free(m);
}

int nf_module_set_lib_dir(nf_module *m, const char *dir) {
  char *d = strdup(dir);
  if (!d) return NF_ENOMEM;
  free(m->lib_dir);
  m->lib_dir = d;
  return NF_OK;
}

const nf_ast_def *nf__module_find(const nf_module *m, const char *name) {
  for (int k = 0; k < m->n_defs; k++)
    if (strcmp(m->defs[k]->name, name) == 0) return m->defs[k];
  return NULL;
}

/* Reads a whole file (bounded) into a malloc'ed NUL-terminated buffer. */
static int read_file(const char *path, char **text, size_t *len, nf_buf *why) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    nf_buf_printf(why, "cannot open '%s': %s", path, strerror(errno));
    return NF_EIO;
  }
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    fclose(f);
    nf_buf_printf(why, "cannot read '%s': it is a directory", path);
    return NF_EIO;
  }
  nf_buf b = NF_BUF_INIT;
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
    if (b.len + n > MAX_FILE_BYTES) {
      fclose(f);
      nf_buf_free(&b);
      nf_buf_printf(why, "'%s' is larger than %u MiB", path, MAX_FILE_BYTES >> 20);
      return NF_ELIMIT;
    }
    nf_buf_add(&b, chunk, n);
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    nf_buf_free(&b);
    nf_buf_printf(why, "cannot read '%s': I/O error", path);
    return NF_EIO;
  }
  if (b.oom) {
    nf_buf_free(&b);
    return NF_ENOMEM;
  }
  if (!b.data) {
    b.data = calloc(1, 1);
    if (!b.data) return NF_ENOMEM;
  }
  *text = b.data;
  *len = b.len;
  return NF_OK;
}

static int add_def(nf_module *m, const nf_ast_def *d) {
  if (m->n_defs == m->cap_defs) {
    int nc = m->cap_defs ? m->cap_defs * 2 : 32;
    const nf_ast_def **n = realloc(m->defs, sizeof(*n) * (size_t)nc);
    if (!n) return NF_ENOMEM;
    m->defs = n;
    m->cap_defs = nc;
  }
  m->defs[m->n_defs++] = d;
  return NF_OK;
}

static int load_text(nf_module *m, const char *path, char *text, size_t len,
                     int direct, int depth, nf_diag *d);

static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

static const char *lib_dir(const nf_module *m) {
  if (m->lib_dir) return m->lib_dir;
  const char *env = nf_env(NF_ENV_LIB);
  if (env && *env) return env;
  struct stat st;
  if (stat(NF_DATA_LIBDIR "/nn.nf", &st) == 0) return NF_DATA_LIBDIR;
  return NF_SOURCE_LIBDIR;
}

static int load_path(nf_module *m, const char *path, int direct, int depth,
                     nf_loc from, nf_diag *d) {
  char real[PATH_MAX];
  if (realpath(path, real)) {
    for (int k = 0; k < m->n_files; k++)
      if (m->files[k]->real && strcmp(m->files[k]->real, real) == 0) {
        if (direct) m->files[k]->direct = 1;
        return NF_OK; /* already loaded (imports form a set) */
      }
  }
  if (depth > MAX_IMPORT_DEPTH) {
    nf_diag_error(d, from, "imports nested more than %d deep", MAX_IMPORT_DEPTH);
    return NF_ELIMIT;
  }
  char *text = NULL;
  size_t len = 0;
  nf_buf why = NF_BUF_INIT;
  int rc = read_file(path, &text, &len, &why);
  if (rc) {
    if (rc == NF_ENOMEM)
      nf_diag_error(d, from, "out of memory reading '%s'", path);
    else
      nf_diag_error(d, from, "%s", nf_buf_str(&why));
    nf_buf_free(&why);
    return rc;
  }
  nf_buf_free(&why);
  return load_text(m, path, text, len, direct, depth, d);
}

/* Takes ownership of text. */
static int load_text(nf_module *m, const char *path, char *text, size_t len,
                     int direct, int depth, nf_diag *d) {
  nf__lfile *f = calloc(1, sizeof *f);
  if (!f) {
    free(text);
    return NF_ENOMEM;
  }
  f->path = strdup(path);
  char real[PATH_MAX];
  f->real = realpath(path, real) ? strdup(real) : NULL;
  f->src.name = f->path;
  f->src.text = text;
  f->src.len = len;
  f->direct = direct;
  if (!f->path) {
    free(text);
    free(f->real);
    free(f);
    return NF_ENOMEM;
  }
  if (m->n_files == m->cap_files) {
    int nc = m->cap_files ? m->cap_files * 2 : 8;
    nf__lfile **n = realloc(m->files, sizeof(*n) * (size_t)nc);
    if (!n) {
      free(f->path);
      free(f->real);
      free(text);
      free(f);
      return NF_ENOMEM;
    }
    m->files = n;
    m->cap_files = nc;
  }
  m->files[m->n_files++] = f;
  int rc = nf__parse(m->arena, &f->src, d, &f->ast);
  if (rc) return rc;
  /* Imports first, so their defs precede ours. */
  char *dir = dir_of(path);
  if (!dir) return NF_ENOMEM;
  for (int k = 0; k < f->ast->n_imports; k++) {
    const nf_ast_import *im = &f->ast->imports[k];
    nf_buf p = NF_BUF_INIT;
    if (im->lib)
      nf_buf_printf(&p, "%s/%s.nf", lib_dir(m), im->lib);
    else if (im->path[0] == '/')
      nf_buf_puts(&p, im->path);
    else
      nf_buf_printf(&p, "%s/%s", dir, im->path);
    if (p.oom) {
      free(dir);
      nf_buf_free(&p);
      return NF_ENOMEM;
    }
    rc = load_path(m, nf_buf_str(&p), 0, depth + 1, im->loc, d);
    nf_buf_free(&p);
    if (rc) {
      free(dir);
      return rc;
    }
  }
  free(dir);
  for (int k = 0; k < f->ast->n_defs; k++) {
    const nf_ast_def *def = f->ast->defs[k];
    const nf_ast_def *prev = nf__module_find(m, def->name);
    if (nf__lang_builtin(def->name)) {
      nf_diag_error(d, def->loc,
                    "def '%s' has the name of a built-in operator (%s): rename it",
                    def->name, nf__lang_builtin_list());
      return NF_ETYPE;
    }
    if (prev) {
      nf_diag_error(d, def->loc, "def '%s' is defined twice", def->name);
      nf_diag_note(d, prev->loc, "first defined here");
      return NF_ETYPE;
    }
    if (add_def(m, def)) return NF_ENOMEM;
  }
  return NF_OK;
}

/* ---- static checks ---- */

typedef struct names {
  const char **v;
  int n, cap;
} names;

static int names_has(const names *s, const char *x) {
  for (int k = 0; k < s->n; k++)
    if (strcmp(s->v[k], x) == 0) return 1;
  return 0;
}

static int names_add(names *s, const char *x) {
  if (names_has(s, x)) return NF_OK;
  if (s->n == s->cap) {
    int nc = s->cap ? s->cap * 2 : 16;
    const char **n = realloc(s->v, sizeof(*n) * (size_t)nc);
    if (!n) return NF_ENOMEM;
    s->v = n;
    s->cap = nc;
  }
  s->v[s->n++] = x;
  return NF_OK;
}

static int collect_defined(nf_ast_stmt *const *body, int n, names *s) {
  for (int k = 0; k < n; k++) {
    const nf_ast_stmt *st = body[k];
    int rc = NF_OK;
    if (st->kind == NF_S_ELEM) rc = names_add(s, st->lhs.name);
    if (st->kind == NF_S_CALL)
      for (int j = 0; j < st->n_results && !rc; j++)
        rc = names_add(s, st->results[j].name);
    if (st->kind == NF_S_FOR) rc = collect_defined(st->body, st->n_body, s);
    if (rc) return rc;
  }
  return NF_OK;
}

/* The names a tensor expression may read as scalars: the def's integer
 * parameters, `where` sizes, the sizes its shapes bind, and loop
 * variables (body: the statements to look for loops in; def NULL then). */
static int collect_scalars(const nf_ast_def *def, nf_ast_stmt *const *body, int n,
                           names *s) {
  int rc = NF_OK;
  for (int k = 0; def && k < def->n_params && !rc; k++) rc = names_add(s, def->params[k].name);
  for (int k = 0; def && k < def->n_wheres && !rc; k++) rc = names_add(s, def->wheres[k].name);
  for (int io = 0; def && io < 2; io++) {
    const nf_ast_tdecl *ts = io ? def->outputs : def->inputs;
    int nt = io ? def->n_outputs : def->n_inputs;
    for (int k = 0; k < nt; k++)
      for (int j = 0; j < ts[k].n_dims && !rc; j++)
        if (ts[k].dims[j]->kind == NF_A_NAME) rc = names_add(s, ts[k].dims[j]->name);
  }
  for (int k = 0; k < n && !rc; k++)
    if (body[k]->kind == NF_S_FOR) {
      rc = names_add(s, body[k]->var);
      if (!rc) rc = collect_scalars(NULL, body[k]->body, body[k]->n_body, s);
    }
  return rc;
}

/* " (did you mean 'X'?)" for the candidate closest to word among the
 * lists (each a names set; NULL: none), the math functions, and, with m,
 * the defs and built-in operators; "" when none is close.  Into buf. */
static const char *did_you_mean(char *buf, size_t n, const char *word, const names *a,
                                const names *b, const nf_module *m) {
  const char *fns[64];
  int nf = 0;
  for (size_t k = 0; k < sizeof math_fns / sizeof math_fns[0]; k++) fns[nf++] = math_fns[k].name;
  for (size_t k = 0; m && k < sizeof builtins / sizeof builtins[0] && nf < 64; k++)
    fns[nf++] = builtins[k].name;
  const char *best[4] = {0};
  best[0] = a ? nf_did_you_mean(word, a->v, a->n) : NULL;
  best[1] = b ? nf_did_you_mean(word, b->v, b->n) : NULL;
  best[2] = nf_did_you_mean(word, fns, nf);
  if (m) {
    const char **defs = malloc(sizeof *defs * (size_t)(m->n_defs + 1));
    if (defs) {
      for (int k = 0; k < m->n_defs; k++) defs[k] = m->defs[k]->name;
      best[3] = nf_did_you_mean(word, defs, m->n_defs);
      free(defs);
    }
  }
  const char *pick = nf_did_you_mean(word, best, 4);
  if (!pick)
    for (int k = 0; k < 4 && !pick; k++) pick = best[k];
  if (!pick) return "";
  snprintf(buf, n, " (did you mean '%.64s'?)", pick);
  return buf;
}

static int check_expr(const nf_ast_expr *e, const names *tensors, nf_diag *d) {
  if (!e) return 0;
  int bad = 0;
  if (e->kind == NF_A_APPLY) {
    nf_op op;
    int ar;
    nf_dtype dt;
    int known = names_has(tensors, e->name) ||
                (!e->sub && (nf__lang_math_fn(e->name, &op, &ar) ||
                             nf_dtype_parse(e->name, strlen(e->name), &dt) ||
                             strcmp(e->name, "prod") == 0));
    if (!known) {
      char dym[96];
      nf_diag_error(d, e->loc, "unknown tensor or function '%s'%s", e->name,
                    did_you_mean(dym, sizeof dym, e->name, tensors, NULL, NULL));
      bad = 1;
    }
  }
  for (int k = 0; k < e->n_args; k++) bad |= check_expr(e->args[k], tensors, d);
  return bad;
}

/* A call of def cd at loc with n_args arguments and params: the arity,
 * the parameters' names and, for n_results >= 0, the results (a call in
 * a tensor expression, n_results -1, must have one output).  1 after
 * errors. */
static int check_call(const nf_ast_def *cd, nf_loc loc, nf_loc stmt_loc, int n_args,
                      int n_results, const nf_ast_param_arg *params, int n_params,
                      nf_diag *d) {
  int bad = 0;
  if (n_args != cd->n_inputs) {
    nf_diag_error(d, loc, "%s takes %d input%s, got %d", cd->name, cd->n_inputs,
                  cd->n_inputs == 1 ? "" : "s", n_args);
    nf_diag_note(d, cd->loc, "%s is defined here", cd->name);
    bad = 1;
  }
  if (n_results >= 0 && n_results != cd->n_outputs) {
    nf_diag_error(d, stmt_loc, "%s returns %d output%s, but %d %s named", cd->name,
                  cd->n_outputs, cd->n_outputs == 1 ? "" : "s", n_results,
                  n_results == 1 ? "is" : "are");
    bad = 1;
  }
  if (n_results < 0 && cd->n_outputs != 1) {
    nf_diag_error(d, loc,
                  "%s returns %d outputs: only a def with one output is a value "
                  "inside an expression; name its results in a statement of its "
                  "own ('A, B = %s(...)')",
                  cd->name, cd->n_outputs, cd->name);
    bad = 1;
  }
  for (int j = 0; j < n_params; j++) {
    int found = 0;
    for (int p = 0; p < cd->n_params; p++)
      if (strcmp(cd->params[p].name, params[j].name) == 0) found = 1;
    if (!found) {
      const char *pn[64];
      int np = 0;
      for (int p = 0; p < cd->n_params && np < 64; p++) pn[np++] = cd->params[p].name;
      const char *s = nf_did_you_mean(params[j].name, pn, np);
      nf_diag_error(d, params[j].loc, "%s has no parameter '%s'%s%s%s", cd->name,
                    params[j].name, s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "");
      bad = 1;
    }
  }
  return bad;
}

/* A tensor expression (the right side of `T = ...`): its tensors known,
 * its calls of defs checked (top: the statement's own call, with its
 * n_results), its functions and casts elementwise with one argument
 * (pow, min and max with two). */
static int check_texpr(const nf_module *m, const nf_ast_expr *e, int top, int n_results,
                       nf_loc stmt_loc, const names *tensors, const names *scalars,
                       nf_diag *d) {
  int bad = 0;
  char dym[96];
  if (e->kind == NF_A_NAME && !names_has(tensors, e->name) &&
      (e->sub || !names_has(scalars, e->name))) {
    nf_diag_error(d, e->loc, "unknown tensor '%s'%s", e->name,
                  did_you_mean(dym, sizeof dym, e->name, tensors, e->sub ? NULL : scalars, NULL));
    bad = 1;
  }
  int bi = e->kind == NF_A_CALL ? nf__lang_builtin(e->name) : 0;
  if (bi == NF__BI_MULTI && !top) {
    nf_diag_error(d, e->loc,
                  "%s has one result per part: name them in a statement of its own "
                  "('A, B = %s(X)')",
                  e->name, e->name);
    bad = 1;
  } else if (bi && bi != NF__BI_MULTI && top && n_results != 1) {
    nf_diag_error(d, stmt_loc, "%s has one result, but %d are named", e->name, n_results);
    bad = 1;
  }
  if (e->kind == NF_A_CALL && !bi) {
    const nf_ast_def *cd = nf__module_find(m, e->name);
    nf_op op;
    int ar = 1;
    nf_dtype dt;
    if (cd) {
      bad |= check_call(cd, e->loc, stmt_loc, e->n_args, top ? n_results : -1, e->params,
                        e->n_params, d);
    } else if (nf__lang_math_fn(e->name, &op, &ar) ||
               nf_dtype_parse(e->name, strlen(e->name), &dt)) {
      if (nf_dtype_parse(e->name, strlen(e->name), &dt)) ar = 1;
      /* (max(X), min(X) of one tensor: over all of it) */
      if (e->n_args == 1 && (!strcmp(e->name, "max") || !strcmp(e->name, "min"))) ar = 1;
      if (e->n_args != ar) {
        nf_diag_error(d, e->loc, "%s takes %d argument%s, got %d", e->name, ar,
                      ar == 1 ? "" : "s", e->n_args);
        bad = 1;
      }
      if (e->n_params) {
        nf_diag_error(d, e->params[0].loc, "%s takes no parameters", e->name);
        bad = 1;
      }
      if (top && n_results != 1) {
        nf_diag_error(d, stmt_loc, "%s has one result, but %d are named", e->name,
                      n_results);
        bad = 1;
      }
    } else if (names_has(tensors, e->name)) {
      nf_diag_error(d, e->loc,
                    "'%s' is a tensor, not a def: a tensor expression uses whole "
                    "tensors (write %s, not %s(...)); index it in an element "
                    "statement",
                    e->name, e->name, e->name);
      bad = 1;
    } else {
      nf_diag_error(d, e->loc, "unknown def or function '%s'%s", e->name,
                    did_you_mean(dym, sizeof dym, e->name, NULL, NULL, m));
      bad = 1;
    }
  }
  for (int k = 0; k < e->n_args; k++)
    bad |= check_texpr(m, e->args[k], 0, 0, stmt_loc, tensors, scalars, d);
  return bad;
}

static int check_body(const nf_module *m, const nf_ast_def *def,
                      nf_ast_stmt *const *body, int n, const names *tensors,
                      const names *scalars, nf_diag *d) {
  int bad = 0;
  for (int k = 0; k < n; k++) {
    const nf_ast_stmt *st = body[k];
    if (st->kind == NF_S_FOR) {
      bad |= check_body(m, def, st->body, st->n_body, tensors, scalars, d);
      continue;
    }
    if (st->kind == NF_S_ELEM) {
      bad |= check_expr(st->rhs, tensors, d);
      continue;
    }
    if (st->kind == NF_S_PARAM) continue; /* checked by check_param_decls */
    if (st->value) {
      bad |= check_texpr(m, st->value, 1, st->n_results, st->loc, tensors, scalars, d);
      continue;
    }
    const nf_ast_def *cd = st->callee ? nf__module_find(m, st->callee) : NULL;
    if (st->callee && !cd && nf__lang_call_is_expr(st->callee)) {
      /* `Y = exp(X)`, `Y = reshape(X, N, -1)`, `A, B = chunk(X)`: checked as
       * the tensor expression it is */
      nf_ast_expr *args = calloc((size_t)st->n_args + 1, sizeof *args);
      nf_ast_expr **argp = calloc((size_t)st->n_args + 1, sizeof *argp);
      if (!args || !argp) {
        free(args);
        free(argp);
        nf_diag_error(d, st->loc, "out of memory");
        bad = 1;
        continue;
      }
      for (int j = 0; j < st->n_args; j++) {
        args[j].kind = NF_A_NAME;
        args[j].name = st->args[j].name;
        args[j].sub = st->args[j].sub;
        args[j].loc = st->args[j].loc;
        argp[j] = &args[j];
      }
      nf_ast_expr call = {.kind = NF_A_CALL, .loc = st->callee_loc, .name = st->callee,
                          .n_args = st->n_args, .args = argp, .n_params = st->n_params,
                          .params = (nf_ast_param_arg *)st->params};
      bad |= check_texpr(m, &call, 1, st->n_results, st->loc, tensors, scalars, d);
      free(args);
      free(argp);
      continue;
    }
    char dym[96];
    for (int j = 0; j < st->n_args; j++)
      if (!names_has(tensors, st->args[j].name)) {
        nf_diag_error(d, st->args[j].loc, "unknown tensor '%s'%s", st->args[j].name,
                      did_you_mean(dym, sizeof dym, st->args[j].name, tensors, NULL, NULL));
        bad = 1;
      }
    if (!st->callee) continue;
    if (!cd) {
      nf_diag_error(d, st->callee_loc, "unknown def '%s'%s", st->callee,
                    did_you_mean(dym, sizeof dym, st->callee, NULL, NULL, m));
      bad = 1;
      continue;
    }
    bad |= check_call(cd, st->callee_loc, st->loc, st->n_args, st->n_results, st->params,
                      st->n_params, d);
  }
  return bad;
}

static int is_float_dtype(int t) {
  return t == NF_F32 || t == NF_F64 || t == NF_F16 || t == NF_BF16;
}

/* The `param` declarations of a def (top level of its body; the parser
 * rejects them in loops): a float dtype, no packs, and a name that is not
 * an integer parameter, input, output, another param or a tensor defined
 * by a statement.  Adds their names to tensors.  Returns 1 after errors,
 * -1 on OOM. */
static int check_param_decls(const nf_ast_def *def, const names *defined,
                             names *tensors, nf_diag *d) {
  int bad = 0;
  for (int k = 0; k < def->n_body; k++) {
    const nf_ast_stmt *st = def->body[k];
    if (st->kind != NF_S_PARAM) continue;
    const nf_ast_tdecl *t = &st->decl;
    const char *clash = NULL;
    nf_loc at = {0};
    for (int j = 0; j < def->n_params && !clash; j++)
      if (strcmp(def->params[j].name, t->name) == 0) {
        clash = "an integer parameter";
        at = def->params[j].loc;
      }
    for (int j = 0; j < def->n_inputs && !clash; j++)
      if (strcmp(def->inputs[j].name, t->name) == 0) {
        clash = "an input";
        at = def->inputs[j].loc;
      }
    for (int j = 0; j < def->n_outputs && !clash; j++)
      if (strcmp(def->outputs[j].name, t->name) == 0) {
        clash = "an output";
        at = def->outputs[j].loc;
      }
    if (clash) {
      nf_diag_error(d, t->loc, "param '%s' has the same name as %s of %s", t->name, clash,
                    def->name);
      nf_diag_note(d, at, "%s '%s' is declared here", clash, t->name);
      bad = 1;
    } else if (names_has(tensors, t->name)) {
      nf_diag_error(d, t->loc, "param '%s' is declared twice", t->name);
      bad = 1;
    } else if (names_has(defined, t->name)) {
      nf_diag_error(d, t->loc,
                    "param '%s' is also defined by a statement of %s (a param "
                    "is an input of the graph: it is read-only)",
                    t->name, def->name);
      bad = 1;
    }
    if (!is_float_dtype(t->dtype)) {
      nf_diag_error(d, t->loc,
                    "param '%s' has dtype %s; a trainable parameter needs a "
                    "float dtype (f32, f64, f16 or bf16)",
                    t->name, nf_dtype_name((nf_dtype)t->dtype));
      bad = 1;
    }
    for (int j = 0; j < t->n_dims; j++)
      if (t->dims[j]->kind == NF_A_PACK) {
        nf_diag_error(d, t->dims[j]->loc,
                      "the dims of param '%s' cannot be a pack ('*%s'): give "
                      "each dimension as a size expression",
                      t->name, t->dims[j]->name);
        bad = 1;
      }
    if (names_add(tensors, t->name)) return -1;
  }
  return bad;
}

static int check_def(const nf_module *m, const nf_ast_def *def, nf_diag *d) {
  int bad = 0;
  names all = {0}, tensors = {0};
  /* Unique names among params, inputs and outputs. */
  for (int k = 0; k < def->n_params; k++) {
    if (names_has(&all, def->params[k].name)) {
      nf_diag_error(d, def->params[k].loc, "'%s' is declared twice", def->params[k].name);
      bad = 1;
    }
    if (names_add(&all, def->params[k].name)) goto oom;
  }
  for (int io = 0; io < 2; io++) {
    const nf_ast_tdecl *ts = io ? def->outputs : def->inputs;
    int n = io ? def->n_outputs : def->n_inputs;
    for (int k = 0; k < n; k++) {
      if (names_has(&all, ts[k].name)) {
        nf_diag_error(d, ts[k].loc, "'%s' is declared twice", ts[k].name);
        bad = 1;
      }
      if (names_add(&all, ts[k].name) || names_add(&tensors, ts[k].name)) goto oom;
    }
  }
  names defined = {0};
  if (collect_defined(def->body, def->n_body, &defined)) goto oom;
  for (int k = 0; k < def->n_inputs; k++)
    if (names_has(&defined, def->inputs[k].name)) {
      nf_diag_error(d, def->inputs[k].loc,
                    "input '%s' is assigned in the body (inputs are read-only)",
                    def->inputs[k].name);
      bad = 1;
    }
  for (int k = 0; k < def->n_outputs; k++)
    if (!names_has(&defined, def->outputs[k].name)) {
      nf_diag_error(d, def->outputs[k].loc, "output '%s' of %s is never defined",
                    def->outputs[k].name, def->name);
      bad = 1;
    }
  {
    int prc = check_param_decls(def, &defined, &tensors, d);
    if (prc < 0) {
      free(defined.v);
      goto oom;
    }
    bad |= prc;
  }
  for (int k = 0; k < defined.n; k++)
    if (names_add(&tensors, defined.v[k])) goto oom;
  free(defined.v);
  names scalars = {0};
  if (collect_scalars(def, def->body, def->n_body, &scalars)) {
    free(scalars.v);
    goto oom;
  }
  bad |= check_body(m, def, def->body, def->n_body, &tensors, &scalars, d);
  free(scalars.v);
  free(all.v);
  free(tensors.v);
  return bad;
oom:
  free(all.v);
  free(tensors.v);
  nf_diag_error(d, def->loc, "out of memory");
  return 1;
}

static void mark_callee(const nf_module *m, const char *name, char *mark) {
  for (int j = 0; j < m->n_defs; j++)
    if (strcmp(m->defs[j]->name, name) == 0) mark[j] = 1;
}

/* The defs a tensor expression calls. */
static void texpr_callees(const nf_module *m, const nf_ast_expr *e, char *mark) {
  if (e->kind == NF_A_CALL) mark_callee(m, e->name, mark);
  for (int k = 0; k < e->n_args; k++) texpr_callees(m, e->args[k], mark);
}

/* Callees of a def (indices into m->defs), recursively through loops. */
static void callees(const nf_module *m, nf_ast_stmt *const *body, int n,
                    char *mark) {
  for (int k = 0; k < n; k++) {
    const nf_ast_stmt *st = body[k];
    if (st->kind == NF_S_FOR) callees(m, st->body, st->n_body, mark);
    if (st->kind != NF_S_CALL) continue;
    if (st->value) texpr_callees(m, st->value, mark);
    if (st->callee) mark_callee(m, st->callee, mark);
  }
}

static int check_recursion(const nf_module *m, nf_diag *d) {
  int n = m->n_defs;
  if (n == 0) return 0;
  char *adj = calloc((size_t)n * (size_t)n, 1);
  int *state = calloc((size_t)n, sizeof(int)); /* 0 new, 1 on stack, 2 done */
  int *stack = calloc((size_t)n, sizeof(int));
  int *iter = calloc((size_t)n, sizeof(int));
  int bad = 0;
  if (!adj || !state || !stack || !iter) {
    nf_diag_error(d, (nf_loc){0}, "out of memory");
    bad = 1;
    goto out;
  }
  for (int k = 0; k < n; k++)
    callees(m, m->defs[k]->body, m->defs[k]->n_body, adj + (size_t)k * (size_t)n);
  for (int s = 0; s < n && !bad; s++) {
    if (state[s]) continue;
    int sp = 0;
    stack[sp++] = s;
    state[s] = 1;
    iter[s] = 0;
    while (sp > 0 && !bad) {
      int u = stack[sp - 1];
      if (iter[u] >= n) {
        state[u] = 2;
        sp--;
        continue;
      }
      int v = iter[u]++;
      if (!adj[(size_t)u * (size_t)n + (size_t)v]) continue;
      if (state[v] == 1) {
        nf_buf b = NF_BUF_INIT;
        int from = 0;
        while (stack[from] != v) from++;
        for (int k = from; k < sp; k++)
          nf_buf_printf(&b, "%s -> ", m->defs[stack[k]]->name);
        nf_buf_puts(&b, m->defs[v]->name);
        nf_diag_error(d, m->defs[v]->loc, "recursion among defs: %s",
                      nf_buf_str(&b));
        nf_buf_free(&b);
        bad = 1;
      } else if (state[v] == 0) {
        state[v] = 1;
        iter[v] = 0;
        stack[sp++] = v;
      }
    }
  }
out:
  free(adj);
  free(state);
  free(stack);
  free(iter);
  return bad;
}

static int finish_load(nf_module *m, int rc, nf_diag *d) {
  if (!rc) {
    int bad = 0;
    for (int k = 0; k < m->n_defs; k++) bad |= check_def(m, m->defs[k], d);
    if (!bad) bad = check_recursion(m, d);
    if (bad) rc = NF_ETYPE;
  }
  if (rc == NF_ENOMEM && nf_diag_count(d) == 0)
    nf_diag_error(d, (nf_loc){0}, "out of memory");
  if (rc) m->failed = 1;
  return rc;
}

int nf_module_load_file(nf_module *m, const char *path, nf_diag *d) {
  if (m->failed) return NF_EINVAL;
  int rc = load_path(m, path, 1, 0, (nf_loc){0}, d);
  return finish_load(m, rc, d);
}

int nf_module_load_source(nf_module *m, const char *name, const char *text,
                          nf_diag *d) {
  if (m->failed) return NF_EINVAL;
  size_t len = strlen(text);
  char *copy = malloc(len + 1);
  if (!copy) return NF_ENOMEM;
  memcpy(copy, text, len + 1);
  int rc = load_text(m, name, copy, len, 1, 0, d);
  return finish_load(m, rc, d);
}

int nf_module_n_defs(const nf_module *m) {
  int n = 0;
  for (int k = 0; k < m->n_files; k++)
    if (m->files[k]->direct && m->files[k]->ast) n += m->files[k]->ast->n_defs;
  return n;
}

const char *nf_module_def_name(const nf_module *m, int i) {
  for (int k = 0; k < m->n_files; k++) {
    const nf__lfile *f = m->files[k];
    if (!f->direct || !f->ast) continue;
    if (i < f->ast->n_defs) return f->ast->defs[i]->name;
    i -= f->ast->n_defs;
  }
  return NULL;
}

int nf_module_has_def(const nf_module *m, const char *name) {
  return nf__module_find(m, name) != NULL;
}

int nf_module_def_signature(const nf_module *m, const char *def, nf_buf *out) {
  const nf_ast_def *d = nf__module_find(m, def);
  if (!d) return NF_ENOENT;
  nf__ast_print_signature(d, out);
  return out->oom ? NF_ENOMEM : NF_OK;
}

int nf_module_print(const nf_module *m, nf_buf *out) {
  int first = 1;
  for (int k = 0; k < m->n_files; k++) {
    const nf__lfile *f = m->files[k];
    if (!f->direct || !f->ast) continue;
    if (!first) nf_buf_putc(out, '\n');
    first = 0;
    nf__ast_print_file(f->ast, out);
  }
  return out->oom ? NF_ENOMEM : NF_OK;
}

int nf_module_def_inputs(const nf_module *m, const char *def,
                         const char **names, int max) {
  const nf_ast_def *d = nf__module_find(m, def);
  if (!d) return -1;
  for (int k = 0; k < d->n_inputs && k < max; k++) names[k] = d->inputs[k].name;
  return d->n_inputs;
}

int nf_module_def_outputs(const nf_module *m, const char *def,
                          const char **names, int max) {
  const nf_ast_def *d = nf__module_find(m, def);
  if (!d) return -1;
  for (int k = 0; k < d->n_outputs && k < max; k++) names[k] = d->outputs[k].name;
  return d->n_outputs;
}

int nf_module_def_params(const nf_module *m, const char *def,
                         const char **names, int max) {
  const nf_ast_def *d = nf__module_find(m, def);
  if (!d) return -1;
  for (int k = 0; k < d->n_params && k < max; k++) names[k] = d->params[k].name;
  return d->n_params;
}

int nf_module_def_param_decls(const nf_module *m, const char *def,
                              nf_param_decl *out, int max) {
  const nf_ast_def *d = nf__module_find(m, def);
  if (!d) return -1;
  int n = 0;
  for (int k = 0; k < d->n_body; k++) {
    const nf_ast_stmt *st = d->body[k];
    if (st->kind != NF_S_PARAM) continue;
    if (out && n < max) {
      nf_param_decl *pd = &out[n];
      pd->name = st->decl.name;
      pd->init = (nf_init_kind)st->init;
      pd->a = st->n_init_args > 0 ? st->init_args[0] : 0;
      pd->b = st->n_init_args > 1 ? st->init_args[1] : 0;
      if (st->n_init_args == 0 && (st->init == NF_INIT_XAVIER_UNIFORM ||
                                   st->init == NF_INIT_XAVIER_NORMAL))
        pd->a = 1; /* the default gain */
    }
    n++;
  }
  return n;
}

int nf_module_instantiate(nf_module *m, const char *def,
                          const nf_inst_opts *opts, nf_ir_ctx *ctx,
                          nf_graph **out, nf_diag *d) {
  if (m->failed) {
    nf_diag_error(d, (nf_loc){0}, "the module failed to load");
    return NF_EINVAL;
  }
  const nf_ast_def *dd = nf__module_find(m, def);
  if (!dd) {
    nf_diag_error(d, (nf_loc){0}, "no def named '%s'", def);
    return NF_ENOENT;
  }
  return nf__elab_instantiate(m, dd, opts, ctx, out, d);
}
