/* model.c - models: `.nf` files and their imports loaded as modules
 * (nf_model_load, nf_model_load_source), and the error strings the
 * constructors of the API hand back (*err, malloc'd). */
#include <stdlib.h>
#include <string.h>

#include "session_int.h"

char *nf__session_err_dup(const char *what, const char *msg) {
  size_t n = strlen(what) + strlen(msg) + 3;
  char *e = malloc(n);
  if (e) snprintf(e, n, "%s%s%s", what, *what && *msg ? ": " : "", msg);
  return e;
}

void nf__session_err_set(char **err, const char *what, const char *msg) {
  if (err) *err = nf__session_err_dup(what, msg);
}

/* ---- models ---- */

static nf_model *model_load(const char *path, const char *name, const char *text, char **err) {
  if (err) *err = NULL;
  nf_model *m = calloc(1, sizeof *m);
  nf_diag *d = nf_diag_new();
  if (!m || !d || !(m->mod = nf_module_new())) {
    nf__session_err_set(err, "", "out of memory");
    goto fail;
  }
  int rc = path ? nf_module_load_file(m->mod, path, d)
                : nf_module_load_source(m->mod, name, text, d);
  if (rc != NF_OK) {
    nf__session_err_set(err, "", nf_diag_count(d) ? nf_diag_text(d) : nf_strerror(rc));
    goto fail;
  }
  nf_diag_free(d);
  return m;
fail:
  nf_diag_free(d);
  nf_model_free(m);
  return NULL;
}

nf_model *nf_model_load(const char *path, char **err) {
  if (!path) {
    nf__session_err_set(err, "", "no file given");
    return NULL;
  }
  return model_load(path, NULL, NULL, err);
}

nf_model *nf_model_load_source(const char *name, const char *text, char **err) {
  if (!text) {
    nf__session_err_set(err, "", "no text given");
    return NULL;
  }
  return model_load(NULL, name ? name : "<source>", text, err);
}

void nf_model_free(nf_model *m) {
  if (!m) return;
  nf_module_free(m->mod);
  free(m);
}

/* ---- building ---- */
