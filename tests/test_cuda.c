/* test_cuda.c - the CUDA backend without a GPU, in two parts (argv[1]):
 *
 *  emu    Every library op (lib/nn.nf), the larger cases, the workloads
 *         and their training-step gradients: the GPU default schedule
 *         lowers (bind_block / bind_thread), the loop program evaluates to
 *         the interpreter's results, and its CUDA C, compiled for the host
 *         with c++ against tests/cuda_emu.h (threads as coroutines, real
 *         barriers), computes them in f32 (relative L2 error under 1e-5,
 *         integers exact).  Exit 77 (skipped) without a host C++ compiler.
 *  nvrtc  The same programs through NVRTC to cubin for sm_80 and sm_90;
 *         PTX for an architecture newer than NVRTC knows; clear errors for
 *         one it does not support.  Exit 77 without NVRTC in this build.
 *
 * Plus checks of the binding rules and of the emitted structure (both
 * parts). */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nf_cuda_rt.h"
#include "nf_lower.h"
#include "nf_nvrtc_link.h"
#include "nf_test_inst.h"

#define N_LIB ((int)(sizeof lib_cases / sizeof lib_cases[0]))
#define N_WL ((int)(sizeof workload_cases / sizeof workload_cases[0]))
#define N_BIG ((int)(sizeof big_cases / sizeof big_cases[0]))
#define N_ALL (2 * N_LIB + N_BIG + 2 * N_WL)

/* Case k of all: its label and instance (inputs, interpreter outputs). */
static const char *case_make(int k, inst *I) {
  static nf_module *nn, *wl;
  if (!nn) nn = load("nn.nf");
  if (!wl) wl = load("../examples/workloads.nf");
  if (k < N_LIB) {
    inst_make(I, nn, &lib_cases[k], 0x1234 + (uint64_t)k);
    return lib_cases[k].label;
  }
  k -= N_LIB;
  if (k < N_BIG) {
    inst_make(I, nn, &big_cases[k], 0x4321 + (uint64_t)k);
    return big_cases[k].label;
  }
  k -= N_BIG;
  if (k < N_WL) {
    inst_make(I, wl, &workload_cases[k], 0x99 + (uint64_t)k);
    return workload_cases[k].label;
  }
  k -= N_WL;
  if (k < N_WL) {
    grad_inst(I, wl, &workload_cases[k], 0x77 + (uint64_t)k);
    return "workload gradient";
  }
  k -= N_WL; /* the library's gradients (a strided convolution's data
                gradient indexes with floor divisions) */
  static char glabel[N_LIB][96];
  grad_inst(I, nn, &lib_cases[k], 0x55 + (uint64_t)k);
  snprintf(glabel[k], sizeof glabel[k], "%s gradient", lib_cases[k].label);
  return glabel[k];
}

/* The GPU default schedule's program of I's graph, built in I's context. */
static nf_lprog *gpu_lower(inst *I, const char *label) {
  nf_schedule *s = NULL;
  nf_lprog *p = NULL;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_schedule_default_gpu(I->g, 256, &s), NF_OK);
  int rc = nf_lower(I->g, s, I->ctx, &p, &err);
  ck_assert_msg(rc == NF_OK, "%s: lowering the GPU default: %s", label, nf_buf_str(&err));
  rc = nf__loop_validate(p, &err);
  ck_assert_msg(rc == NF_OK, "%s: %s", label, nf_buf_str(&err));
  nf_schedule_free(s);
  nf_buf_free(&err);
  return p;
}

/* ---- structure and rules (no compiler needed) ---- */

static const char *mm_src =
    "def mm(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(k, j)\n"
    "}\n"
    "def sq(A: f32[M, K]) -> (L: f32[]) {\n"
    "  L() +=! A(i, k) * A(i, k)\n"
    "}\n"
    "def mx(A: f32[M, K]) -> (L: f32[]) {\n"
    "  L() max=! A(i, k)\n"
    "}\n"
    "def sh(A: f32[M, K]) -> (B: f32[M, K - 1]) {\n"
    "  B(i, j) = A(i, j + 1) * 2.0\n"
    "}\n";

static nf_graph *mm_graph(nf_ir_ctx *ctx, int m, int k, int n) {
  nf_module *mod = nf_module_new();
  nf_diag *d = nf_diag_new();
  ck_assert_msg(nf_module_load_source(mod, "mm.nf", mm_src, d) == NF_OK, "%s", nf_diag_text(d));
  nf_arg_shape sh[2] = {{.rank = 2, .dims = {m, k}}, {.rank = 2, .dims = {k, n}}};
  nf_inst_opts o = {.n_shapes = 2, .shapes = sh};
  nf_graph *g = NULL;
  ck_assert_int_eq(nf_module_instantiate(mod, "mm", &o, ctx, &g, d), NF_OK);
  nf_diag_free(d);
  nf_module_free(mod);
  return g;
}

static int lower_text(nf_graph *g, nf_ir_ctx *ctx, const char *text, nf_lprog **p, nf_buf *err) {
  nf_schedule *s = NULL;
  int rc = nf_schedule_parse(text, "test", &s, err);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(err));
  rc = nf_lower(g, s, ctx, p, err);
  nf_schedule_free(s);
  return rc;
}

/* The GPU default of a large matmul: shared-memory tiles (32 x 32 outputs
 * per block, 2 x 2 per thread, the reduction staged 16 at a time). */
START_TEST(cuda_default_tiled) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = mm_graph(ctx, 100, 64, 70);
  nf_schedule *s = NULL;
  ck_assert_int_eq(nf_schedule_default_gpu(g, 256, &s), NF_OK);
  nf_buf t = NF_BUF_INIT, err = NF_BUF_INIT, src = NF_BUF_INIT;
  nf_schedule_print(s, &t);
  ck_assert_str_eq(nf_buf_str(&t),
                   "neoflow-schedule 1\nstmts 1\n"
                   "stmt 0 split i 32\nstmt 0 split i.i 2\nstmt 0 split j 32\n"
                   "stmt 0 split j.i 2\nstmt 0 split k 16\n"
                   "stmt 0 reorder i.o j.o k.o i.i.o j.i.o k.i i.i.i j.i.i\n"
                   "stmt 0 bind_block i.o\nstmt 0 bind_block j.o\n"
                   "stmt 0 bind_thread i.i.o\nstmt 0 bind_thread j.i.o\n"
                   "stmt 0 cache_read A k.o\nstmt 0 cache_read B k.o\n"
                   "stmt 0 vectorize j.i.i\nstmt 0 cache_write j.i.o\n");
  nf_lprog *p = NULL;
  ck_assert_int_eq(nf_lower(g, s, ctx, &p, &err), NF_OK);
  nf_cuda_plan plan;
  memset(&plan, 0, sizeof plan);
  ck_assert_int_eq(nf_cuda_emit(p, &src, &plan, &err), NF_OK);
  /* j does not divide into the tiles: guarded; the vector accesses run
   * where every lane of a thread's pair is in the guard */
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&src), "every lane in the guard?"));
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&src), "NF_VMOVE(float2"));
  /* the output's identity fill over the grid, then 4 x 3 blocks of 256 */
  ck_assert_int_eq(plan.n_launches, 2);
  ck_assert_uint_eq(plan.launches[1].grid, 12);
  ck_assert_uint_eq(plan.launches[1].block, 256);
  ck_assert_uint_eq(plan.launches[1].shared_bytes, 2 * 32 * 16 * 4);
  nf_cuda_plan_free(&plan);
  nf_schedule_free(s);
  nf_buf_free(&t);
  nf_buf_free(&err);
  nf_buf_free(&src);
  nf_ir_ctx_free(ctx);
}
END_TEST

START_TEST(cuda_emit_matmul) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = mm_graph(ctx, 10, 64, 700); /* 10 rows: under the tiles' 16 */
  nf_schedule *s = NULL;
  ck_assert_int_eq(nf_schedule_default_gpu(g, 256, &s), NF_OK);
  nf_buf t = NF_BUF_INIT, err = NF_BUF_INIT, src = NF_BUF_INIT;
  nf_schedule_print(s, &t);
  ck_assert_str_eq(nf_buf_str(&t), "neoflow-schedule 1\n"
                                   "stmts 1\n"
                                   "stmt 0 fuse i j\n"
                                   "stmt 0 split i.j.fused 250\n"
                                   "stmt 0 bind_block i.j.fused.o\n"
                                   "stmt 0 bind_thread i.j.fused.i\n"
                                   "stmt 0 cache_write i.j.fused.i\n");
  nf_lprog *p = NULL;
  ck_assert_int_eq(nf_lower(g, s, ctx, &p, &err), NF_OK);
  nf_cuda_plan plan;
  memset(&plan, 0, sizeof plan);
  ck_assert_int_eq(nf_cuda_emit(p, &src, &plan, &err), NF_OK);
  /* one launch: 7000 outputs in 28 blocks of 250 (a divisor: no guard),
   * accumulated in a register */
  ck_assert_int_eq(plan.n_launches, 1);
  ck_assert_uint_eq(plan.launches[0].grid, 28);
  ck_assert_uint_eq(plan.launches[0].block, 250);
  ck_assert_uint_eq(plan.launches[0].shared_bytes, 0);
  ck_assert_uint_eq(plan.scratch_bytes, 0);
  ck_assert_uint_eq(plan.n_args, 3);
  const char *c = nf_buf_str(&src);
  ck_assert_ptr_nonnull(strstr(c, "extern \"C\" __global__ void __launch_bounds__(250) nf_k0("
                                  "void *a0, void *a1, void *a2, unsigned char *scratch)"));
  ck_assert_ptr_nonnull(strstr(c, "(long long)blockIdx.x"));
  ck_assert_ptr_nonnull(strstr(c, "if (threadIdx.x < 250u)"));
  ck_assert_ptr_null(strstr(c, "7000LL")); /* no guard */
  ck_assert_ptr_nonnull(strstr(c, "float b3[1]; /* C_tile */"));
  ck_assert_ptr_null(strstr(c, "__syncthreads"));
  nf_cuda_plan_free(&plan);
  nf_schedule_free(s);
  nf_buf_free(&t);
  nf_buf_free(&err);
  nf_buf_free(&src);
  nf_ir_ctx_free(ctx);
}
END_TEST

