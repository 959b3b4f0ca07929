/* nccl_rt.c - nf_nccl.h: NCCL through dlopen.  The types NCCL's API takes
 * are declared here: the communicator is a pointer, results, data types
 * and reduction operators ints, the unique id 128 bytes. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_env.h"
#include "nf_nccl.h"
#include "nf_status.h"

typedef int ncclResult_t; /* 0: ncclSuccess; 7: ncclInProgress */
typedef void *ncclComm_t;
typedef struct {
  char internal[NF_NCCL_ID_BYTES];
} ncclUniqueId;
enum { NCCL_FLOAT32 = 7, NCCL_AVG = 4, NCCL_IN_PROGRESS = 7 };

struct nf_nccl {
  void *lib;
  nf_cuda_rt *rt;
  ncclComm_t comm;
  char version[32];
  ncclResult_t (*GetVersion)(int *);
  ncclResult_t (*GetUniqueId)(ncclUniqueId *);
  ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*AllReduce)(const void *, void *, size_t, int, int, ncclComm_t, void *);
  ncclResult_t (*Broadcast)(const void *, void *, size_t, int, int, ncclComm_t, void *);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  const char *(*GetErrorString)(ncclResult_t);
};

static int fail(nf_nccl *n, ncclResult_t r, const char *call, nf_buf *err) {
  if (r == 0) return NF_OK;
  nf_buf_printf(err, "%s: %s (NCCL result %d)", call,
                n->GetErrorString ? n->GetErrorString(r) : "error", r);
  return NF_EIO;
}

int nf_nccl_load(nf_cuda_rt *rt, nf_nccl **out, nf_buf *why) {
  *out = NULL;
  nf_nccl *n = calloc(1, sizeof *n);
  if (!n) return NF_ENOMEM;
  n->rt = rt;
  const char *env = nf_env(NF_ENV_LIBNCCL);
  n->lib = dlopen(env && *env ? env : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!n->lib) {
    nf_buf_printf(why, "no NCCL: cannot load %s (%s)", env && *env ? env : "libnccl.so.2",
                  dlerror());
    free(n);
    return NF_EUNSUPPORTED;
  }
  *(void **)&n->GetVersion = dlsym(n->lib, "ncclGetVersion");
  *(void **)&n->GetUniqueId = dlsym(n->lib, "ncclGetUniqueId");
  *(void **)&n->CommInitRank = dlsym(n->lib, "ncclCommInitRank");
  *(void **)&n->AllReduce = dlsym(n->lib, "ncclAllReduce");
  *(void **)&n->Broadcast = dlsym(n->lib, "ncclBroadcast");
  *(void **)&n->CommGetAsyncError = dlsym(n->lib, "ncclCommGetAsyncError");
  *(void **)&n->CommAbort = dlsym(n->lib, "ncclCommAbort");
  *(void **)&n->CommDestroy = dlsym(n->lib, "ncclCommDestroy");
  *(void **)&n->GetErrorString = dlsym(n->lib, "ncclGetErrorString");
  int v = 0;
  if (!n->GetVersion || !n->GetUniqueId || !n->CommInitRank || !n->AllReduce || !n->Broadcast ||
      !n->CommGetAsyncError || !n->CommAbort || !n->CommDestroy || !n->GetErrorString) {
    nf_buf_puts(why, "the NCCL library lacks one of ncclGetVersion, ncclGetUniqueId, "
                     "ncclCommInitRank, ncclAllReduce, ncclBroadcast, ncclCommGetAsyncError, "
                     "ncclCommAbort, ncclCommDestroy, ncclGetErrorString");
  } else if (n->GetVersion(&v) != 0 || v < 21000) {
    /* (codes: major*10000 + minor*100 + patch since 2.9) */
    nf_buf_printf(why, "NCCL %d is older than 2.10 (no ncclAvg)", v);
  } else {
    snprintf(n->version, sizeof n->version, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    *out = n;
    return NF_OK;
  }
  nf_nccl_close(n);
  return NF_EUNSUPPORTED;
}

const char *nf_nccl_version(const nf_nccl *n) { return n->version; }

int nf_nccl_unique_id(nf_nccl *n, uint8_t id[NF_NCCL_ID_BYTES], nf_buf *err) {
  ncclUniqueId u;
  memset(&u, 0, sizeof u);
  int rc = fail(n, n->GetUniqueId(&u), "ncclGetUniqueId", err);
  memcpy(id, u.internal, NF_NCCL_ID_BYTES);
  return rc;
}

int nf_nccl_init(nf_nccl *n, int size, int rank, const uint8_t id[NF_NCCL_ID_BYTES],
                 nf_buf *err) {
  int rc = nf_cuda_rt_current(n->rt, err);
  if (rc != NF_OK) return rc;
  ncclUniqueId u;
  memcpy(u.internal, id, NF_NCCL_ID_BYTES);
  return fail(n, n->CommInitRank(&n->comm, size, u, rank), "ncclCommInitRank", err);
}

static void *stream(nf_nccl *n) {
  return nf_cuda_rt_stream_at(n->rt, nf_cuda_rt_selected(n->rt));
}

int nf_nccl_mean(nf_nccl *n, uint64_t dptr, size_t count, nf_buf *err) {
  void *p = (void *)(uintptr_t)dptr;
  return fail(n, n->AllReduce(p, p, count, NCCL_FLOAT32, NCCL_AVG, n->comm, stream(n)),
              "ncclAllReduce", err);
}

int nf_nccl_bcast(nf_nccl *n, uint64_t dptr, size_t count, int root, nf_buf *err) {
  void *p = (void *)(uintptr_t)dptr;
  return fail(n, n->Broadcast(p, p, count, NCCL_FLOAT32, root, n->comm, stream(n)),
              "ncclBroadcast", err);
}

int nf_nccl_check(nf_nccl *n, nf_buf *err) {
  if (!n->comm) return NF_OK;
  ncclResult_t a = 0;
  ncclResult_t r = n->CommGetAsyncError(n->comm, &a);
  if (r != 0) return fail(n, r, "ncclCommGetAsyncError", err);
  return a == NCCL_IN_PROGRESS ? NF_OK : fail(n, a, "NCCL (asynchronous)", err);
}

void nf_nccl_abort(nf_nccl *n) {
  if (n && n->comm) n->CommAbort(n->comm);
  if (n) n->comm = NULL;
}

void nf_nccl_close(nf_nccl *n) {
  if (!n) return;
  /* its queued work done first; the library stays loaded (NCCL's own
   * threads and handlers outlive a communicator) */
  nf_buf e = NF_BUF_INIT;
  if (n->comm && nf_cuda_rt_current(n->rt, &e) == NF_OK && nf_cuda_rt_sync(n->rt, &e) == NF_OK)
    n->CommDestroy(n->comm);
  else if (n->comm)
    n->CommAbort(n->comm); /* (work that cannot finish: a broken context, a peer gone) */
  nf_buf_free(&e);
  free(n);
}
