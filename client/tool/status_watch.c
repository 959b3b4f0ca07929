/* status_watch.c - `neoflow status --watch` (daemon_cmd.h): what neoflowd
 * is doing, redrawn every interval as top does: the daemon and its
 * cache, every job with a progress bar and what it computes, the clients
 * with their step time.
 *
 * On a terminal the view takes the alternate screen with the cursor
 * hidden and the keyboard unbuffered (q quits), and gives all of it back
 * when it ends, by q, Ctrl-C, Ctrl-\, SIGTERM or SIGHUP, and while Ctrl-Z
 * stops it: the terminal is left as it was found.  Lines are cut to the window's width, the view to its
 * height (SIGWINCH is followed).  Not on a terminal (a pipe, a log), each
 * view is printed whole after the last, without control sequences.  A
 * daemon that goes away is said so and connected to again every
 * interval. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "daemon_cmd.h"
#include "nf_wire.h"

static volatile sig_atomic_t g_stop, g_resized, g_suspend;

static void on_signal(int sig) {
  if (sig == SIGWINCH) g_resized = 1;
  else if (sig == SIGTSTP) g_suspend = 1;
  else g_stop = 1;
}

typedef struct term {
  int tty, raw;
  struct termios saved;
  int rows, cols;
} term;

static void term_size(term *t) {
  struct winsize w;
  t->rows = 24;
  t->cols = 80;
  if (ioctl(1, TIOCGWINSZ, &w) == 0 && w.ws_row > 0 && w.ws_col > 0) {
    t->rows = w.ws_row;
    t->cols = w.ws_col;
  }
}

static void term_enter(term *t) {
  t->tty = isatty(1);
  if (!t->tty) return;
  term_size(t);
  if (isatty(0) && tcgetattr(0, &t->saved) == 0) {
    struct termios r = t->saved;
    r.c_lflag &= (tcflag_t) ~(ICANON | ECHO);
    r.c_cc[VMIN] = 0;
    r.c_cc[VTIME] = 0;
    t->raw = tcsetattr(0, TCSANOW, &r) == 0;
  }
  fputs("\033[?1049h\033[?25l", stdout); /* the alternate screen; no cursor */
  fflush(stdout);
}

static void term_leave(term *t) {
  if (!t->tty) return;
  fputs("\033[?25h\033[?1049l", stdout);
  fflush(stdout);
  if (t->raw) tcsetattr(0, TCSANOW, &t->saved);
}