START_TEST(cuda_bind_rules) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = mm_graph(ctx, 8, 4, 8);
  nf_lprog *p = NULL;
  nf_buf err = NF_BUF_INIT;
  /* a reduction loop bound to threads would race on the output */
  ck_assert_int_eq(lower_text(g, ctx, "neoflow-schedule 1\nstmt 0 reorder i k j\n"
                                      "stmt 0 bind_thread k\n", &p, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "bind_thread: loop 'k' is a reduction loop"));
  nf_buf_reset(&err);
  /* thread loops follow block loops directly */
  ck_assert_int_eq(lower_text(g, ctx, "neoflow-schedule 1\nstmt 0 bind_block j\n", &p, &err),
                   NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "bind_block: loop 'j' is inside loop 'i'"));
  nf_buf_reset(&err);
  ck_assert_int_eq(lower_text(g, ctx, "neoflow-schedule 1\nstmt 0 bind_thread i\n"
                                      "stmt 0 bind_block j\n", &p, &err), NF_EINVAL);
  nf_buf_reset(&err);
  ck_assert_int_eq(lower_text(g, ctx, "neoflow-schedule 1\nstmt 0 parallel i\n"
                                      "stmt 0 bind_block i\n", &p, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "already annotated"));
  nf_buf_reset(&err);
  /* blocks and threads without a tile: the init pass (64 distinct
   * elements) is spread over a grid-strided block; 8 blocks of 8 threads
   * run the products */
  ck_assert_int_eq(lower_text(g, ctx, "neoflow-schedule 1\nstmt 0 bind_block i\n"
                                      "stmt 0 bind_thread j\n", &p, &err), NF_OK);
  nf_buf src = NF_BUF_INIT;
  nf_cuda_plan plan;
  memset(&plan, 0, sizeof plan);
  ck_assert_int_eq(nf_cuda_emit(p, &src, &plan, &err), NF_OK);
  ck_assert_int_eq(plan.n_launches, 2);
  ck_assert_uint_eq(plan.launches[0].grid, 1);
  ck_assert_uint_eq(plan.launches[0].block, 64);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&src), "f_ += (long long)gridDim.x * blockDim.x"));
  ck_assert_uint_eq(plan.launches[1].grid, 8);
  ck_assert_uint_eq(plan.launches[1].block, 8);
  /* a block of more than 1024 threads is refused, with the loop named */
  nf_ir_ctx *c2 = nf_ir_ctx_new();
  nf_graph *g2 = mm_graph(c2, 4, 4, 2048);
  ck_assert_int_eq(lower_text(g2, c2, "neoflow-schedule 1\nstmt 0 bind_block i\n"
                                      "stmt 0 bind_thread j\n", &p, &err), NF_OK);
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cuda_emit(p, &src, &plan, &err), NF_ELIMIT);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "loop 'j': 2048 threads in a block"));
  ck_assert_int_eq(plan.n_launches, 0);
#if NF_HAVE_LLVM
  /* the CPU backend refuses a GPU program */
  nf_blob obj = NF_BLOB_INIT;
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cpu_compile_object(p, NULL, &obj, NULL, &err), NF_EUNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "bound to GPU blocks or threads"));
#endif
  nf_cuda_plan_free(&plan);
  nf_buf_free(&src);
  nf_buf_free(&err);
  nf_ir_ctx_free(c2);
  nf_ir_ctx_free(ctx);
}
END_TEST

/* A block whose statements share memory: the init on thread 0 into a
 * __shared__ copy, barriers between the block's statements. */
START_TEST(cuda_shared_and_barriers) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = mm_graph(ctx, 8, 16, 32);
  nf_lprog *p = NULL;
  nf_buf err = NF_BUF_INIT, src = NF_BUF_INIT;
  ck_assert_int_eq(lower_text(g, ctx, "neoflow-schedule 1\nstmt 0 bind_block i\n"
                                      "stmt 0 cache_read A i\n"
                                      "stmt 0 bind_thread j\n", &p, &err), NF_OK);
  nf_cuda_plan plan;
  memset(&plan, 0, sizeof plan);
  ck_assert_msg(nf_cuda_emit(p, &src, &plan, &err) == NF_OK, "%s", nf_buf_str(&err));
  const char *c = nf_buf_str(&src);
  ck_assert_ptr_nonnull(strstr(c, "__shared__ __align__(16) float"));
  ck_assert_ptr_nonnull(strstr(c, "__syncthreads();"));
  /* the copy is shared by the block's threads */
  ck_assert_ptr_nonnull(strstr(c, "f_ += blockDim.x"));
  ck_assert_uint_gt(plan.launches[plan.n_launches - 1].shared_bytes, 0);
  nf_cuda_plan_free(&plan);
  nf_buf_free(&src);
  nf_buf_free(&err);
  nf_ir_ctx_free(ctx);
}
END_TEST

/* f16 buffers: refused with the buffer named, nothing emitted. */
START_TEST(cuda_f16_refused) {
  static const char *src = "def h(A: f16[N]) -> (B: f16[N]) {\n  B(i) = A(i) * A(i)\n}\n";
  nf_module *mod = nf_module_new();
  nf_diag *d = nf_diag_new();
  ck_assert_msg(nf_module_load_source(mod, "h.nf", src, d) == NF_OK, "%s", nf_diag_text(d));
  nf_arg_shape sh[1] = {{.rank = 1, .dims = {64}}};
  nf_inst_opts o = {.n_shapes = 1, .shapes = sh};
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = NULL;
  ck_assert_int_eq(nf_module_instantiate(mod, "h", &o, ctx, &g, d), NF_OK);
  nf_schedule *s = NULL;
  nf_lprog *p = NULL;
  nf_buf err = NF_BUF_INIT, out = NF_BUF_INIT;
  ck_assert_int_eq(nf_schedule_default_gpu(g, 256, &s), NF_OK);
  ck_assert_int_eq(nf_lower(g, s, ctx, &p, &err), NF_OK);
  nf_cuda_plan plan;
  memset(&plan, 0, sizeof plan);
  ck_assert_int_eq(nf_cuda_emit(p, &out, &plan, &err), NF_EUNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "buffer 'A': dtype f16 is not supported"));
  ck_assert_uint_eq(out.len, 0);
  ck_assert_int_eq(plan.n_launches, 0);
  nf_schedule_free(s);
  nf_buf_free(&err);
  nf_buf_free(&out);
  nf_ir_ctx_free(ctx);
  nf_diag_free(d);
  nf_module_free(mod);
}
END_TEST

