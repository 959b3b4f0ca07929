/* report.c - the training report (neoflow.h: nf_session_report_to,
 * nf_session_report, nf_session_note; docs/report.md): one self-contained
 * HTML page, inline SVG and CSS, no script and nothing fetched, that a
 * person reads the run from:
 *   - step time over the run (a log scale when it spans more than 20x),
 *     the tier mix of the entries below it, and each kernel's arrival
 *     marked (a title names the entry);
 *   - the loss, and every metric the program noted (test accuracy);
 *   - the partitioned training graph: a box per op (its entry's name, what
 *     it computes, share of step time, tier, GFLOP/s), coloured by tier,
 *     in layers by data dependence, arrows for the data between them;
 *   - each entry's tuning curve (best time against trials, as the daemon
 *     reported its search);
 *   - the per-kernel profile since the kernels last changed.
 *
 * What the page shows is collected as the session runs, in bounded
 * memory whatever its length: the step history is kept as at most
 * NF_REPORT_POINTS points, pairs merged (their mean) when it fills, so a
 * point stands for 1, 2, 4 ... steps; kernel arrivals up to
 * NF_REPORT_EVENTS; NF_REPORT_METRICS metrics of NF_REPORT_POINTS points;
 * NF_TUNE_POINTS points per tuning curve (nf_ktable.h).
 *
 * The page is written to PATH.tmp and renamed over PATH: a reader never
 * sees half of it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nf_clock.h"
#include "nf_flops.h"
#include "nf_status.h"
#include "session_int.h"

#define NF_REPORT_POINTS 2048
#define NF_REPORT_EVENTS 4096
#define NF_REPORT_METRICS 8

typedef struct rpoint {
  int64_t step;    /* the last step it stands for */
  double ms, loss; /* means over its steps */
  uint16_t t0, t1, t2; /* entries on tier 0, 1, 2 at its end */
} rpoint;

typedef struct revent {
  int64_t step;
  int kent, tier;
} revent;

typedef struct rseries {
  char name[48];
  int n;
  int64_t stride;
  int64_t step[NF_REPORT_POINTS];
  double v[NF_REPORT_POINTS];
} rseries;

struct nf__report {
  char *path;
  double every_s, t_last;
  int warned;
  rpoint pts[NF_REPORT_POINTS];
  int n_pts;
  int64_t stride;        /* steps per point */
  int64_t b_n;           /* the open point's steps so far */
  double b_ms, b_loss;
  revent ev[NF_REPORT_EVENTS];
  int n_ev;
  int64_t ev_dropped;
  rseries *m[NF_REPORT_METRICS];
  int n_m;
  /* the profile since the kernels last changed */
  int64_t prof_swaps, prof_steps;
  double *prof_ms;
  int n_prof;
};

static struct nf__report *rep(nf_session *s) {
  if (!s->rep) {
    s->rep = calloc(1, sizeof *s->rep);
    if (s->rep) {
      s->rep->stride = 1;
      s->rep->every_s = 60;
    }
  }
  return s->rep;
}

int nf__report_has_path(const nf_session *s) { return s->rep && s->rep->path; }

void nf__report_free(nf_session *s) {
  if (!s->rep) return;
  for (int i = 0; i < s->rep->n_m; i++) free(s->rep->m[i]);
  free(s->rep->prof_ms);
  free(s->rep->path);
  free(s->rep);
  s->rep = NULL;
}

/* The tier an entry runs now: 2, 1, or 0 (tier 0, or a kernel kept out). */
static int tier_now(const nf__kent *k) {
  return k->cur && !k->prefer_t0 && k->cur_tier >= 1 ? k->cur_tier : 0;
}

static void merge_points(struct nf__report *r) {
  int n = r->n_pts / 2;
  for (int i = 0; i < n; i++) {
    rpoint a = r->pts[2 * i], b = r->pts[2 * i + 1];
    r->pts[i] = b;
    r->pts[i].ms = (a.ms + b.ms) / 2;
    r->pts[i].loss = (a.loss + b.loss) / 2;
  }
  r->n_pts = n;
  r->stride *= 2;
}

void nf__report_step(nf_session *s) {
  struct nf__report *r = rep(s);
  if (!r) return;
  r->b_n++;
  r->b_ms += s->last_ms;
  r->b_loss += s->last_loss;
  if (r->b_n >= r->stride) {
    if (r->n_pts == NF_REPORT_POINTS) merge_points(r);
    rpoint *p = &r->pts[r->n_pts++];
    p->step = s->step;
    p->ms = r->b_ms / (double)r->b_n;
    p->loss = r->b_loss / (double)r->b_n;
    p->t0 = p->t1 = p->t2 = 0;
    for (int i = 0; i < s->kt.n_kents; i++) {
      int t = tier_now(&s->kt.kents[i]);
      if (t == 2) p->t2++;
      else if (t == 1) p->t1++;
      else p->t0++;
    }
    r->b_n = 0;
    r->b_ms = r->b_loss = 0;
  }
  /* the profile: since the kernels last changed, on timed steps */
  if (!r->prof_ms || r->n_prof != s->kt.n_kents) {
    free(r->prof_ms);
    r->prof_ms = calloc((size_t)s->kt.n_kents + 1, sizeof *r->prof_ms);
    r->n_prof = r->prof_ms ? s->kt.n_kents : 0;
    r->prof_steps = 0;
  }
  if (r->prof_swaps != s->swaps) {
    r->prof_swaps = s->swaps;
    r->prof_steps = 0;
    for (int i = 0; i < r->n_prof; i++) r->prof_ms[i] = 0;
  }
  if (r->prof_ms && (!s->kt.dev->timed || s->kt.dev->timed(s))) {
    for (int i = 0; i < r->n_prof; i++) r->prof_ms[i] += s->kt.kents[i].run_ms;
    r->prof_steps++;
  }
}

