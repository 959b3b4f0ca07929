/* tune.c - `neoflow tune` (tune.h): the search in-process, its progress
 * bar, curve (text, CSV, SVG) and JSON summary. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nf_search.h"
#include "nf_status.h"
#include "tune.h"

typedef struct bar {
  int tty;
  const char *label;
} bar;

static void progress(void *user, const nf_search_progress *p) {
  const bar *b = user;
  if (!b->tty) return;
  int width = 30, done = p->max_trials ? p->trial * width / p->max_trials : 0;
  char cells[64];
  for (int i = 0; i < width; i++) cells[i] = i < done ? '#' : '.';
  cells[width] = 0;
  fprintf(stderr, "\r%s [%s] %d/%d  best %.4g ms", b->label, cells, p->trial, p->max_trials,
          p->best_ms);
  if (p->default_ms > 0 && p->best_ms > 0)
    fprintf(stderr, " (%.2fx default)", p->default_ms / p->best_ms);
  fprintf(stderr, "  failed %d  %.0f s ", p->failures, p->elapsed_s);
  fflush(stderr);
}

/* best-so-far after each record (the default's record counts as trial 0) */
static double *best_curve(const nf_search_result *r) {
  double *c = calloc(r->n_records ? r->n_records : 1, sizeof *c), best = 0;
  if (!c) return NULL;
  for (size_t i = 0; i < r->n_records; i++) {
    const nf_search_record *x = &r->records[i];
    if (x->status == NF_MEAS_OK && (best <= 0 || x->time_ms < best)) best = x->time_ms;
    c[i] = best;
  }
  return c;
}

/* The first trial whose best-so-far is within 1/frac of the curve's final
 * best (90%: best_so_far <= final / 0.9).  The curve's own end, not the
 * re-measured best_ms, so that one lucky or unlucky second measurement
 * does not move it. */
static int trials_to(const nf_search_result *r, const double *c, double frac) {
  double final = r->n_records ? c[r->n_records - 1] : 0;
  for (size_t i = 0; i < r->n_records; i++)
    if (c[i] > 0 && c[i] <= final / frac) return r->records[i].trial;
  return r->trials;
}

/* The first trial whose best-so-far is at most target ms, or -1. */
static int first_reach(const nf_search_result *r, const double *c, double target) {
  for (size_t i = 0; i < r->n_records; i++)
    if (c[i] > 0 && c[i] <= target) return r->records[i].trial;
  return -1;
}

static int write_csv(const char *path, const nf_search_result *r, const double *c) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f, "trial,seconds,status,time_ms,best_ms\n");
  for (size_t i = 0; i < r->n_records; i++) {
    const nf_search_record *x = &r->records[i];
    fprintf(f, "%d,%.3f,%s,%.6g,%.6g\n", x->trial, x->at_s, nf_measure_status_name(x->status),
            x->time_ms, c[i]);
  }
  return fclose(f);
}

/* An SVG line plot of best-so-far time over trials: one or two curves
 * (model, random) and the default's time as a dashed line. */
static int write_svg(const char *path, const char *title, const nf_search_result *a,
                     const double *ca, const nf_search_result *b, const double *cb) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  const double W = 640, H = 400, L = 70, R = 20, T = 40, B = 50;
  double ymax = a->default_ms, ymin = a->best_ms;
  int xmax = a->trials;
  if (b) {
    if (b->default_ms > ymax) ymax = b->default_ms;
    if (b->best_ms > 0 && b->best_ms < ymin) ymin = b->best_ms;
    if (b->trials > xmax) xmax = b->trials;
  }
  for (size_t i = 0; i < a->n_records; i++)
    if (ca[i] > ymax) ymax = ca[i];
  if (ymax <= 0) ymax = 1;
  if (ymin <= 0 || ymin > ymax) ymin = 0;
  ymin *= 0.9;
  if (xmax < 1) xmax = 1;
  double sx = (W - L - R) / xmax, sy = (H - T - B) / (ymax - ymin > 0 ? ymax - ymin : 1);
#define PX(t) (L + (t) * sx)
#define PY(v) (H - B - ((v) - ymin) * sy)
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
             "font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  fprintf(f, "<text x=\"%.0f\" y=\"24\" font-size=\"15\">%s: best time so far</text>\n", L, title);
  fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, H - B,
          W - R, H - B);
  fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T, L,
          H - B);
  for (int k = 0; k <= 4; k++) {
    double v = ymin + (ymax - ymin) * k / 4;
    fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", L - 6, PY(v) + 4, v);
    int t = xmax * k / 4;
    fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%d</text>\n", PX(t), H - B + 18,
            t);
  }
  fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">trials</text>\n", (L + W - R) / 2,
          H - 12);
  fprintf(f, "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" "
             "text-anchor=\"middle\">ms per run</text>\n", (T + H - B) / 2, (T + H - B) / 2);
  if (a->default_ms > 0)
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"gray\" "
               "stroke-dasharray=\"5,4\"/>\n<text x=\"%.0f\" y=\"%.1f\" fill=\"gray\" "
               "text-anchor=\"end\">default %.3g ms</text>\n",
            L, PY(a->default_ms), W - R, PY(a->default_ms), W - R, PY(a->default_ms) - 4,
            a->default_ms);
  const nf_search_result *rs[2] = {a, b};
  const double *cs[2] = {ca, cb};
  const char *col[2] = {"#1f6feb", "#d1242f"};
  const char *lab[2] = {b ? "cost model" : "search", "random search"};
  for (int q = 0; q < 2; q++) {
    if (!rs[q]) continue;
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col[q]);
    for (size_t i = 0; i < rs[q]->n_records; i++)
      if (cs[q][i] > 0)
        fprintf(f, "%.1f,%.1f ", PX(rs[q]->records[i].trial < 0 ? 0 : rs[q]->records[i].trial),
                PY(cs[q][i]));
    fprintf(f, "\"/>\n<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">%s (best %.3g ms)</text>\n",
            W - R - 200, T + 16 + 16 * q, col[q], lab[q], rs[q]->best_ms);
  }