static void fmt_age(double s, char *out, size_t n) {
  if (s < 60) snprintf(out, n, "%.0fs", s);
  else if (s < 3600) snprintf(out, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
  else snprintf(out, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

static const char *state_word(int s) {
  switch (s) {
    case NEOFLOW__JOB_STATE__JOB_QUEUED: return "queued";
    case NEOFLOW__JOB_STATE__JOB_COMPILING: return "compiling";
    case NEOFLOW__JOB_STATE__JOB_TUNING: return "tuning";
    default: return "?";
  }
}

/* One view of s into o (lines of any length: cut when shown). */
static void render(FILE *o, const Neoflow__StatusReply *s, const char *addr) {
  char up[32], now[16];
  time_t t = time(NULL);
  struct tm tm;
  strftime(now, sizeof now, "%H:%M:%S", localtime_r(&t, &tm));
  fmt_age(s->uptime_s, up, sizeof up);
  uint64_t looks = s->cache_hits + s->cache_misses;
  fprintf(o, "neoflowd %s (pid %u) at %s, up %s   %s   (q quits)\n", s->daemon_version, s->pid,
          addr, up, now);
  fprintf(o, "cache  %llu entries, %.1f MiB; hit rate %.1f%% (%llu hits, %llu misses)\n",
          (unsigned long long)s->cache_entries, (double)s->cache_bytes / 1048576.0,
          looks ? 100.0 * (double)s->cache_hits / (double)looks : 0.0,
          (unsigned long long)s->cache_hits, (unsigned long long)s->cache_misses);
  int comp = 0, tune = 0, queued = 0;
  for (size_t i = 0; i < s->n_jobs; i++) {
    int st = s->jobs[i]->state;
    comp += st == NEOFLOW__JOB_STATE__JOB_COMPILING;
    tune += st == NEOFLOW__JOB_STATE__JOB_TUNING;
    queued += st == NEOFLOW__JOB_STATE__JOB_QUEUED;
  }
  fprintf(o, "jobs   %d compiling, %d tuning, %d queued; %llu done, %llu failed, %llu cancelled\n",
          comp, tune, queued, (unsigned long long)s->jobs_done, (unsigned long long)s->jobs_failed,
          (unsigned long long)s->jobs_cancelled);
  if (s->upstream && s->upstream[0])
    fprintf(o, "tier   upstream %s: %llu kernels taken, %llu schedules published\n", s->upstream,
            (unsigned long long)s->upstream_kernels, (unsigned long long)s->upstream_published);
  fprintf(o, "\n%-9s %-22s %8s %9s %9s %4s %6s  %s\n", "STATE", "PROGRESS", "TRIALS", "BEST ms",
          "DEFAULT", "WAIT", "AGE", "JOB (what it computes)");
  if (!s->n_jobs) fprintf(o, "(no jobs)\n");
  /* running first, then the queue in the daemon's order */
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < s->n_jobs; i++) {
      const Neoflow__JobInfo *j = s->jobs[i];
      if ((j->state == NEOFLOW__JOB_STATE__JOB_QUEUED) != pass) continue;
      char bar[24], tr[24] = "-", best[16] = "-", def[16] = "-", age[32];
      int fill = j->max_trials ? (int)(20.0 * j->trial / j->max_trials + 0.5) : 0;
      if (fill > 20) fill = 20;
      bar[0] = '[';
      for (int k = 0; k < 20; k++) bar[1 + k] = k < fill ? '#' : '.';
      bar[21] = ']';
      bar[22] = 0;
      if (j->state != NEOFLOW__JOB_STATE__JOB_TUNING) snprintf(bar, sizeof bar, "%s", "");
      if (j->max_trials && j->state == NEOFLOW__JOB_STATE__JOB_TUNING)
        snprintf(tr, sizeof tr, "%u/%u", j->trial, j->max_trials);
      if (j->best_ms > 0) snprintf(best, sizeof best, "%.3g", j->best_ms);
      if (j->default_ms > 0) snprintf(def, sizeof def, "%.3g", j->default_ms);
      fmt_age(j->age_s, age, sizeof age);
      fprintf(o, "%-9s %-22s %8s %9s %9s %4u %6s  %s%s%s%s\n", state_word(j->state), bar, tr, best,
              def, j->waiters, age, j->graph && *j->graph ? j->graph : "(unnamed)",
              j->summary && *j->summary ? " (" : "", j->summary ? j->summary : "",
              j->summary && *j->summary ? ")" : "");
    }
  fprintf(o, "\n%-24s %8s %6s %-5s %5s %9s %9s\n", "CLIENT", "PID", "UID", "VIA", "REQS", "STEP ms",
          "CONNECTED");
  if (!s->n_clients) fprintf(o, "(no clients)\n");
  for (size_t i = 0; i < s->n_clients; i++) {
    const Neoflow__ClientInfo *c = s->clients[i];
    char sm[16] = "-", age[32];
    if (c->step_ms > 0) snprintf(sm, sizeof sm, "%.3g", c->step_ms);
    fmt_age(c->connected_s, age, sizeof age);
    fprintf(o, "%-24.24s %8u %6u %-5s %5u %9s %9s\n", c->name ? c->name : "", c->pid, c->uid,
            c->transport ? c->transport : "", c->requests, sm, age);
  }
}

/* Writes text to the terminal: each line cut to the width (on a
 * character boundary), at most rows lines, the rest of the screen
 * cleared. */
static void show(const term *t, const char *text) {
  if (!t->tty) {
    fputs(text, stdout);
    fputs("\n", stdout);
    fflush(stdout);
    return;
  }
  fputs("\033[H", stdout);
  int row = 0;
  const char *p = text;
  while (*p && row < t->rows - 1) {
    const char *e = strchr(p, '\n');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    int cols = 0;
    size_t k = 0;
    while (k < len) { /* count characters, not bytes */
      if (((unsigned char)p[k] & 0xc0) != 0x80) {
        if (cols == t->cols) break;
        cols++;
      }
      k++;
    }
    fwrite(p, 1, k, stdout);
    fputs("\033[K\n", stdout); /* the rest of the line cleared */
    row++;
    p = e ? e + 1 : p + len;
  }
  fputs("\033[J", stdout); /* and the rest of the screen */
  fflush(stdout);
}

/* Waits up to ms for q on the keyboard or a signal. */
static void wait_key(term *t, int ms) {
  struct pollfd pf = {.fd = 0, .events = POLLIN};
  double end = ms / 1000.0;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!g_stop && !g_resized) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double left = end - ((double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
    if (left <= 0) return;
    int r = poll(&pf, t->raw ? 1 : 0, (int)(left * 1000) + 1);
    if (r > 0 && (pf.revents & POLLIN)) {
      char ch[16];
      ssize_t n = read(0, ch, sizeof ch);
      for (ssize_t i = 0; i < n; i++)
        if (ch[i] == 'q' || ch[i] == 'Q' || ch[i] == 3) g_stop = 1;
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
        pf.fd = -1; /* end of input: only the clock and signals */
    } else if (r > 0 && (pf.revents & (POLLHUP | POLLERR | POLLNVAL))) {
      pf.fd = -1;
    }
    if (g_suspend) return;
  }
}

/* Ctrl-Z: the terminal given back, stopped, taken again when continued. */
static void suspend(term *t) {
  g_suspend = 0;
  term_leave(t);
  signal(SIGTSTP, SIG_DFL);
  raise(SIGTSTP); /* (stopped here until SIGCONT) */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTSTP, &sa, NULL);
  term_enter(t);
}

int nf__cli_status_watch(const nf_dconn_opts *o, int interval_ms) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  sigaction(SIGQUIT, &sa, NULL);
  sigaction(SIGWINCH, &sa, NULL);
  if (isatty(1)) sigaction(SIGTSTP, &sa, NULL);
  term t;
  memset(&t, 0, sizeof t);
  term_enter(&t);
  char addr[512];
  int origin = 0;
  if (nf_dconn_address(o->address, o->trust, addr, sizeof addr, &origin) != NF_OK)
    snprintf(addr, sizeof addr, "%s", o->address ? o->address : "?");
  nf_dconn *c = NULL;
  nf_buf err = NF_BUF_INIT;
  while (!g_stop) {
    if (g_suspend) suspend(&t);
    if (g_resized) {
      g_resized = 0;
      term_size(&t);
    }
    nf_buf_reset(&err);
    Neoflow__ServerMessage *m = NULL;
    int rc = c ? NF_OK : nf_dconn_open(o, &c, &err);
    /* (a daemon that does not answer holds a view no longer than this) */
    if (rc == NF_OK) rc = nf__cli_status_fetch(c, interval_ms + 2000, &m, &err);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) break;
    if (rc == NF_OK) {
      render(f, m->status, addr);
    } else {
      nf_dconn_close(c);
      c = NULL;
      fprintf(f, "neoflowd at %s is not answering: %s\nTrying again every %.1f s (q quits).\n",
              addr, nf_buf_str(&err), interval_ms / 1000.0);
    }
    fclose(f);
    nf_wire_free_server(m);
    show(&t, text);
    free(text);
    wait_key(&t, interval_ms);
  }
  nf_dconn_close(c);
  nf_buf_free(&err);
  term_leave(&t);
  return 0;
}
