/* nf_diag.c - located diagnostics (see nf_diag.h). */
#include "nf_diag.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "nf_buf.h"

struct nf_diag {
  int n_errors;
  int n_kept;
  int last_kept; /* whether the previous error's text was kept */
  nf_buf text;
};

nf_diag *nf_diag_new(void) { return calloc(1, sizeof(nf_diag)); }

void nf_diag_free(nf_diag *d) {
  if (!d) return;
  nf_buf_free(&d->text);
  free(d);
}

static void render(nf_diag *d, nf_loc loc, const char *kind, const char *fmt,
                   va_list ap) {
  nf_buf *b = &d->text;
  if (loc.src)
    nf_buf_printf(b, "%s:%u:%u: %s: ", loc.src->name, loc.line, loc.col, kind);
  else
    nf_buf_printf(b, "%s: ", kind);
  nf_buf_vprintf(b, fmt, ap);
  nf_buf_putc(b, '\n');
  if (!loc.src || loc.line == 0) return;
  /* Find the source line. */
  const char *p = loc.src->text, *end = loc.src->text + loc.src->len;
  for (uint32_t l = 1; l < loc.line && p < end; p++)
    if (*p == '\n') l++;
  const char *e = p;
  while (e < end && *e != '\n') e++;
  nf_buf_puts(b, "  ");
  for (const char *q = p; q < e; q++) nf_buf_putc(b, *q == '\t' ? ' ' : *q);
  nf_buf_puts(b, "\n  ");
  for (uint32_t c = 1; c < loc.col && c <= (uint32_t)(e - p) + 1; c++)
    nf_buf_putc(b, ' ');
  nf_buf_puts(b, "^\n");
}

void nf_diag_error(nf_diag *d, nf_loc loc, const char *fmt, ...) {
  d->n_errors++;
  d->last_kept = d->n_kept < NF_DIAG_KEEP;
  if (!d->last_kept) return;
  d->n_kept++;
  va_list ap;
  va_start(ap, fmt);
  render(d, loc, "error", fmt, ap);
  va_end(ap);
}

void nf_diag_note(nf_diag *d, nf_loc loc, const char *fmt, ...) {
  if (!d->last_kept) return;
  va_list ap;
  va_start(ap, fmt);
  render(d, loc, "note", fmt, ap);
  va_end(ap);
}

int nf_diag_count(const nf_diag *d) { return d->n_errors; }

const char *nf_diag_text(const nf_diag *d) {
  if (d->n_errors > d->n_kept) {
    /* Cast away const only to append the summary once per call. */
    nf_diag *m = (nf_diag *)d;
    static const char tag[] = " more error(s) not shown\n";
    const char *s = nf_buf_str(&m->text);
    size_t n = strlen(s);
    if (n < sizeof tag || strcmp(s + n - (sizeof tag - 1), tag) != 0)
      nf_buf_printf(&m->text, "... %d%s", d->n_errors - d->n_kept, tag);
  }
  return nf_buf_str(&d->text);
}

void nf_diag_clear(nf_diag *d) {
  nf_buf_reset(&d->text);
  d->n_errors = d->n_kept = d->last_kept = 0;
}

/* Twice the edit distance of a and b (a change of case costs 1, any other
 * edit 2), with swaps of neighbours; stops early past limit. */
static int edit2(const char *a, const char *b, int limit) {
  size_t n = strlen(a), m = strlen(b);
  if (n > 64 || m > 64) return limit + 1;
  int d[65][65];
  for (size_t i = 0; i <= n; i++) d[i][0] = (int)i * 2;
  for (size_t j = 0; j <= m; j++) d[0][j] = (int)j * 2;
  for (size_t i = 1; i <= n; i++) {
    int best = limit + 1;
    for (size_t j = 1; j <= m; j++) {
      int c = a[i - 1] == b[j - 1] ? 0 : tolower((unsigned char)a[i - 1]) ==
                                                 tolower((unsigned char)b[j - 1]) ? 1 : 2;
      int v = d[i - 1][j - 1] + c;
      if (d[i - 1][j] + 2 < v) v = d[i - 1][j] + 2;
      if (d[i][j - 1] + 2 < v) v = d[i][j - 1] + 2;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          d[i - 2][j - 2] + 2 < v)
        v = d[i - 2][j - 2] + 2;
      d[i][j] = v;
      if (v < best) best = v;
    }
    if (best > limit) return limit + 1;
  }
  return d[n][m];
}

const char *nf_did_you_mean(const char *word, const char *const *cands, int n) {
  if (!word || !*word) return NULL;
  int len = (int)strlen(word), max = len / 3;
  if (max > 3) max = 3;
  const char *best = NULL;
  int bd = len < 3 ? 2 : 2 * max + 1; /* (a name of one or two letters: case only) */
  for (int k = 0; k < n; k++) {
    if (!cands[k] || !strcmp(cands[k], word)) continue;
    int e = edit2(word, cands[k], bd - 1);
    if (e < bd) {
      bd = e;
      best = cands[k];
    }
  }
  return best;
}
