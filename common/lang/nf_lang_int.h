/* nf_lang_int.h - what the module loader and the elaborator share
 * (internal to common/lang). */
#ifndef NF_LANG_INT_H
#define NF_LANG_INT_H

#include "../nf_lang.h"
#include "nf_ast.h"

/* One loaded file. */
typedef struct nf__lfile {
  nf_src src;
  char *path; /* as opened */
  char *real; /* realpath, for import de-duplication */
  nf_ast_file *ast;
  int direct; /* loaded by the user rather than imported */
} nf__lfile;

struct nf_module {
  nf_arena *arena; /* ASTs, names */
  nf__lfile **files;
  int n_files, cap_files;
  /* every def of every file, in load order */
  const nf_ast_def **defs;
  int n_defs, cap_defs;
  char *lib_dir;
  int failed;
};

/* Looks a def up by name across every loaded file; NULL when absent. */
const nf_ast_def *nf__module_find(const nf_module *m, const char *name);

/* Whether name is one of the math functions of the language, and its op
 * and arity (1 or 2). */
int nf__lang_math_fn(const char *name, nf_op *op, int *arity);

/* The built-in operators of tensor expressions (elab.c): shape and
 * reduction operators made into statements (NF__BI_SHAPE), those with one
 * result per part (NF__BI_MULTI, only as a statement's whole right side),
 * and elementwise ones (NF__BI_ELEM: where, clamp).  0: not a built-in.
 * No def may take their names. */
enum { NF__BI_SHAPE = 1, NF__BI_MULTI, NF__BI_ELEM };
int nf__lang_builtin(const char *name);
/* Whether a call of name that is no def is a tensor expression: a math
 * function, a cast or a built-in operator. */
int nf__lang_call_is_expr(const char *name);
const char *nf__lang_builtin_list(void);

/* Instantiates a def (see nf_module_instantiate). */
int nf__elab_instantiate(nf_module *m, const nf_ast_def *def,
                         const nf_inst_opts *opts, nf_ir_ctx *ctx,
                         nf_graph **out, nf_diag *d);

#endif
