/* test_npy.c - .npy reading, writing and refusal of malformed files.
 *
 * Fixtures in tests/data/npy were written by numpy 1.24 (np.save and
 * np.lib.format.write_array); the values below are the ones they were
 * made from.  Writing must reproduce numpy's bytes exactly; every
 * malformed header in the table must be refused with the expected status
 * and a message naming the file. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nf_npy.h"

static const char *data_dir(void) {
  const char *d = getenv("NF_TEST_DATA");
  return d ? d : "tests/data";
}

static void fixture(char *out, size_t n, const char *name) {
  snprintf(out, n, "%s/npy/%s", data_dir(), name);
}

static int read_fixture(const char *name, nf_array *a, nf_buf *err) {
  char path[1024];
  fixture(path, sizeof path, name);
  return nf_npy_read(path, a, err);
}

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc(sz > 0 ? (size_t)sz : 1);
  *n = fread(buf, 1, (size_t)sz, f);
  fclose(f);
  return buf;
}

static char tmpdir[256];

static void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/nf_test_npy.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void) {
  DIR *d = opendir(tmpdir);
  if (!d) return;
  struct dirent *de;
  char p[512];
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", tmpdir, de->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(tmpdir);
}

static int count_dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (de->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

START_TEST(npy_read_f4_2x3) {
  nf_array a;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(read_fixture("f4_2x3.npy", &a, &err), NF_OK);
  ck_assert_int_eq(a.dtype, NF_F32);
  ck_assert_int_eq(a.rank, 2);
  ck_assert_int_eq(a.shape[0], 2);
  ck_assert_int_eq(a.shape[1], 3);
  ck_assert_int_eq(a.numel, 6);
  const float want[6] = {1.5f, -2.25f, 3.0f, 0.1f, 1e30f, -0.0f};
  const float *v = a.data;
  for (int k = 0; k < 6; k++) ck_assert(v[k] == want[k]);
  ck_assert(signbit(v[5]));
  nf_array_free(&a);
  ck_assert_ptr_null(a.data);
  nf_buf_free(&err);
}
END_TEST

START_TEST(npy_read_f8_scalar) {
  nf_array a;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(read_fixture("f8_scalar.npy", &a, &err), NF_OK);
  ck_assert_int_eq(a.dtype, NF_F64);
  ck_assert_int_eq(a.rank, 0);
  ck_assert_int_eq(a.numel, 1);
  ck_assert(((double *)a.data)[0] == 3.141592653589793);
  nf_array_free(&a);
  nf_buf_free(&err);
}
END_TEST

START_TEST(npy_read_i8_bool_empty) {
  nf_array a;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(read_fixture("i8_1d.npy", &a, &err), NF_OK);
  ck_assert_int_eq(a.dtype, NF_I64);
  ck_assert_int_eq(a.rank, 1);
  ck_assert_int_eq(a.shape[0], 5);
  const int64_t wi[5] = {1, -2, 3, (int64_t)1 << 62, INT64_MIN};
  for (int k = 0; k < 5; k++) ck_assert(((int64_t *)a.data)[k] == wi[k]);
  nf_array_free(&a);

  ck_assert_int_eq(read_fixture("bool_2x2.npy", &a, &err), NF_OK);
  ck_assert_int_eq(a.dtype, NF_BOOL);
  const uint8_t wb[4] = {1, 0, 0, 1};
  for (int k = 0; k < 4; k++) ck_assert_int_eq(((uint8_t *)a.data)[k], wb[k]);
  nf_array_free(&a);

  ck_assert_int_eq(read_fixture("f8_empty.npy", &a, &err), NF_OK);
  ck_assert_int_eq(a.dtype, NF_F64);
  ck_assert_int_eq(a.rank, 2);
  ck_assert_int_eq(a.shape[0], 0);
  ck_assert_int_eq(a.shape[1], 3);
  ck_assert_int_eq(a.numel, 0);
  nf_array_free(&a);
  ck_assert_str_eq(nf_buf_str(&err), "");
  nf_buf_free(&err);
}
END_TEST

START_TEST(npy_read_big_endian) {
  nf_array a;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(read_fixture("f4_be.npy", &a, &err), NF_OK);
  ck_assert_int_eq(a.dtype, NF_F32);
  const float wf[4] = {1.0f, -2.5f, 1e-3f, 65504.0f};
  for (int k = 0; k < 4; k++) ck_assert(((float *)a.data)[k] == wf[k]);
  nf_array_free(&a);

  ck_assert_int_eq(read_fixture("i4_be_2x2.npy", &a, &err), NF_OK);
  ck_assert_int_eq(a.dtype, NF_I32);
  const int32_t wi[4] = {1, -1, INT32_MAX, INT32_MIN};
  for (int k = 0; k < 4; k++) ck_assert_int_eq(((int32_t *)a.data)[k], wi[k]);
  nf_array_free(&a);
  nf_buf_free(&err);
}
END_TEST

START_TEST(npy_read_narrow_ints_widen) {
  static const struct {
    const char *file;
    int n;
    int64_t v[3];
  } cases[] = {
      {"u1_3.npy", 3, {0, 200, 255}},
      {"i1_3.npy", 3, {-128, 0, 127}},
      {"i2_3.npy", 3, {-32768, 7, 32767}},
      {"u2_be.npy", 2, {65535, 1}},
      {"u4_2.npy", 2, {4294967295LL, 5}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    nf_array a;
    nf_buf err = NF_BUF_INIT;
    ck_assert_msg(read_fixture(cases[c].file, &a, &err) == NF_OK, "%s: %s",
                  cases[c].file, nf_buf_str(&err));
    ck_assert_int_eq(a.dtype, NF_I64);
    ck_assert_int_eq(a.numel, cases[c].n);
    for (int k = 0; k < cases[c].n; k++)
      ck_assert(((int64_t *)a.data)[k] == cases[c].v[k]);
    nf_array_free(&a);
    nf_buf_free(&err);
  }
}
END_TEST

START_TEST(npy_read_versions_2_and_3) {
  nf_array a;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(read_fixture("i4_v2.npy", &a, &err), NF_OK);
  ck_assert_int_eq(a.dtype, NF_I32);
  for (int k = 0; k < 4; k++) ck_assert_int_eq(((int32_t *)a.data)[k], k + 1);
  nf_array_free(&a);
  ck_assert_int_eq(read_fixture("f8_v3.npy", &a, &err), NF_OK);
  ck_assert(((double *)a.data)[0] == 7.0 && ((double *)a.data)[1] == 8.0);
  nf_array_free(&a);
  nf_buf_free(&err);
}
END_TEST

START_TEST(npy_refuses_bad_files) {
  static const struct {
    const char *file;
    int rc;
    const char *why;
  } cases[] = {
      {"fortran.npy", NF_EUNSUPPORTED, ": Fortran-order arrays are not supported"},
      {"u8.npy", NF_EUNSUPPORTED,
       ": dtype '<u8' not supported (u8 values may not fit in i64)"},
      {"object.npy", NF_EUNSUPPORTED, ": object arrays are not supported"},
      {"truncated.npy", NF_EFORMAT,
       ": truncated: header promises 60 bytes of data, file has 12"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char path[1024], want[1200];
    nf_array a;
    nf_buf err = NF_BUF_INIT;
    fixture(path, sizeof path, cases[c].file);
    ck_assert_int_eq(nf_npy_read(path, &a, &err), cases[c].rc);
    ck_assert_ptr_null(a.data);
    snprintf(want, sizeof want, "%s%s", path, cases[c].why);
    ck_assert_str_eq(nf_buf_str(&err), want);
    nf_buf_free(&err);
  }
}
END_TEST

START_TEST(npy_read_missing_file) {
  nf_array a;
  nf_buf err = NF_BUF_INIT;
  ck_assert_int_eq(nf_npy_read("/nonexistent/x.npy", &a, &err), NF_EIO);
  ck_assert_str_eq(nf_buf_str(&err),
                   "/nonexistent/x.npy: cannot open: No such file or directory");
  nf_buf_free(&err);
}
END_TEST

/* Writing what numpy wrote gives numpy's bytes back. */
START_TEST(npy_write_matches_numpy) {
  static const char *const files[] = {"f4_2x3.npy", "f8_scalar.npy",
                                      "i8_1d.npy", "bool_2x2.npy",
                                      "f8_empty.npy"};
  make_tmpdir();
  for (size_t c = 0; c < sizeof files / sizeof files[0]; c++) {
    char src[1024], dst[512];
    nf_array a;
    nf_buf err = NF_BUF_INIT;
    fixture(src, sizeof src, files[c]);
    snprintf(dst, sizeof dst, "%s/%s", tmpdir, files[c]);
    ck_assert_int_eq(nf_npy_read(src, &a, &err), NF_OK);
    ck_assert_msg(nf_npy_write(dst, &a, &err) == NF_OK, "%s", nf_buf_str(&err));
    size_t n1, n2;
    char *b1 = slurp(src, &n1), *b2 = slurp(dst, &n2);
    ck_assert_uint_eq(n1, n2);
    ck_assert_msg(memcmp(b1, b2, n1) == 0, "%s differs from numpy's", files[c]);
    ck_assert_uint_eq((n2 - a.numel * (a.dtype == NF_BOOL ? 1 : a.dtype == NF_F32 ? 4 : 8)) % 64, 0);
    free(b1);
    free(b2);
    nf_array_free(&a);
    nf_buf_free(&err);
  }
  ck_assert_int_eq(count_dir_entries(tmpdir), 5); /* no temporaries left */
  remove_tmpdir();
}
END_TEST

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

