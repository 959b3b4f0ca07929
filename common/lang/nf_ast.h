/* nf_ast.h - the syntax tree of `.nf` source (internal to common/lang).
 *
 * The parser (parser.c) builds it from text; the elaborator (elab.c) turns
 * a def plus bound sizes and parameters into a concrete nf_graph; the AST
 * printer (ast_print.c) writes it back as canonical `.nf` text.  All nodes
 * and strings live in the arena passed to the parser and are immutable
 * once parsed.  Every node has the location of its first token. */
#ifndef NF_AST_H
#define NF_AST_H

#include <stdint.h>

#include "../nf_arena.h"
#include "../nf_buf.h"
#include "../nf_diag.h"
#include "../nf_ir.h"
#include "../nf_lang.h"

typedef enum nf_ast_kind {
  NF_A_INT = 0, /* ival */
  NF_A_FLOAT,   /* fval; text holds the literal as written */
  NF_A_BOOL,    /* ival 0/1 */
  NF_A_NAME,    /* name; in a tensor expression, sub is the subscript of
                   NAME[sub] (a family member, or a row of a tensor) or
                   NULL, and sub_hi, when not NULL, makes it the family
                   range NAME[sub:sub_hi] (the arguments of cat, stack) */
  NF_A_PACK,    /* *name: only as an index, dim or LHS variable */
  NF_A_UNARY,   /* op (NF_OP_NEG or NF_OP_NOT), args[0] */
  NF_A_BINARY,  /* op (ADD..OR), args[0], args[1] */
  NF_A_SELECT,  /* args[0] ? args[1] : args[2] */
  NF_A_APPLY,   /* name[sub](args...): a tensor access, a math function or
                   a cast; the elaborator decides by the name. sub is the
                   family subscript or NULL. `T()` has n_args 0. */
  NF_A_CALL     /* name<params>(args...) in a tensor expression (the right
                   side of `T = ...`): a def applied to whole tensors (the
                   args, tensor expressions), or an elementwise math
                   function or cast; params: n_params, params */
} nf_ast_kind;

typedef struct nf_ast_expr nf_ast_expr;
typedef struct nf_ast_param_arg nf_ast_param_arg;
struct nf_ast_expr {
  uint8_t kind; /* nf_ast_kind */
  uint8_t op;   /* nf_op for UNARY/BINARY */
  nf_loc loc;
  int64_t ival;
  double fval;
  const char *name; /* NAME, PACK, APPLY */
  const char *text; /* FLOAT: literal text */
  nf_ast_expr *sub; /* APPLY: family subscript, or NULL */
  nf_ast_expr *sub_hi; /* NAME in a tensor expression: a range's end */
  int n_args;
  nf_ast_expr **args;
  int n_params;             /* CALL: name = value, in <...> */
  nf_ast_param_arg *params;
};

/* A reference to a whole tensor: NAME or NAME[sub]. */
typedef struct nf_ast_tref {
  const char *name;
  nf_ast_expr *sub; /* NULL for a plain tensor */
  nf_loc loc;
} nf_ast_tref;

typedef struct nf_ast_range { /* where NAME in LO:HI */
  const char *name;
  nf_ast_expr *lo, *hi;
  nf_loc loc;
} nf_ast_range;

struct nf_ast_param_arg { /* name = expr, in a call's <...> */
  const char *name;
  nf_ast_expr *value;
  nf_loc loc;
};

typedef struct nf_ast_tdecl { /* NAME: DTYPE[dims] */
  const char *name;
  uint8_t dtype;
  int n_dims;
  nf_ast_expr **dims; /* size expressions or NF_A_PACK */
  nf_loc loc;
} nf_ast_tdecl;

typedef enum nf_ast_stmt_kind {
  NF_S_ELEM = 0, /* lhs(idx...) OP rhs [where ranges] */
  NF_S_CALL,     /* results = callee<params>(args); callee NULL for a copy
                    `T = U` (then n_args == 1, n_params == 0); or, when
                    value is not NULL, results = a tensor expression
                    (nested calls, elementwise arithmetic: callee NULL,
                    n_args 0) */
  NF_S_FOR,      /* for var in lo:hi { body } */
  NF_S_PARAM     /* param NAME: DTYPE[dims] = init(args): only at the top
                    level of a def's body (the parser rejects it in `for`) */
} nf_ast_stmt_kind;

