/* nf_diag.h - located diagnostics for users.
 *
 * A diagnostic list collects errors like SQLite's Parse: it counts every
 * error and keeps the text of the first NF_DIAG_KEEP.  An error with a
 * location renders as
 *     file:line:col: error: message
 *       <the source line>
 *       ^
 * Sources (nf_src) are registered by whoever owns the text and must
 * outlive every diagnostic that points into them. */
#ifndef NF_DIAG_H
#define NF_DIAG_H

#include <stddef.h>
#include <stdint.h>

#include "nf_status.h"

#define NF_DIAG_KEEP 20

typedef struct nf_src {
  const char *name; /* file name as given by the user */
  const char *text; /* whole text, NUL-terminated */
  size_t len;
} nf_src;

typedef struct nf_loc {
  const nf_src *src; /* NULL: no location */
  uint32_t line, col; /* 1-based; col counts bytes */
} nf_loc;

typedef struct nf_diag nf_diag;

/* Creates an empty list; NULL on allocation failure. */
nf_diag *nf_diag_new(void);
void nf_diag_free(nf_diag *d);
/* Records an error at loc (loc.src may be NULL). */
void nf_diag_error(nf_diag *d, nf_loc loc, const char *fmt, ...) NF_PRINTF(3, 4);
/* Appends a note (a continuation of the previous error, not counted). */
void nf_diag_note(nf_diag *d, nf_loc loc, const char *fmt, ...) NF_PRINTF(3, 4);
/* Number of errors recorded (including those whose text was dropped). */
int nf_diag_count(const nf_diag *d);
/* All kept messages, newline-terminated; valid until the next call on d. */
const char *nf_diag_text(const nf_diag *d);
/* Forgets every message. */
void nf_diag_clear(nf_diag *d);

/* "Did you mean": the candidate closest to word by edit distance (an
 * insertion, deletion, substitution or swap of neighbours each counts 1,
 * a change of case half), when that distance is at most a third of word's
 * length (at most 3; for a word of one or two letters, a change of case:
 * `x` suggests `X`, `j` nothing) and the candidate is not word itself;
 * else NULL.  NULL entries of cands are skipped. */
const char *nf_did_you_mean(const char *word, const char *const *cands, int n);

#endif
