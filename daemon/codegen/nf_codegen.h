/* nf_codegen.h - the CPU code generator's public interface: loop IR
 * (nf_loop.h) -> LLVM IR -> optimised object -> shared object bytes that
 * common/runtime/loader.c loads (kernel ABI: common/nf_kernel.h).
 *
 * Pipeline: nf_cpu_compile_object (llvm_backend.c, vector math from
 * vmath.c) emits an ELF relocatable object into memory; nf_cpu_link
 * (link.c) turns it into a shared object with GNU ld run as a subprocess
 * on memfds (no file is ever created on disk); nf_cpu_compile does both.
 *
 * The kernel's return codes (documented by the ABI as kernel-defined):
 *   0                     success
 *   NF_KERNEL_EABI        args->abi_version != NF_KERNEL_ABI_VERSION
 *   NF_KERNEL_ENBUF       args->n_buffers differs from the program's
 *   NF_KERNEL_ENOMEM      a heap temporary could not be allocated
 *                         (outside parallel loops; inside one the kernel
 *                         traps instead, as it cannot report)
 *
 * Thread safety: every function here may be called concurrently from
 * several threads (each call builds its own LLVM context; LLVM target
 * machines are shared through a locked pool, one user at a time, and
 * freed at process exit: do not compile while the process exits). */
#ifndef NF_CODEGEN_H
#define NF_CODEGEN_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"
#include "nf_loop.h"
#include "nf_lower.h"

#define NF_KERNEL_EABI 1
#define NF_KERNEL_ENBUF 2
#define NF_KERNEL_ENOMEM 3

/* nf_blob: nf_buf.h */

/* A code generation target.  Every string may be NULL or empty, meaning
 * the host's (LLVMGetDefaultTargetTriple, LLVMGetHostCPUName,
 * LLVMGetHostCPUFeatures).  Only x86-64 triples are supported today. */
typedef struct nf_cpu_target {
  const char *triple;   /* e.g. "x86_64-pc-linux-gnu" */
  const char *cpu;      /* e.g. "znver3", "skylake-avx512", "x86-64" */
  const char *features; /* LLVM feature string, e.g. "+avx2,+fma" */
  int opt_level;        /* 0..3 for the pass pipeline; 0 means 3 */
} nf_cpu_target;

/* Timings of one compilation in milliseconds and sizes in bytes.  Any
 * stats pointer may be NULL. */
typedef struct nf_cpu_stats {
  double irgen_ms, opt_ms, emit_ms, link_ms, total_ms;
  size_t object_bytes, so_bytes;
  uint32_t n_functions; /* kernel entry, main, outlined parallel bodies */
} nf_cpu_stats;

/* Compiles p to an ELF object (x86-64 relocatable) in *object (reset
 * first; the caller frees it with nf_blob_free).  The object defines
 * NF_KERNEL_SYMBOL (default visibility) and nothing else global; it may
 * reference libm (exp, log, tanh, erf, pow...) and libc (malloc family,
 * memcpy/memset).  Returns NF_OK, NF_EINVAL (malformed program: message
 * in err), NF_EUNSUPPORTED (f16/bf16 buffers, an unknown target), or
 * NF_EINTERNAL (LLVM verification or emission failed: message in err). */
int nf_cpu_compile_object(const nf_lprog *p, const nf_cpu_target *t,
                          nf_blob *object, nf_cpu_stats *stats, nf_buf *err);

/* Links an object produced by nf_cpu_compile_object into a shared object
 * (bytes in *shared_object) with GNU ld (NF_LD_PATH) as a subprocess:
 * memfd input and output, a version script exporting only
 * NF_KERNEL_SYMBOL, -lm, no temporary files.  ld gets timeout_ms (0: 30 s)
 * before it is killed.  Returns NF_OK, NF_EIO (spawn failed, ld failed:
 * its stderr is appended to err, timed out) or NF_ENOMEM. */
int nf_cpu_link(const void *object, size_t n, unsigned timeout_ms,
                nf_blob *shared_object, nf_buf *err);

/* Bump when lowering or code generation changes the kernels it makes for
 * the same graph and schedule: it is part of every tuning-cache key. */
#define NF_CODEGEN_REVISION 6

/* The code generator's version for cache keys (into out, n bytes):
 * "neoflow-cpu r<revision> abi<kernel ABI> llvm-<version> <host cpu>
 * f<first 16 hex digits of SHA-256 of the host's LLVM feature string>".
 * A different LLVM, CPU model or feature set is another key. */
void nf_cpu_codegen_version(char *out, size_t n);

/* What the default schedule needs of t (nf_schedule_default_for): from
 * its features; without features, the host's for the host (or no CPU
 * named), and AVX2's 16 registers for another CPU named. */
nf_sched_target nf_cpu_sched_target(const nf_cpu_target *t);

/* Both steps: p -> shared object bytes ready for nf_kernel_load. */
int nf_cpu_compile(const nf_lprog *p, const nf_cpu_target *t,
                   nf_blob *shared_object, nf_cpu_stats *stats, nf_buf *err);

#endif

/* ---- internal to daemon/codegen (llvm_backend.c <-> vmath.c) ----
 * Visible only to files that included llvm-c/Core.h first. */
#ifdef LLVM_C_CORE_H
/* Emits op (EXP, LOG, TANH, SIGMOID, ERF, SQRT, RSQRT, ABS, FLOOR, CEIL)
 * on x, a float or double scalar or vector, at the builder's position.
 * f32: inline range reduction + polynomial (no calls, no branches);
 * f64: libm calls, lane by lane for vectors.  Returns NULL for any other
 * op. */
LLVMValueRef nf__vm_unary(LLVMModuleRef m, LLVMBuilderRef b, int op, LLVMValueRef x);
/* pow(x, y) for float/double scalars or vectors (llvm.pow: libm). */
LLVMValueRef nf__vm_pow(LLVMModuleRef m, LLVMBuilderRef b, LLVMValueRef x, LLVMValueRef y);
/* NaN-propagating min/max with the interpreter's tie rule:
 * max(a, b) = (a > b || a != a) ? a : b (min with <). */
LLVMValueRef nf__vm_fminmax(LLVMBuilderRef b, int is_max, LLVMValueRef x, LLVMValueRef y);
/* llvm_target.c: sets M's target (t's triple, CPU and features; the
 * host's where NULL or empty), runs the pass pipeline of t->opt_level and
 * emits an ELF object into *object; the times of the two steps go to
 * *opt_ms and *emit_ms (may be NULL).  NF_OK, NF_EUNSUPPORTED (unknown
 * target), NF_EINTERNAL (passes or emission failed) or NF_ENOMEM, with a
 * message in err. */
int nf__llvm_optimize_emit(LLVMModuleRef M, const nf_cpu_target *t, nf_blob *object,
                           double *opt_ms, double *emit_ms, nf_buf *err);
/* Calls the overloaded intrinsic `name` (e.g. "llvm.sqrt") on args;
 * the overload types are the types of the first n_ovl arguments, or
 * ovl[] when given. */
LLVMValueRef nf__vm_intrinsic(LLVMModuleRef m, LLVMBuilderRef b, const char *name,
                              LLVMTypeRef *ovl, unsigned n_ovl, LLVMValueRef *args,
                              unsigned n_args);
#endif