/* Without a driver the runtime says why and stays closed. */
START_TEST(cuda_rt_no_driver) {
  nf_cuda_rt *rt = (nf_cuda_rt *)1;
  nf_buf why = NF_BUF_INIT;
  setenv("NEOFLOW_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  ck_assert_int_eq(nf_cuda_rt_open(0, &rt, &why), NF_EUNSUPPORTED);
  ck_assert_ptr_null(rt);
  ck_assert_msg(strstr(nf_buf_str(&why), "no CUDA driver: cannot load /nonexistent/libcuda.so.1"),
                "%s", nf_buf_str(&why));
  /* the toolkit's stub library loads, and cuInit says it is the stub */
  const char *stub = getenv("NF_TEST_CUDA_STUB");
  if (stub && access(stub, R_OK) == 0) {
    nf_buf_reset(&why);
    setenv("NEOFLOW_LIBCUDA", stub, 1);
    ck_assert_int_eq(nf_cuda_rt_open(0, &rt, &why), NF_EUNSUPPORTED);
    ck_assert_ptr_null(rt);
    ck_assert_msg(strstr(nf_buf_str(&why), "stub"), "%s", nf_buf_str(&why));
  }
  unsetenv("NEOFLOW_LIBCUDA");
  nf_buf_free(&why);
}
END_TEST

/* ---- emulated execution ---- */

static const char *cxx(void) {
  const char *c = getenv("CXX");
  return c && *c ? c : "c++";
}

static int run_cmd(char *const argv[]) {
  pid_t pid = fork();
  if (pid == 0) {
    execvp(argv[0], argv);
    _exit(127);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int have_cxx(void) {
  char *argv[] = {(char *)cxx(), (char *)"--version", NULL};
  pid_t pid = fork();
  if (pid == 0) {
    freopen("/dev/null", "w", stdout);
    execvp(argv[0], argv);
    _exit(127);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0) return 0;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* Writes C++ source src (n bytes) to dir/name.cpp and compiles it into
 * out (dir/name.so with shared, else the executable dir/name); the
 * source's path into cpp (256 bytes). */
static void cxx_build(const char *dir, const char *name, const char *src, size_t n, int shared,
                      char *cpp, char *out) {
  snprintf(cpp, 256, "%s/%s.cpp", dir, name);
  snprintf(out, 256, "%s/%s%s", dir, name, shared ? ".so" : "");
  FILE *f = fopen(cpp, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(src, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
  char *argv[] = {(char *)cxx(), (char *)"-std=c++17", (char *)"-O1", (char *)"-w",
                  (char *)"-o", out, cpp, shared ? (char *)"-shared" : NULL,
                  (char *)"-fPIC", NULL};
  int rc = run_cmd(argv);
  ck_assert_msg(rc == 0, "%s failed (%d) on %s", cxx(), rc, cpp);
}

/* Appends the generated source with its kernels in namespace c<k> (C++
 * linkage: every case has an nf_k0) and a runner nf_run_<k>. */
static void add_case_source(nf_buf *tu, int k, const char *src, const nf_cuda_plan *plan) {
  nf_buf_printf(tu, "namespace c%d {\n", k);
  const char *q = src, *hit;
  const char *ext = "extern \"C\" ";
  while ((hit = strstr(q, ext)) != NULL) {
    nf_buf_add(tu, q, (size_t)(hit - q));
    q = hit + strlen(ext);
  }
  nf_buf_puts(tu, q);
  for (int l = 0; l < plan->n_launches; l++) {
    nf_buf_printf(tu, "static void body%d(void *v) {\n  void **a = (void **)v;\n  %s(", l,
                  plan->launches[l].name);
    for (uint32_t i = 0; i < plan->n_args; i++) nf_buf_printf(tu, "a[%u], ", i);
    nf_buf_printf(tu, "(unsigned char *)a[%u]);\n}\n", plan->n_args);
  }
  nf_buf_printf(tu, "}\nextern \"C\" int nf_run_%d(void **a) {\n", k);
  for (int l = 0; l < plan->n_launches; l++)
    nf_buf_printf(tu, "  if (nf_emu::launch(%u, %u, c%d::body%d, a)) return -1;\n",
                  plan->launches[l].grid, plan->launches[l].block, k, l);
  nf_buf_puts(tu, "  return 0;\n}\n\n");
}

static double rel_l2(const nf_array *got, const nf_array *want, int *exact_bad, char *msg,
                     size_t n) {
  double num = 0, den = 0;
  int fl = nf_dtype_is_float((nf_dtype)got->dtype);
  *exact_bad = 0;
  for (int64_t i = 0; i < want->numel; i++) {
    double w = aget(want, i), h = aget(got, i);
    if (!fl && h != w && !*exact_bad) {
      snprintf(msg, n, "element %lld: got %.17g, want %.17g", (long long)i, h, w);
      *exact_bad = 1;
    }
    if (isnan(h) && !isnan(w) && !*exact_bad) {
      snprintf(msg, n, "element %lld: NaN (unwritten?), want %.9g", (long long)i, w);
      *exact_bad = 1;
    }
    if (fl && !isnan(w) && isfinite(w)) {
      num += (h - w) * (h - w);
      den += w * w;
    }
  }
  return sqrt(num) / (sqrt(den) > 0 ? sqrt(den) : 1);
}

/* Programs under hand-written GPU schedules: blocked reductions whose
 * operands a block stages in shared memory (copies shared by the block's
 * threads, barriers around them), each thread a register tile. */
typedef struct sched_case {
  const char *label;
  tcase c;
  const char *schedule;
} sched_case;

#define TILED_MM                                                                           \
  "neoflow-schedule 1\n"                                                                   \
  "stmt 0 split i 16\nstmt 0 split j 16\nstmt 0 split i.i 4\nstmt 0 split j.i 4\n"         \
  "stmt 0 split k 8\n"                                                                     \
  "stmt 0 reorder i.o j.o k.o i.i.o j.i.o k.i i.i.i j.i.i\n"                               \
  "stmt 0 bind_block i.o\nstmt 0 bind_block j.o\n"                                         \
  "stmt 0 bind_thread i.i.o\nstmt 0 bind_thread j.i.o\n"                                   \
  "stmt 0 cache_read A k.o\nstmt 0 cache_read B k.o\nstmt 0 cache_write j.i.o\n"

/* virtual threads (nf_gpu_knobs.vthread 2): 32 x 32 outputs per block,
 * 4 x 4 per thread in two interleaved chunks of 2 x 2 per dimension,
 * each thread's register tile compact (4 x 4) */
#define VTHREAD_MM                                                                         \
  "neoflow-schedule 1\n"                                                                   \
  "stmt 0 split i 32\nstmt 0 split i.i 16\nstmt 0 split i.i.i 2\n"                         \
  "stmt 0 split j 32\nstmt 0 split j.i 16\nstmt 0 split j.i.i 2\nstmt 0 split k 8\n"       \
  "stmt 0 reorder i.o j.o k.o i.i.i.o j.i.i.o k.i i.i.o j.i.o i.i.i.i j.i.i.i\n"             \
  "stmt 0 bind_block i.o\nstmt 0 bind_block j.o\n"                                         \
  "stmt 0 bind_thread i.i.i.o\nstmt 0 bind_thread j.i.i.o\n"                               \
  "stmt 0 cache_read A k.o\nstmt 0 cache_read B k.o\nstmt 0 cache_write j.i.i.o\n"

static const sched_case sched_cases[] = {
    {"tiled matmul 64x40x48", {"mm", "mm", P0, 2, {NZ(1, 2, 64, 40), NZ(1, 2, 40, 48)}, NULL, 0, 0},
     TILED_MM},
    /* nothing divides: guarded tiles and copies */
    {"tiled matmul 50x37x45", {"mm", "mm", P0, 2, {NZ(1, 2, 50, 37), NZ(1, 2, 37, 45)}, NULL, 0, 0},
     TILED_MM},
    {"vthread matmul 64x40x48", {"mm", "mm", P0, 2, {NZ(1, 2, 64, 40), NZ(1, 2, 40, 48)}, NULL,
                                 0, 0},
     VTHREAD_MM},
    {"vthread matmul 50x37x45", {"mm", "mm", P0, 2, {NZ(1, 2, 50, 37), NZ(1, 2, 37, 45)}, NULL,
                                 0, 0},
     VTHREAD_MM},
    /* one thread tile per block, the reduction unsplit, A staged per block */
    {"matmul rows staged 24x70x33", {"mm", "mm", P0, 2, {NZ(1, 2, 24, 70), NZ(1, 2, 70, 33)}, NULL,
                                     0, 0},
     "neoflow-schedule 1\nstmt 0 split i 8\nstmt 0 bind_block i.o\nstmt 0 cache_read A i.o\n"
     "stmt 0 reorder i.o j i.i k\nstmt 0 bind_thread j\nstmt 0 bind_thread i.i\n"},
    /* the GPU default's shared-memory tiles (no schedule given) */
    {"default tiles matmul 40x50x37", {"mm", "mm", P0, 2, {NZ(1, 2, 40, 50), NZ(1, 2, 50, 37)},
                                       NULL, 0, 0}, NULL},
    {"default tiles matmul 64x20x96", {"mm", "mm", P0, 2, {NZ(1, 2, 64, 20), NZ(1, 2, 20, 96)},
                                       NULL, 0, 0}, NULL},
    {"default tiles batch_matmul 2x33x17x20", {"batch", "batch_matmul", P0, 2,
                                               {NZ(1, 3, 2, 33, 17), NZ(1, 3, 2, 17, 20)}, NULL, 0, 0},
     NULL},
    /* the GPU default's block reductions to a scalar (one block of 256
     * threads, a partial result each in shared memory) */
    {"default block sum 37x41", {"sq", "sq", P0, 1, {NZ(1, 2, 37, 41)}, NULL, 0, 0}, NULL},
    /* vector loops: the thread's 4 (or 2) outputs along j read the staged
     * row of B with one vector load and add into the register tile with
     * one vector store */
    {"vector tiled matmul 64x40x48", {"mm", "mm", P0, 2, {NZ(1, 2, 64, 40), NZ(1, 2, 40, 48)},
                                      NULL, 0, 0},
     TILED_MM "stmt 0 vectorize j.i.i\n"},
    {"vector vthread matmul 64x40x64", {"mm", "mm", P0, 2, {NZ(1, 2, 64, 40),
                                                            NZ(1, 2, 40, 64)}, NULL, 0, 0},
     VTHREAD_MM "stmt 0 vectorize j.i.i.i\n"},
    /* ... and from a global buffer, at offsets of which 3 in 4 are not
     * aligned (the scalar path) */
    {"vector shifted rows 6x9", {"sh", "sh", P0, 1, {NZ(1, 2, 6, 9)}, NULL, 0, 0},
     "neoflow-schedule 1\nstmt 0 split j 4\nstmt 0 vectorize j.i\n"},
    {"default block max 64x64", {"mx", "mx", P0, 1, {NZ(1, 2, 64, 64)}, NULL, 0, 0}, NULL},
    {"default tiles conv2d pad 1 3ch 18x20", {"conv", "conv2d", P1("pad", 1), 2,
                                              {NZ(1, 4, 1, 3, 18, 20), NZ(1, 4, 4, 3, 3, 3)}, NULL,
                                              0, 0}, NULL},
};

#define N_SCHED ((int)(sizeof sched_cases / sizeof sched_cases[0]))

/* Scheduled case k: its instance and program. */
static const char *sched_make(int k, inst *I, nf_lprog **p) {
  static nf_module *mod;
  if (!mod) {
    nf_diag *d = nf_diag_new();
    mod = nf_module_new();
    ck_assert_msg(nf_module_load_source(mod, "mm.nf", mm_src, d) == NF_OK, "%s", nf_diag_text(d));
    nf_diag_free(d);
  }
  static nf_module *nn;
  if (!nn) nn = load("nn.nf");
  const sched_case *sc = &sched_cases[k];
  int own = !strcmp(sc->c.def, "mm") || !strcmp(sc->c.def, "sq") || !strcmp(sc->c.def, "mx") ||
            !strcmp(sc->c.def, "sh");
  inst_make(I, own ? mod : nn, &sc->c, 0x5eed + (uint64_t)k);
  nf_schedule *s = NULL;
  nf_buf err = NF_BUF_INIT;
  if (sc->schedule)
    ck_assert_msg(nf_schedule_parse(sc->schedule, sc->label, &s, &err) == NF_OK, "%s",
                  nf_buf_str(&err));
  else
    ck_assert_int_eq(nf_schedule_default_gpu(I->g, 256, &s), NF_OK);
  int rc = nf_lower(I->g, s, I->ctx, p, &err);
  ck_assert_msg(rc == NF_OK, "%s: %s", sc->label, nf_buf_str(&err));
  nf_schedule_free(s);
  nf_buf_free(&err);
  return sc->label;
}

START_TEST(cuda_emulated) {
  nf_buf tu = NF_BUF_INIT, err = NF_BUF_INIT;
  const char *inc = getenv("NF_TEST_CUDA_EMU");
  ck_assert_msg(inc != NULL, "NF_TEST_CUDA_EMU (tests/cuda_emu.h) is not set");
  nf_buf_printf(&tu, "#include \"%s\"\n", inc);
  static inst I[N_ALL + N_SCHED];
  static const char *label[N_ALL + N_SCHED];
  static nf_cuda_plan plan[N_ALL + N_SCHED];
  int n_launch = 0, n_shared = 0, n_vec = 0, n_guard = 0;
  for (int k = 0; k < N_ALL + N_SCHED; k++) {
    nf_lprog *p = NULL;
    if (k < N_ALL) {
      label[k] = case_make(k, &I[k]);
      p = gpu_lower(&I[k], label[k]);
    } else {
      label[k] = sched_make(k - N_ALL, &I[k], &p);
    }
    /* the loop program itself (f64) against the interpreter, on buffers of
     * doubles (floats) and int64 (integers) */
    void *ev[MAX_IN + MAX_OUT];
    for (int j = 0; j < I[k].n_in + I[k].n_out; j++) {
      const nf_tensor *t = &I[k].g->tensors[j < I[k].n_in ? I[k].g->inputs[j]
                                                          : I[k].g->outputs[j - I[k].n_in]];
      int64_t n = nf_tensor_numel(t);
      ev[j] = calloc((size_t)(n ? n : 1), 8);
      ck_assert_ptr_nonnull(ev[j]);
      for (int64_t i = 0; j < I[k].n_in && i < n; i++) {
        if (nf_dtype_is_float((nf_dtype)t->dtype))
          ((double *)ev[j])[i] = aget(&I[k].in[j], i);
        else
          ((int64_t *)ev[j])[i] = (int64_t)aget(&I[k].in[j], i);
      }
    }
    int rc = nf__loop_eval(p, ev, &err);
    ck_assert_msg(rc == NF_OK, "%s: loop eval: %s", label[k], nf_buf_str(&err));
    for (int j = 0; j < I[k].n_out; j++) {
      const nf_tensor *t = &I[k].g->tensors[I[k].g->outputs[j]];
      int fl = nf_dtype_is_float((nf_dtype)t->dtype);
      for (int64_t i = 0; i < I[k].want[j].numel; i++) {
        double w = aget(&I[k].want[j], i);
        double h = fl ? ((double *)ev[I[k].n_in + j])[i]
                      : (double)((int64_t *)ev[I[k].n_in + j])[i];
        ck_assert_msg(h == w || (isnan(h) && isnan(w)) || fabs(h - w) <= 1e-9 * (fabs(w) + 1),
                      "%s: loop eval output %d element %lld: %.17g, want %.17g", label[k], j,
                      (long long)i, h, w);
      }
    }
    for (int j = 0; j < I[k].n_in + I[k].n_out; j++) free(ev[j]);
    nf_buf src = NF_BUF_INIT;
    memset(&plan[k], 0, sizeof plan[k]);
    rc = nf_cuda_emit(p, &src, &plan[k], &err);
    ck_assert_msg(rc == NF_OK, "%s: emit: %s", label[k], nf_buf_str(&err));
    n_launch += plan[k].n_launches;
    n_vec += strstr(nf_buf_str(&src), "== 0) NF_VMOVE(") != NULL;
    n_guard += strstr(nf_buf_str(&src), "every lane in the guard?") != NULL;
    if (k >= N_ALL && strncmp(label[k], "vector shifted", 14) != 0) {
      /* staged in shared memory, copies or fills shared, barriers */
      const char *cs = nf_buf_str(&src);
      ck_assert_msg(strstr(cs, "__shared__") && strstr(cs, "f_ += blockDim.x") &&
                        strstr(cs, "__syncthreads();"),
                    "%s:\n%s", label[k], cs);
      n_shared++;
    }
    add_case_source(&tu, k, nf_buf_str(&src), &plan[k]);
    nf_buf_free(&src);
  }
  /* one translation unit for all cases: one compiler run */
  char dir[] = "/tmp/nf-cuda-emu-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char cpp[256], so[256];
  cxx_build(dir, "all", tu.data, tu.len, 1, cpp, so);
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(h != NULL, "dlopen: %s", dlerror());
  for (int k = 0; k < N_ALL + N_SCHED; k++) {
    char sym[32], msg[512] = "";
    snprintf(sym, sizeof sym, "nf_run_%d", k);
    int (*run)(void **) = (int (*)(void **))dlsym(h, sym);
    ck_assert_ptr_nonnull(run);
    void *a[MAX_IN + MAX_OUT + 1];
    nf_array got[MAX_OUT];
    for (int j = 0; j < I[k].n_in; j++) a[j] = I[k].in[j].data;
    for (int j = 0; j < I[k].n_out; j++) {
      const nf_tensor *t = &I[k].g->tensors[I[k].g->outputs[j]];
      ck_assert_int_eq(nf_array_alloc(&got[j], (nf_dtype)t->dtype, t->rank, t->shape), NF_OK);
      if (nf_dtype_is_float((nf_dtype)t->dtype))
        for (int64_t i = 0; i < got[j].numel; i++)
          if (t->dtype == NF_F32) ((float *)got[j].data)[i] = NAN;
          else ((double *)got[j].data)[i] = NAN;
      else
        memset(got[j].data, 0x5a, (size_t)got[j].numel * nf_dtype_size((nf_dtype)t->dtype));
      a[I[k].n_in + j] = got[j].data;
    }
    void *scratch = malloc(plan[k].scratch_bytes + 1);
    ck_assert_ptr_nonnull(scratch);
    a[I[k].n_in + I[k].n_out] = scratch;
    ck_assert_int_eq(run(a), 0);
    for (int j = 0; j < I[k].n_out; j++) {
      int bad;
      double e = rel_l2(&got[j], &I[k].want[j], &bad, msg, sizeof msg);
      ck_assert_msg(!bad, "%s (case %d) output %d: %s", label[k], k, j, msg);
      ck_assert_msg(e < 1e-5, "%s (case %d) output %d: relative L2 error %.3g (over 1e-5)",
                    label[k], k, j, e);
      nf_array_free(&got[j]);
    }
    free(scratch);
    nf_cuda_plan_free(&plan[k]);
    inst_free(&I[k]);
  }
  /* the vector cases, and the default tiles where they divide, and
   * where they do not (vectorized where every lane is in the guard) */
  ck_assert_int_ge(n_vec, 4);
  ck_assert_int_ge(n_guard, 1);
  fprintf(stderr, "cuda_emulated: %d programs (%d staging in shared memory, %d with vector "
          "accesses, %d of them under guards that may cut lanes), %d launches, emulated and "
          "checked\n", N_ALL + N_SCHED, n_shared, n_vec, n_guard, n_launch);
  dlclose(h);
  unlink(so);
  unlink(cpp);
  rmdir(dir);
  nf_buf_free(&tu);
  nf_buf_free(&err);
}
END_TEST

/* The emulator is strict where a GPU would differ (cuda_emu.h): hand-written
 * kernels, one program run per mode.  0: a shared array filled, a
 * barrier, read at the neighbour below (thread 0 its own): right.  1: the same without the
 * barrier: the forward order reads what the neighbour already wrote (by
 * luck); the alternating order catches it: wrong values, exit 1.  2: a
 * barrier only odd threads reach; 3: thread 0 ends while the others wait
 * at a barrier: both reported and aborted (on a GPU they hang or are
 * undefined). */
static const char strict_src[] =
    "#include <stdlib.h>\n"
    "static int g_mode;\n"
    "static float out[4 * 64];\n"
    "__global__ void k() {\n"
    "  __shared__ float s[64];\n"
    "  unsigned t = threadIdx.x, b = blockIdx.x;\n"
    "  if (g_mode == 3 && t == 0) return;\n"
    "  s[t] = (float)(b * 100 + t);\n"
    "  if (g_mode == 0 || g_mode == 3) __syncthreads();\n"
    "  if (g_mode == 2 && t % 2) __syncthreads();\n"
    "  out[b * 64 + t] = s[t ? t - 1 : 0];\n"
    "}\n"
    "static void body(void *) { k(); }\n"
    "int main(int argc, char **argv) {\n"
    "  g_mode = atoi(argv[1]);\n"
    "  if (nf_emu::launch(4, 64, body, 0)) return 2;\n"
    "  for (unsigned b = 0; b < 4; b++)\n"
    "    for (unsigned t = 0; t < 64; t++)\n"
    "      if (out[b * 64 + t] != (float)(b * 100 + (t ? t - 1 : 0))) return 1;\n"
    "  return 0;\n"
    "}\n";

START_TEST(cuda_emu_strict) {
  const char *inc = getenv("NF_TEST_CUDA_EMU");
  ck_assert_msg(inc != NULL, "NF_TEST_CUDA_EMU (tests/cuda_emu.h) is not set");
  char dir[] = "/tmp/nf-cuda-strict-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char cpp[256], exe[256];
  nf_buf tu = NF_BUF_INIT;
  nf_buf_printf(&tu, "#include \"%s\"\n%s", inc, strict_src);
  cxx_build(dir, "strict", tu.data, tu.len, 0, cpp, exe);
  nf_buf_free(&tu);
  for (int mode = 0; mode < 4; mode++) {
    char m[2] = {(char)('0' + mode), 0};
    pid_t pid = fork();
    if (pid == 0) {
      freopen("/dev/null", "w", stderr);
      execl(exe, exe, m, (char *)NULL);
      _exit(127);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    if (mode == 0)
      ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "mode 0: status %d", st);
    else if (mode == 1)
      ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "the race ran right (status %d)", st);
    else
      ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT,
                    "mode %d: a divergent barrier was not reported (status %d)", mode, st);
  }
  unlink(exe);
  unlink(cpp);
  rmdir(dir);
}
END_TEST

/* ---- the GPU runtime through the emulated driver ---- */

/* Opens the runtime on tests/cuda_emu_driver.cc (NF_TEST_CUDA_DRIVER). */
static nf_cuda_rt *emu_rt_open(void) {
  const char *drv = getenv("NF_TEST_CUDA_DRIVER");
  ck_assert_msg(drv && *drv, "NF_TEST_CUDA_DRIVER is not set");
  setenv("NEOFLOW_LIBCUDA", drv, 1);
  nf_cuda_rt *rt = NULL;
  nf_buf why = NF_BUF_INIT;
  ck_assert_msg(nf_cuda_rt_open(0, &rt, &why) == NF_OK, "%s", nf_buf_str(&why));
  ck_assert(nf_cuda_rt_emulated(rt));
  nf_buf_free(&why);
  return rt;
}

/* Runs program p (of graph g, inputs in[]) through a bundle on rt;
 * returns the runtime's status, outputs in got[] (allocated here). */
static int emu_run(nf_cuda_rt *rt, const nf_lprog *p, const nf_graph *g, const nf_array *in,
                   nf_array *got, nf_buf *err) {
  nf_buf src = NF_BUF_INIT, bun = NF_BUF_INIT;
  nf_cuda_plan plan;
  memset(&plan, 0, sizeof plan);
  ck_assert_int_eq(nf_cuda_emit(p, &src, &plan, err), NF_OK);
  /* no cubin (NVRTC is not needed here): the emulated driver runs the source */
  ck_assert_int_eq(nf_cuda_bundle_encode(&plan, NF_CUDA_IMAGE_CUBIN, 90, NULL, 0, src.data,
                                         src.len, &bun),
                   NF_OK);
  nf_cuda_bundle b;
  ck_assert_int_eq(nf_cuda_bundle_decode(bun.data, bun.len, &b, err), NF_OK);
  nf_cuda_module *m = NULL;
  int rc = nf_cuda_module_load_bundle(rt, &b, &m, err);
  ck_assert_msg(rc == NF_OK, "load: %s", nf_buf_str(err));
  uint32_t n_in = g->n_inputs, n_out = g->n_outputs;
  uint64_t dev[MAX_IN + MAX_OUT + 1] = {0};
  for (uint32_t j = 0; j < n_in; j++) {
    size_t n = (size_t)in[j].numel * nf_dtype_size((nf_dtype)in[j].dtype);
    ck_assert_int_eq(nf_cuda_rt_alloc(rt, n, &dev[j], err), NF_OK);
    ck_assert_int_eq(nf_cuda_rt_upload(rt, dev[j], in[j].data, n, err), NF_OK);
  }
  for (uint32_t j = 0; j < n_out; j++) {
    const nf_tensor *t = &g->tensors[g->outputs[j]];
    ck_assert_int_eq(nf_array_alloc(&got[j], (nf_dtype)t->dtype, t->rank, t->shape), NF_OK);
    size_t n = (size_t)got[j].numel * nf_dtype_size((nf_dtype)t->dtype);
    ck_assert_int_eq(nf_cuda_rt_alloc(rt, n, &dev[n_in + j], err), NF_OK);
  }
  uint64_t scratch = 0;
  ck_assert_int_eq(nf_cuda_rt_alloc(rt, plan.scratch_bytes, &scratch, err), NF_OK);
  rc = nf_cuda_module_run(m, dev, n_in + n_out, scratch, err);
  if (rc == NF_OK) rc = nf_cuda_rt_sync(rt, err);
  for (uint32_t j = 0; rc == NF_OK && j < n_out; j++) {
    size_t n = (size_t)got[j].numel * nf_dtype_size((nf_dtype)got[j].dtype);
    rc = nf_cuda_rt_download(rt, got[j].data, dev[n_in + j], n, err);
  }
  for (uint32_t j = 0; j < n_in + n_out; j++) nf_cuda_rt_free(rt, dev[j]);
  nf_cuda_rt_free(rt, scratch);
  nf_cuda_module_free(m);
  nf_cuda_bundle_free(&b);
  nf_cuda_plan_free(&plan);
  nf_buf_free(&src);
  nf_buf_free(&bun);
  return rc;
}

/* The runtime's whole path on the emulated driver: bundles loaded from
 * their source, device buffers, launches, downloads, against the
 * interpreter; graph capture's rules; then a sticky launch error: the
 * context refuses every later call with the error that broke it. */
START_TEST(cuda_rt_emulated) {
  nf_cuda_rt *rt = emu_rt_open();
  ck_assert_int_eq(nf_cuda_rt_sm(rt), 90);
  nf_buf err = NF_BUF_INIT;
  /* a few library ops, one larger case (shared-memory tiles) and a
   * workload gradient: each module is one host compile */
  int pick[] = {0, 3, N_LIB / 2, N_LIB, N_LIB + N_BIG + N_WL};
  for (size_t c = 0; c < sizeof pick / sizeof pick[0]; c++) {
    inst I;
    const char *label = case_make(pick[c], &I);
    nf_lprog *p = gpu_lower(&I, label);
    nf_array got[MAX_OUT];
    int rc = emu_run(rt, p, I.g, I.in, got, &err);
    ck_assert_msg(rc == NF_OK, "%s: %s", label, nf_buf_str(&err));
    for (int j = 0; j < I.n_out; j++) {
      char msg[512] = "";
      int bad;
      double e = rel_l2(&got[j], &I.want[j], &bad, msg, sizeof msg);
      ck_assert_msg(!bad && e < 1e-5, "%s output %d: %s (relative L2 %.3g)", label, j, msg, e);
      nf_array_free(&got[j]);
    }
    inst_free(&I);
  }
  /* graph capture's rules: what it may not hold fails and invalidates
   * it (nothing captured runs); an empty capture over several streams
   * ends, joined, and its graph launches */
  ck_assert(nf_cuda_rt_graphs(rt));
  ck_assert_int_eq(nf_cuda_rt_set_streams(rt, 3, &err), NF_OK);
  ck_assert_int_eq(nf_cuda_rt_capture_begin(rt, &err), NF_OK);
  ck_assert_int_eq(nf_cuda_rt_capture_begin(rt, &err), NF_EUNSUPPORTED); /* one at a time */
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cuda_rt_sync(rt, &err), NF_EIO);
  ck_assert_msg(strstr(nf_buf_str(&err), "STREAM_CAPTURE_UNSUPPORTED"), "%s", nf_buf_str(&err));
  nf_cuda_graph *gr = NULL;
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cuda_rt_capture_end(rt, &gr, &err), NF_EIO);
  ck_assert_msg(strstr(nf_buf_str(&err), "STREAM_CAPTURE_INVALIDATED") && !gr, "%s",
                nf_buf_str(&err));
  ck_assert(!nf_cuda_rt_broken(rt));
  ck_assert_int_eq(nf_cuda_rt_capture_begin(rt, &err), NF_OK);
  ck_assert_int_eq(nf_cuda_rt_capture_end(rt, &gr, &err), NF_OK);
  ck_assert_int_eq(nf_cuda_rt_graph_launch(rt, gr, &err), NF_OK);
  ck_assert_int_eq(nf_cuda_rt_graph_launch(rt, gr, &err), NF_OK);
  ck_assert_int_eq(nf_cuda_rt_sync(rt, &err), NF_OK);
  nf_cuda_graph_free(rt, gr);
  /* the next launch fails as an illegal address would */
  setenv("NF_EMU_FAIL_LAUNCH", "1", 1);
  nf_cuda_rt_close(rt);
  rt = emu_rt_open();
  inst I;
  const char *label = case_make(0, &I);
  nf_lprog *p = gpu_lower(&I, label);
  nf_array got[MAX_OUT];
  nf_buf_reset(&err);
  int rc = emu_run(rt, p, I.g, I.in, got, &err);
  ck_assert_int_eq(rc, NF_EIO);
  ck_assert_msg(strstr(nf_buf_str(&err), "CUDA_ERROR_ILLEGAL_ADDRESS") &&
                    strstr(nf_buf_str(&err), "unusable"),
                "%s", nf_buf_str(&err));
  for (int j = 0; j < I.n_out; j++) nf_array_free(&got[j]);
  uint64_t d = 0;
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_cuda_rt_alloc(rt, 64, &d, &err), NF_EIO);
  ck_assert_msg(strstr(nf_buf_str(&err), "broke earlier"), "%s", nf_buf_str(&err));
  unsetenv("NF_EMU_FAIL_LAUNCH");
  inst_free(&I);
  nf_cuda_rt_close(rt);
  nf_buf_free(&err);
}
END_TEST

/* Reductions across the threads of a block: few outputs, each a long sum
 * (a row norm, a column max, a 4 x 4 product over 1024 terms).  The GPU
 * default gives each output a block whose threads share its terms
 * (partial results in shared memory, rfactor), and the search's knob
 * tiled = 2 asks for the same on a product; both run on the emulated
 * driver against the interpreter. */
static const char *xred_src =
    "def rowsq(X: f32[R, K]) -> (Y: f32[R]) {\n"
    "  Y(i) +=! X(i, k) * X(i, k)\n"
    "}\n"
    "def colmax(X: f32[K, C]) -> (Y: f32[C]) {\n"
    "  Y(j) max=! X(k, j)\n"
    "}\n"
    "def mm(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(k, j)\n"
    "}\n";

START_TEST(cuda_reduce_across_threads) {
  nf_module *mod = nf_module_new();
  nf_diag *d = nf_diag_new();
  ck_assert_msg(nf_module_load_source(mod, "xred.nf", xred_src, d) == NF_OK, "%s", nf_diag_text(d));
  nf_diag_free(d);
  static const libcase cases[] = {
      {"rowsq 8x4096", "rowsq", P0, 1, {NZ(1, 2, 8, 4096)}, NULL, 0, 0},
      {"colmax 2048x16", "colmax", P0, 1, {NZ(1, 2, 2048, 16)}, NULL, 0, 0},
      {"mm 4x1024x4", "mm", P0, 2, {NZ(1, 2, 4, 1024), NZ(1, 2, 1024, 4)}, NULL, 0, 0},
  };
  nf_cuda_rt *rt = emu_rt_open();
  nf_buf err = NF_BUF_INIT, text = NF_BUF_INIT;
  for (int c = 0; c < 4; c++) {
    inst I;
    inst_make(&I, mod, &cases[c < 3 ? c : 2], 0x51 + (uint64_t)c);
    nf_schedule *sch = NULL;
    if (c < 3) {
      ck_assert_int_eq(nf_schedule_default_gpu(I.g, NF_GPU_DEFAULT_THREADS, &sch), NF_OK);
    } else {
      nf_gpu_knobs kn = {.tiled = 2, .block = 128};
      ck_assert_int_eq(nf_schedule_gpu(I.g, &kn, &sch), NF_OK);
    }
    nf_buf_reset(&text);
    nf_schedule_print(sch, &text);
    ck_assert_msg(strstr(nf_buf_str(&text), "rfactor") && strstr(nf_buf_str(&text), "bind_block"),
                  "%s: not a reduction across threads:\n%s", cases[c < 3 ? c : 2].label,
                  nf_buf_str(&text));
    nf_lprog *p = NULL;
    ck_assert_msg(nf_lower(I.g, sch, I.ctx, &p, &err) == NF_OK, "%s", nf_buf_str(&err));
    nf_array got[MAX_OUT];
    int rc = emu_run(rt, p, I.g, I.in, got, &err);
    ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
    char msg[512] = "";
    int bad;
    double e = rel_l2(&got[0], &I.want[0], &bad, msg, sizeof msg);
    ck_assert_msg(!bad && e < 1e-5, "%s: %s (relative L2 %.3g)", cases[c < 3 ? c : 2].label, msg, e);
    nf_array_free(&got[0]);
    nf_schedule_free(sch);
    inst_free(&I);
  }
  nf_cuda_rt_close(rt);
  nf_buf_free(&err);
  nf_buf_free(&text);
  nf_module_free(mod);
}
END_TEST

/* Virtual threads (nf_gpu_knobs.vthread): a block's tile is dealt to its
 * threads in vt interleaved chunks per dimension.  Matmuls (one with
 * tiles that do not divide the output) and a padded convolution (tiles
 * over its rows and columns, the batch and channels as block loops) run
 * on the emulated driver against the interpreter, and each thread's
 * register tile is compact: thr_i x thr_j elements, where the bounding
 * box of its outputs' offsets would be (vt - 1) * tile / vt + thr / vt
 * per side.  A vthread that does not divide the thread's outputs is
 * lowered to one that does (4 with 2 per thread: 2; 3: none). */
static const char *vt_src =
    "import nn\n"
    "def mm(A: f32[M, K], B: f32[K, N]) -> (C: f32[M, N]) {\n"
    "  C(i, j) +=! A(i, k) * B(k, j)\n"
    "}\n"
    "def cv(I: f32[N, C, H, Wd], W: f32[K, C, 3, 3]) -> (O: f32[N, K, H, Wd]) {\n"
    "  O = conv2d<pad = 1>(I, W)\n"
    "}\n";

START_TEST(cuda_vthreads) {
  nf_module *mod = nf_module_new();
  nf_diag *d = nf_diag_new();
  ck_assert_msg(nf_module_load_source(mod, "vt.nf", vt_src, d) == NF_OK, "%s", nf_diag_text(d));
  nf_diag_free(d);
  static const libcase mm64 = {"mm 64x40x48", "mm", P0, 2, {NZ(1, 2, 64, 40), NZ(1, 2, 40, 48)},
                               NULL, 0, 0};
  static const libcase mm50 = {"mm 50x37x45", "mm", P0, 2, {NZ(1, 2, 50, 37), NZ(1, 2, 37, 45)},
                               NULL, 0, 0};
  static const libcase cv = {"conv 2x3x20x34 to 4", "cv", P0, 2,
                             {NZ(1, 4, 2, 3, 20, 34), NZ(1, 4, 4, 3, 3, 3)}, NULL, 0, 0};
  static const struct {
    const libcase *c;
    nf_gpu_knobs kn;
    int vt; /* the virtual threads lowered (after clamping) */
    const char *split; /* the schedule's virtual-thread split, NULL: none */
  } cases[] = {
      {&mm64, {.tiled = 1, .tile_i = 32, .tile_j = 32, .thr_i = 2, .thr_j = 2, .vthread = 2}, 2,
       "stmt 0 split i.i 16\nstmt 0 split i.i.i 1\n"},
      {&mm64, {.tiled = 1, .tile_i = 32, .tile_j = 16, .thr_i = 4, .thr_j = 4, .vthread = 4}, 4,
       "stmt 0 split j.i 4\nstmt 0 split j.i.i 1\n"},
      {&mm64, {.tiled = 1, .tile_i = 16, .tile_j = 32, .thr_i = 4, .thr_j = 8, .kt = 8,
               .vthread = 2}, 2, "stmt 0 split j.i 16\nstmt 0 split j.i.i 4\n"},
      {&mm50, {.tiled = 1, .tile_i = 16, .tile_j = 32, .thr_i = 4, .thr_j = 2, .vthread = 2}, 2,
       "stmt 0 split i 16\nstmt 0 split i.i 8\nstmt 0 split i.i.i 2\n"},
      {&mm50, {.tiled = 1, .tile_i = 32, .tile_j = 16, .thr_i = 4, .thr_j = 4, .vthread = 4}, 4,
       "stmt 0 split i.i 8\nstmt 0 split i.i.i 1\n"},
      {&cv, {.tiled = 1, .tile_i = 16, .tile_j = 32, .thr_i = 2, .thr_j = 4, .vthread = 2}, 2,
       "stmt 0 split h.i 8\nstmt 0 split h.i.i 1\n"},
      {&cv, {.tiled = 1, .tile_i = 16, .tile_j = 16, .thr_i = 4, .thr_j = 4, .vthread = 4}, 4,
       "stmt 0 split w.i 4\nstmt 0 split w.i.i 1\n"},
      /* clamped: 4 does not divide 2 outputs per thread; 3 divides nothing */
      {&mm64, {.tiled = 1, .tile_i = 32, .tile_j = 32, .thr_i = 2, .thr_j = 2, .vthread = 4}, 2,
       "stmt 0 split i.i 16\nstmt 0 split i.i.i 1\n"},
      {&mm64, {.tiled = 1, .tile_i = 32, .tile_j = 32, .thr_i = 3, .thr_j = 2, .vthread = 3}, 1,
       NULL},
  };
  nf_cuda_rt *rt = emu_rt_open();
  nf_buf err = NF_BUF_INIT, text = NF_BUF_INIT;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const char *label = cases[c].c->label;
    const nf_gpu_knobs *kn = &cases[c].kn;
    inst I;
    inst_make(&I, mod, cases[c].c, 0x77 + (uint64_t)c);
    ck_assert_int_eq(I.g->n_stmts, 1);
    nf_schedule *sch = NULL;
    ck_assert_int_eq(nf_schedule_gpu(I.g, kn, &sch), NF_OK);
    nf_buf_reset(&text);
    nf_schedule_print(sch, &text);
    const char *tx = nf_buf_str(&text);
    if (cases[c].split)
      ck_assert_msg(strstr(tx, cases[c].split), "%s case %zu: no '%s' in\n%s", label, c,
                    cases[c].split, tx);
    else
      ck_assert_msg(!strstr(tx, ".i.i.o"), "%s case %zu: virtual threads in\n%s", label, c, tx);
    nf_lprog *p = NULL;
    ck_assert_msg(nf_lower(I.g, sch, I.ctx, &p, &err) == NF_OK, "%s case %zu: %s\n%s", label, c,
                  nf_buf_str(&err), tx);
    ck_assert_msg(nf__loop_validate(p, &err) == NF_OK, "%s: %s", label, nf_buf_str(&err));
    /* the register tile: thr_i x thr_j, nothing of the bounding box */
    const nf_lbuf *tile = NULL;
    for (uint32_t b = 0; b < p->n_bufs; b++)
      if (p->bufs[b].name && strstr(p->bufs[b].name, "_tile")) tile = &p->bufs[b];
    ck_assert_msg(tile != NULL, "%s: no register tile", label);
    int64_t elems = 1;
    for (int k = 0; k < tile->rank; k++) elems *= tile->shape[k];
    ck_assert_int_ge(tile->rank, 2);
    ck_assert_int_eq(tile->shape[tile->rank - 2], kn->thr_i);
    ck_assert_int_eq(tile->shape[tile->rank - 1], kn->thr_j);
    ck_assert_int_eq(elems, (int64_t)kn->thr_i * kn->thr_j);
    /* the block's threads: tile / thr per side (rounded up) */
    nf_cuda_plan plan;
    nf_buf src = NF_BUF_INIT;
    memset(&plan, 0, sizeof plan);
    ck_assert_int_eq(nf_cuda_emit(p, &src, &plan, &err), NF_OK);
    ck_assert_uint_eq(plan.launches[plan.n_launches - 1].block,
                      (unsigned)(((kn->tile_i + kn->thr_i - 1) / kn->thr_i) *
                                 ((kn->tile_j + kn->thr_j - 1) / kn->thr_j)));
    nf_cuda_plan_free(&plan);
    nf_buf_free(&src);
    nf_array got[MAX_OUT];
    int rc = emu_run(rt, p, I.g, I.in, got, &err);
    ck_assert_msg(rc == NF_OK, "%s: %s", label, nf_buf_str(&err));
    char msg[512] = "";
    int bad;
    double e = rel_l2(&got[0], &I.want[0], &bad, msg, sizeof msg);
    ck_assert_msg(!bad && e < 1e-5, "%s case %zu (vthread %d): %s (relative L2 %.3g)\n%s", label,
                  c, cases[c].vt, msg, e, tx);
    nf_array_free(&got[0]);
    nf_schedule_free(sch);
    inst_free(&I);
  }
  nf_cuda_rt_close(rt);
  nf_buf_free(&err);
  nf_buf_free(&text);
  nf_module_free(mod);
}
END_TEST

