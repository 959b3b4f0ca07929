/* daemon_cmd.h - the neoflow tool's commands that talk to neoflowd:
 * `neoflow status` and `neoflow tune --daemon`. */
#ifndef NF_DAEMON_CMD_H
#define NF_DAEMON_CMD_H

#include "nf_ir.h"

/* neoflow status [--socket ADDR] [--key FILE] [--json]; argv[0] is
 * "status".  Returns the exit status (0; 1 with a message; 2 usage). */
int nf__cli_status(int argc, char **argv);

typedef struct nf_tune_daemon_cli {
  const char *def;      /* for reports */
  const char *address;  /* --socket (NULL: the default) */
  const char *key_file; /* --key */
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