START_TEST(npy_round_trip_dtypes_and_ranks) {
  static const nf_dtype dts[] = {NF_BOOL, NF_I32, NF_I64, NF_F32, NF_F64};
  make_tmpdir();
  for (size_t t = 0; t < 5; t++) {
    for (int rank = 0; rank <= 4; rank++) {
      int64_t shape[NF_MAX_RANK];
      for (int d = 0; d < rank; d++) shape[d] = 1 + (int64_t)(rng() % 4) + d;
      nf_array a, b;
      nf_buf err = NF_BUF_INIT;
      char path[512];
      ck_assert_int_eq(nf_array_alloc(&a, dts[t], rank, shape), NF_OK);
      for (int64_t e = 0; e < a.numel; e++) {
        uint64_t r = rng();
        switch (dts[t]) {
        case NF_BOOL: ((uint8_t *)a.data)[e] = r & 1; break;
        case NF_I32: ((int32_t *)a.data)[e] = (int32_t)r; break;
        case NF_I64: ((int64_t *)a.data)[e] = (int64_t)r; break;
        case NF_F32: ((float *)a.data)[e] = (float)((int64_t)r) * 1e-9f; break;
        default: ((double *)a.data)[e] = (double)((int64_t)r) * 1e-11; break;
        }
      }
      snprintf(path, sizeof path, "%s/rt.npy", tmpdir);
      ck_assert_msg(nf_npy_write(path, &a, &err) == NF_OK, "%s", nf_buf_str(&err));
      ck_assert_msg(nf_npy_read(path, &b, &err) == NF_OK, "%s", nf_buf_str(&err));
      ck_assert_int_eq(b.dtype, a.dtype);
      ck_assert_int_eq(b.rank, rank);
      for (int d = 0; d < rank; d++) ck_assert_int_eq(b.shape[d], shape[d]);
      ck_assert_int_eq(b.numel, a.numel);
      size_t es = dts[t] == NF_BOOL ? 1 : (dts[t] == NF_I32 || dts[t] == NF_F32) ? 4 : 8;
      ck_assert(memcmp(a.data, b.data, (size_t)a.numel * es) == 0);
      nf_array_free(&a);
      nf_array_free(&b);
      nf_buf_free(&err);
    }
  }
  remove_tmpdir();
}
END_TEST