const char *nf__report_due(nf_session *s) {
  struct nf__report *r = s->rep;
  if (!r || !r->path) return NULL;
  double now = nf_now_ms() / 1000;
  if (r->t_last == 0) r->t_last = now;
  if (now - r->t_last < r->every_s) return NULL;
  r->t_last = now;
  return r->path;
}

const char *nf__report_path(const nf_session *s) { return s->rep ? s->rep->path : NULL; }

int nf__report_warn_once(nf_session *s) {
  if (!s->rep || s->rep->warned) return 0;
  s->rep->warned = 1;
  return 1;
}

void nf__report_swap(nf_session *s, const nf__kent *k) {
  struct nf__report *r = rep(s);
  if (!r) return;
  if (r->n_ev == NF_REPORT_EVENTS) {
    r->ev_dropped++;
    return;
  }
  revent *e = &r->ev[r->n_ev++];
  e->step = s->step + 1; /* (the step it runs in) */
  e->kent = (int)(k - s->kt.kents);
  e->tier = k->cur_tier;
}

int nf_session_report_to(nf_session *s, const char *path, double every_s) {
  if (!s) return NF_EINVAL;
  struct nf__report *r = rep(s);
  if (!r) return NF_ENOMEM;
  char *p = path && *path ? strdup(path) : NULL;
  if (path && *path && !p) return NF_ENOMEM;
  free(r->path);
  r->path = p;
  r->every_s = every_s > 0 ? every_s : 60;
  r->t_last = nf_now_ms() / 1000;
  return NF_OK;
}

int nf_session_note(nf_session *s, const char *metric, double value) {
  if (!s) return NF_EINVAL;
  nf_buf_reset(&s->err);
  if (!metric || !*metric || strlen(metric) >= 48 || !isfinite(value)) {
    nf_buf_printf(&s->err, "nf_session_note: a metric's name of 1 to 47 bytes and a finite "
                           "value, not %s = %g", metric ? metric : "(null)", value);
    return NF_EINVAL;
  }
  struct nf__report *r = rep(s);
  if (!r) return NF_ENOMEM;
  rseries *m = NULL;
  for (int i = 0; i < r->n_m && !m; i++)
    if (!strcmp(r->m[i]->name, metric)) m = r->m[i];
  if (!m) {
    if (r->n_m == NF_REPORT_METRICS) {
      nf_buf_printf(&s->err, "nf_session_note: %s: a report charts at most %d metrics",
                    metric, NF_REPORT_METRICS);
      return NF_ELIMIT;
    }
    if (!(m = calloc(1, sizeof *m))) return NF_ENOMEM;
    snprintf(m->name, sizeof m->name, "%s", metric);
    m->stride = 1;
    r->m[r->n_m++] = m;
  }
  if (m->n == NF_REPORT_POINTS) { /* every other point kept */
    for (int i = 0; i < m->n / 2; i++) {
      m->step[i] = m->step[2 * i + 1];
      m->v[i] = m->v[2 * i + 1];
    }
    m->n /= 2;
  }
  m->step[m->n] = s->step;
  m->v[m->n++] = value;
  return NF_OK;
}

/* ---- writing ---- */

static void esc(nf_buf *b, const char *t) {
  for (; t && *t; t++) {
    switch (*t) {
      case '<': nf_buf_puts(b, "&lt;"); break;
      case '>': nf_buf_puts(b, "&gt;"); break;
      case '&': nf_buf_puts(b, "&amp;"); break;
      case '"': nf_buf_puts(b, "&quot;"); break;
      default:
        if ((unsigned char)*t >= 0x20 || *t == '\n') nf_buf_add(b, t, 1);
    }
  }
}

/* src into dst[n], cut on a character boundary with "..." when longer
 * (a box's line). */
static void cut(char *dst, size_t n, const char *src) {
  size_t len = strlen(src);
  if (len < n) {
    memcpy(dst, src, len + 1);
    return;
  }
  size_t k = n - 4;
  while (k > 0 && ((unsigned char)src[k] & 0xc0) == 0x80) k--;
  memcpy(dst, src, k);
  memcpy(dst + k, "...", 4);
}

