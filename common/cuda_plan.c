/* cuda_plan.c - nf_cuda_plan.h: the plan and the bundle format. */
#include <stdlib.h>
#include <string.h>

#include "nf_cuda_plan.h"

void nf_cuda_plan_free(nf_cuda_plan *plan) {
  if (!plan) return;
  free(plan->launches);
  memset(plan, 0, sizeof *plan);
}

static void put32(nf_buf *b, uint32_t v) {
  for (int i = 0; i < 4; i++) nf_buf_u8(b, (uint8_t)(v >> (8 * i)));
}

static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

enum { HEAD = 8 + 4 + 4 + 8 + 4 + 4 + 8 + 8, LAUNCH = 24 + 12 };

static int name_ok(const char *s) {
  size_t n = strnlen(s, 24);
  if (n == 0 || n == 24) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      return 0;
  }
  return 1;
}

static int launch_ok(const nf_cuda_launch *l) {
  return name_ok(l->name) && l->grid >= 1 && l->grid <= 0x7fffffffu && l->block >= 1 &&
         l->block <= NF_CUDA_BUNDLE_MAX_BLOCK && l->shared_bytes <= NF_CUDA_BUNDLE_MAX_SHARED;
}

int nf_cuda_bundle_encode(const nf_cuda_plan *plan, int image_kind, int sm, const void *image,
                          size_t image_len, const char *source, size_t source_len, nf_buf *out) {
  if (!plan || plan->n_launches < 0 || plan->n_launches > NF_CUDA_BUNDLE_MAX_LAUNCHES ||
      plan->n_args > NF_CUDA_BUNDLE_MAX_ARGS || plan->scratch_bytes > NF_CUDA_BUNDLE_MAX_SCRATCH ||
      (image_kind != NF_CUDA_IMAGE_CUBIN && image_kind != NF_CUDA_IMAGE_PTX) || sm < 0 ||
      (image_len && !image) || (source_len && !source))
    return NF_EINVAL;
  for (int i = 0; i < plan->n_launches; i++)
    if (!launch_ok(&plan->launches[i])) return NF_EINVAL;
  nf_buf_add(out, NF_CUDA_BUNDLE_MAGIC, 8);
  put32(out, (uint32_t)plan->n_launches);
  put32(out, plan->n_args);
  nf_buf_u64(out, plan->scratch_bytes);
  put32(out, (uint32_t)image_kind);
  put32(out, (uint32_t)sm);
  nf_buf_u64(out, image_len);
  nf_buf_u64(out, source_len);
  for (int i = 0; i < plan->n_launches; i++) {
    const nf_cuda_launch *l = &plan->launches[i];
    char name[24];
    memset(name, 0, sizeof name);
    memcpy(name, l->name, strnlen(l->name, 23));
    nf_buf_add(out, name, sizeof name);
    put32(out, l->grid);
    put32(out, l->block);
    put32(out, l->shared_bytes);
  }
  if (image_len) nf_buf_add(out, image, image_len);
  if (source_len) nf_buf_add(out, source, source_len);
  return out->oom ? NF_ENOMEM : NF_OK;
}

int nf_cuda_bundle_decode(const void *p, size_t n, nf_cuda_bundle *b, nf_buf *err) {
  const uint8_t *u = p;
  memset(b, 0, sizeof *b);
  if (!p || n < HEAD || memcmp(u, NF_CUDA_BUNDLE_MAGIC, 8) != 0) {
    nf_buf_printf(err, "CUDA kernel bundle: %s", n < HEAD ? "shorter than its header"
                                                         : "no NFCUDA01 magic at offset 0");
    return NF_EFORMAT;
  }
  uint32_t nl = get32(u + 8), na = get32(u + 12), kind = get32(u + 24), sm = get32(u + 28);
  uint64_t scratch = get64(u + 16), il = get64(u + 32), sl = get64(u + 40);
  const char *bad = NULL;
  if (nl > NF_CUDA_BUNDLE_MAX_LAUNCHES)
    bad = "n_launches (offset 8) over 4096";
  else if (na > NF_CUDA_BUNDLE_MAX_ARGS)
    bad = "n_args (offset 12) over 4096";
  else if (scratch > NF_CUDA_BUNDLE_MAX_SCRATCH)
    bad = "scratch_bytes (offset 16) over 1 TiB";
  else if (kind != NF_CUDA_IMAGE_CUBIN && kind != NF_CUDA_IMAGE_PTX)
    bad = "image_kind (offset 24) is neither 0 (cubin) nor 1 (PTX)";
  else if (sm > 10000)
    bad = "sm (offset 28) out of range";
  else if (il > n || sl > n || (uint64_t)HEAD + (uint64_t)nl * LAUNCH + il + sl != n)
    bad = "the lengths (offsets 32, 40) do not add up to the bundle's size";
  if (bad) {
    nf_buf_printf(err, "CUDA kernel bundle: %s", bad);
    return NF_EFORMAT;
  }
  b->plan.launches = calloc(nl ? nl : 1, sizeof *b->plan.launches);
  if (!b->plan.launches) return NF_ENOMEM;
  b->plan.n_launches = (int)nl;
  b->plan.n_args = na;
  b->plan.scratch_bytes = scratch;
  const uint8_t *q = u + HEAD;
  for (uint32_t i = 0; i < nl; i++, q += LAUNCH) {
    nf_cuda_launch *l = &b->plan.launches[i];
    memcpy(l->name, q, 24);
    size_t nl_name = strnlen(l->name, 24);
    int padded = 1; /* zeros after the NUL: one encoding per bundle */
    for (size_t c = nl_name; c < 24; c++) padded &= l->name[c] == 0;
    l->grid = get32(q + 24);
    l->block = get32(q + 28);
    l->shared_bytes = get32(q + 32);
    if (!padded || !launch_ok(l)) {
      nf_buf_printf(err,
                    "CUDA kernel bundle: launch %u (offset %zu): a name that is not a "
                    "zero-padded identifier, or grid, block or shared memory out of range",
                    i, (size_t)(q - u));
      nf_cuda_bundle_free(b);
      return NF_EFORMAT;
    }
  }
  b->image_kind = (int)kind;
  b->sm = (int)sm;
  b->image = q;
  b->image_len = (size_t)il;
  b->source = (const char *)q + il;
  b->source_len = (size_t)sl;
  return NF_OK;
}

void nf_cuda_bundle_free(nf_cuda_bundle *b) {
  if (!b) return;
  nf_cuda_plan_free(&b->plan);
  memset(b, 0, sizeof *b);
}
