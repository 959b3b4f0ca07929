/* nfd_net.h - neoflowd's listening sockets and peer checks.
 *
 * The Unix socket lives in a private directory: created 0700 (0750 with a
 * group) under umask 077; an existing directory is accepted only when it
 * is a real directory (lstat, not a symlink) owned by the daemon's uid
 * with no write bit for group or other (and no access at all for other).
 * The socket is 0600 (0660 with a group).  A stale socket file (nobody
 * answers) is replaced; a live one means another daemon: refused with
 * "already running (pid N)".  TCP listens on loopback unless a key is
 * configured (nfd_config_check enforces it; nfd_listen_tcp checks again).
 * Loopback is 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104; addresses are
 * numeric only (no DNS, so no name can resolve to a surprise).
 *
 * Every fd returned is non-blocking and close-on-exec.  The Unix socket
 * functions change the process umask for a moment: call them at start-up,
 * before other threads exist. */
#ifndef NFD_NET_H
#define NFD_NET_H

#include <sys/socket.h>
#include <sys/types.h>

#include "nf_buf.h"
#include "nfd_config.h"

/* Creates or checks dir as described above; gid (-1: none) makes a new
 * directory 0750 and group-owned.  Only the last component is created
 * (the parent must exist).  An existing directory is never modified.
 * NF_OK, NF_EINVAL (unsafe: the reason names the owner, mode or symlink),
 * NF_EIO. */
int nfd_prepare_socket_dir(const char *dir, gid_t gid, nf_buf *err);
/* Listens on the Unix socket at path (its directory prepared first by the
 * caller); gid (-1: none) gives 0660 and that group, else 0600.  A socket
 * file nobody answers on is unlinked and replaced; a path that exists and
 * is not a socket is refused (never unlinked).  NF_OK with *fd; NF_EIO
 * "already running (pid N)" when a daemon answers there; NF_EINVAL (empty
 * path, or longer than 107 bytes: sun_path); NF_EIO. */
int nfd_listen_unix(const char *path, gid_t gid, int backlog, int *fd, nf_buf *err);
/* Listens on "host:port" ("[::1]:7117" for IPv6; port 0 picks one) with
 * SO_REUSEADDR (and IPV6_V6ONLY for IPv6).  Refuses a non-loopback address
 * unless have_key.  NF_OK with *fd; NF_EINVAL; NF_EIO. */
int nfd_listen_tcp(const char *spec, int have_key, int backlog, int *fd, nf_buf *err);
/* Parses "host:port" / "[v6]:port" with numeric host and port only
 * (getaddrinfo with AI_NUMERICHOST | AI_NUMERICSERV).  ss and len may be
 * NULL; *loopback is 1 for a loopback address.  NF_OK, or NF_EINVAL with
 * the reason. */
int nfd_parse_tcp_spec(const char *spec, struct sockaddr_storage *ss, socklen_t *len,
                       int *loopback, nf_buf *err);
/* systemd socket activation (sd_listen_fds(3) protocol, read by hand):
 * when LISTEN_PID is our pid, stores the LISTEN_FDS fds (from 3) in fds
 * and their count in *n, and makes them non-blocking and close-on-exec.
 * Whenever LISTEN_PID is set (ours or not, well-formed or not),
 * LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES are unset so that child processes
 * never see them.  *n = 0 when not activated.  NF_OK; NF_EINVAL
 * (malformed variables, more than max fds, an fd that is not open). */
int nfd_systemd_fds(int *fds, int max, int *n, nf_buf *err);
/* 1 when fd is a Unix stream socket, 0 TCP (IPv4 or IPv6 stream), -1
 * neither. */
int nfd_socket_is_unix(int fd);
/* SO_PEERCRED of a connected Unix socket (uid, pid may be NULL).  NF_OK,
 * or NF_EIO when fd has no Unix peer (not connected, not AF_UNIX). */
int nfd_peer_cred(int fd, uid_t *uid, pid_t *pid);
/* 1 when uid may talk to the daemon: uid is the daemon's effective uid or
 * is in c->allowed_uids; 0 otherwise.  Root (uid 0) is not implicitly
 * allowed, and membership in socket_group only passes the file
 * permission, never this check. */
int nfd_uid_allowed(const nfd_config *c, uid_t uid);
/* Resolves a group name (or a decimal gid) to its gid.  NF_OK, NF_ENOENT,
 * NF_EIO. */
int nfd_group_gid(const char *name, gid_t *gid, nf_buf *err);

#endif