typedef struct nf_ast_stmt nf_ast_stmt;
struct nf_ast_stmt {
  uint8_t kind;
  nf_loc loc;
  /* ELEM */
  nf_ast_tref lhs;
  int n_idx;
  nf_ast_expr **idx; /* NF_A_NAME or NF_A_PACK */
  uint8_t red;       /* nf_redop */
  nf_ast_expr *rhs;
  int n_ranges;
  nf_ast_range *ranges;
  /* CALL */
  int n_results;
  nf_ast_tref *results;
  const char *callee;
  nf_loc callee_loc;
  int n_params;
  nf_ast_param_arg *params;
  int n_args;
  nf_ast_tref *args;
  nf_ast_expr *value;  /* a tensor expression, or NULL */
  /* FOR */
  const char *var;
  nf_ast_expr *lo, *hi;
  int n_body;
  nf_ast_stmt **body;
  /* PARAM */
  nf_ast_tdecl decl;    /* name, dtype (any, as parsed) and dims */
  uint8_t init;         /* nf_init_kind */
  int n_init_args;      /* as written: 0..2 (the parser checks the arity) */
  double init_args[2];  /* numeric literals, the sign applied */
  nf_loc init_loc;      /* of the initializer's name */
};

typedef struct nf_ast_param { /* name [= default] */
  const char *name;
  nf_ast_expr *dflt; /* NULL: required */
  nf_loc loc;
} nf_ast_param;

typedef struct nf_ast_where { /* where NAME = expr */
  const char *name;
  nf_ast_expr *value;
  nf_loc loc;
} nf_ast_where;

typedef struct nf_ast_def {
  const char *name;
  nf_loc loc;
  int n_params;
  nf_ast_param *params;
  int n_inputs;
  nf_ast_tdecl *inputs;
  int n_outputs;
  nf_ast_tdecl *outputs;
  int n_wheres;
  nf_ast_where *wheres;
  int n_requires;
  nf_ast_expr **requires;
  int n_body;
  nf_ast_stmt **body;
} nf_ast_def;

typedef struct nf_ast_import {
  const char *path; /* "file.nf" as written (quoted form) */
  const char *lib;  /* bare name (import nn), or NULL */
  nf_loc loc;
} nf_ast_import;

typedef struct nf_ast_file {
  const nf_src *src;
  int n_imports;
  nf_ast_import *imports;
  int n_defs;
  nf_ast_def **defs;
} nf_ast_file;

/* Parses src into *out.  Syntax errors go to d (each located, with the
 * expected token); parsing recovers at the next statement or def so
 * several errors can be reported.  Returns NF_OK, NF_ESYNTAX when d got
 * errors, NF_ENOMEM.  Never crashes or recurses without bound on any input
 * (nesting deeper than NF_PARSE_MAX_DEPTH is a syntax error). */
#define NF_PARSE_MAX_DEPTH 200
int nf__parse(nf_arena *arena, const nf_src *src, nf_diag *d,
              nf_ast_file **out);

/* Printing in canonical form: one statement per line, two-space indents,
 * minimal parentheses, float literals in a form that reads back to the
 * same double ("%.17g" trimmed, always with a '.' or exponent). */
void nf__ast_print_file(const nf_ast_file *f, nf_buf *out);
void nf__ast_print_def(const nf_ast_def *d, nf_buf *out);
void nf__ast_print_expr(const nf_ast_expr *e, nf_buf *out);
/* `name(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N])` with params. */
void nf__ast_print_signature(const nf_ast_def *d, nf_buf *out);

/* Structural equality of trees, ignoring locations and the text of float
 * literals (their values are compared by bits).  1 when equal. */
int nf__ast_file_equal(const nf_ast_file *a, const nf_ast_file *b);
int nf__ast_expr_equal(const nf_ast_expr *a, const nf_ast_expr *b);

#endif
