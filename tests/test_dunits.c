/* test_dunits.c - the daemon's units without the event loop: its
 * configuration (daemon/nfd_config.h), listening sockets and peer checks
 * (daemon/nfd_net.h), the TCP handshake's MACs and key file
 * (proto/nf_wire_auth.h) and the host fingerprint (common/nf_target.h).
 *
 *  - config: the documented defaults (socket and cache paths from the
 *    environment, compile_jobs = min(CPUs, 8)); a file setting every key;
 *    unknown sections and keys, bad integers, out-of-range values, bad
 *    booleans, syntax errors, keys set twice and over-long lines are each
 *    an error naming file:line and the key, and leave the config as it
 *    was; NEOFLOW_SOCKET / NEOFLOW_CACHE override the file;
 *  - check: 0.0.0.0:7117 refused without a key (the message the user
 *    sees), accepted with one; loopback (127.0.0.1:0, [::1], ::ffff:127.x)
 *    accepted without; names (no DNS) and bad ports refused; limits out of
 *    order refused;
 *  - socket directory: created 0700 (0750 with a group); a symlink, a
 *    0777 or 0755 directory and one owned by another uid are refused;
 *  - Unix socket: 0600 after bind (0660 with a group), non-blocking and
 *    close-on-exec; a second daemon on the path is "already running (pid
 *    N)"; a stale socket file is replaced; a regular file is never
 *    removed; a path too long for sun_path is refused;
 *  - TCP: 127.0.0.1:0 listens; 0.0.0.0:0 is refused without a key;
 *  - systemd activation: LISTEN_PID/LISTEN_FDS give fd 3 and are unset;
 *    malformed values are errors; another pid's variables are ignored;
 *  - peers: SO_PEERCRED on a socketpair; the uid allowlist rules;
 *  - auth: known-answer MACs over the documented byte layout; a wrong key,
 *    swapped nonces or a replayed nonce fail; constant-time equality; key
 *    files: good, 0644, symlink, foreign owner, bad hex, no overwrite;
 *  - target: fingerprint over the documented layout; flag order and
 *    duplicates do not matter, one flag or the CPU count does; ARM's field
 *    names; this host's target is non-zero, described and stable across
 *    threads.
 * Tests that need another uid chown to 65534 when running as root. */
#include <check.h>
#include <math.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nf_target.h"
#include "nf_wire_auth.h"
#include "nf_wire_box.h"
#include "nfd_config.h"
#include "nfd_net.h"

#define NOBODY 65534

/* ---- helpers ---- */