START_TEST(npy_write_errors) {
  nf_array a;
  nf_buf err = NF_BUF_INIT;
  int64_t shape[1] = {3};
  ck_assert_int_eq(nf_array_alloc(&a, NF_F32, 1, shape), NF_OK);
  ck_assert_int_eq(nf_npy_write("/nonexistent/dir/x.npy", &a, &err), NF_EIO);
  ck_assert_str_eq(nf_buf_str(&err),
                   "/nonexistent/dir/x.npy: cannot create a temporary file: "
                   "No such file or directory");
  nf_array_free(&a);
  nf_buf_free(&err);
}
END_TEST

START_TEST(npy_array_alloc_checks) {
  nf_array a;
  int64_t big[2] = {INT64_MAX / 2, 3};
  int64_t neg[1] = {-1};
  ck_assert_int_eq(nf_array_alloc(&a, NF_F32, 2, big), NF_EOVERFLOW);
  ck_assert_int_eq(nf_array_alloc(&a, NF_F32, 1, neg), NF_EINVAL);
  ck_assert_int_eq(nf_array_alloc(&a, NF_F16, 0, NULL), NF_EINVAL);
  ck_assert_int_eq(nf_array_alloc(&a, NF_I64, 9, big), NF_EINVAL);
  ck_assert_int_eq(nf_array_alloc(&a, NF_I64, 0, NULL), NF_OK);
  ck_assert_int_eq(a.numel, 1);
  ck_assert(((int64_t *)a.data)[0] == 0);
  nf_array_free(&a);
}
END_TEST

