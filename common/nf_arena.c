/* nf_arena.c - chunked bump allocator (see nf_arena.h). */
#include "nf_arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NF_ARENA_CHUNK (64u * 1024u)

typedef struct nf_chunk {
  struct nf_chunk *next;
  size_t size, used;
  _Alignas(16) unsigned char data[];
} nf_chunk;

struct nf_arena {
  nf_chunk *head;
  size_t total;
};

nf_arena *nf_arena_new(void) { return calloc(1, sizeof(nf_arena)); }

void nf_arena_free(nf_arena *a) {
  if (!a) return;
  nf_chunk *c = a->head;
  while (c) {
    nf_chunk *n = c->next;
    free(c);
    c = n;
  }
  free(a);
}

void *nf_arena_alloc(nf_arena *a, size_t n) {
  if (n > SIZE_MAX - 64) return NULL;
  n = (n + 15u) & ~(size_t)15u;
  if (n == 0) n = 16;
  nf_chunk *c = a->head;
  if (!c || c->size - c->used < n) {
    size_t sz = n > NF_ARENA_CHUNK ? n : NF_ARENA_CHUNK;
    nf_chunk *nc = malloc(sizeof(nf_chunk) + sz);
    if (!nc) return NULL;
    nc->size = sz;
    nc->used = 0;
    if (c && n > NF_ARENA_CHUNK) {
      /* A big block goes behind the current chunk so the space left in
       * the current chunk stays usable. */
      nc->next = c->next;
      c->next = nc;
    } else {
      nc->next = c;
      a->head = nc;
    }
    c = nc;
  }
  void *p = c->data + c->used;
  c->used += n;
  a->total += n;
  memset(p, 0, n);
  return p;
}

char *nf_arena_strndup(nf_arena *a, const char *s, size_t n) {
  char *p = nf_arena_alloc(a, n + 1);
  if (!p) return NULL;
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

char *nf_arena_strdup(nf_arena *a, const char *s) {
  return nf_arena_strndup(a, s, strlen(s));
}

size_t nf_arena_used(const nf_arena *a) { return a->total; }
