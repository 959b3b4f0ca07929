/* auth.c - the TCP handshake's challenge-response and its key file (see
 * nf_wire_auth.h).  All cryptography is libsodium's: HMAC-SHA256
 * (crypto_auth_hmacsha256), the CSPRNG (randombytes_buf) and the
 * constant-time comparison (sodium_memcmp).
 *
 * Invariants:
 *  - sodium_init() has run (once, pthread_once) before any libsodium call.
 *  - Key material read from or written to a file is wiped (sodium_memzero)
 *    from our buffers before returning, and never appears in messages.
 *  - A key file is trusted only when it is a regular file, reached without
 *    following a symlink, owned by us and unreadable to anyone else.
 *
 * Not here: the handshake's framing and deadlines (the daemon's session
 * code and the client own them). */
#include "nf_wire_auth.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEY_FILE_MAX 4096
#define LABEL_LEN (sizeof NF_AUTH_CLIENT_LABEL - 1)

static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;

static void sodium_init_once(void) {
  int r = sodium_init(); /* 1: already initialised, which is fine */
  NF_ASSERT(r >= 0);
}

static void ensure_sodium(void) { pthread_once(&sodium_once, sodium_init_once); }

static void mac2(const uint8_t key[NF_AUTH_KEY], const char *label, const uint8_t t[32],
                 uint8_t mac[NF_AUTH_MAC]) {
  uint8_t msg[LABEL_LEN + 32];
  _Static_assert(sizeof NF_AUTH_CLIENT_LABEL == sizeof NF_AUTH_SERVER_LABEL, "label lengths");
  _Static_assert(crypto_auth_hmacsha256_KEYBYTES == NF_AUTH_KEY, "key size");
  _Static_assert(crypto_auth_hmacsha256_BYTES == NF_AUTH_MAC, "mac size");
  ensure_sodium();
  memcpy(msg, label, LABEL_LEN);
  memcpy(msg + LABEL_LEN, t, 32);
  crypto_auth_hmacsha256(mac, msg, sizeof msg, key);
}

void nf_auth_client_mac(const uint8_t key[NF_AUTH_KEY], const uint8_t t[32],
                        uint8_t mac[NF_AUTH_MAC]) {
  mac2(key, NF_AUTH_CLIENT_LABEL, t, mac);
}

void nf_auth_server_mac(const uint8_t key[NF_AUTH_KEY], const uint8_t t[32],
                        uint8_t mac[NF_AUTH_MAC]) {
  mac2(key, NF_AUTH_SERVER_LABEL, t, mac);
}

int nf_auth_mac_equal(const uint8_t a[NF_AUTH_MAC], const uint8_t b[NF_AUTH_MAC]) {
  ensure_sodium();
  return sodium_memcmp(a, b, NF_AUTH_MAC) == 0;
}

void nf_auth_nonce(uint8_t nonce[NF_AUTH_NONCE]) {
  ensure_sodium();
  randombytes_buf(nonce, NF_AUTH_NONCE);
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int hex_val(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* 64 hex digits with optional blanks around them; 1 when well-formed. */
static int parse_key_text(const char *text, size_t n, uint8_t key[NF_AUTH_KEY]) {
  size_t i = 0;
  while (i < n && is_space(text[i])) i++;
  if (n - i < 2 * NF_AUTH_KEY) return 0;
  for (size_t k = 0; k < NF_AUTH_KEY; k++) {
    int hi = hex_val(text[i + 2 * k]), lo = hex_val(text[i + 2 * k + 1]);
    if (hi < 0 || lo < 0) return 0;
    key[k] = (uint8_t)(hi << 4 | lo);
  }
  for (i += 2 * NF_AUTH_KEY; i < n; i++)
    if (!is_space(text[i])) return 0;
  return 1;
}

int nf_auth_load_key(const char *path, uint8_t key[NF_AUTH_KEY], nf_buf *err) {
  ensure_sodium();
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    if (e == ELOOP) {
      nf_buf_printf(err, "key file %s is a symlink: refusing it", path);
      return NF_EINVAL;
    }
    nf_buf_printf(err, "key file %s: %s", path, strerror(e));
    return e == ENOENT ? NF_ENOENT : NF_EIO;
  }
  struct stat st;
  int rc = NF_OK;
  if (fstat(fd, &st) != 0) {
    nf_buf_printf(err, "key file %s: %s", path, strerror(errno));
    rc = NF_EIO;
  } else if (!S_ISREG(st.st_mode)) {
    nf_buf_printf(err, "key file %s is not a regular file", path);
    rc = NF_EINVAL;
  } else if (st.st_uid != geteuid()) {
    nf_buf_printf(err, "key file %s is owned by uid %lu, not by us (uid %lu)", path,
                  (unsigned long)st.st_uid, (unsigned long)geteuid());
    rc = NF_EINVAL;
  } else if (st.st_mode & 077) {
    nf_buf_printf(err, "key file %s has mode %04o: group or other may access it (chmod 600)",
                  path, (unsigned)st.st_mode & 07777);
    rc = NF_EINVAL;
  } else if (st.st_size > KEY_FILE_MAX) {
    nf_buf_printf(err, "key file %s: %lld bytes, expected 64 hex digits", path,
                  (long long)st.st_size);
    rc = NF_EINVAL;
  }
  if (rc != NF_OK) {
    close(fd);
    return rc;
  }
  char text[KEY_FILE_MAX + 1];
  size_t n = 0;
  while (n < sizeof text) {
    ssize_t r = read(fd, text + n, sizeof text - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      nf_buf_printf(err, "key file %s: %s", path, strerror(errno));
      rc = NF_EIO;
      break;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  if (rc == NF_OK && (n > KEY_FILE_MAX || !parse_key_text(text, n, key))) {
    nf_buf_printf(err, "key file %s: expected 64 hex digits (a 32-byte key) and nothing else",
                  path);
    rc = NF_EINVAL;
  }
  if (rc != NF_OK) sodium_memzero(key, NF_AUTH_KEY);
  sodium_memzero(text, sizeof text);
  return rc;
}

int nf_auth_new_key(const char *path, nf_buf *err) {
  ensure_sodium();
  uint8_t key[NF_AUTH_KEY];
  char hex[2 * NF_AUTH_KEY + 2];
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600);
  if (fd < 0) {
    int e = errno;
    nf_buf_printf(err, "key file %s: %s%s", path, strerror(e),
                  e == EEXIST ? " (refusing to overwrite it)" : "");
    return e == EEXIST ? NF_EINVAL : NF_EIO;
  }
  randombytes_buf(key, sizeof key);
  sodium_bin2hex(hex, sizeof hex, key, sizeof key);
  hex[2 * NF_AUTH_KEY] = '\n';
  size_t n = 0, len = 2 * NF_AUTH_KEY + 1;
  int rc = NF_OK;
  if (fchmod(fd, 0600) != 0) rc = NF_EIO;
  while (rc == NF_OK && n < len) {
    ssize_t w = write(fd, hex + n, len - n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) rc = NF_EIO;
    else n += (size_t)w;
  }
  if (rc == NF_OK && fsync(fd) != 0) rc = NF_EIO;
  int e = errno;
  if (close(fd) != 0 && rc == NF_OK) {
    rc = NF_EIO;
    e = errno;
  }
  sodium_memzero(key, sizeof key);
  sodium_memzero(hex, sizeof hex);
  if (rc != NF_OK) {
    unlink(path);
    nf_buf_printf(err, "key file %s: %s", path, strerror(e ? e : EIO));
  }
  return rc;
}
