/* test_exec.c - the runtime half of compiled kernels: the thread pool
 * (partitions cover [0, n) exactly once, for 1..4 threads and n = 0, 1,
 * odd, large, over many back-to-back calls) and the loader (garbage,
 * truncated, wrong-class, wrong-machine and wrong-type ELF bytes rejected
 * with messages; a real kernel loads through memfd and through the
 * O_TMPFILE fallback; no descriptor leaks).  Run under valgrind with
 * `meson test --setup valgrind exec`. */
#include <check.h>
#include <dirent.h>
#include <elf.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "nf_config.h"
#include "nf_runtime.h"
#if NF_HAVE_LLVM
#include "nf_codegen.h"
#endif

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* ---- pool ---- */

typedef struct cover {
  atomic_int *hits;
  atomic_int calls;
} cover;

static void mark(void *ctx, int64_t b, int64_t e) {
  cover *c = ctx;
  ck_assert_int_lt(b, e);
  for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
  atomic_fetch_add(&c->calls, 1);
}

START_TEST(exec_pool_partition) {
  static const int64_t ns[] = {0, 1, 2, 3, 7, 64, 1001, 100003};
  for (int t = 1; t <= 4; t++) {
    nf_pool *p = nf_pool_new(t);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(nf_pool_threads(p), t);
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
      int64_t n = ns[k];
      cover c;
      c.hits = calloc((size_t)n + 1, sizeof *c.hits);
      atomic_init(&c.calls, 0);
      for (int rep = 0; rep < 3; rep++) nf_pool_parallel_for(p, n, mark, &c);
      for (int64_t i = 0; i < n; i++)
        ck_assert_msg(atomic_load(&c.hits[i]) == 3, "threads %d n %lld: index %lld hit %d times",
                      t, (long long)n, (long long)i, atomic_load(&c.hits[i]));
      ck_assert_int_le(atomic_load(&c.calls), 3 * t);
      if (n == 0) ck_assert_int_eq(atomic_load(&c.calls), 0);
      free(c.hits);
    }
    nf_pool_free(p);
  }
}
END_TEST

static void add_range(void *ctx, int64_t b, int64_t e) {
  atomic_long *s = ctx;
  atomic_fetch_add(s, (long)(e - b));
}

START_TEST(exec_pool_many_calls) {
  nf_pool *p = nf_pool_new(3);
  atomic_long s;
  atomic_init(&s, 0);
  for (int i = 0; i < 20000; i++) nf_pool_parallel_for(p, 1 + i % 17, add_range, &s);
  long want = 0;
  for (int i = 0; i < 20000; i++) want += 1 + i % 17;
  ck_assert_int_eq(atomic_load(&s), want);
  nf_pool_free(p);
  /* the serial path of the ABI: a NULL runtime */
  atomic_init(&s, 0);
  nf_pool_parallel_for(NULL, 10, add_range, &s);
  ck_assert_int_eq(atomic_load(&s), 10);
}
END_TEST

/* ---- loader ---- */

static void expect_reject(const void *b, size_t n, const char *needle) {
  nf_kernel *k = (nf_kernel *)1;
  nf_buf err = NF_BUF_INIT;
  int rc = nf_kernel_load(b, n, &k, &err);
  ck_assert_int_eq(rc, NF_EFORMAT);
  ck_assert_ptr_null(k);
  ck_assert_msg(strstr(nf_buf_str(&err), needle) != NULL, "message '%s' lacks '%s'",
                nf_buf_str(&err), needle);
  nf_buf_free(&err);
}

static void fake_header(Elf64_Ehdr *h) {
  memset(h, 0, sizeof *h);
  memcpy(h->e_ident, ELFMAG, SELFMAG);
  h->e_ident[EI_CLASS] = ELFCLASS64;
  h->e_ident[EI_DATA] = ELFDATA2LSB;
  h->e_ident[EI_VERSION] = EV_CURRENT;
  h->e_type = ET_DYN;
  h->e_machine = EM_X86_64;
  h->e_version = EV_CURRENT;
  h->e_ehsize = sizeof *h;
  h->e_phentsize = sizeof(Elf64_Phdr);
  h->e_phoff = sizeof *h;
  h->e_phnum = 4;
}