/* Builds a version-1.0 image: magic, header text (padded to 64 with a
 * final newline when pad is set), then n_data bytes 0x11, 0x22, ... */
static size_t build(unsigned char *out, const char *hdr, int pad,
                    size_t n_data) {
  size_t hl = strlen(hdr);
  size_t total = hl;
  if (pad) total = ((10 + hl + 1 + 63) / 64) * 64 - 10;
  memcpy(out, "\x93NUMPY\x01\x00", 8);
  out[8] = (unsigned char)(total & 0xff);
  out[9] = (unsigned char)(total >> 8);
  memcpy(out + 10, hdr, hl);
  for (size_t k = hl; k < total; k++) out[10 + k] = ' ';
  if (pad) out[10 + total - 1] = '\n';
  for (size_t k = 0; k < n_data; k++) out[10 + total + k] = (unsigned char)(0x11 * (k % 15 + 1));
  return 10 + total + n_data;
}

START_TEST(npy_parse_header_variants) {
  static const struct {
    const char *hdr;
    size_t n_data;
    nf_dtype dt;
    int rank;
    int64_t d0, d1;
  } ok[] = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 48, NF_F32, 2, 3, 4},
      {"{'shape': (3, 4), 'fortran_order': False, 'descr': '<f4'}", 48, NF_F32, 2, 3, 4},
      {"{ 'fortran_order' :False,'shape':(5,),'descr':'<i8' , }", 40, NF_I64, 1, 5, 0},
      {"{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": ()}", 8, NF_F64, 0, 0, 0},
      {"{'descr': '=i4', 'fortran_order': False, 'shape': (2L, 1L,), }", 8, NF_I32, 2, 2, 1},
      {"{'descr': '|b1', 'fortran_order': False, 'shape': (0,), }", 0, NF_BOOL, 1, 0, 0},
      {"{'descr': '>u2', 'fortran_order': False, 'shape': (\n3,\t), }", 6, NF_I64, 1, 3, 0},
  };
  for (size_t c = 0; c < sizeof ok / sizeof ok[0]; c++) {
    unsigned char img[512];
    size_t n = build(img, ok[c].hdr, 1, ok[c].n_data);
    nf_array a;
    nf_buf err = NF_BUF_INIT;
    ck_assert_msg(nf_npy_parse(img, n, "mem.npy", &a, &err) == NF_OK,
                  "case %zu: %s", c, nf_buf_str(&err));
    ck_assert_int_eq(a.dtype, ok[c].dt);
    ck_assert_int_eq(a.rank, ok[c].rank);
    if (ok[c].rank > 0) ck_assert_int_eq(a.shape[0], ok[c].d0);
    if (ok[c].rank > 1) ck_assert_int_eq(a.shape[1], ok[c].d1);
    nf_array_free(&a);
    nf_buf_free(&err);
  }
  /* Big-endian u2 0x1122 is 4386; little-endian i8 bytes 11..88. */
  unsigned char img[512];
  size_t n = build(img, "{'descr': '>u2', 'fortran_order': False, 'shape': (1,), }", 1, 2);
  nf_array a;
  ck_assert_int_eq(nf_npy_parse(img, n, "m", &a, NULL), NF_OK);
  ck_assert(((int64_t *)a.data)[0] == 0x1122);
  nf_array_free(&a);
  n = build(img, "{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }", 1, 2);
  ck_assert_int_eq(nf_npy_parse(img, n, "m", &a, NULL), NF_OK);
  ck_assert(((int64_t *)a.data)[0] == 0x2211);
  nf_array_free(&a);
}
END_TEST