static const char *tier_color(int t) {
  return t == 2 ? "#2e7d32" : t == 1 ? "#1565c0" : "#9e9e9e";
}

/* An axis: value to pixel, linear or log10. */
typedef struct axis {
  double lo, hi;
  int log;
  double p0, p1; /* pixels of lo and hi */
  int integer;   /* ticks at whole numbers only (steps, trials) */
} axis;

static double ax_px(const axis *a, double v) {
  double x0 = a->log ? log10(a->lo) : a->lo, x1 = a->log ? log10(a->hi) : a->hi;
  double x = a->log ? log10(v > a->lo ? v : a->lo) : v;
  return x1 > x0 ? a->p0 + (x - x0) / (x1 - x0) * (a->p1 - a->p0) : a->p0;
}

/* Tick values of a (at most ~8) into t; the count. */
static int ticks(const axis *a, double *t, int max) {
  int n = 0;
  if (a->log) {
    for (double d = pow(10, floor(log10(a->lo))); d <= a->hi * 1.0001 && n < max; d *= 10)
      for (int m = 1; m <= 5 && n < max; m = m == 1 ? 2 : m == 2 ? 5 : 6)
        if (d * m >= a->lo * 0.9999 && d * m <= a->hi * 1.0001) t[n++] = d * m;
    return n;
  }
  double span = a->hi - a->lo;
  if (!(span > 0)) {
    t[n++] = a->lo;
    return n;
  }
  double raw = span / 6, mag = pow(10, floor(log10(raw))), step = mag;
  if (raw / mag > 5) step = 10 * mag;
  else if (raw / mag > 2) step = 5 * mag;
  else if (raw / mag > 1) step = 2 * mag;
  if (a->integer && step < 1) step = 1;
  for (double v = ceil(a->lo / step) * step; v <= a->hi + step * 1e-6 && n < max; v += step)
    t[n++] = fabs(v) < step * 1e-9 ? 0 : v;
  return n;
}

static void fmt_num(char *o, size_t n, double v) {
  if (v == 0) snprintf(o, n, "0");
  else if (fabs(v) >= 10000 || fabs(v) < 0.001) snprintf(o, n, "%.3g", v);
  else snprintf(o, n, "%.4g", v);
}

/* The frame of a chart: axes, ticks, grid, labels. */
static void frame(nf_buf *b, const axis *x, const axis *y, const char *xlabel, const char *ylabel) {
  double t[64];
  char s[32];
  int n = ticks(y, t, 64);
  for (int i = 0; i < n; i++) {
    double py = ax_px(y, t[i]);
    fmt_num(s, sizeof s, t[i]);
    nf_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
                     "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%s</text>\n",
                  x->p0, py, x->p1, py, x->p0 - 4, py + 4, s);
  }
  n = ticks(x, t, 64);
  for (int i = 0; i < n; i++) {
    double px = ax_px(x, t[i]);
    fmt_num(s, sizeof s, t[i]);
    nf_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"middle\">%s</text>\n",
                  px, y->p0 + 14, s);
  }
  nf_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"axis\"/>"
                   "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"axis\"/>\n",
                x->p0, y->p0, x->p1, y->p0, x->p0, y->p0, x->p0, y->p1);
  nf_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" class=\"label\" text-anchor=\"middle\">", 
                (x->p0 + x->p1) / 2, y->p0 + 30);
  esc(b, xlabel);
  nf_buf_printf(b, "</text><text x=\"14\" y=\"%.1f\" class=\"label\" text-anchor=\"middle\" "
                   "transform=\"rotate(-90 14 %.1f)\">", (y->p0 + y->p1) / 2, (y->p0 + y->p1) / 2);
  esc(b, ylabel);
  nf_buf_puts(b, "</text>\n");
}

static void polyline(nf_buf *b, const axis *x, const axis *y, const int64_t *xs, const double *ys,
                     int n, const char *cls) {
  nf_buf_printf(b, "<polyline class=\"%s\" points=\"", cls);
  for (int i = 0; i < n; i++)
    if (isfinite(ys[i]) && (!y->log || ys[i] > 0))
      nf_buf_printf(b, "%.1f,%.1f ", ax_px(x, (double)xs[i]), ax_px(y, ys[i]));
  nf_buf_puts(b, "\"/>\n");
}

static const char *entry_label(const nf__kent *k) {
  const char *n = k->g && k->g->name ? k->g->name : "?";
  const char *h = strchr(n, '#');
  return h ? h : n; /* "#4 L.Z": the model's name is in the page's title */
}

