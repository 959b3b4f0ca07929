/* vmath.c - vector (and scalar) math emitted as LLVM IR for the CPU
 * backend: exp, log, tanh, sigmoid and erf by range reduction and
 * polynomials for f32 (scalars or <W x float>), straight-line code with
 * selects only (no calls, no branches), so a vector loop stays a vector
 * loop; sqrt, rsqrt, abs, floor, ceil through LLVM intrinsics; f64 through
 * libm calls (lane by lane for vectors).
 *
 * Accuracy (f32, checked against libm in tests/test_codegen.c over dense
 * sweeps): about 1e-7..5e-7 relative on the whole domain; specials as in
 * C99: exp(-inf)=0, exp(+inf)=inf, exp overflows to inf beyond 88.72 and
 * underflows gradually through denormals to 0; log(0)=-inf, log(x<0)=NaN,
 * log(inf)=inf, denormal inputs are exact-scaled; tanh/sigmoid/erf
 * saturate to +-1 / 0..1; NaN in -> NaN out everywhere.
 *
 * Sources of the polynomials: Cephes (expf, logf, tanhf), the Taylor
 * series of erf on |x| < 1 and Abramowitz & Stegun 7.1.26 beyond. */
#include <llvm-c/Core.h>
#include <math.h>
#include <string.h>

#include "nf_codegen.h"
#include "nf_ir.h"

/* ---- small helpers ---- */

static LLVMTypeRef scalar_of(LLVMTypeRef t) {
  return LLVMGetTypeKind(t) == LLVMVectorTypeKind ? LLVMGetElementType(t) : t;
}

static unsigned lanes_of(LLVMTypeRef t) {
  return LLVMGetTypeKind(t) == LLVMVectorTypeKind ? LLVMGetVectorSize(t) : 0;
}

static LLVMValueRef splat(LLVMTypeRef like, LLVMValueRef s) {
  unsigned w = lanes_of(like);
  if (!w) return s;
  LLVMValueRef el[64];
  for (unsigned i = 0; i < w; i++) el[i] = s;
  return LLVMConstVector(el, w);
}

static LLVMValueRef cf(LLVMTypeRef t, double v) {
  return splat(t, LLVMConstReal(scalar_of(t), v));
}

static LLVMTypeRef int_like(LLVMTypeRef t) {
  LLVMTypeRef i32 = LLVMInt32TypeInContext(LLVMGetTypeContext(t));
  unsigned w = lanes_of(t);
  return w ? LLVMVectorType(i32, w) : i32;
}

static LLVMValueRef ci(LLVMTypeRef t, int64_t v) {
  return splat(t, LLVMConstInt(scalar_of(t), (unsigned long long)v, 1));
}

LLVMValueRef nf__vm_intrinsic(LLVMModuleRef m, LLVMBuilderRef b, const char *name,
                              LLVMTypeRef *ovl, unsigned n_ovl, LLVMValueRef *args,
                              unsigned n_args) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  NF_ASSERT(id != 0);
  LLVMTypeRef tys[4];
  NF_ASSERT(n_ovl <= 4);
  for (unsigned i = 0; i < n_ovl; i++) tys[i] = ovl ? ovl[i] : LLVMTypeOf(args[i]);
  LLVMValueRef fn = LLVMGetIntrinsicDeclaration(m, id, tys, n_ovl);
  LLVMTypeRef fty = LLVMIntrinsicGetType(LLVMGetModuleContext(m), id, tys, n_ovl);
  return LLVMBuildCall2(b, fty, fn, args, n_args, "");
}

static LLVMValueRef intr1(LLVMModuleRef m, LLVMBuilderRef b, const char *name,
                          LLVMValueRef x) {
  return nf__vm_intrinsic(m, b, name, NULL, 1, &x, 1);
}

static LLVMValueRef sel(LLVMBuilderRef b, LLVMValueRef c, LLVMValueRef x, LLVMValueRef y) {
  return LLVMBuildSelect(b, c, x, y, "");
}

#define FADD(x, y) LLVMBuildFAdd(b, (x), (y), "")
#define FSUB(x, y) LLVMBuildFSub(b, (x), (y), "")
#define FMUL(x, y) LLVMBuildFMul(b, (x), (y), "")
#define FDIV(x, y) LLVMBuildFDiv(b, (x), (y), "")
#define FCMP(p, x, y) LLVMBuildFCmp(b, (p), (x), (y), "")

static LLVMValueRef isnan_(LLVMBuilderRef b, LLVMValueRef x) {
  return FCMP(LLVMRealUNO, x, x);
}

