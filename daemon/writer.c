/* writer.c - neoflowd's cache writer: one thread with its own cache
 * handle that performs every write (kernels, records, hit counts), so
 * the event loop never waits on a disk, an fsync at a checkpoint, or a
 * lock another process holds (busy_timeout is 5 s).
 *
 * The event loop queues operations (copies: the caller keeps nothing
 * shared) and goes on; the thread runs them in order, one transaction
 * each, and logs failures (a failed write means an uncached success, as
 * the failure policy says).  Until an entry is committed,
 * nfd_writer_lookup finds it in the queue, so a request arriving between
 * a job's end and the commit is answered like a hit and never starts a
 * second job for the key (the server prefers it over an older committed
 * entry of the key: a tuning's result over its compile's).
 *
 * Bounds: at most NFD_WRITER_MAX_BYTES of pending operations; beyond it
 * records and hit counts are dropped with a warning (kernels are always
 * queued: there is at most one per job).  nfd_writer_stop drains the
 * queue and joins the thread: SIGTERM loses nothing queued. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_kernel.h"
#include "nf_wire_sign.h"
#include "nfd_int.h"

#define NFD_WRITER_MAX_BYTES (256u << 20)

enum { OP_PUT, OP_RECORDS, OP_TOUCH, OP_QUARANTINE, OP_SHAPE };

typedef struct op {
  struct op *next;
  int kind;
  uint8_t key[32];
  nf_cache_entry e;     /* OP_PUT */
  nf_cache_record *recs; /* OP_RECORDS */
  size_t n_recs;
  int64_t touches;      /* OP_TOUCH */
  char reason[64];      /* OP_QUARANTINE */
  nfd_shape shape;      /* OP_SHAPE */
  size_t bytes;
} op;

struct nfd_writer {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  op *head, *tail;
  op *cur; /* being written (still found by lookup) */
  size_t bytes;
  int stop;
  nf_cache *cache;
  nfd_server *S;
  uint64_t done, failed, dropped;
};

static void op_free(op *o) {
  if (o->kind == OP_PUT) nf_cache_entry_free(&o->e);
  if (o->kind == OP_RECORDS) nf_cache_records_free(o->recs, o->n_recs);
  free(o);
}

static void run_op(nfd_writer *w, op *o) {
  nf_buf err = NF_BUF_INIT;
  int rc = NF_OK;
  switch (o->kind) {
    case OP_PUT: rc = nf_cache_put(w->cache, &o->e, NULL, &err); break;
    case OP_RECORDS: rc = nf_cache_add_records(w->cache, o->key, o->recs, o->n_recs, &err); break;
    case OP_TOUCH: rc = nf_cache_touch(w->cache, o->key, o->touches, &err); break;
    case OP_QUARANTINE: rc = nf_cache_quarantine(w->cache, o->key, o->reason, &err); break;
    case OP_SHAPE:
      rc = nf_cache_put_shape(w->cache, o->key, o->shape.sig, o->shape.desc, o->shape.n_desc,
                              &err);
      break;
  }
  if (rc != NF_OK && strstr(nf_buf_str(&err), ": busy: ")) {
    __atomic_store_n(&w->S->writer_busy_ms, (int64_t)(nfd_now() * 1000), __ATOMIC_RELAXED);
    __atomic_fetch_add(&w->S->cache_busy, 1, __ATOMIC_RELAXED);
  }
  if (rc != NF_OK && !(o->kind == OP_TOUCH && rc == NF_ENOENT)) {
    NFD_WARN("cache: %s not stored (clients were served anyway): %s",
             o->kind == OP_PUT       ? "a kernel"
             : o->kind == OP_RECORDS ? "records"
             : o->kind == OP_TOUCH   ? "hit counts"
             : o->kind == OP_SHAPE   ? "a shape"
                                     : "a quarantine",
             nf_buf_str(&err));
    w->failed++;
  }
  nf_buf_free(&err);
}