static void step_chart(nf_buf *b, nf_session *s, const struct nf__report *r) {
  int n = r->n_pts;
  nf_buf_puts(b, "<section id=\"step-time\"><h2>Step time</h2>\n");
  if (!n) {
    nf_buf_puts(b, "<p>No step yet.</p></section>\n");
    return;
  }
  int64_t *xs = malloc(sizeof(int64_t) * (size_t)n);
  double *ys = malloc(sizeof(double) * (size_t)n);
  if (!xs || !ys) {
    free(xs);
    free(ys);
    nf_buf_puts(b, "<p>(out of memory)</p></section>\n");
    return;
  }
  double lo = INFINITY, hi = 0;
  for (int i = 0; i < n; i++) {
    xs[i] = r->pts[i].step;
    ys[i] = r->pts[i].ms;
    if (ys[i] > 0 && ys[i] < lo) lo = ys[i];
    if (ys[i] > hi) hi = ys[i];
  }
  if (!(lo < INFINITY)) lo = 0.001;
  if (!(hi > lo)) hi = lo * 2;
  const double W = 900, H = 300, L = 70, T = 20, STRIP = 36;
  axis x = {xs[0] > 1 ? (double)xs[0] : 1, (double)xs[n - 1] > 1 ? (double)xs[n - 1] : 2, 0, L,
            W - 20, 1};
  if (!(x.hi > x.lo)) x.hi = x.lo + 1;
  axis y = {hi / lo > 20 ? lo * 0.8 : 0, hi * 1.05, hi / lo > 20, T + H - 60, T, 0};
  nf_buf_printf(b, "<p>ms per step%s (a point stands for %lld step%s: their mean); below, the "
                   "entries on each tier; a mark for each kernel that arrived (its title names it)."
                   "</p>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                   "viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"step time\">\n",
                y.log ? ", log scale" : "", (long long)r->stride, r->stride == 1 ? "" : "s", W,
                H + STRIP + 20, W, H + STRIP + 20);
  frame(b, &x, &y, "step", "ms per step");
  /* arrivals */
  for (int i = 0; i < r->n_ev; i++) {
    const revent *e = &r->ev[i];
    if (e->kent < 0 || e->kent >= s->kt.n_kents) continue;
    double px = ax_px(&x, (double)e->step);
    nf_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                     "class=\"arrival\"><title>step %lld: ", px, y.p0, px, y.p1,
                  tier_color(e->tier), (long long)e->step);
    esc(b, s->kt.kents[e->kent].g ? s->kt.kents[e->kent].g->name : "?");
    nf_buf_printf(b, ": %s kernel</title></line>\n", e->tier == 2 ? "tuned (tier 2)"
                                                   : e->tier == 1 ? "default (tier 1)"
                                                                  : "generated");
  }
  polyline(b, &x, &y, xs, ys, n, "line");
  /* the tier mix */
  double sy = H - 10;
  int total = r->pts[0].t0 + r->pts[0].t1 + r->pts[0].t2;
  for (int i = 0; i < n && total > 0; i++) {
    double xa = ax_px(&x, i ? (double)xs[i - 1] : x.lo), xb = ax_px(&x, (double)xs[i]);
    if (xb - xa < 0.5) xb = xa + 0.5;
    const rpoint *p = &r->pts[i];
    double h0 = STRIP * p->t0 / total, h1 = STRIP * p->t1 / total, h2 = STRIP * p->t2 / total;
    nf_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>"
                     "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>"
                     "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n",
                  xa, sy, xb - xa, h2, tier_color(2), xa, sy + h2, xb - xa, h1, tier_color(1), xa,
                  sy + h2 + h1, xb - xa, h0, tier_color(0));
  }
  nf_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">tiers</text>\n",
                L - 4, sy + STRIP / 2 + 4);
  nf_buf_puts(b, "</svg>\n<p class=\"legend\"><span style=\"color:#2e7d32\">&#9632;</span> tier 2 "
                 "(tuned) <span style=\"color:#1565c0\">&#9632;</span> tier 1 (the daemon's "
                 "default) <span style=\"color:#9e9e9e\">&#9632;</span> tier 0 (fallback)</p>\n");
  if (r->ev_dropped)
    nf_buf_printf(b, "<p>%lld later arrivals are not marked.</p>\n", (long long)r->ev_dropped);
  nf_buf_puts(b, "</section>\n");
  free(xs);
  free(ys);
}

static void series_chart(nf_buf *b, const char *id, const char *title, const char *ylabel,
                         const int64_t *xs, const double *ys, int n) {
  nf_buf_printf(b, "<section id=\"%s\"><h2>", id);
  esc(b, title);
  nf_buf_puts(b, "</h2>\n");
  if (!n) {
    nf_buf_puts(b, "<p>No value yet.</p></section>\n");
    return;
  }
  double lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < n; i++)
    if (isfinite(ys[i])) {
      if (ys[i] < lo) lo = ys[i];
      if (ys[i] > hi) hi = ys[i];
    }
  if (!(hi >= lo)) lo = 0, hi = 1;
  double pad = (hi - lo) * 0.05;
  if (!(pad > 0)) pad = fabs(hi) * 0.05 + 1e-6;
  const double W = 900, H = 240, L = 70;
  axis x = {(double)xs[0], (double)xs[n - 1], 0, L, W - 20, 1};
  if (!(x.hi > x.lo)) x.lo -= 1, x.hi += 1;
  axis y = {lo - pad, hi + pad, 0, H - 40, 14, 0};
  nf_buf_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                   "viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"%s\">\n", W, H, W, H, id);
  frame(b, &x, &y, "step", ylabel);
  polyline(b, &x, &y, xs, ys, n, "line");
  if (n <= 64)
    for (int i = 0; i < n; i++)
      if (isfinite(ys[i]))
        nf_buf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" class=\"dot\"><title>step %lld: "
                       "%.6g</title></circle>\n",
                    ax_px(&x, (double)xs[i]), ax_px(&y, ys[i]), (long long)xs[i], ys[i]);
  char last[32];
  fmt_num(last, sizeof last, ys[n - 1]);
  nf_buf_printf(b, "</svg>\n<p>Last: %s at step %lld.</p></section>\n", last, (long long)xs[n - 1]);
}

