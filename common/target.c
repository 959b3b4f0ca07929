/* target.c - the host fingerprint (see nf_target.h): the first processor
 * block of /proc/cpuinfo, uname's machine and the online CPU count, hashed
 * with libsodium's SHA-256 in the documented layout, plus a one-line
 * description for logs and `neoflow daemon status`.
 *
 * Invariants:
 *  - The hash input is a pure function of (cpuinfo's first block, arch,
 *    n_cpus): flags are sorted and deduplicated, so their order in the file
 *    does not matter; every other line of cpuinfo (MHz, bogomips, cache
 *    size, microcode) is ignored, so the key does not drift with clocks or
 *    updates.
 *  - The host's target is computed once (pthread_once) and copied out;
 *    nf_host_target_get never fails and never allocates after that.
 *
 * Not here: GPU targets (the GPU backend adds its own key parts). */
#include "nf_target.h"

#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "nf_status.h"

#define CPUINFO_MAX (1 << 20) /* bytes read at most to find the first block */

typedef struct span {
  const char *p;
  size_t n;
} span;

typedef struct cpu_fields {
  span vendor, model, flags;
  span implementer, part, features; /* ARM's names */
} cpu_fields;

/* Flags worth showing in the description, best first (those present). */
static const char *const notable_flags[] = {
    "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8", "avx_vnni", "avx2", "fma", "f16c", "avx",
    "sse4_2", "sve2", "sve", "sme", "i8mm", "bf16", "asimddp", "asimdhp", "asimd",
};

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

static span trim(const char *p, size_t n) {
  while (n && is_blank(*p)) p++, n--;
  while (n && is_blank(p[n - 1])) n--;
  return (span){p, n};
}

static int span_is(span s, const char *lit) {
  return s.n == strlen(lit) && memcmp(s.p, lit, s.n) == 0;
}

/* The fields of the first processor block: lines up to the first blank
 * line that follows a non-blank one. */
static void parse_cpuinfo(const char *text, cpu_fields *f) {
  memset(f, 0, sizeof *f);
  if (!text) return;
  int started = 0;
  const char *p = text;
  while (*p) {
    const char *eol = strchr(p, '\n');
    size_t len = eol ? (size_t)(eol - p) : strlen(p);
    span line = trim(p, len);
    if (line.n == 0) {
      if (started) break;
    } else {
      started = 1;
      const char *colon = memchr(line.p, ':', line.n);
      if (colon) {
        span key = trim(line.p, (size_t)(colon - line.p));
        span val = trim(colon + 1, line.n - (size_t)(colon - line.p) - 1);
        if (span_is(key, "vendor_id")) f->vendor = val;
        else if (span_is(key, "model name")) f->model = val;
        else if (span_is(key, "flags")) f->flags = val;
        else if (span_is(key, "Features")) f->features = val;
        else if (span_is(key, "CPU implementer")) f->implementer = val;
        else if (span_is(key, "CPU part")) f->part = val;
      }
    }
    if (!eol) break;
    p = eol + 1;
  }
}

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  size_t n = x->n < y->n ? x->n : y->n;
  int c = memcmp(x->p, y->p, n);
  if (c) return c;
  return x->n < y->n ? -1 : x->n > y->n;
}

/* Splits s on blanks into a sorted, deduplicated array (malloc'd; *n). */
static span *split_flags(span s, size_t *n) {
  size_t cap = s.n / 2 + 1, k = 0;
  span *v = malloc(cap * sizeof *v);
  NF_ASSERT(v); /* a few KiB at start-up */
  size_t i = 0;
  while (i < s.n) {
    while (i < s.n && is_blank(s.p[i])) i++;
    size_t start = i;
    while (i < s.n && !is_blank(s.p[i])) i++;
    if (i > start) v[k++] = (span){s.p + start, i - start};
  }
  qsort(v, k, sizeof *v, span_cmp);
  size_t m = 0;
  for (size_t j = 0; j < k; j++)
    if (m == 0 || span_cmp(&v[m - 1], &v[j]) != 0) v[m++] = v[j];
  *n = m;
  return v;
}

static void hash_span(crypto_hash_sha256_state *st, span s) {
  if (s.n) crypto_hash_sha256_update(st, (const unsigned char *)s.p, s.n);
}

static void hash_str(crypto_hash_sha256_state *st, const char *s) {
  crypto_hash_sha256_update(st, (const unsigned char *)s, strlen(s));
}

/* Appends s (n bytes) to d (cap bytes, NUL-terminated) when it fits
 * whole; 0 when it does not (d unchanged). */
static int append_fit(char *d, size_t cap, const char *s, size_t n) {
  size_t len = strlen(d);
  if (len + n + 1 > cap) return 0;
  memcpy(d + len, s, n);
  d[len + n] = 0;
  return 1;
}

