/* nf_dlink.h - the daemon link (dlink.c): a background thread that
 * connects to neoflowd (starting a per-user one when none answers),
 * submits the kernel table's subgraphs, and offers the kernels it
 * receives to the table's mailboxes (nf__kt_offer).  A producer: it sees
 * the kernel table and this configuration, never the session. */
#ifndef NF_DLINK_H
#define NF_DLINK_H

#include "nf_ktable.h"
#include "nf_trust.h"

typedef struct nf__link_cfg {
  const char *daemon_addr; /* NULL: $NEOFLOW_SOCKET, the configuration's,
                              or the per-user default */
  const char *daemon_key;  /* TCP: the shared key file, NULL: the configuration's */
  const nf_trust *trust;   /* whom to take kernels from */
  int no_spawn;            /* never start a per-user neoflowd */
  int compile_only;        /* ask for default kernels only */
  int tune_trials, tune_seconds; /* per subgraph; 0: the daemon's defaults */
} nf__link_cfg;

typedef struct nf__dlink nf__dlink;

/* Starts the link for kt (which, and cfg's strings and trust, must
 * outlive it).  NF_OK and the link in *out; NF_ENOMEM with why in err. */
int nf__dlink_start(nf__ktable *kt, const nf__link_cfg *cfg, nf__dlink **out, nf_buf *err);
/* Stops the thread (at once, even inside a handshake) and frees the
 * link.  NULL is a no-op. */
void nf__dlink_stop(nf__dlink *l);

#endif