/* Horner: c[0] + x*(c[1] + x*(...)) with n coefficients. */
static LLVMValueRef horner(LLVMBuilderRef b, LLVMValueRef x, const double *c, int n) {
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef y = cf(t, c[n - 1]);
  for (int i = n - 2; i >= 0; i--) y = FADD(FMUL(y, x), cf(t, c[i]));
  return y;
}

/* The NaN test is the first operand of the `or`: the order in which the
 * x86 backend turns it into maxss/minss and one blend (the other order
 * costs a compare and a second blend on the dependency chain of a max/min
 * reduction). */
LLVMValueRef nf__vm_fminmax(LLVMBuilderRef b, int is_max, LLVMValueRef x, LLVMValueRef y) {
  LLVMValueRef c = FCMP(is_max ? LLVMRealOGT : LLVMRealOLT, x, y);
  c = LLVMBuildOr(b, isnan_(b, x), c, "");
  return sel(b, c, x, y);
}

/* ---- f32 kernels ---- */

static LLVMValueRef exp_f32(LLVMModuleRef m, LLVMBuilderRef b, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x), it = int_like(t);
  LLVMValueRef nan = isnan_(b, x);
  LLVMValueRef xc = sel(b, nan, cf(t, 0.0), x);
  xc = sel(b, FCMP(LLVMRealOGT, xc, cf(t, 89.0)), cf(t, 89.0), xc);
  xc = sel(b, FCMP(LLVMRealOLT, xc, cf(t, -104.0)), cf(t, -104.0), xc);
  LLVMValueRef n = intr1(m, b, "llvm.floor",
                         FADD(FMUL(xc, cf(t, 1.44269504088896341)), cf(t, 0.5)));
  LLVMValueRef r = FSUB(xc, FMUL(n, cf(t, 0.693359375)));
  r = FSUB(r, FMUL(n, cf(t, -2.12194440e-4)));
  static const double P[] = {5.0000001201E-1, 1.6666665459E-1, 4.1665795894E-2,
                             8.3334519073E-3, 1.3981999507E-3, 1.9875691500E-4};
  LLVMValueRef p = horner(b, r, P, 6);
  LLVMValueRef y = FADD(FADD(FMUL(p, FMUL(r, r)), r), cf(t, 1.0));
  /* 2^n in two factors so that n in [-150, 129] never leaves the normal
   * exponent range; the last multiply rounds once into denormals. */
  LLVMValueRef ni = LLVMBuildFPToSI(b, n, it, "");
  LLVMValueRef n1 = LLVMBuildAShr(b, ni, ci(it, 1), "");
  LLVMValueRef n2 = LLVMBuildSub(b, ni, n1, "");
  LLVMValueRef s1 = LLVMBuildBitCast(
      b, LLVMBuildShl(b, LLVMBuildAdd(b, n1, ci(it, 127), ""), ci(it, 23), ""), t, "");
  LLVMValueRef s2 = LLVMBuildBitCast(
      b, LLVMBuildShl(b, LLVMBuildAdd(b, n2, ci(it, 127), ""), ci(it, 23), ""), t, "");
  LLVMValueRef res = FMUL(FMUL(y, s1), s2);
  return sel(b, nan, x, res);
}