static void *thread_main(void *arg) {
  nfd_writer *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->head && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
    if (!w->head) break; /* stop and drained */
    op *o = w->head;
    w->head = o->next;
    if (!w->head) w->tail = NULL;
    w->cur = o;
    pthread_mutex_unlock(&w->mu);
    run_op(w, o);
    pthread_mutex_lock(&w->mu);
    w->cur = NULL;
    w->bytes -= o->bytes;
    w->done++;
    op_free(o);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static void adopt_sign(void *user, const uint8_t key[32], const uint8_t sha[32],
                       const uint8_t target[32], nf_cache_sig *out) {
  const nfd_server *S = user;
  memcpy(out->signer, S->sign_pk, 32);
  nf_sign_kernel(S->sign_sk, key, sha, target, NF_KERNEL_ABI_VERSION, out->sig);
}

int nfd_writer_start(nfd_server *S, nf_buf *err) {
  nfd_writer *w = calloc(1, sizeof *w);
  if (!w) return NF_ENOMEM;
  int damaged = 0;
  nf_cache_opts co = {.writer_lock = 1,
                      .allow_network_fs = S->cfg.allow_network_fs,
                      .sync_full = S->cfg.cache_sync_full,
                      .soft_cap_bytes = S->cfg.cache_soft_cap,
                      .hard_cap_bytes = S->cfg.cache_hard_cap,
                      .damaged = &damaged};
  int rc = nf_cache_open(S->cfg.cache_path, &co, &w->cache, err);
  if (rc != NF_OK && damaged) {
    /* a damaged cache is no reason to stay down: aside (named, logged),
     * a fresh one, and the way to bring back what can be verified */
    char moved[4300];
    nf_buf why = NF_BUF_INIT;
    nf_buf_puts(&why, nf_buf_str(err));
    nf_buf_reset(err);
    rc = nf_cache_move_aside(S->cfg.cache_path, moved, sizeof moved, err);
    if (rc == NF_OK) {
      NFD_ERROR("cache %s is damaged (%s); moved it to %s and starting on a fresh cache; "
                "`neoflow cache recover %s --cache %s` brings back what can be verified",
                S->cfg.cache_path, nf_buf_str(&why), moved, moved, S->cfg.cache_path);
      rc = nf_cache_open(S->cfg.cache_path, &co, &w->cache, err);
    }
    nf_buf_free(&why);
  }
  if (rc != NF_OK) {
    free(w);
    return rc;
  }
  /* the entries of a cache from before signatures were what this daemon
   * served then: it signs them now, once (nf_cache_adopt) */
  int64_t adopted = 0;
  nf_buf aerr = NF_BUF_INIT;
  if (nf_cache_adopt(w->cache, adopt_sign, S, &adopted, &aerr) != NF_OK)
    NFD_WARN("cache: cannot sign the entries of the older cache (each will be built again "
             "when asked for): %s", nf_buf_str(&aerr));
  else if (adopted)
    NFD_INFO("cache: signed %lld entries stored before kernels were signed", (long long)adopted);
  nf_buf_free(&aerr);
  w->S = S;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  if (pthread_create(&w->th, NULL, thread_main, w) != 0) {
    nf_cache_close(w->cache);
    free(w);
    nf_buf_printf(err, "cannot start the cache writer thread");
    return NF_EIO;
  }
  S->writer = w;
  return NF_OK;
}

/* Queues o, or drops it (records, hits) when the queue is over its bound. */
static void enqueue(nfd_writer *w, op *o) {
  pthread_mutex_lock(&w->mu);
  if (o->kind != OP_PUT && w->bytes + o->bytes > NFD_WRITER_MAX_BYTES) {
    w->dropped++;
    pthread_mutex_unlock(&w->mu);
    NFD_WARN("cache: the write queue is full (%zu bytes): %s dropped", w->bytes,
             o->kind == OP_RECORDS ? "records" : o->kind == OP_SHAPE ? "a shape" : "hit counts");
    op_free(o);
    return;
  }
  w->bytes += o->bytes;
  if (w->tail) w->tail->next = o;
  else w->head = o;
  w->tail = o;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

void nfd_writer_put(nfd_server *S, const nf_cache_entry *e) {
  if (!S->writer) return;
  op *o = calloc(1, sizeof *o);
  if (!o || nf_cache_entry_copy(&o->e, e) != NF_OK) {
    free(o);
    NFD_WARN("cache: out of memory: a kernel not stored");
    return;
  }
  o->kind = OP_PUT;
  memcpy(o->key, e->key, 32);
  o->bytes = sizeof *o + e->binary_len;
  enqueue(S->writer, o);
}

void nfd_writer_records(nfd_server *S, const uint8_t key[32], nf_cache_record *recs, size_t n) {
  if (!S->writer || !n) {
    nf_cache_records_free(recs, n);
    return;
  }
  op *o = calloc(1, sizeof *o);
  if (!o) {
    nf_cache_records_free(recs, n);
    return;
  }
  o->kind = OP_RECORDS;
  memcpy(o->key, key, 32);
  o->recs = recs;
  o->n_recs = n;
  o->bytes = sizeof *o;
  for (size_t i = 0; i < n; i++)
    o->bytes += sizeof *recs + recs[i].n_features + (recs[i].schedule ? strlen(recs[i].schedule) : 0);
  enqueue(S->writer, o);
}

void nfd_writer_quarantine(nfd_server *S, const uint8_t key[32], const char *reason) {
  if (!S->writer) return;
  op *o = calloc(1, sizeof *o);
  if (!o) return;
  o->kind = OP_QUARANTINE;
  memcpy(o->key, key, 32);
  snprintf(o->reason, sizeof o->reason, "%s", reason);
  o->bytes = sizeof *o;
  enqueue(S->writer, o);
}

void nfd_writer_shape(nfd_server *S, const uint8_t key[32], const nfd_shape *shape) {
  if (!S->writer || !shape->ok) return;
  op *o = calloc(1, sizeof *o);
  if (!o) return;
  o->kind = OP_SHAPE;
  memcpy(o->key, key, 32);
  o->shape = *shape;
  o->bytes = sizeof *o;
  enqueue(S->writer, o);
}

void nfd_writer_touch(nfd_server *S, const uint8_t key[32], int64_t n) {
  if (!S->writer) return;
  op *o = calloc(1, sizeof *o);
  if (!o) return;
  o->kind = OP_TOUCH;
  memcpy(o->key, key, 32);
  o->touches = n;
  o->bytes = sizeof *o;
  enqueue(S->writer, o);
}

int nfd_writer_lookup(nfd_server *S, const uint8_t key[32], nf_cache_entry *out) {
  nfd_writer *w = S->writer;
  if (!w) return NF_ENOENT;
  int rc = NF_ENOENT;
  pthread_mutex_lock(&w->mu);
  const op *found = NULL;
  if (w->cur && w->cur->kind == OP_PUT && memcmp(w->cur->key, key, 32) == 0) found = w->cur;
  for (const op *o = w->head; o; o = o->next)
    if (o->kind == OP_PUT && memcmp(o->key, key, 32) == 0) found = o; /* the latest */
  if (found) rc = nf_cache_entry_copy(out, &found->e);
  pthread_mutex_unlock(&w->mu);
  return rc;
}

int nfd_writer_pending(nfd_server *S, const uint8_t key[32]) {
  nfd_writer *w = S->writer;
  if (!w) return 0;
  int found = 0;
  pthread_mutex_lock(&w->mu);
  if (w->cur && memcmp(w->cur->key, key, 32) == 0) found = 1;
  for (const op *o = w->head; o && !found; o = o->next)
    found = memcmp(o->key, key, 32) == 0;
  pthread_mutex_unlock(&w->mu);
  return found;
}

void nfd_writer_stop(nfd_server *S) {
  nfd_writer *w = S->writer;
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->th, NULL);
  if (w->failed || w->dropped)
    NFD_WARN("cache writer: %llu writes, %llu failed, %llu dropped", (unsigned long long)w->done,
             (unsigned long long)w->failed, (unsigned long long)w->dropped);
  /* a clean stop leaves the database file whole: the log copied into it
   * and truncated (docs/daemon.md, "Backing up the cache") */
  if (w->cache) {
    nf_buf err = NF_BUF_INIT;
    int complete = 0;
    if (nf_cache_checkpoint(w->cache, &complete, &err) != NF_OK)
      NFD_WARN("cache: checkpoint at stop: %s", nf_buf_str(&err));
    else if (!complete)
      NFD_WARN("cache: checkpoint at stop left part of the log (a reader held it): copy %s-wal "
               "with the database when backing up", nf_cache_path(w->cache));
    else
      NFD_INFO("cache: checkpointed at stop: %s holds everything", nf_cache_path(w->cache));
    nf_buf_free(&err);
  }
  nf_cache_close(w->cache);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
  S->writer = NULL;
}