/* The per-entry shares of step time: from the profile (since the kernels
 * last changed), else the last timed step's. */
static double entry_ms(const nf_session *s, const struct nf__report *r, int k) {
  if (r->prof_steps > 0 && k < r->n_prof) return r->prof_ms[k] / (double)r->prof_steps;
  return s->kt.kents[k].share_ms;
}

/* The graph's edges, growing. */
typedef struct edges {
  int *from, *to;
  int n, cap;
} edges;

/* Edge i -> j; j's layer below i's.  NF_OK or NF_ENOMEM. */
static int add_edge(edges *E, int i, int j, int *layer) {
  if (E->n == E->cap) {
    int cap = E->cap ? 2 * E->cap : 64;
    int *f = realloc(E->from, sizeof(int) * (size_t)cap);
    if (!f) return NF_ENOMEM;
    E->from = f;
    int *t = realloc(E->to, sizeof(int) * (size_t)cap);
    if (!t) return NF_ENOMEM;
    E->to = t;
    E->cap = cap;
  }
  E->from[E->n] = i;
  E->to[E->n++] = j;
  if (layer[i] + 1 > layer[j]) layer[j] = layer[i] + 1;
  return NF_OK;
}

static void graph_view(nf_buf *b, nf_session *s, const struct nf__report *r) {
  int n = s->n_ops;
  nf_buf_puts(b, "<section id=\"graph\"><h2>The partitioned training graph</h2>\n");
  int *layer = calloc((size_t)n + 1, sizeof(int));
  int *col = calloc((size_t)n + 1, sizeof(int));
  edges E = {0};
  if (!layer || !col) goto oom;
  /* an edge from the op that last wrote a buffer before j to j, for each
   * buffer j reads (slot by slot: the planner's sharing of bytes between
   * buffers with disjoint lifetimes is not data) */
  const char *g0 = (const char *)s->G, *g1 = (const char *)(s->G + s->n_flat);
  for (int j = 0; j < n; j++) {
    const nf__op *oj = &s->ops[j];
    /* the update reads the gradients in place: from every op writing into
     * the flat gradient vector */
    for (int i = 0; oj->alias && i < j; i++) {
      const nf__op *oi = &s->ops[i];
      int writes = 0;
      for (uint32_t q = oi->n_in; q < oi->n_in + oi->n_out && !writes; q++) {
        const char *a0 = oi->bufs[q], *a1 = a0 + s->slots[oi->slots[q]].bytes;
        writes = !oi->alias && a0 < g1 && a1 > g0;
      }
      if (!writes) continue;
      if (add_edge(&E, i, j, layer) != NF_OK) goto oom;
    }
    for (uint32_t a = 0; a < oj->n_in; a++) {
      int src = -1;
      for (int i = j - 1; i >= 0 && src < 0; i--) {
        const nf__op *oi = &s->ops[i];
        for (uint32_t q = oi->n_in; q < oi->n_in + oi->n_out; q++)
          if (oi->slots[q] == oj->slots[a]) src = i;
      }
      if (src < 0) continue;
      int dup = 0; /* (j's edges are the last ones added) */
      for (int e = E.n - 1; e >= 0 && E.to[e] == j && !dup; e--) dup = E.from[e] == src;
      if (dup) continue;
      if (add_edge(&E, src, j, layer) != NF_OK) goto oom;
    }
  }
  int n_layers = 0, per[4096] = {0}, widest = 1;
  for (int j = 0; j < n; j++) {
    if (layer[j] > 4095) layer[j] = 4095;
    col[j] = per[layer[j]]++;
    if (per[layer[j]] > widest) widest = per[layer[j]];
    if (layer[j] + 1 > n_layers) n_layers = layer[j] + 1;
  }
  const double BW = 250, BH = 64, GX = 24, GY = 44, M = 20;
  double W = M * 2 + widest * (BW + GX), H = M * 2 + n_layers * (BH + GY);
  double total = 0;
  for (int k = 0; k < s->kt.n_kents; k++) total += entry_ms(s, r, k);
  nf_buf_printf(b, "<p>%d ops in %d layers (each below what it reads); a box per op: its entry, "
                   "what it computes, its share of step time, its tier and GFLOP/s. Arrows carry "
                   "the data between them.</p>\n<div class=\"scroll\"><svg "
                   "xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 "
                   "0 %.0f %.0f\" role=\"img\" aria-label=\"graph\">\n<defs><marker id=\"arrow\" "
                   "viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\""
                   " orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\" "
                   "fill=\"#555\"/></marker></defs>\n",
                n, n_layers, W, H, W, H);
  for (int e = 0; e < E.n; e++) {
    int i = E.from[e], j = E.to[e];
    double x1 = M + col[i] * (BW + GX) + BW / 2, y1 = M + layer[i] * (BH + GY) + BH;
    double x2 = M + col[j] * (BW + GX) + BW / 2, y2 = M + layer[j] * (BH + GY);
    nf_buf_printf(b, "<path d=\"M %.1f %.1f C %.1f %.1f, %.1f %.1f, %.1f %.1f\" class=\"edge\" "
                     "marker-end=\"url(#arrow)\"/>\n",
                  x1, y1, x1, y1 + GY / 2, x2, y2 - GY / 2, x2, y2);
  }
  for (int j = 0; j < n; j++) {
    const nf__op *op = &s->ops[j];
    const nf__kent *k = &s->kt.kents[op->kent];
    double x0 = M + col[j] * (BW + GX), y0 = M + layer[j] * (BH + GY);
    double ms = entry_ms(s, r, op->kent) / (k->n_ops > 0 ? k->n_ops : 1);
    double share = total > 0 ? 100 * ms / total : 0;
    double gf = ms > 0 ? (double)k->flops / ms / 1e6 : 0;
    int t = tier_now(k);
    char sum[96];
    nf_graph_summary(k->g, sum, sizeof sum);
    nf_buf_printf(b, "<g><title>op %d, entry ", j);
    esc(b, k->g->name);
    nf_buf_puts(b, ": ");
    esc(b, sum);
    nf_buf_printf(b, "</title><rect x=\"%.1f\" y=\"%.1f\" width=\"%.0f\" height=\"%.0f\" rx=\"6\" "
                     "class=\"box\" style=\"stroke:%s\"/><rect x=\"%.1f\" y=\"%.1f\" width=\"6\" "
                     "height=\"%.0f\" fill=\"%s\"/>",
                  x0, y0, BW, BH, tier_color(t), x0, y0, BH, tier_color(t));
    nf_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" class=\"bname\">", x0 + 12, y0 + 17);
    char lab[40];
    cut(lab, sizeof lab, entry_label(k));
    esc(b, lab);
    nf_buf_printf(b, "</text><text x=\"%.1f\" y=\"%.1f\" class=\"bsum\">", x0 + 12, y0 + 35);
    char sm[40];
    cut(sm, sizeof sm, sum);
    esc(b, sm);
    nf_buf_printf(b, "</text><text x=\"%.1f\" y=\"%.1f\" class=\"bstat\">%.1f%% &#183; %s &#183; "
                     "%.2f GFLOP/s</text></g>\n",
                  x0 + 12, y0 + 54, share, t == 2 ? "tier 2" : t == 1 ? "tier 1" : "tier 0", gf);
  }
  nf_buf_puts(b, "</svg></div></section>\n");
  free(layer);
  free(col);
  free(E.from);
  free(E.to);
  return;