/* Appends as much of s as fits. */
static void append_cut(char *d, size_t cap, const char *s, size_t n) {
  size_t len = strlen(d);
  if (len + 1 >= cap) return;
  if (n > cap - 1 - len) n = cap - 1 - len;
  memcpy(d + len, s, n);
  d[len + n] = 0;
}

static int has_flag(const span *v, size_t n, const char *name) {
  span key = {name, strlen(name)};
  return bsearch(&key, v, n, sizeof *v, span_cmp) != NULL;
}

/* "CPU implementer 0x41" style fallbacks, into buf. */
static span labelled(char *buf, size_t cap, const char *label, span v) {
  if (!v.n) return v;
  int len = snprintf(buf, cap, "%s %.*s", label, (int)v.n, v.p);
  if (len < 0) return (span){"", 0};
  return (span){buf, (size_t)len < cap ? (size_t)len : cap - 1};
}

void nf__host_target_from(const char *cpuinfo, const char *arch, long n_cpus,
                          nf_host_target *t) {
  int sr = sodium_init(); /* thread-safe, idempotent */
  NF_ASSERT(sr >= 0);
  cpu_fields f;
  parse_cpuinfo(cpuinfo, &f);
  char vbuf[160], mbuf[160];
  span vendor = f.vendor.n ? f.vendor : labelled(vbuf, sizeof vbuf, "CPU implementer", f.implementer);
  span model = f.model.n ? f.model : labelled(mbuf, sizeof mbuf, "CPU part", f.part);
  size_t n_flags = 0;
  span *flags = split_flags(f.flags.n ? f.flags : f.features, &n_flags);
  if (!arch) arch = "";
  if (n_cpus < 1) n_cpus = 1;

  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  hash_str(&st, "neoflow-target-v1 cpu\n");
  hash_str(&st, arch);
  hash_str(&st, "\n");
  hash_span(&st, vendor);
  hash_str(&st, "\n");
  hash_span(&st, model);
  hash_str(&st, "\n");
  for (size_t i = 0; i < n_flags; i++) {
    if (i) hash_str(&st, " ");
    hash_span(&st, flags[i]);
  }
  hash_str(&st, "\n");
  char num[32];
  snprintf(num, sizeof num, "%ld", n_cpus);
  hash_str(&st, num);
  crypto_hash_sha256_final(&st, t->fingerprint);

  /* "<arch> <model>, <n> CPUs, <notable flags>" */
  char *d = t->description;
  size_t cap = sizeof t->description;
  d[0] = 0;
  append_cut(d, cap, arch, strlen(arch));
  if (model.n) {
    append_cut(d, cap, " ", 1);
    append_cut(d, cap, model.p, model.n);
  }
  char cpus[48];
  snprintf(cpus, sizeof cpus, ", %ld CPU%s", n_cpus, n_cpus == 1 ? "" : "s");
  append_fit(d, cap, cpus, strlen(cpus));
  const char *sep = ", ";
  for (size_t i = 0; i < sizeof notable_flags / sizeof notable_flags[0]; i++) {
    const char *fl = notable_flags[i];
    if (!has_flag(flags, n_flags, fl)) continue;
    char word[64];
    int len = snprintf(word, sizeof word, "%s%s", sep, fl);
    if (len < 0 || (size_t)len >= sizeof word || !append_fit(d, cap, word, (size_t)len)) break;
    sep = " ";
  }
  free(flags);
}

/* ---- this host, once ---- */

void nf_cuda_target_make(int sm, const char *name, nf_host_target *t) {
  int sr = sodium_init();
  NF_ASSERT(sr >= 0);
  if (!name) name = "";
  char head[64];
  snprintf(head, sizeof head, "neoflow-target-v1 cuda\nsm_%d\n", sm);
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  hash_str(&st, head);
  hash_str(&st, name);
  crypto_hash_sha256_final(&st, t->fingerprint);
  snprintf(t->description, sizeof t->description, "cuda sm_%d %s", sm, name);
}

static nf_host_target host_target;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

/* Reads /proc/cpuinfo up to the end of its first block (malloc'd text, or
 * NULL when unreadable). */
static char *read_cpuinfo(void) {
  int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  size_t cap = 16384, n = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    if (n == cap) {
      if (cap >= CPUINFO_MAX) break;
      char *nb = realloc(buf, cap * 2 + 1);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + n, cap - n);
    if (r <= 0) break;
    n += (size_t)r;
    buf[n] = 0;
    if (strstr(buf, "\n\n")) break;
  }
  close(fd);
  if (buf) buf[n] = 0;
  return buf;
}

static void host_init(void) {
  struct utsname u;
  const char *arch = uname(&u) == 0 ? u.machine : "unknown";
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  char *text = read_cpuinfo();
  nf__host_target_from(text, arch, n, &host_target);
  free(text);
}

void nf_host_target_get(nf_host_target *t) {
  pthread_once(&host_once, host_init);
  *t = host_target;
}
