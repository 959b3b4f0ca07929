/* nccl_emu.cc - NCCL for tests on machines without GPUs: the entry points
 * client/executor/nccl_rt.c loads (NEOFLOW_LIBNCCL=<this library>), for
 * ranks that are processes of one machine (mpirun on it), with "device"
 * memory in host memory as the emulated driver (cuda_emu_driver.cc) has
 * it.
 *
 * The communicator is a POSIX shared memory segment named by the unique
 * id (made by one rank, sent to the others by the caller, as with NCCL):
 * one staging slot per rank and a barrier.  A collective is queued on its
 * stream of the emulated driver (emu_stream.h: run in stream order, when
 * something waits for the stream), as NCCL queues kernels: each rank
 * copies its chunk to its slot, waits for every rank, reduces the slots
 * in rank order (every rank gets the same bits), and waits again before
 * the slots are reused.  ncclAvg divides the sum by the rank count.
 *
 * A rank that does not arrive: the barrier gives up after
 * $NEOFLOW_DIST_TIMEOUT seconds (default 300), the collective's result is
 * left as it was and ncclCommGetAsyncError reports ncclRemoteError, as
 * NCCL reports a peer gone.  Float32 only (NeoFlow's gradients).
 *
 * Test code, not shipped: built only with the tests. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "emu_stream.h"

extern "C" {

typedef int ncclResult_t;
enum { OK = 0, E_SYSTEM = 2, E_INTERNAL = 3, E_INVALID_ARGUMENT = 4, E_REMOTE = 6 };
typedef struct {
  char internal[128];
} ncclUniqueId;

#define CHUNK (1 << 18) /* floats per rank and round */

struct shm_hdr {
  std::atomic<int> joined;
  std::atomic<int> arrived;
  std::atomic<int> gen;
};

struct emu_comm {
  int n, rank;
  size_t bytes;
  shm_hdr *h;
  float *slots; /* n x CHUNK */
  std::atomic<int> err;
  double timeout_s;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Every rank here, or the timeout: 0 / -1. */
static int barrier(emu_comm *c) {
  int g = c->h->gen.load();
  if (c->h->arrived.fetch_add(1) == c->n - 1) {
    c->h->arrived.store(0);
    c->h->gen.fetch_add(1);
    return 0;
  }
  double until = now_s() + c->timeout_s;
  while (c->h->gen.load() == g) {
    if (now_s() > until) return -1;
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
  return 0;
}

ncclResult_t ncclGetVersion(int *v) {
  *v = 21803;
  return OK;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case OK: return "no error";
    case E_SYSTEM: return "unhandled system error (emulated NCCL)";
    case E_INVALID_ARGUMENT: return "invalid argument (emulated NCCL)";
    case E_REMOTE: return "remote process exited or there was a network error (emulated NCCL: "
                          "a rank did not arrive in time)";
    default: return "internal error (emulated NCCL)";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(id->internal, sizeof id->internal, "/nfemu_nccl_%d_%ld_%ld", (int)getpid(),
           (long)ts.tv_sec, ts.tv_nsec);
  return OK;
}

ncclResult_t ncclCommInitRank(void **out, int n, ncclUniqueId id, int rank) {
  if (n < 1 || rank < 0 || rank >= n || strncmp(id.internal, "/nfemu_nccl_", 12))
    return E_INVALID_ARGUMENT;
  emu_comm *c = new emu_comm();
  c->n = n;
  c->rank = rank;
  const char *t = getenv("NEOFLOW_DIST_TIMEOUT");
  c->timeout_s = t && atof(t) > 0 ? atof(t) : 300;
  c->bytes = 64 + (size_t)n * CHUNK * sizeof(float);
  int fd = shm_open(id.internal, O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)c->bytes) != 0) {
    if (fd >= 0) close(fd);
    delete c;
    return E_SYSTEM;
  }
  void *m = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    delete c;
    return E_SYSTEM;
  }
  c->h = (shm_hdr *)m; /* (zero-filled by ftruncate: the atomics start at 0) */
  c->slots = (float *)((char *)m + 64);
  c->h->joined.fetch_add(1);
  double until = now_s() + c->timeout_s;
  while (c->h->joined.load() < n) {
    if (now_s() > until) {
      munmap(m, c->bytes);
      delete c;
      return E_REMOTE;
    }
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  if (barrier(c) != 0) {
    munmap(m, c->bytes);
    delete c;
    return E_REMOTE;
  }
  if (rank == 0) shm_unlink(id.internal); /* every rank has it mapped */
  *out = c;
  return OK;
}

/* The collective itself, run in stream order. */
static void reduce(emu_comm *c, const float *in, float *out, size_t count, int avg, int root) {
  if (c->err.load()) return;
  float *mine = c->slots + (size_t)c->rank * CHUNK;
  for (size_t at = 0; at < count; at += CHUNK) {
    size_t k = count - at < CHUNK ? count - at : CHUNK;
    if (root < 0 || c->rank == root) memcpy(mine, in + at, k * sizeof(float));
    if (barrier(c) != 0) {
      c->err.store(E_REMOTE);
      return;
    }
    if (root >= 0) {
      memcpy(out + at, c->slots + (size_t)root * CHUNK, k * sizeof(float));
    } else {
      for (size_t i = 0; i < k; i++) {
        float v = 0;
        for (int r = 0; r < c->n; r++) v += c->slots[(size_t)r * CHUNK + i];
        out[at + i] = avg ? v / (float)c->n : v;
      }
    }
    if (barrier(c) != 0) {
      c->err.store(E_REMOTE);
      return;
    }
  }
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op,
                           void *comm, void *stream) {
  emu_comm *c = (emu_comm *)comm;
  if (!c || dtype != 7 || (op != 0 && op != 4)) return E_INVALID_ARGUMENT;
  const float *in = (const float *)send;
  float *out = (float *)recv;
  int avg = op == 4;
  return emu_stream_enqueue(stream, [=] { reduce(c, in, out, count, avg, -1); }) ? E_INTERNAL
                                                                                   : OK;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root,
                           void *comm, void *stream) {
  emu_comm *c = (emu_comm *)comm;
  if (!c || dtype != 7 || root < 0 || root >= c->n) return E_INVALID_ARGUMENT;
  const float *in = (const float *)send;
  float *out = (float *)recv;
  return emu_stream_enqueue(stream, [=] { reduce(c, in, out, count, 0, root); }) ? E_INTERNAL
                                                                                  : OK;
}

ncclResult_t ncclCommGetAsyncError(void *comm, ncclResult_t *r) {
  *r = comm ? ((emu_comm *)comm)->err.load() : E_INVALID_ARGUMENT;
  return OK;
}

static void release(emu_comm *c) {
  if (!c) return;
  munmap(c->h, c->bytes);
  delete c;
}

ncclResult_t ncclCommAbort(void *comm) {
  /* (work queued on an emulated stream may still name it: kept mapped
   * until the process ends, as an aborted communicator's memory is the
   * library's business) */
  if (comm) ((emu_comm *)comm)->err.store(E_REMOTE);
  return OK;
}

ncclResult_t ncclCommDestroy(void *comm) {
  release((emu_comm *)comm);
  return OK;
}

}  // extern "C"