START_TEST(npy_parse_corrupt_headers) {
  static const struct {
    const char *hdr;
    size_t n_data;
    int rc;
    const char *msg; /* after "bad.npy: " */
  } bad[] = {
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }", 12,
       NF_EUNSUPPORTED, "Fortran-order arrays are not supported"},
      {"{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", 24,
       NF_EUNSUPPORTED, "object arrays are not supported"},
      {"{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", 24,
       NF_EUNSUPPORTED, "dtype '<c8' not supported"},
      {"{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", 6,
       NF_EUNSUPPORTED, "dtype '<f2' not supported"},
      {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }", 12,
       NF_EUNSUPPORTED, "structured dtypes are not supported"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4,
       NF_EUNSUPPORTED, "rank above the maximum 8 is not supported"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, -1), }", 0,
       NF_EFORMAT, "negative dimension in shape"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (5), }", 20,
       NF_EFORMAT, "shape is not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [5], }", 20,
       NF_EFORMAT, "shape is not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 8,
       NF_EFORMAT, "shape has too many elements"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 8,
       NF_EFORMAT, "dimension too large in shape"},
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }", 8,
       NF_EFORMAT, "truncated: header promises 8000000000000 bytes of data, file has 8"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 13,
       NF_EFORMAT, "trailing bytes: header promises 12 bytes of data, file has 13"},
      {"{'descr': '<f4', 'fortran_order': False, }", 4, NF_EFORMAT,
       "header lacks 'shape'"},
      {"{'descr': '<f4', 'shape': (1,), }", 4, NF_EFORMAT,
       "header lacks 'fortran_order'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4,
       NF_EFORMAT, "duplicate key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", 4,
       NF_EFORMAT, "unexpected key 'x' in header"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }", 4, NF_EFORMAT,
       "'fortran_order' is not True or False"},
      {"{'descr': <f4, 'fortran_order': False, 'shape': (1,), }", 4, NF_EFORMAT,
       "'descr' is not a string"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (1,), }", 4,
       NF_EUNSUPPORTED, "dtype '<f4, ' not supported"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (1,), }", 4, NF_EFORMAT,
       "malformed header dict"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } x", 4, NF_EFORMAT,
       "unexpected text after the header dict"},
      {"['descr', '<f4']", 4, NF_EFORMAT, "header is not a dict"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", 4, NF_EFORMAT,
       "malformed header dict"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1 2), }", 4, NF_EFORMAT,
       "malformed shape"},
      {"{'descr': '<u8', 'fortran_order': False, 'shape': (1,), }", 8, NF_EUNSUPPORTED,
       "dtype '<u8' not supported (u8 values may not fit in i64)"},
      {"{'descr': '', 'fortran_order': False, 'shape': (1,), }", 8, NF_EFORMAT,
       "empty dtype descr"},
  };
  for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
    unsigned char img[512];
    size_t n = build(img, bad[c].hdr, 1, bad[c].n_data);
    nf_array a;
    nf_buf err = NF_BUF_INIT;
    char want[256];
    int rc = nf_npy_parse(img, n, "bad.npy", &a, &err);
    ck_assert_msg(rc == bad[c].rc, "case %zu: rc %d, %s", c, rc, nf_buf_str(&err));
    ck_assert_ptr_null(a.data);
    snprintf(want, sizeof want, "bad.npy: %s", bad[c].msg);
    ck_assert_str_eq(nf_buf_str(&err), want);
    nf_buf_free(&err);
  }
}
END_TEST