static char tmp_root[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

static void tmp_setup(void) {
  snprintf(tmp_root, sizeof tmp_root, "/tmp/nfdunits-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmp_root));
  ck_assert_int_eq(chmod(tmp_root, 0700), 0);
}

static void tmp_teardown(void) {
  if (tmp_root[0]) nftw(tmp_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  tmp_root[0] = 0;
}

/* tmp_root/name into out. */
static const char *tpath(char *out, size_t n, const char *name) {
  int len = snprintf(out, n, "%s/%s", tmp_root, name);
  ck_assert(len > 0 && (size_t)len < n);
  return out;
}

static void write_file(const char *path, const char *text, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ck_assert_int_ge(fd, 0);
  size_t n = strlen(text);
  ck_assert_int_eq(write(fd, text, n), (ssize_t)n);
  ck_assert_int_eq(fchmod(fd, mode), 0);
  close(fd);
}

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static void clear_env(void) {
  unsetenv("NEOFLOW_SOCKET");
  unsetenv("NEOFLOW_CACHE");
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
}

/* Loads text as a config file over defaults; returns the status, the
 * messages in err (caller frees). */
static int load_text(nfd_config *c, const char *text, char *path, size_t n, nf_buf *err) {
  tpath(path, n, "neoflowd.conf");
  write_file(path, text, 0600);
  nfd_config_defaults(c);
  return nfd_config_load(c, path, err);
}

/* Asserts err contains "path:line:" and needle. */
static void assert_err_at(const nf_buf *err, const char *path, int line, const char *needle) {
  char where[512];
  snprintf(where, sizeof where, "%s:%d: ", path, line);
  ck_assert_msg(strstr(nf_buf_str(err), where), "no '%s' in: %s", where, nf_buf_str(err));
  ck_assert_msg(strstr(nf_buf_str(err), needle), "no '%s' in: %s", needle, nf_buf_str(err));
}

static int fd_flags_ok(int fd) {
  int fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD);
  return fl >= 0 && fdfl >= 0 && (fl & O_NONBLOCK) && (fdfl & FD_CLOEXEC);
}

/* Connects to a Unix socket path; the fd or -1. */
static int connect_unix(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(fd, 0);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* ---- configuration ---- */

START_TEST(dunits_config_defaults) {
  clear_env();
  setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  setenv("XDG_CACHE_HOME", "/var/cache/u", 1);
  nfd_config c;
  nfd_config_defaults(&c);
  ck_assert_str_eq(c.socket_path, "/run/user/4242/neoflowd/neoflowd.sock");
  ck_assert_str_eq(c.cache_path, "/var/cache/u/neoflow/cache.db");
  ck_assert_str_eq(c.socket_group, "");
  ck_assert_int_eq(c.n_allowed_uids, 0);
  ck_assert_int_eq(c.max_connections, 256);
  ck_assert_int_eq(c.max_requests, 1024);
  ck_assert_int_eq(c.handshake_timeout_ms, 5000);
  ck_assert_int_eq(c.progress_timeout_ms, 10000);
  ck_assert_int_eq(c.idle_timeout_s, 600);
  ck_assert_int_eq(c.max_connections_per_uid, 64);
  ck_assert_int_eq(c.min_frame_rate, 1024);
  ck_assert_int_eq(c.output_soft_limit, 8 << 20);
  ck_assert_int_eq(c.output_hard_limit, 64 << 20);
  ck_assert_int_eq(c.output_soft_seconds, 60);
  ck_assert_int_eq(c.log_level, NFD_LOG_INFO);
  ck_assert_str_eq(nfd_log_level_name(c.log_level), "info");
  ck_assert_int_eq(c.allow_network_fs, 0);
  ck_assert_int_eq(c.cache_sync_full, 0);
  ck_assert_int_eq(c.cache_soft_cap, 0);
  ck_assert_int_eq(c.cache_hard_cap, 0);
  ck_assert_str_eq(c.tcp_listen, "");
  ck_assert_str_eq(c.tcp_key_file, "");
  long n_cpus = sysconf(_SC_NPROCESSORS_ONLN);
  ck_assert_int_eq(c.compile_jobs, n_cpus > 8 ? 8 : n_cpus < 1 ? 1 : n_cpus);
  ck_assert_int_eq(c.tune_jobs, 1);
  ck_assert_int_eq(c.max_queued_jobs, 4096);
  ck_assert_int_eq(c.default_trials, 200);
  ck_assert_int_eq(c.max_trials, 2000);
  ck_assert_int_eq(c.default_seconds, 600);
  ck_assert_int_eq(c.max_seconds, 3600);
  ck_assert_int_eq(c.compile_timeout_s, 60);
  ck_assert_int_eq(c.measure_timeout_ms, 10000);
  ck_assert_int_eq(c.worker_memory_mb, 4096);
  ck_assert_int_eq(c.max_elements, (int64_t)4 << 30);
  ck_assert_int_eq(c.max_gflops, 100000);
  ck_assert_str_eq(c.config_path, "");
  nf_buf err = NF_BUF_INIT;
  ck_assert_msg(nfd_config_check(&c, &err) == NF_OK, "%s", nf_buf_str(&err));
  char dir[128];
  nfd_config_socket_dir(&c, dir, sizeof dir);
  ck_assert_str_eq(dir, "/run/user/4242/neoflowd");

  /* Without XDG (or with a relative one, which the spec says to ignore). */
  setenv("XDG_RUNTIME_DIR", "relative/dir", 1);
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/home/someone", 1);
  nfd_config_defaults(&c);
  if (geteuid() == 0) {
    ck_assert_str_eq(c.socket_path, "/run/neoflowd/neoflowd.sock");
    ck_assert_str_eq(c.cache_path, "/var/lib/neoflowd/cache.db");
  } else {
    char want[128];
    snprintf(want, sizeof want, "/tmp/neoflowd-%lu/neoflowd.sock", (unsigned long)geteuid());
    ck_assert_str_eq(c.socket_path, want);
    ck_assert_str_eq(c.cache_path, "/home/someone/.cache/neoflow/cache.db");
  }
  ck_assert_str_eq(nfd_log_level_name(NFD_LOG_DEBUG), "debug");
  ck_assert_str_eq(nfd_log_level_name(17), "unknown");
  nf_buf_free(&err);
}
END_TEST

static const char full_ini[] =
    "; every key, none at its default\n"
    "[daemon]\n"
    "socket = /run/nf-test/d.sock\n"
    "socket_group = neoflow\n"
    "allowed_uids = 1001, root ,1001,4242\n"
    "max_connections = 64\n"
    "max_requests = 32\n"
    "handshake_timeout_ms = 2500\n"
    "progress_timeout_ms = 7000\n"
    "idle_timeout_s = 300\n"
    "output_soft_limit = 16M\n"
    "output_hard_limit = 128MiB   ; inline comment\n"
    "output_soft_seconds = 30\n"
    "log_level = DEBUG\n"
    "\n"
    "# the cache\n"
    "[cache]\n"
    "cache = /srv/nf/cache.db\n"
    "allow_network_fs = yes\n"
    "sync = full\n"
    "soft_cap_mb = 100\n"
    "hard_cap_mb = 200\n"
    "[tcp]\n"
    "listen = 0.0.0.0:7117\n"
    "key_file = /etc/neoflow/key\n"
    "[jobs]\n"
    "compile_jobs = 3\n"
    "tune_jobs = 2\n"
    "max_queued_jobs = 100\n"
    "default_trials = 50\n"
    "max_trials = 500\n"
    "default_seconds = 60\n"
    "max_seconds = 120\n"
    "compile_timeout_s = 90\n"
    "measure_timeout_ms = 2000\n"
    "worker_memory_mb = 8192\n"
    "max_elements = 1G\n"
    "max_gflops = 2500\n";

START_TEST(dunits_config_full_file) {
  clear_env();
  nfd_config c;
  nf_buf err = NF_BUF_INIT;
  char path[256];
  int rc = load_text(&c, full_ini, path, sizeof path, &err);
  ck_assert_msg(rc == NF_OK, "%d: %s", rc, nf_buf_str(&err));
  ck_assert_str_eq(c.socket_path, "/run/nf-test/d.sock");
  ck_assert_str_eq(c.socket_group, "neoflow");
  ck_assert_int_eq(c.n_allowed_uids, 3); /* 1001, root, 4242: duplicates dropped */
  ck_assert_int_eq(c.allowed_uids[0], 1001);
  ck_assert_int_eq(c.allowed_uids[1], 0);
  ck_assert_int_eq(c.allowed_uids[2], 4242);
  ck_assert_int_eq(c.max_connections, 64);
  ck_assert_int_eq(c.max_requests, 32);
  ck_assert_int_eq(c.handshake_timeout_ms, 2500);
  ck_assert_int_eq(c.progress_timeout_ms, 7000);
  ck_assert_int_eq(c.idle_timeout_s, 300);
  ck_assert_int_eq(c.output_soft_limit, 16 << 20);
  ck_assert_int_eq(c.output_hard_limit, 128 << 20);
  ck_assert_int_eq(c.output_soft_seconds, 30);
  ck_assert_int_eq(c.log_level, NFD_LOG_DEBUG);
  ck_assert_str_eq(c.cache_path, "/srv/nf/cache.db");
  ck_assert_int_eq(c.allow_network_fs, 1);
  ck_assert_int_eq(c.cache_sync_full, 1);
  ck_assert_int_eq(c.cache_soft_cap, (int64_t)100 << 20);
  ck_assert_int_eq(c.cache_hard_cap, (int64_t)200 << 20);
  ck_assert_str_eq(c.tcp_listen, "0.0.0.0:7117");
  ck_assert_str_eq(c.tcp_key_file, "/etc/neoflow/key");
  ck_assert_int_eq(c.compile_jobs, 3);
  ck_assert_int_eq(c.tune_jobs, 2);
  ck_assert_int_eq(c.max_queued_jobs, 100);
  ck_assert_int_eq(c.default_trials, 50);
  ck_assert_int_eq(c.max_trials, 500);
  ck_assert_int_eq(c.default_seconds, 60);
  ck_assert_int_eq(c.max_seconds, 120);
  ck_assert_int_eq(c.compile_timeout_s, 90);
  ck_assert_int_eq(c.measure_timeout_ms, 2000);
  ck_assert_int_eq(c.worker_memory_mb, 8192);
  ck_assert_int_eq(c.max_elements, (int64_t)1 << 30);
  ck_assert_int_eq(c.max_gflops, 2500);
  ck_assert_str_eq(c.config_path, path);
  ck_assert_msg(nfd_config_check(&c, &err) == NF_OK, "%s", nf_buf_str(&err));

  /* The other spellings of sizes and booleans. */
  nf_buf_reset(&err);
  rc = load_text(&c,
                 "[daemon]\noutput_soft_limit = 65536\noutput_hard_limit = 1g\n"
                 "[cache]\nallow_network_fs = Off\n",
                 path, sizeof path, &err);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(c.output_soft_limit, 65536);
  ck_assert_int_eq(c.output_hard_limit, (int64_t)1 << 30);
  ck_assert_int_eq(c.allow_network_fs, 0);
  nf_buf_free(&err);
}
END_TEST

/* A bad file: the status, every message, and c left as it was. */
static void expect_bad(const char *text, int line, const char *needle) {
  nfd_config c;
  nf_buf err = NF_BUF_INIT;
  char path[256];
  int rc = load_text(&c, text, path, sizeof path, &err);
  ck_assert_msg(rc == NF_EFORMAT, "rc %d for:\n%s", rc, text);
  assert_err_at(&err, path, line, needle);
  nfd_config d;
  nfd_config_defaults(&d);
  ck_assert_msg(memcmp(&c, &d, sizeof c) == 0, "a bad file changed the config");
  nf_buf_free(&err);
}

START_TEST(dunits_config_unknown_section) {
  clear_env();
  expect_bad("[daemon]\nmax_connections = 10\n[bogus]\nx = 1\n", 3, "unknown section [bogus]");
  expect_bad("[daemon\nmax_connections = 10\n", 1, "without ']'");
  expect_bad("[cache]\n[ daemon ]\nmax_connections = 10\n", 2, "unknown section [ daemon ]");
}
END_TEST

START_TEST(dunits_config_unknown_key) {
  clear_env();
  expect_bad("[jobs]\n\nfrobnicate = 3\n", 3, "unknown key 'frobnicate' in [jobs]");
  /* a key of another section */
  expect_bad("[tcp]\nmax_trials = 3\n", 2, "unknown key 'max_trials' in [tcp]");
  expect_bad("max_trials = 3\n", 1, "'max_trials' outside any section");
}
END_TEST

START_TEST(dunits_config_bad_int) {
  clear_env();
  expect_bad("[daemon]\nmax_connections = lots\n", 2,
             "[daemon] max_connections: 'lots' is not an integer");
  expect_bad("[jobs]\n# c\nmax_trials = 12abc\n", 3, "[jobs] max_trials: '12abc' is not an integer");
  expect_bad("[daemon]\noutput_soft_limit = 8X\n", 2, "[daemon] output_soft_limit: '8X' is not a size");
  expect_bad("[daemon]\nmax_connections =\n", 2, "[daemon] max_connections: '' is not an integer");
  expect_bad("[jobs]\nmax_elements = lots\n", 2,
             "[jobs] max_elements: 'lots' is not a count (a number, or one with K, M, G or T)");
  expect_bad("[jobs]\nmax_gflops = 1.5\n", 2, "[jobs] max_gflops: '1.5' is not a count");
}
END_TEST

START_TEST(dunits_config_out_of_range) {
  clear_env();
  expect_bad("[daemon]\nmax_connections = 0\n", 2,
             "[daemon] max_connections: '0' is out of range (1..65536)");
  expect_bad("[jobs]\ncompile_jobs = 99999999999999999999\n", 2,
             "[jobs] compile_jobs: '99999999999999999999' is out of range");
  expect_bad("[jobs]\ntune_jobs = -1\n", 2, "[jobs] tune_jobs: '-1' is out of range");
  expect_bad("[daemon]\noutput_hard_limit = 1K\n", 2, "[daemon] output_hard_limit: '1K' is out of range");
  expect_bad("[daemon]\noutput_hard_limit = 99999999999G\n", 2, "out of range");
  expect_bad("[jobs]\nmax_elements = 0\n", 2,
             "[jobs] max_elements: '0' is out of range (1..4611686018427387904)");
  expect_bad("[jobs]\nmax_gflops = 2048T\n", 2, "[jobs] max_gflops: '2048T' is out of range");
  expect_bad("[cache]\nsoft_cap_mb = 9999999999\n", 2, "[cache] soft_cap_mb: '9999999999' is out of range");
}
END_TEST

START_TEST(dunits_config_bad_bool) {
  clear_env();
  expect_bad("[cache]\nallow_network_fs = maybe\n", 2,
             "[cache] allow_network_fs: 'maybe' is not a boolean");
  expect_bad("[cache]\nsync = sometimes\n", 2, "[cache] sync: 'sometimes' is not a sync mode");
  expect_bad("[daemon]\nlog_level = loud\n", 2, "[daemon] log_level: 'loud' is not a log level");
  expect_bad("[daemon]\nallowed_uids = 1001,,1002\n", 2, "[daemon] allowed_uids: empty entry");
  expect_bad("[daemon]\nallowed_uids = no-such-user-nf\n", 2,
             "[daemon] allowed_uids: no user named 'no-such-user-nf'");
}
END_TEST

START_TEST(dunits_config_syntax) {
  clear_env();
  expect_bad("[daemon]\nmax_connections 10\n", 2, "expected 'key = value' or '[section]'");
  expect_bad("[daemon]\nmax_connections = 10\nmax_connections = 11\n", 3,
             "[daemon] max_connections: set twice (first on line 2)");
  expect_bad("[daemon]\nsocket = /a\n   /b\n", 3, "indented continuation");
  expect_bad("[daemon]\nsocket = /a\n   max_connections = 3\n", 3,
             "[daemon] socket: indented continuation");
  char text[512];
  char longv[300];
  memset(longv, 'x', sizeof longv - 1);
  longv[sizeof longv - 1] = 0;
  snprintf(text, sizeof text, "[daemon]\n\nsocket = /%s\nmax_connections = 5\n", longv);
  expect_bad(text, 3, "line longer than");

  /* A long comment is fine, and its tail is not read as a key. */
  {
    nfd_config c;
    nf_buf err = NF_BUF_INIT;
    char path[256];
    snprintf(text, sizeof text, "[daemon]\n# %s max_connections = 9\nmax_connections = 5\n", longv);
    ck_assert_msg(load_text(&c, text, path, sizeof path, &err) == NF_OK, "%s", nf_buf_str(&err));
    ck_assert_int_eq(c.max_connections, 5);
    nf_buf_free(&err);
  }

  /* Every error is reported, each with its line. */
  nfd_config c;
  nf_buf err = NF_BUF_INIT;
  char path[256];
  int rc = load_text(&c, "[daemon]\nmax_connections = x\n[jobs]\ntune_jobs = 0\nnope = 1\n", path,
                     sizeof path, &err);
  ck_assert_int_eq(rc, NF_EFORMAT);
  assert_err_at(&err, path, 2, "max_connections");
  assert_err_at(&err, path, 4, "tune_jobs");
  assert_err_at(&err, path, 5, "unknown key 'nope'");

  /* Missing file. */
  nf_buf_reset(&err);
  tpath(path, sizeof path, "missing.conf");
  ck_assert_int_eq(nfd_config_load(&c, path, &err), NF_ENOENT);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), path));
  nf_buf_free(&err);
}
END_TEST

