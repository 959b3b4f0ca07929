/* daemon_cmd.c - `neoflow status` (what a daemon is doing: clients, jobs
 * with progress, the cache and its hit rate) and `neoflow tune --daemon`
 * (tuning through the daemon: the answer comes from its cache when the
 * subgraph was tuned before, by anyone). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_cmd.h"
#include "nf_dconn.h"
#include "nf_wire.h"

static const char status_usage[] =
    "usage: neoflow status [--socket ADDR] [--key FILE] [--trust-key KEY] [--trust-uid USER]\n"
    "                      [--json | --watch [--interval SECONDS]]\n"
    "Shows what neoflowd is doing: connected clients, queued and running jobs\n"
    "with their progress, and the tuning cache with its hit rate.\n"
    "  --watch        redraw the view every second (--interval) as top does, until\n"
    "                 q or Ctrl-C; the terminal is left as it was\n"
    "  --socket ADDR  a Unix socket path or tcp:HOST:PORT (default: $NEOFLOW_SOCKET,\n"
    "                 else the daemon's default socket)\n"
    "  --key FILE     the key for a daemon on TCP\n"
    "  --trust-key KEY  a daemon's public key (ed25519:..., or a file): needed on TCP\n"
    "  --trust-uid USER the user a shared daemon runs as (docs/security.md)\n"
    "  --json         one JSON object\n";

static void hex16(const uint8_t *k, size_t n, char out[17]) {
  for (size_t i = 0; i < 8; i++) snprintf(out + 2 * i, 3, "%02x", i < n ? k[i] : 0);
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

static const char *state_name(int s) {
  switch (s) {
    case NEOFLOW__JOB_STATE__JOB_QUEUED: return "queued";
    case NEOFLOW__JOB_STATE__JOB_COMPILING: return "compiling";
    case NEOFLOW__JOB_STATE__JOB_TUNING: return "tuning";
    case NEOFLOW__JOB_STATE__JOB_DONE: return "done";
    default: return "failed";
  }
}

static void print_status(FILE *o, const Neoflow__StatusReply *s, int json) {
  uint64_t looks = s->cache_hits + s->cache_misses;
  double rate = looks ? 100.0 * (double)s->cache_hits / (double)looks : 0;
  if (json) {
    fprintf(o, "{\"version\":");
    json_str(o, s->daemon_version);
    fprintf(o, ",\"pid\":%u,\"uptime_s\":%.1f,\"cache\":{\"path\":", s->pid, s->uptime_s);
    json_str(o, s->cache_path);
    fprintf(o, ",\"entries\":%llu,\"bytes\":%llu,\"hits\":%llu,\"misses\":%llu,\"hit_rate\":%.4f},",
           (unsigned long long)s->cache_entries, (unsigned long long)s->cache_bytes,
           (unsigned long long)s->cache_hits, (unsigned long long)s->cache_misses,
           looks ? (double)s->cache_hits / (double)looks : 0.0);
    fprintf(o, "\"jobs_done\":%llu,\"jobs_failed\":%llu,\"jobs_cancelled\":%llu,"
           "\"connections_refused\":%llu,"
           "\"timeouts\":%llu,\"emfile_closes\":%llu,\"quarantined\":%llu,\"cache_busy\":%llu,"
           "\"slower_reports\":%llu,\"retunes\":%llu,\"upstream_kernels\":%llu,"
           "\"lookups_missed\":%llu,\"upstream_published\":%llu,\"published_received\":%llu,"
           "\"published_kept\":%llu,\"upstream\":",
           (unsigned long long)s->jobs_done, (unsigned long long)s->jobs_failed,
           (unsigned long long)s->jobs_cancelled, (unsigned long long)s->connections_refused,
           (unsigned long long)s->timeouts,
           (unsigned long long)s->emfile_closes, (unsigned long long)s->quarantined,
           (unsigned long long)s->cache_busy, (unsigned long long)s->slower_reports,
           (unsigned long long)s->retunes, (unsigned long long)s->upstream_kernels,
           (unsigned long long)s->lookups_missed, (unsigned long long)s->upstream_published,
           (unsigned long long)s->published_received, (unsigned long long)s->published_kept);
    json_str(o, s->upstream ? s->upstream : "");
    fprintf(o, ",\"clients\":[");
    for (size_t i = 0; i < s->n_clients; i++) {
      const Neoflow__ClientInfo *c = s->clients[i];
      fprintf(o, "%s{\"session\":%llu,\"name\":", i ? "," : "", (unsigned long long)c->session_id);
      json_str(o, c->name);
      fprintf(o, ",\"pid\":%u,\"uid\":%u,\"transport\":\"%s\",\"requests\":%u,\"connected_s\":%.1f,"
              "\"step_ms\":%.6g}",
             c->pid, c->uid, c->transport, c->requests, c->connected_s, c->step_ms);
    }
    fprintf(o, "],\"jobs\":[");
    for (size_t i = 0; i < s->n_jobs; i++) {
      const Neoflow__JobInfo *j = s->jobs[i];
      char k[17];
      hex16(j->key.data, j->key.len, k);
      fprintf(o, "%s{\"key\":\"%s\",\"graph\":", i ? "," : "", k);
      json_str(o, j->graph);
      fprintf(o, ",\"summary\":");
      json_str(o, j->summary ? j->summary : "");
      fprintf(o, ",\"state\":\"%s\",\"mode\":\"%s\",\"waiters\":%u,\"trial\":%u,\"max_trials\":%u,"
             "\"best_ms\":%.6g,\"default_ms\":%.6g,\"step_ms\":%.6g,\"age_s\":%.1f}",
             state_name(j->state), j->mode == NEOFLOW__MODE__MODE_TUNE ? "tune" : "compile",
             j->waiters, j->trial, j->max_trials, j->best_ms, j->default_ms, j->step_ms, j->age_s);
    }
    fprintf(o, "]}\n");
    return;
  }
  fprintf(o, "neoflowd %s (pid %u), up %.0f s\n", s->daemon_version, s->pid, s->uptime_s);
  fprintf(o, "cache %s: %llu entries, %.1f MiB; hit rate %.1f%% (%llu hits, %llu misses)\n",
         s->cache_path, (unsigned long long)s->cache_entries, (double)s->cache_bytes / 1048576.0,
         rate, (unsigned long long)s->cache_hits, (unsigned long long)s->cache_misses);
  fprintf(o, "jobs: %llu done, %llu failed, %llu cancelled (no one waited); connections refused: "
         "%llu\n",
         (unsigned long long)s->jobs_done, (unsigned long long)s->jobs_failed,
         (unsigned long long)s->jobs_cancelled, (unsigned long long)s->connections_refused);
  if (s->upstream && s->upstream[0])
    fprintf(o, "team tier: upstream %s: %llu kernels taken from it instead of compiling, %llu tuned "
           "schedules published to it\n",
           s->upstream, (unsigned long long)s->upstream_kernels,
           (unsigned long long)s->upstream_published);
  if (s->lookups_missed || s->published_received)
    fprintf(o, "team tier, as an upstream: %llu lookups from nodes not answered (a miss); %llu "
           "schedules published by nodes, %llu of them kept as the fastest here\n",
           (unsigned long long)s->lookups_missed, (unsigned long long)s->published_received,
           (unsigned long long)s->published_kept);
  if (s->slower_reports)
    fprintf(o, "kernels slower than a client's fallback: %llu reported, %llu searched further\n",
           (unsigned long long)s->slower_reports, (unsigned long long)s->retunes);
  fprintf(o, "faults: %llu timeouts, %llu closed for lack of descriptors, %llu quarantined entries, "
         "%llu cache lock conflicts\n",
         (unsigned long long)s->timeouts, (unsigned long long)s->emfile_closes,
         (unsigned long long)s->quarantined, (unsigned long long)s->cache_busy);
  fprintf(o, "clients (%zu):\n", s->n_clients);
  if (s->n_clients)
    fprintf(o, "  %-8s %-20s %8s %6s %-5s %8s %10s %10s\n", "session", "name", "pid", "uid", "via",
           "requests", "connected", "step ms");
  for (size_t i = 0; i < s->n_clients; i++) {
    const Neoflow__ClientInfo *c = s->clients[i];
    char sm[32] = "-";
    if (c->step_ms > 0) snprintf(sm, sizeof sm, "%.3g", c->step_ms);
    fprintf(o, "  %-8llu %-20.20s %8u %6u %-5s %8u %9.0fs %10s\n", (unsigned long long)c->session_id,
           c->name, c->pid, c->uid, c->transport, c->requests, c->connected_s, sm);
  }
  fprintf(o, "jobs (%zu):\n", s->n_jobs);
  if (s->n_jobs)
    fprintf(o, "  %-16s %-9s %-7s %7s %11s %10s %10s  %s\n", "key", "state", "mode",
           "waiters", "trials", "best ms", "default ms", "graph (what it computes)");
  for (size_t i = 0; i < s->n_jobs; i++) {
    const Neoflow__JobInfo *j = s->jobs[i];
    char k[17], tr[32];
    hex16(j->key.data, j->key.len, k);
    snprintf(tr, sizeof tr, "%u/%u", j->trial, j->max_trials);
    fprintf(o, "  %-16s %-9s %-7s %7u %11s %10.4g %10.4g  %s%s%s%s\n", k, state_name(j->state),
           j->mode == NEOFLOW__MODE__MODE_TUNE ? "tune" : "compile", j->waiters, tr, j->best_ms,
           j->default_ms, j->graph, j->summary && *j->summary ? " (" : "",
           j->summary ? j->summary : "", j->summary && *j->summary ? ")" : "");
  }
}

int nf__cli_trust(nf_trust *t, const char *const *keys, int n_keys, const char *const *uids,
                  int n_uids, const char *cmd) {
  nf_buf err = NF_BUF_INIT;
  int rc = nf_trust_load(t, &err);
  for (int i = 0; rc == NF_OK && i < n_keys; i++) rc = nf_trust_add_key(t, keys[i], &err);
  for (int i = 0; rc == NF_OK && i < n_uids; i++) rc = nf_trust_add_uid(t, uids[i], &err);
  if (rc != NF_OK) fprintf(stderr, "neoflow %s: %s\n", cmd, nf_buf_str(&err));
  nf_buf_free(&err);
  return rc;
}

int nf__cli_status_fetch(nf_dconn *c, int timeout_ms, Neoflow__ServerMessage **out,
                         nf_buf *err) {
  *out = NULL;
  Neoflow__StatusRequest sr = NEOFLOW__STATUS_REQUEST__INIT;
  Neoflow__ClientMessage cm = NEOFLOW__CLIENT_MESSAGE__INIT;
  cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_STATUS;
  cm.status = &sr;
  int rc = nf_dconn_send(c, &cm, err);
  Neoflow__ServerMessage *m = NULL;
  while (rc == NF_OK) {
    rc = nf_dconn_recv(c, timeout_ms, &m, err);
    if (rc != NF_OK) break;
    if (m->msg_case == NEOFLOW__SERVER_MESSAGE__MSG_STATUS) break;
    nf_wire_free_server(m);
    m = NULL;
  }
  if (rc == NF_OK) *out = m;
  return rc;
}

int nf__cli_status(int argc, char **argv) {
  const char *addr = NULL, *key = NULL;
  const char *tkeys[16], *tuids[16];
  int n_tk = 0, n_tu = 0;
  int json = 0, watch = 0;
  double interval = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--trust-key") && i + 1 < argc && n_tk < 16) tkeys[n_tk++] = argv[++i];
    else if (!strcmp(argv[i], "--watch")) watch = 1;
    else if (!strcmp(argv[i], "--interval") && i + 1 < argc) {
      char *end = NULL;
      interval = strtod(argv[++i], &end);
      if (!end || *end || !(interval >= 0.1 && interval <= 3600)) {
        fprintf(stderr, "neoflow status: --interval %s: seconds from 0.1 to 3600\n", argv[i]);
        return 2;
      }
    }
    else if (!strcmp(argv[i], "--trust-uid") && i + 1 < argc && n_tu < 16) tuids[n_tu++] = argv[++i];
    else if (!strcmp(argv[i], "--json")) json = 1;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(status_usage, stdout);
      return 0;
    } else if ((!strcmp(argv[i], "--socket") || !strcmp(argv[i], "--key")) && i + 1 < argc) {
      if (argv[i][2] == 's') addr = argv[++i];
      else key = argv[++i];
    } else {
      fprintf(stderr, "neoflow status: unexpected argument '%s'\n\n%s", argv[i], status_usage);
      return 2;
    }
  }
  if (watch && json) {
    fprintf(stderr, "neoflow status: --watch and --json do not go together\n\n%s", status_usage);
    return 2;
  }
  nf_trust tr;
  if (nf__cli_trust(&tr, tkeys, n_tk, tuids, n_tu, "status") != NF_OK) return 1;
  nf_buf err = NF_BUF_INIT;
  nf_dconn *c = NULL;
  nf_dconn_opts o = {.address = addr, .key_file = key,
                     .client_name = watch ? "neoflow status --watch" : "neoflow status",
                     .trust = &tr};
  if (watch) return nf__cli_status_watch(&o, (int)(interval * 1000 + 0.5));
  int orc = nf_dconn_open(&o, &c, &err);
  if (orc != NF_OK) {
    fprintf(stderr, "neoflow status: %s\n", nf_buf_str(&err));
    if (orc == NF_EIO && (strstr(nf_buf_str(&err), strerror(ENOENT)) ||
                          strstr(nf_buf_str(&err), strerror(ECONNREFUSED)))) /* no one there */
      fprintf(stderr,
              "  No daemon is running there. Start your own with `neoflowd &` (a training "
              "program also starts it\n  when it needs one), the team's with `systemctl start "
              "neoflowd` (systemd/neoflowd.service),\n  or name another with --socket ADDR "
              "(docs/daemon.md).\n");
    nf_buf_free(&err);
    return 1;
  }
  Neoflow__ServerMessage *m = NULL;
  int rc = nf__cli_status_fetch(c, 10000, &m, &err);
  if (rc == NF_OK) print_status(stdout, m->status, json);
  else fprintf(stderr, "neoflow status: %s\n", nf_buf_str(&err));
  nf_wire_free_server(m);
  nf_dconn_close(c);
  nf_buf_free(&err);
  return rc == NF_OK ? 0 : 1;
}