static LLVMValueRef log_f32(LLVMModuleRef m, LLVMBuilderRef b, LLVMValueRef x) {
  (void)m;
  LLVMTypeRef t = LLVMTypeOf(x), it = int_like(t);
  LLVMValueRef small = FCMP(LLVMRealOLT, x, cf(t, 1.17549435e-38));
  LLVMValueRef xs = sel(b, small, FMUL(x, cf(t, 8388608.0)), x);
  LLVMValueRef eadj = sel(b, small, ci(it, -23), ci(it, 0));
  LLVMValueRef bits = LLVMBuildBitCast(b, xs, it, "");
  /* Sign dropped: negative inputs become NaN below. */
  LLVMValueRef e = LLVMBuildLShr(b, LLVMBuildAnd(b, bits, ci(it, 0x7fffffff), ""), ci(it, 23), "");
  e = LLVMBuildSub(b, e, ci(it, 126), "");
  e = LLVMBuildAdd(b, e, eadj, "");
  LLVMValueRef mb = LLVMBuildOr(b, LLVMBuildAnd(b, bits, ci(it, 0x007fffff), ""),
                                ci(it, 0x3f000000), "");
  LLVMValueRef mm = LLVMBuildBitCast(b, mb, t, ""); /* [0.5, 1) */
  LLVMValueRef lt = FCMP(LLVMRealOLT, mm, cf(t, 0.707106781186547524));
  e = sel(b, lt, LLVMBuildSub(b, e, ci(it, 1), ""), e);
  LLVMValueRef xm = sel(b, lt, FSUB(FADD(mm, mm), cf(t, 1.0)), FSUB(mm, cf(t, 1.0)));
  LLVMValueRef ef = LLVMBuildSIToFP(b, e, t, "");
  LLVMValueRef z = FMUL(xm, xm);
  static const double P[] = {3.3333331174E-1, -2.4999993993E-1, 2.0000714765E-1,
                             -1.6668057665E-1, 1.4249322787E-1, -1.2420140846E-1,
                             1.1676998740E-1, -1.1514610310E-1, 7.0376836292E-2};
  LLVMValueRef y = FMUL(FMUL(horner(b, xm, P, 9), xm), z);
  y = FADD(y, FMUL(ef, cf(t, -2.12194440e-4)));
  y = FSUB(y, FMUL(z, cf(t, 0.5)));
  LLVMValueRef res = FADD(xm, y);
  res = FADD(res, FMUL(ef, cf(t, 0.693359375)));
  res = sel(b, FCMP(LLVMRealOEQ, x, cf(t, 0.0)), cf(t, -INFINITY), res);
  res = sel(b, FCMP(LLVMRealOLT, x, cf(t, 0.0)), cf(t, NAN), res);
  res = sel(b, FCMP(LLVMRealOEQ, x, cf(t, INFINITY)), x, res);
  return sel(b, isnan_(b, x), x, res);
}

static LLVMValueRef tanh_f32(LLVMModuleRef m, LLVMBuilderRef b, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef ax = intr1(m, b, "llvm.fabs", x);
  LLVMValueRef z = FMUL(x, x);
  static const double P[] = {-3.33332819422E-1, 1.33314422036E-1, -5.37397155531E-2,
                             2.06390887954E-2, -5.70498872745E-3};
  LLVMValueRef small = FADD(FMUL(FMUL(horner(b, z, P, 5), z), x), x);
  LLVMValueRef axc = sel(b, FCMP(LLVMRealOGT, ax, cf(t, 20.0)), cf(t, 20.0), ax);
  LLVMValueRef e = exp_f32(m, b, FMUL(axc, cf(t, 2.0)));
  LLVMValueRef large = FSUB(cf(t, 1.0), FDIV(cf(t, 2.0), FADD(e, cf(t, 1.0))));
  LLVMValueRef a2[2] = {large, x};
  large = nf__vm_intrinsic(m, b, "llvm.copysign", NULL, 1, a2, 2);
  LLVMValueRef res = sel(b, FCMP(LLVMRealOLT, ax, cf(t, 0.625)), small, large);
  return sel(b, isnan_(b, x), x, res);
}

static LLVMValueRef sigmoid_f32(LLVMModuleRef m, LLVMBuilderRef b, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef ax = intr1(m, b, "llvm.fabs", x);
  LLVMValueRef e = exp_f32(m, b, LLVMBuildFNeg(b, ax, ""));
  LLVMValueRef d = FADD(cf(t, 1.0), e);
  LLVMValueRef res = sel(b, FCMP(LLVMRealOGE, x, cf(t, 0.0)), FDIV(cf(t, 1.0), d), FDIV(e, d));
  return sel(b, isnan_(b, x), x, res);
}

static LLVMValueRef erf_f32(LLVMModuleRef m, LLVMBuilderRef b, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef ax = intr1(m, b, "llvm.fabs", x);
  /* |x| < 1: 2/sqrt(pi) * x * sum_k (-1)^k z^k / (k! (2k+1)), z = x^2. */
  double c[11], fact = 1.0;
  for (int k = 0; k <= 10; k++) {
    if (k) fact *= k;
    c[k] = (k & 1 ? -1.0 : 1.0) / (fact * (2 * k + 1)) * 1.12837916709551257390;
  }
  LLVMValueRef z = FMUL(x, x);
  LLVMValueRef small = FMUL(x, horner(b, z, c, 11));
  /* |x| >= 1: 1 - t P(t) exp(-x^2), t = 1/(1 + p|x|) (A&S 7.1.26). */
  static const double A[] = {0.254829592, -0.284496736, 1.421413741, -1.453152027,
                             1.061405429};
  LLVMValueRef axc = sel(b, FCMP(LLVMRealOGT, ax, cf(t, 5.0)), cf(t, 5.0), ax);
  LLVMValueRef tt = FDIV(cf(t, 1.0), FADD(cf(t, 1.0), FMUL(axc, cf(t, 0.3275911))));
  LLVMValueRef ex = exp_f32(m, b, LLVMBuildFNeg(b, FMUL(axc, axc), ""));
  LLVMValueRef large = FSUB(cf(t, 1.0), FMUL(FMUL(tt, horner(b, tt, A, 5)), ex));
  LLVMValueRef a2[2] = {large, x};
  large = nf__vm_intrinsic(m, b, "llvm.copysign", NULL, 1, a2, 2);
  LLVMValueRef res = sel(b, FCMP(LLVMRealOLT, ax, cf(t, 1.0)), small, large);
  return sel(b, isnan_(b, x), x, res);
}

