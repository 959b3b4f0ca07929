/* neoflow/neoflow.h - libneoflow-client: train models written as `.nf`
 * tensor expressions.
 *
 * A program loads `.nf` modules (nf_model), describes what to train (a def
 * of a module, or a net built in C by applying defs: nf_net), and opens a
 * session (nf_session).  The session differentiates the loss, adds the
 * optimizer's fused update, partitions the training step into subgraphs,
 * plans memory once and trains at once on fallback kernels (tier 0: the
 * reference interpreter, OpenBLAS sgemm for matmul-shaped subgraphs).  A
 * background thread sends the subgraphs to neoflowd (started per user when
 * none answers) and swaps each better kernel in between steps, after
 * verifying it (digest, the key it answers, a canary run against the
 * kernel it replaces).  See docs/client.md for a complete example.
 *
 * Conventions: functions return 0 (NEOFLOW_OK) or a negative status
 * (NEOFLOW_E*, below; nf_strerror describes each); on error a message naming what failed and why is kept
 * on the object (nf_model_error, nf_net_error, nf_session_error) or, for
 * constructors, written to *err (malloc'd; free it with free()).  Objects
 * are not thread-safe: one thread uses a session at a time (the library's
 * own background thread is internal).  Tensor data is dense row-major in
 * the tensor's dtype (f32: float).  The library never writes to stdout or
 * stderr: a session's warnings and notes go to the log callback of its
 * options. */
#ifndef NEOFLOW_NEOFLOW_H
#define NEOFLOW_NEOFLOW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NF_API __attribute__((visibility("default")))
#else
#define NF_API
#endif

#define NEOFLOW_VERSION_MAJOR 0
#define NEOFLOW_VERSION_MINOR 10

/* Status codes: 0 or negative, the same numbers as the rest of NeoFlow
 * (a build check keeps them equal).  nf_strerror gives a one-line
 * description of each; the message of the failure itself is on the
 * object (nf_model_error, nf_net_error, nf_session_error) or in *err. */
#define NEOFLOW_OK 0
#define NEOFLOW_ENOMEM (-1)        /* out of memory */
#define NEOFLOW_EINVAL (-2)        /* invalid argument (a bad option, name, shape) */
#define NEOFLOW_ESYNTAX (-3)       /* a .nf syntax error */
#define NEOFLOW_ETYPE (-4)         /* a type or shape error */
#define NEOFLOW_ENOENT (-5)        /* no such file, definition or tensor */
#define NEOFLOW_EIO (-6)           /* input/output error */
#define NEOFLOW_EFORMAT (-7)       /* a malformed file (parameters, dataset) */
#define NEOFLOW_EBOUNDS (-8)       /* an index out of bounds (a gather's index data) */
#define NEOFLOW_EOVERFLOW (-9)     /* arithmetic overflow (sizes) */
#define NEOFLOW_ERANGE (-10)       /* a value out of range; a wait that timed out */
#define NEOFLOW_ELIMIT (-11)       /* an implementation limit exceeded */
#define NEOFLOW_EUNSUPPORTED (-12) /* not supported (in this build, on this device) */
#define NEOFLOW_EINTERNAL (-13)    /* an internal error (a bug: please report it) */
#define NEOFLOW_EPERM (-14)        /* refused: not trusted */
#define NEOFLOW_EREJECTED (-15)    /* an artifact rejected (a kernel failed its checks) */
NF_API const char *nf_strerror(int status);

/* Levels of the messages a session gives its log callback
 * (nf_session_opts.log). */
#define NEOFLOW_LOG_WARN 1 /* something went worse than asked: a kernel
                              rejected, the daemon lost, no GPU */
#define NEOFLOW_LOG_INFO 2 /* what the session chose: the device, its libraries */

/* Element types (the same values as the IR's nf_dtype). */
typedef enum nf_elem {
  NF_ELEM_BOOL = 0, NF_ELEM_I32 = 1, NF_ELEM_I64 = 2, NF_ELEM_F16 = 3, NF_ELEM_BF16 = 4,
  NF_ELEM_F32 = 5, NF_ELEM_F64 = 6
} nf_elem;