/* ---- on a GPU ---- */

static nf_cuda_rt *g_rt;

/* Every program compiled for the device, run on it, against the
 * interpreter (relative L2 under 1e-5 for floats, integers exact). */
START_TEST(cuda_gpu_run) {
  nf_buf err = NF_BUF_INIT;
  int sm = nf_cuda_rt_sm(g_rt), n_launch = 0;
  for (int k = 0; k < N_ALL + N_SCHED; k++) {
    inst I;
    nf_lprog *p = NULL;
    const char *label = k < N_ALL ? case_make(k, &I) : sched_make(k - N_ALL, &I, &p);
    if (k < N_ALL) p = gpu_lower(&I, label);
    nf_blob img = {NULL, 0};
    nf_cuda_plan plan;
    nf_cuda_stats st;
    memset(&plan, 0, sizeof plan);
    int rc = nf_cuda_compile(p, sm, &img, &plan, NULL, &st, &err);
    ck_assert_msg(rc == NF_OK, "%s: sm_%d: %s", label, sm, nf_buf_str(&err));
    nf_cuda_module *m = NULL;
    rc = nf_cuda_module_load(g_rt, img.data, img.len, &plan, &m, &err);
    ck_assert_msg(rc == NF_OK, "%s: load: %s", label, nf_buf_str(&err));
    uint64_t dev[MAX_IN + MAX_OUT + 1] = {0};
    nf_array got[MAX_OUT];
    for (int j = 0; j < I.n_in; j++) {
      size_t n = (size_t)I.in[j].numel * nf_dtype_size((nf_dtype)I.in[j].dtype);
      ck_assert_int_eq(nf_cuda_rt_alloc(g_rt, n, &dev[j], &err), NF_OK);
      ck_assert_int_eq(nf_cuda_rt_upload(g_rt, dev[j], I.in[j].data, n, &err), NF_OK);
    }
    for (int j = 0; j < I.n_out; j++) {
      const nf_tensor *t = &I.g->tensors[I.g->outputs[j]];
      ck_assert_int_eq(nf_array_alloc(&got[j], (nf_dtype)t->dtype, t->rank, t->shape), NF_OK);
      size_t n = (size_t)got[j].numel * nf_dtype_size((nf_dtype)t->dtype);
      memset(got[j].data, 0xff, n); /* NaN for floats: unwritten shows */
      ck_assert_int_eq(nf_cuda_rt_alloc(g_rt, n, &dev[I.n_in + j], &err), NF_OK);
      ck_assert_int_eq(nf_cuda_rt_upload(g_rt, dev[I.n_in + j], got[j].data, n, &err), NF_OK);
    }
    uint64_t scratch = 0;
    ck_assert_int_eq(nf_cuda_rt_alloc(g_rt, plan.scratch_bytes, &scratch, &err), NF_OK);
    rc = nf_cuda_module_run(m, dev, (uint32_t)(I.n_in + I.n_out), scratch, &err);
    if (rc == NF_OK) rc = nf_cuda_rt_sync(g_rt, &err);
    ck_assert_msg(rc == NF_OK, "%s: run: %s", label, nf_buf_str(&err));
    for (int j = 0; j < I.n_out; j++) {
      char msg[512] = "";
      int bad;
      size_t n = (size_t)got[j].numel * nf_dtype_size((nf_dtype)got[j].dtype);
      ck_assert_int_eq(nf_cuda_rt_download(g_rt, got[j].data, dev[I.n_in + j], n, &err), NF_OK);
      double e = rel_l2(&got[j], &I.want[j], &bad, msg, sizeof msg);
      ck_assert_msg(!bad, "%s (case %d) output %d on the GPU: %s", label, k, j, msg);
      ck_assert_msg(e < 1e-5, "%s (case %d) output %d on the GPU: relative L2 error %.3g", label,
                    k, j, e);
      nf_array_free(&got[j]);
    }
    for (int j = 0; j < I.n_in + I.n_out; j++) nf_cuda_rt_free(g_rt, dev[j]);
    nf_cuda_rt_free(g_rt, scratch);
    n_launch += plan.n_launches;
    nf_cuda_module_free(m);
    nf_cuda_plan_free(&plan);
    free(img.data);
    inst_free(&I);
  }
  fprintf(stderr, "cuda_gpu_run: %d programs, %d launches on %s (sm_%d), checked\n",
          N_ALL + N_SCHED, n_launch, nf_cuda_rt_name(g_rt), sm);
  nf_buf_free(&err);
}
END_TEST

