/* ptrmap.c - the one pointer map (nf_ptrmap.h). */
#include "nf_ptrmap.h"

#include <stdlib.h>
#include <string.h>

#include "nf_status.h"

uint64_t nf_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

static size_t slot_of(const void *key, size_t cap) {
  return (size_t)nf_mix64((uint64_t)(uintptr_t)key) & (cap - 1);
}

int nf_ptrmap_get(const nf_ptrmap *m, const void *key, uint64_t *val) {
  if (m->cap == 0) return 0;
  for (size_t i = slot_of(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
    const nf_ptrslot *s = &m->slots[i];
    if (s->gen != m->gen) return 0;
    if (s->key == key) {
      if (val) *val = s->val;
      return 1;
    }
  }
}

static int grow(nf_ptrmap *m) {
  size_t ncap = m->cap ? m->cap * 2 : 64;
  if (ncap > SIZE_MAX / sizeof(nf_ptrslot)) return NF_ENOMEM;
  nf_ptrslot *ns = calloc(ncap, sizeof(*ns));
  if (!ns) return NF_ENOMEM;
  uint32_t gen = m->gen ? m->gen : 1; /* calloc'd slots (gen 0) are empty */
  for (size_t i = 0; m->gen && i < m->cap; i++) {
    const nf_ptrslot *s = &m->slots[i];
    if (s->gen != m->gen) continue;
    size_t j = slot_of(s->key, ncap);
    while (ns[j].gen == gen) j = (j + 1) & (ncap - 1);
    ns[j] = *s;
  }
  free(m->slots);
  m->slots = ns;
  m->cap = ncap;
  m->gen = gen;
  return NF_OK;
}

int nf_ptrmap_put(nf_ptrmap *m, const void *key, uint64_t val) {
  if ((m->count + 1) * 2 > m->cap || m->gen == 0) {
    int rc = grow(m);
    if (rc) return rc;
  }
  size_t i = slot_of(key, m->cap);
  for (;; i = (i + 1) & (m->cap - 1)) {
    nf_ptrslot *s = &m->slots[i];
    if (s->gen != m->gen) break;
    if (s->key == key) {
      s->val = val;
      return NF_OK;
    }
  }
  m->slots[i].key = key;
  m->slots[i].val = val;
  m->slots[i].gen = m->gen;
  m->count++;
  return NF_OK;
}

int nf_ptrmap_next(const nf_ptrmap *m, size_t *i, const void **key, uint64_t *val) {
  for (; *i < m->cap; (*i)++) {
    const nf_ptrslot *s = &m->slots[*i];
    if (s->gen != m->gen || !m->gen) continue;
    if (key) *key = s->key;
    if (val) *val = s->val;
    (*i)++;
    return 1;
  }
  return 0;
}

void nf_ptrmap_clear(nf_ptrmap *m) {
  m->count = 0;
  if (!m->cap) return;
  m->gen++;
  if (m->gen == 0) { /* the stamp wrapped: empty every slot for real */
    for (size_t i = 0; i < m->cap; i++) m->slots[i].gen = 0;
    m->gen = 1;
  }
}

void nf_ptrmap_free(nf_ptrmap *m) {
  free(m->slots);
  memset(m, 0, sizeof *m);
}

nf_ptrmap *nf_ptrmap_new(void) { return calloc(1, sizeof(nf_ptrmap)); }

void nf_ptrmap_delete(nf_ptrmap *m) {
  if (!m) return;
  free(m->slots);
  free(m);
}
