/* test_data.c - IDX files, MNIST-style datasets and evaluation
 * (neoflow/neoflow.h: nf_idx_load, nf_dataset_mnist_load, nf_session_eval,
 * nf_session_output_info; client/idx.c, client/session.c,
 * client/tool/train_cmd.c):
 *
 *  - IDX files written here (u8, i8, i16, i32, f32, f64; plain and
 *    gzip-compressed) load with their type, rank, dims and every value in
 *    the host's byte order;
 *  - a missing, empty, truncated, malformed, over-long or oversized file,
 *    or a corrupt gzip stream, is an error with a status, a zeroed nf_idx
 *    and a message naming the file and the fault;
 *  - an MNIST-style directory (some files .gz, some plain) loads with the
 *    Fashion-MNIST normalisation, and inconsistent splits are errors;
 *  - nf_session_eval computes the loss and the outputs of a step's
 *    forward pass without touching the parameters or the step count;
 *  - on the real Fashion-MNIST (Debian's dataset-fashion-mnist, skipped
 *    where it is missing) the MLP of examples/fashion_mlp.nf reaches a
 *    test accuracy far above chance through the API and through
 *    `neoflow train --data fashion-mnist`;
 *  - `neoflow train --data-dir` on a damaged directory fails with the
 *    file's name and the fault. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "neoflow/neoflow.h"
#include "nf_status.h"

#if defined(__SANITIZE_ADDRESS__)
#define NF_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NF_TEST_ASAN 1
#endif
#endif
#ifndef NF_TEST_ASAN
#define NF_TEST_ASAN 0
#endif

/* ---- helpers ---- */

static char tmpdir[256];