oom:
  free(layer);
  free(col);
  free(E.from);
  free(E.to);
  nf_buf_puts(b, "<p>(out of memory)</p></section>\n");
}

static void tuning_view(nf_buf *b, nf_session *s) {
  nf_buf_puts(b, "<section id=\"tuning\"><h2>Tuning curves</h2>\n<p>For each entry the daemon "
                 "tuned, the best time it had found against the trials it had measured, as it "
                 "reported its search (the dashed line: the default schedule's time).</p>\n"
                 "<div class=\"grid\">\n");
  int shown = 0;
  pthread_mutex_lock(&s->kt.mu);
  for (int k = 0; k < s->kt.n_kents; k++) {
    const nf__kent *e = &s->kt.kents[k];
    if (e->n_tune == 0) continue;
    shown++;
    int64_t xs[NF_TUNE_POINTS];
    double ys[NF_TUNE_POINTS];
    double lo = INFINITY, hi = e->tune_default > 0 ? e->tune_default : 0;
    for (int i = 0; i < e->n_tune; i++) {
      xs[i] = (int64_t)e->tune_x[i];
      ys[i] = e->tune_y[i];
      if (ys[i] < lo) lo = ys[i];
      if (ys[i] > hi) hi = ys[i];
    }
    const double W = 280, H = 170;
    axis x = {0, xs[e->n_tune - 1] > 0 ? (double)xs[e->n_tune - 1] : 1, 0, 50, W - 10, 1};
    axis y = {0, hi * 1.1 > 0 ? hi * 1.1 : 1, 0, H - 34, 26, 0};
    nf_buf_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                     "viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"tuning\">\n"
                     "<text x=\"6\" y=\"14\" class=\"bname\">", W, H, W, H);
    esc(b, e->g->name);
    nf_buf_puts(b, "</text>\n");
    frame(b, &x, &y, "trials", "best ms");
    if (e->tune_default > 0)
      nf_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"dflt\"/>\n",
                    x.p0, ax_px(&y, e->tune_default), x.p1, ax_px(&y, e->tune_default));
    /* a step line: the best so far holds until the next improvement */
    nf_buf_puts(b, "<polyline class=\"line\" points=\"");
    for (int i = 0; i < e->n_tune; i++) {
      if (i) nf_buf_printf(b, "%.1f,%.1f ", ax_px(&x, (double)xs[i]), ax_px(&y, ys[i - 1]));
      nf_buf_printf(b, "%.1f,%.1f ", ax_px(&x, (double)xs[i]), ax_px(&y, ys[i]));
    }
    nf_buf_puts(b, "\"/>\n</svg>\n");
  }
  pthread_mutex_unlock(&s->kt.mu);
  nf_buf_puts(b, "</div>\n");
  if (!shown)
    nf_buf_puts(b, "<p>No tuning was reported (no daemon, compile only, or every kernel came "
                   "tuned from the cache).</p>\n");
  nf_buf_puts(b, "</section>\n");
}

