/* pool.c - the thread pool behind the kernel ABI's parallel_for.
 *
 * n_threads - 1 workers plus the calling thread.  A job is published by
 * bumping a generation counter (under the mutex, so a worker that checked
 * it before sleeping cannot miss the wake-up); [0, n) is split statically
 * into n_threads contiguous ranges [n*t/T, n*(t+1)/T), range 0 run by the
 * caller, range t by worker t, empty ranges skipped.  Workers and the
 * waiting caller spin for a few microseconds (cheap back-to-back
 * parallel sections), then sleep on condition variables: nothing ever
 * spins indefinitely (TOOLCHAIN-NOTES: a spinning pool collapses when
 * another process wants the core).  Concurrent callers are serialised by
 * a call lock. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "nf_runtime.h"

#define SPIN_ITERS 4000
#define WORKER_STACK (8u << 20)

typedef struct worker {
  struct nf_pool *pool;
  int index;
  pthread_t th;
} worker;

struct nf_pool {
  int n;
  int n_started;
  worker *w;
  pthread_mutex_t call_lock;
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_done;
  /* the current job (written before gen is bumped) */
  nf_parallel_body body;
  void *ctx;
  int64_t n_items;
  atomic_ulong gen;
  atomic_int pending;
  atomic_int stop;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void run_range(nf_pool *p, int t) {
  int64_t n = p->n_items, T = p->n;
  int64_t b = (int64_t)((__int128)n * t / T), e = (int64_t)((__int128)n * (t + 1) / T);
  if (b < e) p->body(p->ctx, b, e);
}

static void *worker_main(void *arg) {
  worker *w = arg;
  nf_pool *p = w->pool;
  unsigned long seen = 0;
  for (;;) {
    int ready = 0;
    for (int i = 0; i < SPIN_ITERS; i++) {
      if (atomic_load_explicit(&p->gen, memory_order_acquire) != seen ||
          atomic_load_explicit(&p->stop, memory_order_acquire)) {
        ready = 1;
        break;
      }
      cpu_relax();
    }
    if (!ready) {
      pthread_mutex_lock(&p->mu);
      while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->cv_work, &p->mu);
      pthread_mutex_unlock(&p->mu);
    }
    if (atomic_load(&p->stop)) break;
    seen = atomic_load_explicit(&p->gen, memory_order_acquire);
    run_range(p, w->index);
    if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->cv_done);
      pthread_mutex_unlock(&p->mu);
    }
  }
  return NULL;
}

nf_pool *nf_pool_new(int n_threads) {
  if (n_threads < 1) n_threads = 1;
  if (n_threads > 1024) n_threads = 1024;
  nf_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n_threads;
  p->w = calloc((size_t)n_threads, sizeof *p->w);
  if (!p->w) {
    free(p);
    return NULL;
  }
  pthread_mutex_init(&p->call_lock, NULL);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv_work, NULL);
  pthread_cond_init(&p->cv_done, NULL);
  atomic_init(&p->gen, 0);
  atomic_init(&p->pending, 0);
  atomic_init(&p->stop, 0);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, WORKER_STACK);
  for (int t = 1; t < n_threads; t++) {
    p->w[t].pool = p;
    p->w[t].index = t;
    if (pthread_create(&p->w[t].th, &attr, worker_main, &p->w[t]) != 0) {
      pthread_attr_destroy(&attr);
      nf_pool_free(p);
      return NULL;
    }
    p->n_started = t;
  }
  pthread_attr_destroy(&attr);
  return p;
}

void nf_pool_free(nf_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, 1);
  pthread_cond_broadcast(&p->cv_work);
  pthread_mutex_unlock(&p->mu);
  for (int t = 1; t <= p->n_started; t++) pthread_join(p->w[t].th, NULL);
  pthread_mutex_destroy(&p->call_lock);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv_work);
  pthread_cond_destroy(&p->cv_done);
  free(p->w);
  free(p);
}

int nf_pool_threads(const nf_pool *p) { return p ? p->n : 1; }

void nf_pool_parallel_for(void *runtime, int64_t n, nf_parallel_body body, void *ctx) {
  nf_pool *p = runtime;
  if (n <= 0) return;
  if (!p || p->n == 1 || n == 1) {
    body(ctx, 0, n);
    return;
  }
  pthread_mutex_lock(&p->call_lock);
  p->body = body;
  p->ctx = ctx;
  p->n_items = n;
  atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
  pthread_cond_broadcast(&p->cv_work);
  pthread_mutex_unlock(&p->mu);
  run_range(p, 0);
  int done = 0;
  for (int i = 0; i < SPIN_ITERS; i++) {
    if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0) {
      done = 1;
      break;
    }
    cpu_relax();
  }
  if (!done) {
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
      pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
  pthread_mutex_unlock(&p->call_lock);
}