static void setup(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/nf_data_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  ck_assert_int_eq(system(cmd), 0);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t rng_state;

static void rng_seed(uint64_t s) { rng_state = s; }

static uint64_t rng_next(void) {
  rng_state += 0x9e3779b97f4a7c15ULL;
  uint64_t z = rng_state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static double unif(void) { return (double)(rng_next() >> 11) * 0x1.0p-53; }

/* tmpdir/name (a static buffer: one of four in turn). */
static const char *tp(const char *name) {
  static char bufs[4][512];
  static int k;
  char *p = bufs[k++ % 4];
  snprintf(p, 512, "%s/%s", tmpdir, name);
  return p;
}

static void mkdir_t(const char *name) { ck_assert_int_eq(mkdir(tp(name), 0700), 0); }

static void write_raw(const char *name, const void *data, size_t n) {
  FILE *f = fopen(tp(name), "wb");
  ck_assert_msg(f != NULL, "%s: %s", tp(name), strerror(errno));
  if (n) ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
}

/* name, gzip-compressed with zlib (gzopen/gzwrite). */
static void write_gz(const char *name, const void *data, size_t n) {
  gzFile g = gzopen(tp(name), "wb9");
  ck_assert_msg(g != NULL, "gzopen %s", tp(name));
  if (n) ck_assert_int_eq(gzwrite(g, data, (unsigned)n), (int)n);
  ck_assert_int_eq(gzclose(g), Z_OK);
}

/* The bytes of a file (malloc'd; *n its size). */
static unsigned char *read_raw(const char *name, size_t *n) {
  FILE *f = fopen(tp(name), "rb");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
  long len = ftell(f);
  ck_assert_int_ge(len, 0);
  rewind(f);
  unsigned char *b = malloc((size_t)len + 1);
  ck_assert_ptr_nonnull(b);
  ck_assert_uint_eq(fread(b, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return b;
}

static void put_be(unsigned char *p, uint64_t v, int size) {
  for (int i = size - 1; i >= 0; i--) {
    p[i] = (unsigned char)(v & 0xff);
    v >>= 8;
  }
}

/* An IDX file in memory: magic 00 00 type rank, the dims as big-endian
 * u32, then payload (already big-endian).  malloc'd; *len its size. */
static unsigned char *idx_image(int type, int rank, const uint32_t *dims, const void *payload,
                                size_t plen, size_t *len) {
  size_t n = 4 + 4 * (size_t)rank + plen;
  unsigned char *b = malloc(n + 1);
  ck_assert_ptr_nonnull(b);
  b[0] = 0;
  b[1] = 0;
  b[2] = (unsigned char)type;
  b[3] = (unsigned char)rank;
  for (int i = 0; i < rank; i++) put_be(b + 4 + 4 * i, dims[i], 4);
  if (plen) memcpy(b + 4 + 4 * (size_t)rank, payload, plen);
  *len = n;
  return b;
}

static void write_idx(const char *name, int gz, int type, int rank, const uint32_t *dims,
                      const void *payload, size_t plen) {
  size_t len;
  unsigned char *b = idx_image(type, rank, dims, payload, plen, &len);
  if (gz) write_gz(name, b, len);
  else write_raw(name, b, len);
  free(b);
}

static nf_idx load_ok(const char *name) {
  nf_idx x;
  memset(&x, 0xab, sizeof x);
  char *err = NULL;
  int rc = nf_idx_load(tp(name), &x, &err);
  ck_assert_msg(rc == NF_OK, "%s: %s: %s", name, nf_strerror(rc), err ? err : "(no message)");
  ck_assert_ptr_null(err);
  return x;
}

static void check_zeroed(const nf_idx *x, const char *what) {
  ck_assert_msg(x->type == 0 && x->rank == 0 && x->data == NULL && x->bytes == 0,
                "%s: nf_idx not zeroed (type %d rank %d data %p bytes %zu)", what, x->type,
                x->rank, x->data, x->bytes);
  for (int i = 0; i < 8; i++)
    ck_assert_msg(x->dims[i] == 0, "%s: dims[%d] = %lld", what, i, (long long)x->dims[i]);
}

/* nf_idx_load(tmpdir/name) fails with want, a zeroed nf_idx and a message
 * naming the file and holding each of the needles (NULL-terminated). */
static void expect_idx_err(const char *name, int want, ...) {
  const char *path = tp(name);
  nf_idx x;
  memset(&x, 0xab, sizeof x);
  char *err = NULL;
  double t0 = now_ms();
  int rc = nf_idx_load(path, &x, &err);
  double dt = now_ms() - t0;
  if (rc == NF_OK) nf_idx_free(&x); /* before failing: no leak */
  ck_assert_msg(rc == want, "%s: status %s (%s), wanted %s", name, nf_status_name(rc),
                err ? err : "(no message)", nf_status_name(want));
  check_zeroed(&x, name);
  ck_assert_msg(err != NULL, "%s: no message", name);
  ck_assert_msg(strstr(err, path) != NULL, "%s: message does not name the file: %s", name, err);
  va_list ap;
  va_start(ap, want);
  for (const char *n = va_arg(ap, const char *); n; n = va_arg(ap, const char *))
    ck_assert_msg(strstr(err, n) != NULL, "%s: message lacks '%s': %s", name, n, err);
  va_end(ap);
  /* every fault is found at once (the largest file here is 128 KiB) */
  ck_assert_msg(dt < 5000, "%s: %.0f ms to fail", name, dt);
  free(err);
  /* without a message pointer: the same status, no crash */
  memset(&x, 0xab, sizeof x);
  ck_assert_int_eq(nf_idx_load(path, &x, NULL), want);
  check_zeroed(&x, name);
}

/* ---- 1. IDX round trip ---- */

START_TEST(idx_round_trip) {
  /* u8, rank 3 */
  enum { A = 2, B = 3, C = 4 };
  unsigned char u8[A * B * C];
  for (int i = 0; i < A * B * C; i++) u8[i] = (unsigned char)(i * 37 + 250);
  write_idx("u8.idx", 0, NF_IDX_U8, 3, (const uint32_t[]){A, B, C}, u8, sizeof u8);
  /* i32, rank 1: values whose bytes differ, negative ones, the extremes */
  const int32_t i32[] = {0x01020304, -2, INT32_MIN, INT32_MAX, 0x7f00ff80, -123456789, 0};
  enum { NI = sizeof i32 / sizeof i32[0] };
  unsigned char be32[NI * 4];
  for (int i = 0; i < NI; i++) put_be(be32 + 4 * i, (uint32_t)i32[i], 4);
  write_idx("i32.idx", 0, NF_IDX_I32, 1, (const uint32_t[]){NI}, be32, sizeof be32);
  /* f32, rank 2 */
  const float f32[2][3] = {{1.5f, -0.25f, 3.14159274f}, {1e-30f, -1e30f, 0x1.fffffep+127f}};
  unsigned char bef[6 * 4];
  for (int i = 0; i < 6; i++) {
    uint32_t u;
    memcpy(&u, &f32[i / 3][i % 3], 4);
    put_be(bef + 4 * i, u, 4);
  }
  write_idx("f32.idx", 0, NF_IDX_F32, 2, (const uint32_t[]){2, 3}, bef, sizeof bef);
  write_idx("f32.idx.gz", 1, NF_IDX_F32, 2, (const uint32_t[]){2, 3}, bef, sizeof bef);
  /* i8, i16, f64 (the other element sizes), and a u8 of rank 8 */
  const int8_t i8[] = {-128, -1, 0, 1, 127};
  write_idx("i8.idx", 0, NF_IDX_I8, 1, (const uint32_t[]){5}, i8, sizeof i8);
  const int16_t i16[] = {0x0102, -2, INT16_MIN, INT16_MAX};
  unsigned char be16[8];
  for (int i = 0; i < 4; i++) put_be(be16 + 2 * i, (uint16_t)i16[i], 2);
  write_idx("i16.idx", 0, NF_IDX_I16, 2, (const uint32_t[]){2, 2}, be16, sizeof be16);
  const double f64[] = {-2.5, 0x1.23456789abcdfp-900, 1e300};
  unsigned char be64[24];
  for (int i = 0; i < 3; i++) {
    uint64_t u;
    memcpy(&u, &f64[i], 8);
    put_be(be64 + 8 * i, u, 8);
  }
  write_idx("f64.idx.gz", 1, NF_IDX_F64, 1, (const uint32_t[]){3}, be64, sizeof be64);
  unsigned char r8[2 * 3 * 1 * 1 * 2 * 1 * 1 * 2];
  for (size_t i = 0; i < sizeof r8; i++) r8[i] = (unsigned char)i;
  write_idx("r8.idx", 0, NF_IDX_U8, 8, (const uint32_t[]){2, 3, 1, 1, 2, 1, 1, 2}, r8, sizeof r8);

  nf_idx x = load_ok("u8.idx");
  ck_assert_int_eq(x.type, NF_IDX_U8);
  ck_assert_int_eq(x.rank, 3);
  ck_assert(x.dims[0] == A && x.dims[1] == B && x.dims[2] == C);
  for (int i = 3; i < 8; i++) ck_assert_int_eq(x.dims[i], 0);
  ck_assert_uint_eq(x.bytes, sizeof u8);
  ck_assert(memcmp(x.data, u8, sizeof u8) == 0);
  nf_idx_free(&x);
  check_zeroed(&x, "nf_idx_free");
  nf_idx_free(&x); /* twice: harmless */
  nf_idx_free(NULL);

  x = load_ok("i32.idx");
  ck_assert_int_eq(x.type, NF_IDX_I32);
  ck_assert_int_eq(x.rank, 1);
  ck_assert_int_eq(x.dims[0], NI);
  ck_assert_uint_eq(x.bytes, sizeof i32);
  for (int i = 0; i < NI; i++)
    ck_assert_msg(((const int32_t *)x.data)[i] == i32[i], "i32[%d] = %d (0x%08x), want %d", i,
                  ((const int32_t *)x.data)[i], (unsigned)((const int32_t *)x.data)[i], i32[i]);
  nf_idx_free(&x);

  const char *fnames[] = {"f32.idx", "f32.idx.gz"};
  for (int k = 0; k < 2; k++) {
    x = load_ok(fnames[k]);
    ck_assert_int_eq(x.type, NF_IDX_F32);
    ck_assert_int_eq(x.rank, 2);
    ck_assert(x.dims[0] == 2 && x.dims[1] == 3 && x.dims[2] == 0);
    ck_assert_uint_eq(x.bytes, sizeof f32);
    const float *v = x.data;
    for (int i = 0; i < 6; i++)
      ck_assert_msg(memcmp(&v[i], &f32[i / 3][i % 3], 4) == 0, "%s: [%d] = %a, want %a", fnames[k],
                    i, (double)v[i], (double)f32[i / 3][i % 3]);
    nf_idx_free(&x);
  }
  /* the .gz really is compressed: its bytes differ from the plain file's */
  size_t n1, n2;
  unsigned char *p1 = read_raw("f32.idx", &n1), *p2 = read_raw("f32.idx.gz", &n2);
  ck_assert(n2 >= 18 && p2[0] == 0x1f && p2[1] == 0x8b);
  ck_assert(n1 != n2 || memcmp(p1, p2, n1));
  free(p1);
  free(p2);

  x = load_ok("i8.idx");
  ck_assert_int_eq(x.type, NF_IDX_I8);
  ck_assert_uint_eq(x.bytes, 5);
  ck_assert(memcmp(x.data, i8, 5) == 0);
  nf_idx_free(&x);

  x = load_ok("i16.idx");
  ck_assert_int_eq(x.type, NF_IDX_I16);
  ck_assert(x.rank == 2 && x.dims[0] == 2 && x.dims[1] == 2);
  ck_assert_uint_eq(x.bytes, 8);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(((const int16_t *)x.data)[i], i16[i]);
  nf_idx_free(&x);

  x = load_ok("f64.idx.gz");
  ck_assert_int_eq(x.type, NF_IDX_F64);
  ck_assert(x.rank == 1 && x.dims[0] == 3);
  ck_assert_uint_eq(x.bytes, 24);
  for (int i = 0; i < 3; i++)
    ck_assert_msg(((const double *)x.data)[i] == f64[i], "f64[%d] = %a", i,
                  ((const double *)x.data)[i]);
  nf_idx_free(&x);

  x = load_ok("r8.idx");
  ck_assert_int_eq(x.rank, 8);
  const int64_t rd[8] = {2, 3, 1, 1, 2, 1, 1, 2};
  for (int i = 0; i < 8; i++) ck_assert_int_eq(x.dims[i], rd[i]);
  ck_assert_uint_eq(x.bytes, sizeof r8);
  ck_assert(memcmp(x.data, r8, sizeof r8) == 0);
  nf_idx_free(&x);

  /* a zero dimension: no elements, not an error */
  write_idx("empty.idx", 0, NF_IDX_F32, 2, (const uint32_t[]){0, 5}, NULL, 0);
  x = load_ok("empty.idx");
  ck_assert(x.rank == 2 && x.dims[0] == 0 && x.dims[1] == 5 && x.bytes == 0);
  nf_idx_free(&x);
}
END_TEST

/* ---- 2. IDX errors ---- */

START_TEST(idx_errors) {
  /* missing */
  expect_idx_err("nothere.idx", NF_ENOENT, "No such file", NULL);
  /* empty */
  write_raw("empty.idx", "", 0);
  expect_idx_err("empty.idx", NF_EFORMAT, "truncated", NULL);
  /* a partial magic */
  write_raw("magic2.idx", "\0\0", 2);
  expect_idx_err("magic2.idx", NF_EFORMAT, "truncated", NULL);
  /* rank 3, but 6 bytes of the 12 of its dimensions */
  write_raw("hdr.idx", "\0\0\x08\x03\0\0\0\x02\0\0", 10);
  expect_idx_err("hdr.idx", NF_EFORMAT, "truncated", "header", NULL);
  /* bad magic: non-zero first bytes */
  write_raw("magic.idx", "\x01\0\x08\x01\0\0\0\x01\x07", 9);
  expect_idx_err("magic.idx", NF_EFORMAT, "not an IDX file", "01 00 08 01", NULL);
  write_raw("magic1.idx", "\0\x10\x08\x01\0\0\0\x01\x07", 9);
  expect_idx_err("magic1.idx", NF_EFORMAT, "not an IDX file", NULL);
  /* an unknown type code (0x0a lies between the known ones) */
  write_raw("type.idx", "\0\0\x0a\x01\0\0\0\x01\x07", 9);
  expect_idx_err("type.idx", NF_EFORMAT, "not an IDX file", "0a", NULL);
  write_raw("type2.idx", "\0\0\x07\x01\0\0\0\x01\x07", 9);
  expect_idx_err("type2.idx", NF_EFORMAT, "not an IDX file", "07", NULL);
  /* rank 0 and rank 9 */
  write_raw("rank0.idx", "\0\0\x08\x00\x07", 5);
  expect_idx_err("rank0.idx", NF_EFORMAT, "rank 0", NULL);
  unsigned char r9[4 + 36 + 1] = {0, 0, 8, 9};
  for (int i = 0; i < 9; i++) put_be(r9 + 4 + 4 * i, 1, 4);
  write_raw("rank9.idx", r9, sizeof r9);
  expect_idx_err("rank9.idx", NF_EFORMAT, "rank 9", NULL);
  /* data shorter than the header declares: 10 x 4 bytes declared, 7 x 4 */
  unsigned char data[64];
  for (int i = 0; i < 64; i++) data[i] = (unsigned char)(i + 1);
  write_idx("short.idx", 0, NF_IDX_I32, 1, (const uint32_t[]){10}, data, 28);
  expect_idx_err("short.idx", NF_EFORMAT, "truncated", "40", "28", NULL);
  /* ... a partial last element */
  write_idx("short1.idx", 0, NF_IDX_F32, 2, (const uint32_t[]){2, 2}, data, 15);
  expect_idx_err("short1.idx", NF_EFORMAT, "truncated", NULL);
  /* ... the same, compressed */
  write_idx("short.idx.gz", 1, NF_IDX_I32, 1, (const uint32_t[]){10}, data, 28);
  expect_idx_err("short.idx.gz", NF_EFORMAT, "truncated", NULL);
  /* trailing data: one byte more */
  write_idx("trail.idx", 0, NF_IDX_U8, 2, (const uint32_t[]){3, 4}, data, 13);
  expect_idx_err("trail.idx", NF_EFORMAT, "trailing", NULL);
  write_idx("trail.idx.gz", 1, NF_IDX_U8, 2, (const uint32_t[]){3, 4}, data, 20);
  expect_idx_err("trail.idx.gz", NF_EFORMAT, "trailing", NULL);

  /* a valid gzip header, then garbage (0xff: a final block of the
   * reserved type 3) */
  unsigned char gz[64] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
  memset(gz + 10, 0xff, sizeof gz - 10);
  write_raw("garbage.idx.gz", gz, sizeof gz);
  expect_idx_err("garbage.idx.gz", NF_EFORMAT, "corrupt", NULL);

  /* a .gz of a valid file of incompressible bytes, cut in the middle */
  enum { NBIG = 4096 };
  unsigned char *big = malloc(NBIG);
  ck_assert_ptr_nonnull(big);
  rng_seed(5);
  for (int i = 0; i < NBIG; i++) big[i] = (unsigned char)(rng_next() >> 56);
  write_idx("full.idx.gz", 1, NF_IDX_U8, 2, (const uint32_t[]){64, 64}, big, NBIG);
  nf_idx x = load_ok("full.idx.gz");
  ck_assert(x.bytes == NBIG && memcmp(x.data, big, NBIG) == 0);
  nf_idx_free(&x);
  size_t gzn;
  unsigned char *gzb = read_raw("full.idx.gz", &gzn);
  ck_assert_uint_gt(gzn, NBIG / 2 + 100);
  write_raw("cut.idx.gz", gzb, gzn / 2);
  expect_idx_err("cut.idx.gz", NF_EFORMAT, "truncated", NULL);
  /* ... with a damaged CRC in the gzip trailer */
  unsigned char *bad = malloc(gzn);
  ck_assert_ptr_nonnull(bad);
  memcpy(bad, gzb, gzn);
  bad[gzn - 8] ^= 0x55;
  write_raw("crc.idx.gz", bad, gzn);
  expect_idx_err("crc.idx.gz", NF_EFORMAT, "corrupt", NULL);
  /* ... with a damaged byte in the middle of the deflate stream */
  memcpy(bad, gzb, gzn);
  for (size_t i = 20; i < 60; i++) bad[i] ^= 0xa5;
  write_raw("mid.idx.gz", bad, gzn);
  expect_idx_err("mid.idx.gz", NF_EFORMAT, "corrupt", NULL);
  free(bad);
  free(gzb);
  /* a gzip stream whose first 64 KiB (the header and most elements) are
   * sound, flushed to a byte boundary, then a block of the reserved type:
   * an error while the elements are read (beyond zlib's buffer) */
  enum { NTXT = 1 << 17 };
  size_t tlen;
  unsigned char *txt = malloc(NTXT);
  ck_assert_ptr_nonnull(txt);
  for (int i = 0; i < NTXT; i++) txt[i] = (unsigned char)("neoflow idx "[i % 12] + (i >> 12));
  unsigned char *img = idx_image(NF_IDX_U8, 1, (const uint32_t[]){NTXT}, txt, NTXT, &tlen);
  free(txt);
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  ck_assert_int_eq(deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  size_t cap = deflateBound(&zs, tlen) + 64;
  gzb = malloc(cap);
  ck_assert_ptr_nonnull(gzb);
  zs.next_in = img;
  zs.avail_in = 1 << 16;
  zs.next_out = gzb;
  zs.avail_out = (uInt)cap;
  ck_assert_int_eq(deflate(&zs, Z_FULL_FLUSH), Z_OK);
  ck_assert_uint_eq(zs.avail_in, 0);
  gzn = cap - zs.avail_out;
  deflateEnd(&zs);
  free(img);
  memset(gzb + gzn, 0xff, 16);
  write_raw("flushed.idx.gz", gzb, gzn + 16);
  expect_idx_err("flushed.idx.gz", NF_EFORMAT, "corrupt compressed data after", "bytes of elements",
                 NULL);
  free(gzb);
  free(big);

  /* sizes beyond the 16 GiB cap: 65536 x 65536 x 5 bytes (20 GiB, each
   * dimension small), and 2^32 - 1 doubles (32 GiB); no elements follow.
   * The status is a format error, not out-of-memory: nothing is
   * allocated. */
  write_idx("huge.idx", 0, NF_IDX_U8, 3, (const uint32_t[]){65536, 65536, 5}, NULL, 0);
  expect_idx_err("huge.idx", NF_EFORMAT, "more than", NULL);
  write_idx("huge64.idx.gz", 1, NF_IDX_F64, 1, (const uint32_t[]){0xffffffffu}, NULL, 0);
  expect_idx_err("huge64.idx.gz", NF_EFORMAT, "more than", NULL);
  /* 16^7 x 17 i32: just over the cap (16^8 would be the cap itself) */
  write_idx("huge8.idx", 0, NF_IDX_I32, 8,
            (const uint32_t[]){16, 16, 16, 16, 16, 16, 16, 17}, NULL, 0);
  expect_idx_err("huge8.idx", NF_EFORMAT, "more than", NULL);
  /* nothing allocated: checked in a child whose address space is capped
   * at 1 GiB more than it maps, where allocating the declared 20 GiB
   * would fail (ENOMEM), so the format error proves the size was refused
   * first (not under ASan, which needs its address space) */
  if (!NF_TEST_ASAN) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      /* 1 GiB above what the process maps now */
      unsigned long long vsz = 0;
      FILE *sf = fopen("/proc/self/statm", "r");
      if (!sf || fscanf(sf, "%llu", &vsz) != 1) _exit(3);
      fclose(sf);
      vsz *= (unsigned long long)sysconf(_SC_PAGESIZE);
      struct rlimit rl = {vsz + (1ull << 30), vsz + (1ull << 30)};
      if (setrlimit(RLIMIT_AS, &rl)) _exit(3);
      /* the cap itself holds: 2 GiB fails */
      void *probe = malloc(2ull << 30);
      if (probe) _exit(4);
      nf_idx y;
      char *e = NULL;
      int rc = nf_idx_load(tp("huge.idx"), &y, &e);
      int ok = rc == NF_EFORMAT && e && strstr(e, "more than");
      free(e);
      _exit(ok ? 0 : 1);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "under a 1 GiB address space: status %d (1: wrong error, 3: setrlimit, 4: cap "
                  "not effective)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }

  /* bad arguments */
  ck_assert_int_eq(nf_idx_load(NULL, &x, NULL), NF_EINVAL);
  ck_assert_int_eq(nf_idx_load(tp("full.idx.gz"), NULL, NULL), NF_EINVAL);
}
END_TEST

/* A .gz cut in its 8-byte trailer (CRC-32 and length): every element
 * decompresses, but the stream ends early and its check cannot be made
 * (gzip -t: "unexpected end of file").  zlib's gzread reports that as a
 * short read with gzerror Z_BUF_ERROR (and gzclose returns Z_BUF_ERROR),
 * not as -1. */
START_TEST(idx_gz_cut_in_trailer) {
  enum { NBIG = 1000 };
  unsigned char big[NBIG];
  rng_seed(6);
  for (int i = 0; i < NBIG; i++) big[i] = (unsigned char)(rng_next() >> 56);
  write_idx("full.idx.gz", 1, NF_IDX_U8, 1, (const uint32_t[]){NBIG}, big, NBIG);
  size_t gzn;
  unsigned char *gzb = read_raw("full.idx.gz", &gzn);
  for (int cut = 1; cut <= 8; cut++) {
    char name[64];
    snprintf(name, sizeof name, "cut%d.idx.gz", cut);
    write_raw(name, gzb, gzn - (size_t)cut);
    expect_idx_err(name, NF_EFORMAT, "truncated", NULL);
  }
  free(gzb);
}
END_TEST

/* ---- 3. MNIST-style directories ---- */

static void write_mnist(const char *dir, const char *pre, int gz_images, int gz_labels, int n,
                        int rows, int cols, const unsigned char *px, const unsigned char *lab) {
  char name[256];
  snprintf(name, sizeof name, "%s/%s-images-idx3-ubyte%s", dir, pre, gz_images ? ".gz" : "");
  write_idx(name, gz_images, NF_IDX_U8, 3, (const uint32_t[]){(uint32_t)n, (uint32_t)rows,
                                                              (uint32_t)cols},
            px, (size_t)n * (size_t)(rows * cols));
  snprintf(name, sizeof name, "%s/%s-labels-idx1-ubyte%s", dir, pre, gz_labels ? ".gz" : "");
  write_idx(name, gz_labels, NF_IDX_U8, 1, (const uint32_t[]){(uint32_t)n}, lab, (size_t)n);
}

static void check_zero_ds(const nf_dataset *d, const char *what) {
  ck_assert_msg(d->n == 0 && d->rows == 0 && d->cols == 0 && d->classes == 0 && !d->images &&
                    !d->labels,
                "%s: dataset not zeroed", what);
}

/* nf_dataset_mnist_load fails with want and a message holding the
 * needles. */
static void expect_ds_err(const char *dir, const char *split, int want, ...) {
  nf_dataset d;
  memset(&d, 0xab, sizeof d);
  char *err = NULL;
  int rc = nf_dataset_mnist_load(dir, split, &d, &err);
  ck_assert_msg(rc == want, "%s %s: status %s (%s), wanted %s", dir, split ? split : "(null)",
                nf_status_name(rc), err ? err : "(no message)", nf_status_name(want));
  check_zero_ds(&d, dir);
  ck_assert_msg(err != NULL, "%s: no message", dir);
  va_list ap;
  va_start(ap, want);
  for (const char *n = va_arg(ap, const char *); n; n = va_arg(ap, const char *))
    ck_assert_msg(strstr(err, n) != NULL, "%s %s: message lacks '%s': %s", dir,
                  split ? split : "(null)", n, err);
  va_end(ap);
  free(err);
}

static float norm_px(unsigned char p) {
  return (float)((p / 255.0 - NF_FASHION_MNIST_MEAN) / NF_FASHION_MNIST_STD);
}

START_TEST(dataset_fake_dir) {
  enum { NTR = 5, NTE = 3, R = 2, C = 3 };
  unsigned char pxtr[NTR * R * C], pxte[NTE * R * C];
  for (int i = 0; i < NTR * R * C; i++) pxtr[i] = (unsigned char)(i * 53 % 256);
  pxtr[0] = 0;
  pxtr[1] = 255;
  for (int i = 0; i < NTE * R * C; i++) pxte[i] = (unsigned char)(255 - i * 11);
  const unsigned char labtr[NTR] = {3, 0, 7, 1, 3}, labte[NTE] = {9, 2, 0};
  mkdir_t("mn");
  /* train: images .gz, labels plain; test: images plain, labels .gz */
  write_mnist("mn", "train", 1, 0, NTR, R, C, pxtr, labtr);
  write_mnist("mn", "t10k", 0, 1, NTE, R, C, pxte, labte);
  const char *dir = tp("mn");
  nf_dataset d;
  memset(&d, 0xab, sizeof d);
  char *err = NULL;
  int rc = nf_dataset_mnist_load(dir, "train", &d, &err);
  ck_assert_msg(rc == NF_OK, "train: %s: %s", nf_strerror(rc), err ? err : "?");
  ck_assert_ptr_null(err);
  ck_assert_int_eq(d.n, NTR);
  ck_assert_int_eq(d.rows, R);
  ck_assert_int_eq(d.cols, C);
  ck_assert_int_eq(d.classes, 8); /* the largest label + 1 */
  for (int i = 0; i < NTR * R * C; i++)
    ck_assert_msg(fabsf(d.images[i] - norm_px(pxtr[i])) <= 1e-6f * (1 + fabsf(norm_px(pxtr[i]))),
                  "train pixel %d: %g, want %g", i, (double)d.images[i], (double)norm_px(pxtr[i]));
  /* the constants themselves: black and white pixels */
  ck_assert(fabs(d.images[0] - (0 - 0.2860) / 0.3530) < 1e-5);
  ck_assert(fabs(d.images[1] - (1 - 0.2860) / 0.3530) < 1e-5);
  for (int i = 0; i < NTR; i++) ck_assert_int_eq(d.labels[i], labtr[i]);
  nf_dataset_free(&d);
  check_zero_ds(&d, "nf_dataset_free");
  nf_dataset_free(&d);
  nf_dataset_free(NULL);

  const char *test_names[] = {"test", "t10k"};
  for (int k = 0; k < 2; k++) {
    rc = nf_dataset_mnist_load(dir, test_names[k], &d, &err);
    ck_assert_msg(rc == NF_OK, "%s: %s: %s", test_names[k], nf_strerror(rc), err ? err : "?");
    ck_assert(d.n == NTE && d.rows == R && d.cols == C && d.classes == 10);
    for (int i = 0; i < NTE * R * C; i++)
      ck_assert(fabsf(d.images[i] - norm_px(pxte[i])) <= 1e-6f * (1 + fabsf(norm_px(pxte[i]))));
    for (int i = 0; i < NTE; i++) ck_assert_int_eq(d.labels[i], labte[i]);
    nf_dataset_free(&d);
  }

  /* errors: 5 images, 4 labels */
  mkdir_t("count");
  write_mnist("count", "train", 0, 0, NTR, R, C, pxtr, labtr);
  write_idx("count/train-labels-idx1-ubyte", 0, NF_IDX_U8, 1, (const uint32_t[]){4}, labtr, 4);
  expect_ds_err(tp("count"), "train", NF_EFORMAT, "train-labels-idx1-ubyte", "4 labels",
                "5 images", NULL);
  /* labels of rank 2 */
  mkdir_t("rank");
  write_mnist("rank", "train", 0, 0, NTR, R, C, pxtr, labtr);
  write_idx("rank/train-labels-idx1-ubyte", 0, NF_IDX_U8, 2, (const uint32_t[]){NTR, 1}, labtr,
            NTR);
  expect_ds_err(tp("rank"), "train", NF_EFORMAT, "train-labels-idx1-ubyte", "labels",
                "2 dimensions", NULL);
  /* labels of type i32 */
  mkdir_t("type");
  write_mnist("type", "t10k", 1, 1, NTE, R, C, pxte, labte);
  unsigned char l32[NTE * 4];
  for (int i = 0; i < NTE; i++) put_be(l32 + 4 * i, labte[i], 4);
  write_idx("type/t10k-labels-idx1-ubyte.gz", 1, NF_IDX_I32, 1, (const uint32_t[]){NTE}, l32,
            sizeof l32);
  expect_ds_err(tp("type"), "test", NF_EFORMAT, "t10k-labels-idx1-ubyte.gz", "0x0c", NULL);
  /* images of rank 2 */
  mkdir_t("img");
  write_mnist("img", "train", 0, 0, NTR, R, C, pxtr, labtr);
  write_idx("img/train-images-idx3-ubyte", 0, NF_IDX_U8, 2, (const uint32_t[]){NTR, R * C}, pxtr,
            sizeof pxtr);
  expect_ds_err(tp("img"), "train", NF_EFORMAT, "train-images-idx3-ubyte", "images", NULL);
  /* an unknown split, none */
  expect_ds_err(dir, "validation", NF_EINVAL, "validation", NULL);
  expect_ds_err(dir, NULL, NF_EINVAL, "split", NULL);
  /* a missing directory; a directory without the test split */
  expect_ds_err(tp("nodir"), "train", NF_ENOENT, tp("nodir"), "train-images-idx3-ubyte", NULL);
  expect_ds_err(tp("count"), "test", NF_ENOENT, "t10k-images-idx3-ubyte", NULL);
  /* a damaged file: the loader's message passes through */
  mkdir_t("cut");
  write_mnist("cut", "train", 0, 0, NTR, R, C, pxtr, labtr);
  write_idx("cut/train-images-idx3-ubyte", 0, NF_IDX_U8, 3, (const uint32_t[]){NTR, R, C}, pxtr,
            sizeof pxtr - 3);
  expect_ds_err(tp("cut"), "train", NF_EFORMAT, "train-images-idx3-ubyte", "truncated", NULL);
  ck_assert_int_eq(nf_dataset_mnist_load(dir, "train", NULL, NULL), NF_EINVAL);
}
END_TEST

/* ---- 4. nf_session_eval ---- */

static const char eval_model[] =
    "import nn\n"
    "def f<batch = 4>(X: f32[batch, 3], y: i64[batch]) -> (L: f32[], logits: f32[batch, 2]) {\n"
    "  param W: f32[2, 3] = uniform(-1.0, 1.0)\n"
    "  param b: f32[2] = uniform(-0.5, 0.5)\n"
    "  logits = linear(X, W, b)\n"
    "  L = cross_entropy(logits, y)\n"
    "}\n";

static void read_t(nf_session *s, const char *name, void *data, size_t bytes) {
  int rc = nf_session_read(s, name, data, bytes);
  ck_assert_msg(rc == NF_OK, "read %s: %s: %s", name, nf_strerror(rc), nf_session_error(s));
}

static void feed(nf_session *s, const char *name, const void *data, size_t bytes) {
  int rc = nf_session_feed(s, name, data, bytes);
  ck_assert_msg(rc == NF_OK, "feed %s: %s: %s", name, nf_strerror(rc), nf_session_error(s));
}

static int64_t step_count(const nf_session *s) {
  nf_session_stats st;
  ck_assert_int_eq(nf_session_stats_get(s, &st), NF_OK);
  return st.step;
}

/* logits = X W^T + b and the mean cross-entropy, in double. */
static double eval_ref(const float *X, const int64_t *y, const float *W, const float *b,
                       double lg[4][2]) {
  double L = 0;
  for (int n = 0; n < 4; n++) {
    for (int o = 0; o < 2; o++) {
      lg[n][o] = b[o];
      for (int i = 0; i < 3; i++) lg[n][o] += (double)X[3 * n + i] * W[3 * o + i];
    }
    double mx = fmax(lg[n][0], lg[n][1]);
    L += mx + log(exp(lg[n][0] - mx) + exp(lg[n][1] - mx)) - lg[n][y[n]];
  }
  return L / 4;
}

START_TEST(session_eval) {
  char *err = NULL;
  nf_model *m = nf_model_load_source("eval.nf", eval_model, &err);
  ck_assert_msg(m != NULL, "eval.nf: %s", err ? err : "?");
  free(err);
  err = NULL;
  nf_session_opts o = {.daemon = "none", .quiet = 1, .seed = 5, .threads = 1,
                       .optim = {.kind = NF_OPTIM_SGD, .lr = 0.5}};
  nf_session *s = nf_session_new_def(m, "f", &o, &err);
  ck_assert_msg(s != NULL, "session: %s", err ? err : "?");

  /* the outputs: the loss, then logits */
  ck_assert_int_eq(nf_session_n_outputs(s), 2);
  const char *name = NULL;
  nf_elem t = (nf_elem)-1;
  int rank = -1;
  int64_t dims[8] = {0};
  ck_assert_int_eq(nf_session_output_info(s, 0, &name, &t, &rank, dims), NF_OK);
  ck_assert_msg(name && (!strcmp(name, "L") || !strcmp(name, "loss")), "output 0: %s",
                name ? name : "(null)");
  ck_assert_str_eq(name, "L");
  ck_assert_int_eq(t, NF_ELEM_F32);
  ck_assert_int_eq(rank, 0);
  ck_assert_int_eq(nf_session_output_info(s, 1, &name, &t, &rank, dims), NF_OK);
  ck_assert_str_eq(name, "logits");
  ck_assert_int_eq(t, NF_ELEM_F32);
  ck_assert_int_eq(rank, 2);
  ck_assert(dims[0] == 4 && dims[1] == 2);
  ck_assert_int_eq(nf_session_output_info(s, 1, NULL, NULL, NULL, NULL), NF_OK);
  ck_assert_int_eq(nf_session_output_info(s, 2, &name, &t, &rank, dims), NF_EINVAL);
  ck_assert_int_eq(nf_session_output_info(s, -1, &name, &t, &rank, dims), NF_EINVAL);
  ck_assert_int_eq(nf_session_output_info(NULL, 0, &name, &t, &rank, dims), NF_EINVAL);
  ck_assert_int_eq(nf_session_n_outputs(NULL), 0);
  ck_assert_int_eq(nf_session_eval(NULL, NULL), NF_EINVAL);

  float X[12], X2[12];
  int64_t y[4] = {0, 1, 1, 0}, y2[4] = {1, 1, 0, 0};
  rng_seed(17);
  for (int i = 0; i < 12; i++) {
    X[i] = (float)(2 * unif() - 1);
    X2[i] = (float)(2 * unif() - 1);
  }
  float W0[6], b0[2], W1[6], b1[2];
  read_t(s, "W", W0, sizeof W0);
  read_t(s, "b", b0, sizeof b0);
  feed(s, "X", X, sizeof X);
  feed(s, "y", y, sizeof y);

  /* eval before any step: the reference's loss and logits */
  double le = NAN, lr[4][2];
  float lg_e[8], lg_s[8], Lread;
  ck_assert_int_eq(nf_session_eval(s, &le), NF_OK);
  double Lref = eval_ref(X, y, W0, b0, lr);
  ck_assert_msg(fabs(le - Lref) < 1e-5 * fabs(Lref) + 1e-6, "eval loss %.9g, reference %.9g", le,
                Lref);
  read_t(s, "logits", lg_e, sizeof lg_e);
  for (int i = 0; i < 8; i++)
    ck_assert_msg(fabs(lg_e[i] - lr[i / 2][i % 2]) < 1e-5, "logits[%d] %g, reference %g", i,
                  (double)lg_e[i], lr[i / 2][i % 2]);
  read_t(s, "loss", &Lread, sizeof Lread);
  ck_assert(Lread == (float)le);
  read_t(s, "L", &Lread, sizeof Lread);
  ck_assert(Lread == (float)le);
  /* no update, no step */
  read_t(s, "W", W1, sizeof W1);
  read_t(s, "b", b1, sizeof b1);
  ck_assert(!memcmp(W0, W1, sizeof W0) && !memcmp(b0, b1, sizeof b0));
  ck_assert_int_eq(step_count(s), 0);
  /* again (NULL loss), and with the other batch: it reads the fed inputs */
  ck_assert_int_eq(nf_session_eval(s, NULL), NF_OK);
  feed(s, "X", X2, sizeof X2);
  feed(s, "y", y2, sizeof y2);
  double le2 = NAN, lr2[4][2];
  ck_assert_int_eq(nf_session_eval(s, &le2), NF_OK);
  double Lref2 = eval_ref(X2, y2, W0, b0, lr2);
  ck_assert_msg(fabs(le2 - Lref2) < 1e-5 * fabs(Lref2) + 1e-6, "eval loss %.9g, reference %.9g",
                le2, Lref2);
  float lg2[8];
  read_t(s, "logits", lg2, sizeof lg2);
  for (int i = 0; i < 8; i++) ck_assert(fabs(lg2[i] - lr2[i / 2][i % 2]) < 1e-5);
  feed(s, "X", X, sizeof X);
  feed(s, "y", y, sizeof y);
  ck_assert_int_eq(nf_session_eval(s, &le2), NF_OK);
  ck_assert(le2 == le);

  /* a step on the same batch: its pre-update loss and logits are eval's */
  double ls = NAN;
  ck_assert_int_eq(nf_session_step(s, &ls), NF_OK);
  ck_assert_msg(ls == le, "step loss %.9g, eval loss %.9g", ls, le);
  read_t(s, "logits", lg_s, sizeof lg_s);
  for (int i = 0; i < 8; i++)
    ck_assert_msg(lg_s[i] == lg_e[i], "logits[%d]: step %g, eval %g", i, (double)lg_s[i],
                  (double)lg_e[i]);
  ck_assert_int_eq(step_count(s), 1);
  read_t(s, "W", W1, sizeof W1);
  read_t(s, "b", b1, sizeof b1);
  ck_assert_msg(memcmp(W0, W1, sizeof W0), "the step did not move W");

  /* eval after the step: the new parameters, still no update */
  float W2[6], b2[2];
  double le3 = NAN, lr3[4][2];
  ck_assert_int_eq(nf_session_eval(s, &le3), NF_OK);
  double Lref3 = eval_ref(X, y, W1, b1, lr3);
  ck_assert_msg(fabs(le3 - Lref3) < 1e-5 * fabs(Lref3) + 1e-6, "eval loss %.9g, reference %.9g",
                le3, Lref3);
  /* SGD with lr 0.5 on a loss of this size moves it down */
  ck_assert_msg(le3 < le, "loss %g after the step, %g before", le3, le);
  read_t(s, "W", W2, sizeof W2);
  read_t(s, "b", b2, sizeof b2);
  ck_assert(!memcmp(W1, W2, sizeof W1) && !memcmp(b1, b2, sizeof b1));
  ck_assert_int_eq(step_count(s), 1);
  nf_session_stats st;
  ck_assert_int_eq(nf_session_stats_get(s, &st), NF_OK);
  ck_assert_msg(st.loss == ls, "stats.loss %g: the step's loss is %g", st.loss, ls);
  /* the next step starts from the same parameters as eval saw */
  double ls2 = NAN;
  ck_assert_int_eq(nf_session_step(s, &ls2), NF_OK);
  ck_assert_msg(ls2 == le3, "step loss %.9g, eval loss %.9g", ls2, le3);
  ck_assert_int_eq(step_count(s), 2);

  nf_session_free(s);
  nf_model_free(m);
}
END_TEST

/* ---- 5. the real Fashion-MNIST through the API ---- */

static int have_fashion(void) {
  struct stat sb;
  char p[512];
  snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", NF_FASHION_MNIST_DIR);
  if (stat(NF_FASHION_MNIST_DIR, &sb) || !S_ISDIR(sb.st_mode)) return 0;
  if (stat(p, &sb)) {
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte", NF_FASHION_MNIST_DIR);
    if (stat(p, &sb)) return 0;
  }
  return 1;
}

static void example_path(char *out, size_t n, const char *name) {
  const char *lib = getenv("NEOFLOW_LIB");
  ck_assert_msg(lib != NULL, "NEOFLOW_LIB is not set");
  snprintf(out, n, "%s/../examples/%s", lib, name);
}

START_TEST(fashion_mlp_learns) {
  if (!have_fashion()) {
    printf("fashion_mlp_learns: skipped: %s is missing (Debian's dataset-fashion-mnist)\n",
           NF_FASHION_MNIST_DIR);
    return;
  }
  double t0 = now_ms();
  nf_dataset tr, te;
  char *err = NULL;
  int rc = nf_dataset_mnist_load(NULL, "train", &tr, &err);
  ck_assert_msg(rc == NF_OK, "train: %s", err ? err : "?");
  rc = nf_dataset_mnist_load(NF_FASHION_MNIST_DIR, "test", &te, &err);
  ck_assert_msg(rc == NF_OK, "test: %s", err ? err : "?");
  ck_assert_int_eq(tr.n, 60000);
  ck_assert_int_eq(te.n, 10000);
  ck_assert(tr.rows == 28 && tr.cols == 28 && te.rows == 28 && te.cols == 28);
  ck_assert_int_eq(tr.classes, 10);
  ck_assert_int_eq(te.classes, 10);
  /* balanced classes; the normalisation makes the training pixels mean 0,
   * deviation 1 */
  int64_t htr[10] = {0}, hte[10] = {0};
  for (int64_t i = 0; i < tr.n; i++) htr[tr.labels[i]]++;
  for (int64_t i = 0; i < te.n; i++) hte[te.labels[i]]++;
  for (int c = 0; c < 10; c++) {
    ck_assert_int_eq(htr[c], 6000);
    ck_assert_int_eq(hte[c], 1000);
  }
  double sum = 0, sq = 0;
  int64_t np = tr.n * 28 * 28;
  for (int64_t i = 0; i < np; i++) {
    sum += tr.images[i];
    sq += (double)tr.images[i] * tr.images[i];
  }
  double mean = sum / (double)np, sd = sqrt(sq / (double)np - mean * mean);
  ck_assert_msg(fabs(mean) < 0.005 && fabs(sd - 1) < 0.005, "normalised pixels: mean %g, sd %g",
                mean, sd);
  double t_load = now_ms() - t0;

  enum { BATCH = 64, STEPS = 300, PIX = 784 };
  char path[4096];
  example_path(path, sizeof path, "fashion_mlp.nf");
  nf_model *m = nf_model_load(path, &err);
  ck_assert_msg(m != NULL, "%s: %s", path, err ? err : "?");
  const char *inames[] = {"batch"};
  const int64_t ivalues[] = {BATCH};
  nf_session_opts o = {.daemon = "none", .quiet = 1, .seed = 1, .threads = 2,
                       .optim = {.kind = NF_OPTIM_ADAM, .lr = 1e-3}, .n_iparams = 1,
                       .inames = inames, .ivalues = ivalues};
  nf_session *s = nf_session_new_def(m, "mlp", &o, &err);
  ck_assert_msg(s != NULL, "session: %s", err ? err : "?");
  ck_assert_int_eq(nf_session_n_outputs(s), 2);
  const char *oname = NULL;
  int orank = 0;
  int64_t odims[8];
  ck_assert_int_eq(nf_session_output_info(s, 1, &oname, NULL, &orank, odims), NF_OK);
  ck_assert(!strcmp(oname, "logits") && orank == 2 && odims[0] == BATCH && odims[1] == 10);

  static float X[BATCH * PIX], logits[BATCH * 10];
  int64_t y[BATCH];
  int64_t *perm = malloc(sizeof(int64_t) * (size_t)tr.n);
  ck_assert_ptr_nonnull(perm);
  for (int64_t i = 0; i < tr.n; i++) perm[i] = i;
  rng_seed(2024);
  for (int64_t i = tr.n - 1; i > 0; i--) { /* one shuffled pass covers 300 x 64 samples */
    int64_t j = (int64_t)(unif() * (double)(i + 1));
    int64_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  double first = 0, last = 0;
  for (int st = 0; st < STEPS; st++) {
    for (int b = 0; b < BATCH; b++) {
      int64_t k = perm[st * BATCH + b];
      memcpy(X + b * PIX, tr.images + k * PIX, sizeof(float) * PIX);
      y[b] = tr.labels[k];
    }
    feed(s, "X", X, sizeof X);
    feed(s, "labels", y, sizeof y);
    double l = NAN;
    rc = nf_session_step(s, &l);
    ck_assert_msg(rc == NF_OK && isfinite(l), "step %d: %s (loss %g)", st, nf_session_error(s), l);
    if (st == 0) first = l;
    last = st >= STEPS - 20 ? last + l / 20 : last;
  }
  ck_assert_int_eq(step_count(s), STEPS);
  double t_train = now_ms() - t0 - t_load;

  /* the whole test split through eval, the last batch padded */
  int64_t correct = 0;
  double lsum = 0;
  int full = 0;
  for (int64_t start = 0; start < te.n; start += BATCH) {
    int64_t valid = te.n - start < BATCH ? te.n - start : BATCH;
    for (int b = 0; b < BATCH; b++) {
      int64_t k = b < valid ? start + b : 0;
      memcpy(X + b * PIX, te.images + k * PIX, sizeof(float) * PIX);
      y[b] = te.labels[k];
    }
    feed(s, "X", X, sizeof X);
    feed(s, "labels", y, sizeof y);
    double l = NAN;
    rc = nf_session_eval(s, &l);
    ck_assert_msg(rc == NF_OK && isfinite(l), "eval at %lld: %s", (long long)start,
                  nf_session_error(s));
    if (valid == BATCH) {
      lsum += l;
      full++;
    }
    read_t(s, "logits", logits, sizeof logits);
    for (int b = 0; b < valid; b++) {
      int best = 0;
      for (int c = 1; c < 10; c++)
        if (logits[b * 10 + c] > logits[b * 10 + best]) best = c;
      correct += best == y[b];
    }
  }
  ck_assert_int_eq(step_count(s), STEPS);
  double acc = (double)correct / (double)te.n, tl = lsum / full;
  double t_eval = now_ms() - t0 - t_load - t_train;
  printf("fashion_mlp_learns: loss %.3f -> %.3f (last 20 steps) in %d steps; test accuracy %.4f, "
         "test loss %.3f; load %.1f s, train %.1f s, eval %.1f s\n",
         first, last, STEPS, acc, tl, t_load / 1000, t_train / 1000, t_eval / 1000);
  ck_assert_msg(first > 1.5 && first < 4, "first loss %g (about ln 10 expected)", first);
  ck_assert_msg(acc > 0.75, "test accuracy %.4f after %d steps (chance: 0.10)", acc, STEPS);
  ck_assert_msg(tl < 0.8, "test loss %g", tl);
  free(perm);
  nf_session_free(s);
  nf_model_free(m);
  nf_dataset_free(&tr);
  nf_dataset_free(&te);
}
END_TEST

/* ---- 6. neoflow train --data fashion-mnist ---- */

static const char *tool(void) {
  const char *t = getenv("NF_NEOFLOW");
  return t ? t : "client/neoflow";
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return strdup("");
  size_t cap = 1 << 16, len = 0, n;
  char *b = malloc(cap);
  ck_assert_ptr_nonnull(b);
  while ((n = fread(b + len, 1, cap - len - 1, f)) > 0) {
    len += n;
    if (len + 1 >= cap) {
      cap *= 2;
      b = realloc(b, cap);
      ck_assert_ptr_nonnull(b);
    }
  }
  b[len] = 0;
  fclose(f);
  return b;
}

/* Runs `neoflow ARGS`; its stdout and stderr (malloc'd); the exit status. */
static int run_tool(const char *args, char **out, char **errs) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s'", tool(), args, tp("stdout"), tp("stderr"));
  int st = system(cmd);
  *out = slurp(tp("stdout"));
  *errs = slurp(tp("stderr"));
  /* a sanitized build's reports (UBSan's do not change the status) */
  ck_assert_msg(!strstr(*errs, "runtime error:") && !strstr(*errs, "Sanitizer"),
                "neoflow %s:\n%s", args, *errs);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The value of the last "test_accuracy" in the JSON lines of out, and how
 * many lines hold one; -1 if none. */
static double last_test_accuracy(const char *out, int *lines, long *step) {
  double acc = -1;
  *lines = 0;
  const char *p = out;
  while ((p = strstr(p, "\"test_accuracy\":"))) {
    acc = strtod(p + strlen("\"test_accuracy\":"), NULL);
    const char *ls = p;
    while (ls > out && ls[-1] != '\n') ls--;
    const char *sp = strstr(ls, "\"step\":");
    if (sp && sp < p) *step = strtol(sp + 7, NULL, 10);
    (*lines)++;
    p++;
  }
  return acc;
}

START_TEST(cli_fashion_mnist) {
  char ex[4096], args[8192];
  example_path(ex, sizeof ex, "fashion_mlp.nf");
  char *out, *errs;
  int rc;
  if (have_fashion()) {
    double t0 = now_ms();
    snprintf(args, sizeof args,
             "train '%s' mlp --data fashion-mnist --steps 150 --daemon none --json --threads 2",
             ex);
    rc = run_tool(args, &out, &errs);
    int lines = 0;
    long step = -1;
    double acc = last_test_accuracy(out, &lines, &step);
    printf("cli_fashion_mnist: 150 steps: exit %d, test accuracy %.4f, %.1f s\n", rc, acc,
           (now_ms() - t0) / 1000);
    ck_assert_msg(rc == 0, "exit %d; stderr:\n%s\nstdout:\n%.2000s", rc, errs, out);
    ck_assert_msg(lines == 1 && step == 150, "%d test_accuracy lines, last at step %ld:\n%.3000s",
                  lines, step, out);
    ck_assert_msg(acc > 0.7, "test accuracy %g after 150 steps:\n%.3000s", acc, out);
    ck_assert(strstr(out, "\"step\":150,"));
    free(out);
    free(errs);
  } else {
    printf("cli_fashion_mnist: the real-data run skipped: %s is missing\n", NF_FASHION_MNIST_DIR);
  }

  /* a small fake dataset whose class is a bright band's row: three
   * epochs, an accuracy line after each, learned */
  enum { NTR = 200, NTE = 50, PIX = 784 };
  unsigned char *px = malloc((size_t)NTR * PIX), lab[NTR];
  ck_assert_ptr_nonnull(px);
  rng_seed(99);
  for (int split = 0; split < 2; split++) {
    int n = split ? NTE : NTR;
    for (int i = 0; i < n; i++) {
      int c = (i * 7 + split) % 10;
      lab[i] = (unsigned char)c;
      for (int p = 0; p < PIX; p++) {
        int row = p / 28;
        px[(size_t)i * PIX + p] =
            row >= 2 * c + 4 && row < 2 * c + 6 ? 255 : (unsigned char)(rng_next() >> 60);
      }
    }
    if (!split) mkdir_t("fake");
    write_mnist("fake", split ? "t10k" : "train", split, !split, n, 28, 28, px, lab);
  }
  free(px);
  snprintf(args, sizeof args,
           "train '%s' mlp --data fashion-mnist --data-dir '%s' --batch 20 --epochs 3 --lr 0.003 "
           "--daemon none --json --threads 2",
           ex, tp("fake"));
  rc = run_tool(args, &out, &errs);
  ck_assert_msg(rc == 0, "fake dir: exit %d; stderr:\n%s\nstdout:\n%.2000s", rc, errs, out);
  int lines = 0;
  long step = -1;
  double acc = last_test_accuracy(out, &lines, &step);
  ck_assert_msg(lines == 3 && step == 30, "fake dir: %d test_accuracy lines, last at step %ld:\n%s",
                lines, step, out);
  ck_assert_msg(acc >= 0.9, "fake dir: test accuracy %g:\n%s", acc, out);
  free(out);
  free(errs);

  /* the same directory, with the test images cut short */
  gzFile g = gzopen(tp("fake/t10k-images-idx3-ubyte.gz"), "rb");
  ck_assert_ptr_nonnull(g);
  unsigned char *plain = malloc(16 + (size_t)NTE * PIX + 1);
  ck_assert_ptr_nonnull(plain);
  ck_assert_int_eq(gzread(g, plain, 16 + NTE * PIX + 1), 16 + NTE * PIX);
  gzclose(g);
  ck_assert_int_eq(unlink(tp("fake/t10k-images-idx3-ubyte.gz")), 0);
  write_raw("fake/t10k-images-idx3-ubyte", plain, 16 + NTE * PIX - 100);
  free(plain);
  rc = run_tool(args, &out, &errs);
  /* exit 1: an error (not 0, nor a sanitizer's status) */
  ck_assert_msg(rc == 1, "truncated file: exit %d; stdout:\n%s\nstderr:\n%s", rc, out, errs);
  ck_assert_msg(strstr(errs, "t10k-images-idx3-ubyte") && strstr(errs, "truncated"),
                "truncated file: exit %d; stderr:\n%s", rc, errs);
  ck_assert_msg(!strstr(out, "test_accuracy"), "truncated file: trained anyway:\n%s", out);
  free(out);
  free(errs);

  /* images of another size than the def's input (2 x 3, not 784) */
  mkdir_t("small");
  unsigned char spx[6 * 20], slab[20];
  for (int i = 0; i < 120; i++) spx[i] = (unsigned char)i;
  for (int i = 0; i < 20; i++) slab[i] = (unsigned char)(i % 10);
  write_mnist("small", "train", 0, 0, 20, 2, 3, spx, slab);
  write_mnist("small", "t10k", 0, 0, 20, 2, 3, spx, slab);
  snprintf(args, sizeof args,
           "train '%s' mlp --data fashion-mnist --data-dir '%s' --batch 4 --steps 2 --daemon none "
           "--json",
           ex, tp("small"));
  rc = run_tool(args, &out, &errs);
  ck_assert_msg(rc == 1 && strstr(errs, "'X'") && strstr(errs, "6 values per sample"),
                "2 x 3 images: exit %d; stderr:\n%s", rc, errs);
  free(out);
  free(errs);

  /* a missing directory */
  snprintf(args, sizeof args,
           "train '%s' mlp --data fashion-mnist --data-dir '%s' --steps 5 --daemon none --json", ex,
           tp("nodir"));
  rc = run_tool(args, &out, &errs);
  ck_assert_msg(rc == 1 && strstr(errs, tp("nodir")) && strstr(errs, "No such file"),
                "missing dir: exit %d; stderr:\n%s", rc, errs);
  free(out);
  free(errs);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("data");
  /* files: IDX and MNIST-style directories written here (fast) */
  TCase *tc = tcase_create("files");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, idx_round_trip);
  tcase_add_test(tc, idx_errors);
  tcase_add_test(tc, idx_gz_cut_in_trailer);
  tcase_add_test(tc, dataset_fake_dir);
  suite_add_tcase(s, tc);
  tc = tcase_create("eval");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, session_eval);
  suite_add_tcase(s, tc);
  /* training on Fashion-MNIST (the real one where installed) */
  tc = tcase_create("fashion");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 280);
  tcase_add_test(tc, fashion_mlp_learns);
  tcase_add_test(tc, cli_fashion_mnist);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  setenv("NEOFLOW_VERIFIED", "none", 1);
  SRunner *r = srunner_create(suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
