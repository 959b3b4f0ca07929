/* fuzz_parse.c - libFuzzer target for the `.nf` parser and printer.
 *
 * Parses the input bytes (any bytes: NULs, invalid UTF-8, huge tokens);
 * the status must be NF_OK or NF_ESYNTAX.  When the input parses, its
 * canonical print must parse again to a structurally equal tree and print
 * identically (a fixed point); any violation abort()s so libFuzzer keeps
 * the input.  Built only with -Dfuzz=true (see meson.build here). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nf_ast.h"

/* In ast_print.c; declared here until nf_ast.h carries it. */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* nf_src text must be NUL-terminated just past len. */
  char *text = malloc(size + 1);
  if (!text) return 0;
  if (size) memcpy(text, data, size);
  text[size] = 0;
  nf_src src = {"fuzz.nf", text, size};
  nf_arena *a = nf_arena_new();
  nf_diag *d = nf_diag_new();
  if (!a || !d) abort();
  nf_ast_file *f = NULL;
  int rc = nf__parse(a, &src, d, &f);
  if (rc != NF_OK && rc != NF_ESYNTAX) {
    fprintf(stderr, "unexpected status %d\n", rc);
    abort();
  }
  if (rc == NF_ESYNTAX) {
    if (f || nf_diag_count(d) == 0) abort();
    (void)nf_diag_text(d); /* render every message (source line, caret) */
  } else {
    nf_buf p1 = NF_BUF_INIT, p2 = NF_BUF_INIT;
    nf__ast_print_file(f, &p1);
    nf_src src2 = {"printed.nf", nf_buf_str(&p1), p1.len};
    nf_ast_file *g = NULL;
    if (p1.oom || nf__parse(a, &src2, d, &g) != NF_OK) {
      fprintf(stderr, "printed text does not parse:\n%s\n%s\n",
              nf_diag_text(d), nf_buf_str(&p1));
      abort();
    }
    if (!nf__ast_file_equal(f, g)) {
      fprintf(stderr, "re-parse differs:\n%s\n", nf_buf_str(&p1));
      abort();
    }
    nf__ast_print_file(g, &p2);
    if (strcmp(nf_buf_str(&p1), nf_buf_str(&p2)) != 0) {
      fprintf(stderr, "not a fixed point:\n%s\n---\n%s\n", nf_buf_str(&p1),
              nf_buf_str(&p2));
      abort();
    }
    nf_buf_free(&p1);
    nf_buf_free(&p2);
  }
  nf_diag_free(d);
  nf_arena_free(a);
  free(text);
  return 0;
}