/* ---- f64 through libm ---- */

static LLVMValueRef libm_call(LLVMModuleRef m, LLVMBuilderRef b, const char *name,
                              LLVMValueRef x) {
  LLVMTypeRef d = LLVMDoubleTypeInContext(LLVMGetModuleContext(m));
  LLVMTypeRef fty = LLVMFunctionType(d, &d, 1, 0);
  LLVMValueRef fn = LLVMGetNamedFunction(m, name);
  if (!fn) fn = LLVMAddFunction(m, name, fty);
  return LLVMBuildCall2(b, fty, fn, &x, 1, "");
}

static LLVMValueRef f64_scalar(LLVMModuleRef m, LLVMBuilderRef b, int op, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  switch (op) {
  case NF_OP_EXP: return libm_call(m, b, "exp", x);
  case NF_OP_LOG: return libm_call(m, b, "log", x);
  case NF_OP_TANH: return libm_call(m, b, "tanh", x);
  case NF_OP_ERF: return libm_call(m, b, "erf", x);
  case NF_OP_SIGMOID: {
    LLVMValueRef e = libm_call(m, b, "exp", LLVMBuildFNeg(b, intr1(m, b, "llvm.fabs", x), ""));
    LLVMValueRef d = FADD(cf(t, 1.0), e);
    return sel(b, FCMP(LLVMRealOGE, x, cf(t, 0.0)), FDIV(cf(t, 1.0), d), FDIV(e, d));
  }
  default: return NULL;
  }
}

LLVMValueRef nf__vm_unary(LLVMModuleRef m, LLVMBuilderRef b, int op, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x), st = scalar_of(t);
  int is_f32 = LLVMGetTypeKind(st) == LLVMFloatTypeKind;
  switch (op) {
  case NF_OP_SQRT: return intr1(m, b, "llvm.sqrt", x);
  case NF_OP_RSQRT: return FDIV(cf(t, 1.0), intr1(m, b, "llvm.sqrt", x));
  case NF_OP_ABS: return intr1(m, b, "llvm.fabs", x);
  case NF_OP_FLOOR: return intr1(m, b, "llvm.floor", x);
  case NF_OP_CEIL: return intr1(m, b, "llvm.ceil", x);
  case NF_OP_EXP:
  case NF_OP_LOG:
  case NF_OP_TANH:
  case NF_OP_SIGMOID:
  case NF_OP_ERF:
    break;
  default: return NULL;
  }
  if (is_f32) {
    switch (op) {
    case NF_OP_EXP: return exp_f32(m, b, x);
    case NF_OP_LOG: return log_f32(m, b, x);
    case NF_OP_TANH: return tanh_f32(m, b, x);
    case NF_OP_SIGMOID: return sigmoid_f32(m, b, x);
    default: return erf_f32(m, b, x);
    }
  }
  unsigned w = lanes_of(t);
  if (!w) return f64_scalar(m, b, op, x);
  LLVMValueRef v = LLVMGetUndef(t);
  LLVMTypeRef i32 = LLVMInt32TypeInContext(LLVMGetModuleContext(m));
  for (unsigned l = 0; l < w; l++) {
    LLVMValueRef idx = LLVMConstInt(i32, l, 0);
    LLVMValueRef s = f64_scalar(m, b, op, LLVMBuildExtractElement(b, x, idx, ""));
    v = LLVMBuildInsertElement(b, v, s, idx, "");
  }
  return v;
}

LLVMValueRef nf__vm_pow(LLVMModuleRef m, LLVMBuilderRef b, LLVMValueRef x, LLVMValueRef y) {
  LLVMValueRef a[2] = {x, y};
  return nf__vm_intrinsic(m, b, "llvm.pow", NULL, 1, a, 2);
}