static int cmp_share(const void *a, const void *b, void *arg) {
  const double *v = arg;
  double x = v[*(const int *)a], y = v[*(const int *)b];
  return x > y ? -1 : x < y;
}

static void profile_view(nf_buf *b, nf_session *s, const struct nf__report *r) {
  int n = s->kt.n_kents;
  nf_buf_printf(b, "<section id=\"profile\"><h2>Per-kernel profile</h2>\n<p>Over the %lld timed "
                   "steps since the kernels last changed%s.</p>\n",
                (long long)r->prof_steps, r->prof_steps ? "" : " (none yet: the last step's times)");
  double *ms = calloc((size_t)n + 1, sizeof *ms);
  int *ord = calloc((size_t)n + 1, sizeof *ord);
  if (!ms || !ord) {
    free(ms);
    free(ord);
    nf_buf_puts(b, "<p>(out of memory)</p></section>\n");
    return;
  }
  double total = 0;
  for (int k = 0; k < n; k++) {
    ms[k] = entry_ms(s, r, k);
    total += ms[k];
    ord[k] = k;
  }
  qsort_r(ord, (size_t)n, sizeof *ord, cmp_share, ms);
  nf_buf_puts(b, "<table><tr><th>entry</th><th>what it computes</th><th>ops</th><th>runs on</th>"
                 "<th>ms/step</th><th>share</th><th>GFLOP/s</th><th>kernel / tier 0</th></tr>\n");
  for (int q = 0; q < n; q++) {
    const nf__kent *k = &s->kt.kents[ord[q]];
    char sum[96], vs[32] = "-";
    nf_graph_summary(k->g, sum, sizeof sum);
    const char *on = nf__kent_runs_on(&s->kt, s, k);
    if (k->kn_ms > 0 && k->t0_ms > 0) snprintf(vs, sizeof vs, "%.3g", k->kn_ms / k->t0_ms);
    double fl = (double)k->flops * k->n_ops;
    nf_buf_puts(b, "<tr><td>");
    esc(b, k->g->name);
    nf_buf_puts(b, "</td><td>");
    esc(b, sum);
    nf_buf_printf(b, "</td><td>%d</td><td style=\"color:%s\">", k->n_ops, tier_color(tier_now(k)));
    esc(b, on);
    nf_buf_printf(b, "</td><td>%.4f</td><td>%.1f%%</td><td>%.2f</td><td>%s</td></tr>\n", ms[ord[q]],
                  total > 0 ? 100 * ms[ord[q]] / total : 0.0,
                  ms[ord[q]] > 0 ? fl / ms[ord[q]] / 1e6 : 0.0, vs);
  }
  nf_buf_printf(b, "<tr class=\"total\"><td>all</td><td></td><td></td><td></td><td>%.4f</td>"
                   "<td>100%%</td><td></td><td></td></tr></table></section>\n", total);
  free(ms);
  free(ord);
}

static const char css[] =
    "body{font-family:'DejaVu Sans',sans-serif;margin:24px;color:#212121;max-width:1100px}"
    "h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}"
    "svg{background:#fff}.grid{display:flex;flex-wrap:wrap;gap:8px}"
    ".scroll{overflow-x:auto}.line{fill:none;stroke:#d84315;stroke-width:1.6}"
    ".dot{fill:#d84315}.axis{stroke:#333}.grid line,.grid{stroke:none}"
    "line.grid{stroke:#eee}.tick{font-size:11px;fill:#555}.label{font-size:12px;fill:#333}"
    ".arrival{stroke-width:1.2;stroke-opacity:.35}.edge{fill:none;stroke:#888;stroke-width:1.2}"
    ".box{fill:#fafafa;stroke-width:1.5}.bname{font-size:12px;font-weight:bold;fill:#212121}"
    ".bsum{font-size:11px;fill:#424242}.bstat{font-size:11px;fill:#616161}"
    ".dflt{stroke:#9e9e9e;stroke-dasharray:4 3}table{border-collapse:collapse;font-size:13px}"
    "td,th{border-bottom:1px solid #e0e0e0;padding:3px 8px;text-align:left}"
    "tr.total td{font-weight:bold}.legend{font-size:13px}dl{display:grid;"
    "grid-template-columns:max-content auto;gap:2px 14px}dt{color:#616161}dd{margin:0}";

