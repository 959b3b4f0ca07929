/* nf_lang.h - loading `.nf` modules and instantiating their defs.
 *
 * A module is a set of parsed files (a root file and its imports) whose
 * defs have passed the static checks (names resolve, calls have the right
 * arity, no recursion).  Instantiating a def binds its sizes (from input
 * shapes) and parameters, expands calls and `for` loops, infers ranges,
 * types and checks bounds, and yields a concrete nf_graph.
 *
 * A module owns its sources and syntax trees; it is not thread-safe.
 * Diagnostics go to the nf_diag the caller passes (never printed). */
#ifndef NF_LANG_H
#define NF_LANG_H

#include "nf_buf.h"
#include "nf_diag.h"
#include "nf_ir.h"

typedef struct nf_module nf_module;

/* Creates an empty module; NULL on allocation failure. */
nf_module *nf_module_new(void);
void nf_module_free(nf_module *m);
/* Directory searched by `import NAME` (NAME.nf).  Without a call, the
 * module uses $NEOFLOW_LIB, then the compiled-in data directory. */
int nf_module_set_lib_dir(nf_module *m, const char *dir);

/* Reads, parses and checks a file and its imports.  Returns NF_OK;
 * NF_EIO (unreadable file), NF_ESYNTAX or NF_ETYPE with the messages in d.
 * A module that failed to load must not be used further except freed. */
int nf_module_load_file(nf_module *m, const char *path, nf_diag *d);
/* Same, from text; name is used in messages and to resolve imports
 * relative to the current directory. */
int nf_module_load_source(nf_module *m, const char *name, const char *text,
                          nf_diag *d);

/* The defs of the files loaded directly (not of their imports), in
 * source order; names are valid while m lives. */
int nf_module_n_defs(const nf_module *m);
const char *nf_module_def_name(const nf_module *m, int i);
/* Whether any loaded file (imports included) defines name. */
int nf_module_has_def(const nf_module *m, const char *name);
/* Appends `name<params>(inputs) -> (outputs)` of a def. */
int nf_module_def_signature(const nf_module *m, const char *def, nf_buf *out);
/* Appends the canonical `.nf` text of the directly loaded files (imports
 * kept as import lines). */
int nf_module_print(const nf_module *m, nf_buf *out);

/* One argument of an instantiation. */
typedef struct nf_arg_shape {
  const char *name; /* the def's input name; NULL: by position */
  int rank;
  int64_t dims[NF_MAX_RANK];
} nf_arg_shape;

typedef struct nf_inst_opts {
  int n_shapes; /* shapes for the def's inputs: by name or in order */
  const nf_arg_shape *shapes;
  int n_params; /* integer parameter values by name */
  const char *const *param_names;
  const int64_t *param_values;
  /* 1: only a def that needs nothing given (its parameters have defaults,
   * its inputs' dimensions are constants): otherwise NF_EUNSUPPORTED and
   * no message (`neoflow check` instantiates every such def) */
  int fixed_only;
} nf_inst_opts;

/* Instantiates def into a new graph in ctx.  Every input needs a shape
 * unless all of its dims are constants.  The def's `param` declarations
 * become graph inputs after the declared ones, with the shapes their dims
 * evaluate to (they take no nf_arg_shape); a called def must not declare
 * any.  Errors (unknown def or input,
 * sizes that disagree, failing requires, bounds, ranges, types, overflow,
 * limits) go to d with the location in the source and, for calls, the
 * call chain.  Returns NF_OK, NF_ENOENT, NF_ETYPE, NF_EBOUNDS,
 * NF_EOVERFLOW, NF_ELIMIT or NF_ENOMEM. */
int nf_module_instantiate(nf_module *m, const char *def,
                          const nf_inst_opts *opts, nf_ir_ctx *ctx,
                          nf_graph **out, nf_diag *d);

/* The names of a def's declared inputs (not its `param` declarations)
 * and integer parameters, in order (valid while m lives).  Returns the
 * count, or -1 for an unknown def. */
int nf_module_def_inputs(const nf_module *m, const char *def,
                         const char **names, int max);
int nf_module_def_params(const nf_module *m, const char *def,
                         const char **names, int max);
/* The names of a def's outputs, in order (as nf_module_def_inputs). */
int nf_module_def_outputs(const nf_module *m, const char *def,
                          const char **names, int max);

/* Initializers of trainable parameters (`param W: f32[H, I] = ...`).  The
 * module only records them; the client library fills the tensors (see
 * docs/language.md, "Parameters", for the formulas). */
typedef enum nf_init_kind {
  NF_INIT_ZEROS = 0, NF_INIT_ONES, NF_INIT_CONSTANT, NF_INIT_UNIFORM, NF_INIT_NORMAL,
  NF_INIT_XAVIER_UNIFORM, NF_INIT_XAVIER_NORMAL, NF_INIT_KAIMING_UNIFORM, NF_INIT_KAIMING_NORMAL
} nf_init_kind;

/* One `param` declaration of a def.  At instantiation each becomes a graph
 * input (NF_T_INPUT) of that name, after the def's declared inputs, in
 * statement order; its shape is in the instantiated graph. */
typedef struct nf_param_decl {
  const char *name;  /* the graph input it becomes; valid while the module lives */
  nf_init_kind init;
  double a, b;       /* arguments with defaults filled in: constant: a = V; uniform: a = LO, b = HI;
                        normal: a = MEAN, b = STD; xavier_*: a = gain (1); kaiming_*: a = slope (0); else 0 */
} nf_param_decl;

/* The param declarations of def, in statement order (at most max written to out, out may be NULL
 * when max is 0).  Returns the total count, or -1 for an unknown def. */
int nf_module_def_param_decls(const nf_module *m, const char *def, nf_param_decl *out, int max);
/* "zeros", "kaiming_uniform", ... (a static string; "?" for a value
 * outside the enum). */
const char *nf_init_name(nf_init_kind k);

/* Writes a concrete graph as a `.nf` def with constant shapes, explicit
 * reduction ranges and one element statement per tensor.  Parsing it and
 * instantiating the def gives a graph with the same canonical hash. */
int nf_graph_print(const nf_graph *g, nf_buf *out);

#endif
