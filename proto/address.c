/* address.c - the per-user default address of neoflowd, shared by the
 * daemon (daemon/config.c) and its clients (proto/dconn.c) so that both
 * sides agree without the client linking the daemon's code. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "nf_env.h"
#include "nf_wire.h"

int nf_wire_default_socket(char *out, size_t n, int with_env) {
  const char *v = with_env ? nf_env(NF_ENV_SOCKET) : NULL;
  int len;
  if (v && *v) {
    len = snprintf(out, n, "%s", v);
  } else {
    const char *xdg = nf_env(NF_ENV_XDG_RUNTIME_DIR);
    if (xdg && xdg[0] == '/')
      len = snprintf(out, n, "%s/neoflowd/neoflowd.sock", xdg);
    else if (geteuid() == 0)
      len = snprintf(out, n, "/run/neoflowd/neoflowd.sock");
    else
      len = snprintf(out, n, "/tmp/neoflowd-%lu/neoflowd.sock", (unsigned long)geteuid());
  }
  if (len < 0 || (size_t)len >= n) {
    if (n) out[0] = 0;
    return NF_ELIMIT;
  }
  return NF_OK;
}