/* ---- models: loaded .nf files ---- */

typedef struct nf_model nf_model;

/* Loads a `.nf` file and its imports (`import nn` finds the standard
 * library through $NEOFLOW_LIB or the installed data directory).  NULL on
 * error with the diagnostics (file:line:col: error: ...) in *err. */
NF_API nf_model *nf_model_load(const char *path, char **err);
/* The same from text; name is used in messages. */
NF_API nf_model *nf_model_load_source(const char *name, const char *text, char **err);
NF_API void nf_model_free(nf_model *m);

/* ---- initializers ---- */

typedef enum nf_init_fn {
  NF_INIT_FN_ZEROS = 0, NF_INIT_FN_ONES, NF_INIT_FN_CONSTANT, NF_INIT_FN_UNIFORM,
  NF_INIT_FN_NORMAL, NF_INIT_FN_XAVIER_UNIFORM, NF_INIT_FN_XAVIER_NORMAL,
  NF_INIT_FN_KAIMING_UNIFORM, NF_INIT_FN_KAIMING_NORMAL,
  NF_INIT_FN_BUFFER /* copy `data` (numel floats) */
} nf_init_fn;

typedef struct nf_init {
  nf_init_fn fn;
  double a, b;       /* constant: a; uniform: [a, b); normal: mean a, std b;
                        xavier: gain a (0 means 1); kaiming: slope a */
  const float *data; /* NF_INIT_FN_BUFFER */
} nf_init;

/* ---- nets: graphs built in C by applying defs ---- */

/* A net is a def written for the caller: inputs, parameters and the
 * results of applying the model's defs (`linear`, `relu`, any user def) to
 * them.  Tensors are small integer handles (>= 0).  The net is checked
 * when a session is opened on it (errors name the step of the net). */
typedef struct nf_net nf_net;

NF_API nf_net *nf_net_new(nf_model *m);
NF_API void nf_net_free(nf_net *n);
NF_API const char *nf_net_error(const nf_net *n);
/* A data input (fed with nf_session_feed). */
NF_API int nf_net_input(nf_net *n, const char *name, nf_elem t, int rank, const int64_t *dims);
/* A trainable parameter with its initializer (float types only). */
NF_API int nf_net_param(nf_net *n, const char *name, nf_elem t, int rank, const int64_t *dims,
                 nf_init init);
/* Applies def to the tensors in[0..n_in) with integer parameters
 * (names[i] = values[i]), writing the handles of its n_out results to
 * out.  Returns NEOFLOW_OK or an error (unknown def, arity). */
NF_API int nf_net_apply(nf_net *n, const char *def, int n_iparams, const char *const *inames,
                 const int64_t *ivalues, int n_in, const int *in, int n_out, int *out);
/* Declares the scalar f32 loss the session minimises (exactly once). */
NF_API int nf_net_loss(nf_net *n, int tensor);
/* Makes a tensor readable by name after each step (nf_session_read). */
NF_API int nf_net_output(nf_net *n, const char *name, int tensor);
/* Asks for the gradient of the loss with respect to tensor (an input or
 * a parameter), readable after each step as "grad_" + its name.  The
 * session always forms the parameters' gradients; this exposes them (and
 * input gradients) to the program. */
NF_API int nf_grad(nf_net *n, int wrt);
/* The `.nf` text the net stands for (for messages and debugging); valid
 * until the net changes. */
NF_API const char *nf_net_source(nf_net *n);

/* ---- optimizers ---- */

typedef enum nf_optim_kind { NF_OPTIM_SGD = 0, NF_OPTIM_ADAM, NF_OPTIM_ADAMW } nf_optim_kind;

/* The update of every parameter is one `.nf` expression (lib/optim.nf)
 * over all parameters laid out in one vector, fused into one update
 * kernel that updates parameters and state in place.  Zero fields take
 * PyTorch's defaults: momentum 0, beta1 0.9, beta2 0.999, eps 1e-8,
 * weight_decay 0 (AdamW: 0.01). */