/* ---- NVRTC ---- */

START_TEST(cuda_nvrtc) {
  nf_buf err = NF_BUF_INIT;
  size_t total[2] = {0, 0};
  int n_launch = 0;
  for (int k = 0; k < N_ALL + N_SCHED; k++) {
    inst I;
    nf_lprog *p = NULL;
    const char *label = k < N_ALL ? case_make(k, &I) : sched_make(k - N_ALL, &I, &p);
    if (k < N_ALL) p = gpu_lower(&I, label);
    static const int sms[2] = {80, 90};
    for (int a = 0; a < 2; a++) {
      nf_blob img = {NULL, 0};
      nf_cuda_plan plan;
      nf_cuda_stats st;
      memset(&plan, 0, sizeof plan);
      int rc = nf_cuda_compile(p, sms[a], &img, &plan, NULL, &st, &err);
      ck_assert_msg(rc == NF_OK, "%s: sm_%d: %s", label, sms[a], nf_buf_str(&err));
      ck_assert_int_eq(st.ptx, 0);
      /* an ELF cubin */
      ck_assert_uint_gt(img.len, 64);
      ck_assert_int_eq(memcmp(img.data, "\177ELF", 4), 0);
      total[a] += img.len;
      if (a == 0) n_launch += plan.n_launches;
      free(img.data);
      nf_cuda_plan_free(&plan);
    }
    inst_free(&I);
  }
  fprintf(stderr, "cuda_nvrtc: %d programs, %d launches; cubin bytes sm_80 %zu, sm_90 %zu\n",
          N_ALL + N_SCHED, n_launch, total[0], total[1]);
  nf_buf_free(&err);
}
END_TEST

