/* daemon_cmd.h - the neoflow tool's commands that talk to neoflowd:
 * `neoflow status` and `neoflow tune --daemon`. */
#ifndef NF_DAEMON_CMD_H
#define NF_DAEMON_CMD_H

#include "nf_dconn.h"
#include "nf_ir.h"
#include "nf_trust.h"

/* neoflow status [--socket ADDR] [--key FILE] [--json]; argv[0] is
 * "status".  Returns the exit status (0; 1 with a message; 2 usage). */
int nf__cli_status(int argc, char **argv);
/* The daemon's status over c: *m (free with nf_wire_free_server) holding
 * m->status.  NF_OK, or an error in err. */
int nf__cli_status_fetch(nf_dconn *c, int timeout_ms, Neoflow__ServerMessage **m, nf_buf *err);
/* neoflow status --watch (status_watch.c): the view redrawn every
 * interval_ms until q or a signal; the terminal restored.  Returns 0. */
int nf__cli_status_watch(const nf_dconn_opts *o, int interval_ms);
/* The user's trust configuration plus the command's --trust-key and
 * --trust-uid values into *t; NF_OK, or an error printed as "neoflow
 * CMD: ...". */
int nf__cli_trust(nf_trust *t, const char *const *keys, int n_keys, const char *const *uids,
                  int n_uids, const char *cmd);

typedef struct nf_tune_daemon_cli {
  const char *def;      /* for reports */
  const char *address;  /* --socket (NULL: the default) */
  const char *key_file; /* --key */
  const char *const *trust_keys; /* --trust-key (n_trust_keys of them) */
  int n_trust_keys;
  const char *const *trust_uids; /* --trust-uid */
  int n_trust_uids;
  int trials;           /* 0: the daemon's default */
  double seconds;       /* 0: the daemon's default */
  int compile_only;     /* tier 1 only */
  int json;
  const char *out;      /* -o FILE: the kernel's shared object */
} nf_tune_daemon_cli;

/* Submits g to the daemon and waits for its final kernel, showing
 * progress on a terminal.  Returns the exit status. */
int nf__cli_tune_daemon(const nf_graph *g, const nf_tune_daemon_cli *t);

/* neoflow cache ... (cache_cmd.c); argv[0] is "cache". */
int nf__cli_cache(int argc, char **argv);
/* train_cmd.c: neoflow train */
int nf__cli_train(int argc, char **argv);

#endif