START_TEST(dunits_config_env_overrides) {
  clear_env();
  nfd_config c;
  nf_buf err = NF_BUF_INIT;
  char path[256];
  const char *text = "[daemon]\nsocket = /from/file.sock\n[cache]\ncache = /from/file.db\n";
  ck_assert_int_eq(load_text(&c, text, path, sizeof path, &err), NF_OK);
  ck_assert_str_eq(c.socket_path, "/from/file.sock");
  ck_assert_str_eq(c.cache_path, "/from/file.db");

  setenv("NEOFLOW_SOCKET", "/from/env.sock", 1);
  setenv("NEOFLOW_CACHE", "/from/env.db", 1);
  nfd_config_defaults(&c);
  ck_assert_str_eq(c.socket_path, "/from/env.sock");
  ck_assert_str_eq(c.cache_path, "/from/env.db");
  ck_assert_int_eq(load_text(&c, text, path, sizeof path, &err), NF_OK);
  ck_assert_str_eq(c.socket_path, "/from/env.sock");
  ck_assert_str_eq(c.cache_path, "/from/env.db");

  /* An empty variable counts as unset. */
  setenv("NEOFLOW_SOCKET", "", 1);
  ck_assert_int_eq(load_text(&c, text, path, sizeof path, &err), NF_OK);
  ck_assert_str_eq(c.socket_path, "/from/file.sock");

  /* Too long for sun_path: an error, never a silently different path. */
  char longp[200];
  memset(longp, 'a', sizeof longp - 1);
  longp[0] = '/';
  longp[sizeof longp - 1] = 0;
  setenv("NEOFLOW_SOCKET", longp, 1);
  nfd_config_defaults(&c);
  ck_assert_str_eq(c.socket_path, "");
  ck_assert_int_eq(nfd_config_check(&c, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "[daemon] socket"));
  nf_buf_reset(&err);
  ck_assert_int_eq(load_text(&c, text, path, sizeof path, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "NEOFLOW_SOCKET"));
  clear_env();
  nf_buf_free(&err);
}
END_TEST

/* deploy/neoflowd.conf.example: $NEOFLOW_LIB/../deploy (meson test), else
 * relative to the working directory. */
static char *read_example(char *path, size_t n) {
  const char *lib = getenv("NEOFLOW_LIB");
  const char *tries[3] = {NULL, "deploy/neoflowd.conf.example", "../deploy/neoflowd.conf.example"};
  char first[4096];
  if (lib) {
    snprintf(first, sizeof first, "%s/../deploy/neoflowd.conf.example", lib);
    tries[0] = first;
  }
  for (int i = 0; i < 3; i++) {
    if (!tries[i]) continue;
    FILE *f = fopen(tries[i], "r");
    if (!f) continue;
    snprintf(path, n, "%s", tries[i]);
    char *text = calloc(1, 65536);
    ck_assert_ptr_nonnull(text);
    size_t len = fread(text, 1, 65535, f);
    fclose(f);
    ck_assert_uint_gt(len, 0);
    return text;
  }
  ck_abort_msg("deploy/neoflowd.conf.example not found (set NEOFLOW_LIB)");
  return NULL;
}

START_TEST(dunits_config_example) {
  clear_env();
  static const char *const all_keys[] = {
      "socket", "socket_group", "allowed_uids", "max_connections", "max_connections_per_uid",
      "max_requests", "handshake_timeout_ms", "progress_timeout_ms", "min_frame_rate",
      "idle_timeout_s", "signing_key", "output_soft_limit",
      "output_hard_limit", "output_soft_seconds", "log_level", "cache", "allow_network_fs",
      "sync", "soft_cap_mb", "hard_cap_mb", "listen", "key_file", "address", "key_file",
      "public_key", "timeout_ms", "publish", "compile_jobs", "tune_jobs",
      "max_queued_jobs", "default_trials", "max_trials", "default_seconds", "max_seconds",
      "compile_timeout_s", "measure_timeout_ms", "worker_memory_mb", "max_elements",
      "max_gflops", "share_budget", "min_trials", "min_seconds", "similar_records",
      "model_records"};
  char expath[4096];
  char *text = read_example(expath, sizeof expath);
  /* Every key is documented with its default ("#key = value"). */
  for (size_t i = 0; i < sizeof all_keys / sizeof all_keys[0]; i++) {
    char want[64];
    snprintf(want, sizeof want, "\n#%s =", all_keys[i]);
    ck_assert_msg(strstr(text, want), "key %s is not in the example", all_keys[i]);
  }
  nfd_config c, d;
  nf_buf err = NF_BUF_INIT;
  nfd_config_defaults(&d);
  /* As shipped (everything commented out): the defaults. */
  c = d;
  ck_assert_msg(nfd_config_load(&c, expath, &err) == NF_OK, "%s", nf_buf_str(&err));
  snprintf(d.config_path, sizeof d.config_path, "%s", expath);
  ck_assert(memcmp(&c, &d, sizeof c) == 0);
  /* Uncommented, the documented defaults are the real ones (except the
   * machine- and environment-dependent socket, cache and compile_jobs). */
  nf_buf out = NF_BUF_INIT;
  int n_set = 0;
  for (char *line = text; *line;) {
    char *eol = strchr(line, '\n');
    size_t len = eol ? (size_t)(eol - line) : strlen(line);
    if (line[0] == '#' && line[1] >= 'a' && line[1] <= 'z' && memmem(line, len, " =", 2) &&
        strncmp(line, "#socket =", 9) && strncmp(line, "#cache =", 8) &&
        strncmp(line, "#compile_jobs =", 15)) {
      line++, len--;
      n_set++;
    }
    nf_buf_add(&out, line, len);
    nf_buf_putc(&out, '\n');
    line += len + (eol ? 1 : 0);
  }
  ck_assert_int_eq(n_set, (int)(sizeof all_keys / sizeof all_keys[0]) - 3);
  char path[256];
  tpath(path, sizeof path, "uncommented.conf");
  write_file(path, nf_buf_str(&out), 0600);
  nfd_config_defaults(&c);
  nfd_config_defaults(&d);
  ck_assert_msg(nfd_config_load(&c, path, &err) == NF_OK, "%s", nf_buf_str(&err));
  snprintf(d.config_path, sizeof d.config_path, "%s", path);
  memcpy(d.key_line, c.key_line, sizeof d.key_line); /* (where each was set: the file's lines) */
  ck_assert(memcmp(&c, &d, sizeof c) == 0);
  nf_buf_free(&out);
  nf_buf_free(&err);
  free(text);
}
END_TEST

/* The tuning budget follows the share of step time: an average subgraph
 * gets what it asked, one taking 40% of a ten-subgraph step four times
 * that (the boost's cap), a negligible one the minimum; the caps hold,
 * the budgets of one client's subgraphs add up to about what they asked
 * together, and without a profile (or with share_budget off) nothing
 * changes. */
START_TEST(dunits_tune_budget) {
  clear_env();
  nfd_config c;
  nfd_config_defaults(&c);
  int t, sec;
  nfd_tune_budget(&c, 1.0, 64, 60, &t, &sec);
  ck_assert_int_eq(t, 64);
  ck_assert_int_eq(sec, 60);
  /* ten subgraphs: 40%, 1%, and eight sharing 59% */
  double ms[10] = {40, 1};
  for (int i = 2; i < 10; i++) ms[i] = 59.0 / 8;
  int sum = 0, got[10];
  for (int i = 0; i < 10; i++) {
    nfd_tune_budget(&c, ms[i] / 10.0, 64, 60, &got[i], &sec);
    sum += got[i];
  }
  ck_assert_int_eq(got[0], 256); /* 4.0 x 64: at the boost's cap */
  ck_assert_int_eq(got[1], 16);  /* 0.1 x 64 = 6: the minimum */
  ck_assert_int_eq(got[2], 47);  /* 0.7375 x 64 */
  ck_assert_int_gt(got[0], got[2]);
  ck_assert_int_gt(got[2], got[1]);
  ck_assert_int_le(abs(sum - 640), 640 / 10);
  nfd_tune_budget(&c, 4.0, 64, 60, &t, &sec);
  ck_assert_int_eq(sec, 240);
  nfd_tune_budget(&c, 0.01, 64, 60, &t, &sec);
  ck_assert_int_eq(sec, 15);
  /* the configuration's caps win over the boost */
  c.max_trials = 100;
  c.max_seconds = 90;
  nfd_tune_budget(&c, 3.0, 64, 60, &t, &sec);
  ck_assert_int_eq(t, 100);
  ck_assert_int_eq(sec, 90);
  /* a request asking for less than the minimum keeps what it asked */
  nfd_tune_budget(&c, 0.01, 8, 5, &t, &sec);
  ck_assert_int_eq(t, 8);
  ck_assert_int_eq(sec, 5);
  /* no profile yet, a broken one, or the feature off: as asked */
  nfd_tune_budget(&c, 0, 64, 60, &t, &sec);
  ck_assert_int_eq(t, 64);
  nfd_tune_budget(&c, NAN, 64, 60, &t, &sec);
  ck_assert_int_eq(t, 64);
  c.share_budget = 0;
  nfd_tune_budget(&c, 3.0, 64, 60, &t, &sec);
  ck_assert_int_eq(t, 64);
  ck_assert_int_eq(sec, 60);
}
END_TEST

