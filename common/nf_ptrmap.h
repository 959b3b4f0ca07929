/* nf_ptrmap.h - the one map from pointers to 64-bit values (ptrmap.c):
 * memo tables of expression rewriting, interpretation, lowering, code
 * generation and wire encoding, keyed by hash-consed nodes.
 *
 * Open addressing with linear probing, at most half full, keys hashed by
 * a strong 64-bit mixer (so arena addresses, aligned and close together,
 * spread).  Clearing is O(1): slots carry the generation that wrote them.
 * A map is a plain struct: NF_PTRMAP_INIT (all zero) is an empty map that
 * owns no memory until its first put; nf_ptrmap_free releases it and
 * leaves it empty.  NULL is not a key.
 *
 * Thread safety: none; one map per thread. */
#ifndef NF_PTRMAP_H
#define NF_PTRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct nf_ptrslot {
  const void *key;
  uint64_t val;
  uint32_t gen;
} nf_ptrslot;

typedef struct nf_ptrmap {
  nf_ptrslot *slots;
  size_t cap, count; /* cap is 0 or a power of two; count in this gen */
  uint32_t gen;      /* slots with another gen are empty (0 before use) */
} nf_ptrmap;

#define NF_PTRMAP_INIT {NULL, 0, 0, 0}

/* 1 and *val (may be NULL) when key is present, else 0. */
int nf_ptrmap_get(const nf_ptrmap *m, const void *key, uint64_t *val);
/* Sets key to val, inserting or overwriting; NF_OK or NF_ENOMEM (the map
 * unchanged). */
int nf_ptrmap_put(nf_ptrmap *m, const void *key, uint64_t val);
/* Removes every entry, keeping the memory. */
void nf_ptrmap_clear(nf_ptrmap *m);
/* Releases the memory; the map is empty again. */
void nf_ptrmap_free(nf_ptrmap *m);
/* Iteration in slot order: size_t i = 0; while (nf_ptrmap_next(m, &i,
 * &key, &val)) ...  (key, val may be NULL).  The map must not change
 * meanwhile. */
int nf_ptrmap_next(const nf_ptrmap *m, size_t *i, const void **key, uint64_t *val);
/* Entries in the map. */
static inline size_t nf_ptrmap_count(const nf_ptrmap *m) { return m->count; }

/* The same with pointer values. */
static inline int nf_ptrmap_getp(const nf_ptrmap *m, const void *key, const void **val) {
  uint64_t v;
  if (!nf_ptrmap_get(m, key, &v)) return 0;
  if (val) *val = (const void *)(uintptr_t)v;
  return 1;
}
static inline int nf_ptrmap_putp(nf_ptrmap *m, const void *key, const void *val) {
  return nf_ptrmap_put(m, key, (uint64_t)(uintptr_t)val);
}

/* For callers that keep a map behind a pointer: a new empty map, NULL
 * when out of memory; nf_ptrmap_delete frees it (NULL is a no-op). */
nf_ptrmap *nf_ptrmap_new(void);
void nf_ptrmap_delete(nf_ptrmap *m);

/* The mixer the map hashes with (splitmix64's finaliser). */
uint64_t nf_mix64(uint64_t x);

#endif