int nf__report_write(nf_session *s, const char *path, const nf_session_stats *stats,
                     nf_buf *err) {
  struct nf__report *r = rep(s);
  if (!r) return NF_ENOMEM;
  nf_session_stats st = *stats;
  nf_buf b = NF_BUF_INIT;
  char model[80] = "training";
  if (s->kt.n_kents && s->kt.kents[0].g->name) {
    snprintf(model, sizeof model, "%s", s->kt.kents[0].g->name);
    char *h = strchr(model, '#');
    if (h) *h = 0;
  }
  time_t now = time(NULL);
  char when[64];
  struct tm tm;
  strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime_r(&now, &tm));
  nf_buf_puts(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                  "<meta name=\"viewport\" content=\"width=device-width\"><title>NeoFlow: ");
  esc(&b, model);
  nf_buf_printf(&b, "</title><style>%s</style></head><body>\n<h1>NeoFlow training report: ", css);
  esc(&b, model);
  nf_buf_printf(&b, "</h1>\n<section id=\"summary\"><dl>"
                    "<dt>written</dt><dd>%s, step %lld</dd>"
                    "<dt>device</dt><dd>%s, %d thread%s</dd>"
                    "<dt>loss</dt><dd>%.6g (last step)</dd>"
                    "<dt>step time</dt><dd>%.3f ms (mean of the last 10); the first step ended "
                    "%.0f ms after the session began</dd>"
                    "<dt>kernels</dt><dd>%d entries: %d tier 2, %d tier 1, %d on a library, %d "
                    "generated here; %lld swapped in, %lld refused</dd>"
                    "<dt>daemon</dt><dd>%s; %d entries still tuning (%lld of %lld trials)</dd>"
                    "</dl></section>\n",
                when, (long long)s->step, s->gpu ? "a GPU" : "the CPU", s->threads,
                s->threads == 1 ? "" : "s", s->last_loss, st.ms_avg, st.first_step_ms, st.kernels,
                st.tier2, st.tier1, st.blas, st.generated, (long long)st.swaps,
                (long long)st.rejected, st.connected ? "connected" : "not connected", st.tuning,
                (long long)st.trials, (long long)st.trials_max);
  step_chart(&b, s, r);
  {
    int n = r->n_pts;
    int64_t *xs = malloc(sizeof(int64_t) * ((size_t)n + 1));
    double *ys = malloc(sizeof(double) * ((size_t)n + 1));
    for (int i = 0; xs && ys && i < n; i++) {
      xs[i] = r->pts[i].step;
      ys[i] = r->pts[i].loss;
    }
    if (xs && ys) series_chart(&b, "loss", "Loss", "loss", xs, ys, n);
    free(xs);
    free(ys);
  }
  for (int i = 0; i < r->n_m; i++) {
    char id[64];
    snprintf(id, sizeof id, "metric-%d", i);
    series_chart(&b, id, r->m[i]->name, r->m[i]->name, r->m[i]->step, r->m[i]->v, r->m[i]->n);
  }
  graph_view(&b, s, r);
  tuning_view(&b, s);
  profile_view(&b, s, r);
  nf_buf_puts(&b, "<footer><p>Written by libneoflow-client (docs/report.md).</p></footer>\n"
                  "</body></html>\n");
  if (b.oom) {
    nf_buf_free(&b);
    nf_buf_printf(err, "out of memory");
    return NF_ENOMEM;
  }
  /* PATH.tmp, then renamed over PATH */
  size_t pl = strlen(path);
  char *tmp = malloc(pl + 8);
  if (!tmp) {
    nf_buf_free(&b);
    return NF_ENOMEM;
  }
  snprintf(tmp, pl + 8, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  int rc = NF_OK;
  if (!f || fwrite(b.data, 1, b.len, f) != b.len || fflush(f) != 0) {
    nf_buf_printf(err, "cannot write %s: %s", tmp, strerror(errno));
    rc = NF_EIO;
  }
  if (f && fclose(f) != 0 && rc == NF_OK) {
    nf_buf_printf(err, "cannot write %s: %s", tmp, strerror(errno));
    rc = NF_EIO;
  }
  if (rc == NF_OK && rename(tmp, path) != 0) {
    nf_buf_printf(err, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    rc = NF_EIO;
  }
  if (rc != NF_OK) unlink(tmp);
  free(tmp);
  nf_buf_free(&b);
  return rc;
}