START_TEST(cuda_nvrtc_archs) {
  nf_ir_ctx *ctx = nf_ir_ctx_new();
  nf_graph *g = mm_graph(ctx, 16, 8, 16);
  nf_schedule *s = NULL;
  nf_lprog *p = NULL;
  nf_buf err = NF_BUF_INIT, src = NF_BUF_INIT;
  ck_assert_int_eq(nf_schedule_default_gpu(g, 256, &s), NF_OK);
  ck_assert_int_eq(nf_lower(g, s, ctx, &p, &err), NF_OK);
  nf_blob img = {NULL, 0};
  nf_cuda_plan plan;
  nf_cuda_stats st;
  memset(&plan, 0, sizeof plan);
  /* far newer than any NVRTC knows: PTX for its newest architecture */
  ck_assert_int_eq(nf_cuda_compile(p, 990, &img, &plan, &src, &st, &err), NF_OK);
  ck_assert_int_eq(st.ptx, 1);
  ck_assert_ptr_nonnull(memmem(img.data, img.len, ".entry nf_k0", 12));
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&src), "nf_k0"));
  ck_assert_int_eq(plan.n_launches, 2); /* the identity fill, the tiles */
  /* older than it supports: a clear refusal */
  ck_assert_int_eq(nf_cuda_compile(p, 20, &img, &plan, NULL, NULL, &err), NF_EUNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "sm_20 is older than this NVRTC supports"));
  ck_assert_ptr_null(img.data);
  char v[128];
  nf_cuda_codegen_version(v, sizeof v);
  ck_assert_ptr_nonnull(strstr(v, "neoflow-cuda r1 nvrtc-"));
  ck_assert_ptr_null(strstr(v, "nvrtc-none"));
  free(img.data);
  nf_cuda_plan_free(&plan);
  nf_schedule_free(s);
  nf_buf_free(&err);
  nf_buf_free(&src);
  nf_ir_ctx_free(ctx);
}
END_TEST

