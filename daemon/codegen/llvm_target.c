/* llvm_target.c - the second half of the CPU backend: an LLVM module
 * (built by llvm_backend.c) -> optimised -> ELF object in memory, for the
 * target the caller names (the host by default).
 *
 * Pass pipelines (nf_cpu_target.opt_level; 0 means 3) and why they look
 * like this: see the comment above pipeline_o2.  Target machines are kept
 * between compilations (tm_acquire).  Thread-safe: each call works on its
 * own module and on a target machine no other call holds. */
#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <llvm/Config/llvm-config.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_codegen.h"
#include "nf_kernel.h"

/* ---- target machines ----
 *
 * Creating a target machine is cheap, but its first use for a CPU and
 * feature string builds the subtarget (instruction tables, lowering
 * tables): the machines are therefore kept.  A machine is used by one
 * compilation at a time: compilations take one from an idle list
 * (mutex-protected, keyed by triple, CPU, features and code generation
 * level) or create one, and put it back when done (at most TM_IDLE_MAX
 * idle machines are kept, the others are disposed of).  The idle machines
 * and the host's triple, CPU name and features (queried once) are freed
 * by an atexit handler; compiling while the process exits is not
 * supported. */

#define TM_IDLE_MAX 16

typedef struct tm_ent {
  struct tm_ent *next;
  LLVMTargetMachineRef tm;
  char key[]; /* "triple\ncpu\nfeatures\nlevel" */
} tm_ent;

static pthread_once_t llvm_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t tm_lock = PTHREAD_MUTEX_INITIALIZER;
static tm_ent *tm_idle;
static int n_tm_idle, tm_closed;
static char *host_triple, *host_cpu, *host_features;

static void llvm_fini(void) {
  pthread_mutex_lock(&tm_lock);
  tm_closed = 1;
  while (tm_idle) {
    tm_ent *e = tm_idle;
    tm_idle = e->next;
    LLVMDisposeTargetMachine(e->tm);
    free(e);
  }
  n_tm_idle = 0;
  LLVMDisposeMessage(host_triple);
  LLVMDisposeMessage(host_cpu);
  LLVMDisposeMessage(host_features);
  host_triple = host_cpu = host_features = NULL;
  pthread_mutex_unlock(&tm_lock);
}

static void llvm_init(void) {
  LLVMInitializeX86TargetInfo();
  LLVMInitializeX86Target();
  LLVMInitializeX86TargetMC();
  LLVMInitializeX86AsmPrinter();
  host_triple = LLVMGetDefaultTargetTriple();
  host_cpu = LLVMGetHostCPUName();
  host_features = LLVMGetHostCPUFeatures();
  atexit(llvm_fini);
}

/* A machine for (triple, cpu, feat, level): an idle one or a new one;
 * NULL when none can be created (*bad_target set when the triple is not
 * supported).  Give it back with tm_release. */
static tm_ent *tm_acquire(const char *triple, const char *cpu, const char *feat,
                          LLVMCodeGenOptLevel level, int *bad_target) {
  size_t n = strlen(triple) + strlen(cpu) + strlen(feat) + 16;
  tm_ent *e = malloc(sizeof *e + n);
  if (!e) return NULL;
  snprintf(e->key, n, "%s\n%s\n%s\n%d", triple, cpu, feat, (int)level);
  pthread_mutex_lock(&tm_lock);
  for (tm_ent **pp = &tm_idle; *pp; pp = &(*pp)->next)
    if (!strcmp((*pp)->key, e->key)) {
      tm_ent *hit = *pp;
      *pp = hit->next;
      n_tm_idle--;
      pthread_mutex_unlock(&tm_lock);
      free(e);
      hit->next = NULL;
      return hit;
    }
  pthread_mutex_unlock(&tm_lock);
  LLVMTargetRef target;
  char *msg = NULL;
  if (strncmp(triple, "x86_64", 6) != 0 || LLVMGetTargetFromTriple(triple, &target, &msg)) {
    LLVMDisposeMessage(msg);
    *bad_target = 1;
    free(e);
    return NULL;
  }
  e->next = NULL;
  e->tm = LLVMCreateTargetMachine(target, triple, cpu, feat, level, LLVMRelocPIC,
                                  LLVMCodeModelDefault);
  if (!e->tm) {
    free(e);
    return NULL;
  }
  return e;
}

static void tm_release(tm_ent *e) {
  if (!e) return;
  pthread_mutex_lock(&tm_lock);
  if (!tm_closed && n_tm_idle < TM_IDLE_MAX) {
    e->next = tm_idle;
    tm_idle = e;
    n_tm_idle++;
    e = NULL;
  }
  pthread_mutex_unlock(&tm_lock);
  if (e) {
    LLVMDisposeTargetMachine(e->tm);
    free(e);
  }
}

/* ---- pass pipelines ----
 *
 * The generated IR is already vectorized (explicit vectors), its register
 * tiles and small loop nests already unrolled (emit_loop, emit_counted):
 * what is left for LLVM is scalar cleanup, promotion of tiles and small
 * temporaries to registers (SROA, helped by loop-idiom's memsets),
 * hoisting (LICM), redundancy elimination (GVN), dead stores.  The
 * function passes run on the outlined bodies' inner functions before they
 * are inlined, while their buffer arguments are still noalias (LICM then
 * hoists gathers out of tile loops), then once more on the inlined result.
 * Neither LLVM's vectorizers nor its unroller run (the unroller alone
 * cost more than the rest of default<O2>). */
static const char *const pipeline_o1 =
    "function(sroa,early-cse,simplifycfg,instcombine),"
    "always-inline,function(instcombine,simplifycfg)";