START_TEST(exec_loader_rejects) {
  int fds = count_fds();
  uint8_t junk[256];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
  expect_reject(junk, sizeof junk, "bad magic");
  expect_reject(junk, 10, "too short");
  expect_reject(NULL, 0, "too short");
  Elf64_Ehdr h;
  fake_header(&h);
  h.e_ident[EI_CLASS] = ELFCLASS32;
  expect_reject(&h, sizeof h, "64-bit");
  fake_header(&h);
  h.e_machine = EM_AARCH64;
  expect_reject(&h, sizeof h, "machine");
  fake_header(&h);
  h.e_type = ET_REL;
  expect_reject(&h, sizeof h, "shared object");
  fake_header(&h);
  expect_reject(&h, sizeof h, "truncated");
  ck_assert_int_eq(count_fds(), fds);
}
END_TEST

#if NF_HAVE_LLVM
/* Y[i] = 2 X[i] over 11 elements, compiled by the backend. */
static int make_kernel(nf_blob *so) {
  nf_ir_ctx *c = nf_ir_ctx_new();
  nf_lbuf bufs[2];
  memset(bufs, 0, sizeof bufs);
  bufs[0] = (nf_lbuf){"X", NF_F32, NF_BUF_INPUT, 1, {11}, 0};
  bufs[1] = (nf_lbuf){"Y", NF_F32, NF_BUF_OUTPUT, 1, {11}, 1};
  const nf_expr *v = nf_e_var(c, 0);
  nf_lstmt st, loop, root;
  nf_lstmt *pl = &loop, *ps = &st;
  memset(&st, 0, sizeof st);
  memset(&loop, 0, sizeof loop);
  memset(&root, 0, sizeof root);
  st.kind = NF_LS_STORE;
  st.buf = 1;
  st.n_idx = 1;
  st.idx[0] = v;
  st.value = nf_e_binary(c, NF_OP_MUL, nf_e_access(c, 0, NF_F32, 1, &v), nf_e_const_f(c, NF_F32, 2.0));
  loop.kind = NF_LS_LOOP;
  loop.var = 0;
  loop.extent = 11;
  loop.loop_kind = NF_LOOP_PARALLEL;
  loop.n_body = 1;
  loop.body = &ps;
  root.kind = NF_LS_SEQ;
  root.n_body = 1;
  root.body = &pl;
  nf_lprog p = {c, "double", 2, 2, 1, bufs, &root};
  nf_buf err = NF_BUF_INIT;
  int rc = nf_cpu_compile(&p, NULL, so, NULL, &err);
  ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
  nf_buf_free(&err);
  nf_ir_ctx_free(c);
  return rc;
}

static void run_double(nf_kernel *k, nf_pool *pool) {
  float x[11], y[11];
  for (int i = 0; i < 11; i++) x[i] = (float)i + 0.5f, y[i] = -1;
  void *b[2] = {x, y};
  ck_assert_int_eq(nf_kernel_run(k, b, 2, pool, NULL), NF_OK);
  for (int i = 0; i < 11; i++) ck_assert(y[i] == 2 * x[i]);
}

START_TEST(exec_loader_loads) {
  nf_blob so = NF_BLOB_INIT;
  make_kernel(&so);
  int fds = count_fds();
  nf_pool *pool = nf_pool_new(2);
  for (int fb = 0; fb < 2; fb++) {
    for (int i = 0; i < 5; i++) {
      nf_kernel *k = NULL;
      nf_buf err = NF_BUF_INIT;
      int rc = nf_kernel_load_ex(so.data, so.len, fb ? NF_LOAD_FORCE_TMPFILE : 0, &k, &err);
      ck_assert_msg(rc == NF_OK, "%s", nf_buf_str(&err));
      ck_assert_int_eq(nf_kernel_used_fallback(k), fb);
      run_double(k, pool);
      run_double(k, NULL);
      if (i % 2) nf_kernel_free(k); else nf_kernel_free_unload(k);
      nf_buf_free(&err);
    }
  }
  nf_pool_free(pool);
  ck_assert_int_eq(count_fds(), fds);
  /* truncated copies of a real kernel */
  expect_reject(so.data, 63, "too short");
  expect_reject(so.data, 200, "truncated");
  nf_blob_free(&so);
}
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("exec");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, exec_pool_partition);
  tcase_add_test(tc, exec_pool_many_calls);
  tcase_add_test(tc, exec_loader_rejects);
#if NF_HAVE_LLVM
  tcase_add_test(tc, exec_loader_loads);
#endif
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int nf = srunner_ntests_failed(sr);
  srunner_free(sr);
  return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