/* The health probe's PTX (nf_cuda_rt_probe), which no test here can run:
 * ptxas (next to NVRTC, in the toolkit's bin, or $NF_TEST_PTXAS)
 * assembles it for sm_75, sm_80 and sm_90.  Skipped with a message where
 * there is no ptxas. */
START_TEST(cuda_probe_ptx) {
  const char *ptxas = getenv("NF_TEST_PTXAS");
  if (!ptxas || !*ptxas) ptxas = "/usr/local/cuda/bin/ptxas";
  if (access(ptxas, X_OK) != 0) {
    fprintf(stderr, "cuda_probe_ptx: skipped: no ptxas at %s\n", ptxas);
    return;
  }
  char dir[] = "/tmp/nf-probe-XXXXXX", ptx[256], out[256];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(ptx, sizeof ptx, "%s/probe.ptx", dir);
  snprintf(out, sizeof out, "%s/probe.cubin", dir);
  FILE *f = fopen(ptx, "wb");
  ck_assert_ptr_nonnull(f);
  fputs(nf_cuda_rt_probe_ptx(), f);
  ck_assert_int_eq(fclose(f), 0);
  static const char *const archs[] = {"-arch=sm_75", "-arch=sm_80", "-arch=sm_90"};
  for (int i = 0; i < 3; i++) {
    char *argv[] = {(char *)ptxas, (char *)archs[i], ptx, (char *)"-o", out, NULL};
    ck_assert_msg(run_cmd(argv) == 0, "%s %s %s failed", ptxas, archs[i], ptx);
  }
  unlink(out);
  unlink(ptx);
  rmdir(dir);
}
END_TEST