static int check_listen(const char *listen, const char *key, nf_buf *err) {
  nfd_config c;
  nfd_config_defaults(&c);
  snprintf(c.tcp_listen, sizeof c.tcp_listen, "%s", listen);
  snprintf(c.tcp_key_file, sizeof c.tcp_key_file, "%s", key);
  nf_buf_reset(err);
  return nfd_config_check(&c, err);
}

START_TEST(dunits_check_tcp_key) {
  clear_env();
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(check_listen("0.0.0.0:7117", "", &err), NF_EINVAL);
  ck_assert_str_eq(nf_buf_str(&err), "refusing to listen on 0.0.0.0:7117 without [tcp] key_file: "
                                     "anyone who can reach it could submit work\n");
  ck_assert_int_eq(check_listen("0.0.0.0:7117", "/etc/neoflow/key", &err), NF_OK);
  ck_assert_int_eq(check_listen("127.0.0.1:0", "", &err), NF_OK);
  ck_assert_int_eq(check_listen("127.8.9.1:7117", "", &err), NF_OK);
  ck_assert_int_eq(check_listen("[::1]:7117", "", &err), NF_OK);
  ck_assert_int_eq(check_listen("[::ffff:127.0.0.1]:7117", "", &err), NF_OK);
  ck_assert_int_eq(check_listen("[::]:7117", "", &err), NF_EINVAL);
  ck_assert_int_eq(check_listen("[::ffff:10.0.0.1]:7117", "", &err), NF_EINVAL);
  ck_assert_int_eq(check_listen("192.168.1.5:7117", "", &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "refusing to listen on 192.168.1.5:7117"));
  /* Malformed: names (no DNS), bad ports, bare IPv6. */
  ck_assert_int_eq(check_listen("localhost:7117", "", &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "[tcp] listen:"));
  ck_assert_int_eq(check_listen("127.0.0.1:65536", "", &err), NF_EINVAL);
  ck_assert_int_eq(check_listen("127.0.0.1:-1", "", &err), NF_EINVAL);
  ck_assert_int_eq(check_listen("127.0.0.1", "", &err), NF_EINVAL);
  ck_assert_int_eq(check_listen("::1:7117", "", &err), NF_EINVAL);
  ck_assert_int_eq(check_listen(":7117", "", &err), NF_EINVAL);
  nf_buf_free(&err);
}
END_TEST

START_TEST(dunits_check_limits) {
  clear_env();
  nfd_config c;
  nf_buf err = NF_BUF_INIT;
  nfd_config_defaults(&c);
  c.output_soft_limit = 64 << 20;
  c.output_hard_limit = 8 << 20;
  ck_assert_int_eq(nfd_config_check(&c, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "output_soft_limit"));

  nfd_config_defaults(&c);
  c.default_trials = 3000;
  nf_buf_reset(&err);
  ck_assert_int_eq(nfd_config_check(&c, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "default_trials (3000) is above max_trials (2000)"));
  /* a refusal of what a file set names its file and line */
  char path[4096];
  nf_buf_reset(&err);
  ck_assert_int_eq(load_text(&c, "[daemon]\n\n[jobs]\nmax_trials = 100\ndefault_trials = 500\n",
                             path, sizeof path, &err), NF_OK);
  ck_assert_int_eq(nfd_config_check(&c, &err), NF_EINVAL);
  assert_err_at(&err, path, 5, "[jobs] default_trials (500) is above max_trials (100)");

  nfd_config_defaults(&c);
  c.default_seconds = 4000;
  c.cache_soft_cap = (int64_t)300 << 20;
  c.cache_hard_cap = (int64_t)200 << 20;
  nf_buf_reset(&err);
  ck_assert_int_eq(nfd_config_check(&c, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "default_seconds"));
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "soft_cap_mb (300) is above hard_cap_mb (200)"));

  /* Values set behind the loader's back (command line) are range-checked. */
  nfd_config_defaults(&c);
  c.max_connections = 0;
  nf_buf_reset(&err);
  ck_assert_int_eq(nfd_config_check(&c, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "[daemon] max_connections = 0 is out of range"));

  nfd_config_defaults(&c);
  snprintf(c.socket_path, sizeof c.socket_path, "relative.sock");
  nf_buf_reset(&err);
  ck_assert_int_eq(nfd_config_check(&c, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "not an absolute path"));
  char dir[64];
  nfd_config_socket_dir(&c, dir, sizeof dir);
  ck_assert_str_eq(dir, ".");
  snprintf(c.socket_path, sizeof c.socket_path, "/x.sock");
  nfd_config_socket_dir(&c, dir, sizeof dir);
  ck_assert_str_eq(dir, "/");
  nf_buf_free(&err);
}
END_TEST

/* ---- socket directory ---- */

START_TEST(dunits_socket_dir_created) {
  char dir[256];
  nf_buf err = NF_BUF_INIT;
  tpath(dir, sizeof dir, "sock");
  mode_t old = umask(0); /* the function must not depend on the caller's umask */
  int rc = nfd_prepare_socket_dir(dir, (gid_t)-1, &err);
  umask(old);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  struct stat st;
  ck_assert_int_eq(lstat(dir, &st), 0);
  ck_assert(S_ISDIR(st.st_mode));
  ck_assert_int_eq(st.st_mode & 07777, 0700);
  ck_assert_int_eq(st.st_uid, geteuid());
  /* Existing and safe: accepted again, unchanged. */
  ck_assert_int_eq(nfd_prepare_socket_dir(dir, (gid_t)-1, &err), NF_OK);

  /* With a group: 0750, group-owned. */
  gid_t gid = geteuid() == 0 ? (gid_t)NOBODY : getegid();
  tpath(dir, sizeof dir, "gsock");
  rc = nfd_prepare_socket_dir(dir, gid, &err);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(lstat(dir, &st), 0);
  ck_assert_int_eq(st.st_mode & 07777, 0750);
  ck_assert_int_eq(st.st_gid, gid);

  /* A missing parent is not created. */
  tpath(dir, sizeof dir, "no/such");
  ck_assert_int_eq(nfd_prepare_socket_dir(dir, (gid_t)-1, &err), NF_EIO);
  nf_buf_free(&err);
}
END_TEST

START_TEST(dunits_socket_dir_symlink) {
  char real[256], link[256];
  nf_buf err = NF_BUF_INIT;
  tpath(real, sizeof real, "real");
  tpath(link, sizeof link, "link");
  ck_assert_int_eq(mkdir(real, 0700), 0);
  ck_assert_int_eq(symlink(real, link), 0);
  ck_assert_int_eq(nfd_prepare_socket_dir(link, (gid_t)-1, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "is a symlink"));
  /* A regular file in the way. */
  nf_buf_reset(&err);
  tpath(real, sizeof real, "file");
  write_file(real, "x", 0600);
  ck_assert_int_eq(nfd_prepare_socket_dir(real, (gid_t)-1, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "not a directory"));
  nf_buf_free(&err);
}
END_TEST

START_TEST(dunits_socket_dir_mode) {
  char dir[256];
  nf_buf err = NF_BUF_INIT;
  tpath(dir, sizeof dir, "open");
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  ck_assert_int_eq(chmod(dir, 0777), 0);
  ck_assert_int_eq(nfd_prepare_socket_dir(dir, (gid_t)-1, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "mode 0777"));
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "writable by group or other"));
  nf_buf_reset(&err);
  ck_assert_int_eq(chmod(dir, 0770), 0);
  ck_assert_int_eq(nfd_prepare_socket_dir(dir, (gid_t)-1, &err), NF_EINVAL);
  nf_buf_reset(&err);
  ck_assert_int_eq(chmod(dir, 0755), 0);
  ck_assert_int_eq(nfd_prepare_socket_dir(dir, (gid_t)-1, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "other users have access"));
  ck_assert_int_eq(chmod(dir, 0750), 0);
  ck_assert_int_eq(nfd_prepare_socket_dir(dir, (gid_t)-1, &err), NF_OK);
  nf_buf_free(&err);
}
END_TEST

START_TEST(dunits_socket_dir_owner) {
  char dir[256];
  nf_buf err = NF_BUF_INIT;
  if (geteuid() == 0) {
    tpath(dir, sizeof dir, "theirs");
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(chown(dir, NOBODY, NOBODY), 0);
    ck_assert_int_eq(nfd_prepare_socket_dir(dir, (gid_t)-1, &err), NF_EINVAL);
    ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "owned by uid 65534, not by us (uid 0)"));
  } else {
    /* "/" is root's; its mode would pass no user's check anyway, but the
     * owner is what is reported first. */
    ck_assert_int_eq(nfd_prepare_socket_dir("/", (gid_t)-1, &err), NF_EINVAL);
    ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "owned by uid 0"));
  }
  nf_buf_free(&err);
}
END_TEST