/* ---- tune --daemon ---- */

typedef struct tprog {
  int tty;
  const char *def;
  int shown;
} tprog;

static void show_progress(void *user, const Neoflow__Progress *p) {
  tprog *t = user;
  if (!t->tty) return;
  fprintf(stderr, "\r%s: %s", t->def, state_name(p->state));
  if (p->state == NEOFLOW__JOB_STATE__JOB_TUNING)
    fprintf(stderr, " %u/%u  best %.4g ms  default %.4g ms  failed %u", p->trial, p->max_trials,
            p->best_ms, p->default_ms, p->failures);
  fprintf(stderr, "        ");
  fflush(stderr);
  t->shown = 1;
}

int nf__cli_tune_daemon(const nf_graph *g, const nf_tune_daemon_cli *t) {
  nf_buf err = NF_BUF_INIT;
  nf_dconn *c = NULL;
  nf_trust tr;
  if (nf__cli_trust(&tr, t->trust_keys, t->n_trust_keys, t->trust_uids, t->n_trust_uids,
                    "tune") != NF_OK)
    return 1;
  nf_dconn_opts o = {.address = t->address, .key_file = t->key_file, .client_name = "neoflow tune",
                     .trust = &tr};
  Neoflow__Graph *pg = NULL;
  int rc = nf_wire_graph_from_ir(g, &pg);
  if (rc != NF_OK) {
    fprintf(stderr, "neoflow: error: %s: cannot encode the graph: %s\n", t->def, nf_strerror(rc));
    return 1;
  }
  if (nf_dconn_open(&o, &c, &err) != NF_OK) {
    fprintf(stderr, "neoflow: error: %s\n", nf_buf_str(&err));
    nf_wire_graph_free(pg);
    nf_buf_free(&err);
    return 1;
  }
  if (!nf_dconn_same_target(c))
    fprintf(stderr, "neoflow: warning: the daemon compiles for another machine (%s)\n",
            nf_dconn_daemon_target(c));
  Neoflow__Submit s = NEOFLOW__SUBMIT__INIT;
  s.request_id = 1;
  s.graph = pg;
  s.mode = t->compile_only ? NEOFLOW__MODE__MODE_COMPILE : NEOFLOW__MODE__MODE_TUNE;
  s.max_trials = t->trials > 0 ? (uint32_t)t->trials : 0;
  s.max_seconds = t->seconds > 0 ? (uint32_t)(t->seconds + 0.999) : 0;
  Neoflow__ClientMessage cm = NEOFLOW__CLIENT_MESSAGE__INIT;
  cm.msg_case = NEOFLOW__CLIENT_MESSAGE__MSG_SUBMIT;
  cm.submit = &s;
  rc = nf_dconn_send(c, &cm, &err);
  nf_wire_graph_free(pg);
  tprog tp = {.tty = isatty(2), .def = t->def};
  nf_dkernel k, last;
  memset(&last, 0, sizeof last);
  int code = 0, n_kernels = 0;
  while (rc == NF_OK) {
    rc = nf_dconn_next_kernel(c, 1, 0, show_progress, &tp, &k, &code, &err);
    if (rc != NF_OK) break;
    n_kernels++;
    nf_dkernel_free(&last);
    last = k;
    if (last.final) break;
  }
  if (tp.shown) fputc('\n', stderr);
  int status = 1;
  if (rc == NF_OK) {
    int from_cache = n_kernels == 1;
    if (t->out) {
      FILE *f = fopen(t->out, "wb");
      if (!f || fwrite(last.binary, 1, last.len, f) != last.len || fclose(f) != 0) {
        fprintf(stderr, "neoflow: error: cannot write '%s': %s\n", t->out, strerror(errno));
        goto done;
      }
    }
    char key[17];
    hex16(last.key, 32, key);
    if (t->json) {
      printf("{\"def\":");
      json_str(stdout, t->def);
      printf(",\"key\":\"%s\",\"tier\":%d,\"time_ms\":%.6g,\"default_ms\":%.6g,\"bytes\":%zu,"
             "\"kernels_received\":%d,\"schedule\":",
             key, last.tier, last.time_ms, last.default_ms, last.len, n_kernels);
      json_str(stdout, last.schedule);
      printf("}\n");
    } else {
      printf("%s: key %s…: tier %d (%s) kernel of %zu bytes%s\n", t->def, key, last.tier,
             last.tier == 2 ? "tuned" : "default schedule", last.len,
             from_cache ? ", answered at once (cache)" : "");
      if (last.time_ms > 0)
        printf("time %.4g ms, default %.4g ms (%.2fx)\n", last.time_ms, last.default_ms,
               last.time_ms > 0 && last.default_ms > 0 ? last.default_ms / last.time_ms : 1.0);
      printf("schedule:\n%s", last.schedule);
      if (last.schedule[0] && last.schedule[strlen(last.schedule) - 1] != '\n') putchar('\n');
    }
    status = 0;
  } else {
    fprintf(stderr, "neoflow: error: %s: %s\n", t->def, nf_buf_str(&err));
  }
done:
  nf_dkernel_free(&last);
  nf_dconn_close(c);
  nf_buf_free(&err);
  return status;
}