#undef PX
#undef PY
  fprintf(f, "</svg>\n");
  return fclose(f);
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c == '\n')
      fputs("\\n", f);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

static int run_one(const nf_graph *g, const nf_tune_cli *t, int random_search,
                   nf_search_result *res) {
  nf_search_opts o;
  memset(&o, 0, sizeof o);
  o.max_trials = t->trials > 0 ? t->trials : 200;
  o.max_seconds = t->seconds;
  o.seed = t->seed;
  o.random_search = random_search;
  o.target = t->target;
  o.cuda_sm = t->cuda_sm;
  o.measure.n_threads = t->threads > 0 ? t->threads : 1;
  bar b = {.tty = !t->json && isatty(2), .label = random_search ? "random" : "tune"};
  o.progress = progress;
  o.user = &b;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_search_run(g, &o, res, &err);
  if (b.tty) fputc('\n', stderr);
  if (rc != NF_OK) {
    fprintf(stderr, "neoflow: error: tuning %s: %s (%s)\n", t->def, nf_buf_str(&err),
            nf_status_name(rc));
    nf_buf_free(&err);
    return 1;
  }
  nf_buf_free(&err);
  return 0;
}

static void print_curve(const nf_search_result *r, const double *c) {
  printf("best-so-far (trial: ms):");
  double last = -1;
  for (size_t i = 0; i < r->n_records; i++)
    if (c[i] > 0 && c[i] != last) {
      printf(" %d:%.4g", r->records[i].trial, c[i]);
      last = c[i];
    }
  printf("\n");
}

int nf_tune_main(const nf_graph *g, const nf_tune_cli *t) {
  nf_search_result a, b;
  memset(&b, 0, sizeof b);
  int rc = 1, have_b = 0;
  double *ca = NULL, *cb = NULL;
  if (run_one(g, t, t->random_search, &a)) return 1;
  if (t->compare_random && !t->random_search) {
    if (run_one(g, t, 1, &b)) goto done;
    have_b = 1;
  }
  ca = best_curve(&a);
  cb = have_b ? best_curve(&b) : NULL;
  if (!ca || (have_b && !cb)) goto done;
  if (a.best_ms <= 0) {
    fprintf(stderr, "neoflow: error: tuning %s: no candidate ran correctly (%d failed)\n", t->def,
            a.failures + (a.n_records && a.records[0].trial == 0));
    for (size_t i = 0; i < a.n_records && i < 3; i++)
      fprintf(stderr, "  trial %d: %s: %s\n", a.records[i].trial,
              nf_measure_status_name(a.records[i].status), a.records[i].reason);
    goto done;
  }
  double gflops = a.flops / (a.best_ms * 1e6);
  int t90 = trials_to(&a, ca, 0.9);
  if (t->csv && write_csv(t->csv, &a, ca)) {
    fprintf(stderr, "neoflow: error: cannot write '%s': %s\n", t->csv, strerror(errno));
    goto done;
  }
  if (t->svg && write_svg(t->svg, t->def, &a, ca, have_b ? &b : NULL, cb)) {
    fprintf(stderr, "neoflow: error: cannot write '%s': %s\n", t->svg, strerror(errno));
    goto done;
  }
  if (t->out) {
    FILE *f = fopen(t->out, "w");
    if (!f || fputs(a.best_schedule, f) < 0 || fclose(f) != 0) {
      fprintf(stderr, "neoflow: error: cannot write '%s': %s\n", t->out, strerror(errno));
      goto done;
    }
  }
  if (t->json) {
    printf("{\"def\":");
    json_str(stdout, t->def);
    printf(",\"trials\":%d,\"failures\":%d,\"best_ms\":%.6g,\"default_ms\":%.6g,"
           "\"gflops\":%.4g,\"speedup\":%.4g,\"seconds\":%.2f,\"trials_to_90\":%d,"
           "\"stopped_early\":%s",
           a.trials, a.failures, a.best_ms, a.default_ms, gflops,
           a.default_ms > 0 ? a.default_ms / a.best_ms : 0, a.seconds, t90,
           a.stopped_early ? "true" : "false");
    if (have_b)
      printf(",\"random\":{\"trials\":%d,\"best_ms\":%.6g,\"model_trials_to_random_best\":%d}",
             b.trials, b.best_ms, b.best_ms > 0 ? first_reach(&a, ca, b.best_ms) : -1);
    printf(",\"schedule\":");
    json_str(stdout, a.best_schedule);
    printf("}\n");
  } else {
    printf("%s: %d trials (%d failed) in %.1f s%s\n", t->def, a.trials, a.failures, a.seconds,
           a.stopped_early ? " (stopped early: no gain)" : "");
    printf("default %.4g ms, best %.4g ms (%.2fx), %.3g GFLOP/s; 90%% of the best at trial %d\n",
           a.default_ms, a.best_ms, a.default_ms > 0 ? a.default_ms / a.best_ms : 0, gflops, t90);
    print_curve(&a, ca);
    if (have_b) {
      printf("random search: best %.4g ms after %d trials; the model reached it at trial %d\n",
             b.best_ms, b.trials, b.best_ms > 0 ? first_reach(&a, ca, b.best_ms) : -1);
      print_curve(&b, cb);
    }
    if (!t->out) printf("best schedule:\n%s", a.best_schedule);
  }
  rc = 0;
done:
  free(ca);
  free(cb);
  nf_search_result_free(&a);
  if (have_b) nf_search_result_free(&b);
  return rc;
}