/* ---- the Unix socket ---- */

START_TEST(dunits_listen_unix_mode) {
  char dir[256], path[256];
  nf_buf err = NF_BUF_INIT;
  int fds0 = count_fds();
  tpath(dir, sizeof dir, "run");
  ck_assert_int_eq(nfd_prepare_socket_dir(dir, (gid_t)-1, &err), NF_OK);
  tpath(path, sizeof path, "run/d.sock");
  int fd = -1;
  mode_t old = umask(0);
  int rc = nfd_listen_unix(path, (gid_t)-1, 16, &fd, &err);
  umask(old);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  struct stat st;
  ck_assert_int_eq(lstat(path, &st), 0);
  ck_assert(S_ISSOCK(st.st_mode));
  ck_assert_int_eq(st.st_mode & 07777, 0600);
  ck_assert(fd_flags_ok(fd));
  ck_assert_int_eq(nfd_socket_is_unix(fd), 1);
  /* A client gets through, and its credentials are ours. */
  int cfd = connect_unix(path);
  ck_assert_int_ge(cfd, 0);
  int afd = accept(fd, NULL, NULL);
  ck_assert_int_ge(afd, 0);
  uid_t uid;
  pid_t pid;
  ck_assert_int_eq(nfd_peer_cred(afd, &uid, &pid), NF_OK);
  ck_assert_int_eq(uid, geteuid());
  ck_assert_int_eq(pid, getpid());
  close(afd);
  close(cfd);
  close(fd);
  unlink(path);

  /* With a group: 0660 and the group. */
  gid_t gid = geteuid() == 0 ? (gid_t)NOBODY : getegid();
  rc = nfd_listen_unix(path, gid, 16, &fd, &err);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(lstat(path, &st), 0);
  ck_assert_int_eq(st.st_mode & 07777, 0660);
  ck_assert_int_eq(st.st_gid, gid);
  close(fd);
  ck_assert_int_eq(count_fds(), fds0);
  nf_buf_free(&err);
}
END_TEST

START_TEST(dunits_listen_unix_running) {
  char path[256];
  nf_buf err = NF_BUF_INIT;
  tpath(path, sizeof path, "d.sock");
  int fd = -1, fd2 = -1;
  ck_assert_int_eq(nfd_listen_unix(path, (gid_t)-1, 16, &fd, &err), NF_OK);
  int fds0 = count_fds();
  ck_assert_int_eq(nfd_listen_unix(path, (gid_t)-1, 16, &fd2, &err), NF_EIO);
  char want[96];
  snprintf(want, sizeof want, "already running (pid %ld)", (long)getpid());
  ck_assert_msg(strstr(nf_buf_str(&err), want), "%s", nf_buf_str(&err));
  ck_assert_int_eq(count_fds(), fds0);
  /* The first one is untouched and still answers. */
  int cfd = connect_unix(path);
  ck_assert_int_ge(cfd, 0);
  close(cfd);
  close(fd);
  nf_buf_free(&err);
}
END_TEST

START_TEST(dunits_listen_unix_stale) {
  char path[256];
  nf_buf err = NF_BUF_INIT;
  tpath(path, sizeof path, "d.sock");
  /* A daemon that died without unlinking its socket. */
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  ck_assert_uint_lt(strlen(path), sizeof sa.sun_path);
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int dead = socket(AF_UNIX, SOCK_STREAM, 0);
  ck_assert_int_eq(bind(dead, (struct sockaddr *)&sa, sizeof sa), 0);
  ck_assert_int_eq(listen(dead, 1), 0);
  close(dead);
  struct stat st;
  int fd = -1;
  int rc = nfd_listen_unix(path, (gid_t)-1, 16, &fd, &err);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(lstat(path, &st), 0);
  ck_assert(S_ISSOCK(st.st_mode));
  ck_assert_int_eq(st.st_mode & 07777, 0600);
  int cfd = connect_unix(path);
  ck_assert_int_ge(cfd, 0);
  close(cfd);
  close(fd);
  unlink(path);

  /* A regular file at the path is refused and left alone. */
  write_file(path, "precious", 0600);
  ck_assert_int_eq(nfd_listen_unix(path, (gid_t)-1, 16, &fd, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "is not a socket"));
  ck_assert_int_eq(lstat(path, &st), 0);
  ck_assert(S_ISREG(st.st_mode));
  nf_buf_free(&err);
}
END_TEST

START_TEST(dunits_listen_unix_too_long) {
  char path[200];
  nf_buf err = NF_BUF_INIT;
  int n = snprintf(path, sizeof path, "%s/", tmp_root);
  memset(path + n, 's', sizeof path - 1 - (size_t)n);
  path[sizeof path - 1] = 0;
  int fd = -1, fds0 = count_fds();
  ck_assert_int_eq(nfd_listen_unix(path, (gid_t)-1, 16, &fd, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "too long"));
  ck_assert_int_eq(count_fds(), fds0);
  nf_buf_reset(&err);
  ck_assert_int_eq(nfd_listen_unix("", (gid_t)-1, 16, &fd, &err), NF_EINVAL);
  nf_buf_free(&err);
}
END_TEST

/* ---- TCP ---- */

START_TEST(dunits_listen_tcp) {
  nf_buf err = NF_BUF_INIT;
  int fd = -1, fds0 = count_fds();
  int rc = nfd_listen_tcp("127.0.0.1:0", 0, 511, &fd, &err);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  ck_assert(fd_flags_ok(fd));
  ck_assert_int_eq(nfd_socket_is_unix(fd), 0);
  struct sockaddr_in sin;
  socklen_t len = sizeof sin;
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
  ck_assert_int_eq(sin.sin_family, AF_INET);
  ck_assert_int_ne(ntohs(sin.sin_port), 0);
  ck_assert_int_eq(ntohl(sin.sin_addr.s_addr), INADDR_LOOPBACK);
  int one = 0;
  len = sizeof one;
  ck_assert_int_eq(getsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, &len), 0);
  ck_assert_int_ne(one, 0);
  close(fd);

  ck_assert_int_eq(nfd_listen_tcp("0.0.0.0:0", 0, 511, &fd, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "refusing to listen on 0.0.0.0:0 without"));
  nf_buf_reset(&err);
  ck_assert_int_eq(nfd_listen_tcp("localhost:0", 0, 511, &fd, &err), NF_EINVAL);
  nf_buf_reset(&err);
  rc = nfd_listen_tcp("0.0.0.0:0", 1, 511, &fd, &err);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  close(fd);
  ck_assert_int_eq(count_fds(), fds0);
  nf_buf_free(&err);
}
END_TEST

/* ---- systemd ---- */

START_TEST(dunits_systemd_fds) {
  clear_env();
  nf_buf err = NF_BUF_INIT;
  int fds[4], n = -1;
  /* Not activated. */
  ck_assert_int_eq(nfd_systemd_fds(fds, 4, &n, &err), NF_OK);
  ck_assert_int_eq(n, 0);

  /* Put a listening socket at fd 3, keeping whatever was there.  Check
   * may use fd 3 to report (every ck_assert writes to it), so nothing is
   * asserted until fd 3 is restored. */
  int sock = -1;
  ck_assert_int_eq(nfd_listen_tcp("127.0.0.1:0", 0, 4, &sock, &err), NF_OK);
  ck_assert_int_eq(fcntl(sock, F_SETFL, fcntl(sock, F_GETFL) & ~O_NONBLOCK), 0);
  char pid[32];
  snprintf(pid, sizeof pid, "%ld", (long)getpid());
  setenv("LISTEN_PID", pid, 1);
  setenv("LISTEN_FDS", "1", 1);
  setenv("LISTEN_FDNAMES", "neoflowd.socket", 1);
  int saved = fcntl(3, F_DUPFD_CLOEXEC, 20);
  int dup_ok = dup2(sock, 3) == 3; /* dup2: not close-on-exec */
  int rc = nfd_systemd_fds(fds, 4, &n, &err);
  int flags_ok = fd_flags_ok(3);
  int is_unix = nfd_socket_is_unix(3);
  if (saved >= 0) {
    dup2(saved, 3);
    close(saved);
  } else {
    close(3);
  }
  close(sock);
  ck_assert(dup_ok);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  ck_assert_int_eq(n, 1);
  ck_assert_int_eq(fds[0], 3);
  ck_assert(flags_ok);
  ck_assert_int_eq(is_unix, 0);
  ck_assert_ptr_null(getenv("LISTEN_PID"));
  ck_assert_ptr_null(getenv("LISTEN_FDS"));
  ck_assert_ptr_null(getenv("LISTEN_FDNAMES"));
  nf_buf_free(&err);
}
END_TEST

static int systemd_with(const char *listen_pid, const char *listen_fds, int max, int *n,
                        nf_buf *err) {
  int fds[4];
  setenv("LISTEN_PID", listen_pid, 1);
  if (listen_fds)
    setenv("LISTEN_FDS", listen_fds, 1);
  else
    unsetenv("LISTEN_FDS");
  nf_buf_reset(err);
  int rc = nfd_systemd_fds(fds, max, n, err);
  ck_assert_ptr_null(getenv("LISTEN_PID"));
  ck_assert_ptr_null(getenv("LISTEN_FDS"));
  return rc;
}