typedef struct nf_optimizer {
  nf_optim_kind kind;
  double lr;
  double momentum;     /* SGD */
  double beta1, beta2, eps;
  double weight_decay; /* SGD, Adam: L2 added to the gradient; AdamW: decoupled */
} nf_optimizer;

/* ---- sessions ---- */

typedef struct nf_session nf_session;

typedef struct nf_session_opts {
  nf_optimizer optim;
  int threads;          /* 0: the machine's cores */
  uint64_t seed;        /* parameter initialisation */
  const char *daemon;   /* NULL: $NEOFLOW_SOCKET, else the per-user default;
                           "none": no daemon (tier 0 only) */
  int no_spawn;         /* do not start a per-user neoflowd when none answers */
  int compile_only;     /* ask for default kernels only (no tuning) */
  int tune_trials;      /* per subgraph; 0: the daemon's default (capped by its config) */
  int tune_seconds;     /* per subgraph; 0: the daemon's default */
  /* Integer parameters of a def (e.g. <batch = 64>) and shapes of inputs
   * with symbolic sizes, for nf_session_new_def. */
  int n_iparams;
  const char *const *inames;
  const int64_t *ivalues;
  int n_shapes;
  const char *const *shape_names;
  const int *shape_ranks;
  const int64_t *const *shape_dims;
  /* Inputs of the def to train as parameters besides its `param`
   * declarations (defs written with their weights as inputs, like
   * examples/workloads.nf), initialised like PyTorch's default for linear
   * and convolution weights: kaiming_uniform with a = sqrt(5), i.e.
   * U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
  int n_trainable;
  const char *const *trainable;
  int quiet;            /* no messages to the log callback */
  /* Where steps run: NULL or "cpu" (default: $NEOFLOW_DEVICE, else the
   * CPU), "cuda" or "cuda:N" (GPU N).  Without a usable GPU the session
   * warns and trains on the CPU.  docs/gpu.md. */
  const char *device;
  /* Whom to take kernels from (docs/security.md), besides the user's
   * configuration file ($NEOFLOW_CONFIG, else
   * ~/.config/neoflow/client.conf): by default only a daemon running as
   * the program's own user.  Each entry of trust is "uid:NAME" or
   * "uid:NUMBER" (a shared daemon's user, for a Unix socket) or
   * "ed25519:<64 hex digits>" (a daemon's public key, needed for TCP), or
   * the path of a file holding such a key. */
  const char *daemon_key;   /* TCP: the shared key file (neoflowd's [tcp]
                               key_file); NULL: the configuration's */
  int n_trust;
  const char *const *trust;
  /* Where the session's messages go (the library never prints): each
   * warning and note, one line without a newline, with its level
   * (NEOFLOW_LOG_*).  Called from the program's thread or the library's
   * background threads, one call at a time per session; it must not call
   * into the session.  NULL: messages are dropped.  A program that wants
   * them on stderr passes a function that writes them there, as the
   * neoflow tool does ("neoflow: warning: ..."). */
  void (*log)(void *log_user, int level, const char *message);
  void *log_user;
} nf_session_opts;

/* A session training def of m: its first output is the scalar f32 loss;
 * its `param` declarations are the parameters (initialised from their
 * initializers with opts->seed); its other inputs are fed each step. */
NF_API nf_session *nf_session_new_def(nf_model *m, const char *def, const nf_session_opts *opts,
                               char **err);
/* A session training a net. */
NF_API nf_session *nf_session_new_net(nf_net *n, const nf_session_opts *opts, char **err);
/* Stops the background thread, closes the daemon connection, frees all. */
NF_API void nf_session_free(nf_session *s);
NF_API const char *nf_session_error(const nf_session *s);

/* Inputs and parameters: names, element types and shapes. */
NF_API int nf_session_n_inputs(const nf_session *s);
NF_API int nf_session_n_params(const nf_session *s);
/* Describes input or parameter i: name, element type, rank, dims (up to 8). */
NF_API int nf_session_input_info(const nf_session *s, int i, const char **name, nf_elem *t, int *rank,
                          int64_t dims[8]);
NF_API int nf_session_param_info(const nf_session *s, int i, const char **name, nf_elem *t, int *rank,
                          int64_t dims[8]);