/* The bundle from a socket peer or a cache file: a round trip keeps every
 * field; every truncation, and any byte of the header or launch table
 * changed to a value out of range, is NF_EFORMAT with a message, never a
 * crash or a read outside the bytes (ASan). */
START_TEST(cuda_bundle_format) {
  nf_cuda_launch ls[2] = {{"nf_k0", 12, 256, 1024}, {"nf_k1", 1, 32, 0}};
  nf_cuda_plan plan = {2, ls, 4096, 3};
  const char img[] = "\x7f" "ELF-not-really", src[] = "extern \"C\" __global__ void nf_k0() {}";
  nf_buf b = NF_BUF_INIT;
  ck_assert_int_eq(nf_cuda_bundle_encode(&plan, NF_CUDA_IMAGE_CUBIN, 90, img, sizeof img, src,
                                         strlen(src), &b),
                   NF_OK);
  nf_cuda_bundle d;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_cuda_bundle_decode(b.data, b.len, &d, &err), NF_OK);
  ck_assert_int_eq(d.plan.n_launches, 2);
  ck_assert_uint_eq(d.plan.n_args, 3);
  ck_assert_uint_eq(d.plan.scratch_bytes, 4096);
  ck_assert_str_eq(d.plan.launches[1].name, "nf_k1");
  ck_assert_uint_eq(d.plan.launches[0].grid, 12);
  ck_assert_uint_eq(d.plan.launches[0].block, 256);
  ck_assert_uint_eq(d.plan.launches[0].shared_bytes, 1024);
  ck_assert_int_eq(d.sm, 90);
  ck_assert_uint_eq(d.image_len, sizeof img);
  ck_assert(memcmp(d.image, img, sizeof img) == 0);
  ck_assert_uint_eq(d.source_len, strlen(src));
  ck_assert(memcmp(d.source, src, strlen(src)) == 0);
  nf_cuda_bundle_free(&d);
  for (size_t n = 0; n < b.len; n++) {
    char *cut = malloc(n ? n : 1);
    memcpy(cut, b.data, n);
    nf_buf_reset(&err);
    ck_assert_int_eq(nf_cuda_bundle_decode(cut, n, &d, &err), NF_EFORMAT);
    ck_assert_uint_gt(err.len, 0);
    free(cut);
  }
  /* header and launch-table bytes set to 0xff, one at a time */
  size_t table = 48 + 2 * 36;
  for (size_t i = 0; i < table; i++) {
    char *bad = malloc(b.len);
    memcpy(bad, b.data, b.len);
    if ((unsigned char)bad[i] == 0xff) {
      free(bad);
      continue;
    }
    bad[i] = (char)0xff;
    nf_buf_reset(&err);
    int rc = nf_cuda_bundle_decode(bad, b.len, &d, &err);
    /* a number may change and stay in range (then it is accepted);
     * the magic, n_launches, the kind, the lengths and the names may not */
    int number = (i >= 12 && i < 24) || (i >= 28 && i < 32) || (i >= 48 && (i - 48) % 36 >= 24);
    if (number && rc == NF_OK) {
      nf_cuda_bundle_free(&d);
    } else {
      ck_assert_msg(rc == NF_EFORMAT, "byte %zu set to 0xff: accepted", i);
      ck_assert_uint_gt(err.len, 0);
    }
    free(bad);
  }
  /* the encoder refuses what the decoder would */
  ls[1].block = 2048;
  nf_buf_reset(&b);
  ck_assert_int_eq(nf_cuda_bundle_encode(&plan, NF_CUDA_IMAGE_CUBIN, 90, img, sizeof img, NULL, 0,
                                         &b),
                   NF_EINVAL);
  nf_buf_free(&b);
  nf_buf_free(&err);
}
END_TEST

int main(int argc, char **argv) {
  const char *part = argc > 1 ? argv[1] : "emu";
  if (strcmp(part, "emu") != 0 && strcmp(part, "nvrtc") != 0 && strcmp(part, "gpu") != 0) {
    fprintf(stderr, "usage: test_cuda emu|nvrtc|gpu\n");
    return 2;
  }
  if (!strcmp(part, "emu") && !have_cxx()) {
    fprintf(stderr, "test_cuda emu: skipped: no host C++ compiler (%s)\n", cxx());
    return 77;
  }
  nf_buf why = NF_BUF_INIT;
  if (strcmp(part, "emu") != 0 && !nf_cuda_available(&why)) {
    fprintf(stderr, "test_cuda %s: skipped: %s\n", part, nf_buf_str(&why));
    nf_buf_free(&why);
    return 77;
  }
  if (!strcmp(part, "gpu") && nf_cuda_rt_open(0, &g_rt, &why) != NF_OK) {
    fprintf(stderr, "test_cuda gpu: skipped: %s\n", nf_buf_str(&why));
    nf_buf_free(&why);
    return 77;
  }
  nf_buf_free(&why);
  Suite *su = suite_create("cuda");
  TCase *tc = tcase_create("rules");
  tcase_add_test(tc, cuda_emit_matmul);
  tcase_add_test(tc, cuda_default_tiled);
  tcase_add_test(tc, cuda_bind_rules);
  tcase_add_test(tc, cuda_shared_and_barriers);
  tcase_add_test(tc, cuda_f16_refused);
  tcase_add_test(tc, cuda_bundle_format);
  if (strcmp(part, "gpu") != 0) tcase_add_test(tc, cuda_rt_no_driver);
  suite_add_tcase(su, tc);
  tc = tcase_create(part);
  tcase_set_timeout(tc, 900);
  if (!strcmp(part, "emu")) {
    tcase_add_test(tc, cuda_emulated);
    tcase_add_test(tc, cuda_emu_strict);
    tcase_add_test(tc, cuda_rt_emulated);
    tcase_add_test(tc, cuda_reduce_across_threads);
    tcase_add_test(tc, cuda_vthreads);
  } else if (!strcmp(part, "nvrtc")) {
    tcase_add_test(tc, cuda_nvrtc);
    tcase_add_test(tc, cuda_nvrtc_archs);
    tcase_add_test(tc, cuda_probe_ptx);
  } else {
    tcase_add_test(tc, cuda_gpu_run);
  }
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  /* one CUDA context, in this process (no fork per test) */
  if (!strcmp(part, "gpu")) srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  nf_cuda_rt_close(g_rt);
  return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