START_TEST(dunits_systemd_fds_malformed) {
  clear_env();
  nf_buf err = NF_BUF_INIT;
  char pid[32], other[32];
  snprintf(pid, sizeof pid, "%ld", (long)getpid());
  snprintf(other, sizeof other, "%ld", (long)getppid());
  int n = -1;
  ck_assert_int_eq(systemd_with(pid, "1x", 4, &n, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "LISTEN_FDS='1x'"));
  ck_assert_int_eq(n, 0);
  ck_assert_int_eq(systemd_with(pid, "-1", 4, &n, &err), NF_EINVAL);
  ck_assert_int_eq(systemd_with(pid, " 1", 4, &n, &err), NF_EINVAL);
  ck_assert_int_eq(systemd_with(pid, "", 4, &n, &err), NF_EINVAL);
  ck_assert_int_eq(systemd_with(pid, "99999999999999999999", 4, &n, &err), NF_EINVAL);
  ck_assert_int_eq(systemd_with("12ab", "1", 4, &n, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "LISTEN_PID='12ab'"));
  ck_assert_int_eq(systemd_with("0", "1", 4, &n, &err), NF_EINVAL);
  ck_assert_int_eq(systemd_with("+1", "1", 4, &n, &err), NF_EINVAL);
  /* More fds than the caller takes. */
  ck_assert_int_eq(systemd_with(pid, "3", 2, &n, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "at most 2"));
  /* An fd that is not open. */
  int high = 3;
  while (fcntl(high, F_GETFD) >= 0) high++;
  if (high < 3 + 4) {
    char cnt[16];
    snprintf(cnt, sizeof cnt, "%d", high - 3 + 1);
    ck_assert_int_eq(systemd_with(pid, cnt, 4, &n, &err), NF_EINVAL);
    ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "unusable"));
  }
  /* Another process's variables (inherited): ignored, and unset. */
  ck_assert_int_eq(systemd_with(other, "1", 4, &n, &err), NF_OK);
  ck_assert_int_eq(n, 0);
  /* Ours without LISTEN_FDS: nothing passed (as sd_listen_fds). */
  ck_assert_int_eq(systemd_with(pid, NULL, 4, &n, &err), NF_OK);
  ck_assert_int_eq(n, 0);
  ck_assert_int_eq(systemd_with(pid, "0", 4, &n, &err), NF_OK);
  ck_assert_int_eq(n, 0);
  nf_buf_free(&err);
}
END_TEST

/* ---- peers ---- */

START_TEST(dunits_peer_cred) {
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  uid_t uid = (uid_t)-1;
  pid_t pid = -1;
  ck_assert_int_eq(nfd_peer_cred(sv[0], &uid, &pid), NF_OK);
  ck_assert_int_eq(uid, geteuid());
  ck_assert_int_eq(pid, getpid());
  ck_assert_int_eq(nfd_socket_is_unix(sv[1]), 1);
  close(sv[0]);
  close(sv[1]);
  int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(udp, 0);
  ck_assert_int_eq(nfd_socket_is_unix(udp), -1);
  ck_assert_int_eq(nfd_peer_cred(udp, &uid, &pid), NF_EIO);
  close(udp);
  int file = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ck_assert_int_eq(nfd_socket_is_unix(file), -1);
  close(file);
}
END_TEST

START_TEST(dunits_uid_allowed) {
  clear_env();
  nfd_config c;
  nfd_config_defaults(&c);
  ck_assert_int_eq(nfd_uid_allowed(&c, geteuid()), 1);
  ck_assert_int_eq(nfd_uid_allowed(&c, 4242), 0);
  ck_assert_int_eq(nfd_uid_allowed(&c, NOBODY), geteuid() == NOBODY);
  /* Root is not implicitly allowed (only when it is the daemon's uid). */
  ck_assert_int_eq(nfd_uid_allowed(&c, 0), geteuid() == 0);
  c.allowed_uids[0] = 4242;
  c.allowed_uids[1] = 1001;
  c.n_allowed_uids = 2;
  ck_assert_int_eq(nfd_uid_allowed(&c, 4242), 1);
  ck_assert_int_eq(nfd_uid_allowed(&c, 1001), 1);
  ck_assert_int_eq(nfd_uid_allowed(&c, 1002), 0);
  ck_assert_int_eq(nfd_uid_allowed(&c, geteuid()), 1);
  /* A socket group does not widen the uid list. */
  snprintf(c.socket_group, sizeof c.socket_group, "neoflow");
  ck_assert_int_eq(nfd_uid_allowed(&c, 1002), 0);
  c.n_allowed_uids = 0;
  ck_assert_int_eq(nfd_uid_allowed(&c, 4242), 0);
  /* As root, look from another uid in a child: root is then refused. */
  if (geteuid() == 0) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      if (setgid(NOBODY) != 0 || setuid(NOBODY) != 0) _exit(2);
      int ok = nfd_uid_allowed(&c, 0) == 0 && nfd_uid_allowed(&c, NOBODY) == 1;
      c.allowed_uids[0] = 0;
      c.n_allowed_uids = 1;
      ok = ok && nfd_uid_allowed(&c, 0) == 1;
      _exit(ok ? 0 : 1);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  }
}
END_TEST

START_TEST(dunits_group_gid) {
  nf_buf err = NF_BUF_INIT;
  gid_t gid = 1;
  ck_assert_int_eq(nfd_group_gid("root", &gid, &err), NF_OK);
  ck_assert_int_eq(gid, 0);
  ck_assert_int_eq(nfd_group_gid("4242", &gid, &err), NF_OK);
  ck_assert_int_eq(gid, 4242);
  ck_assert_int_eq(nfd_group_gid("no-such-group-nf", &gid, &err), NF_ENOENT);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "no group named 'no-such-group-nf'"));
  nf_buf_free(&err);
}
END_TEST

/* ---- auth ---- */

static void fill(uint8_t *p, size_t n, uint8_t first) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(first + i);
}

static void hex_of(const uint8_t *p, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", p[i]);
}

START_TEST(dunits_auth_known_answer) {
  ck_assert_int_ge(sodium_init(), 0);
  uint8_t key[NF_AUTH_KEY], sn[32], se[32], cn[32], ce[32], tg[32], t[32];
  fill(key, sizeof key, 0);
  fill(sn, 32, 0x40);
  fill(se, 32, 0x60);
  fill(cn, 32, 0x80);
  fill(ce, 32, 0xa0);
  fill(tg, 32, 0xc0);
  uint8_t mac[NF_AUTH_MAC], want[NF_AUTH_MAC];
  char hex[2 * NF_AUTH_MAC + 1];

  /* The documented transcript (nf_wire_box.h), computed here directly. */
  uint8_t tm[15 + 5 * 32];
  memcpy(tm, "neoflow-tcp-v2", 15); /* with its NUL */
  memcpy(tm + 15, sn, 32);
  memcpy(tm + 47, se, 32);
  memcpy(tm + 79, cn, 32);
  memcpy(tm + 111, ce, 32);
  memcpy(tm + 143, tg, 32);
  crypto_hash_sha256(want, tm, sizeof tm);
  nf_box_transcript(sn, se, cn, ce, tg, t);
  ck_assert_mem_eq(t, want, 32);
  /* pinned: Python's hashlib and hmac over the same bytes */
  hex_of(t, 32, hex);
  ck_assert_str_eq(hex, "08e266271ae2fd991a533ec9edcae455d4c07ea896bcd9290fa702b4346c60ae");

  uint8_t msg[23 + 32];
  memcpy(msg, "neoflow-auth-v2 client ", 23);
  memcpy(msg + 23, t, 32);
  crypto_auth_hmacsha256(want, msg, sizeof msg, key);
  nf_auth_client_mac(key, t, mac);
  ck_assert_mem_eq(mac, want, NF_AUTH_MAC);
  hex_of(mac, sizeof mac, hex);
  ck_assert_str_eq(hex, "b2957bbe3b25a54234dc0b2f0bcaa3346fb463bbec069b3ecf7345582940f2d3");

  memcpy(msg, "neoflow-auth-v2 server ", 23);
  crypto_auth_hmacsha256(want, msg, sizeof msg, key);
  nf_auth_server_mac(key, t, mac);
  ck_assert_mem_eq(mac, want, NF_AUTH_MAC);
  hex_of(mac, sizeof mac, hex);
  ck_assert_str_eq(hex, "0582369137952a8464c8eb1205b90115d7cab6da515e189729b3d3fe9ccf1d7f");
}
END_TEST

START_TEST(dunits_auth_mismatch) {
  uint8_t key[NF_AUTH_KEY], key2[NF_AUTH_KEY], sn[32], cn[32], se[32], ce[32], tg[32], t[32];
  nf_auth_nonce(key);
  memcpy(key2, key, sizeof key);
  key2[31] ^= 1;
  nf_auth_nonce(sn);
  nf_auth_nonce(cn);
  nf_auth_nonce(se);
  nf_auth_nonce(ce);
  nf_auth_nonce(tg);
  ck_assert(memcmp(sn, cn, NF_AUTH_NONCE) != 0); /* the CSPRNG produces fresh bytes */
  nf_box_transcript(sn, se, cn, ce, tg, t);
  uint8_t good[NF_AUTH_MAC], mac[NF_AUTH_MAC], t2[32];
  nf_auth_client_mac(key, t, good);
  nf_auth_client_mac(key, t, mac);
  ck_assert_int_eq(nf_auth_mac_equal(good, mac), 1);
  /* wrong key */
  nf_auth_client_mac(key2, t, mac);
  ck_assert_int_eq(nf_auth_mac_equal(good, mac), 0);
  /* swapped nonces, another server nonce (a replay), another ephemeral
   * key (a man in the middle's), another target: another transcript */
  const uint8_t *alt[4][5] = {{cn, se, sn, ce, tg}, {key2, se, cn, ce, tg},
                              {sn, ce, cn, se, tg}, {sn, se, cn, ce, key2}};
  for (int i = 0; i < 4; i++) {
    nf_box_transcript(alt[i][0], alt[i][1], alt[i][2], alt[i][3], alt[i][4], t2);
    nf_auth_client_mac(key, t2, mac);
    ck_assert_msg(nf_auth_mac_equal(good, mac) == 0, "variant %d", i);
  }
  /* a client MAC reflected as the server's */
  nf_auth_server_mac(key, t, mac);
  ck_assert_int_eq(nf_auth_mac_equal(good, mac), 0);
}
END_TEST