/* The forward outputs: 0 is the loss, then the def's outputs after it (or
 * the net's nf_net_output tensors), readable after a step or an eval. */
NF_API int nf_session_n_outputs(const nf_session *s);
NF_API int nf_session_output_info(const nf_session *s, int i, const char **name, nf_elem *t,
                                  int *rank, int64_t dims[8]);

/* Copies an input's data for the next steps (bytes must equal its size). */
NF_API int nf_session_feed(nf_session *s, const char *input, const void *data, size_t bytes);
/* One training step on the fed inputs: forward, gradients, update.
 * *loss (may be NULL) gets the step's loss (before the update). */
NF_API int nf_session_step(nf_session *s, double *loss);
/* The forward pass only, on the fed inputs and the current parameters:
 * the loss (*loss, may be NULL) and the outputs declared after it (or with
 * nf_net_output), readable with nf_session_read; no gradient, no update,
 * and the step count is unchanged (evaluation, e.g. test accuracy).
 * Gradients read afterwards may hold partial values: read them after a
 * step. */
NF_API int nf_session_eval(nf_session *s, double *loss);
/* Copies a parameter, an output declared with nf_net_output, the loss
 * ("loss" or its name) or a gradient ("grad_" + name) of the last step. */
NF_API int nf_session_read(nf_session *s, const char *name, void *data, size_t bytes);
/* Sets a parameter from a buffer (e.g. pretrained weights). */
NF_API int nf_session_set_param(nf_session *s, const char *name, const float *data, size_t n);
/* Changes the learning rate for the next steps (schedules). */
NF_API int nf_session_set_lr(nf_session *s, double lr);

/* Parameters on disk (docs/client.md "Parameter files"): written to a
 * temporary file, fsynced and renamed; loading checks every name, type,
 * shape and the trailing SHA-256 before changing anything. */
NF_API int nf_session_save(nf_session *s, const char *path);
NF_API int nf_session_load(nf_session *s, const char *path);

typedef struct nf_session_stats {
  int64_t step;          /* steps done */
  double loss;           /* of the last step */
  double ms;             /* wall time of the last step */
  double ms_avg;         /* average over the last 10 steps */
  int kernels;           /* distinct subgraph kernels */
  int tier1, tier2;      /* of them, running a daemon kernel / a tuned one */
  int blas;              /* running OpenBLAS (tier 0, or kept: blas_kept) */
  int tuning;            /* kernels still being tuned by the daemon */
  int64_t trials, trials_max; /* tuning progress over those kernels */
  int connected;         /* to a daemon now */
  int64_t reconnects;    /* connections made after the first */
  int64_t rejected;      /* kernels refused (digest, key, load, canary) */
  int64_t swaps;         /* kernels swapped in */
  int64_t trusted;       /* of them, without a canary: the same bytes passed
                            one for the same key on this machine before */
  double first_step_ms;  /* from session start to the end of step 1 */
  int blas_kept;         /* of blas: entries whose daemon kernel arrived but
                            OpenBLAS ran faster (measured, alternating, after
                            each swap); not counted in tier1/tier2 */
  int generated;         /* GPU sessions: running a kernel the session
                            generated itself (tier 0 for subgraphs no
                            library takes, until the daemon's arrives) */
  int64_t graph_runs;    /* GPU sessions: steps and evaluations replayed
                            as one CUDA graph */
  int tier0_kept;        /* entries whose daemon kernel arrived but ran slower
                            than tier 0 (OpenBLAS or the interpreter) on this
                            machine: measured on the step's data, or
                            remembered from an earlier session; they run tier
                            0 (blas_kept counts the OpenBLAS ones) */
  int64_t remembered;    /* of trusted: kernels whose speed against tier 0
                            was on record, so not measured again */
} nf_session_stats;

NF_API int nf_session_stats_get(const nf_session *s, nf_session_stats *st);