static const char *const pipeline_o2 =
    "function(sroa,early-cse,simplifycfg,instcombine,loop-mssa(licm),"
    "loop(loop-idiom,loop-deletion),sroa,instcombine,gvn,loop-mssa(licm),dse,adce,"
    "simplifycfg,instcombine),"
    "always-inline,function(instcombine,simplifycfg)";

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Lets every function use 512-bit registers on an AVX-512 CPU.  LLVM's
 * tuning for Intel's AVX-512 cores prefers 256-bit vectors and splits an
 * explicit <16 x float> into two halves unless a function asks for the
 * wide registers ("min-legal-vector-width"); the kernels' vectors are
 * explicit (the pipelines run no auto-vectorizer), so this only keeps
 * them whole. */
static void wide_vectors(LLVMModuleRef M) {
  LLVMContextRef C = LLVMGetModuleContext(M);
  for (LLVMValueRef f = LLVMGetFirstFunction(M); f; f = LLVMGetNextFunction(f)) {
    if (LLVMIsDeclaration(f)) continue;
    LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex,
                            LLVMCreateStringAttribute(C, "min-legal-vector-width", 22, "512", 3));
  }
}

int nf__llvm_optimize_emit(LLVMModuleRef M, const nf_cpu_target *t, nf_blob *object,
                           double *opt_ms, double *emit_ms, nf_buf *err) {
  pthread_once(&llvm_once, llvm_init);
  double t1 = now_ms(), t2 = 0;
  int rc = NF_OK;
  char *msg = NULL;
  tm_ent *tme = NULL;
  LLVMPassBuilderOptionsRef opts = NULL;
  LLVMMemoryBufferRef mb = NULL;
  /* Level 0 means 3; levels 2 and 3 run the same passes (see the
   * pipelines above), level 1 a shorter list and the default code
   * generator. */
  int lvl = t && t->opt_level > 0 && t->opt_level <= 3 ? t->opt_level : 3;
  const char *triple = t && t->triple && *t->triple ? t->triple : host_triple;
  const char *cpu = t && t->cpu && *t->cpu ? t->cpu : host_cpu;
  const char *feat = t && t->cpu && *t->cpu ? (t->features ? t->features : "")
                     : t && t->features && *t->features ? t->features
                                                        : host_features;
  int bad_target = 0;
  LLVMCodeGenOptLevel cgl = lvl >= 2 ? LLVMCodeGenLevelAggressive : LLVMCodeGenLevelDefault;
  tme = tm_acquire(triple, cpu, feat, cgl, &bad_target);
  if (!tme) {
    rc = NF_EUNSUPPORTED;
    if (bad_target)
      nf_buf_printf(err, "unsupported target triple '%s'", triple);
    else
      nf_buf_printf(err, "cannot create a target machine for CPU '%s'", cpu);
    goto done;
  }
  LLVMSetTarget(M, triple);
  LLVMTargetDataRef td = LLVMCreateTargetDataLayout(tme->tm);
  LLVMSetModuleDataLayout(M, td);
  LLVMDisposeTargetData(td);
  if (strstr(feat, "+avx512f")) wide_vectors(M);
  opts = LLVMCreatePassBuilderOptions();
  LLVMErrorRef perr = LLVMRunPasses(M, lvl >= 2 ? pipeline_o2 : pipeline_o1, tme->tm, opts);
  if (perr) {
    char *em = LLVMGetErrorMessage(perr);
    nf_buf_printf(err, "LLVM passes: %s", em);
    LLVMDisposeErrorMessage(em);
    rc = NF_EINTERNAL;
    goto done;
  }
  t2 = now_ms();
  if (LLVMTargetMachineEmitToMemoryBuffer(tme->tm, M, LLVMObjectFile, &msg, &mb)) {
    nf_buf_printf(err, "LLVM emission: %s", msg ? msg : "?");
    rc = NF_EINTERNAL;
    goto done;
  }
  {
    size_t n = LLVMGetBufferSize(mb);
    object->data = malloc(n ? n : 1);
    if (!object->data) {
      nf_buf_puts(err, "out of memory");
      rc = NF_ENOMEM;
      goto done;
    }
    memcpy(object->data, LLVMGetBufferStart(mb), n);
    object->len = n;
  }
  if (opt_ms) *opt_ms = t2 - t1;
  if (emit_ms) *emit_ms = now_ms() - t2;
done:
  if (msg) LLVMDisposeMessage(msg);
  if (mb) LLVMDisposeMemoryBuffer(mb);
  if (opts) LLVMDisposePassBuilderOptions(opts);
  tm_release(tme);
  return rc;
}

nf_sched_target nf_cpu_sched_target(const nf_cpu_target *t) {
  if (t && t->features && t->features[0]) return nf_sched_target_of(t->features);
  pthread_once(&llvm_once, llvm_init);
  /* a CPU named without features: its registers are not known here (the
   * C API gives no CPU's features but the host's), so the default takes
   * the count every x86-64 vector unit has, unless it is the host */
  if (t && t->cpu && t->cpu[0] && (!host_cpu || strcmp(t->cpu, host_cpu) != 0))
    return nf_sched_target_of(NULL);
  return nf_sched_target_of(host_features);
}

void nf_cpu_codegen_version(char *out, size_t n) {
  char *cpu = LLVMGetHostCPUName();
  char *feat = LLVMGetHostCPUFeatures();
  uint8_t h[crypto_hash_sha256_BYTES];
  const char *f = feat ? feat : "";
  crypto_hash_sha256(h, (const unsigned char *)f, strlen(f));
  char hex[17];
  for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
  snprintf(out, n, "neoflow-cpu r%d abi%d llvm-%s %s f%s", NF_CODEGEN_REVISION,
           NF_KERNEL_ABI_VERSION, LLVM_VERSION_STRING, cpu ? cpu : "?", hex);
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(feat);
}