/* The sealed stream (nf_wire_box.h): both ends agree on keys from the
 * exchange; a frame round-trips; a flipped bit, a replayed frame, a
 * reordered pair, a cut frame and another psk each fail; the plain
 * length prefix counts the sealed bytes. */
START_TEST(dunits_box_stream) {
  uint8_t sn[32], cn[32], tg[32], t[32], psk[32];
  nf_auth_nonce(sn);
  nf_auth_nonce(cn);
  nf_auth_nonce(tg);
  nf_auth_nonce(psk);
  uint8_t cpk[32], csk[32], spk[32], ssk[32];
  nf_box_ephemeral(cpk, csk);
  nf_box_ephemeral(spk, ssk);
  nf_box_transcript(sn, spk, cn, cpk, tg, t);
  nf_wire_box cl, sv, other;
  memset(&cl, 0, sizeof cl);
  memset(&sv, 0, sizeof sv);
  memset(&other, 0, sizeof other);
  uint8_t ssk2[32]; /* the server's secret once more, for the keys without a psk */
  memcpy(ssk2, ssk, 32);
  ck_assert_int_eq(nf_box_client_keys(&cl, cpk, csk, spk, psk, t), NF_OK);
  ck_assert_int_eq(nf_box_server_keys(&sv, spk, ssk, cpk, psk, t), NF_OK);
  uint8_t zero[32] = {0};
  ck_assert_mem_eq(csk, zero, 32); /* the ephemeral secret is wiped */
  ck_assert_int_eq(nf_box_server_keys(&other, spk, ssk2, cpk, NULL, t), NF_OK); /* no psk */
  nf_buf f[3] = {NF_BUF_INIT, NF_BUF_INIT, NF_BUF_INIT};
  const char *msgs[3] = {"first frame", "second", "third, a longer one"};
  for (int i = 0; i < 3; i++) {
    uint8_t hdr[4] = {0, 0, 0, (uint8_t)strlen(msgs[i])};
    nf_buf_add(&f[i], hdr, 4);
    nf_buf_add(&f[i], msgs[i], strlen(msgs[i]));
    ck_assert_int_eq(nf_box_seal_frame(&cl, &f[i]), NF_OK);
    ck_assert_uint_eq(f[i].len, 4 + strlen(msgs[i]) + NF_BOX_TAG);
    ck_assert_uint_eq(((uint8_t *)f[i].data)[3], strlen(msgs[i]) + NF_BOX_TAG);
  }
  uint8_t out[128];
  size_t n;
  const uint8_t *p0 = (const uint8_t *)f[0].data + 4;
  /* another psk's keys, a flipped bit, a cut frame: refused, counter kept */
  ck_assert_int_eq(nf_box_open(&other, p0, f[0].len - 4, out, &n), NF_EFORMAT);
  uint8_t bad[128];
  memcpy(bad, p0, f[0].len - 4);
  bad[3] ^= 1;
  ck_assert_int_eq(nf_box_open(&sv, bad, f[0].len - 4, out, &n), NF_EFORMAT);
  ck_assert_int_eq(nf_box_open(&sv, p0, f[0].len - 5, out, &n), NF_EFORMAT);
  /* out of order: the second frame first */
  ck_assert_int_eq(nf_box_open(&sv, (const uint8_t *)f[1].data + 4, f[1].len - 4, out, &n),
                   NF_EFORMAT);
  ck_assert_int_eq(nf_box_open(&sv, p0, f[0].len - 4, out, &n), NF_OK);
  ck_assert_uint_eq(n, strlen(msgs[0]));
  ck_assert(!memcmp(out, msgs[0], n));
  /* replayed */
  ck_assert_int_eq(nf_box_open(&sv, p0, f[0].len - 4, out, &n), NF_EFORMAT);
  ck_assert_int_eq(nf_box_open(&sv, (const uint8_t *)f[1].data + 4, f[1].len - 4, out, &n), NF_OK);
  ck_assert(!memcmp(out, msgs[1], n));
  /* the other direction has its own key: a client frame is no server frame */
  ck_assert_int_eq(nf_box_open(&cl, (const uint8_t *)f[2].data + 4, f[2].len - 4, out, &n),
                   NF_EFORMAT);
  for (int i = 0; i < 3; i++) nf_buf_free(&f[i]);
  nf_box_clear(&cl);
  nf_box_clear(&sv);
  nf_box_clear(&other);
}
END_TEST

START_TEST(dunits_auth_mac_equal) {
  uint8_t a[NF_AUTH_MAC], b[NF_AUTH_MAC];
  fill(a, sizeof a, 7);
  memcpy(b, a, sizeof a);
  ck_assert_int_eq(nf_auth_mac_equal(a, b), 1);
  b[0] ^= 0x80;
  ck_assert_int_eq(nf_auth_mac_equal(a, b), 0);
  b[0] ^= 0x80;
  b[NF_AUTH_MAC - 1] ^= 1;
  ck_assert_int_eq(nf_auth_mac_equal(a, b), 0);
}
END_TEST

START_TEST(dunits_auth_key_file) {
  char path[256], other[256];
  nf_buf err = NF_BUF_INIT;
  uint8_t key[NF_AUTH_KEY], key2[NF_AUTH_KEY];
  tpath(path, sizeof path, "key");
  mode_t old = umask(0);
  int rc = nf_auth_new_key(path, &err);
  umask(old);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  struct stat st;
  ck_assert_int_eq(lstat(path, &st), 0);
  ck_assert_int_eq(st.st_mode & 07777, 0600);
  ck_assert_int_eq(st.st_size, 65);
  char text[80] = {0};
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ck_assert_int_eq(read(fd, text, sizeof text - 1), 65);
  close(fd);
  ck_assert_int_eq(text[64], '\n');
  for (int i = 0; i < 64; i++) ck_assert(strchr("0123456789abcdef", text[i]));
  ck_assert_int_eq(nf_auth_load_key(path, key, &err), NF_OK);
  /* Never overwritten. */
  ck_assert_int_eq(nf_auth_new_key(path, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "refusing to overwrite"));
  ck_assert_int_eq(nf_auth_load_key(path, key2, &err), NF_OK);
  ck_assert_mem_eq(key, key2, NF_AUTH_KEY);
  /* Not through a (dangling) symlink either. */
  tpath(other, sizeof other, "dangling");
  char target[256];
  ck_assert_int_eq(symlink(tpath(target, sizeof target, "elsewhere"), other), 0);
  ck_assert_int_ne(nf_auth_new_key(other, &err), NF_OK);
  ck_assert_int_eq(access(target, F_OK), -1);

  /* A hand-written key with blanks around it. */
  tpath(path, sizeof path, "hand");
  write_file(path,
             "  \n000102030405060708090a0b0c0d0e0f101112131415161718191A1B1C1D1E1F\r\n\n", 0600);
  ck_assert_int_eq(nf_auth_load_key(path, key, &err), NF_OK);
  fill(key2, sizeof key2, 0);
  ck_assert_mem_eq(key, key2, NF_AUTH_KEY);

  /* 0644: refused. */
  ck_assert_int_eq(chmod(path, 0644), 0);
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_auth_load_key(path, key, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "mode 0644"));
  ck_assert_int_eq(chmod(path, 0640), 0);
  ck_assert_int_eq(nf_auth_load_key(path, key, &err), NF_EINVAL);
  ck_assert_int_eq(chmod(path, 0604), 0);
  ck_assert_int_eq(nf_auth_load_key(path, key, &err), NF_EINVAL);
  ck_assert_int_eq(chmod(path, 0400), 0);
  ck_assert_int_eq(nf_auth_load_key(path, key, &err), NF_OK);

  /* Symlink: refused even to a good file. */
  tpath(other, sizeof other, "link");
  ck_assert_int_eq(symlink(path, other), 0);
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_auth_load_key(other, key, &err), NF_EINVAL);
  ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "symlink"));

  /* Another owner. */
  if (geteuid() == 0) {
    ck_assert_int_eq(chown(path, NOBODY, NOBODY), 0);
    nf_buf_reset(&err);
    ck_assert_int_eq(nf_auth_load_key(path, key, &err), NF_EINVAL);
    ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "owned by uid 65534"));
  }

  /* Bad contents. */
  static const char *const bad[] = {
      "",
      "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1\n",   /* 63 */
      "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f0\n", /* 65 */
      "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1g\n",  /* g */
      "0001020304050607 08090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n", /* blank inside */
      "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\nmore\n",
  };
  tpath(path, sizeof path, "bad");
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    unlink(path);
    write_file(path, bad[i], 0600);
    nf_buf_reset(&err);
    ck_assert_msg(nf_auth_load_key(path, key, &err) == NF_EINVAL, "bad key %zu accepted", i);
    ck_assert_ptr_nonnull(strstr(nf_buf_str(&err), "expected 64 hex digits"));
  }
  /* Missing. */
  tpath(path, sizeof path, "missing");
  ck_assert_int_eq(nf_auth_load_key(path, key, &err), NF_ENOENT);
  nf_buf_free(&err);
}
END_TEST