/* The training report (docs/report.md): one self-contained HTML page
 * (inline SVG, no script, nothing fetched) with the step time over the
 * run, its tier mix and each kernel's arrival, the loss and the noted
 * metrics, the partitioned training graph, each entry's tuning curve and
 * the per-kernel profile.  The session keeps what it shows as it runs,
 * in bounded memory, from its first step on.
 *
 * nf_session_report_to: the page is written to path (NULL: no longer)
 * every every_s seconds (<= 0: 60) at the end of a step, and when the
 * session is freed.  nf_session_report: written now, to path (NULL: the
 * one set), atomically (a temporary file renamed over it); NEOFLOW_EIO
 * with the reason in nf_session_error.  nf_session_note: value of metric
 * (at most 47 bytes, e.g. "test accuracy") at the current step, shown as
 * a chart of its own (up to 8 metrics). */
NF_API int nf_session_report_to(nf_session *s, const char *path, double every_s);
NF_API int nf_session_report(nf_session *s, const char *path);
NF_API int nf_session_note(nf_session *s, const char *metric, double value);

/* The size in bytes of this library's nf_session_opts ("opts"),
 * nf_session_stats ("stats"), nf_optimizer ("optimizer") or nf_view
 * ("view"); 0 for another name.  For bindings that mirror the structures (the Python package
 * checks its own against these when it loads the library). */
NF_API size_t nf_session_abi_size(const char *what);
/* Same as nf_session_stats_get (the name the docs use). */
#define nf_session_stats(s, st) nf_session_stats_get((s), (st))

/* Waits (up to timeout_ms; <= 0: no limit) until every kernel has its
 * final daemon kernel or the daemon gave up; steps are not run meanwhile,
 * kernels that arrived are swapped in at the next step.  0 when all are
 * final, NEOFLOW_ERANGE on timeout.  For tests, benchmarks
 * and the demo. */
NF_API int nf_session_wait_kernels(nf_session *s, int timeout_ms, int want_tier);

/* ---- operators: one def run on the caller's buffers ---- */

/* A tensor of the caller's: dense row-major elements of type elem, shape
 * dims[0..rank) (rank <= 7).  data may be any address the element type
 * allows; it is read or written only during the call that takes it. */
typedef struct nf_view {
  void *data;
  nf_elem elem;
  int rank;
  int64_t dims[8];
} nf_view;

/* An operator: def of m as a function of its inputs, run forward and
 * backward on the caller's buffers (bindings such as Python's
 * neoflow.torch.op build framework operators on it; docs/client.md,
 * "Operators").  Its inputs are the def's declared inputs then its
 * `param` declarations, in order; its outputs the def's, in order.
 *
 * Each combination of input shapes and element types seen for the first
 * time is specialised: the def is instantiated for those shapes (sizes
 * not fixed by opts->n_iparams come from them), differentiated with
 * respect to its float inputs (expression autodiff), both graphs
 * partitioned, and the subgraphs run at once on fallback kernels while
 * the daemon compiles and tunes them, swapped as they arrive, exactly as
 * a session's.  Up to NF_OPERATOR_SPECS specialisations are kept (the
 * least recently used is dropped, with its daemon connection).
 *
 * Element types: a def declared in f32 given f64 tensors runs in f64
 * throughout (each f32 of the def becomes f64: for gradient checks);
 * other types must match the declaration.
 *
 * Options as a session's: integer parameters, threads, daemon, no_spawn,
 * compile_only, tune_*, device (the CPU only for now: a GPU device is
 * refused), trust, daemon_key, quiet, log.  The optimizer, seed, shapes
 * and trainable fields are ignored.  One thread at a time per operator
 * (calls from several threads are serialised). */
typedef struct nf_operator nf_operator;
#define NF_OPERATOR_SPECS 16

NF_API nf_operator *nf_operator_new(nf_model *m, const char *def, const nf_session_opts *opts,
                                    char **err);
NF_API void nf_operator_free(nf_operator *op);
NF_API const char *nf_operator_error(const nf_operator *op);
NF_API int nf_operator_n_inputs(const nf_operator *op);
NF_API int nf_operator_n_outputs(const nf_operator *op);
/* The name of input or output i (NULL when out of range). */
NF_API const char *nf_operator_input_name(const nf_operator *op, int i);
NF_API const char *nf_operator_output_name(const nf_operator *op, int i);
/* The element types and shapes of the outputs for inputs in[0..n_inputs)
 * (their data unused): out[j].elem, rank and dims are written, data left
 * alone.  Specialises for the inputs' shapes when new; errors (a shape the
 * def refuses, a wrong element type or rank) name the input. */
