/* nf_arena.h - bump allocator for objects that die together.
 *
 * IR nodes, AST nodes and per-compilation scratch come from an arena and
 * are freed in one call.  Allocation never moves earlier objects.  An
 * arena is single-threaded.  nf_arena_alloc returns zeroed memory aligned
 * to 16 bytes, or NULL when malloc fails (callers turn that into
 * NF_ENOMEM). */
#ifndef NF_ARENA_H
#define NF_ARENA_H

#include <stddef.h>

typedef struct nf_arena nf_arena;

/* Creates an empty arena; NULL on allocation failure. */
nf_arena *nf_arena_new(void);
/* Frees the arena and everything allocated from it.  NULL is a no-op. */
void nf_arena_free(nf_arena *a);
/* Returns n zeroed bytes valid until nf_arena_free, or NULL. */
void *nf_arena_alloc(nf_arena *a, size_t n);
/* Copies n bytes of s plus a terminating NUL into the arena. */
char *nf_arena_strndup(nf_arena *a, const char *s, size_t n);
/* Copies a NUL-terminated string into the arena. */
char *nf_arena_strdup(nf_arena *a, const char *s);
/* Bytes handed out so far (for tests and memory accounting). */
size_t nf_arena_used(const nf_arena *a);

#endif