START_TEST(npy_parse_corrupt_prefix) {
  unsigned char img[512];
  nf_array a;
  nf_buf err = NF_BUF_INIT;
  size_t n = build(img, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 1, 4);

  ck_assert_int_eq(nf_npy_parse(img, 5, "p", &a, &err), NF_EFORMAT);
  ck_assert_str_eq(nf_buf_str(&err), "p: not a .npy file (bad magic)");
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_npy_parse(img, 9, "p", &a, &err), NF_EFORMAT);
  ck_assert_str_eq(nf_buf_str(&err), "p: truncated: no header length");
  nf_buf_reset(&err);
  ck_assert_int_eq(nf_npy_parse(img, 40, "p", &a, &err), NF_EFORMAT);
  ck_assert_str_eq(nf_buf_str(&err),
                   "p: truncated: header promises 118 bytes of header, file has 30");
  nf_buf_reset(&err);

  img[6] = 4;
  ck_assert_int_eq(nf_npy_parse(img, n, "p", &a, &err), NF_EUNSUPPORTED);
  ck_assert_str_eq(nf_buf_str(&err), "p: unsupported .npy format version 4.0");
  nf_buf_reset(&err);
  img[6] = 1;
  img[1] = 'X';
  ck_assert_int_eq(nf_npy_parse(img, n, "p", &a, &err), NF_EFORMAT);
  ck_assert_str_eq(nf_buf_str(&err), "p: not a .npy file (bad magic)");
  nf_buf_free(&err);
}
END_TEST

/* Every prefix of a valid file is refused, never read past its end. */
START_TEST(npy_parse_every_prefix_refused) {
  unsigned char img[512];
  size_t n = build(img, "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2), }", 1, 32);
  for (size_t k = 0; k < n; k++) {
    unsigned char *copy = malloc(k ? k : 1);
    memcpy(copy, img, k);
    nf_array a;
    nf_buf err = NF_BUF_INIT;
    ck_assert_int_lt(nf_npy_parse(copy, k, "p", &a, &err), 0);
    ck_assert_ptr_null(a.data);
    ck_assert(err.len > 0);
    nf_buf_free(&err);
    free(copy);
  }
}
END_TEST

static Suite *npy_suite(void) {
  Suite *s = suite_create("npy");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, npy_read_f4_2x3);
  tcase_add_test(tc, npy_read_f8_scalar);
  tcase_add_test(tc, npy_read_i8_bool_empty);
  tcase_add_test(tc, npy_read_big_endian);
  tcase_add_test(tc, npy_read_narrow_ints_widen);
  tcase_add_test(tc, npy_read_versions_2_and_3);
  tcase_add_test(tc, npy_refuses_bad_files);
  tcase_add_test(tc, npy_read_missing_file);
  tcase_add_test(tc, npy_write_matches_numpy);
  tcase_add_test(tc, npy_round_trip_dtypes_and_ranks);
  tcase_add_test(tc, npy_write_errors);
  tcase_add_test(tc, npy_array_alloc_checks);
  tcase_add_test(tc, npy_parse_header_variants);
  tcase_add_test(tc, npy_parse_corrupt_headers);
  tcase_add_test(tc, npy_parse_corrupt_prefix);
  tcase_add_test(tc, npy_parse_every_prefix_refused);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(npy_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