NF_API int nf_operator_shapes(nf_operator *op, const nf_view *in, nf_view *out);
/* Runs the def: reads in[0..n_inputs), writes out[0..n_outputs), whose
 * element types and shapes must be nf_operator_shapes' answer, and which
 * must not overlap the inputs.  *saved (may be NULL) gets a token naming
 * this run for nf_operator_backward. */
NF_API int nf_operator_forward(nf_operator *op, const nf_view *in, nf_view *out, uint64_t *saved);
/* The gradients of the inputs given those of the outputs (vector-Jacobian
 * products): reads in[0..n_inputs) and dout[0..n_outputs) (the outputs'
 * types and shapes; a NULL data is a zero gradient), writes din[i] for
 * each float input i whose din[i].data is not NULL (the input's type and
 * shape); only the gradients asked for are computed.  The forward values
 * the gradients read (PyTorch's saved tensors) are kept from the forward
 * named by saved when it was the last forward of these shapes and its
 * inputs, the same as in, have not changed since; otherwise (saved 0, or
 * another forward of these shapes since) the forward runs again first.
 * A def whose gradient cannot be formed (a float-to-integer cast on the
 * way) runs forward; its backward is NEOFLOW_EUNSUPPORTED, saying why. */
NF_API int nf_operator_backward(nf_operator *op, uint64_t saved, const nf_view *in,
                                const nf_view *dout, nf_view *din);
/* Statistics summed over the specialisations kept (step: forward and
 * backward runs; connected: whether any is; ms_avg: their mean; loss,
 * first_step_ms: 0). */
NF_API int nf_operator_stats(const nf_operator *op, nf_session_stats *st);
/* nf_session_wait_kernels over every specialisation kept (other calls of
 * the operator wait meanwhile). */
NF_API int nf_operator_wait_kernels(nf_operator *op, int timeout_ms, int want_tier);

/* ---- data: IDX files and MNIST-style datasets ---- */

/* IDX element types (the format's type codes). */
enum { NF_IDX_U8 = 0x08, NF_IDX_I8 = 0x09, NF_IDX_I16 = 0x0B, NF_IDX_I32 = 0x0C,
       NF_IDX_F32 = 0x0D, NF_IDX_F64 = 0x0E };

typedef struct nf_idx {
  int type;            /* NF_IDX_* */
  int rank;            /* 1..8 */
  int64_t dims[8];
  void *data;          /* the elements, row-major, in the host's byte order */
  size_t bytes;
} nf_idx;

/* Reads an IDX file, gzip-compressed or not.  A missing, truncated,
 * malformed or over-long file is an error whose message (in *err) names
 * the file and the fault. */
NF_API int nf_idx_load(const char *path, nf_idx *out, char **err);
NF_API void nf_idx_free(nf_idx *x);

/* Where Debian's dataset-fashion-mnist package puts the files. */
#define NF_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
/* The training split's pixel mean and standard deviation (of x / 255). */
#define NF_FASHION_MNIST_MEAN 0.2860
#define NF_FASHION_MNIST_STD 0.3530

typedef struct nf_dataset {
  int64_t n, rows, cols;
  int64_t classes;     /* the largest label + 1 */
  float *images;       /* n x rows x cols: (x / 255 - mean) / std */
  int64_t *labels;     /* n */
} nf_dataset;

/* Loads an MNIST-style split from dir (NULL: NF_FASHION_MNIST_DIR):
 * split "train" reads train-{images-idx3,labels-idx1}-ubyte[.gz], "test"
 * the t10k- files.  Pixels are normalised with Fashion-MNIST's training
 * statistics. */
NF_API int nf_dataset_mnist_load(const char *dir, const char *split, nf_dataset *out, char **err);
NF_API void nf_dataset_free(nf_dataset *d);

#ifdef __cplusplus
}
#endif

#endif