/* ---- target ---- */

static const char cpuinfo_x86[] =
    "processor\t: 0\n"
    "vendor_id\t: GenuineIntel\n"
    "cpu family\t: 6\n"
    "model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz\n"
    "cpu MHz\t\t: 2900.000\n"
    "flags\t\t: fpu sse4_2 avx avx2 fma avx512f\n"
    "bogomips\t: 5800.00\n"
    "\n"
    "processor\t: 1\n"
    "vendor_id\t: GenuineIntel\n"
    "model name\t: Something Else\n"
    "flags\t\t: fpu\n"
    "\n";

/* cpuinfo_x86 with its first flags line replaced. */
static void with_flags(char *out, size_t n, const char *flags) {
  const char *at = strstr(cpuinfo_x86, "fpu sse4_2 avx avx2 fma avx512f");
  int len = snprintf(out, n, "%.*s%s%s", (int)(at - cpuinfo_x86), cpuinfo_x86, flags,
                     at + strlen("fpu sse4_2 avx avx2 fma avx512f"));
  ck_assert(len > 0 && (size_t)len < n);
}

START_TEST(dunits_target_fingerprint) {
  nf_host_target a, b;
  nf__host_target_from(cpuinfo_x86, "x86_64", 2, &a);
  /* The documented layout, computed here directly. */
  const char *input = "neoflow-target-v1 cpu\nx86_64\nGenuineIntel\n"
                      "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz\n"
                      "avx avx2 avx512f fma fpu sse4_2\n2";
  uint8_t want[32];
  crypto_hash_sha256(want, (const unsigned char *)input, strlen(input));
  ck_assert_mem_eq(a.fingerprint, want, 32);
  ck_assert_str_eq(a.description,
                   "x86_64 Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz, 2 CPUs, avx512f avx2 "
                   "fma avx sse4_2");

  /* Same text: same key. */
  nf__host_target_from(cpuinfo_x86, "x86_64", 2, &b);
  ck_assert_mem_eq(a.fingerprint, b.fingerprint, 32);
  /* Order, duplicates and extra blanks in the flags do not matter. */
  char text[1024];
  with_flags(text, sizeof text, "avx512f  fma avx2 avx sse4_2 fpu avx2");
  nf__host_target_from(text, "x86_64", 2, &b);
  ck_assert_mem_eq(a.fingerprint, b.fingerprint, 32);
  /* One flag more: another key. */
  with_flags(text, sizeof text, "fpu sse4_2 avx avx2 fma avx512f avx512bw");
  nf__host_target_from(text, "x86_64", 2, &b);
  ck_assert(memcmp(a.fingerprint, b.fingerprint, 32) != 0);
  /* One flag less. */
  with_flags(text, sizeof text, "fpu sse4_2 avx avx2 fma");
  nf__host_target_from(text, "x86_64", 2, &b);
  ck_assert(memcmp(a.fingerprint, b.fingerprint, 32) != 0);
  ck_assert_ptr_null(strstr(b.description, "avx512f"));
  /* CPU count and architecture are part of the key. */
  nf__host_target_from(cpuinfo_x86, "x86_64", 4, &b);
  ck_assert(memcmp(a.fingerprint, b.fingerprint, 32) != 0);
  ck_assert_ptr_nonnull(strstr(b.description, ", 4 CPUs,"));
  nf__host_target_from(cpuinfo_x86, "i686", 2, &b);
  ck_assert(memcmp(a.fingerprint, b.fingerprint, 32) != 0);
  /* Other processors' blocks and volatile lines (MHz) are ignored. */
  char *edited = strdup(cpuinfo_x86);
  ck_assert_ptr_nonnull(edited);
  memcpy(strstr(edited, "2900.000"), "1234.567", 8);
  memcpy(strstr(edited, "Something Else"), "Other Thing!!!", 14);
  nf__host_target_from(edited, "x86_64", 2, &b);
  ck_assert_mem_eq(a.fingerprint, b.fingerprint, 32);
  free(edited);

  /* No cpuinfo at all: arch and count only. */
  nf__host_target_from(NULL, "x86_64", 1, &b);
  input = "neoflow-target-v1 cpu\nx86_64\n\n\n\n1";
  crypto_hash_sha256(want, (const unsigned char *)input, strlen(input));
  ck_assert_mem_eq(b.fingerprint, want, 32);
  ck_assert_str_eq(b.description, "x86_64, 1 CPU");
}
END_TEST

START_TEST(dunits_target_arm) {
  static const char arm[] = "processor\t: 0\n"
                            "BogoMIPS\t: 243.75\n"
                            "Features\t: fp asimd evtstrm aes sve asimddp\n"
                            "CPU implementer\t: 0x41\n"
                            "CPU architecture: 8\n"
                            "CPU variant\t: 0x1\n"
                            "CPU part\t: 0xd40\n"
                            "CPU revision\t: 1\n"
                            "\n"
                            "processor\t: 1\n";
  nf_host_target t;
  nf__host_target_from(arm, "aarch64", 64, &t);
  const char *input = "neoflow-target-v1 cpu\naarch64\nCPU implementer 0x41\nCPU part 0xd40\n"
                      "aes asimd asimddp evtstrm fp sve\n64";
  uint8_t want[32];
  crypto_hash_sha256(want, (const unsigned char *)input, strlen(input));
  ck_assert_mem_eq(t.fingerprint, want, 32);
  ck_assert_str_eq(t.description, "aarch64 CPU part 0xd40, 64 CPUs, sve asimddp asimd");
}
END_TEST

START_TEST(dunits_target_truncated) {
  char text[2048];
  char model[400];
  memset(model, 'M', sizeof model - 1);
  model[sizeof model - 1] = 0;
  snprintf(text, sizeof text, "vendor_id: V\nmodel name: %s\nflags: avx2 fma\n", model);
  nf_host_target t;
  nf__host_target_from(text, "x86_64", 8, &t);
  ck_assert_int_eq(strlen(t.description), sizeof t.description - 1);
  ck_assert(strncmp(t.description, "x86_64 MMM", 10) == 0);
}
END_TEST

static void *get_target(void *arg) {
  nf_host_target_get(arg);
  return NULL;
}

START_TEST(dunits_target_host) {
  nf_host_target t[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) ck_assert_int_eq(pthread_create(&th[i], NULL, get_target, &t[i]), 0);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  uint8_t zero[32] = {0};
  ck_assert(memcmp(t[0].fingerprint, zero, 32) != 0);
  ck_assert(t[0].description[0] != 0);
  struct utsname u;
  ck_assert_int_eq(uname(&u), 0);
  ck_assert(strncmp(t[0].description, u.machine, strlen(u.machine)) == 0);
  for (int i = 1; i < 4; i++) {
    ck_assert_mem_eq(t[0].fingerprint, t[i].fingerprint, 32);
    ck_assert_str_eq(t[0].description, t[i].description);
  }
  char want[64];
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  snprintf(want, sizeof want, ", %ld CPU%s", n, n == 1 ? "" : "s");
  ck_assert_ptr_nonnull(strstr(t[0].description, want));
}
END_TEST

int main(void) {
  Suite *s = suite_create("dunits");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 30);
  tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
  tcase_add_test(tc, dunits_config_defaults);
  tcase_add_test(tc, dunits_config_full_file);
  tcase_add_test(tc, dunits_config_unknown_section);
  tcase_add_test(tc, dunits_config_unknown_key);
  tcase_add_test(tc, dunits_config_bad_int);
  tcase_add_test(tc, dunits_config_out_of_range);
  tcase_add_test(tc, dunits_config_bad_bool);
  tcase_add_test(tc, dunits_config_syntax);
  tcase_add_test(tc, dunits_config_env_overrides);
  tcase_add_test(tc, dunits_config_example);
  tcase_add_test(tc, dunits_tune_budget);
  tcase_add_test(tc, dunits_check_tcp_key);
  tcase_add_test(tc, dunits_check_limits);
  tcase_add_test(tc, dunits_socket_dir_created);
  tcase_add_test(tc, dunits_socket_dir_symlink);
  tcase_add_test(tc, dunits_socket_dir_mode);
  tcase_add_test(tc, dunits_socket_dir_owner);
  tcase_add_test(tc, dunits_listen_unix_mode);
  tcase_add_test(tc, dunits_listen_unix_running);
  tcase_add_test(tc, dunits_listen_unix_stale);
  tcase_add_test(tc, dunits_listen_unix_too_long);
  tcase_add_test(tc, dunits_listen_tcp);
  tcase_add_test(tc, dunits_systemd_fds);
  tcase_add_test(tc, dunits_systemd_fds_malformed);
  tcase_add_test(tc, dunits_peer_cred);
  tcase_add_test(tc, dunits_uid_allowed);
  tcase_add_test(tc, dunits_group_gid);
  tcase_add_test(tc, dunits_auth_known_answer);
  tcase_add_test(tc, dunits_auth_mismatch);
  tcase_add_test(tc, dunits_box_stream);
  tcase_add_test(tc, dunits_auth_mac_equal);
  tcase_add_test(tc, dunits_auth_key_file);
  tcase_add_test(tc, dunits_target_fingerprint);
  tcase_add_test(tc, dunits_target_arm);
  tcase_add_test(tc, dunits_target_truncated);
  tcase_add_test(tc, dunits_target_host);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
